//! `tandem calibrate`: fits the calibration of a drafter's confidences
//! ([`tandem_core::calibration`]; a DSpark drafter, or a Gemma 4 assistant with its Gemma 4
//! `--model`) on rounds of the real target and saves it beside the drafter. Every prompt is decoded at every `--temperatures` value with the drafter's full
//! γ, token-wise verification and raw confidences; each drafted token the verifier reached
//! (all before it accepted) is one observation of its position, source and regime. Even
//! prompts fit, odd ones are held out: the report gives the expected calibration error of
//! the held-out rounds before and after, per position, and the reliability diagram draws
//! them.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tandem_core::calibration::{
    ece, fit_source, Calibration, Observation, PositionMap, Regime, SourceFit, CALIBRATION_VERSION,
};
use tandem_core::{DraftSource, Proposer, SamplingParams, Verification};
use tandem_engine::{Engine, GenerationRequest, Update};

use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;
use crate::{prompt_sets, reliability};

/// Bins of the expected calibration error and of the reliability diagram.
pub(crate) const BINS: usize = 10;

/// Flags of `tandem calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Prompt files: JSON lists of prompt texts or of token-id lists. Even prompts fit,
    /// odd ones are held out.
    #[arg(long, num_args = 1.., required = true)]
    prompts: Vec<PathBuf>,
    /// Prompts taken from each file (its first ones).
    #[arg(long, default_value_t = 16)]
    prompts_per_file: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 96)]
    max_tokens: usize,
    /// Sampling regimes to fit (0: greedy).
    #[arg(long, value_delimiter = ',', default_value = "0,0.7")]
    temperatures: Vec<f32>,
    /// Seed of the sampled runs (prompt i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Fit and report, but leave the drafter directory as it is.
    #[arg(long)]
    dry_run: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the reliability diagram (model tokens, per regime and position) here.
    #[arg(long)]
    png: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

/// Observations keyed by (regime index, source, held out), one list per position.
type Rounds = BTreeMap<(usize, &'static str, bool), Vec<Vec<Observation>>>;

/// One reliability bin: mean confidence, acceptance rate and count.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Bin {
    pub(crate) confidence: f64,
    pub(crate) acceptance: f64,
    pub(crate) n: usize,
}

/// Held-out figures of one position.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct PositionReport {
    pub(crate) position: usize,
    pub(crate) fitted_on: usize,
    pub(crate) held_out: usize,
    pub(crate) method: String,
    pub(crate) ece_before: f64,
    pub(crate) ece_after: f64,
    pub(crate) before: Vec<Bin>,
    pub(crate) after: Vec<Bin>,
}

/// Held-out figures of one source in one regime.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct SourceReport {
    pub(crate) temperature: f32,
    pub(crate) source: String,
    pub(crate) positions: Vec<PositionReport>,
}

#[derive(Serialize)]
struct Report {
    drafter: String,
    backend: String,
    prompts: usize,
    max_tokens: usize,
    gamma: usize,
    sources: Vec<SourceReport>,
}

