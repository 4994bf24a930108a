//! The stepper of a batched target: one thread that forms steps from the forwards
//! generations send it ([`tandem_core::batching::gather`]: every forward waiting, and a
//! short wait for running generations that have not sent theirs) and runs each step on a
//! [`StepRunner`] (the CPU kernels' ragged forward, or a device's batched steps), and
//! [`Steps`], the channel generations send their forwards through.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tandem_core::batching::{gather, Gathered, Gathering, Observers, Pace, Rows, StepReport};
use tandem_gemma::{
    DeviceBatch, ForwardOptions, ForwardOutput, Gemma3, GemmaError, KvCache, LogitsMode, Segment,
    SlotCache, SlotSegment,
};

use crate::device_rows::{draw_last_rows, Draw};
use crate::error::{EngineError, Result};

/// How the stepper forms its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most token rows one step runs (a forward that alone is longer runs alone).
    pub max_rows: usize,
    /// Prompt tokens a prefill forward sends per step.
    pub prefill_chunk: usize,
    /// The longest a step waits for running generations that have not sent their forward.
    pub max_wait: Duration,
    /// Sequences a device target's KV pool holds (a sequence beyond them runs alone).
    pub slots: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_rows: 512,
            prefill_chunk: 128,
            max_wait: Duration::from_millis(5),
            slots: 64,
        }
    }
}

/// A forward waiting for a step: the cache travels with it and comes back with the output
/// (and, where it asked for a draw, the token drawn from its last row).
pub(super) struct Job<C> {
    pub(super) tokens: Vec<u32>,
    pub(super) pos: usize,
    pub(super) cache: C,
    pub(super) opts: ForwardOptions,
    pub(super) draw: Option<Draw>,
    pub(super) reply: SyncSender<(C, tandem_gemma::Result<Stepped>)>,
}

/// A job's answer: its forward's output and the token its draw landed on.
pub(super) type Stepped = (ForwardOutput, Option<u32>);

impl<C> Rows for Job<C> {
    fn rows(&self) -> usize {
        self.tokens.len()
    }
}

/// What a stepper runs its steps on.
pub(super) trait StepRunner: Send + 'static {
    /// The cache a job brings.
    type Cache: Send + 'static;
    /// Fails where [`Self::run`] would refuse `job`'s forward.
    fn check(&self, job: &mut Job<Self::Cache>) -> tandem_gemma::Result<()>;
    /// Runs the forwards of `jobs` (each passed [`Self::check`]) together, outputs in order.
    fn run(&mut self, jobs: &mut [Job<Self::Cache>]) -> tandem_gemma::Result<Vec<ForwardOutput>>;
    /// The rows a step of `jobs` runs, as the target's step costs count them: its blocks'
    /// tokens, unless the target pads them.
    fn step_rows(&self, jobs: &[Job<Self::Cache>]) -> usize {
        jobs.iter().map(|j| j.tokens.len()).sum()
    }
}

/// The CPU kernels' ragged forward ([`Gemma3::forward_ragged`]).
pub(super) struct Ragged(pub(super) Arc<Gemma3>);

impl StepRunner for Ragged {
    type Cache = KvCache;

    fn check(&self, job: &mut Job<KvCache>) -> tandem_gemma::Result<()> {
        self.0.check_segment(&segment(job))
    }

    fn run(&mut self, jobs: &mut [Job<KvCache>]) -> tandem_gemma::Result<Vec<ForwardOutput>> {
        let mut segs: Vec<Segment<'_>> = jobs.iter_mut().map(segment).collect();
        self.0.forward_ragged(&mut segs)
    }
}

fn segment(job: &mut Job<KvCache>) -> Segment<'_> {
    Segment {
        tokens: &job.tokens,
        pos: job.pos,
        cache: &mut job.cache,
        opts: &job.opts,
    }
}

/// A device's batched steps over its pool of KV slots, shared with the target (which
/// warms its steps up through it).
pub(super) struct Shared(pub(super) Arc<Mutex<DeviceBatch>>);

impl Shared {
    fn batch(&self) -> MutexGuard<'_, DeviceBatch> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl StepRunner for Shared {
    type Cache = SlotCache;

