//! The `tandem.v1.Generation` service: thin handlers that parse a request, admit it
//! (concurrency slots and a KV-cache budget), run the engine on a blocking thread and stream
//! its chunks through a bounded channel. A client that goes away ends the generation at its
//! next chunk; its KV cache and its drafter session are freed with it.

use std::sync::Arc;
use std::time::Instant;

use tandem_core::{FinishReason, Proposer, Verification};
use tandem_engine::{drafting_gamma, Engine, GenerationRequest, Outcome, Plan, Update};
use tandem_proto::codec::{sampling_from_pb, verification_from_pb};
use tandem_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::admission::Admission;
use crate::error::VerifierError;
use crate::metrics::VerifierMetrics;
use crate::pool::DrafterPool;

/// Chunks buffered per stream before the engine waits for the client.
const STREAM_BUFFER: usize = 16;
/// Most stop strings per request, and their longest length in bytes.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 256;

/// Request defaults and limits.
#[derive(Debug, Clone)]
pub struct VerifierConfig {
    /// Tokens drafted per round (capped per request by `max_gamma`).
    pub gamma: usize,
    /// Let each generation choose its rounds' draft lengths up to that γ
    /// ([`tandem_core::GammaPolicy`]), plain rounds included when drafting does not pay.
    pub adaptive_gamma: bool,
    /// How sampled rounds verify drafts when a request does not say.
    pub verification: Verification,
    /// Whether adaptive generations cut blocks on calibrated confidences when a request
    /// does not say.
    pub confidence_cuts: bool,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// The target's identity, reported by GetModelInfo.
    pub target: pb::TargetIdentity,
}

struct Inner {
    engine: Engine,
    pool: Option<Arc<DrafterPool>>,
    cfg: VerifierConfig,
    metrics: Arc<VerifierMetrics>,
    admission: Admission,
}

/// The client-facing gRPC service.
#[derive(Clone)]
pub struct GenerationService {
    inner: Arc<Inner>,
}

