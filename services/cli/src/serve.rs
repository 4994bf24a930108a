//! `tandem drafter`, `tandem verifier` and `tandem up` (both on one machine): the services
//! of the design, configured by flags or the environment, running until Ctrl-C or SIGTERM.
//! Security (TLS, mutual TLS, bearer tokens) is the operator's choice; by default the
//! services are plaintext and open, as `tandem up` on a laptop wants.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Args;
use tandem_core::Verification;
use tandem_drafter::{Drafter, DrafterConfig};
use tandem_engine::BatchLimits;
use tandem_proto::codec::DEFAULT_MAX_MESSAGE_BYTES;
use tandem_serving::{
    ClientTls, ClientTlsFiles, KeyPair, Listeners, Security, Serve, ServerTlsFiles, Tokens,
};
use tandem_verifier::{Verifier, VerifierSettings, DEFAULT_SERVED_MODEL_NAME};

use crate::drafter::DrafterArgs;
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
    /// Seconds open sessions may go on after SIGTERM (new ones are refused meanwhile).
    #[arg(long, env = "TANDEM_DRAIN_SECONDS", default_value_t = 30)]
    drain_seconds: u64,
    #[command(flatten)]
    tls: TlsArgs,
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
    /// Largest request message accepted, in bytes (verifiers send context rows in chunks
    /// below it).
    #[arg(long, env = "TANDEM_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    max_message_bytes: usize,
    /// Seconds a session may go without a message from its verifier before it is closed.
    #[arg(long, env = "TANDEM_IDLE_TIMEOUT_SECONDS", default_value_t = 600)]
    idle_timeout_seconds: u64,
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
    /// OpenAI-compatible HTTP API listen address (/v1/completions, /v1/chat/completions,
    /// /v1/models, /tokenize, /detokenize, /health), secured like gRPC. Default: off.
    #[arg(long, env = "TANDEM_HTTP_LISTEN")]
    http_listen: Option<SocketAddr>,
    /// Drafter endpoints: `http://host:port` or `dns:///name:port` (re-resolved), comma
    /// separated. None: plain decoding only.
    #[arg(long, env = "TANDEM_DRAFTERS", value_delimiter = ',')]
    drafters: Vec<String>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    auth: AuthArgs,
    #[command(flatten)]
    drafter_tls: DrafterTlsArgs,
    #[command(flatten)]
    opts: VerifierOptions,
    #[command(flatten)]
    models: ModelArgs,
}

