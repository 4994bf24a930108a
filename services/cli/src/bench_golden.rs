//! `tandem bench golden`: greedy decoding, plain and speculative, on this target against a
//! golden fixture of an independent implementation (by default transformers in f32, made by
//! `scripts/golden/gemma3_transformers.py`). A target whose arithmetic differs from the
//! reference's (a GPU in bf16) may part from it at a near-tie, so each case is compared up
//! to its first step whose reference top-2 margin is at most the error bound measured here:
//! twice the largest difference of the cases' first logits from the reference's (a margin
//! moves by at most both logits' errors). The CPU `exact` path is held to the same fixture
//! by the golden tests; this is the check a device run commits.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Args;
use serde::Serialize;
use tandem_core::{SamplingParams, SnapshotSpec, Verification};
use tandem_engine::Engine;
use tandem_gemma::{GoldenFixture, LogitsMode};

use crate::bench_spec::{decode_local, Decode};
use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;

/// Flags of `tandem bench golden`.
#[derive(Args, Debug)]
pub struct GoldenArgs {
    /// The fixture: cases of prompt ids, the reference's greedy ids, its top-2 margin at
    /// each step and its largest first logits (`shared/gemma/tests/fixtures/`).
    #[arg(
        long,
        default_value = "shared/gemma/tests/fixtures/gemma3_270m_transformers.json"
    )]
    fixture: PathBuf,
    /// Run only the first N cases.
    #[arg(long)]
    cases: Option<usize>,
    /// Draft length of the speculative runs.
    #[arg(long, default_value_t = 8)]
    gamma: usize,
    /// The near-tie bound (default: twice the largest first-logit error measured).
    #[arg(long)]
    near_tie: Option<f32>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

#[derive(Serialize)]
struct CaseReport {
    name: String,
    prompt_tokens: usize,
    /// Reference steps before its first near-tie: what must agree.
    compared: usize,
    /// Leading ids equal to the reference's, plain and speculative.
    plain_agree: usize,
    speculative_agree: usize,
    /// Whether speculation decoded exactly what plain decoding did.
    speculative_equals_plain: bool,
}

#[derive(Serialize)]
struct GoldenReport {
    backend: String,
    fixture: String,
    gamma: usize,
    /// Largest |ours - reference| over the cases' top first logits.
    worst_first_logit: f32,
    near_tie: f32,
    cases: Vec<CaseReport>,
    passed: bool,
}

pub fn run(a: GoldenArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.fixture)
        .with_context(|| format!("reading {}", a.fixture.display()))?;
    let mut fixture: GoldenFixture = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a golden fixture", a.fixture.display()))?;
    fixture.cases.truncate(a.cases.unwrap_or(usize::MAX));
    if fixture.cases.is_empty() || a.gamma == 0 {
        bail!("no case to run (--cases and --gamma must be >= 1)");
    }
    let engine = a.models.load_engine()?;
    let drafter = a.drafter.load_any(&a.models, engine.model().head())?;
    let mut worst_first_logit = 0f32;
    for case in &fixture.cases {
        let first = first_logits(&engine, &case.prompt_ids)?;
        let error = case
            .first_logit_error(&first)
            .context("a reference id past the vocabulary")?;
        worst_first_logit = worst_first_logit.max(error);
    }
    let near_tie = a.near_tie.unwrap_or(2.0 * worst_first_logit);
    let mut cases = Vec::new();
    for case in &fixture.cases {
        let n = case.generated_ids.len();
        let decode = |gamma: usize| -> Result<Vec<u32>> {
            let d = Decode {
                max_tokens: n,
                sampling: SamplingParams::default(),
                gamma,
                adaptive_gamma: false,
                verification: Verification::Token,
                confidence_cuts: true,
                lookup: !a.drafter.no_lookup,
            };
            let tally = decode_local(
                &engine,
                Some(drafter.proposer.as_ref()),
                &d,
                &case.prompt_ids,
            )?;
            Ok(tally.outputs.into_iter().next().unwrap_or_default())
        };
        let (plain, spec) = (decode(0)?, decode(a.gamma)?);
        let agree = |ours: &[u32]| {
            ours.iter()
                .zip(&case.generated_ids)
                .take_while(|(x, y)| x == y)
                .count()
        };
        cases.push(CaseReport {
            name: case.name.clone(),
            prompt_tokens: case.prompt_ids.len(),
            compared: case
                .step_margins
                .iter()
                .position(|m| *m <= near_tie)
                .unwrap_or(n),
            plain_agree: agree(&plain),
            speculative_agree: agree(&spec),
            speculative_equals_plain: plain == spec,
        });
    }
    let passed = cases
        .iter()
        .all(|c| c.plain_agree >= c.compared && c.speculative_agree >= c.compared);
    let report = GoldenReport {
        backend: a.models.backend(),
        fixture: a.fixture.display().to_string(),
        gamma: a.gamma,
        worst_first_logit,
        near_tie,
        cases,
        passed,
    };
    print_report(&report);
    if let Some(path) = &a.json {
        crate::bench::write_json(path, &report)?;
    }
    if !report.passed {
        bail!("greedy ids part from the reference before a near-tie (see the table above)");
    }
    Ok(())
}

/// The logits after `prompt`, on the host.
fn first_logits(engine: &Engine, prompt: &[u32]) -> Result<Vec<f32>> {
    let mut seq = engine.model().start(prompt.len());
    let step = seq.forward(prompt, 0, LogitsMode::Last, &SnapshotSpec::default())?;
    let logits = step.logits.context("the target returned no logits")?;
    Ok(logits.flatten_all()?.to_device(&Device::Cpu)?.to_vec1()?)
}

fn print_report(r: &GoldenReport) {
    println!(
        "{} against {} (γ = {}): worst first logit {:.4}, near-tie bound {:.4}",
        r.backend, r.fixture, r.gamma, r.worst_first_logit, r.near_tie
    );
    println!("  case                 prompt  compared  plain  speculative  spec = plain");
    for c in &r.cases {
        println!(
            "  {:<20} {:>6} {:>9} {:>6} {:>12} {:>13}",
            c.name,
            c.prompt_tokens,
            c.compared,
            c.plain_agree,
            c.speculative_agree,
            c.speculative_equals_plain
        );
    }
    println!("{}", if r.passed { "passed" } else { "FAILED" });
}
