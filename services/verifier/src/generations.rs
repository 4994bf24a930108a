//! The generation core both front ends (gRPC and the OpenAI-compatible HTTP API) go
//! through: parse a wire request, admit it (concurrency slots, a KV-cache budget and a
//! bounded queue, within the request's deadline), run the engine on a blocking thread and
//! stream its chunks to the client ([`crate::client_stream`]). A client that goes away,
//! stops reading or runs out of time ends the generation at its next chunk; its KV cache
//! and its drafter session are freed with it. While the server drains, new requests are
//! refused with UNAVAILABLE.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_core::{FinishReason, Proposer, SnapshotSpec};
use tandem_engine::{drafting_gamma, Engine, GenerationRequest, Outcome, Plan, Update};
use tandem_proto::v1 as pb;
use tandem_serving::{Drain, InFlight};
use tokio::sync::mpsc;
use tonic::Status;

use crate::admission::{Admission, Permit};
use crate::client_stream::{ClientStream, Item};
use crate::error::VerifierError;
use crate::metrics::{Refusal, VerifierMetrics};
use crate::pool::DrafterPool;
use crate::request::{generation_request, RequestDefaults};

/// Chunks buffered per stream before the engine waits for the client.
const STREAM_BUFFER: usize = 16;

/// Request defaults and the target's identity.
#[derive(Debug, Clone)]
pub struct VerifierConfig {
    /// What requests get for the fields they leave unset.
    pub defaults: RequestDefaults,
    /// The target's identity, reported by GetModelInfo.
    pub target: pb::TargetIdentity,
    /// Longest wait for a client to take a chunk before the generation is dropped.
    pub slow_client_timeout: Duration,
}

/// The generation core, shared by the gRPC and HTTP front ends.
pub struct Generations {
    engine: Engine,
    pool: Option<Arc<DrafterPool>>,
    cfg: VerifierConfig,
    metrics: Arc<VerifierMetrics>,
    admission: Admission,
    drain: Arc<Drain>,
}

/// What [`Generations`] are made of.
pub struct ServiceParts {
    /// The target.
    pub engine: Engine,
    /// The drafters, when the server drafts.
    pub pool: Option<Arc<DrafterPool>>,
    /// Defaults and limits.
    pub cfg: VerifierConfig,
    /// The metrics.
    pub metrics: Arc<VerifierMetrics>,
    /// Slots, KV budget and queue.
    pub admission: Admission,
    /// Work in flight, drained on shutdown.
    pub drain: Arc<Drain>,
}

impl Generations {
    /// The core over `parts`.
    pub fn new(parts: ServiceParts) -> Arc<Self> {
        Arc::new(Self {
            engine: parts.engine,
            pool: parts.pool,
            cfg: parts.cfg,
            metrics: parts.metrics,
            admission: parts.admission,
            drain: parts.drain,
        })
    }

