//! `tandem bench speculative`: held-out corpus prompts decoded plainly and speculatively
//! (one drafter, every γ asked for; in process, or through a verifier and a drafter served
//! on loopback with `--services`), greedy and sampled, in one run: mean
//! acceptance length τ, acceptance rate per draft position, the split of round time between
//! drafting and verifying, tokens/s and the speedup over plain decoding. JSON on request and
//! a PNG chart (see `chart`).

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tandem_core::{Proposer, SamplingParams, Verification};
use tandem_engine::{Engine, GenerationRequest, SpecStats, Update};
use tandem_proto::codec::sampling_to_pb;
use tandem_proto::v1 as pb;
use tandem_train::corpus::{self, CorpusConfig};
use tokio::runtime::Runtime;

use crate::bench::StepSplit;
use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;
use crate::{client, loopback, serve};

/// Flags of `tandem bench speculative`.
#[derive(Args, Debug)]
pub struct SpecArgs {
    /// Corpus (files or folders); prompts come from its held-out files only.
    #[arg(long, num_args = 1.., required_unless_present = "prompts_file")]
    prompts_from: Vec<PathBuf>,
    /// Prompts as a JSON list of prompt texts (each encoded after a BOS) or of token-id
    /// lists (e.g. written by `--save-prompts`), instead of `--prompts-from`.
    #[arg(long, conflicts_with = "prompts_from")]
    prompts_file: Option<PathBuf>,
    /// Write the prompts used as a JSON list of token-id lists.
    #[arg(long)]
    save_prompts: Option<PathBuf>,
    /// Send every request through a verifier and a drafter served on loopback (real gRPC)
    /// instead of running them in process.
    #[arg(long)]
    services: bool,
    /// Each γ is the largest block of an adaptive draft length (`--adaptive-gamma`) rather
    /// than the length of every block.
    #[arg(long)]
    adaptive_gamma: bool,
    /// How sampled rounds verify drafts: `block` or `token`.
    #[arg(long, default_value = "token")]
    verification: Verification,
    /// Verify whole blocks even where calibrated confidences say a tail does not pay
    /// (cuts apply only with an adaptive γ and a calibrated drafter).
    #[arg(long)]
    no_confidence_cuts: bool,
    /// Prompts to run.
    #[arg(long, default_value_t = 4)]
    prompts: usize,
    /// Prompt length in tokens (BOS included).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Percent of files held out (as in training).
    #[arg(long, default_value_t = 10)]
    held_out_percent: u32,
    /// Seed of the prompt choice and of sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Draft lengths to measure (each at most the drafter's γ).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    gammas: Vec<usize>,
    /// Temperature of the sampled runs.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Top-k of the sampled runs (none: every token).
    #[arg(long)]
    top_k: Option<usize>,
    /// Top-p (nucleus mass) of the sampled runs (1: every token).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Times the whole comparison runs, each time plain then every γ, so that a machine
    /// that drifts slows every configuration alike; the figures sum over all. A warm-up
    /// generation, not counted, runs first.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw acceptance per position and speedup against γ into this PNG.
    #[arg(long)]
    png: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

impl SpecArgs {
    /// The longest γ measured.
    fn max_gamma(&self) -> usize {
        self.gammas.iter().copied().max().unwrap_or(1)
    }
}

/// One speculative configuration.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SpecRun {
    pub gamma: usize,
    pub tau: f64,
    pub acceptance_per_position: Vec<f64>,
    pub draft_s: f64,
    pub verify_s: f64,
    pub draft_share: f64,
    pub tok_s: f64,
    pub speedup: f64,
    /// Sampled block-verified runs: the τ each verification rule gives in expectation on
    /// the very rounds of the run (`[token-wise, block]`), a comparison free of the noise
    /// of diverging sampled paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_tau: Option<[f64; 2]>,
    /// Greedy runs in process: `[identical, all]` generations whose tokens equal plain
    /// decoding's of the same prompt and repeat (lossless on batch-invariant kernels; on a
    /// GPU a near-tie may part them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identical_to_plain: Option<[usize; 2]>,
    /// Sampled rows whose every logit was formed because their bounds left the rule's
    /// question open (CPU targets in `exact` precision; in process).
    #[serde(default)]
    pub whole_rows: u64,
    /// A device target's fixed-shape steps in these generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_steps: Option<StepSplit>,
}

