//! Assembling the verifier: [`Verifier::builder`] takes an engine and [`VerifierSettings`]
//! and builds the whole service (metrics, the drafter pool with its refresh, admission, the
//! Generation handlers, the HTTP API's router); [`Serve::serve`] (tandem-serving) runs it
//! with health, reflection, `/metrics`, a warm-up before SERVING and shutdown. The CLI and the tests assemble
//! verifiers only through here.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tandem_core::Verification;
use tandem_engine::{Engine, GenerationRequest, Update};
use tandem_proto::v1 as pb;
use tandem_serving::{App, ClientTls, Drain, Serve, ServeError};
use tandem_telemetry::Registry;
use tonic::server::NamedService;
use tonic::service::Routes;

use crate::admission::{Admission, Limits};
use crate::error::VerifierError;
use crate::generations::{Generations, ServiceParts, VerifierConfig};
use crate::metrics::{HttpMetrics, VerifierMetrics};
use crate::pool::{DrafterPool, PoolConfig, Resolve, SystemResolver};
use crate::remote::SessionOptions;
use crate::request::RequestDefaults;
use crate::service::GenerationService;

type Server = pb::generation_server::GenerationServer<GenerationService>;

/// Shortest period between drafter refreshes (a zero period would spin).
const MIN_REFRESH: Duration = Duration::from_millis(100);

/// Everything an operator sets on a verifier.
#[derive(Debug, Clone)]
pub struct VerifierSettings {
    /// Most tokens drafted per round (requests may ask for fewer).
    pub gamma: usize,
    /// Let each generation choose its rounds' draft lengths up to `gamma`
    /// ([`tandem_core::GammaPolicy`]), plain rounds included when drafting does not pay.
    pub adaptive_gamma: bool,
    /// How sampled rounds verify drafts when a request does not say.
    pub verification: Verification,
    /// Whether adaptive generations cut blocks on calibrated confidences when a request
    /// does not say.
    pub confidence_cuts: bool,
    /// `max_tokens` of requests that give none.
    pub default_max_tokens: usize,
    /// Generations running at once.
    pub max_concurrent: usize,
    /// KV-cache budget in bytes over all running generations.
    pub kv_cache_bytes: usize,
    /// Drafter endpoints (`http://host:port` or `dns:///name:port`); none: plain decoding.
    pub drafters: Vec<String>,
    /// How often drafter endpoints are resolved again (`None`: only at start).
    pub drafter_refresh: Option<Duration>,
    /// Longest wait for a drafter session to open.
    pub open_timeout: Duration,
    /// Longest wait for one drafted block (then the session moves to another drafter).
    pub propose_timeout: Duration,
    /// Requests waiting for admission at once (more are refused).
    pub max_queued: usize,
    /// Longest wait for a client to take a chunk before its generation is dropped.
    pub slow_client_timeout: Duration,
    /// Longest wait for running generations once a shutdown began.
    pub drain_grace: Duration,
    /// Most bytes of context rows in one message to a drafter (less where a drafter
    /// accepts less).
    pub snapshot_chunk_bytes: usize,
    /// Longest prompt + generation accepted, below the target's own context (`None`: the
    /// target's).
    pub max_context: Option<usize>,
    /// TLS to the drafters (mutual with a client identity); `None`: plaintext.
    pub drafter_tls: Option<ClientTls>,
    /// The model's name in the HTTP API (`model` of requests and of `/v1/models`).
    pub served_model_name: String,
}

/// [`VerifierSettings::served_model_name`] unless the operator names it.
pub const DEFAULT_SERVED_MODEL_NAME: &str = "gemma-3-270m";

impl Default for VerifierSettings {
    fn default() -> Self {
        Self {
            gamma: 8,
            adaptive_gamma: true,
            verification: Verification::default(),
            confidence_cuts: true,
            default_max_tokens: 256,
            max_concurrent: 16,
            kv_cache_bytes: 4 << 30,
            drafters: Vec::new(),
            drafter_refresh: Some(Duration::from_secs(10)),
            open_timeout: Duration::from_secs(5),
            propose_timeout: Duration::from_secs(2),
            max_queued: 256,
            slow_client_timeout: Duration::from_secs(30),
            drain_grace: Duration::from_secs(30),
            snapshot_chunk_bytes: 1 << 20,
            max_context: None,
            drafter_tls: None,
            served_model_name: DEFAULT_SERVED_MODEL_NAME.to_string(),
        }
    }
}

/// A verifier, assembled and ready to serve.
pub struct Verifier {
    core: Arc<Generations>,
    registry: Arc<Registry>,
    drain: Arc<Drain>,
    grace: Duration,
    http: axum::Router,
}

