//! The stepper of a batched target: one thread that forms steps from the forwards
//! generations send it ([`tandem_core::batching::gather`]: every forward waiting, and a
//! short wait for running generations that have not sent theirs) and runs each step as one
//! ragged forward.

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_core::batching::{gather, Gathering, Observers, Pace, Rows, StepReport};
use tandem_gemma::{ForwardOptions, ForwardOutput, Gemma3, GemmaError, KvCache, Segment};

/// How the stepper forms its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most token rows one step runs (a forward that alone is longer runs alone).
    pub max_rows: usize,
    /// Prompt tokens a prefill forward sends per step.
    pub prefill_chunk: usize,
    /// The longest a step waits for running generations that have not sent their forward.
    pub max_wait: Duration,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_rows: 512,
            prefill_chunk: 128,
            max_wait: Duration::from_millis(5),
        }
    }
}

/// A forward waiting for a step: the cache travels with it and comes back with the output.
pub(super) struct Job {
    pub(super) tokens: Vec<u32>,
    pub(super) pos: usize,
    pub(super) cache: KvCache,
    pub(super) opts: ForwardOptions,
    pub(super) reply: SyncSender<(KvCache, tandem_gemma::Result<ForwardOutput>)>,
}

impl Rows for Job {
    fn rows(&self) -> usize {
        self.tokens.len()
    }
}

/// The stepper thread's state.
pub(super) struct Stepper {
    pub(super) model: Arc<Gemma3>,
    pub(super) jobs: Receiver<Job>,
    pub(super) limits: BatchLimits,
    /// Generations (sequences) that exist.
    pub(super) alive: Arc<AtomicUsize>,
    pub(super) observers: Observers,
}

impl Stepper {
    /// Runs steps until every sender is gone.
    pub(super) fn run(self) {
        let mut held: Option<Job> = None;
        let mut pace = Pace::default();
        while let Some(first) = held.take().or_else(|| self.jobs.recv().ok()) {
            let limits = Gathering {
                max_rows: self.limits.max_rows,
                wait: pace.wait(self.limits.max_wait),
                alive: &self.alive,
            };
            let (step, over) = gather(&self.jobs, first, limits);
            held = over;
            if let Some(seconds) = self.run_step(step) {
                pace.record(seconds);
            }
        }
    }

    /// Runs `step`'s valid forwards together and answers every job (one that the model
    /// refuses alone, with its error); returns the forward's seconds when it ran.
    fn run_step(&self, step: Vec<Job>) -> Option<f64> {
        let (mut ready, mut replies) = (Vec::new(), Vec::new());
        for mut job in step {
            match self.model.check_segment(&segment(&mut job)) {
                Ok(()) => ready.push(job),
                Err(e) => replies.push((job.reply, job.cache, Err(e))),
            }
        }
        let mut seconds = None;
        if !ready.is_empty() {
            let t0 = Instant::now();
            let mut segs: Vec<Segment<'_>> = ready.iter_mut().map(segment).collect();
            let outs = self.model.forward_ragged(&mut segs);
            let report = StepReport {
                sequences: segs.len(),
                rows: segs.iter().map(|s| s.tokens.len()).sum(),
                seconds: t0.elapsed().as_secs_f64(),
            };
            drop(segs);
            seconds = Some(report.seconds);
            self.observers.report(&report);
            match outs {
                Ok(outs) => replies.extend(
                    ready
                        .into_iter()
                        .zip(outs)
                        .map(|(job, out)| (job.reply, job.cache, Ok(out))),
                ),
                Err(e) => replies.extend(ready.into_iter().map(|job| {
                    let e = GemmaError::Request(format!("a batched forward failed: {e}"));
                    (job.reply, job.cache, Err(e))
                })),
            }
        }
        for (reply, cache, out) in replies {
            // A generation that stopped waiting has gone; its cache goes with the answer.
            let _ = reply.send((cache, out));
        }
        seconds
    }
}

fn segment(job: &mut Job) -> Segment<'_> {
    Segment {
        tokens: &job.tokens,
        pos: job.pos,
        cache: &mut job.cache,
        opts: &job.opts,
    }
}
