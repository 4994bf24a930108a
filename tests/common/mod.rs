//! Shared harness of the end-to-end tests: the real Gemma 3 270M (fetched by
//! scripts/fetch-models.sh; tests never download), a randomly initialised DSpark drafter,
//! the shipped drafters, and real drafter and verifier servers on 127.0.0.1:0 with their /metrics endpoints,
//! plaintext and open or secured ([`Secure`]: TLS, mutual TLS, bearer tokens), a
//! verifier's OpenAI-compatible HTTP API among them ([`http`]: a raw HTTP/1.1 client).
#![allow(missing_docs, clippy::unwrap_used)]

pub mod http;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tandem_core::{Proposer, Route, Routed, TargetIdentity};
use tandem_drafter::{Drafter, DrafterConfig};
use tandem_dspark::{
    BatchedDrafter, DraftBatching, Dspark, DsparkConfig, DsparkProposer, RouterManifest, TargetDims,
};
use tandem_engine::{BatchLimits, Engine, Placement, TargetFiles};
use tandem_proto::v1 as pb;
use tandem_serving::{ClientTls, Listeners, Running, Security, Serve};
use tandem_testkit::{real_gguf, real_tokenizer};
use tandem_verifier::{Resolve, Verifier, VerifierSettings};

/// The real target and tokenizer, loaded once per test binary, its generations batched as
/// the verifier's are by default.
pub fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let files = TargetFiles {
                model: real_gguf(),
                tokenizer: real_tokenizer(),
            };
            let batching = Some(BatchLimits::default());
            Engine::load_batched(&files, &Placement::Cpu(Default::default()), batching)
                .expect("the real target")
        })
        .clone()
}

/// The real target's identity.
pub fn target() -> TargetIdentity {
    engine().model().identity().expect("identity")
}

/// A DSpark proposer whose sessions' blocks are drafted in batches, as the drafter
/// service's are by default.
pub type BatchedProposer = DsparkProposer<BatchedDrafter>;

/// A randomly initialised small DSpark drafter for the real target (the same weights
/// every call), drafting in batches.
pub fn random_drafter() -> Arc<BatchedProposer> {
    static DRAFTER: OnceLock<Arc<BatchedProposer>> = OnceLock::new();
    DRAFTER
        .get_or_init(|| {
            let head = engine().model().head().expect("a Gemma 3 head");
            let model =
                Dspark::init(DsparkConfig::small(&TargetDims::of(&head)), &head, 7).expect("init");
            batched(model, &head)
        })
        .clone()
}

/// A running server; stops when dropped.
pub struct Node {
    /// gRPC endpoint, `http://127.0.0.1:port`.
    pub url: String,
    /// /metrics address.
    pub metrics: SocketAddr,
    /// HTTP API address, when it serves one.
    pub http: Option<SocketAddr>,
    running: Running,
}

/// How a test server is secured, and how the harness reaches it to wait for SERVING.
#[derive(Clone, Default)]
pub struct Secure {
    /// The server's TLS and tokens (default: plaintext, open).
    pub security: Security,
    /// The harness's TLS to it (a TLS server); mutual TLS needs an identity in it.
    pub client: Option<ClientTls>,
}

impl Node {
    /// Asks the server to shut down.
    pub fn stop(&self) {
        self.running.stop();
    }

    /// Waits until `running` reports SERVING, reaching it over `client` TLS when given.
    async fn ready(running: Running, client: Option<&ClientTls>) -> Node {
        running
            .wait_serving_over(client, Duration::from_secs(60))
            .await
            .expect("SERVING");
        Node {
            url: running.url(),
            metrics: running.metrics,
            http: running.http,
            running,
        }
    }
}

/// A gRPC listener on `host` (an IP) and a metrics listener on 127.0.0.1, ports the OS picks.
pub async fn listeners(host: &str) -> Listeners {
    let any = |h: &str| SocketAddr::new(h.parse().expect("an IP"), 0);
    Listeners::bind(any(host), any("127.0.0.1"))
        .await
        .expect("listeners")
}

/// Starts a drafter serving `proposer` as a drafter for `target` on `host` (an IP).
pub async fn start_drafter_on(
    host: &str,
    proposer: Arc<dyn Proposer>,
    target: TargetIdentity,
) -> Node {
    start_drafter_kind(host, proposer, target, "dspark").await
}

