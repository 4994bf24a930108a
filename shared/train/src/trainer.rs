//! The training loop: each step takes the next `samples_per_step` training prompts (in
//! order, wrapping), generates their samples with the target if needed, draws random
//! anchors from a generator seeded by (seed, step), runs the drafter's training forward,
//! and takes an AdamW step on the DSpark loss. Everything a step depends on is a function
//! of the checkpointed state, so a resumed run repeats the uninterrupted one exactly.

use std::path::Path;
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use tandem_dspark::Dspark;
use tandem_gemma::{Gemma3Model, TargetHead};

use crate::batch::{anchor_range, random_anchors, Anchor, BatchMaker};
use crate::checkpoint::{self, TrainState};
use crate::error::{Result, TrainError};
use crate::loss::{loss, Loss};
use crate::optim::{AdamW, AdamWConfig, LrSchedule};
use crate::teacher::{Pool, Sample};

/// Settings of a training run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainConfig {
    /// Updates in total.
    pub steps: usize,
    /// Training prompts per step.
    pub samples_per_step: usize,
    /// Random anchors per sample and step.
    pub anchors_per_sample: usize,
    /// Learning-rate schedule.
    pub schedule: LrSchedule,
    /// Optimizer settings.
    pub adamw: AdamWConfig,
    /// Seed of the anchors.
    pub seed: u64,
    /// Evaluate on the held-out samples every this many steps (0 = only at the end).
    pub eval_every: usize,
    /// Anchor stride of the held-out evaluation (every `n`-th valid position).
    pub eval_stride: usize,
    /// Save a checkpoint every this many steps (0 = only at the end).
    pub checkpoint_every: usize,
    /// Prefixes of the names of the parameters the optimizer steps (`bb.2.`: the third
    /// backbone layer); the others stay as loaded. Empty: every parameter.
    pub train_only: Vec<String>,
    /// The corpus weights the training prompts were drawn with (`PATH=W`), for the resume
    /// check only.
    pub corpus_weights: Vec<String>,
    /// Temperature of the loss's total variation ([`crate::loss::loss`]; 1 = the paper's).
    pub tv_temperature: f64,
    /// Where the drafter trains (the CPU, or a GPU with the `cuda` feature).
    #[serde(skip)]
    pub device: Device,
}

/// What one step did.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// Steps done after this one.
    pub step: usize,
    /// Loss and its parts.
    pub loss: f32,
    /// Cross-entropy part.
    pub ce: f32,
    /// Total-variation part.
    pub tv: f32,
    /// Confidence part.
    pub bce: f32,
    /// Teacher-forced mean accepted tokens per block of the batch.
    pub accepted: f32,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Block positions trained on.
    pub tokens: usize,
    /// Seconds spent generating samples with the target.
    pub generate_s: f64,
    /// Seconds of the step itself (forward, backward, update).
    pub train_s: f64,
}

/// Held-out figures.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// Step at which it was measured.
    pub step: usize,
    /// Blocks scored.
    pub blocks: usize,
    /// Mean loss.
    pub loss: f32,
    /// Mean total variation.
    pub tv: f32,
    /// Teacher-forced mean acceptance length τ = 1 + accepted tokens per block.
    pub tau: f32,
}

