//! `tandem bench soak`: a verifier and two drafters on loopback in this process (real
//! sockets), N client sessions sending requests for M seconds — normal generations, greedy
//! and sampled, cancellations, slow and stalled readers, bad requests and short deadlines,
//! each drawn from a seeded RNG after the first requests have tried every behaviour once —
//! while one drafter is killed at half time and started again on its address a few seconds
//! later. It reports every request's outcome by behaviour, unexpected errors by gRPC code,
//! lost generations, RSS along the load and after it (growth is measured from the first
//! tenth of the load, when every behaviour has run at full concurrency), the services'
//! gauges (which must be back at 0) and counters, and fails when any of its criteria is not
//! met.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use pb::generation_client::GenerationClient;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;
use tandem_proto::v1 as pb;
use tandem_verifier::VerifierSettings;
use tonic::transport::Channel;

use crate::drafter::DrafterArgs;
use crate::loopback::{self, Loopback};
use crate::models::ModelArgs;
use crate::scrape::{scrape, total};
use crate::serve;
use crate::soak_client::{Behaviour, Clients, Outcome, BEHAVIOURS};

/// Prompts when no `--prompts-file` is given: prose, a chat turn, a question, code.
const PROMPTS: [&str; 4] = [
    "The river flows through the valley and",
    "<start_of_turn>user\nWrite a short note thanking a colleague.<end_of_turn>\n<start_of_turn>model\n",
    "Q: Why is the sky blue?\nA:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
];
/// Seconds between the drafter's kill and its restart.
const RESTART_DELAY: Duration = Duration::from_secs(3);
/// Longest wait for the gauges to come back to 0 once the load stopped.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);
/// Pause after the gauges are at 0, before RSS is read.
const SETTLE: Duration = Duration::from_secs(2);
/// Gauges that must be 0 at the end: on the verifier, and (the first) on every drafter.
const VERIFIER_GAUGES: [&str; 3] = [
    "tandem_active_sessions",
    "tandem_kv_cache_usage_ratio",
    "tandem_queued_requests",
];
/// Verifier counters the report shows (every label).
const COUNTERS: [&str; 5] = [
    "tandem_drafter_failovers_total",
    "tandem_refused_requests_total",
    "tandem_dropped_requests_total",
    "tandem_draft_rpc_errors_total",
    "tandem_proposer_failures_total",
];

/// Flags of `tandem bench soak`.
#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Client sessions running at once.
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Tokens per normal generation.
    #[arg(long, default_value_t = 48)]
    max_tokens: u32,
    /// Seed of the behaviours' draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Prompts, one a line (default: a built-in prose, chat, question and code set).
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Seconds the verifier waits for a reader before dropping it.
    #[arg(long, default_value_t = 2)]
    slow_client_seconds: u64,
    /// Largest RSS growth accepted from the first tenth of the load to the end, in percent.
    #[arg(long, default_value_t = 5.0)]
    rss_limit_percent: f64,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

/// The kill and restart of a drafter.
#[derive(Serialize, Default)]
struct Restart {
    killed_at_s: f64,
    restarted_at_s: f64,
    /// Sessions the restarted drafter opened before the end.
    sessions_after_restart: f64,
}

/// What `--json` gets.
#[derive(Serialize)]
struct SoakReport {
    sessions: usize,
    seconds: u64,
    max_tokens: u32,
    seed: u64,
    drafter: String,
    backend: String,
    load_s: f64,
    requests: u64,
    /// Behaviour → outcome → requests.
    outcomes: BTreeMap<Behaviour, BTreeMap<String, u64>>,
    /// gRPC code → requests that ended with it unexplained.
    unexpected_errors: BTreeMap<String, u64>,
    /// Requests that had to finish and did not (errors included).
    lost_generations: u64,
    greedy_mismatches: u64,
    restart: Restart,
    /// After the warm-up requests, before the load.
    rss_before_load_mib: f64,
    /// After the first tenth of the load (every behaviour has run at full concurrency):
    /// where growth is measured from.
    rss_start_mib: f64,
    /// At every tenth of the load.
    rss_samples_mib: Vec<f64>,
    /// After the load, once the gauges read 0.
    rss_end_mib: f64,
    rss_growth_percent: f64,
    rss_limit_percent: f64,
    /// Seconds from the end of the load until every gauge read 0.
    settle_s: f64,
    /// `service/gauge` → value at the end.
    gauges: BTreeMap<String, f64>,
    /// Verifier series of [`COUNTERS`] → value at the end.
    counters: BTreeMap<String, f64>,
    /// The criteria not met (none: the soak passed).
    failures: Vec<String>,
}