/// `tandem calibrate`.
pub fn run(a: CalibrateArgs) -> Result<()> {
    let Some(dir) = a.drafter.dir()? else {
        bail!("--drafter random has nothing to calibrate: name a drafter directory");
    };
    let assistant = a.drafter.is_assistant()?;
    if a.temperatures.is_empty() || a.temperatures.iter().any(|t| !(0.0..=4.0).contains(t)) {
        bail!("--temperatures must be values in [0, 4]");
    }
    let engine = a.models.load_engine()?;
    let raw = DrafterArgs {
        no_calibration: true,
        ..a.drafter.clone()
    };
    let proposer = raw.load_any(&a.models, engine.model().head())?.proposer;
    let mut prompts = Vec::new();
    for path in &a.prompts {
        prompts.extend(prompt_sets::load(
            path,
            engine.tokenizer(),
            a.prompts_per_file,
        )?);
    }
    if prompts.len() < 2 {
        bail!("calibration needs at least 2 prompts (one to fit, one held out)");
    }
    let rounds = collect(&engine, proposer.as_ref(), &prompts, &a)?;
    let (calibration, sources) = fit(&rounds, &a.temperatures);
    print_table(&sources);
    if !a.dry_run {
        let (saved, file): (Result<()>, _) = match assistant {
            true => (
                tandem_assistant::save_calibration(&dir, &calibration).map_err(Into::into),
                tandem_assistant::CALIBRATION,
            ),
            false => (
                tandem_dspark::attach_calibration(&dir, &calibration).map_err(Into::into),
                tandem_dspark::CALIBRATION,
            ),
        };
        saved.with_context(|| format!("saving the calibration into {}", dir.display()))?;
        eprintln!("saved {}", dir.join(file).display());
    }
    if let Some(png) = &a.png {
        reliability::draw(png, &sources).with_context(|| format!("drawing {}", png.display()))?;
    }
    if let Some(path) = &a.json {
        let report = Report {
            drafter: dir.display().to_string(),
            backend: a.models.backend(),
            prompts: prompts.len(),
            max_tokens: a.max_tokens,
            gamma: proposer.max_gamma(),
            sources,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Decodes every prompt in every regime and gathers the observations.
fn collect(
    engine: &Engine,
    proposer: &dyn Proposer,
    prompts: &[Vec<u32>],
    a: &CalibrateArgs,
) -> Result<Rounds> {
    let mut rounds = Rounds::new();
    for (ti, t) in a.temperatures.iter().enumerate() {
        for (i, prompt) in prompts.iter().enumerate() {
            let req = GenerationRequest {
                prompt: prompt.clone(),
                max_tokens: a.max_tokens,
                sampling: SamplingParams {
                    temperature: *t,
                    seed: a.seed.wrapping_add(i as u64),
                    ..SamplingParams::default()
                },
                ignore_eos: true,
                gamma: proposer.max_gamma(),
                verification: Verification::Token,
                // Every round goes to the drafter, whose own lookup (unless switched off)
                // makes the lookup blocks: both sources are fitted from its blocks.
                lookup: false,
                ..GenerationRequest::default()
            };
            let mut sink = |u: &Update| {
                if let Some(r) = u.round.as_ref().filter(|r| r.drafted > 0) {
                    let lists = rounds
                        .entry((ti, r.source.as_str(), i % 2 == 1))
                        .or_default();
                    let reached = r.confidences.iter().take(r.accepted + 1);
                    for (k, c) in reached.enumerate() {
                        if lists.len() <= k {
                            lists.resize(k + 1, Vec::new());
                        }
                        lists[k].push(Observation {
                            confidence: *c,
                            accepted: k < r.accepted,
                        });
                    }
                }
                ControlFlow::Continue(())
            };
            engine.generate(&req, Some(proposer), &mut sink)?;
        }
        eprintln!("T = {t}: {} prompts decoded", prompts.len());
    }
    Ok(rounds)
}

/// Fits every regime and source on the even prompts; reports the odd ones.
fn fit(rounds: &Rounds, temperatures: &[f32]) -> (Calibration, Vec<SourceReport>) {
    let mut regimes = Vec::new();
    let mut reports = Vec::new();
    for (ti, t) in temperatures.iter().enumerate() {
        let mut sources = Vec::new();
        for source in DraftSource::ALL {
            let get = |held| rounds.get(&(ti, source.as_str(), held)).cloned();
            let fitted = fit_source(source, &get(false).unwrap_or_default());
            if fitted.positions.is_empty() {
                continue;
            }
            reports.push(SourceReport {
                temperature: *t,
                source: source.as_str().into(),
                positions: held_out(&fitted, &get(false).unwrap_or_default(), &get(true)),
            });
            sources.push(fitted);
        }
        regimes.push(Regime {
            temperature: *t,
            sources,
        });
    }
    let calibration = Calibration {
        version: CALIBRATION_VERSION,
        regimes,
    };
    (calibration, reports)
}

/// The held-out figures of each fitted position.
fn held_out(
    fitted: &SourceFit,
    fit_on: &[Vec<Observation>],
    held: &Option<Vec<Vec<Observation>>>,
) -> Vec<PositionReport> {
    let empty = Vec::new();
    fitted
        .positions
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let obs = held.as_ref().and_then(|h| h.get(k)).unwrap_or(&empty);
            let after = |o: &Observation| (p.map.apply(o.confidence), o.accepted);
            PositionReport {
                position: k + 1,
                fitted_on: fit_on.get(k).map_or(0, Vec::len),
                held_out: obs.len(),
                method: method(&p.map).into(),
                ece_before: ece(obs.iter().map(|o| (o.confidence, o.accepted)), BINS),
                ece_after: ece(obs.iter().map(after), BINS),
                before: bins(obs.iter().map(|o| (o.confidence, o.accepted))),
                after: bins(obs.iter().map(after)),
            }
        })
        .collect()
}

fn method(m: &PositionMap) -> &'static str {
    match m {
        PositionMap::Temperature { .. } => "temperature",
        PositionMap::Isotonic { .. } => "isotonic",
    }
}

/// The non-empty reliability bins of `pairs`.
fn bins(pairs: impl Iterator<Item = (f32, bool)>) -> Vec<Bin> {
    let mut sums = vec![(0f64, 0f64, 0usize); BINS];
    for (c, a) in pairs {
        let b = ((c as f64 * BINS as f64) as usize).min(BINS - 1);
        sums[b].0 += c as f64;
        sums[b].1 += f64::from(u8::from(a));
        sums[b].2 += 1;
    }
    sums.into_iter()
        .filter(|s| s.2 > 0)
        .map(|(c, a, n)| Bin {
            confidence: c / n as f64,
            acceptance: a / n as f64,
            n,
        })
        .collect()
}

fn print_table(sources: &[SourceReport]) {
    println!("regime  source  pos  fitted  held-out  method       ECE before  ECE after");
    for s in sources {
        for p in &s.positions {
            println!(
                "T={:<4}  {:<6}  {:>3}  {:>6}  {:>8}  {:<11}  {:>10.4}  {:>9.4}",
                s.temperature,
                s.source,
                p.position,
                p.fitted_on,
                p.held_out,
                p.method,
                p.ece_before,
                p.ece_after
            );
        }
    }
}