/// Starts a drafter of `kind` serving `proposer` for `target` on `host` (an IP).
pub async fn start_drafter_kind(
    host: &str,
    proposer: Arc<dyn Proposer>,
    target: TargetIdentity,
    kind: &str,
) -> Node {
    start_drafter_secured(host, proposer, target, kind, Secure::default()).await
}

/// Starts a drafter of `kind` serving `proposer` for `target` on `host` (an IP), secured
/// as `secure` says.
pub async fn start_drafter_secured(
    host: &str,
    proposer: Arc<dyn Proposer>,
    target: TargetIdentity,
    kind: &str,
    secure: Secure,
) -> Node {
    start_drafter_with(host, proposer, DrafterConfig::new(target, kind), secure).await
}

/// Starts a drafter serving `proposer` as `cfg` says on `host` (an IP), secured as `secure`
/// says.
pub async fn start_drafter_with(
    host: &str,
    proposer: Arc<dyn Proposer>,
    cfg: DrafterConfig,
    secure: Secure,
) -> Node {
    let drafter = Drafter::new(proposer, cfg);
    let listeners = listeners(host).await.with_security(secure.security);
    let running = drafter.spawn(listeners).expect("spawn");
    Node::ready(running, secure.client.as_ref()).await
}

/// The folder of the DSpark drafter shipped in drafters/.
pub fn shipped_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../drafters/gemma-3-270m-dspark")
}

/// The shipped DSpark drafter over the real target (loaded once per test binary),
/// drafting in batches.
pub fn shipped_drafter() -> Arc<BatchedProposer> {
    static DRAFTER: OnceLock<Arc<BatchedProposer>> = OnceLock::new();
    DRAFTER
        .get_or_init(|| {
            let head = engine().model().head().expect("a Gemma 3 head");
            let model = Dspark::load(&shipped_dir(), &head).expect("the shipped drafter loads");
            batched(model, &head)
        })
        .clone()
}

/// The folder of the routed set `--drafter shipped` loads.
pub fn shipped_set_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../drafters/gemma-3-270m-router")
}

/// The routed set `--drafter shipped` loads (drafters/gemma-3-270m-router) over the real
/// target, each route drafting in batches (loaded once per test binary).
pub fn shipped_set() -> Arc<Routed> {
    static SET: OnceLock<Arc<Routed>> = OnceLock::new();
    SET.get_or_init(|| {
        let head = engine().model().head().expect("a Gemma 3 head");
        let dir = shipped_set_dir();
        let m = RouterManifest::read(&dir).expect("the shipped router");
        let routes = (m.routes.iter().zip(m.drafter_dirs(&dir)))
            .map(|(spec, dir)| {
                let model = Dspark::load(&dir, &head).expect("a shipped drafter loads");
                let proposer: Arc<dyn Proposer> = batched(model, &head);
                Route {
                    name: spec.name.clone(),
                    proposer,
                }
            })
            .collect();
        let default = m.default_index().expect("a default route");
        Arc::new(Routed::new(routes, m.router, default).expect("the set routes"))
    })
    .clone()
}

/// `model` as a proposer drafting in batches with the default limits.
fn batched(model: Dspark, head: &tandem_gemma::TargetHead) -> Arc<BatchedProposer> {
    let p = DsparkProposer::batched(Arc::new(model), head, DraftBatching::default());
    Arc::new(p.expect("proposer"))
}

/// Starts a drafter with the random DSpark drafter for the real target on 127.0.0.1.
pub async fn start_drafter() -> Node {
    start_drafter_on("127.0.0.1", random_drafter(), target()).await
}

/// Verifier settings for tests.
pub struct VerifierSetup {
    pub drafters: Vec<String>,
    pub gamma: usize,
    pub max_concurrent: usize,
    pub refresh: Option<Duration>,
    pub resolver: Option<Box<dyn Resolve>>,
    /// Longest wait for a client to read a chunk (default: the server's).
    pub slow_client: Option<Duration>,
    /// Longest prompt + generation (default: the model's).
    pub max_context: Option<usize>,
    /// Requests that may wait for admission (default: the server's).
    pub max_queued: Option<usize>,
    /// The verifier's TLS to its drafters.
    pub drafter_tls: Option<ClientTls>,
    /// The verifier's own listener.
    pub secure: Secure,
    /// Serve the HTTP API too (on 127.0.0.1, a port the OS picks).
    pub http: bool,
}

