//! The stepper of a batched target: one thread that forms steps from the forwards
//! generations send it and runs each step as one ragged forward. A step starts with the
//! first forward waiting and takes every other one waiting, up to a row limit; if some
//! running generations have not sent theirs yet (they were reading the last step's answer,
//! or drafting), it waits for them a little — at most a quarter of a recent step and never
//! more than [`BatchLimits::max_wait`] — so that steps hold whole batches rather than
//! stragglers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

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

/// What one step ran, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Forwards (one per generation) in the step.
    pub sequences: usize,
    /// Token rows in the step.
    pub rows: usize,
    /// Wall time of the step's forward.
    pub seconds: f64,
}

/// Receives every step's [`StepReport`] (the verifier's metrics).
pub trait StepObserver: Send + Sync {
    /// Called after each step, on the stepper thread.
    fn step(&self, report: &StepReport);
}

/// Everything that receives the steps' reports.
pub(super) type Observers = Arc<RwLock<Vec<Arc<dyn StepObserver>>>>;

/// A forward waiting for a step: the cache travels with it and comes back with the output.
pub(super) struct Job {
    pub(super) tokens: Vec<u32>,
    pub(super) pos: usize,
    pub(super) cache: KvCache,
    pub(super) opts: ForwardOptions,
    pub(super) reply: SyncSender<(KvCache, tandem_gemma::Result<ForwardOutput>)>,
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
        let mut recent = 0.0f64;
        while let Some(first) = held.take().or_else(|| self.jobs.recv().ok()) {
            let wait = Duration::from_secs_f64(recent / 4.0).min(self.limits.max_wait);
            let (step, over) = self.gather(first, wait);
            held = over;
            if let Some(seconds) = self.run_step(step) {
                recent = if recent == 0.0 {
                    seconds
                } else {
                    0.8 * recent + 0.2 * seconds
                };
            }
        }
    }

    /// The step that starts with `first`: every forward waiting, and those that arrive
    /// within `wait` while some running generation has not sent one; a forward that would
    /// pass the row limit is returned for the next step.
    fn gather(&self, first: Job, wait: Duration) -> (Vec<Job>, Option<Job>) {
        let until = Instant::now() + wait;
        let mut rows = first.tokens.len();
        let mut step = vec![first];
        loop {
            let next = match self.jobs.try_recv() {
                Ok(job) => job,
                Err(_) if step.len() >= self.alive.load(Ordering::Acquire) => break,
                Err(_) => match self
                    .jobs
                    .recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                },
            };
            if rows + next.tokens.len() > self.limits.max_rows {
                return (step, Some(next));
            }
            rows += next.tokens.len();
            step.push(next);
        }
        (step, None)
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
            let observers = self.observers.read().unwrap_or_else(|e| e.into_inner());
            observers.iter().for_each(|o| o.step(&report));
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
