//! `tandem bench load`: what many clients get from one verifier. A verifier and drafters run
//! on loopback in this process (real sockets, gRPC); at each concurrency C, C clients each
//! send `--requests` streamed requests one after another (closed loop), every request
//! generating exactly `--max-tokens` tokens. Each mode runs on its own verifier: `plain`
//! (no drafting), `fixed` (γ = `--gamma` every round), `scheduled` (adaptive γ: the batch's
//! draft scheduler chooses every generation's length from its acceptance and the measured
//! step costs). Reported per mode and concurrency:
//! aggregate tok/s (all tokens over the wall time), per-user tok/s (a request's tokens over
//! its time after the first token, averaged), time to first token and inter-token latency
//! (a chunk's gap shared by its tokens) at p50 and p99, and the verifier's mean sessions and
//! token rows per batched step. Where the time goes: the busy window (until the first
//! client has finished, every client is generating; the tokens of that window over it are
//! the batch's steady throughput, beside the aggregate that also holds the tail in which
//! the slowest clients run in a thinning batch), the slowest tenth of requests' per-user
//! rate, the mean step, and the drafter calls per request with their mean latency. JSON and
//! a PNG chart on request. With `--rounds N` every mode's verifier is served side by side
//! and each concurrency runs the modes in turn N times: each mode's aggregate over plain's
//! is paired within a round (minutes apart at most), so a machine whose speed drifts over
//! the run moves both sides of a ratio ([`crate::bench_load_report::pair`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use pb::generation_client::GenerationClient;
use serde::{Deserialize, Serialize};
use tandem_core::Verification;
use tandem_engine::BatchLimits;
use tandem_proto::v1 as pb;
use tandem_tokenizer::GemmaTokenizer;
use tandem_verifier::VerifierSettings;
use tonic::transport::Channel;

use crate::bench_load_report::{pair, print_report, PairedRatio};
use crate::bench_rpc::PROMPTS;
use crate::drafter::DrafterArgs;
use crate::loopback::{self, Loopback};
use crate::models::ModelArgs;
use crate::scrape::{scrape, total};
use crate::{prompt_sets, serve};

/// How a mode's verifier drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// No drafting.
    Plain,
    /// γ = `--gamma` every round.
    Fixed,
    /// Adaptive γ (up to `--gamma`): the batch scheduler's lengths while generations share
    /// steps, each generation's own policy while it runs alone.
    Scheduled,
}

/// Flags of `tandem bench load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Concurrent clients, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    concurrency: Vec<usize>,
    /// Modes, each on its own verifier.
    #[arg(long, value_delimiter = ',', default_value = "plain,fixed,scheduled")]
    modes: Vec<LoadMode>,
    /// Times each concurrency runs every mode in turn (ratios to plain paired by round).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 2)]
    requests: usize,
    /// Tokens per request (end-of-sequence ignored).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature (0: greedy); sampled requests are seeded per request.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// How sampled requests are verified, sent with each: `seeded` (what the server does
    /// with a seeded request that names no rule), `token` or `block`.
    #[arg(long, default_value = "seeded")]
    verification: Verification,
    /// Most tokens drafted per round.
    #[arg(long, default_value_t = 8)]
    gamma: usize,
    /// Drafters the verifier drafts through.
    #[arg(long, default_value_t = 2)]
    drafters: usize,
    /// Batch concurrent generations' forwards (false: each runs its own, as before
    /// continuous batching).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    batching: bool,
    /// A prompt file (drafters/eval/*.json); default: eight general prompts.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the chart here.
    #[arg(long)]
    png: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

/// One mode at one concurrency.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Level {
    pub mode: LoadMode,
    pub concurrency: usize,
    /// Which of the `--rounds` turns (0 first).
    #[serde(default)]
    pub round: usize,
    pub requests: usize,
    pub tokens: usize,
    pub wall_s: f64,
    /// All tokens over the wall time.
    pub aggregate_tok_s: f64,
    /// Mean over requests of tokens after the first over the time after the first.
    pub per_user_tok_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    /// The verifier's mean generations and token rows per batched step (0 unbatched).
    pub sessions_per_step: f64,
    pub rows_per_step: f64,
    /// Draft tokens accepted over draft tokens verified (0 for plain).
    pub acceptance: f64,
    /// Seconds until the first client had finished (every client generating until then).
    #[serde(default)]
    pub busy_s: f64,
    /// Tokens all clients received in the busy window, over it.
    #[serde(default)]
    pub busy_tok_s: f64,
    /// The per-user tok/s of the slowest tenth of requests (10th percentile).
    #[serde(default)]
    pub per_user_p10_tok_s: f64,
    /// The verifier's mean batched step (0 unbatched).
    #[serde(default)]
    pub step_ms: f64,
    /// Calls to drafters per request, and their mean latency.
    #[serde(default)]
    pub draft_rpcs_per_request: f64,
    #[serde(default)]
    pub draft_rpc_ms: f64,
    /// The verifier's mean wait per step for generations after its first forward, and the
    /// running generations a step started without.
    #[serde(default)]
    pub gather_ms: f64,
    #[serde(default)]
    pub missed_per_step: f64,
    /// Wall time over batched steps: a step and the time between steps (host work).
    #[serde(default)]
    pub cycle_ms: f64,
    /// Requests that decoded plainly because the batch's scheduler gave a newcomer no
    /// draft when they joined, per request.
    #[serde(default)]
    pub shed_per_request: f64,
}