/// Builds a [`Verifier`].
pub struct VerifierBuilder {
    engine: Engine,
    settings: VerifierSettings,
    resolver: Box<dyn Resolve>,
}

impl Verifier {
    /// A builder over `engine` with `settings`.
    pub fn builder(engine: Engine, settings: VerifierSettings) -> VerifierBuilder {
        VerifierBuilder {
            engine,
            settings,
            resolver: Box::new(SystemResolver),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        self.core.engine()
    }
}

impl Serve for Verifier {
    fn app(self) -> App {
        let warm = Arc::clone(&self.core);
        App {
            routes: Routes::new(Server::new(GenerationService::new(self.core))),
            name: Server::NAME,
            registry: self.registry,
            warm_up: Box::new(move || warm_up(&warm)),
            drain: self.drain,
            grace: self.grace,
            http: Some(self.http),
        }
    }
}

impl VerifierBuilder {
    /// Resolves drafter names with `resolver` instead of the system's.
    pub fn resolver(mut self, resolver: Box<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Assembles the verifier: contacts the drafters once (refusing drafters made for
    /// another target) and starts their periodic refresh.
    pub async fn build(self) -> Result<Verifier, VerifierError> {
        let s = self.settings;
        let engine = match s.max_context {
            Some(limit) => self.engine.with_context_limit(limit),
            None => self.engine,
        };
        let target = pb::TargetIdentity::from(engine.model().identity()?);
        let registry = Arc::new(Registry::new());
        let metrics = Arc::new(VerifierMetrics::new(&registry, s.gamma));
        if engine.model().observe_steps(metrics.clone()) {
            tracing::info!("concurrent generations share batched target steps");
        }
        let pool = match s.drafters.is_empty() {
            true => None,
            false => {
                let cfg = PoolConfig {
                    endpoints: s.drafters.clone(),
                    session: SessionOptions {
                        target: target.clone(),
                        open_timeout: s.open_timeout,
                        propose_timeout: s.propose_timeout,
                        dtype: pb::Dtype::Bf16,
                        chunk_bytes: s.snapshot_chunk_bytes,
                    },
                    snapshot: engine.model().snapshot_support(),
                    tls: s.drafter_tls.clone(),
                };
                let handle = tokio::runtime::Handle::current();
                let pool = DrafterPool::new(cfg, Arc::clone(&metrics), handle)?;
                let pool = Arc::new(pool.with_resolver(self.resolver));
                pool.refresh().await?;
                if let Some(every) = s.drafter_refresh {
                    pool.spawn_refresh(every.max(MIN_REFRESH));
                }
                Some(pool)
            }
        };
        let limits = Limits {
            max_concurrent: s.max_concurrent,
            kv_bytes: s.kv_cache_bytes,
            max_queued: s.max_queued,
        };
        let admission = Admission::new(limits, Arc::clone(&metrics));
        let defaults = RequestDefaults {
            gamma: s.gamma,
            adaptive_gamma: s.adaptive_gamma,
            verification: s.verification,
            confidence_cuts: s.confidence_cuts,
            default_max_tokens: s.default_max_tokens,
        };
        let cfg = VerifierConfig {
            defaults,
            target,
            slow_client_timeout: s.slow_client_timeout,
        };
        let drain = Drain::new();
        let http_metrics = Arc::new(HttpMetrics::new(&registry));
        let core = Generations::new(ServiceParts {
            engine,
            pool,
            cfg,
            metrics,
            admission,
            drain: Arc::clone(&drain),
        });
        let http = crate::http::router(Arc::clone(&core), &s.served_model_name, http_metrics);
        Ok(Verifier {
            http,
            core,
            registry,
            drain,
            grace: s.drain_grace,
        })
    }
}

/// Runs the target's warm-up for the drafters agreed on ([`Engine::warm_up`]), then
/// generates two tokens, so the first request pays no first-use costs.
fn warm_up(core: &Generations) -> Result<(), ServeError> {
    let engine = core.engine();
    let drafting = core.drafting();
    let took = engine.warm_up(drafting.as_ref().map(|(spec, gamma)| (spec, *gamma)))?;
    if let Some(took) = took {
        tracing::info!(ms = took.as_millis() as u64, "target steps warmed up");
    }
    let req = GenerationRequest {
        prompt: vec![engine.tokenizer().bos_id()],
        max_tokens: 2,
        ignore_eos: true,
        ..GenerationRequest::default()
    };
    engine.generate(&req, None, &mut |_: &Update| ControlFlow::Continue(()))?;
    Ok(())
}
