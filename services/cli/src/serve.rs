//! `tandem drafter`, `tandem verifier` and `tandem up` (both on one machine): the services
//! of the design, configured by flags or the environment, running until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tandem_core::Verification;
use tandem_drafter::{DrafterConfig, DrafterMetrics, DrafterService};
use tandem_gemma::TargetIdentity;
use tandem_proto::v1 as pb;
use tandem_telemetry::Registry;
use tandem_verifier::{
    Admission, DrafterPool, GenerationService, PoolConfig, SessionOptions, VerifierConfig,
    VerifierMetrics,
};
use tokio::net::TcpListener;

use crate::drafter::DrafterArgs;
use crate::generate::load_engine;
use crate::models::ModelArgs;

/// Flags of `tandem drafter`.
#[derive(Args, Debug)]
pub struct DrafterServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "TANDEM_LISTEN", default_value = "0.0.0.0:50052")]
    listen: SocketAddr,
    /// Prometheus /metrics listen address.
    #[arg(long, env = "TANDEM_METRICS_LISTEN", default_value = "0.0.0.0:9102")]
    metrics_listen: SocketAddr,
    #[command(flatten)]
    opts: DrafterOptions,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

/// Drafter settings shared by `tandem drafter` and `tandem up`.
#[derive(Args, Debug, Clone)]
pub struct DrafterOptions {
    /// Most drafting sessions open at once.
    #[arg(long, env = "TANDEM_MAX_SESSIONS", default_value_t = 64)]
    max_sessions: usize,
}

/// Flags of `tandem verifier`.
#[derive(Args, Debug)]
pub struct VerifierServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "TANDEM_LISTEN", default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Prometheus /metrics listen address.
    #[arg(long, env = "TANDEM_METRICS_LISTEN", default_value = "0.0.0.0:9101")]
    metrics_listen: SocketAddr,
    /// Drafter endpoints: `http://host:port` or `dns:///name:port` (re-resolved), comma
    /// separated. None: plain decoding only.
    #[arg(long, env = "TANDEM_DRAFTERS", value_delimiter = ',')]
    drafters: Vec<String>,
    #[command(flatten)]
    opts: VerifierOptions,
    #[command(flatten)]
    models: ModelArgs,
}

/// Verifier settings shared by `tandem verifier` and `tandem up`.
#[derive(Args, Debug, Clone)]
pub struct VerifierOptions {
    /// Most tokens drafted per round.
    #[arg(long, env = "TANDEM_GAMMA", default_value_t = 8)]
    gamma: usize,
    /// Choose each round's draft length up to `--gamma` from the acceptance and costs each
    /// generation measures, drafting nothing when drafting does not pay.
    #[arg(long, env = "TANDEM_ADAPTIVE_GAMMA", default_value_t = true, action = clap::ArgAction::Set)]
    adaptive_gamma: bool,
    /// How sampled rounds verify drafts when a request does not say: `block` (jointly,
    /// Sun et al. 2024; never fewer accepted tokens) or `token` (token by token).
    #[arg(long, env = "TANDEM_VERIFICATION", default_value = "token")]
    verification: Verification,
    /// With an adaptive γ, verify only the part of each block whose calibrated confidences
    /// pay for its verify rows (drafters without a calibration are never cut).
    #[arg(long, env = "TANDEM_CONFIDENCE_CUTS", default_value_t = true, action = clap::ArgAction::Set)]
    confidence_cuts: bool,
    /// Generations running at once.
    #[arg(long, env = "TANDEM_MAX_CONCURRENT", default_value_t = 4)]
    max_concurrent: usize,
    /// KV-cache budget in bytes over all running generations.
    #[arg(long, env = "TANDEM_KV_CACHE_BYTES", default_value_t = 4 << 30)]
    kv_cache_bytes: usize,
    /// `max_tokens` of requests that give none.
    #[arg(long, env = "TANDEM_DEFAULT_MAX_TOKENS", default_value_t = 256)]
    default_max_tokens: usize,
    /// Seconds between re-resolutions of drafter endpoints.
    #[arg(long, env = "TANDEM_DRAFTER_REFRESH_SECONDS", default_value_t = 10)]
    drafter_refresh_seconds: u64,
    /// Longest wait for one drafted block, in milliseconds (then the round goes on plain).
    #[arg(long, env = "TANDEM_PROPOSE_TIMEOUT_MS", default_value_t = 2000)]
    propose_timeout_ms: u64,
}

impl Default for DrafterOptions {
    fn default() -> Self {
        Self { max_sessions: 64 }
    }
}

impl VerifierOptions {
    /// The defaults of the flags, with `gamma` and `adaptive_gamma` given.
    pub(crate) fn fixed(gamma: usize, adaptive_gamma: bool) -> Self {
        Self {
            gamma,
            adaptive_gamma,
            verification: Verification::default(),
            confidence_cuts: true,
            max_concurrent: 4,
            kv_cache_bytes: 4 << 30,
            default_max_tokens: 256,
            drafter_refresh_seconds: 10,
            propose_timeout_ms: 2000,
        }
    }
}