/// Verifier settings shared by `tandem verifier` and `tandem up`.
#[derive(Args, Debug, Clone)]
pub struct VerifierOptions {
    /// Most tokens drafted per round.
    #[arg(long, env = "TANDEM_GAMMA", default_value_t = VerifierSettings::default().gamma)]
    gamma: usize,
    /// Choose each round's draft length up to `--gamma` from the acceptance and costs each
    /// generation measures, drafting nothing when drafting does not pay.
    #[arg(long, env = "TANDEM_ADAPTIVE_GAMMA", default_value_t = VerifierSettings::default().adaptive_gamma, action = clap::ArgAction::Set)]
    adaptive_gamma: bool,
    /// How sampled rounds verify drafts when a request does not say: `block` (jointly,
    /// Sun et al. 2024; never fewer accepted tokens) or `token` (token by token).
    #[arg(long, env = "TANDEM_VERIFICATION", default_value = "token")]
    verification: Verification,
    /// With an adaptive γ, verify only the part of each block whose calibrated confidences
    /// pay for its verify rows (drafters without a calibration are never cut).
    #[arg(long, env = "TANDEM_CONFIDENCE_CUTS", default_value_t = VerifierSettings::default().confidence_cuts, action = clap::ArgAction::Set)]
    confidence_cuts: bool,
    /// Generations running at once.
    #[arg(long, env = "TANDEM_MAX_CONCURRENT", default_value_t = VerifierSettings::default().max_concurrent)]
    max_concurrent: usize,
    /// KV-cache budget in bytes over all running generations.
    #[arg(long, env = "TANDEM_KV_CACHE_BYTES", default_value_t = VerifierSettings::default().kv_cache_bytes)]
    kv_cache_bytes: usize,
    /// `max_tokens` of requests that give none.
    #[arg(long, env = "TANDEM_DEFAULT_MAX_TOKENS", default_value_t = VerifierSettings::default().default_max_tokens)]
    default_max_tokens: usize,
    /// Seconds between re-resolutions of drafter endpoints.
    #[arg(long, env = "TANDEM_DRAFTER_REFRESH_SECONDS", default_value_t = 10)]
    drafter_refresh_seconds: u64,
    /// Longest wait for one drafted block, in milliseconds (then the session moves to
    /// another drafter, or the generation goes on plain).
    #[arg(long, env = "TANDEM_PROPOSE_TIMEOUT_MS", default_value_t = VerifierSettings::default().propose_timeout.as_millis() as u64)]
    propose_timeout_ms: u64,
    /// Requests that may wait for admission at once; more are refused (RESOURCE_EXHAUSTED).
    #[arg(long, env = "TANDEM_MAX_QUEUED", default_value_t = VerifierSettings::default().max_queued)]
    max_queued: usize,
    /// Seconds a client may leave a chunk unread before its generation is dropped.
    #[arg(long, env = "TANDEM_SLOW_CLIENT_SECONDS", default_value_t = VerifierSettings::default().slow_client_timeout.as_secs())]
    slow_client_seconds: u64,
    /// Seconds running generations may go on after SIGTERM (new requests are refused).
    #[arg(long = "drain-seconds", env = "TANDEM_DRAIN_SECONDS", default_value_t = VerifierSettings::default().drain_grace.as_secs())]
    drain_seconds: u64,
    /// Most bytes of context rows per message to a drafter.
    #[arg(long, env = "TANDEM_SNAPSHOT_CHUNK_BYTES", default_value_t = VerifierSettings::default().snapshot_chunk_bytes)]
    snapshot_chunk_bytes: usize,
    /// Longest prompt + generation accepted (default: the model's context).
    #[arg(long, env = "TANDEM_MAX_CONTEXT")]
    max_context: Option<usize>,
    /// The model's name in the HTTP API: what requests put in `model` and /v1/models lists
    /// (requests naming another model get 404).
    #[arg(long, env = "TANDEM_SERVED_MODEL_NAME", default_value = DEFAULT_SERVED_MODEL_NAME)]
    served_model_name: String,
    /// Run the forwards of concurrent generations as one batched step (Gemma 3; on the CPU
    /// output is the same either way, on a GPU it can part at near-ties, as speculation's).
    #[arg(long, env = "TANDEM_BATCHING", default_value_t = true, action = clap::ArgAction::Set)]
    batching: bool,
    /// Most token rows (prompt chunks and verify blocks) in one batched step.
    #[arg(long, env = "TANDEM_BATCH_MAX_ROWS", default_value_t = BatchLimits::default().max_rows)]
    batch_max_rows: usize,
    /// Prompt tokens a generation prefills per batched step.
    #[arg(long, env = "TANDEM_PREFILL_CHUNK", default_value_t = BatchLimits::default().prefill_chunk)]
    prefill_chunk: usize,
    /// Longest a batched step waits, in milliseconds, for running generations that have
    /// not sent their forward yet (at most a quarter of a recent step).
    #[arg(long, env = "TANDEM_BATCH_WAIT_MS", default_value_t = BatchLimits::default().max_wait.as_millis() as u64)]
    batch_wait_ms: u64,
    /// Generations a GPU target's KV pool holds for batching (each slot holds a context of
    /// up to 4,096 positions; a generation that finds no free slot runs alone).
    #[arg(long, env = "TANDEM_BATCH_SLOTS", default_value_t = BatchLimits::default().slots)]
    batch_slots: usize,
}

