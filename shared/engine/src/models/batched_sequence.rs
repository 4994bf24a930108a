//! A generation's sequence on a batched target ([`super::BatchedGemma3`],
//! [`super::BatchedDeviceGemma3`]): its cache, lent to the stepper for each forward. A
//! prompt goes a chunk per step, so that it shares steps with other generations' blocks.
//! A sequence counts among those the stepper waits for ([`Steps::alive`]) from its start
//! to its end, except while it has stepped aside: its generation asks a proposer for
//! longer than a step waits for late forwards ([`Steps::late_wait`]), and a step waiting
//! for that draft would delay every other sequence. A draft expected within that wait
//! keeps the sequence counted: the step waits for it rather than run without it (which
//! on a CPU target also gives the drafter the cores the step would share with it, and
//! costs the generation a whole step).

use std::sync::atomic::Ordering;

use tandem_core::SnapshotSpec;
use tandem_gemma::{ForwardOptions, GemmaError, KvCache, LogitsMode, SlotCache};

use super::gemma3::{forward_options, interleave};
use super::stepper::{Stepped, Steps};
use super::{Draw, TargetSequence, TargetStep};
use crate::error::{EngineError, Result};

/// A cache a batched sequence lends its stepper.
pub(super) trait BatchCache: Send + 'static {
    /// Whether the stepper of sequences in such caches makes a plain sampled round's draw
    /// ([`TargetSequence::draws_in_steps`]): where the logits stay on a device.
    const DRAWS_IN_STEPS: bool;
    /// Committed positions.
    fn len(&self) -> usize;
    /// Rolls back to the first `len` positions.
    fn truncate(&mut self, len: usize) -> tandem_gemma::Result<()>;
}

impl BatchCache for KvCache {
    const DRAWS_IN_STEPS: bool = false;

    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn truncate(&mut self, len: usize) -> tandem_gemma::Result<()> {
        KvCache::truncate(self, len)
    }
}

impl BatchCache for SlotCache {
    const DRAWS_IN_STEPS: bool = true;

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
    /// One step's forward of `tokens` at `pos` (with a draw from its last row, if any).
    fn step(
        &mut self,
        tokens: &[u32],
        pos: usize,
        asked: (ForwardOptions, Option<Draw>),
    ) -> Result<Stepped> {
        let cache = self.cache.take().ok_or_else(lost_cache)?;
        if std::mem::take(&mut self.away) {
            self.steps.alive.fetch_add(1, Ordering::AcqRel);
        }
        let (cache, out) = self.steps.submit(tokens, pos, cache, asked);
        self.cache = cache;
        Ok(out?)
    }

    /// [`TargetSequence::forward`], with `draw` made from the last row by the stepper.
    fn forward_with(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        spec: &SnapshotSpec,
        draw: Option<Draw>,
    ) -> Result<TargetStep> {
        let opts = forward_options(logits, spec)?;
        // Prompts (only the last row's logits, or none) go a chunk per step; a block that
        // needs every row's logits (verification) goes whole, as does an empty one (which
        // the model refuses).
        let prompt = matches!(
            logits,
            LogitsMode::Last | LogitsMode::Bounded | LogitsMode::None
        );
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
            bounded: Vec::new(),
            snapshot: Vec::new(),
            drawn: None,
        };
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let opts = ForwardOptions {
                logits: if last { logits } else { LogitsMode::None },
                taps: opts.taps.clone(),
            };
            let (out, drawn) = self.step(part, pos + i * chunk, (opts, draw.filter(|_| last)))?;
            step.snapshot.extend(interleave(&out.taps, part.len())?);
            (step.logits, step.top, step.bounded) = (out.logits, out.top, out.bounded);
            step.drawn = drawn;
        }
        Ok(step)
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
        self.forward_with(tokens, pos, logits, spec, None)
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

    fn draws_in_steps(&self) -> bool {
        C::DRAWS_IN_STEPS
    }

    fn forward_drawn(
        &mut self,
        tokens: &[u32],
        pos: usize,
        draw: Draw,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep> {
        self.forward_with(tokens, pos, LogitsMode::All, spec, Some(draw))
    }

    fn step_aside(&mut self, expected: Option<f64>) {
        if expected.is_some_and(|s| s < self.steps.late_wait()) {
            return;
        }
        if !std::mem::replace(&mut self.away, true) {
            self.steps.alive.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};
    use tandem_gemma::ForwardOutput;

    use super::super::stepper::{BatchLimits, Job, StepRunner};
    use super::*;

    /// A cache of committed positions only.
    struct Positions(usize);

    impl BatchCache for Positions {
        const DRAWS_IN_STEPS: bool = false;

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
                    bounded: Vec::new(),
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
        a.step_aside(None);
        a.step_aside(None);
        assert_eq!(waited_for(), 1, "aside once, however often it says so");
        a.forward(&[7, 8, 9], 0, LogitsMode::None, &spec)?;
        assert_eq!((waited_for(), a.len()), (2, 3), "back with its forward");
        a.step_aside(None);
        drop(a);
        assert_eq!(waited_for(), 1, "a sequence that ends aside leaves once");
        drop(b);
        assert_eq!(waited_for(), 0);
        Ok(())
    }

    #[test]
    fn steps_wait_for_a_draft_expected_within_their_wait_for_late_forwards() -> Result<()> {
        let steps = Steps::start(Commit, BatchLimits::default())?;
        let waited_for = || steps.alive.load(Ordering::Acquire);
        let mut a = BatchedSequence::new(&steps, Positions(0), 64);
        let _b = BatchedSequence::new(&steps, Positions(0), 64);
        a.step_aside(Some(0.0));
        assert_eq!(waited_for(), 1, "no step timed yet: no wait to fit in");
        a.forward(&[7], 0, LogitsMode::None, &SnapshotSpec::default())?;
        // The stepper publishes its wait once it has timed the step it just answered.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while steps.late_wait() == 0.0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let wait = steps.late_wait();
        assert!(
            wait > 0.0 && wait <= 0.005,
            "a quarter step, at most the cap: {wait}"
        );
        a.step_aside(Some(0.0));
        assert_eq!(
            waited_for(),
            2,
            "a draft within the wait keeps it waited for"
        );
        a.step_aside(Some(wait));
        assert_eq!(
            waited_for(),
            1,
            "one that needs the whole wait or more steps aside"
        );
        a.forward(&[8], 1, LogitsMode::None, &SnapshotSpec::default())?;
        a.step_aside(None);
        assert_eq!(waited_for(), 1, "without a measure it steps aside");
        Ok(())
    }
}
