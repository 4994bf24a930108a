//! Continuous batching of a device Gemma 3 target's forwards across generations: as
//! [`super::BatchedGemma3`] on the CPU, every generation keeps its own thread and round and
//! sends its forwards to one stepper thread, which runs them as batched steps of the
//! device ([`DeviceBatch`]: CUDA graphs per batch bucket over a pool of KV slots). A
//! generation gets a slot of the pool for its cache; one that finds none free, or is
//! longer than a slot, runs alone on the model's own path, with a warning and a report to
//! the step observers (the verifier counts them). Prompts go
//! [`MAX_STEP_ROWS`] tokens a step (the longest block a graph takes).
//!
//! On a GPU the steps are not batch invariant (cuBLAS chooses kernels by shape): greedy
//! output can part from a generation's output alone at near-ties, as speculation's can
//! from plain decoding there. Sampling stays exact in distribution.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tandem_core::batching::StepObserver;
use tandem_core::{SnapshotSpec, SnapshotSupport, StepCosts, TargetIdentity};
use tandem_gemma::{
    bind_thread, DeviceBatch, DeviceGemma3, DeviceSlots, ForwardOptions, LogitsMode, SlotCache,
    SlotSegment, TargetHead, BLOCK_BUCKETS, MAX_STEP_ROWS,
};

use super::batched_sequence::BatchedSequence;
use super::gemma3::forward_options;
use super::stepper::{BatchLimits, Shared, Steps};
use super::{Target, TargetFacts, TargetSequence};
use crate::error::{EngineError, Result};

/// A device Gemma 3 target whose generations' forwards are batched (see the module docs).
pub struct BatchedDeviceGemma3 {
    model: Arc<DeviceGemma3>,
    /// Shared with the stepper, which holds it for each step.
    batch: Arc<Mutex<DeviceBatch>>,
    slots: Arc<DeviceSlots>,
    costs: StepCosts,
    steps: Steps<SlotCache>,
}

impl BatchedDeviceGemma3 {
    /// A pool of `limits.slots` KV slots for `model`, its step costs profiled (which also
    /// captures the one-token steps of every batch bucket), and its stepper thread.
    pub fn new(model: Arc<DeviceGemma3>, limits: BatchLimits) -> Result<Self> {
        let limits = BatchLimits {
            max_rows: limits.max_rows.max(1),
            prefill_chunk: limits.prefill_chunk.clamp(1, MAX_STEP_ROWS),
            slots: limits.slots.max(1),
            ..limits
        };
        let mut batch = DeviceBatch::new(model.clone(), limits.slots)?;
        let costs = profile(&mut batch)?;
        let slots = batch.slots();
        let batch = Arc::new(Mutex::new(batch));
        let steps = Steps::start(Shared(batch.clone()), limits)?;
        Ok(Self {
            model,
            batch,
            slots,
            costs,
            steps,
        })
    }
}

/// The start-up profile's steps, as (sequences, block length) (those the pool has slots
/// for): decode steps of every batch bucket, then verify blocks of the default γ = 8 where
/// their padded rows pass the decode steps' (a step's cost is priced by its padded rows).
const PROFILE_STEPS: [(usize, usize); 10] = [
    (1, 1),
    (2, 1),
    (4, 1),
    (8, 1),
    (16, 1),
    (32, 1),
    (64, 1),
    (16, 9),
    (32, 9),
    (64, 9),
];
/// Context of each profiled sequence.
const PROFILE_CONTEXT: usize = 32;

/// The seconds of greedy steps of [`PROFILE_STEPS`] at a short context, the fastest of
/// three runs each (the first captures its graph), by padded rows: the scheduler's first
/// step costs.
fn profile(batch: &mut DeviceBatch) -> Result<StepCosts> {
    let slots = batch.slots();
    let context: Vec<u32> = (0..PROFILE_CONTEXT as u32).map(|i| 1000 + 7 * i).collect();
    let none = ForwardOptions {
        logits: LogitsMode::None,
        taps: Vec::new(),
    };
    let greedy = ForwardOptions {
        logits: LogitsMode::Top(1),
        taps: Vec::new(),
    };
    let mut points = Vec::new();
    let fits = |&(n, _): &(usize, usize)| n <= slots.available();
    for (sequences, block) in PROFILE_STEPS.into_iter().filter(fits) {
        let mut caches: Vec<SlotCache> = (0..sequences)
            .filter_map(|_| slots.take(PROFILE_CONTEXT + block))
            .collect();
        batch.forward(&mut SlotSegment::at_ends(&mut caches, &context, &none))?;
        let tokens: Vec<u32> = (0..block as u32).map(|i| 2000 + i).collect();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t0 = Instant::now();
            batch.forward(&mut SlotSegment::at_ends(&mut caches, &tokens, &greedy))?;
            best = best.min(t0.elapsed().as_secs_f64());
            caches
                .iter_mut()
                .try_for_each(|c| c.truncate(PROFILE_CONTEXT))?;
        }
        points.push((sequences * block, best));
    }
    tracing::debug!(?points, "batched device step costs profiled");
    StepCosts::new(&points)
        .map(|c| c.padded(&BLOCK_BUCKETS))
        .ok_or_else(|| EngineError::Load("profiling batched steps measured no time".into()))
}

impl Target for BatchedDeviceGemma3 {
    batched_target_common!();

    fn captures_steps(&self) -> bool {
        self.model.captures_steps()
    }

    fn warm_batches(&self, spec: &SnapshotSpec, rows: usize) -> Result<usize> {
        let opts = forward_options(LogitsMode::Top(1), spec)?;
        let mut batch = self.batch.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(batch.warm(rows, &opts)?)
    }

    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        // The generation's thread drops the device logits the stepper hands it.
        if let Err(error) = bind_thread(self.model.device()) {
            tracing::warn!(%error, "the device's context could not be bound to a generation");
        }
        match self.slots.take(max_len) {
            Some(cache) => Box::new(BatchedSequence::new(&self.steps, cache, max_len)),
            None => {
                tracing::warn!(
                    max_len,
                    slot_positions = self.slots.positions(),
                    free_slots = self.slots.available(),
                    "no KV slot of the batch fits this generation; it runs alone, unbatched"
                );
                self.steps.observers.unbatched();
                Target::start(self.model.as_ref(), max_len)
            }
        }
    }
}