/// TLS of a service's gRPC listener.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// PEM certificate chain the gRPC listener presents: TLS on (needs --tls-key).
    #[arg(long, env = "TANDEM_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "TANDEM_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle: clients must present a certificate it signed (mutual TLS).
    #[arg(long, env = "TANDEM_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Also answer gRPC health checks, and nothing else, in plaintext here: for probes that
    /// cannot speak TLS (Kubernetes' gRPC probes).
    #[arg(long, env = "TANDEM_PROBE_LISTEN")]
    probe_listen: Option<SocketAddr>,
}

/// Bearer tokens of the client-facing service.
#[derive(Args, Debug, Clone)]
pub struct AuthArgs {
    /// File of accepted bearer tokens, one a line (blank and `#` lines skipped): every call
    /// but health checks must send `authorization: Bearer <token>`.
    #[arg(long, env = "TANDEM_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

/// TLS from the verifier to its drafters.
#[derive(Args, Debug, Clone)]
pub struct DrafterTlsArgs {
    /// PEM CA bundle the drafters' certificates must chain to: TLS to the drafters on.
    #[arg(long, env = "TANDEM_DRAFTER_TLS_CA")]
    drafter_tls_ca: Option<PathBuf>,
    /// PEM certificate chain the verifier presents to drafters (mutual TLS).
    #[arg(long, env = "TANDEM_DRAFTER_TLS_CERT", requires_all = ["drafter_tls_key", "drafter_tls_ca"])]
    drafter_tls_cert: Option<PathBuf>,
    /// PEM private key of --drafter-tls-cert.
    #[arg(long, env = "TANDEM_DRAFTER_TLS_KEY", requires = "drafter_tls_cert")]
    drafter_tls_key: Option<PathBuf>,
    /// Name the drafters' certificates carry (default: the endpoint's host; for a
    /// `dns:///name:port` endpoint, `name`).
    #[arg(long, env = "TANDEM_DRAFTER_TLS_DOMAIN", requires = "drafter_tls_ca")]
    drafter_tls_domain: Option<String>,
}

impl TlsArgs {
    /// `listeners` secured as these flags and `auth` say, with their probe listener.
    async fn secure(&self, listeners: Listeners, auth: Option<&AuthArgs>) -> Result<Listeners> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(
                ServerTlsFiles {
                    identity: KeyPair {
                        cert: cert.clone(),
                        key: key.clone(),
                    },
                    client_ca: self.tls_client_ca.clone(),
                }
                .load()?,
            ),
            _ => None,
        };
        let tokens = match auth.and_then(|a| a.token_file.as_deref()) {
            Some(path) => Some(Arc::new(Tokens::load(path)?)),
            None => None,
        };
        let listeners = listeners.with_security(Security { tls, tokens });
        match self.probe_listen {
            Some(addr) => listeners.with_probe(addr).await.map_err(|e| anyhow!("{e}")),
            None => Ok(listeners),
        }
    }
}