/// `[token-wise, block]` expected τ of the rounds in `s` that reported it.
fn expected_tau(s: &SpecStats) -> Option<[f64; 2]> {
    let n = s.expected_rounds as f64;
    (n > 0.0).then(|| {
        [
            1.0 + s.expected_token_kept / n,
            1.0 + s.expected_block_kept / n,
        ]
    })
}

/// The `top_p` of reports written before it was recorded: every token.
fn every_token() -> f32 {
    1.0
}

/// All runs at one temperature.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Mode {
    pub temperature: f32,
    /// Top-k of the sampled runs (greedy runs have none).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Top-p of the sampled runs (1 for greedy runs and reports that predate it).
    #[serde(default = "every_token")]
    pub top_p: f32,
    pub plain_tok_s: f64,
    /// A device target's fixed-shape steps in the plain generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_device_steps: Option<StepSplit>,
    pub runs: Vec<SpecRun>,
}

#[derive(Serialize)]
struct SpecReport {
    drafter: String,
    via: &'static str,
    /// Where and how the target ran (`cpu exact`, `cuda:0 f32`, ...); a DSpark drafter
    /// runs there too.
    backend: String,
    repeats: usize,
    prompts: usize,
    prompt_tokens: usize,
    max_tokens: usize,
    modes: Vec<Mode>,
}

/// Where requests run.
enum Runner<'a> {
    /// `Engine::generate` in this process.
    Local {
        engine: &'a Engine,
        proposer: &'a dyn Proposer,
    },
    /// A verifier's gRPC API.
    Remote { rt: &'a Runtime, url: String },
}

pub fn run(a: SpecArgs) -> Result<()> {
    if a.prompts == 0
        || a.repeats == 0
        || a.max_tokens < 2
        || a.gammas.is_empty()
        || a.gammas.contains(&0)
    {
        bail!("--prompts, --repeats and --gammas must be >= 1 and --max-tokens >= 2");
    }
    SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    }
    .validate()?;
    let max_gamma = a.max_gamma();
    let rt = serve::runtime()?;
    let services = match a.services {
        true => Some(rt.block_on(loopback::start(
            &a.drafter,
            &a.models,
            max_gamma,
            a.adaptive_gamma,
        ))?),
        false => None,
    };
    let (engine, url) = match &services {
        Some(lb) => (lb.engine().clone(), Some(lb.url().to_string())),
        None => (a.models.load_engine()?, None),
    };
    let proposer = a
        .drafter
        .load_any(&a.models, engine.model().head())?
        .proposer;
    if max_gamma > proposer.max_gamma() {
        bail!(
            "γ {max_gamma} exceeds the drafter's {}",
            proposer.max_gamma()
        );
    }
    if url.is_none() {
        let drafting = (&proposer.snapshot_spec(), proposer.max_gamma());
        if engine.warm_up(Some(drafting))?.is_some() {
            proposer.warm_up()?;
        }
    }
    let runner = match url {
        Some(url) => Runner::Remote { rt: &rt, url },
        None => Runner::Local {
            engine: &engine,
            proposer: proposer.as_ref(),
        },
    };
    let prompts = prompts(&engine, &a)?;
    let mut modes = Vec::new();
    for temperature in [0.0, a.temperature] {
        modes.push(mode(&runner, &prompts, &a, temperature)?);
    }
    let report = SpecReport {
        drafter: a.drafter.drafter.clone(),
        via: if a.services { "services" } else { "in-process" },
        backend: a.models.backend(),
        prompts: prompts.len(),
        prompt_tokens: prompts.first().map_or(0, Vec::len),
        max_tokens: a.max_tokens,
        repeats: a.repeats,
        modes,
    };
    print_report(&report);
    write_outputs(&a, &report, &prompts)
}