    /// The engine (for warm-up and the tokenizer).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Starts a generation of `r` that must answer by `deadline`: checked, planned,
    /// admitted, then run on a blocking thread. Its chunks arrive on the returned channel;
    /// the last item is the message carrying the finish, or the status that ended it.
    pub async fn start(
        self: &Arc<Self>,
        r: pb::GenerateRequest,
        deadline: Option<Instant>,
    ) -> Result<mpsc::Receiver<Item>, Status> {
        let started = Instant::now();
        let in_flight = self.enter()?;
        let (plan, proposer) = self.plan(r).inspect_err(|e| {
            tracing::debug!("refused: {e}");
        })?;
        let permit = self.admit(&plan, proposer.as_deref(), deadline).await?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream = ClientStream::open(tx, deadline, self.cfg.slow_client_timeout).await?;
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _held: (Permit, InFlight) = (permit, in_flight);
            this.run(&plan, proposer.as_deref(), stream, started);
        });
        Ok(rx)
    }

    /// The served model and what speculation it offers.
    pub fn model_info(&self) -> pb::ModelInfo {
        let cfg = self.engine.facts();
        let pool = self.pool.as_ref();
        pb::ModelInfo {
            target: Some(self.cfg.target.clone()),
            vocab_size: cfg.vocab_size as u32,
            hidden_size: cfg.hidden_size as u32,
            num_layers: cfg.num_layers as u32,
            max_context: cfg.max_context as u32,
            speculative: pool.is_some_and(|p| p.max_gamma() > 0),
            max_gamma: self.drafting_cap() as u32,
            drafters: pool.map_or_else(Vec::new, |p| p.endpoints().to_vec()),
        }
    }

    /// The token ids of a text (with BOS unless asked not to) and their vocabulary entries.
    pub fn tokenize(&self, r: &pb::TokenizeRequest) -> Result<pb::TokenizeResponse, VerifierError> {
        let tokenizer = self.engine.tokenizer();
        let ids = tokenizer
            .encode(&r.text, r.add_special_tokens.unwrap_or(true))
            .map_err(|e| VerifierError::InvalidArgument(e.to_string()))?;
        let tokens = ids
            .iter()
            .map(|id| tokenizer.token_text(*id).unwrap_or_default())
            .collect();
        Ok(pb::TokenizeResponse { ids, tokens })
    }

    /// The text of token ids, every id within the vocabulary.
    pub fn detokenize(
        &self,
        r: &pb::DetokenizeRequest,
    ) -> Result<pb::DetokenizeResponse, VerifierError> {
        let vocab = self.engine.facts().vocab_size;
        if let Some(id) = r.ids.iter().find(|id| **id as usize >= vocab) {
            return Err(VerifierError::InvalidArgument(format!(
                "token {id} is outside the vocabulary of {vocab}"
            )));
        }
        let text = self
            .engine
            .tokenizer()
            .decode_with(&r.ids, r.skip_special_tokens)
            .map_err(|e| VerifierError::InvalidArgument(e.to_string()))?;
        Ok(pb::DetokenizeResponse { text })
    }

    /// Counts a request in flight; refused while the server drains.
    fn enter(&self) -> Result<InFlight, VerifierError> {
        self.drain.enter().ok_or_else(|| {
            self.metrics.refused(Refusal::Draining);
            VerifierError::Unavailable("the server is draining; retry on another replica".into())
        })
    }

    /// Waits for a slot and the plan's KV cache (and, when it drafts, the context rows it
    /// keeps to move its drafter session), until the deadline.
    async fn admit(
        &self,
        plan: &Plan,
        pool: Option<&DrafterPool>,
        deadline: Option<Instant>,
    ) -> Result<Permit, VerifierError> {
        let rows = pool.map_or(0, |p| p.history_bytes(plan.cache_positions()));
        let admit = self.admission.admit(plan.cache_bytes() + rows);
        let Some(deadline) = deadline else {
            return admit.await;
        };
        match tokio::time::timeout_at(deadline.into(), admit).await {
            Ok(admitted) => admitted,
            Err(_) => {
                self.metrics.refused(Refusal::Deadline);
                Err(VerifierError::DeadlineExceeded(
                    "the request's deadline passed while it waited for admission".into(),
                ))
            }
        }
    }

    /// The snapshot spec the pool's drafters agree on and the most tokens a round drafts
    /// through them, where they draft.
    pub fn drafting(&self) -> Option<(SnapshotSpec, usize)> {
        let pool = self.pool.as_ref()?;
        let gamma = self.drafting_cap();
        (gamma > 0).then(|| (pool.snapshot_spec(), gamma))
    }

    /// Most tokens a round drafts through the pool: the server's γ within what the
    /// drafters agree on (0 without drafters).
    fn drafting_cap(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| {
            drafting_gamma(self.cfg.defaults.gamma, p.max_gamma())
        })
    }

    /// The request checked and planned once, with the pool when it drafts; a refusal is
    /// counted by its error type.
    fn plan(
        &self,
        r: pb::GenerateRequest,
    ) -> Result<(Plan, Option<Arc<DrafterPool>>), VerifierError> {
        let speculative = r.speculative.unwrap_or(true);
        let cap = if speculative { self.drafting_cap() } else { 0 };
        let plan = self
            .request(r)
            .and_then(|request| Ok(self.engine.plan(request, cap)?))
            .inspect_err(|_| self.metrics.refused(Refusal::Invalid))?;
        let pool = self.pool.clone().filter(|_| plan.gamma() > 0);
        Ok((plan, pool))
    }

    /// A wire request as the engine takes it, with this server's defaults; the checks that
    /// need the target are the plan's.
    fn request(&self, r: pb::GenerateRequest) -> Result<GenerationRequest, VerifierError> {
        generation_request(r, &self.cfg.defaults, self.engine.tokenizer())
    }

    /// Runs one admitted generation, streaming to its client.
    fn run(
        &self,
        plan: &Plan,
        proposer: Option<&DrafterPool>,
        mut stream: ClientStream,
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
                    logprobs: u.logprobs.iter().map(pb::TokenLogprob::from).collect(),
                };
                match stream.send(msg) {
                    true => std::ops::ControlFlow::Continue(()),
                    false => std::ops::ControlFlow::Break(()),
                }
            },
        );
        m.active_sessions.decrement(1.0);
        let last = match (result, stream.aborted()) {
            (Ok(out), Some(why)) => {
                m.finished(&out, started.elapsed().as_secs_f64());
                m.dropped(why);
                let status = stream.abort_status(why);
                tracing::warn!(
                    "generation ended after {} tokens: {}",
                    out.tokens.len(),
                    status.message()
                );
                Err(status)
            }
            (Ok(out), None) => {
                m.finished(&out, started.elapsed().as_secs_f64());
                Ok(finished_message(&out, started))
            }
            (Err(e), _) => {
                m.request(FinishReason::Error);
                tracing::error!("generation failed: {e}");
                Err(Status::from(VerifierError::Engine(e)))
            }
        };
        stream.finish(last);
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
        finished: Some(finished),
        ..pb::GenerateResponse::default()
    }
}