/// Every request's outcome, by behaviour.
#[derive(Default)]
struct Tally(BTreeMap<Behaviour, BTreeMap<Outcome, u64>>);

pub fn run(a: SoakArgs) -> Result<()> {
    if a.sessions == 0 || a.seconds == 0 || a.max_tokens == 0 {
        bail!("--sessions, --seconds and --max-tokens must be at least 1");
    }
    let prompts = prompts(&a)?;
    let report = serve::runtime()?.block_on(soak(&a, prompts))?;
    print_report(&report);
    if let Some(path) = &a.json {
        crate::bench::write_json(path, &report)?;
    }
    if !report.failures.is_empty() {
        bail!("the soak failed: {}", report.failures.join("; "));
    }
    Ok(())
}

fn prompts(a: &SoakArgs) -> Result<Vec<String>> {
    let Some(path) = &a.prompts_file else {
        return Ok(PROMPTS.iter().map(|p| p.to_string()).collect());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let prompts: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    if prompts.is_empty() {
        bail!("{} holds no prompt", path.display());
    }
    Ok(prompts)
}

/// The verifier's settings: slow readers dropped after `--slow-client-seconds`, drafters
/// looked at again every second (so the restarted one is found soon).
fn settings(a: &SoakArgs) -> VerifierSettings {
    VerifierSettings {
        slow_client_timeout: Duration::from_secs(a.slow_client_seconds),
        drafter_refresh: Some(Duration::from_secs(1)),
        ..VerifierSettings::default()
    }
}

async fn soak(a: &SoakArgs, prompts: Vec<String>) -> Result<SoakReport> {
    let loading = Instant::now();
    let mut lb = loopback::start_with(&a.drafter, &a.models, 2, settings(a)).await?;
    let load_s = loading.elapsed().as_secs_f64();
    let clients = Arc::new(warm_up(&lb, a, prompts).await?);
    let rss_before_load = rss_mib()?;
    let started = Instant::now();
    let load = Duration::from_secs(a.seconds);
    let sampler = tokio::spawn(sample_rss(started, load));
    let drawn = Arc::new(AtomicUsize::new(0));
    let sessions = (0..a.sessions).map(|s| {
        let (clients, drawn) = (Arc::clone(&clients), Arc::clone(&drawn));
        tokio::spawn(session(clients, a.seed, s, started + load, drawn))
    });
    let sessions: Vec<_> = sessions.collect();
    let restart = restart_midway(&mut lb, a, started, load).await?;
    let mut tally = Tally::default();
    for s in sessions {
        tally.merge(s.await.context("a client session panicked")?);
    }
    let ended = Instant::now();
    let (gauges, counters, new_sessions) = settle(&lb).await?;
    let settle_s = ended.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let rss_end = rss_mib()?;
    let rss_samples = sampler.await?;
    let rss_start = rss_samples.first().copied().unwrap_or(rss_before_load);
    let mut report = tally.report(a);
    report.load_s = load_s;
    report.restart = Restart {
        sessions_after_restart: new_sessions,
        ..restart
    };
    report.rss_before_load_mib = rss_before_load;
    report.rss_start_mib = rss_start;
    report.rss_samples_mib = rss_samples;
    report.rss_end_mib = rss_end;
    report.rss_growth_percent = 100.0 * (rss_end - rss_start) / rss_start;
    report.settle_s = settle_s;
    report.gauges = gauges;
    report.counters = counters;
    report.failures = failures(&report);
    Ok(report)
}

/// The clients, with each prompt's plain greedy tokens, after one plain and one
/// speculative run of every prompt (so the RSS read next is warm).
async fn warm_up(lb: &Loopback, a: &SoakArgs, prompts: Vec<String>) -> Result<Clients> {
    let mut client = GenerationClient::connect(lb.url().to_string()).await?;
    let info = client
        .get_model_info(pb::GetModelInfoRequest {})
        .await?
        .into_inner();
    let mut clients = Clients {
        url: lb.url().to_string(),
        prompts,
        plain: Vec::new(),
        max_tokens: a.max_tokens,
        vocab: info.vocab_size,
        max_context: info.max_context,
        slow_client: Duration::from_secs(a.slow_client_seconds),
    };
    for p in 0..clients.prompts.len() {
        let mut ids = Vec::new();
        for speculative in [false, true] {
            let req = clients.request(p, a.max_tokens, speculative);
            let mut stream = client.generate(req).await?.into_inner();
            ids.clear();
            while let Some(m) = stream.message().await? {
                ids.extend(m.token_ids);
            }
        }
        clients.plain.push(ids);
    }
    Ok(clients)
}

/// One client session: requests one after another on one connection until `until`.
/// `drawn` counts the requests of all sessions: the first ones go through every behaviour
/// once, so even a short soak tries each; the rest are drawn from the session's RNG.
async fn session(
    clients: Arc<Clients>,
    seed: u64,
    id: usize,
    until: Instant,
    drawn: Arc<AtomicUsize>,
) -> Tally {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id as u64);
    let mut tally = Tally::default();
    let channel = match Channel::from_shared(clients.url.clone()) {
        Ok(endpoint) => endpoint.connect_lazy(),
        Err(_) => return tally,
    };
    while Instant::now() < until {
        let b = match drawn.fetch_add(1, Ordering::Relaxed) {
            n if n < BEHAVIOURS.len() => BEHAVIOURS[n].0,
            _ => Behaviour::draw(&mut rng),
        };
        let outcome = clients.run(&channel, b, &mut rng).await;
        tally.add(b, outcome);
    }
    tally
}

