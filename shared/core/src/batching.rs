//! How a batching thread forms its steps from the jobs that sessions send it (Orca's
//! iteration-level scheduling, Yu et al., OSDI 2022), shared by the target's stepper and
//! the drafter's: a step starts with the first job waiting and takes every other one
//! waiting, up to a row limit; while some live sessions have not sent theirs yet (they were
//! reading the last step's answer, or doing other work), it waits for them a little — at
//! most a quarter of a recent step ([`Pace`]) and never more than a configured cap — so that
//! steps hold whole batches rather than stragglers. What each step ran, how long it waited
//! and whom it went without are reported to [`StepObserver`]s (metrics, the draft
//! scheduler's costs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// What one batched step ran, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Jobs (one per session) in the step.
    pub sequences: usize,
    /// Token rows in the step, as the target's step costs count them (on a device that
    /// pads every block to the step's block length, padding included).
    pub rows: usize,
    /// Wall time of the step's forward.
    pub seconds: f64,
    /// Seconds the step waited for live sessions after its first job ([`gather`]).
    pub waited: f64,
    /// Live sessions the step went without when it started (still at work after its wait).
    pub missed: usize,
    /// Plain sampled rounds whose token the step drew (a device target's batched steps).
    pub drawn: usize,
    /// Rows whose logits the step formed in full, where the others' were only bounded or
    /// screened ([`crate::StepCosts::observe`] prices them apart).
    pub full_rows: usize,
}

/// Receives every step's [`StepReport`].
pub trait StepObserver: Send + Sync {
    /// Called after each step, on the batching thread.
    fn step(&self, report: &StepReport);
    /// Called when a generation runs alone, outside the batch (no room in it), on the
    /// generation's thread.
    fn unbatched(&self) {}
}

/// Everything that receives a batching thread's reports; observers join at any time.
#[derive(Clone, Default)]
pub struct Observers(Arc<RwLock<Vec<Arc<dyn StepObserver>>>>);

impl Observers {
    /// Adds `observer`.
    pub fn add(&self, observer: Arc<dyn StepObserver>) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
    }

    /// Tells every observer what a step ran.
    pub fn report(&self, report: &StepReport) {
        let observers = self.0.read().unwrap_or_else(|e| e.into_inner());
        observers.iter().for_each(|o| o.step(report));
    }

    /// Tells every observer that a generation runs outside the batch.
    pub fn unbatched(&self) {
        let observers = self.0.read().unwrap_or_else(|e| e.into_inner());
        observers.iter().for_each(|o| o.unbatched());
    }
}

/// A job's size in a step's row limit.
pub trait Rows {
    /// Token rows the job adds to a step.
    fn rows(&self) -> usize;
}

/// The limits a step is gathered under.
#[derive(Debug, Clone, Copy)]
pub struct Gathering<'a> {
    /// The most rows a step takes (a job that alone is longer goes alone).
    pub max_rows: usize,
    /// How long the step may wait for live sessions that have not sent a job.
    pub wait: Duration,
    /// Sessions that exist (each sends at most one job per step).
    pub alive: &'a AtomicUsize,
}

/// A step as [`gather`] formed it.
#[derive(Debug)]
pub struct Gathered<J> {
    /// Its jobs, the first one first.
    pub step: Vec<J>,
    /// A job that would have passed the row limit, for the next step.
    pub over: Option<J>,
    /// Seconds spent gathering after the first job.
    pub waited: f64,
    /// Live sessions without a job in the step when gathering ended.
    pub missed: usize,
}

/// The step that starts with `first`: every job waiting, and those that arrive within
/// `limits.wait` while fewer jobs than live sessions are in it; a job that would pass the
/// row limit is kept for the next step.
pub fn gather<J: Rows>(jobs: &Receiver<J>, first: J, limits: Gathering<'_>) -> Gathered<J> {
    let started = Instant::now();
    let until = started + limits.wait;
    let mut rows = first.rows();
    let mut step = vec![first];
    let mut over = None;
    loop {
        let next = match jobs.try_recv() {
            Ok(job) => job,
            Err(_) if step.len() >= limits.alive.load(Ordering::Acquire) => break,
            Err(_) => match jobs.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            },
        };
        if rows + next.rows() > limits.max_rows {
            over = Some(next);
            break;
        }
        rows += next.rows();
        step.push(next);
    }
    let missed = match over {
        Some(_) => 0,
        None => limits
            .alive
            .load(Ordering::Acquire)
            .saturating_sub(step.len()),
    };
    Gathered {
        step,
        over,
        waited: started.elapsed().as_secs_f64(),
        missed,
    }
}