    fn check(&self, job: &mut Job<SlotCache>) -> tandem_gemma::Result<()> {
        self.batch().check(&slot_segment(job))
    }

    fn run(&mut self, jobs: &mut [Job<SlotCache>]) -> tandem_gemma::Result<Vec<ForwardOutput>> {
        let mut segs: Vec<SlotSegment<'_>> = jobs.iter_mut().map(slot_segment).collect();
        self.batch().forward(&mut segs)
    }

    fn step_rows(&self, jobs: &[Job<SlotCache>]) -> usize {
        tandem_gemma::padded_rows(&jobs.iter().map(|j| j.tokens.len()).collect::<Vec<_>>())
    }
}

/// The rows of `job` whose logits its forward forms in full ([`StepReport::full_rows`]):
/// every row of an `All` block, the last of a `Last` one, none of a bounded or screened one
/// (a model without bounds or a screen forms those too, but its full rows then cost what
/// its other rows do and its step costs price none apart).
fn full_rows<C>(job: &Job<C>) -> usize {
    match job.opts.logits {
        LogitsMode::All => job.tokens.len(),
        LogitsMode::Last => 1,
        LogitsMode::Top(_) | LogitsMode::Bounded | LogitsMode::BoundedAll | LogitsMode::None => 0,
    }
}

fn slot_segment(job: &mut Job<SlotCache>) -> SlotSegment<'_> {
    SlotSegment {
        tokens: &job.tokens,
        pos: job.pos,
        cache: &mut job.cache,
        opts: &job.opts,
    }
}

/// A stepper thread and the channel generations send their forwards to it through.
pub(super) struct Steps<C> {
    jobs: Option<Sender<Job<C>>>,
    thread: Option<JoinHandle<()>>,
    pub(super) limits: BatchLimits,
    /// Generations (sequences) that exist.
    pub(super) alive: Arc<AtomicUsize>,
    /// The seconds the next step waits for late forwards, as f64 bits.
    late_wait: Arc<AtomicU64>,
    pub(super) observers: Observers,
}

impl<C: Send + 'static> Steps<C> {
    /// Starts the stepper thread of `runner`.
    pub(super) fn start<R: StepRunner<Cache = C>>(runner: R, limits: BatchLimits) -> Result<Self> {
        let (tx, rx) = mpsc::channel();
        let observers = Observers::default();
        let alive = Arc::new(AtomicUsize::new(0));
        let late_wait = Arc::new(AtomicU64::new(0f64.to_bits()));
        let stepper = Stepper {
            runner,
            jobs: rx,
            limits,
            alive: alive.clone(),
            late_wait: late_wait.clone(),
            observers: observers.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("tandem-stepper".into())
            .spawn(move || stepper.run())
            .map_err(|e| EngineError::Load(format!("cannot start the batch stepper: {e}")))?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
            limits,
            alive,
            late_wait,
            observers,
        })
    }

    /// The seconds the next step waits for generations that have not sent their forward
    /// (0 before a step was timed).
    pub(super) fn late_wait(&self) -> f64 {
        f64::from_bits(self.late_wait.load(Ordering::Relaxed))
    }

    /// Sends one forward to the stepper (with the draw its last row's logits are for, if
    /// any) and waits for its step; the cache comes back unless the stepper has gone.
    pub(super) fn submit(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: C,
        (opts, draw): (ForwardOptions, Option<Draw>),
    ) -> (Option<C>, tandem_gemma::Result<Stepped>) {
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            tokens: tokens.to_vec(),
            pos,
            cache,
            opts,
            draw,
            reply,
        };
        let stopped = |job: Job<C>| {
            let e = GemmaError::Request("the batch stepper has stopped".into());
            (Some(job.cache), Err(e))
        };
        let Some(jobs) = &self.jobs else {
            return stopped(job);
        };
        if let Err(mpsc::SendError(job)) = jobs.send(job) {
            return stopped(job);
        }
        match answer.recv() {
            Ok((cache, out)) => (Some(cache), out),
            Err(_) => {
                let e = GemmaError::Request("the batch stepper dropped a forward".into());
                (None, Err(e))
            }
        }
    }
}