/// Kills drafter 0 at half time and starts it again [`RESTART_DELAY`] later.
async fn restart_midway(
    lb: &mut Loopback,
    a: &SoakArgs,
    started: Instant,
    load: Duration,
) -> Result<Restart> {
    tokio::time::sleep_until((started + load / 2).into()).await;
    lb.kill_drafter(0).await?;
    let killed_at_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(RESTART_DELAY).await;
    lb.restart_drafter(0, &a.drafter, &a.models).await?;
    Ok(Restart {
        killed_at_s,
        restarted_at_s: started.elapsed().as_secs_f64(),
        sessions_after_restart: 0.0,
    })
}

/// Waits (up to [`SETTLE_LIMIT`]) for every gauge to read 0; returns the gauges, the
/// verifier's counters and the sessions the restarted drafter opened.
async fn settle(lb: &Loopback) -> Result<(BTreeMap<String, f64>, BTreeMap<String, f64>, f64)> {
    let limit = Instant::now() + SETTLE_LIMIT;
    loop {
        let verifier = scrape(lb.verifier_metrics()).await?;
        let mut gauges: BTreeMap<String, f64> = VERIFIER_GAUGES
            .iter()
            .map(|g| (format!("verifier/{g}"), total(&verifier, g)))
            .collect();
        let mut new_sessions = 0.0;
        for (i, addr) in lb.drafter_metrics().into_iter().enumerate() {
            let drafter = scrape(addr).await?;
            let name = format!("drafter{i}/tandem_active_sessions");
            gauges.insert(name, total(&drafter, "tandem_active_sessions"));
            if i == 0 {
                new_sessions = total(&drafter, "tandem_drafter_sessions_total");
            }
        }
        if gauges.values().all(|v| *v == 0.0) || Instant::now() >= limit {
            let counters = verifier
                .into_iter()
                .filter(|(k, _)| COUNTERS.iter().any(|c| k.starts_with(c)))
                .collect();
            return Ok((gauges, counters, new_sessions));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// RSS at every tenth of the load (the last at its end).
async fn sample_rss(started: Instant, load: Duration) -> Vec<f64> {
    let mut samples = Vec::with_capacity(10);
    for k in 1..=10 {
        tokio::time::sleep_until((started + load * k / 10).into()).await;
        samples.extend(rss_mib().ok());
    }
    samples
}

/// This process's resident memory, in MiB.
fn rss_mib() -> Result<f64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .context("no VmRSS in /proc/self/status")?;
    Ok(kib / 1024.0)
}

impl Tally {
    fn add(&mut self, b: Behaviour, o: Outcome) {
        *self.0.entry(b).or_default().entry(o).or_default() += 1;
    }

    fn merge(&mut self, other: Tally) {
        for (b, outcomes) in other.0 {
            for (o, n) in outcomes {
                *self.0.entry(b).or_default().entry(o).or_default() += n;
            }
        }
    }

    /// The report's request figures (the rest is filled in by the caller).
    fn report(&self, a: &SoakArgs) -> SoakReport {
        let mut unexpected = BTreeMap::new();
        let (mut lost, mut mismatches, mut requests) = (0, 0, 0);
        for (b, outcomes) in &self.0 {
            for (o, n) in outcomes {
                requests += n;
                match o {
                    Outcome::Unexpected(code) => {
                        *unexpected.entry(code.clone()).or_default() += n;
                    }
                    Outcome::Mismatch => mismatches += n,
                    _ => {}
                }
                let finished = matches!(o, Outcome::Finished | Outcome::Mismatch);
                if b.must_finish() && !finished {
                    lost += n;
                }
            }
        }
        let outcomes = self.0.iter().map(|(b, os)| {
            let os = os.iter().map(|(o, n)| (o.name(), *n)).collect();
            (*b, os)
        });
        SoakReport {
            sessions: a.sessions,
            seconds: a.seconds,
            max_tokens: a.max_tokens,
            seed: a.seed,
            drafter: a.drafter.drafter.clone(),
            backend: a.models.backend(),
            load_s: 0.0,
            requests,
            outcomes: outcomes.collect(),
            unexpected_errors: unexpected,
            lost_generations: lost,
            greedy_mismatches: mismatches,
            restart: Restart::default(),
            rss_before_load_mib: 0.0,
            rss_start_mib: 0.0,
            rss_samples_mib: Vec::new(),
            rss_end_mib: 0.0,
            rss_growth_percent: 0.0,
            rss_limit_percent: a.rss_limit_percent,
            settle_s: 0.0,
            gauges: BTreeMap::new(),
            counters: BTreeMap::new(),
            failures: Vec::new(),
        }
    }
}

/// The soak's criteria that `r` does not meet.
fn failures(r: &SoakReport) -> Vec<String> {
    let mut out = Vec::new();
    let unexpected: u64 = r.unexpected_errors.values().sum();
    if unexpected > 0 {
        out.push(format!(
            "{unexpected} unexpected errors {:?}",
            r.unexpected_errors
        ));
    }
    if r.lost_generations > 0 {
        out.push(format!("{} lost generations", r.lost_generations));
    }
    if r.greedy_mismatches > 0 {
        out.push(format!(
            "{} greedy generations differ from plain decoding",
            r.greedy_mismatches
        ));
    }
    for (g, v) in &r.gauges {
        if *v != 0.0 {
            out.push(format!("{g} is {v} at the end"));
        }
    }
    if r.rss_growth_percent > r.rss_limit_percent {
        out.push(format!(
            "RSS grew {:.1} % ({:.0} → {:.0} MiB), above {} %",
            r.rss_growth_percent, r.rss_start_mib, r.rss_end_mib, r.rss_limit_percent
        ));
    }
    out
}

fn print_report(r: &SoakReport) {
    println!(
        "soak: {} sessions × {} s, {} requests, drafter {} ({}), seed {}",
        r.sessions, r.seconds, r.requests, r.drafter, r.backend, r.seed
    );
    for (b, outcomes) in &r.outcomes {
        let line: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
        println!("  {:<12} {}", format!("{b:?}"), line.join(", "));
    }
    println!(
        "unexpected errors {:?}, lost generations {}, greedy mismatches {}",
        r.unexpected_errors, r.lost_generations, r.greedy_mismatches
    );
    println!(
        "drafter 0 killed at {:.1} s, restarted at {:.1} s, {} sessions on it afterwards",
        r.restart.killed_at_s, r.restart.restarted_at_s, r.restart.sessions_after_restart
    );
    let samples: Vec<String> = r
        .rss_samples_mib
        .iter()
        .map(|m| format!("{m:.0}"))
        .collect();
    println!(
        "RSS {:.0} MiB before the load, {:.0} MiB after its first tenth → {:.0} MiB at the end ({:+.1} %, limit {} %); every tenth: {}",
        r.rss_before_load_mib, r.rss_start_mib, r.rss_end_mib, r.rss_growth_percent, r.rss_limit_percent, samples.join(" ")
    );
    println!("gauges after {:.1} s: {:?}", r.settle_s, r.gauges);
    println!("counters: {:?}", r.counters);
    match r.failures.is_empty() {
        true => println!("PASS"),
        false => println!("FAIL: {}", r.failures.join("; ")),
    }
}
