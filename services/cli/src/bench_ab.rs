//! `tandem bench ab`: a paired A/B of two drafters on one target. Both run in process on
//! the same prompts with the same settings and seeds, interleaved (for each prompt and
//! repeat, A then B or B then A in turn) so that a drifting machine slows both alike. Per
//! prompt: acceptance rate, τ and seconds per decoded token; then the paired differences
//! B − A with 95 % Student-t intervals and the verdict of `tandem_core::ab::compare`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tandem_core::ab::{self, Comparison, PromptRun};
use tandem_core::{Proposer, SamplingParams, Verification};
use tandem_engine::Engine;

use crate::bench_spec::{decode_local, Decode, Tally};
use crate::drafter::{DrafterArgs, SHIPPED};
use crate::models::ModelArgs;
use crate::prompt_sets;

/// Flags of `tandem bench ab`.
#[derive(Args, Debug)]
pub struct AbArgs {
    /// Drafter A, the incumbent: `shipped` or a drafter folder (as `--drafter`).
    #[arg(long)]
    a: String,
    /// Drafter B, the candidate: `shipped` or a drafter folder (as `--drafter`).
    #[arg(long)]
    b: String,
    /// Drafter A drafts with its model alone (no lookup in the context).
    #[arg(long)]
    a_no_lookup: bool,
    /// Drafter B drafts with its model alone (no lookup in the context).
    #[arg(long)]
    b_no_lookup: bool,
    /// Drafter A sends its raw confidences even if it has a calibration.
    #[arg(long)]
    a_no_calibration: bool,
    /// Drafter B sends its raw confidences even if it has a calibration.
    #[arg(long)]
    b_no_calibration: bool,
    /// Prompts: a JSON list of prompt texts or of token-id lists.
    #[arg(long)]
    prompts_file: PathBuf,
    /// Prompts to run (the first ones of the file); at least 2.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Draft length (the largest one with `--adaptive-gamma`).
    #[arg(long, default_value_t = 4)]
    gamma: usize,
    /// Let each round choose its draft length up to `--gamma`.
    #[arg(long)]
    adaptive_gamma: bool,
    /// How arm A's sampled rounds verify drafts: `block` or `token`.
    #[arg(long, default_value = "token")]
    a_verification: Verification,
    /// How arm B's sampled rounds verify drafts: `block` or `token`.
    #[arg(long, default_value = "token")]
    b_verification: Verification,
    /// Verify whole blocks even where calibrated confidences say a tail does not pay
    /// (cuts apply only with an adaptive γ and a calibrated drafter).
    #[arg(long)]
    no_confidence_cuts: bool,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sampling seed of the first repeat; repeat r uses seed + r, the same for A and B.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Times each prompt runs per arm; a prompt's figures sum over its repeats.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// The largest drop in acceptance rate, in percentage points, B may show and still be
    /// adopted.
    #[arg(long, default_value_t = 1.0)]
    max_drop_pts: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    models: ModelArgs,
}

/// One arm's figures on one prompt.
#[derive(Serialize)]
struct Figures {
    #[serde(flatten)]
    run: PromptRun,
    acceptance: f64,
    tau: f64,
    s_per_token: f64,
}

impl From<PromptRun> for Figures {
    fn from(run: PromptRun) -> Self {
        Figures {
            acceptance: run.acceptance(),
            tau: run.tau(),
            s_per_token: run.s_per_token(),
            run,
        }
    }
}

/// Both arms on one prompt.
#[derive(Serialize)]
struct Pair {
    prompt: usize,
    prompt_tokens: usize,
    a: Figures,
    b: Figures,
}

#[derive(Serialize)]
struct AbReport {
    drafter_a: String,
    drafter_b: String,
    /// Where and how the target ran (`cpu exact`, `cuda:0 f32`, ...).
    backend: String,
    prompts_file: PathBuf,
    prompts: usize,
    repeats: usize,
    max_tokens: usize,
    gamma: usize,
    adaptive_gamma: bool,
    temperature: f32,
    seed: u64,
    #[serde(flatten)]
    comparison: Comparison,
    pairs: Vec<Pair>,
}

/// One arm: its proposer and how its sampled rounds verify.
struct Arm {
    proposer: std::sync::Arc<dyn Proposer>,
    verification: Verification,
    /// Whether its rounds look continuations up in the context.
    lookup: bool,
}