/// Flags of `tandem up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Verifier gRPC listen address (clients connect here).
    #[arg(long, env = "TANDEM_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Verifier /metrics listen address.
    #[arg(long, env = "TANDEM_METRICS_LISTEN", default_value = "127.0.0.1:9101")]
    metrics_listen: SocketAddr,
    /// Drafter gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    drafter_listen: SocketAddr,
    /// Drafter /metrics listen address.
    #[arg(long, default_value = "127.0.0.1:9102")]
    drafter_metrics_listen: SocketAddr,
    #[command(flatten)]
    verifier: VerifierOptions,
    #[command(flatten)]
    drafter_opts: DrafterOptions,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn identity_pb(t: &TargetIdentity) -> pb::TargetIdentity {
    pb::TargetIdentity {
        architecture: t.architecture.clone(),
        embedding_hash: t.embedding_hash.clone(),
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
    tracing::info!("shutting down");
}

pub(crate) fn drafter_service(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    opts: &DrafterOptions,
) -> Result<(DrafterService, Arc<Registry>)> {
    let loaded = drafter.load_any(models, None)?;
    if drafter.drafter == "random" {
        eprintln!("tandem: drafter is randomly initialised (--drafter random): output is exact, acceptance near zero");
    }
    let registry = Arc::new(Registry::new());
    let cfg = DrafterConfig {
        target: identity_pb(&loaded.target),
        kind: loaded.kind.into(),
        max_sessions: opts.max_sessions,
    };
    let metrics = DrafterMetrics::new(Arc::clone(&registry));
    let service = DrafterService::new(loaded.proposer, cfg, metrics);
    Ok((service, registry))
}

/// `tandem drafter`.
pub fn drafter(a: DrafterServeArgs) -> Result<()> {
    let (service, registry) = drafter_service(&a.drafter, &a.models, &a.opts)?;
    runtime()?.block_on(async move {
        let grpc = bind(a.listen, "gRPC").await?;
        let metrics = bind(a.metrics_listen, "metrics").await?;
        tandem_drafter::serve(service, registry, grpc, metrics, shutdown_signal())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
    })
}

pub(crate) async fn verifier_service(
    models: &ModelArgs,
    drafters: Vec<String>,
    o: &VerifierOptions,
) -> Result<(GenerationService, Arc<Registry>)> {
    let engine = load_engine(models)?;
    let target = identity_pb(&engine.model().identity()?);
    let registry = Arc::new(Registry::new());
    let metrics = Arc::new(VerifierMetrics::new(&registry, o.gamma));
    let pool = if drafters.is_empty() {
        None
    } else {
        let pool_cfg = PoolConfig {
            endpoints: drafters,
            session: SessionOptions {
                target: target.clone(),
                open_timeout: Duration::from_secs(5),
                propose_timeout: Duration::from_millis(o.propose_timeout_ms),
                dtype: pb::Dtype::Bf16,
            },
            snapshot: engine.model().snapshot_support(),
        };
        let pool = Arc::new(DrafterPool::new(
            pool_cfg,
            Arc::clone(&metrics),
            tokio::runtime::Handle::current(),
        )?);
        pool.refresh().await?;
        pool.spawn_refresh(Duration::from_secs(o.drafter_refresh_seconds.max(1)));
        Some(pool)
    };
    let admission = Admission::new(o.max_concurrent, o.kv_cache_bytes, Arc::clone(&metrics));
    let vcfg = VerifierConfig {
        gamma: o.gamma,
        adaptive_gamma: o.adaptive_gamma,
        verification: o.verification,
        confidence_cuts: o.confidence_cuts,
        default_max_tokens: o.default_max_tokens,
        target,
    };
    Ok((
        GenerationService::new(engine, pool, vcfg, metrics, admission),
        registry,
    ))
}

/// `tandem verifier`.
pub fn verifier(a: VerifierServeArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let grpc = bind(a.listen, "gRPC").await?;
        let metrics = bind(a.metrics_listen, "metrics").await?;
        let (service, registry) = verifier_service(&a.models, a.drafters, &a.opts).await?;
        tandem_verifier::serve(service, registry, grpc, metrics, shutdown_signal())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
    })
}

/// `tandem up`: a drafter and a verifier in one process.
pub fn up(a: UpArgs) -> Result<()> {
    let (drafter, drafter_registry) = drafter_service(&a.drafter, &a.models, &a.drafter_opts)?;
    runtime()?.block_on(async move {
        let d_grpc = bind(a.drafter_listen, "drafter gRPC").await?;
        let d_metrics = bind(a.drafter_metrics_listen, "drafter metrics").await?;
        let endpoint = format!("http://{}", d_grpc.local_addr()?);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut rx = stop_rx.clone();
        let d_task = tokio::spawn(tandem_drafter::serve(drafter, drafter_registry, d_grpc, d_metrics, async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        let grpc = bind(a.listen, "gRPC").await?;
        let metrics = bind(a.metrics_listen, "metrics").await?;
        wait_serving(&endpoint).await?;
        let (service, registry) = verifier_service(&a.models, vec![endpoint], &a.verifier).await?;
        eprintln!(
            "tandem up: verifier on {} (metrics {}), drafter on {} (metrics {}); try\n  tandem generate --server http://{} --prompt \"The capital of France is\"",
            a.listen, a.metrics_listen, a.drafter_listen, a.drafter_metrics_listen, a.listen
        );
        let result = tandem_verifier::serve(service, registry, grpc, metrics, shutdown_signal()).await;
        let _ = stop_tx.send(true);
        let _ = d_task.await;
        result.map_err(|e| anyhow::anyhow!("{e}"))
    })
}

/// Waits until the drafter at `endpoint` reports SERVING (after its warm-up).
pub(crate) async fn wait_serving(endpoint: &str) -> Result<()> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())?.connect_lazy();
    let mut client = HealthClient::new(channel);
    for _ in 0..600 {
        let req = HealthCheckRequest {
            service: String::new(),
        };
        if let Ok(r) = client.check(req).await {
            if r.into_inner().status == ServingStatus::Serving as i32 {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the drafter at {endpoint} did not become ready")
}