/// The whole run.
#[derive(Serialize, Deserialize, Debug)]
pub struct LoadReport {
    pub prompts: String,
    pub max_tokens: usize,
    pub temperature: f32,
    /// How sampled requests were verified.
    #[serde(default = "seeded")]
    pub verification: String,
    pub gamma: usize,
    pub drafters: usize,
    pub batching: bool,
    pub levels: Vec<Level>,
    /// Each mode's aggregate over plain's, paired by round.
    #[serde(default)]
    pub paired: Vec<PairedRatio>,
}

/// What one request saw.
struct Trace {
    tokens: usize,
    ttft_s: f64,
    e2e_s: f64,
    /// Per-token gaps after the first chunk.
    itl_s: Vec<f64>,
    /// Each chunk's arrival (seconds since the level started) and tokens.
    chunks: Vec<(f64, usize)>,
}

pub fn run(a: LoadArgs) -> Result<()> {
    if a.concurrency.is_empty() || a.concurrency.contains(&0) {
        bail!("--concurrency needs positive client counts");
    }
    if a.requests == 0 || a.max_tokens < 2 || a.rounds == 0 {
        bail!("--requests and --rounds must be at least 1 and --max-tokens at least 2");
    }
    let levels = serve::runtime()?.block_on(run_levels(&a))?;
    let report = LoadReport {
        prompts: a
            .prompts
            .as_ref()
            .map_or("general (bench rpc's eight)".into(), |p| {
                p.display().to_string()
            }),
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        verification: a.verification.as_str().into(),
        gamma: a.gamma,
        drafters: a.drafters,
        batching: a.batching,
        paired: pair(&levels),
        levels,
    };
    print_report(&report);
    if let Some(path) = &a.json {
        crate::bench::write_json(path, &report)?;
    }
    if let Some(path) = &a.png {
        crate::chart_load::draw(path, &report)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

/// Every level: one mode's verifier at a time through every concurrency, or with several
/// rounds every mode's verifier at once, each concurrency running the modes in turn.
async fn run_levels(a: &LoadArgs) -> Result<Vec<Level>> {
    let mut levels = Vec::new();
    if a.rounds == 1 {
        for mode in &a.modes {
            let served = Served::start(a, *mode).await?;
            for &c in &a.concurrency {
                levels.push(served.level(a, c, 0).await?);
            }
        }
        return Ok(levels);
    }
    let mut served = Vec::new();
    for mode in &a.modes {
        served.push(Served::start(a, *mode).await?);
    }
    for &c in &a.concurrency {
        for round in 0..a.rounds {
            for s in &served {
                levels.push(s.level(a, c, round).await?);
            }
        }
    }
    Ok(levels)
}

/// The prompts as token ids (BOS first).
fn prompt_ids(a: &LoadArgs, tok: &GemmaTokenizer) -> Result<Vec<Vec<u32>>> {
    match &a.prompts {
        None => PROMPTS.iter().map(|p| Ok(tok.encode(p, true)?)).collect(),
        Some(path) => prompt_sets::load(path, tok, usize::MAX),
    }
}

/// One mode's verifier and drafters on loopback, warmed.
struct Served {
    mode: LoadMode,
    lb: Loopback,
    prompts: Vec<Vec<u32>>,
}

impl Served {
    async fn start(a: &LoadArgs, mode: LoadMode) -> Result<Self> {
        let most = a.concurrency.iter().copied().max().unwrap_or(1);
        let settings = VerifierSettings {
            gamma: a.gamma.max(1),
            adaptive_gamma: mode == LoadMode::Scheduled,
            max_concurrent: most,
            max_queued: most,
            ..VerifierSettings::default()
        };
        let drafters = if mode == LoadMode::Plain {
            0
        } else {
            a.drafters
        };
        let batching = a.batching.then(BatchLimits::default);
        let lb =
            loopback::start_batched(&a.drafter, &a.models, drafters, settings, batching).await?;
        let prompts = prompt_ids(a, lb.engine().tokenizer())?;
        // Warm the path (connections, caches) before timing.
        let mut warm = connect(&lb).await?;
        Shared::of(a)
            .request(&mut warm, mode, &prompts[0], 0, Instant::now())
            .await?;
        Ok(Self { mode, lb, prompts })
    }

    /// `c` clients, each sending `--requests` requests one after another.
    async fn level(&self, a: &LoadArgs, c: usize, round: usize) -> Result<Level> {
        let (lb, mode, prompts) = (&self.lb, self.mode, &self.prompts);
        let before = scrape(lb.verifier_metrics()).await?;
        let t0 = Instant::now();
        let mut clients = tokio::task::JoinSet::new();
        for i in 0..c {
            let mut client = connect(lb).await?;
            let n = a.requests;
            let mine: Vec<(Vec<u32>, u64)> = (0..n)
                .map(|j| {
                    let k = i * n + j;
                    (prompts[k % prompts.len()].clone(), k as u64)
                })
                .collect();
            let args = Shared::of(a);
            clients.spawn(async move {
                let mut traces = Vec::with_capacity(mine.len());
                for (prompt, seed) in mine {
                    let trace = args.request(&mut client, mode, &prompt, seed, t0);
                    traces.push(trace.await?);
                }
                anyhow::Ok(traces)
            });
        }
        let mut traces = Vec::new();
        while let Some(done) = clients.join_next().await {
            traces.push(done.context("a client task failed")??);
        }
        let wall_s = t0.elapsed().as_secs_f64();
        let after = scrape(lb.verifier_metrics()).await?;
        let level = summarize(mode, c, round, wall_s, &traces, &before, &after);
        eprintln!(
            "bench load: {:?} × {c}: {:.1} tok/s aggregate, {:.1} per user",
            mode, level.aggregate_tok_s, level.per_user_tok_s
        );
        Ok(level)
    }
}

async fn connect(lb: &Loopback) -> Result<GenerationClient<Channel>> {
    let channel = Channel::from_shared(lb.url().to_string())?
        .connect()
        .await
        .context("connecting to the loopback verifier")?;
    Ok(GenerationClient::new(channel))
}

/// What a client task needs of the flags.
#[derive(Clone, Copy)]
struct Shared {
    max_tokens: usize,
    temperature: f32,
    verification: Verification,
    gamma: usize,
}

impl Shared {
    fn of(a: &LoadArgs) -> Self {
        Self {
            max_tokens: a.max_tokens,
            temperature: a.temperature,
            verification: a.verification,
            gamma: a.gamma,
        }
    }

    /// One streamed request, timed.
    async fn request(
        &self,
        client: &mut GenerationClient<Channel>,
        mode: LoadMode,
        prompt: &[u32],
        seed: u64,
        level_start: Instant,
    ) -> Result<Trace> {
        let ids = pb::TokenIds {
            ids: prompt.to_vec(),
        };
        let req = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::TokenIds(ids)),
            max_tokens: Some(self.max_tokens as u32),
            ignore_eos: true,
            speculative: Some(mode != LoadMode::Plain),
            max_gamma: (mode != LoadMode::Plain).then_some(self.gamma as u32),
            sampling: (self.temperature > 0.0).then(|| pb::SamplingParams {
                temperature: Some(self.temperature),
                seed: Some(seed),
                ..Default::default()
            }),
            verification: pb::Verification::from(self.verification) as i32,
            ..Default::default()
        };
        let t0 = Instant::now();
        let mut stream = client.generate(req).await?.into_inner();
        let (mut tokens, mut ttft, mut last, mut itl) = (0, None, 0.0, Vec::new());
        let mut chunks = Vec::new();
        while let Some(msg) = stream.message().await? {
            let now = t0.elapsed().as_secs_f64();
            let n = msg.token_ids.len();
            if n > 0 {
                chunks.push((level_start.elapsed().as_secs_f64(), n));
                match ttft {
                    None => ttft = Some(now),
                    Some(_) => itl.extend(std::iter::repeat_n((now - last) / n as f64, n)),
                }
                last = now;
                tokens += n;
            }
        }
        if tokens != self.max_tokens {
            bail!(
                "a request generated {tokens} tokens, {} asked",
                self.max_tokens
            );
        }
        Ok(Trace {
            tokens,
            ttft_s: ttft.unwrap_or(last),
            e2e_s: t0.elapsed().as_secs_f64(),
            itl_s: itl,
            chunks,
        })
    }
}