/// Progress events of [`Trainer::run`].
#[derive(Debug)]
pub enum Event<'a> {
    /// A step finished.
    Step(&'a StepReport),
    /// A held-out evaluation finished.
    Eval(&'a EvalReport),
    /// A checkpoint was written.
    Checkpoint(&'a Path),
}

/// Trains one drafter against one target: the teacher's forward is any [`Gemma3Model`]
/// (the CPU kernels or a GPU), and the drafter trains on [`TrainConfig::device`].
pub struct Trainer<'m, M: Gemma3Model> {
    model: &'m M,
    head: TargetHead,
    drafter: Dspark,
    head_rows: Tensor,
    opt: AdamW,
    train: Pool,
    held_out: Pool,
    cfg: TrainConfig,
    step: usize,
}

impl<'m, M: Gemma3Model> Trainer<'m, M> {
    /// A trainer for a fresh `drafter`, or one restored from `resume` (a checkpoint folder).
    pub fn new(
        model: &'m M,
        drafter: Dspark,
        (train, held_out): (Pool, Pool),
        cfg: TrainConfig,
    ) -> Result<Self> {
        if train.is_empty() || cfg.samples_per_step == 0 || cfg.anchors_per_sample == 0 {
            return Err(TrainError::Invalid(
                "training needs prompts, samples per step and anchors per sample".into(),
            ));
        }
        let head = model.head();
        let drafter = drafter.to_device(&cfg.device)?;
        let head_rows = head
            .dense_rows(drafter.vocab().ids())?
            .to_device(&cfg.device)?;
        let opt = AdamW::new(stepped(&drafter, &cfg.train_only)?, cfg.adamw)?;
        Ok(Self {
            model,
            head,
            drafter,
            head_rows,
            opt,
            train,
            held_out,
            cfg,
            step: 0,
        })
    }

    /// Continues from the checkpoint in `dir` (which must have been made with the same data
    /// settings); the drafter there replaces the one this trainer was built with.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let r = checkpoint::load(dir, &self.head)?;
        if r.state.fingerprint != self.fingerprint() {
            return Err(TrainError::checkpoint(
                dir,
                format!(
                    "was made with other settings: {} (now {})",
                    r.state.fingerprint,
                    self.fingerprint()
                ),
            ));
        }
        let dev = &self.cfg.device;
        let drafter = r.drafter.to_device(dev)?;
        self.head_rows = self
            .head
            .dense_rows(drafter.vocab().ids())?
            .to_device(dev)?;
        self.opt = AdamW::new(stepped(&drafter, &self.cfg.train_only)?, self.cfg.adamw)?;
        let moments = r
            .moments
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_device(dev)?)))
            .collect::<Result<_>>()?;
        self.opt.restore(moments, r.state.step)?;
        self.drafter = drafter;
        self.step = r.state.step;
        Ok(())
    }

    /// The drafter being trained.
    pub fn drafter(&self) -> &Dspark {
        &self.drafter
    }

    /// Steps done.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Settings that must match on resume.
    fn fingerprint(&self) -> serde_json::Value {
        let mut f = serde_json::json!({
            "seed": self.cfg.seed,
            "samples_per_step": self.cfg.samples_per_step,
            "anchors_per_sample": self.cfg.anchors_per_sample,
            "train_prompts": self.train.len(),
            "continuation_tokens": self.train.config().continuation_tokens,
            "schedule": self.cfg.schedule,
        });
        // Absent when every parameter trains, as checkpoints made before the setting had it.
        if !self.cfg.train_only.is_empty() {
            f["train_only"] = serde_json::json!(self.cfg.train_only);
        }
        if !self.cfg.corpus_weights.is_empty() {
            f["corpus_weights"] = serde_json::json!(self.cfg.corpus_weights);
        }
        if self.cfg.tv_temperature != 1.0 {
            f["tv_temperature"] = serde_json::json!(self.cfg.tv_temperature);
        }
        f
    }

    /// Saves a checkpoint into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let state = TrainState {
            step: self.step,
            fingerprint: self.fingerprint(),
        };
        checkpoint::save(dir, &self.drafter, &self.opt, &state)
    }

    /// Runs until `cfg.steps`, evaluating and checkpointing into `out` as configured.
    pub fn run(&mut self, out: &Path, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        while self.step < self.cfg.steps {
            let report = self.step()?;
            on(Event::Step(&report));
            let step = self.step;
            let every = |n: usize| n > 0 && step.is_multiple_of(n);
            let last = step == self.cfg.steps;
            let (eval, save) = (every(self.cfg.eval_every), every(self.cfg.checkpoint_every));
            if (eval || last) && !self.held_out.is_empty() {
                on(Event::Eval(&self.evaluate()?));
            }
            if save || last {
                self.save(out)?;
                on(Event::Checkpoint(out));
            }
        }
        Ok(())
    }

    /// One update.
    pub fn step(&mut self) -> Result<StepReport> {
        let n = self.train.len();
        let first = self.step * self.cfg.samples_per_step;
        let idx: Vec<usize> = (0..self.cfg.samples_per_step)
            .map(|i| (first + i) % n)
            .collect();
        let t0 = Instant::now();
        // A missing sample brings a whole teacher batch of the prompts to come with it.
        let ahead = self.train.config().batch.max(idx.len());
        let wanted: Vec<usize> = match idx.iter().all(|i| self.train.get(*i).is_some()) {
            true => Vec::new(),
            false => (0..ahead).map(|i| (first + i) % n).collect(),
        };
        self.train.ensure(self.model, &wanted)?;
        let generate_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let picked: Vec<(usize, &Sample)> = idx
            .iter()
            .enumerate()
            .map(|(k, i)| self.train.get(*i).map(|s| (k, s)))
            .collect::<Option<_>>()
            .ok_or_else(|| TrainError::Invalid("a sample was not generated".into()))?;
        let gamma = self.drafter.config().gamma;
        let mut rng = ChaCha20Rng::seed_from_u64(
            self.cfg.seed ^ (self.step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let anchors = random_anchors(&mut rng, &picked, self.cfg.anchors_per_sample, gamma)?;
        let samples: Vec<&Sample> = picked.iter().map(|(_, s)| *s).collect();
        let l = self.score(&samples, &anchors)?;
        let grads = l.total.backward()?;
        let lr = self.cfg.schedule.at(self.step);
        let grad_norm = self.opt.step(&grads, lr)?;
        self.step += 1;
        Ok(StepReport {
            step: self.step,
            loss: l.value,
            ce: l.ce,
            tv: l.tv,
            bce: l.bce,
            accepted: l.accepted,
            lr,
            grad_norm,
            tokens: anchors.len() * gamma,
            generate_s,
            train_s: t1.elapsed().as_secs_f64(),
        })
    }

    fn score(&self, samples: &[&Sample], anchors: &[Anchor]) -> Result<Loss> {
        let maker = BatchMaker {
            head: &self.head,
            vocab: self.drafter.vocab(),
            gamma: self.drafter.config().gamma,
            device: &self.cfg.device,
        };
        let (batch, targets) = maker.make(samples, anchors)?;
        let out = self.drafter.forward_train(&batch, &self.head_rows)?;
        loss(&out, &targets, self.cfg.tv_temperature)
    }

    /// Scores every `eval_stride`-th anchor of every held-out sample (generated on first
    /// use), in batches of the training batch size.
    pub fn evaluate(&mut self) -> Result<EvalReport> {
        let all: Vec<usize> = (0..self.held_out.len()).collect();
        self.held_out.ensure(self.model, &all)?;
        let gamma = self.drafter.config().gamma;
        let samples = self.held_out.generated();
        let anchors: Vec<Anchor> = samples
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                anchor_range(s, gamma)
                    .step_by(self.cfg.eval_stride.max(1))
                    .map(move |pos| Anchor { sample: i, pos })
            })
            .collect();
        let chunk = (self.cfg.samples_per_step * self.cfg.anchors_per_sample).max(1);
        let (mut loss_sum, mut tv_sum, mut acc_sum) = (0f64, 0f64, 0f64);
        for part in anchors.chunks(chunk) {
            let l = self.score(&samples, part)?;
            let w = part.len() as f64;
            loss_sum += f64::from(l.value) * w;
            tv_sum += f64::from(l.tv) * w;
            acc_sum += f64::from(l.accepted) * w;
        }
        let n = anchors.len().max(1) as f64;
        Ok(EvalReport {
            step: self.step,
            blocks: anchors.len(),
            loss: (loss_sum / n) as f32,
            tv: (tv_sum / n) as f32,
            tau: (1.0 + acc_sum / n) as f32,
        })
    }
}

/// The parameters of `drafter` the optimizer steps: those whose names start with one of
/// `prefixes` (every one when there are none).
fn stepped(drafter: &Dspark, prefixes: &[String]) -> Result<Vec<(String, Var)>> {
    let vars = drafter.vars();
    if prefixes.is_empty() {
        return Ok(vars);
    }
    let kept: Vec<_> = (vars.into_iter())
        .filter(|(name, _)| prefixes.iter().any(|p| name.starts_with(p.as_str())))
        .collect();
    match kept.is_empty() {
        true => Err(TrainError::Invalid(format!(
            "no parameter's name starts with {}",
            prefixes.join(", ")
        ))),
        false => Ok(kept),
    }
}
