//! What operators rely on, against real components: the metric families the services
//! export are exactly deploy/metrics.txt (which the dashboard and rules are checked
//! against); a real Prometheus (Debian's package) scraping a verifier and a drafter computes
//! the mean acceptance length of deploy/prometheus's recording rule equal to what the
//! generations reported; and DNS discovery keeps new sessions working when one of the
//! drafters behind a name stops and a new one appears.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession, SamplingParams,
    SnapshotRows, SnapshotSpec,
};
use tandem_e2e::*;
use tandem_proto::v1 as pb;
use tandem_verifier::{Lookup, Resolve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Metric family names of a scrape (histogram series folded into their family).
fn families(series: &std::collections::BTreeMap<String, f64>) -> BTreeSet<String> {
    let names: BTreeSet<String> = series
        .keys()
        .map(|k| k.split('{').next().unwrap().to_string())
        .collect();
    names
        .iter()
        .map(|n| {
            for suffix in ["_bucket", "_sum", "_count"] {
                if let Some(base) = n.strip_suffix(suffix) {
                    if names.contains(&format!("{base}_bucket")) {
                        return base.to_string();
                    }
                }
            }
            n.clone()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exported_families_are_exactly_deploy_metrics_txt() {
    // The shipped drafters: a routed set exports its routes too.
    let d = start_drafter_on("127.0.0.1", shipped_set(), target()).await;
    let v = start_verifier(VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    })
    .await;
    generate(&v.url, request("Hello", 4, true)).await.unwrap();
    let mut exported = families(&scrape(v.metrics).await);
    exported.extend(families(&scrape(d.metrics).await));
    let listed: BTreeSet<String> = std::fs::read_to_string(repo().join("deploy/metrics.txt"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    assert_eq!(
        exported, listed,
        "update deploy/metrics.txt (and the dashboard) with the services"
    );
    // "Hello" is too short to route: the default (general) drafter drafted it. A docs
    // prompt (token ids cut from a held-out documentation file) goes to the docs drafter:
    // its tokens reached the drafter with the rows. (A session is routed when its rows are
    // first sent, before its first draft; 24 tokens leave room for one past the lookups.)
    let routed = |m: &BTreeMap<String, f64>, route: &str| {
        m[&format!("tandem_drafter_routed_sessions_total{{route=\"{route}\"}}")]
    };
    let after_hello = scrape(d.metrics).await;
    assert_eq!(
        (
            routed(&after_hello, "docs"),
            routed(&after_hello, "general")
        ),
        (0.0, 1.0)
    );
    let docs: Vec<Vec<u32>> = serde_json::from_str(
        &std::fs::read_to_string(shipped_dir().join("held_out_prompts.json")).unwrap(),
    )
    .unwrap();
    let ids = pb::generate_request::Prompt::TokenIds(pb::TokenIds {
        ids: docs[0].clone(),
    });
    let req = pb::GenerateRequest {
        prompt: Some(ids),
        ..request("", 24, true)
    };
    generate(&v.url, req).await.unwrap();
    let after_docs = scrape(d.metrics).await;
    assert_eq!(
        (routed(&after_docs, "docs"), routed(&after_docs, "general")),
        (1.0, 1.0)
    );
}

/// Drafts by following the target's own bigrams (learned from its plain output): right
/// often, wrong often, so rounds accept partially.
struct Bigrams {
    next: HashMap<u32, u32>,
    spec: SnapshotSpec,
}

impl Proposer for Bigrams {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.spec.clone()
    }
    fn max_gamma(&self) -> usize {
        8
    }
    fn open(&self, _: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        Ok(Box::new(BigramSession(self.next.clone())))
    }
}

struct BigramSession(HashMap<u32, u32>);

impl ProposerSession for BigramSession {
    fn extend(&mut self, _: &SnapshotRows) -> Result<(), ProposeError> {
        Ok(())
    }
    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        let mut t = req.anchor;
        let tokens: Vec<u32> = (0..req.gamma)
            .map(|_| {
                t = self.0.get(&t).copied().unwrap_or(0);
                t
            })
            .collect();
        Ok(DraftBlock::point_masses(tokens, 0.5))
    }
}

const PROMETHEUS_PROMPTS: [&str; 3] = [
    "1, 2, 3, 4,",
    "Monday, Tuesday, Wednesday,",
    "The quick brown fox",
];

fn bigram_drafter() -> Bigrams {
    let e = engine();
    let mut next = HashMap::new();
    for p in PROMETHEUS_PROMPTS {
        let req = tandem_engine::GenerationRequest {
            prompt: e.tokenizer().encode(p, true).unwrap(),
            max_tokens: 48,
            ignore_eos: true,
            ..Default::default()
        };
        let out = e
            .generate(&req, None, &mut |_: &tandem_engine::Update| {
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
        let all: Vec<u32> = req.prompt.iter().chain(&out.tokens).copied().collect();
        for w in all.windows(2) {
            next.entry(w[0]).or_insert(w[1]);
        }
    }
    Bigrams {
        next,
        spec: random_drafter().snapshot_spec(),
    }
}

/// A Prometheus server on loopback, stopped when dropped (its folder removed after).
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(verifier: SocketAddr, drafter: SocketAddr) -> Prometheus {
    let bin = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("prometheus missing: install Debian's prometheus package (scripts/test does)");
    let tmp = tempfile::Builder::new()
        .prefix("tandem-prom-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let rules = repo()
        .join("deploy/prometheus/tandem-recording.rules.yml")
        .canonicalize()
        .unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: tandem-verifier\n    static_configs:\n      - targets: ['{verifier}']\n  - job_name: tandem-drafter\n    static_configs:\n      - targets: ['{drafter}']\n",
        rules.display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = Command::new(bin)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    Prometheus {
        child,
        addr,
        _dir: tmp,
    }
}

/// The value of an instant query with exactly one result, if it has one.
async fn query(addr: SocketAddr, q: &str) -> Option<f64> {
    let encoded: String = q
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "GET /api/v1/query?query={encoded} HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.ok()?;
    let body = raw.split_once("\r\n\r\n")?.1;
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    let result = json["data"]["result"].as_array()?;
    (result.len() == 1).then(|| result[0]["value"][1].as_str()?.parse().ok())?
}

async fn poll(addr: SocketAddr, q: &str, done: impl Fn(f64) -> bool) -> Option<f64> {
    let mut last = None;
    for _ in 0..120 {
        last = query(addr, q).await;
        if last.is_some_and(&done) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_computes_the_reported_mean_acceptance_length() {
    let drafter = tokio::task::spawn_blocking(bigram_drafter).await.unwrap();
    let d = start_drafter_on("127.0.0.1", Arc::new(drafter), target()).await;
    let v = start_verifier(VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    })
    .await;
    let prom = start_prometheus(v.metrics, d.metrics);
    let up = poll(prom.addr, "sum(up{job=~\"tandem-.*\"})", |x| x == 2.0).await;
    assert_eq!(up, Some(2.0), "Prometheus scrapes both services");
    let (mut accepted, mut drafts) = (0u64, 0u64);
    for p in PROMETHEUS_PROMPTS {
        let (_, _, f) = generate(&v.url, request(p, 48, true)).await.unwrap();
        let s = f.speculation.unwrap();
        accepted += s.accepted_tokens;
        drafts += s.drafts;
    }
    assert!(
        accepted > 0 && accepted < drafts * 8,
        "partial acceptance: {accepted} of {drafts} rounds"
    );
    let reported = 1.0 + accepted as f64 / drafts as f64;
    let scraped = poll(prom.addr, "tandem_spec_drafts_total", |x| {
        x == drafts as f64
    })
    .await;
    assert_eq!(scraped, Some(drafts as f64));
    let q = "tandem:mean_acceptance_length:rate5m{job=\"tandem-verifier\"}";
    let computed = poll(prom.addr, q, |x| (x - reported).abs() < 1e-6).await;
    assert!(
        computed.is_some_and(|x| (x - reported).abs() < 1e-6),
        "Prometheus says {computed:?}, the generations reported {reported}"
    );
}

/// A resolver whose answer the test changes, standing in for DNS records of a headless
/// Service whose pods come and go.
#[derive(Clone, Default)]
struct Records(Arc<Mutex<Vec<SocketAddr>>>);

impl Records {
    fn set(&self, urls: &[&str]) {
        *self.0.lock().unwrap() = urls
            .iter()
            .map(|u| u.trim_start_matches("http://").parse().unwrap())
            .collect();
    }
}

impl Resolve for Records {
    fn resolve<'a>(&'a self, host: &'a str, _: u16) -> Lookup<'a> {
        let addrs = self.0.lock().unwrap().clone();
        Box::pin(async move {
            assert_eq!(host, "drafters.tandem.test");
            Ok(addrs)
        })
    }
}

async fn sessions(node: &Node) -> f64 {
    scrape(node.metrics).await["tandem_drafter_sessions_total"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_discovery_survives_a_stopped_drafter_and_finds_a_new_one() {
    let (d1, d2, d3) = (
        start_drafter().await,
        start_drafter().await,
        start_drafter().await,
    );
    let records = Records::default();
    records.set(&[&d1.url, &d2.url]);
    let setup = VerifierSetup {
        drafters: vec!["dns:///drafters.tandem.test:50052".into()],
        refresh: Some(Duration::from_millis(200)),
        resolver: Some(Box::new(records.clone())),
        ..Default::default()
    };
    let v = start_verifier(setup).await;
    let run = |n: usize| {
        let url = v.url.clone();
        async move {
            for _ in 0..n {
                let (ids, _, f) = generate(&url, request("The capital of France is", 6, true))
                    .await
                    .unwrap();
                let s = f.speculation.unwrap();
                assert_eq!(ids.len(), 6);
                assert!(s.drafts > 0 && s.proposer_failures == 0, "{s:?}");
            }
        }
    };
    run(2).await;
    assert!(
        sessions(&d1).await >= 1.0 && sessions(&d2).await >= 1.0,
        "both drafters behind the name used"
    );
    d1.stop();
    let gone = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    for _ in 0..100 {
        if health(&d1.url).await != gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = sessions(&d2).await;
    run(3).await;
    assert_eq!(
        sessions(&d2).await,
        before + 3.0,
        "new sessions went to the drafter still up"
    );
    records.set(&[&d2.url, &d3.url]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    run(2).await;
    assert!(
        sessions(&d3).await >= 1.0,
        "the new drafter behind the name gets sessions"
    );
    let vm = scrape(v.metrics).await;
    assert_eq!(vm["tandem_drafters_available"], 2.0);
}