fn summarize(
    mode: LoadMode,
    concurrency: usize,
    round: usize,
    wall_s: f64,
    clients: &[Vec<Trace>],
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> Level {
    let delta = |name: &str| total(after, name) - total(before, name);
    let traces: Vec<&Trace> = clients.iter().flatten().collect();
    let tokens: usize = traces.iter().map(|t| t.tokens).sum();
    let per_user: Vec<f64> = traces
        .iter()
        .map(|t| ratio((t.tokens - 1) as f64, t.e2e_s - t.ttft_s))
        .collect();
    let ttft: Vec<f64> = traces.iter().map(|t| t.ttft_s * 1e3).collect();
    let itl: Vec<f64> = traces
        .iter()
        .flat_map(|t| t.itl_s.iter().map(|s| s * 1e3))
        .collect();
    let steps = delta("tandem_batch_sessions_per_step_count");
    let rpcs = delta("tandem_draft_rpc_seconds_count");
    let (busy_s, busy_tokens) = busy_window(clients);
    Level {
        mode,
        concurrency,
        round,
        requests: traces.len(),
        tokens,
        wall_s,
        aggregate_tok_s: tokens as f64 / wall_s,
        per_user_tok_s: per_user.iter().sum::<f64>() / per_user.len().max(1) as f64,
        ttft_p50_ms: percentile(&ttft, 0.5),
        ttft_p99_ms: percentile(&ttft, 0.99),
        itl_p50_ms: percentile(&itl, 0.5),
        itl_p99_ms: percentile(&itl, 0.99),
        sessions_per_step: ratio(delta("tandem_batch_sessions_per_step_sum"), steps),
        rows_per_step: ratio(delta("tandem_batch_rows_per_step_sum"), steps),
        acceptance: ratio(
            delta("tandem_spec_accepted_tokens_total"),
            delta("tandem_spec_draft_tokens_total"),
        ),
        busy_s,
        busy_tok_s: ratio(busy_tokens as f64, busy_s),
        per_user_p10_tok_s: percentile(&per_user, 0.1),
        step_ms: 1e3 * ratio(delta("tandem_batch_step_seconds_sum"), steps),
        draft_rpcs_per_request: ratio(rpcs, traces.len() as f64),
        draft_rpc_ms: 1e3 * ratio(delta("tandem_draft_rpc_seconds_sum"), rpcs),
        gather_ms: 1e3 * ratio(delta("tandem_batch_gather_seconds_sum"), steps),
        missed_per_step: ratio(delta("tandem_batch_missed_sessions_total"), steps),
        cycle_ms: 1e3 * ratio(wall_s, steps),
        shed_per_request: ratio(delta("tandem_speculation_shed_total"), traces.len() as f64),
    }
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        0.0
    }
}

