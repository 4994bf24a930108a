//! Batched proposals across sessions: a [`BatchedDrafter`] keeps every session's context
//! and sampler with the session, but sends its blocks to one batching thread, which drafts
//! the blocks of all sessions asking at once as one [`Drafter::draft_many`] — one read of
//! the drafter's weights and one product of the Markov head per block position for the
//! whole batch. Steps form as the target's do ([`tandem_core::batching::gather`]): every
//! block waiting, and a short wait for live sessions that have not asked yet. While only
//! one session lives, it drafts on its own thread. Each session gets exactly the block it
//! would get alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tandem_core::batching::{
    gather, Gathered, Gathering, Observers, Pace, Rows, StepObserver, StepReport,
};
use tandem_core::{DraftBlock, Sampler};

use crate::batch::DraftJob;
use crate::draft::{ContextCache, DraftRequest, Drafter};
use crate::error::{DsparkError, Result};
use crate::proposer::BlockDrafter;

/// How the batching thread forms its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftBatching {
    /// The most blocks one step drafts.
    pub max_sessions: usize,
    /// The longest a step waits for live sessions that have not asked for a block.
    pub max_wait: Duration,
}

impl Default for DraftBatching {
    fn default() -> Self {
        Self {
            max_sessions: 32,
            max_wait: Duration::from_millis(2),
        }
    }
}

/// A host drafter whose sessions' blocks are drafted in batches (see the module docs).
pub struct BatchedDrafter {
    drafter: Arc<Drafter>,
    alive: Arc<AtomicUsize>,
    observers: Observers,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// A session's context in a [`BatchedDrafter`]: lent to the batching thread while a block
/// is drafted (the session waits for it meanwhile).
pub struct BatchedContext {
    cache: Arc<Mutex<ContextCache>>,
    alive: Arc<AtomicUsize>,
}

impl Drop for BatchedContext {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

impl BatchedContext {
    fn lock(&self) -> MutexGuard<'_, ContextCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A block waiting for a step; the sampler travels with it and comes back advanced.
struct Job {
    cache: Arc<Mutex<ContextCache>>,
    req: DraftRequest,
    sampler: Sampler,
    reply: SyncSender<(Sampler, Result<DraftBlock>)>,
}

impl Rows for Job {
    fn rows(&self) -> usize {
        1
    }
}

impl BatchedDrafter {
    /// Starts the batching thread of `drafter`.
    pub fn new(drafter: Drafter, batching: DraftBatching) -> Result<Self> {
        let (tx, rx) = mpsc::channel();
        let drafter = Arc::new(drafter);
        let (alive, observers) = (Arc::new(AtomicUsize::new(0)), Observers::default());
        let step = Steps {
            drafter: Arc::clone(&drafter),
            jobs: rx,
            batching,
            alive: Arc::clone(&alive),
            observers: observers.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("tandem-draft-batch".into())
            .spawn(move || step.run())
            .map_err(|e| DsparkError::Batch(format!("cannot start the batching thread: {e}")))?;
        Ok(Self {
            drafter,
            alive,
            observers,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for BatchedDrafter {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl BlockDrafter for BatchedDrafter {
    type Context = BatchedContext;

    fn row_width(&self) -> usize {
        self.drafter.row_width()
    }

    fn new_context(&self) -> BatchedContext {
        self.alive.fetch_add(1, Ordering::AcqRel);
        BatchedContext {
            cache: Arc::new(Mutex::new(self.drafter.new_cache())),
            alive: Arc::clone(&self.alive),
        }
    }

    fn context_len(ctx: &BatchedContext) -> usize {
        ctx.lock().len()
    }

    fn extend(&self, ctx: &mut BatchedContext, rows: &[f32]) -> Result<()> {
        self.drafter.extend(&mut ctx.lock(), rows)
    }

    fn draft(
        &self,
        ctx: &mut BatchedContext,
        req: &DraftRequest,
        s: &mut Sampler,
    ) -> Result<DraftBlock> {
        let stopped = || DsparkError::Batch("the batching thread has stopped".into());
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            cache: Arc::clone(&ctx.cache),
            req: *req,
            sampler: s.clone(),
            reply,
        };
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())?;
        let (sampler, block) = answer.recv().map_err(|_| stopped())?;
        *s = sampler;
        block
    }

    fn observe_steps(&self, observer: Arc<dyn StepObserver>) -> bool {
        self.observers.add(observer);
        true
    }
}

/// The batching thread's state.
struct Steps {
    drafter: Arc<Drafter>,
    jobs: Receiver<Job>,
    batching: DraftBatching,
    alive: Arc<AtomicUsize>,
    observers: Observers,
}

impl Steps {
    /// Drafts steps until every sender is gone.
    fn run(self) {
        let (mut held, mut pace) = (None, Pace::default());
        while let Some(first) = held.take().or_else(|| self.jobs.recv().ok()) {
            let limits = Gathering {
                max_rows: self.batching.max_sessions.max(1),
                wait: pace.wait(self.batching.max_wait),
                alive: &self.alive,
            };
            let mut gathered = gather(&self.jobs, first, limits);
            held = gathered.over.take();
            pace.record(self.run_step(gathered));
        }
    }

    /// Drafts the gathered step's blocks together, answers every job and returns the step's
    /// seconds.
    fn run_step(&self, gathered: Gathered<Job>) -> f64 {
        let t0 = Instant::now();
        let step = gathered.step;
        let guards: Vec<_> = step
            .iter()
            .map(|j| j.cache.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let mut samplers: Vec<Sampler> = step.iter().map(|j| j.sampler.clone()).collect();
        let mut jobs: Vec<DraftJob<'_>> = guards
            .iter()
            .zip(&step)
            .zip(&mut samplers)
            .map(|((cache, job), sampler)| DraftJob {
                cache,
                req: job.req,
                sampler,
            })
            .collect();
        let blocks = self.drafter.draft_many(&mut jobs);
        drop(jobs);
        drop(guards);
        let report = StepReport {
            sequences: step.len(),
            rows: step.iter().map(|j| j.req.gamma).sum(),
            seconds: t0.elapsed().as_secs_f64(),
            waited: gathered.waited,
            missed: gathered.missed,
            drawn: 0,
            full_rows: 0,
        };
        self.observers.report(&report);
        for ((job, sampler), block) in step.into_iter().zip(samplers).zip(blocks) {
            // A session that stopped waiting has gone; its answer goes nowhere.
            let _ = job.reply.send((sampler, block));
        }
        report.seconds
    }
}
