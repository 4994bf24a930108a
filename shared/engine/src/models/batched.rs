//! Continuous batching of a CPU Gemma 3 target's forwards across generations (Orca's
//! iteration-level scheduling, Yu et al., OSDI 2022): every generation keeps its own thread,
//! cache and round, but its forwards go to one stepper thread ([`super::stepper`]), which
//! runs the forwards of all running generations as one ragged forward
//! ([`Gemma3::forward_ragged`]) — one read of the weights for every running session. Generations join and leave between steps. Long
//! prompts are prefilled in chunks, so a new session's prompt shares steps with the others'
//! verify blocks instead of stalling them. The kernels are batch invariant: a generation's
//! output is bit for bit what it is alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use tandem_core::batching::{Observers, StepObserver};
use tandem_core::{SnapshotSpec, SnapshotSupport, StepCosts, TargetIdentity};
use tandem_gemma::{
    ForwardOptions, ForwardOutput, Gemma3, GemmaError, KvCache, LogitsMode, Segment, TargetHead,
};

use super::gemma3::{forward_options, interleave};
use super::stepper::{BatchLimits, Job, Stepper};
use super::{Target, TargetFacts, TargetSequence, TargetStep};
use crate::error::{EngineError, Result};

/// A CPU Gemma 3 target whose generations' forwards are batched (see the module docs).
pub struct BatchedGemma3 {
    model: Arc<Gemma3>,
    limits: BatchLimits,
    observers: Observers,
    costs: StepCosts,
    alive: Arc<AtomicUsize>,
    jobs: Option<Sender<Job>>,
    stepper: Option<JoinHandle<()>>,
}

impl BatchedGemma3 {
    /// Starts the stepper thread of `model`.
    pub fn new(model: Arc<Gemma3>, limits: BatchLimits) -> Result<Self> {
        let limits = BatchLimits {
            max_rows: limits.max_rows.max(1),
            prefill_chunk: limits.prefill_chunk.max(1),
            ..limits
        };
        let (tx, rx) = mpsc::channel();
        let costs = profile(&model)?;
        let observers = Observers::default();
        let alive = Arc::new(AtomicUsize::new(0));
        let stepper = Stepper {
            model: model.clone(),
            jobs: rx,
            limits,
            alive: alive.clone(),
            observers: observers.clone(),
        };
        let stepper = std::thread::Builder::new()
            .name("tandem-stepper".into())
            .spawn(move || stepper.run())
            .map_err(|e| EngineError::Load(format!("cannot start the batch stepper: {e}")))?;
        Ok(Self {
            model,
            limits,
            observers,
            costs,
            alive,
            jobs: Some(tx),
            stepper: Some(stepper),
        })
    }

    /// Sends one forward to the stepper and waits for its step.
    fn submit(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: KvCache,
        opts: ForwardOptions,
    ) -> (KvCache, tandem_gemma::Result<ForwardOutput>) {
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            tokens: tokens.to_vec(),
            pos,
            cache,
            opts,
            reply,
        };
        let stopped = |job: Job| {
            let e = GemmaError::Request("the batch stepper has stopped".into());
            (job.cache, Err(e))
        };
        let Some(jobs) = &self.jobs else {
            return stopped(job);
        };
        if let Err(mpsc::SendError(job)) = jobs.send(job) {
            return stopped(job);
        }
        answer.recv().unwrap_or_else(|_| {
            let e = GemmaError::Request("the batch stepper dropped a forward".into());
            (KvCache::new(self.model.config(), 0), Err(e))
        })
    }
}

/// Rows of the start-up profile's steps.
const PROFILE_ROWS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Context of each profiled sequence.
const PROFILE_CONTEXT: usize = 32;

/// The seconds of a step of one-row forwards (every row's logits) of 1 to 64 sequences at a
/// short context, the fastest of two runs each: the scheduler's first step costs.
fn profile(model: &Gemma3) -> Result<StepCosts> {
    let context: Vec<u32> = (0..PROFILE_CONTEXT as u32).map(|i| 1000 + 7 * i).collect();
    let mut base = model.new_cache(PROFILE_CONTEXT + 1);
    let none = ForwardOptions {
        logits: LogitsMode::None,
        taps: Vec::new(),
    };
    model.forward(&context, 0, &mut base, &none)?;
    let all = ForwardOptions::default();
    let mut points = Vec::with_capacity(PROFILE_ROWS.len());
    for rows in PROFILE_ROWS {
        let mut caches = vec![base.clone(); rows];
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let mut segs: Vec<Segment<'_>> = caches
                .iter_mut()
                .map(|cache| Segment {
                    tokens: &[2000],
                    pos: PROFILE_CONTEXT,
                    cache,
                    opts: &all,
                })
                .collect();
            let t0 = Instant::now();
            model.forward_ragged(&mut segs)?;
            best = best.min(t0.elapsed().as_secs_f64());
            drop(segs);
            caches
                .iter_mut()
                .try_for_each(|c| c.truncate(PROFILE_CONTEXT))?;
        }
        points.push((rows, best));
    }
    tracing::debug!(?points, "batched step costs profiled");
    StepCosts::new(&points)
        .ok_or_else(|| EngineError::Load("profiling batched steps measured no time".into()))
}

impl Drop for BatchedGemma3 {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(stepper) = self.stepper.take() {
            let _ = stepper.join();
        }
    }
}

impl Target for BatchedGemma3 {
    fn facts(&self) -> TargetFacts {
        Target::facts(self.model.as_ref())
    }

    fn identity(&self) -> Result<TargetIdentity> {
        Target::identity(self.model.as_ref())
    }

    fn snapshot_support(&self) -> SnapshotSupport {
        Target::snapshot_support(self.model.as_ref())
    }

    fn head(&self) -> Option<TargetHead> {
        Target::head(self.model.as_ref())
    }

    fn observe_steps(&self, observer: Arc<dyn StepObserver>) -> bool {
        self.observers.add(observer);
        true
    }

    fn step_costs(&self) -> Option<StepCosts> {
        Some(self.costs.clone())
    }

    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        let cache = self.model.new_cache(max_len);
        self.alive.fetch_add(1, Ordering::AcqRel);
        Box::new(BatchedSequence {
            target: self,
            max_len: cache.max_len(),
            cache: Some(cache),
        })
    }
}

/// One generation's sequence: its cache, lent to the stepper for each forward.
struct BatchedSequence<'t> {
    target: &'t BatchedGemma3,
    cache: Option<KvCache>,
    max_len: usize,
}

impl Drop for BatchedSequence<'_> {
    fn drop(&mut self) {
        self.target.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The error of a sequence whose cache a failed stepper kept.
fn lost_cache() -> EngineError {
    EngineError::Model(GemmaError::Request("the sequence lost its cache".into()))
}

impl BatchedSequence<'_> {
    /// One step's forward of `tokens` at `pos`.
    fn step(&mut self, tokens: &[u32], pos: usize, opts: ForwardOptions) -> Result<ForwardOutput> {
        let cache = self.cache.take().ok_or_else(lost_cache)?;
        let (cache, out) = self.target.submit(tokens, pos, cache, opts);
        self.cache = Some(cache);
        Ok(out?)
    }
}

impl TargetSequence for BatchedSequence<'_> {
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
            true => self.target.limits.prefill_chunk,
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
        self.cache.as_ref().map_or(0, KvCache::len)
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        Ok(self.cache.as_mut().ok_or_else(lost_cache)?.truncate(len)?)
    }
}
