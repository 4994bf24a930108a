//! Assembling the verifier: [`Verifier::builder`] takes an engine and [`VerifierSettings`]
//! and builds the whole service (metrics, the drafter pool with its refresh, admission, the
//! Generation handlers); [`Serve::serve`] (tandem-serving) runs it with health, reflection,
//! `/metrics`, a warm-up before SERVING and shutdown. The CLI and the tests assemble
//! verifiers only through here.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tandem_core::Verification;
use tandem_engine::{Engine, GenerationRequest, Update};
use tandem_proto::v1 as pb;
use tandem_serving::{App, Serve, ServeError};
use tandem_telemetry::Registry;
use tonic::server::NamedService;
use tonic::service::Routes;

use crate::admission::Admission;
use crate::error::VerifierError;
use crate::metrics::VerifierMetrics;
use crate::pool::{DrafterPool, PoolConfig, Resolve, SystemResolver};
use crate::remote::SessionOptions;
use crate::service::{GenerationService, VerifierConfig};

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
    /// Longest wait for one drafted block (then the round goes on plain).
    pub propose_timeout: Duration,
}

impl Default for VerifierSettings {
    fn default() -> Self {
        Self {
            gamma: 8,
            adaptive_gamma: true,
            verification: Verification::default(),
            confidence_cuts: true,
            default_max_tokens: 256,
            max_concurrent: 4,
            kv_cache_bytes: 4 << 30,
            drafters: Vec::new(),
            drafter_refresh: Some(Duration::from_secs(10)),
            open_timeout: Duration::from_secs(5),
            propose_timeout: Duration::from_secs(2),
        }
    }
}

/// A verifier, assembled and ready to serve.
pub struct Verifier {
    service: GenerationService,
    registry: Arc<Registry>,
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
        self.service.engine()
    }
}

impl Serve for Verifier {
    fn app(self) -> App {
        let warm = self.service.clone();
        App {
            routes: Routes::new(Server::new(self.service)),
            name: Server::NAME,
            registry: self.registry,
            warm_up: Box::new(move || warm_up(warm.engine())),
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
        let target = pb::TargetIdentity::from(self.engine.model().identity()?);
        let registry = Arc::new(Registry::new());
        let metrics = Arc::new(VerifierMetrics::new(&registry, s.gamma));
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
                    },
                    snapshot: self.engine.model().snapshot_support(),
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
        let admission = Admission::new(s.max_concurrent, s.kv_cache_bytes, Arc::clone(&metrics));
        let cfg = VerifierConfig {
            gamma: s.gamma,
            adaptive_gamma: s.adaptive_gamma,
            verification: s.verification,
            confidence_cuts: s.confidence_cuts,
            default_max_tokens: s.default_max_tokens,
            target,
        };
        Ok(Verifier {
            service: GenerationService::new(self.engine, pool, cfg, metrics, admission),
            registry,
        })
    }
}

/// Generates two tokens so the first request pays no first-use costs.
fn warm_up(engine: &Engine) -> Result<(), ServeError> {
    let req = GenerationRequest {
        prompt: vec![engine.tokenizer().bos_id()],
        max_tokens: 2,
        ignore_eos: true,
        ..GenerationRequest::default()
    };
    engine.generate(&req, None, &mut |_: &Update| ControlFlow::Continue(()))?;
    Ok(())
}