fn write_outputs(a: &SpecArgs, report: &SpecReport, prompts: &[Vec<u32>]) -> Result<()> {
    let files = [
        (&a.json, serde_json::to_string_pretty(report)?),
        (&a.save_prompts, serde_json::to_string(prompts)?),
    ];
    for (path, text) in files {
        if let Some(path) = path {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(path) = &a.png {
        crate::chart::draw(path, &report.modes)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

/// The prompts: read from `--prompts-file`, or cut from the corpus's held-out files.
fn prompts(engine: &Engine, a: &SpecArgs) -> Result<Vec<Vec<u32>>> {
    match &a.prompts_file {
        Some(path) => crate::prompt_sets::load(path, engine.tokenizer(), a.prompts),
        None => held_out_prompts(engine, a),
    }
}

fn held_out_prompts(engine: &Engine, a: &SpecArgs) -> Result<Vec<Vec<u32>>> {
    let tok = engine.tokenizer();
    let cfg = CorpusConfig {
        prompt_tokens: a.prompt_tokens,
        bos: Some(tok.bos_id()),
        train_prompts: 0,
        held_out_prompts: a.prompts,
        held_out_percent: a.held_out_percent,
        prompts_per_file: 1,
        weights: Vec::new(),
        seed: a.seed,
    };
    let p = corpus::prompts(&a.prompts_from, &cfg, |t| {
        tok.encode(t, false).map_err(|e| e.to_string())
    })?;
    if p.held_out.is_empty() {
        bail!("no held-out prompt in the corpus");
    }
    Ok(p.held_out)
}

/// Plain and speculative decoding of every prompt at one temperature, `--repeats` times.
fn mode(runner: &Runner<'_>, prompts: &[Vec<u32>], a: &SpecArgs, temperature: f32) -> Result<Mode> {
    let sampling = SamplingParams {
        temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    decode_all(runner, &prompts[..1], a, sampling, a.max_gamma())?;
    tandem_gemma::profile_steps(true);
    let mut plain = Tally::default();
    let mut spec: Vec<Tally> = a.gammas.iter().map(|_| Tally::default()).collect();
    let mut splits: Vec<Option<StepSplit>> = vec![None; 1 + a.gammas.len()];
    for _ in 0..a.repeats {
        StepSplit::take();
        plain.add(decode_all(runner, prompts, a, sampling, 0)?);
        splits[0] = StepSplit::take();
        for (i, (t, &gamma)) in spec.iter_mut().zip(&a.gammas).enumerate() {
            t.add(decode_all(runner, prompts, a, sampling, gamma)?);
            splits[1 + i] = StepSplit::take();
        }
    }
    tandem_gemma::profile_steps(false);
    let runs = a
        .gammas
        .iter()
        .zip(&spec)
        .zip(splits[1..].iter().cloned())
        .map(|((&gamma, t), device_steps)| {
            let s = &t.stats;
            SpecRun {
                gamma,
                tau: s.mean_acceptance_length().unwrap_or(1.0),
                acceptance_per_position: s.acceptance_per_position(),
                draft_s: s.draft_s,
                verify_s: s.verify_s,
                draft_share: s.draft_s / (s.draft_s + s.verify_s).max(1e-9),
                tok_s: t.tok_s(),
                speedup: t.tok_s() / plain.tok_s().max(1e-9),
                expected_tau: expected_tau(s),
                identical_to_plain: identical(&plain.outputs, &t.outputs, sampling),
                whole_rows: s.whole_rows,
                device_steps,
            }
        })
        .collect();
    Ok(Mode {
        temperature,
        top_k: sampling.top_k.filter(|_| !sampling.is_greedy()),
        top_p: if sampling.is_greedy() {
            1.0
        } else {
            sampling.top_p
        },
        plain_tok_s: plain.tok_s(),
        plain_device_steps: splits[0].take(),
        runs,
    })
}

/// `[identical, all]` pairs of greedy generations, the same prompts in the same order
/// (`None` when sampled, or without the tokens: through the services).
fn identical(
    plain: &[Vec<u32>],
    spec: &[Vec<u32>],
    sampling: SamplingParams,
) -> Option<[usize; 2]> {
    let same = plain.iter().zip(spec).filter(|(p, s)| p == s).count();
    (sampling.is_greedy() && !plain.is_empty() && plain.len() == spec.len())
        .then_some([same, plain.len()])
}

/// Decoded tokens (the first, chosen by the prefill, left out), decode seconds and the
/// speculation figures of some generations, and their tokens where they ran in process.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) tokens: usize,
    pub(crate) secs: f64,
    pub(crate) stats: SpecStats,
    pub(crate) outputs: Vec<Vec<u32>>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.tokens += other.tokens;
        self.secs += other.secs;
        merge(&mut self.stats, &other.stats);
        self.outputs.extend(other.outputs);
    }

    fn count(&mut self, completion_tokens: usize, secs: f64, stats: &SpecStats) {
        self.tokens += completion_tokens.saturating_sub(1);
        self.secs += secs;
        merge(&mut self.stats, stats);
    }

    fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.secs.max(1e-9)
    }
}

/// Every prompt decoded once (`gamma` 0: plain).
fn decode_all(
    runner: &Runner<'_>,
    prompts: &[Vec<u32>],
    a: &SpecArgs,
    sampling: SamplingParams,
    gamma: usize,
) -> Result<Tally> {
    let (engine, proposer) = match runner {
        Runner::Local { engine, proposer } => (*engine, *proposer),
        Runner::Remote { rt, url } => {
            return rt.block_on(remote_all(url, prompts, a, sampling, gamma));
        }
    };
    let decode = Decode {
        max_tokens: a.max_tokens,
        sampling,
        gamma,
        adaptive_gamma: a.adaptive_gamma,
        verification: a.verification,
        confidence_cuts: !a.no_confidence_cuts,
        lookup: !a.drafter.no_lookup,
    };
    let mut tally = Tally::default();
    for prompt in prompts {
        tally.add(decode_local(engine, Some(proposer), &decode, prompt)?);
    }
    Ok(tally)
}

/// How a benchmark request decodes (every one ignores EOS and runs to `max_tokens`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decode {
    pub(crate) max_tokens: usize,
    pub(crate) sampling: SamplingParams,
    /// Draft length (0: plain decoding).
    pub(crate) gamma: usize,
    pub(crate) adaptive_gamma: bool,
    pub(crate) verification: Verification,
    pub(crate) confidence_cuts: bool,
    /// Look continuations up in the context before asking the proposer.
    pub(crate) lookup: bool,
}

/// One prompt decoded through `Engine::generate` in this process, speculatively when there
/// is a proposer and a γ.
pub(crate) fn decode_local(
    engine: &Engine,
    proposer: Option<&dyn Proposer>,
    d: &Decode,
    prompt: &[u32],
) -> Result<Tally> {
    let req = GenerationRequest {
        prompt: prompt.to_vec(),
        max_tokens: d.max_tokens,
        sampling: d.sampling,
        ignore_eos: true,
        gamma: d.gamma,
        adaptive_gamma: d.adaptive_gamma,
        verification: d.verification,
        confidence_cuts: d.confidence_cuts,
        lookup: d.lookup,
        ..GenerationRequest::default()
    };
    let proposer = proposer.filter(|_| d.gamma > 0);
    let out = engine.generate(&req, proposer, &mut |_: &Update| ControlFlow::Continue(()))?;
    let mut tally = Tally::default();
    tally.count(out.tokens.len(), out.timing.decode_s, &out.spec);
    tally.outputs.push(out.tokens);
    Ok(tally)
}

/// [`decode_all`] through the verifier at `url`: its timings and statistics, as it reports
/// them in each generation's finish message.
async fn remote_all(
    url: &str,
    prompts: &[Vec<u32>],
    a: &SpecArgs,
    sampling: SamplingParams,
    gamma: usize,
) -> Result<Tally> {
    let mut client = pb::generation_client::GenerationClient::connect(url.to_string()).await?;
    let mut tally = Tally::default();
    for prompt in prompts {
        let req = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds {
                ids: prompt.clone(),
            })),
            sampling: Some(sampling_to_pb(&sampling)),
            max_tokens: Some(a.max_tokens as u32),
            ignore_eos: true,
            speculative: Some(gamma > 0),
            max_gamma: (gamma > 0).then_some(gamma as u32),
            verification: pb::Verification::from(a.verification) as i32,
            confidence_cuts: Some(!a.no_confidence_cuts),
            ..Default::default()
        };
        let f = client::finished(&mut client, req).await?;
        let usage = f.usage.unwrap_or_default();
        tally.count(
            usage.completion_tokens as usize,
            (f.total_seconds - f.ttft_seconds).max(0.0),
            &spec_from_pb(&f.speculation.unwrap_or_default()),
        );
    }
    Ok(tally)
}

