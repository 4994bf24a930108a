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
    SlotSegment, TargetHead, MAX_STEP_ROWS,
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

/// Sequences of the start-up profile's steps (those the pool has slots for).
const PROFILE_ROWS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Context of each profiled sequence.
const PROFILE_CONTEXT: usize = 32;

/// The seconds of a step of one-token greedy blocks of 1 to 64 sequences at a short
/// context, the fastest of three runs each (the first captures its graph): the
/// scheduler's first step costs.
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
    for rows in PROFILE_ROWS.into_iter().filter(|&r| r <= slots.available()) {
        let mut caches: Vec<SlotCache> = (0..rows)
            .filter_map(|_| slots.take(PROFILE_CONTEXT + 1))
            .collect();
        batch.forward(&mut SlotSegment::at_ends(&mut caches, &context, &none))?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t0 = Instant::now();
            batch.forward(&mut SlotSegment::at_ends(&mut caches, &[2000], &greedy))?;
            best = best.min(t0.elapsed().as_secs_f64());
            caches
                .iter_mut()
                .try_for_each(|c| c.truncate(PROFILE_CONTEXT))?;
        }
        points.push((rows, best));
    }
    tracing::debug!(?points, "batched device step costs profiled");
    StepCosts::new(&points)
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