/// A batching thread's recent step time (an exponential average), which bounds how long a
/// step waits for stragglers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pace {
    recent: f64,
}

impl Pace {
    /// How long the next step may wait: a quarter of a recent step, at most `cap` (no wait
    /// before the first step was timed).
    pub fn wait(&self, cap: Duration) -> Duration {
        Duration::from_secs_f64(self.recent / 4.0).min(cap)
    }

    /// Takes a step's seconds into the average.
    pub fn record(&mut self, seconds: f64) {
        self.recent = match self.recent == 0.0 {
            true => seconds,
            false => 0.8 * self.recent + 0.2 * seconds,
        };
    }
}

/// The size a step pads `n` to: the first of `sizes` (ascending) that holds it, `n` itself
/// past the last. The one rule of a device's batch buckets and block lengths, and of the
/// draft scheduler's pricing of them.
pub fn bucket(sizes: &[usize], n: usize) -> usize {
    let i = sizes.partition_point(|s| *s < n);
    sizes.get(i).copied().unwrap_or(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_size_pads_to_the_first_bucket_that_holds_it() {
        let sizes = [1, 2, 4, 8, 9, 12];
        let padded: Vec<usize> = (0..=14).map(|n| bucket(&sizes, n)).collect();
        assert_eq!(padded, [1, 1, 2, 4, 4, 8, 8, 8, 8, 9, 12, 12, 12, 13, 14]);
        assert_eq!(bucket(&[], 5), 5);
    }

    struct Job(usize);

    impl Rows for Job {
        fn rows(&self) -> usize {
            self.0
        }
    }

    fn limits(alive: &AtomicUsize, max_rows: usize, wait_ms: u64) -> Gathering<'_> {
        Gathering {
            max_rows,
            wait: Duration::from_millis(wait_ms),
            alive,
        }
    }

    #[test]
    fn takes_every_waiting_job_without_waiting_once_all_sessions_sent() {
        let (tx, rx) = mpsc::channel();
        [2, 3, 4]
            .into_iter()
            .for_each(|r| tx.send(Job(r)).expect("send"));
        let alive = AtomicUsize::new(4);
        let t0 = Instant::now();
        let g = gather(&rx, Job(1), limits(&alive, 64, 10_000));
        assert_eq!(g.step.iter().map(|j| j.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(g.over.is_none());
        assert_eq!(g.missed, 0);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "it waited for nobody"
        );
    }

    #[test]
    fn waits_at_most_the_wait_for_missing_sessions() {
        let (tx, rx) = mpsc::channel::<Job>();
        let alive = AtomicUsize::new(3);
        let t0 = Instant::now();
        let g = gather(&rx, Job(1), limits(&alive, 64, 30));
        let waited = t0.elapsed();
        assert_eq!(g.step.len(), 1);
        assert!(g.over.is_none());
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // It says what it waited and the two live sessions it went without.
        assert!(g.waited >= 0.030 && g.waited <= waited.as_secs_f64());
        assert_eq!(g.missed, 2);
        drop(tx);
    }

    #[test]
    fn a_job_past_the_row_limit_waits_for_the_next_step() {
        let (tx, rx) = mpsc::channel();
        [3, 5, 1]
            .into_iter()
            .for_each(|r| tx.send(Job(r)).expect("send"));
        let alive = AtomicUsize::new(4);
        let g = gather(&rx, Job(4), limits(&alive, 8, 0));
        assert_eq!(g.step.iter().map(|j| j.0).collect::<Vec<_>>(), [4, 3]);
        assert_eq!(g.over.map(|j| j.0), Some(5));
        // A full step misses nobody: the others wait for room, not for the step.
        assert_eq!(g.missed, 0);
        let alone = gather(&rx, Job(20), limits(&alive, 8, 0));
        assert_eq!(alone.step.iter().map(|j| j.0).collect::<Vec<_>>(), [20]);
    }

    #[test]
    fn pace_waits_a_quarter_of_recent_steps_under_the_cap() {
        let mut pace = Pace::default();
        assert_eq!(pace.wait(Duration::from_millis(5)), Duration::ZERO);
        pace.record(0.008);
        assert_eq!(pace.wait(Duration::from_millis(5)).as_micros(), 2000);
        pace.record(0.108);
        assert_eq!(
            pace.wait(Duration::from_millis(5)),
            Duration::from_millis(5)
        );
    }
}