fn spec_from_pb(s: &pb::SpeculationStats) -> SpecStats {
    SpecStats {
        drafts: s.drafts,
        draft_tokens: s.draft_tokens,
        accepted_tokens: s.accepted_tokens,
        accepted_per_position: s.accepted_per_position.clone(),
        drafted_per_position: s.drafted_per_position.clone(),
        draft_s: s.draft_seconds,
        verify_s: s.verify_seconds,
        proposer_failures: s.proposer_failures,
        ..SpecStats::default()
    }
}

fn merge(into: &mut SpecStats, s: &SpecStats) {
    into.drafts += s.drafts;
    into.draft_tokens += s.draft_tokens;
    into.accepted_tokens += s.accepted_tokens;
    into.draft_s += s.draft_s;
    into.verify_s += s.verify_s;
    into.proposer_failures += s.proposer_failures;
    into.whole_rows += s.whole_rows;
    into.expected_rounds += s.expected_rounds;
    into.expected_token_kept += s.expected_token_kept;
    into.expected_block_kept += s.expected_block_kept;
    for (dst, src) in [
        (&mut into.accepted_per_position, &s.accepted_per_position),
        (&mut into.drafted_per_position, &s.drafted_per_position),
    ] {
        if dst.len() < src.len() {
            dst.resize(src.len(), 0);
        }
        dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
    }
}

