//! A generation's sequence on a batched target ([`super::BatchedGemma3`],
//! [`super::BatchedDeviceGemma3`]): its cache, lent to the stepper for each forward. A
//! prompt goes a chunk per step, so that it shares steps with other generations' blocks.
//! A sequence counts among those the stepper waits for ([`Steps::alive`]) from its start
//! to its end, except while it has stepped aside (its generation asks a proposer): a step
//! waiting for a draft that takes longer than the step would delay every other sequence.

use std::sync::atomic::Ordering;

use tandem_core::SnapshotSpec;
use tandem_gemma::{ForwardOptions, ForwardOutput, GemmaError, KvCache, LogitsMode, SlotCache};

use super::gemma3::{forward_options, interleave};
use super::stepper::Steps;
use super::{TargetSequence, TargetStep};
use crate::error::{EngineError, Result};

/// A cache a batched sequence lends its stepper.
pub(super) trait BatchCache: Send + 'static {
    /// Committed positions.
    fn len(&self) -> usize;
    /// Rolls back to the first `len` positions.
    fn truncate(&mut self, len: usize) -> tandem_gemma::Result<()>;
}

impl BatchCache for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn truncate(&mut self, len: usize) -> tandem_gemma::Result<()> {
        KvCache::truncate(self, len)
    }
}

impl BatchCache for SlotCache {
    fn len(&self) -> usize {
        SlotCache::len(self)
    }

    fn truncate(&mut self, len: usize) -> tandem_gemma::Result<()> {
        SlotCache::truncate(self, len)
    }
}

/// One generation's sequence: its cache, lent to the stepper for each forward.
pub(super) struct BatchedSequence<'t, C> {
    steps: &'t Steps<C>,
    cache: Option<C>,
    max_len: usize,
    /// Stepped aside: not counted among the sequences steps wait for.
    away: bool,
}

impl<'t, C: BatchCache> BatchedSequence<'t, C> {
    /// A sequence of at most `max_len` positions in `cache`, stepped by `steps`.
    pub(super) fn new(steps: &'t Steps<C>, cache: C, max_len: usize) -> Self {
        steps.alive.fetch_add(1, Ordering::AcqRel);
        Self {
            steps,
            cache: Some(cache),
            max_len,
            away: false,
        }
    }
}

impl<C> Drop for BatchedSequence<'_, C> {
    fn drop(&mut self) {
        if !self.away {
            self.steps.alive.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The error of a sequence whose cache a failed stepper kept.
fn lost_cache() -> EngineError {
    EngineError::Model(GemmaError::Request("the sequence lost its cache".into()))
}

impl<C: BatchCache> BatchedSequence<'_, C> {
    /// One step's forward of `tokens` at `pos`.
    fn step(&mut self, tokens: &[u32], pos: usize, opts: ForwardOptions) -> Result<ForwardOutput> {
        let cache = self.cache.take().ok_or_else(lost_cache)?;
        if std::mem::take(&mut self.away) {
            self.steps.alive.fetch_add(1, Ordering::AcqRel);
        }
        let (cache, out) = self.steps.submit(tokens, pos, cache, opts);
        self.cache = cache;
        Ok(out?)
    }
}

impl<C: BatchCache> TargetSequence for BatchedSequence<'_, C> {
    fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep> {
        let opts = forward_options(logits, spec)?;
        // Prompts (only the last row's logits, or none) go a chunk per step; a block that
        // needs every row's logits (verification) goes whole, as does an empty one (which
        // the model refuses).
        let prompt = matches!(logits, LogitsMode::Last | LogitsMode::None);
        let chunk = match prompt {
            true => self.steps.limits.prefill_chunk,
            false => tokens.len().max(1),
        };
        let parts: Vec<&[u32]> = match tokens.is_empty() {
            true => vec![tokens],
            false => tokens.chunks(chunk).collect(),
        };
        let mut step = TargetStep {
            logits: None,
            top: None,
            snapshot: Vec::new(),
        };
        for (i, part) in parts.iter().enumerate() {
            let opts = ForwardOptions {
                logits: if i + 1 == parts.len() {
                    logits
                } else {
                    LogitsMode::None
                },
                taps: opts.taps.clone(),
            };
            let out = self.step(part, pos + i * chunk, opts)?;
            step.snapshot.extend(interleave(&out.taps, part.len())?);
            (step.logits, step.top) = (out.logits, out.top);
        }
        Ok(step)
    }

    fn len(&self) -> usize {
        self.cache.as_ref().map_or(0, BatchCache::len)
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        Ok(self.cache.as_mut().ok_or_else(lost_cache)?.truncate(len)?)
    }

    fn step_aside(&mut self) {
        if !std::mem::replace(&mut self.away, true) {
            self.steps.alive.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::super::stepper::{BatchLimits, Job, StepRunner};
    use super::*;

    /// A cache of committed positions only.
    struct Positions(usize);

    impl BatchCache for Positions {
        fn len(&self) -> usize {
            self.0
        }

        fn truncate(&mut self, len: usize) -> tandem_gemma::Result<()> {
            self.0 = len.min(self.0);
            Ok(())
        }
    }

    /// Commits every job's tokens and returns no logits.
    struct Commit;

    impl StepRunner for Commit {
        type Cache = Positions;

        fn check(&self, _: &mut Job<Positions>) -> tandem_gemma::Result<()> {
            Ok(())
        }

        fn run(&mut self, jobs: &mut [Job<Positions>]) -> tandem_gemma::Result<Vec<ForwardOutput>> {
            let out = |job: &mut Job<Positions>| {
                job.cache.0 = job.pos + job.tokens.len();
                let rows = (job.tokens.len(), 1);
                Ok(ForwardOutput {
                    logits: None,
                    top: None,
                    taps: Vec::new(),
                    last_hidden: Tensor::zeros(rows, DType::F32, &Device::Cpu)?,
                })
            };
            jobs.iter_mut().map(out).collect()
        }
    }

    #[test]
    fn steps_do_not_wait_for_a_sequence_aside_until_its_next_forward() -> Result<()> {
        let steps = Steps::start(Commit, BatchLimits::default())?;
        let waited_for = || steps.alive.load(Ordering::Acquire);
        let spec = SnapshotSpec::default();
        let mut a = BatchedSequence::new(&steps, Positions(0), 64);
        let b = BatchedSequence::new(&steps, Positions(0), 64);
        assert_eq!(waited_for(), 2);
        a.step_aside();
        a.step_aside();
        assert_eq!(waited_for(), 1, "aside once, however often it says so");
        a.forward(&[7, 8, 9], 0, LogitsMode::None, &spec)?;
        assert_eq!((waited_for(), a.len()), (2, 3), "back with its forward");
        a.step_aside();
        drop(a);
        assert_eq!(waited_for(), 1, "a sequence that ends aside leaves once");
        drop(b);
        assert_eq!(waited_for(), 0);
        Ok(())
    }
}