impl Default for VerifierSetup {
    fn default() -> Self {
        Self {
            drafters: Vec::new(),
            gamma: 8,
            max_concurrent: 8,
            refresh: None,
            resolver: None,
            slow_client: None,
            max_context: None,
            max_queued: None,
            drafter_tls: None,
            secure: Secure::default(),
            http: false,
        }
    }
}

/// Assembles a verifier over `engine` as `setup` says (contacting its drafters once).
pub async fn build_verifier(
    engine: Engine,
    setup: VerifierSetup,
) -> Result<Verifier, tandem_verifier::VerifierError> {
    let settings = VerifierSettings {
        gamma: setup.gamma,
        adaptive_gamma: false,
        default_max_tokens: 64,
        max_concurrent: setup.max_concurrent,
        kv_cache_bytes: 1 << 30,
        drafters: setup.drafters,
        drafter_refresh: setup.refresh,
        // These tests check outputs and counts, not latency: a draft on a loaded
        // two-core CI machine (eight sessions, two drafters) has taken over 10 s.
        open_timeout: Duration::from_secs(60),
        propose_timeout: Duration::from_secs(120),
        max_context: setup.max_context,
        drafter_tls: setup.drafter_tls,
        ..VerifierSettings::default()
    };
    let settings = VerifierSettings {
        slow_client_timeout: setup.slow_client.unwrap_or(settings.slow_client_timeout),
        max_queued: setup.max_queued.unwrap_or(settings.max_queued),
        ..settings
    };
    let mut builder = Verifier::builder(engine, settings);
    if let Some(r) = setup.resolver {
        builder = builder.resolver(r);
    }
    builder.build().await
}

/// Starts a verifier over the real target.
pub async fn start_verifier(setup: VerifierSetup) -> Node {
    start_verifier_for(engine(), setup).await
}

/// Starts a verifier over `engine`.
pub async fn start_verifier_for(engine: Engine, mut setup: VerifierSetup) -> Node {
    let secure = std::mem::take(&mut setup.secure);
    let http = setup.http;
    let verifier = build_verifier(engine, setup).await.expect("verifier");
    let mut listeners = listeners("127.0.0.1").await.with_security(secure.security);
    if http {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        listeners = listeners.with_http(any).await.expect("an HTTP listener");
    }
    let running = verifier.spawn(listeners).expect("spawn");
    Node::ready(running, secure.client.as_ref()).await
}

/// The health status of the server at `url` ("" service), -1 when it does not answer.
pub async fn health(url: &str) -> i32 {
    tandem_serving::health(url).await.map_or(-1, |s| s as i32)
}

/// Fetches and parses a /metrics page: series (name with labels) → value. Panics on a line
/// that is not Prometheus text.
pub async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    tokio::task::spawn_blocking(move || tandem_testkit::metrics::scrape(addr))
        .await
        .unwrap()
}

pub use tandem_testkit::metrics::total;

/// A greedy request for `prompt`.
pub fn request(prompt: &str, max_tokens: u32, speculative: bool) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Text(prompt.into())),
        sampling: None,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        ignore_eos: true,
        speculative: Some(speculative),
        max_gamma: None,
        ..Default::default()
    }
}

/// Runs a generation to its end: all token ids, the text and the finish message.
pub async fn generate(
    url: &str,
    req: pb::GenerateRequest,
) -> Result<(Vec<u32>, String, pb::Finished), tonic::Status> {
    generate_as(url, None, None, req).await
}

/// [`generate`] over `tls` (an `https://` URL) with `token` as the bearer token.
pub async fn generate_as(
    url: &str,
    tls: Option<&ClientTls>,
    token: Option<&str>,
    req: pb::GenerateRequest,
) -> Result<(Vec<u32>, String, pb::Finished), tonic::Status> {
    let channel = tandem_serving::endpoint(url, tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))?;
    let mut client = pb::generation_client::GenerationClient::new(channel);
    let mut req = tonic::Request::new(req);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        req.metadata_mut().insert("authorization", value);
    }
    let mut stream = client.generate(req).await?.into_inner();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(msg) = stream.message().await? {
        ids.extend(msg.token_ids);
        text.push_str(&msg.text);
        if let Some(f) = msg.finished {
            return Ok((ids, text, f));
        }
    }
    Err(tonic::Status::internal(
        "stream ended without a finish message",
    ))
}

/// [`generate`] with an owned URL, for `tokio::spawn`.
pub async fn generate_owned(
    url: String,
    req: pb::GenerateRequest,
) -> Result<(Vec<u32>, String, pb::Finished), tonic::Status> {
    generate(&url, req).await
}