/// The busy window of a level: seconds until the first client received its last chunk,
/// and the tokens every client received until then.
fn busy_window(clients: &[Vec<Trace>]) -> (f64, usize) {
    let last_chunk = |c: &Vec<Trace>| {
        let chunks = c.iter().flat_map(|t| t.chunks.iter());
        chunks.map(|(at, _)| *at).fold(0.0, f64::max)
    };
    let busy_s = clients.iter().map(last_chunk).fold(f64::INFINITY, f64::min);
    if !busy_s.is_finite() {
        return (0.0, 0);
    }
    let chunks = clients.iter().flatten().flat_map(|t| t.chunks.iter());
    let tokens = chunks.filter(|(at, _)| *at <= busy_s).map(|(_, n)| n).sum();
    (busy_s, tokens)
}

/// The `q` quantile of `v` (nearest rank; 0 for none).
pub(crate) fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// The rule of reports written before `verification` was recorded.
fn seeded() -> String {
    Verification::Seeded.as_str().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(chunks: &[(f64, usize)]) -> Trace {
        Trace {
            tokens: chunks.iter().map(|c| c.1).sum(),
            ttft_s: 0.0,
            e2e_s: 0.0,
            itl_s: Vec::new(),
            chunks: chunks.to_vec(),
        }
    }

    #[test]
    fn the_busy_window_ends_when_the_first_client_is_done() {
        let fast = vec![trace(&[(0.1, 1), (0.2, 4)]), trace(&[(0.3, 1), (0.5, 2)])];
        let slow = vec![trace(&[(0.2, 1), (0.4, 1), (0.5, 1), (0.9, 5)])];
        assert_eq!(busy_window(&[fast, slow]), (0.5, 11));
        assert_eq!(busy_window(&[]), (0.0, 0));
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
