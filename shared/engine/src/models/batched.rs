//! Continuous batching of a CPU Gemma 3 target's forwards across generations (Orca's
//! iteration-level scheduling, Yu et al., OSDI 2022): every generation keeps its own thread,
//! cache and round, but its forwards go to one stepper thread ([`super::stepper`]), which
//! runs the forwards of all running generations as one ragged forward
//! ([`Gemma3::forward_ragged`]) — one read of the weights for every running session. Generations join and leave between steps. Long
//! prompts are prefilled in chunks, so a new session's prompt shares steps with the others'
//! verify blocks instead of stalling them. The kernels are batch invariant: a generation's
//! output is bit for bit what it is alone.

use std::sync::Arc;
use std::time::Instant;

use tandem_core::batching::StepObserver;
use tandem_core::{SnapshotSupport, StepCosts, TargetIdentity};
use tandem_gemma::{ForwardOptions, Gemma3, KvCache, LogitsMode, Segment, TargetHead};

use super::batched_sequence::BatchedSequence;
use super::stepper::{BatchLimits, Ragged, Steps};
use super::{Target, TargetFacts, TargetSequence};
use crate::error::{EngineError, Result};

/// A CPU Gemma 3 target whose generations' forwards are batched (see the module docs).
pub struct BatchedGemma3 {
    model: Arc<Gemma3>,
    costs: StepCosts,
    steps: Steps<KvCache>,
}

impl BatchedGemma3 {
    /// Starts the stepper thread of `model`.
    pub fn new(model: Arc<Gemma3>, limits: BatchLimits) -> Result<Self> {
        let limits = BatchLimits {
            max_rows: limits.max_rows.max(1),
            prefill_chunk: limits.prefill_chunk.max(1),
            ..limits
        };
        let costs = profile(&model)?;
        let steps = Steps::start(Ragged(model.clone()), limits)?;
        Ok(Self {
            model,
            costs,
            steps,
        })
    }
}

/// Rows of the start-up profile's steps.
const PROFILE_ROWS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Context of each profiled sequence.
const PROFILE_CONTEXT: usize = 32;
/// Rows of the profiled step that prices a row with every logit against a bounded one.
const FULL_ROWS_AT: usize = 16;
/// Timed runs of each profiled step after an untimed one (its fastest counts). A step's
/// first run on this CPU took 36–38 ms against 27 ms after for 16 rows with every logit
/// (its logits' first use), and a row with every logit was priced 0.93–1.03 ms over a
/// bounded one by the fastest of two runs against 0.39–0.45 ms of five.
const PROFILE_RUNS: usize = 3;

/// The seconds of a step of one-row forwards whose logits the model bounds (one-row
/// forwards of a model that cannot bound form their row's logits) of 1 to 64 sequences at a
/// short context: the scheduler's first step costs; and what a row with every logit costs
/// over a bounded one ([`StepCosts::with_full_rows`], from steps of 16 rows).
fn profile(model: &Gemma3) -> Result<StepCosts> {
    let context: Vec<u32> = (0..PROFILE_CONTEXT as u32).map(|i| 1000 + 7 * i).collect();
    let mut base = model.new_cache(PROFILE_CONTEXT + 1);
    let none = ForwardOptions {
        logits: LogitsMode::None,
        taps: Vec::new(),
    };
    model.forward(&context, 0, &mut base, &none)?;
    let bounded = ForwardOptions {
        logits: LogitsMode::Bounded,
        taps: Vec::new(),
    };
    let points = (PROFILE_ROWS.iter())
        .map(|&rows| Ok((rows, step_seconds(model, &base, rows, &bounded)?)))
        .collect::<Result<Vec<_>>>()?;
    let bounded_at = points.iter().find(|(r, _)| *r == FULL_ROWS_AT).map(|p| p.1);
    let all = step_seconds(model, &base, FULL_ROWS_AT, &ForwardOptions::default())?;
    let full_row_s = bounded_at.map_or(0.0, |b| (all - b) / FULL_ROWS_AT as f64);
    tracing::debug!(?points, full_row_s, "batched step costs profiled");
    StepCosts::new(&points)
        .map(|c| c.with_full_rows(full_row_s))
        .ok_or_else(|| EngineError::Load("profiling batched steps measured no time".into()))
}

/// The fastest of [`PROFILE_RUNS`] steps of `rows` one-token forwards after `base`'s
/// context, after one untimed.
fn step_seconds(model: &Gemma3, base: &KvCache, rows: usize, opts: &ForwardOptions) -> Result<f64> {
    let mut caches = vec![base.clone(); rows];
    let mut best = f64::INFINITY;
    for run in 0..=PROFILE_RUNS {
        let mut segs: Vec<Segment<'_>> = caches
            .iter_mut()
            .map(|cache| Segment {
                tokens: &[2000],
                pos: PROFILE_CONTEXT,
                cache,
                opts,
            })
            .collect();
        let t0 = Instant::now();
        model.forward_ragged(&mut segs)?;
        if run > 0 {
            best = best.min(t0.elapsed().as_secs_f64());
        }
        drop(segs);
        caches
            .iter_mut()
            .try_for_each(|c| c.truncate(PROFILE_CONTEXT))?;
    }
    Ok(best)
}

impl Target for BatchedGemma3 {
    batched_target_common!();

    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        let cache = self.model.new_cache(max_len);
        let max_len = cache.max_len();
        Box::new(BatchedSequence::new(&self.steps, cache, max_len))
    }
}