fn print_report(r: &SpecReport) {
    println!(
        "drafter {} ({}, target on {}): {} held-out prompts of {} tokens, {} tokens each, {} times",
        r.drafter, r.via, r.backend, r.prompts, r.prompt_tokens, r.max_tokens, r.repeats
    );
    for m in &r.modes {
        let top_k = m.top_k.map(|k| format!(", top-k {k}")).unwrap_or_default();
        let top_p = match m.top_p < 1.0 {
            true => format!(", top-p {}", m.top_p),
            false => String::new(),
        };
        println!(
            "T = {}{top_k}{top_p}: plain {:.1} tok/s",
            m.temperature, m.plain_tok_s
        );
        if let Some(steps) = &m.plain_device_steps {
            steps.print("plain, last repeat");
        }
        println!("    γ      τ   tok/s  speedup  draft%  acceptance per position");
        for s in &m.runs {
            let acc: Vec<String> = s
                .acceptance_per_position
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect();
            println!(
                "  {:>3} {:>6.2} {:>7.1} {:>8.2} {:>7.1} {}",
                s.gamma,
                s.tau,
                s.tok_s,
                s.speedup,
                100.0 * s.draft_share,
                acc.join(" ")
            );
            if let Some(steps) = &s.device_steps {
                steps.print("last repeat");
            }
            if let Some([same, all]) = s.identical_to_plain {
                println!("        identical to plain decoding: {same} of {all} generations");
            }
            if s.whole_rows > 0 {
                println!(
                    "        rows formed whole where bounds left a question open: {}",
                    s.whole_rows
                );
            }
            if let Some([token, block]) = s.expected_tau {
                println!(
                    "        expected τ on these rounds: token-wise {token:.3}, block {block:.3} ({:+.1} %)",
                    100.0 * (block / token - 1.0)
                );
            }
        }
    }
}
