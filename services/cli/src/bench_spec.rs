//! `tandem bench speculative`: held-out corpus prompts decoded plainly and speculatively
//! (in process, one drafter, every γ asked for), greedy and sampled, in one run: mean
//! acceptance length τ, acceptance rate per draft position, the split of round time between
//! drafting and verifying, tokens/s and the speedup over plain decoding. JSON on request and
//! a PNG chart (see `chart`).

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tandem_core::{Proposer, SamplingParams};
use tandem_engine::{Engine, GenerationRequest, Outcome, SpecStats, Update};
use tandem_train::corpus::{self, CorpusConfig};

use crate::drafter::DrafterArgs;
use crate::generate::load_engine;
use crate::models::ModelArgs;

/// Flags of `tandem bench speculative`.
#[derive(Args, Debug)]
pub struct SpecArgs {
    /// Corpus (files or folders); prompts come from its held-out files only.
    #[arg(long, num_args = 1.., required = true)]
    prompts_from: Vec<PathBuf>,
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

/// One speculative configuration.
#[derive(Serialize, Debug, Clone)]
pub struct SpecRun {
    pub gamma: usize,
    pub tau: f64,
    pub acceptance_per_position: Vec<f64>,
    pub draft_s: f64,
    pub verify_s: f64,
    pub draft_share: f64,
    pub tok_s: f64,
    pub speedup: f64,
}

/// All runs at one temperature.
#[derive(Serialize, Debug, Clone)]
pub struct Mode {
    pub temperature: f32,
    pub plain_tok_s: f64,
    pub runs: Vec<SpecRun>,
}

#[derive(Serialize)]
struct SpecReport {
    drafter: String,
    prompts: usize,
    prompt_tokens: usize,
    max_tokens: usize,
    modes: Vec<Mode>,
}

pub fn run(a: SpecArgs) -> Result<()> {
    if a.prompts == 0 || a.max_tokens < 2 || a.gammas.is_empty() || a.gammas.contains(&0) {
        bail!("--prompts and --gammas must be >= 1 and --max-tokens >= 2");
    }
    let engine = load_engine(&a.models)?;
    let proposer = a
        .drafter
        .load_any(&a.models, engine.model().head())?
        .proposer;
    if let Some(g) = a.gammas.iter().find(|g| **g > proposer.max_gamma()) {
        bail!("γ {g} exceeds the drafter's {}", proposer.max_gamma());
    }
    let prompts = held_out_prompts(&engine, &a)?;
    let mut modes = Vec::new();
    for temperature in [0.0, a.temperature] {
        modes.push(mode(&engine, proposer.as_ref(), &prompts, &a, temperature)?);
    }
    let report = SpecReport {
        drafter: a.drafter.drafter.clone(),
        prompts: prompts.len(),
        prompt_tokens: a.prompt_tokens,
        max_tokens: a.max_tokens,
        modes,
    };
    print_report(&report);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.png {
        crate::chart::draw(path, &report.modes)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

fn held_out_prompts(engine: &Engine, a: &SpecArgs) -> Result<Vec<Vec<u32>>> {
    let tok = engine.tokenizer();
    let cfg = CorpusConfig {
        prompt_tokens: a.prompt_tokens,
        bos: Some(tok.bos_id()),
        train_prompts: 1,
        held_out_prompts: a.prompts,
        held_out_percent: a.held_out_percent,
        prompts_per_file: 1,
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

/// Plain and speculative decoding of every prompt at one temperature.
fn mode(
    engine: &Engine,
    proposer: &dyn Proposer,
    prompts: &[Vec<u32>],
    a: &SpecArgs,
    temperature: f32,
) -> Result<Mode> {
    let sampling = SamplingParams {
        temperature,
        seed: a.seed,
        ..SamplingParams::default()
    };
    let (plain, _) = decode_all(engine, None, prompts, a, sampling, 0)?;
    let mut runs = Vec::new();
    for &gamma in &a.gammas {
        let (tok_s, s) = decode_all(engine, Some(proposer), prompts, a, sampling, gamma)?;
        runs.push(SpecRun {
            gamma,
            tau: s.mean_acceptance_length().unwrap_or(1.0),
            acceptance_per_position: s.acceptance_per_position(),
            draft_s: s.draft_s,
            verify_s: s.verify_s,
            draft_share: s.draft_s / (s.draft_s + s.verify_s).max(1e-9),
            tok_s,
            speedup: tok_s / plain.max(1e-9),
        });
    }
    Ok(Mode {
        temperature,
        plain_tok_s: plain,
        runs,
    })
}

/// Decode tokens/s over all prompts and the merged speculation figures.
fn decode_all(
    engine: &Engine,
    proposer: Option<&dyn Proposer>,
    prompts: &[Vec<u32>],
    a: &SpecArgs,
    sampling: SamplingParams,
    gamma: usize,
) -> Result<(f64, SpecStats)> {
    let (mut tokens, mut secs, mut stats) = (0usize, 0f64, SpecStats::default());
    for prompt in prompts {
        let req = GenerationRequest {
            prompt: prompt.clone(),
            max_tokens: a.max_tokens,
            sampling,
            ignore_eos: true,
            gamma,
            ..GenerationRequest::default()
        };
        let out = engine.generate(&req, proposer, &mut |_: &Update| ControlFlow::Continue(()))?;
        tokens += out.tokens.len().saturating_sub(1);
        secs += out.timing.decode_s;
        merge(&mut stats, &out);
    }
    Ok((tokens as f64 / secs.max(1e-9), stats))
}

fn merge(into: &mut SpecStats, out: &Outcome) {
    let s = &out.spec;
    into.drafts += s.drafts;
    into.draft_tokens += s.draft_tokens;
    into.accepted_tokens += s.accepted_tokens;
    into.draft_s += s.draft_s;
    into.verify_s += s.verify_s;
    into.proposer_failures += s.proposer_failures;
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
        "drafter {}: {} held-out prompts of {} tokens, {} tokens each",
        r.drafter, r.prompts, r.prompt_tokens, r.max_tokens
    );
    for m in &r.modes {
        println!("T = {}: plain {:.1} tok/s", m.temperature, m.plain_tok_s);
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
        }
    }
}