impl GenerationService {
    /// A service over `engine`, drafting through `pool` when given.
    pub fn new(
        engine: Engine,
        pool: Option<Arc<DrafterPool>>,
        cfg: VerifierConfig,
        metrics: Arc<VerifierMetrics>,
        admission: Admission,
    ) -> Self {
        let inner = Inner {
            engine,
            pool,
            cfg,
            metrics,
            admission,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The engine (for warm-up).
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

type GenerateStream = ReceiverStream<Result<pb::GenerateResponse, Status>>;

#[tonic::async_trait]
impl pb::generation_server::Generation for GenerationService {
    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<GenerateStream>, Status> {
        let started = Instant::now();
        let inner = Arc::clone(&self.inner);
        let (plan, proposer) = inner.plan(request.into_inner()).inspect_err(|e| {
            tracing::debug!("refused: {e}");
        })?;
        let permit = inner.admission.admit(plan.cache_bytes()).await?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            inner.run(&plan, proposer.as_deref(), &tx, started);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_model_info(
        &self,
        _: Request<pb::GetModelInfoRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        let cfg = self.inner.engine.model().facts();
        let pool = self.inner.pool.as_ref();
        Ok(Response::new(pb::ModelInfo {
            target: Some(self.inner.cfg.target.clone()),
            vocab_size: cfg.vocab_size as u32,
            hidden_size: cfg.hidden_size as u32,
            num_layers: cfg.num_layers as u32,
            max_context: cfg.max_context as u32,
            speculative: pool.is_some_and(|p| p.max_gamma() > 0),
            max_gamma: self.inner.drafting_cap() as u32,
            drafters: pool.map_or_else(Vec::new, |p| p.endpoints().to_vec()),
        }))
    }
}

impl Inner {
    /// Most tokens a round drafts through the pool: the server's γ within what the
    /// drafters agree on (0 without drafters).
    fn drafting_cap(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(0, |p| drafting_gamma(self.cfg.gamma, p.max_gamma()))
    }

    /// The request checked and planned once, with the pool when it drafts.
    fn plan(
        &self,
        r: pb::GenerateRequest,
    ) -> Result<(Plan, Option<Arc<DrafterPool>>), VerifierError> {
        let speculative = r.speculative.unwrap_or(true);
        let request = self.request(r)?;
        let cap = if speculative { self.drafting_cap() } else { 0 };
        let plan = self.engine.plan(request, cap)?;
        let pool = self.pool.clone().filter(|_| plan.gamma() > 0);
        Ok((plan, pool))
    }

    /// A wire request as the engine takes it, with this server's defaults; the checks that
    /// need the target are the plan's.
    fn request(&self, r: pb::GenerateRequest) -> Result<GenerationRequest, VerifierError> {
        let invalid = |m: String| VerifierError::InvalidArgument(m);
        let verification = verification_from_pb(r.verification(), self.cfg.verification);
        let prompt = match r.prompt {
            Some(pb::generate_request::Prompt::Text(t)) if !t.is_empty() => self
                .engine
                .tokenizer()
                .encode(&t, true)
                .map_err(|e| invalid(e.to_string()))?,
            Some(pb::generate_request::Prompt::TokenIds(ids)) if !ids.ids.is_empty() => ids.ids,
            _ => {
                return Err(invalid(
                    "the prompt is empty: give text or token_ids".into(),
                ))
            }
        };
        if r.stop.len() > MAX_STOPS || r.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(invalid(format!(
                "at most {MAX_STOPS} stop strings of {MAX_STOP_BYTES} bytes each"
            )));
        }
        Ok(GenerationRequest {
            prompt,
            max_tokens: r
                .max_tokens
                .map_or(self.cfg.default_max_tokens, |m| m as usize),
            sampling: sampling_from_pb(r.sampling.as_ref()),
            stop_strings: r.stop,
            ignore_eos: r.ignore_eos,
            gamma: r.max_gamma.map_or(self.cfg.gamma, |g| g as usize),
            adaptive_gamma: self.cfg.adaptive_gamma,
            verification,
            confidence_cuts: r.confidence_cuts.unwrap_or(self.cfg.confidence_cuts),
        })
    }

    /// Runs one admitted generation, streaming into `tx`.
    fn run(
        &self,
        plan: &Plan,
        proposer: Option<&DrafterPool>,
        tx: &mpsc::Sender<Result<pb::GenerateResponse, Status>>,
        started: Instant,
    ) {
        let m = &self.metrics;
        m.active_sessions.increment(1.0);
        let mut timer = ChunkTimer {
            started,
            last: None,
        };
        let result = self.engine.run(
            plan,
            proposer.map(|p| p as &dyn Proposer),
            &mut |u: &Update| {
                if let Some(r) = &u.round {
                    m.round(r);
                }
                timer.observe(m, u.chunk.tokens.len());
                let msg = pb::GenerateResponse {
                    token_ids: u.chunk.tokens.clone(),
                    text: u.chunk.text.clone(),
                    finished: None,
                };
                match tx.blocking_send(Ok(msg)) {
                    Ok(()) => std::ops::ControlFlow::Continue(()),
                    Err(_) => std::ops::ControlFlow::Break(()),
                }
            },
        );
        m.active_sessions.decrement(1.0);
        match result {
            Ok(out) => {
                m.finished(&out, started.elapsed().as_secs_f64());
                let _ = tx.blocking_send(Ok(finished_message(&out, started)));
            }
            Err(e) => {
                m.request(FinishReason::Error);
                tracing::error!("generation failed: {e}");
                let _ = tx.blocking_send(Err(Status::from(VerifierError::Engine(e))));
            }
        }
    }
}

/// Time to the first token, then the time between chunks spread over their tokens.
struct ChunkTimer {
    started: Instant,
    last: Option<Instant>,
}

impl ChunkTimer {
    fn observe(&mut self, m: &VerifierMetrics, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        match self.last {
            None => m
                .ttft
                .record(now.duration_since(self.started).as_secs_f64()),
            Some(last) => {
                let per_token = now.duration_since(last).as_secs_f64() / tokens as f64;
                (0..tokens).for_each(|_| m.itl.record(per_token));
            }
        }
        self.last = Some(now);
    }
}

fn finished_message(out: &Outcome, started: Instant) -> pb::GenerateResponse {
    let s = &out.spec;
    let finished = pb::Finished {
        reason: pb::FinishReason::from(out.finish) as i32,
        usage: Some(pb::Usage {
            prompt_tokens: out.prompt_tokens as u32,
            completion_tokens: out.tokens.len() as u32,
        }),
        speculation: Some(pb::SpeculationStats {
            drafts: s.drafts,
            draft_tokens: s.draft_tokens,
            accepted_tokens: s.accepted_tokens,
            mean_acceptance_length: s.mean_acceptance_length().unwrap_or(0.0),
            accepted_per_position: s.accepted_per_position.clone(),
            drafted_per_position: s.drafted_per_position.clone(),
            draft_seconds: s.draft_s,
            verify_seconds: s.verify_s,
            proposer_failures: s.proposer_failures,
        }),
        ttft_seconds: out.timing.ttft_s,
        total_seconds: started.elapsed().as_secs_f64(),
    };
    pb::GenerateResponse {
        token_ids: Vec::new(),
        text: String::new(),
        finished: Some(finished),
    }
}