impl<C> Drop for Steps<C> {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The stepper thread's state.
struct Stepper<R: StepRunner> {
    runner: R,
    jobs: Receiver<Job<R::Cache>>,
    limits: BatchLimits,
    alive: Arc<AtomicUsize>,
    late_wait: Arc<AtomicU64>,
    observers: Observers,
}

impl<R: StepRunner> Stepper<R> {
    /// Runs steps until every sender is gone.
    fn run(mut self) {
        let mut held: Option<Job<R::Cache>> = None;
        let mut pace = Pace::default();
        while let Some(first) = held.take().or_else(|| self.jobs.recv().ok()) {
            let limits = Gathering {
                max_rows: self.limits.max_rows,
                wait: pace.wait(self.limits.max_wait),
                alive: &self.alive,
            };
            let mut gathered = gather(&self.jobs, first, limits);
            held = gathered.over.take();
            if let Some(seconds) = self.run_step(gathered) {
                pace.record(seconds);
                let wait = pace.wait(self.limits.max_wait).as_secs_f64();
                self.late_wait.store(wait.to_bits(), Ordering::Relaxed);
            }
        }
    }

    /// Runs the gathered step's valid forwards together and answers every job (one that the
    /// runner refuses alone, with its error); returns the step's seconds when it ran.
    fn run_step(&mut self, gathered: Gathered<Job<R::Cache>>) -> Option<f64> {
        let (mut ready, mut refused) = (Vec::new(), Vec::new());
        for mut job in gathered.step {
            match self.runner.check(&mut job) {
                Ok(()) => ready.push(job),
                Err(e) => refused.push((job, e)),
            }
        }
        for (job, e) in refused {
            // A generation that stopped waiting has gone; its cache goes with the answer.
            let _ = job.reply.send((job.cache, Err(e)));
        }
        if ready.is_empty() {
            return None;
        }
        let t0 = Instant::now();
        let outs = (self.runner.run(&mut ready)).and_then(|outs| drawn(&ready, outs));
        let report = StepReport {
            sequences: ready.len(),
            rows: self.runner.step_rows(&ready),
            seconds: t0.elapsed().as_secs_f64(),
            waited: gathered.waited,
            missed: gathered.missed,
            drawn: ready.iter().filter(|j| j.draw.is_some()).count(),
            full_rows: ready.iter().map(full_rows).sum(),
        };
        let outs: Vec<tandem_gemma::Result<Stepped>> = match outs {
            Ok(outs) => outs.into_iter().map(Ok).collect(),
            Err(e) => (0..ready.len())
                .map(|_| {
                    let e = GemmaError::Request(format!("a batched forward failed: {e}"));
                    Err(e)
                })
                .collect(),
        };
        // Before the answers, while the generations wait for them: the draft scheduler
        // plans the batch they ask about next (after them it raced 32 generations for the
        // host's cores: 0.3–0.5 ms a step on an H100's host against 3–4 ms steps).
        self.observers.report(&report);
        for (job, out) in ready.into_iter().zip(outs) {
            let _ = job.reply.send((job.cache, out));
        }
        Some(report.seconds)
    }
}

/// Each job's output with the token its draw lands on, the step's draws made together
/// ([`draw_last_rows`]); a job that asked for a draw got logits (its forward's
/// [`tandem_gemma::LogitsMode::All`]).
fn drawn<C>(jobs: &[Job<C>], outs: Vec<ForwardOutput>) -> tandem_gemma::Result<Vec<Stepped>> {
    let asked = (jobs.iter().zip(&outs))
        .filter_map(|(job, out)| Some((out.logits.as_ref()?, job.draw?)))
        .collect::<Vec<_>>();
    if asked.len() < jobs.iter().filter(|j| j.draw.is_some()).count() {
        return Err(GemmaError::Request(
            "a draw asked of a forward without logits".into(),
        ));
    }
    let mut ids = draw_last_rows(&asked)?.into_iter();
    Ok((jobs.iter().zip(outs))
        .map(|(job, out)| (out, job.draw.and_then(|_| ids.next())))
        .collect())
}