/// The two arms, A first.
struct Arms {
    a: Arm,
    b: Arm,
}

pub fn run(args: AbArgs) -> Result<()> {
    let set = validate(&args)?;
    let engine = args.models.load_engine()?;
    let arms = load_arms(&engine, &args)?;
    let prompts = set.encode(engine.tokenizer(), args.prompts)?;
    if prompts.len() < 2 {
        bail!(
            "{}: a paired comparison needs at least 2 prompts, the file has {}",
            args.prompts_file.display(),
            prompts.len()
        );
    }
    let (runs_a, runs_b) = run_pairs(&engine, &arms, &prompts, &args)?;
    let comparison = ab::compare(&runs_a, &runs_b, args.max_drop_pts)?;
    let pairs = runs_a
        .into_iter()
        .zip(runs_b)
        .zip(&prompts)
        .enumerate()
        .map(|(i, ((a, b), p))| Pair {
            prompt: i,
            prompt_tokens: p.len(),
            a: a.into(),
            b: b.into(),
        })
        .collect();
    let report = AbReport {
        drafter_a: arm_name(
            &args.a,
            [args.a_no_lookup, args.a_no_calibration],
            args.a_verification,
        ),
        drafter_b: arm_name(
            &args.b,
            [args.b_no_lookup, args.b_no_calibration],
            args.b_verification,
        ),
        backend: args.models.backend(),
        prompts_file: args.prompts_file.clone(),
        prompts: prompts.len(),
        repeats: args.repeats,
        max_tokens: args.max_tokens,
        gamma: args.gamma,
        adaptive_gamma: args.adaptive_gamma,
        temperature: args.temperature,
        seed: args.seed,
        comparison,
        pairs,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Checks every flag and reads the prompt file, before any model loads.
fn validate(a: &AbArgs) -> Result<prompt_sets::PromptSet> {
    if a.prompts < 2 || a.repeats == 0 || a.max_tokens < 2 || a.gamma == 0 {
        bail!("--prompts must be >= 2, --repeats and --gamma >= 1 and --max-tokens >= 2");
    }
    if !a.max_drop_pts.is_finite() || a.max_drop_pts < 0.0 {
        bail!("--max-drop-pts must be a number >= 0");
    }
    sampling(a, 0).validate()?;
    for name in [&a.a, &a.b] {
        if name != SHIPPED && !Path::new(name).is_dir() {
            bail!("drafter {name}: not `{SHIPPED}` nor a drafter folder");
        }
    }
    prompt_sets::read(&a.prompts_file)
}

/// How an arm is named in the report.
/// The drafter's name with what its arm switched off (`[no lookup, no calibration]`) and
/// its verification rule.
fn arm_name(drafter: &str, off: [bool; 2], verification: Verification) -> String {
    let mut notes: Vec<&str> = ["no lookup", "raw confidences"]
        .into_iter()
        .zip(off)
        .filter_map(|(note, on)| on.then_some(note))
        .collect();
    notes.push(match verification {
        Verification::Block => "block verification",
        Verification::Token => "token-wise verification",
        Verification::Seeded => "seeded verification",
    });
    format!("{drafter} ({})", notes.join(", "))
}

fn sampling(a: &AbArgs, repeat: usize) -> SamplingParams {
    SamplingParams {
        temperature: a.temperature,
        seed: a.seed.wrapping_add(repeat as u64),
        ..SamplingParams::default()
    }
}

/// Loads both drafters for the engine's target and checks they draft `--gamma` tokens.
fn load_arms(engine: &Engine, a: &AbArgs) -> Result<Arms> {
    let load = |name: &str, no_lookup, no_calibration| -> Result<std::sync::Arc<dyn Proposer>> {
        let args = DrafterArgs {
            drafter: name.to_string(),
            drafter_seed: 0,
            no_lookup,
            no_calibration,
            // One session at a time: nothing to batch.
            no_draft_batching: true,
            draft_batch_wait_ms: 0.0,
            draft_batch_max: 1,
        };
        let p = args.load_any(&a.models, engine.model().head())?.proposer;
        if a.gamma > p.max_gamma() {
            bail!("γ {} exceeds drafter {name}'s {}", a.gamma, p.max_gamma());
        }
        // First-use costs (a device drafter's graphs, every drafter of a routed set) paid
        // before any timed generation, as a drafter service pays them before serving.
        p.warm_up()?;
        Ok(p)
    };
    Ok(Arms {
        a: Arm {
            proposer: load(&a.a, a.a_no_lookup, a.a_no_calibration)?,
            lookup: !a.a_no_lookup,
            verification: a.a_verification,
        },
        b: Arm {
            proposer: load(&a.b, a.b_no_lookup, a.b_no_calibration)?,
            lookup: !a.b_no_lookup,
            verification: a.b_verification,
        },
    })
}

/// Every prompt through both arms, `--repeats` times, alternating which goes first; a
/// warm-up generation per arm, not counted, runs first.
fn run_pairs(
    engine: &Engine,
    arms: &Arms,
    prompts: &[Vec<u32>],
    a: &AbArgs,
) -> Result<(Vec<PromptRun>, Vec<PromptRun>)> {
    let decode = |repeat, arm: &Arm| Decode {
        max_tokens: a.max_tokens,
        sampling: sampling(a, repeat),
        gamma: a.gamma,
        adaptive_gamma: a.adaptive_gamma,
        verification: arm.verification,
        confidence_cuts: !a.no_confidence_cuts,
        lookup: arm.lookup,
    };
    for arm in [&arms.a, &arms.b] {
        decode_local(
            engine,
            Some(arm.proposer.as_ref()),
            &decode(0, arm),
            &prompts[0],
        )?;
    }
    let mut runs = vec![(PromptRun::default(), PromptRun::default()); prompts.len()];
    for repeat in 0..a.repeats {
        for (i, prompt) in prompts.iter().enumerate() {
            let (run_a, run_b) = &mut runs[i];
            let mut order = [(&arms.a, run_a), (&arms.b, run_b)];
            if (i + repeat) % 2 == 1 {
                order.reverse();
            }
            for (arm, run) in order {
                let d = decode(repeat, arm);
                add(
                    run,
                    &decode_local(engine, Some(arm.proposer.as_ref()), &d, prompt)?,
                );
            }
        }
    }
    Ok(runs.into_iter().unzip())
}

fn add(run: &mut PromptRun, t: &Tally) {
    run.drafts += t.stats.drafts;
    run.drafted += t.stats.draft_tokens;
    run.accepted += t.stats.accepted_tokens;
    run.tokens += t.tokens;
    run.secs += t.secs;
}

fn print_report(r: &AbReport) {
    let c = &r.comparison;
    println!(
        "A/B on {} ({}): {} prompts × {} repeats, {} tokens each, γ {}{}, T = {}",
        r.prompts_file.display(),
        r.backend,
        r.prompts,
        r.repeats,
        r.max_tokens,
        r.gamma,
        if r.adaptive_gamma { " (adaptive)" } else { "" },
        r.temperature
    );
    println!("  arm  acceptance %      τ  ms/token    tok/s  drafter");
    for (name, s, drafter) in [("A", &c.a, &r.drafter_a), ("B", &c.b, &r.drafter_b)] {
        println!(
            "  {name:>3} {:>13.2} {:>6.2} {:>9.3} {:>8.1}  {drafter}",
            s.acceptance_pct,
            s.tau,
            1000.0 * s.s_per_token,
            s.tok_s
        );
    }
    let (acc, t) = (&c.acceptance_pts, &c.s_per_token);
    println!(
        "B − A acceptance {:+.2} points, 95 % CI [{:+.2}, {:+.2}]",
        acc.mean, acc.low, acc.high
    );
    println!(
        "B − A time {:+.4} ms/token, 95 % CI [{:+.4}, {:+.4}]; B at {:.3}× A's speed",
        1000.0 * t.mean,
        1000.0 * t.low,
        1000.0 * t.high,
        c.relative_speed
    );
    println!("  prompt  tokens  acc A %  acc B %  ms/tok A  ms/tok B");
    for p in &r.pairs {
        println!(
            "  {:>6} {:>7} {:>8.2} {:>8.2} {:>9.3} {:>9.3}",
            p.prompt,
            p.prompt_tokens,
            100.0 * p.a.acceptance,
            100.0 * p.b.acceptance,
            1000.0 * p.a.s_per_token,
            1000.0 * p.b.s_per_token
        );
    }
    println!("verdict: {}", c.reason);
}