impl DrafterTlsArgs {
    /// The verifier's client TLS to drafters, `None` without --drafter-tls-ca.
    fn load(&self) -> Result<Option<ClientTls>> {
        let Some(ca) = &self.drafter_tls_ca else {
            return Ok(None);
        };
        let identity = match (&self.drafter_tls_cert, &self.drafter_tls_key) {
            (Some(cert), Some(key)) => Some(KeyPair {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        let files = ClientTlsFiles {
            ca: ca.clone(),
            identity,
            domain: self.drafter_tls_domain.clone(),
        };
        Ok(Some(files.load()?))
    }
}

impl DrafterOptions {
    /// The flags' defaults (and the environment's values), as `tandem drafter` reads them;
    /// a malformed `TANDEM_*` variable is an error, not a panic.
    pub(crate) fn from_env() -> Result<Self> {
        use clap::FromArgMatches;
        let cmd = <Self as Args>::augment_args(clap::Command::new("drafter"));
        let matches = cmd.try_get_matches_from(["drafter"])?;
        Ok(Self::from_arg_matches(&matches)?)
    }

    /// The drafter's configuration for `target`, of `kind`, draining for `drain`.
    fn config(
        &self,
        target: tandem_core::TargetIdentity,
        kind: &str,
        drain: Duration,
    ) -> DrafterConfig {
        DrafterConfig {
            max_sessions: self.max_sessions,
            max_message_bytes: self.max_message_bytes,
            idle_timeout: Duration::from_secs(self.idle_timeout_seconds),
            drain_grace: drain,
            ..DrafterConfig::new(target, kind)
        }
    }
}

impl VerifierOptions {
    /// How concurrent generations are batched (`None`: each runs its own forwards).
    pub(crate) fn batching(&self) -> Option<BatchLimits> {
        self.batching.then_some(BatchLimits {
            max_rows: self.batch_max_rows,
            prefill_chunk: self.prefill_chunk,
            max_wait: Duration::from_millis(self.batch_wait_ms),
            slots: self.batch_slots,
        })
    }

    /// The verifier's settings, drafting through `drafters`.
    pub(crate) fn settings(&self, drafters: Vec<String>) -> VerifierSettings {
        VerifierSettings {
            gamma: self.gamma,
            adaptive_gamma: self.adaptive_gamma,
            verification: self.verification,
            confidence_cuts: self.confidence_cuts,
            default_max_tokens: self.default_max_tokens,
            max_concurrent: self.max_concurrent,
            kv_cache_bytes: self.kv_cache_bytes,
            drafters,
            drafter_refresh: Some(Duration::from_secs(self.drafter_refresh_seconds)),
            propose_timeout: Duration::from_millis(self.propose_timeout_ms),
            max_queued: self.max_queued,
            slow_client_timeout: Duration::from_secs(self.slow_client_seconds),
            drain_grace: Duration::from_secs(self.drain_seconds),
            snapshot_chunk_bytes: self.snapshot_chunk_bytes,
            max_context: self.max_context,
            served_model_name: self.served_model_name.clone(),
            ..VerifierSettings::default()
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
    /// Verifier's OpenAI-compatible HTTP API listen address.
    #[arg(long, env = "TANDEM_HTTP_LISTEN", default_value = "127.0.0.1:8000")]
    http_listen: SocketAddr,
    /// Drafter gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    drafter_listen: SocketAddr,
    /// Drafter /metrics listen address.
    #[arg(long, default_value = "127.0.0.1:9102")]
    drafter_metrics_listen: SocketAddr,
    /// TLS of the verifier's listener (the drafter stays in plaintext on its own address).
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    auth: AuthArgs,
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

/// Binds a gRPC and a metrics listener.
pub(crate) async fn listen(grpc: SocketAddr, metrics: SocketAddr) -> Result<Listeners> {
    Listeners::bind(grpc, metrics)
        .await
        .map_err(|e| anyhow!("{e}"))
}

/// `listeners` plus the HTTP API's on `addr`, if any.
async fn with_http(listeners: Listeners, addr: Option<SocketAddr>) -> Result<Listeners> {
    match addr {
        Some(addr) => listeners.with_http(addr).await.map_err(|e| anyhow!("{e}")),
        None => Ok(listeners),
    }
}

/// `, HTTP on ADDR` when `listeners` serve HTTP, for the announce lines.
fn http_part(listeners: &Listeners) -> Result<String> {
    Ok(match &listeners.http {
        Some(l) => format!(", HTTP on {}", l.local_addr()?),
        None => String::new(),
    })
}

/// Prints the addresses `listeners` bound (port 0 asks the system for one), for operators
/// and scripts.
fn announce(what: &str, listeners: &Listeners) -> Result<()> {
    eprintln!(
        "tandem {what}: gRPC on {}, metrics on {}{}",
        listeners.grpc.local_addr()?,
        listeners.metrics.local_addr()?,
        http_part(listeners)?
    );
    Ok(())
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

/// The drafter `drafter` names, assembled, draining for `drain` on shutdown.
pub(crate) fn drafter_server(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    opts: &DrafterOptions,
    drain: Duration,
) -> Result<Drafter> {
    let loaded = drafter.load_any(models, None)?;
    if drafter.drafter == "random" {
        eprintln!("tandem: drafter is randomly initialised (--drafter random): output is exact, acceptance near zero");
    }
    let cfg = opts.config(loaded.target, loaded.kind, drain);
    Ok(Drafter::new(loaded.proposer, cfg))
}

/// `tandem drafter`.
pub fn drafter(a: DrafterServeArgs) -> Result<()> {
    let drain = Duration::from_secs(a.drain_seconds);
    let drafter = drafter_server(&a.drafter, &a.models, &a.opts, drain)?;
    runtime()?.block_on(async move {
        let listeners = listen(a.listen, a.metrics_listen).await?;
        let listeners = a.tls.secure(listeners, None).await?;
        announce("drafter", &listeners)?;
        drafter
            .serve(listeners, shutdown_signal())
            .await
            .map_err(|e| anyhow!("{e}"))
    })
}

/// The verifier over the `--model` target with `settings`, its generations batched as
/// `batching` says, assembled.
pub(crate) async fn verifier_server(
    models: &ModelArgs,
    settings: VerifierSettings,
    batching: Option<BatchLimits>,
) -> Result<Verifier> {
    let engine = models.load_engine_batched(batching)?;
    Ok(Verifier::builder(engine, settings).build().await?)
}

/// `tandem verifier`.
pub fn verifier(a: VerifierServeArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let listeners = listen(a.listen, a.metrics_listen).await?;
        let listeners = a.tls.secure(listeners, Some(&a.auth)).await?;
        let listeners = with_http(listeners, a.http_listen).await?;
        let settings = VerifierSettings {
            drafter_tls: a.drafter_tls.load()?,
            ..a.opts.settings(a.drafters)
        };
        let verifier = verifier_server(&a.models, settings, a.opts.batching()).await?;
        announce("verifier", &listeners)?;
        verifier
            .serve(listeners, shutdown_signal())
            .await
            .map_err(|e| anyhow!("{e}"))
    })
}

/// `tandem up`: a drafter and a verifier in one process.
pub fn up(a: UpArgs) -> Result<()> {
    let drain = Duration::from_secs(a.verifier.drain_seconds);
    let drafter = drafter_server(&a.drafter, &a.models, &a.drafter_opts, drain)?;
    runtime()?.block_on(async move {
        let d_listeners = listen(a.drafter_listen, a.drafter_metrics_listen).await?;
        let listeners = listen(a.listen, a.metrics_listen).await?;
        let listeners = a.tls.secure(listeners, Some(&a.auth)).await?;
        let listeners = with_http(listeners, Some(a.http_listen)).await?;
        let scheme = listeners.security.scheme();
        let running = drafter.spawn(d_listeners).map_err(|e| anyhow!("{e}"))?;
        running.wait_serving(READY_WAIT).await.map_err(|e| anyhow!("{e}"))?;
        let settings = a.verifier.settings(vec![running.url()]);
        let verifier = verifier_server(&a.models, settings, a.verifier.batching()).await?;
        let grpc = listeners.grpc.local_addr()?;
        let metrics = listeners.metrics.local_addr()?;
        eprintln!(
            "tandem up: verifier on {grpc} (metrics {metrics}{}), drafter on {} (metrics {}); try\n  tandem generate --server {scheme}://{grpc} --prompt \"The capital of France is\"",
            http_part(&listeners)?, running.grpc, running.metrics
        );
        let result = verifier.serve(listeners, shutdown_signal()).await;
        let drafter = running.shutdown().await;
        result.and(drafter).map_err(|e| anyhow!("{e}"))
    })
}

/// Longest wait for a freshly started drafter to warm up.
pub(crate) const READY_WAIT: Duration = Duration::from_secs(60);
