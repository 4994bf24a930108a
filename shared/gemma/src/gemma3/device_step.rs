//! Fixed-shape steps of [`DeviceGemma3`], replayed as CUDA graphs.
//!
//! A decode or verify step of Gemma 3 270M is about 450 kernel launches of a few
//! microseconds each, so on a GPU the host's work per launch, not the weights' memory
//! traffic, sets a step's pace ([`crate::launch`]). A CUDA graph replays a captured sequence
//! of launches in one call, but with the shapes and addresses it was captured with. A
//! fixed-shape step gives it both:
//!
//! * the cache of one sequence is allocated whole, at fixed addresses, for
//!   [`STEP_POSITIONS`] positions; a dropped cache's storage, with its steps and graphs,
//!   goes to the next sequence (up to [`MAX_SPARE_CACHES`] kept, so a burst of sequences
//!   does not keep its device memory for good);
//! * the block's embedded rows and positions are copied into input tensors the step owns;
//!   rotations are gathered from device tables by position, keys and values are scattered
//!   to their positions, and attention covers a fixed span of the cache (the smallest power
//!   of two, at least [`MIN_SPAN`], that holds the block) under a mask computed on the
//!   device from the positions;
//! * the final-norm rows and taps are copied into output tensors the step owns.
//!
//! A block is padded with rows at the positions that follow it up to one of a few row
//! counts (their keys and values land past the committed positions, where nothing attends
//! to them before a later block overwrites them), so that a few steps serve every block
//! length. A step is keyed by its rows, span and taps; its first run goes op by op and is
//! then captured (CUDA only); later runs replay the graph. On other devices the steps run
//! op by op, which is how the tests check them against the plain forward. A capture that fails
//! leaves its step op by op, with a warning.
//!
//! Measured on an H100 in bf16 (docs/performance/2026-12-05-gpu-fused-steps-h100.md): a
//! decode step replayed in 0.97 ms, 20–35 µs of it host work, against 3.0 ms launched op by
//! op; a 16-token block in 1.23 times a one-token step.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::config::GemmaConfig;
use super::device::{DeviceGemma3, DeviceOptions};
use super::device_cache::DeviceCache;
use super::device_frame::{Context, Store};
use super::model::{ForwardOptions, ForwardOutput, LogitsMode};
use super::step_clock::StepClock;
use crate::error::Result;
use crate::graph::{Replayed, Spares};
use crate::launch::with_cached_layouts;
use crate::ops::Rope;

/// Positions a cache of fixed-shape steps holds (fewer where the model's context is
/// shorter); a sequence that may grow longer gets a plain cache.
pub const STEP_POSITIONS: usize = 4096;
/// Most rows a fixed-shape step takes; longer blocks (prompts) run op by op.
pub const MAX_STEP_ROWS: usize = 32;
/// Rows a step runs: a block is padded to the first that holds it (where the cache has
/// room for the padding), so that a few graphs serve every block length; 9 is a verify
/// block of the default γ = 8.
const ROW_BUCKETS: [usize; 8] = [1, 2, 4, 8, 9, 12, 16, 32];
/// The shortest span of the cache a step attends to.
pub(super) const MIN_SPAN: usize = 256;
/// What a masked score gets added (finite, so that masks are made by arithmetic; its
/// exponential is exactly zero next to any visible score, as `-inf`'s is).
pub(super) const MASKED: f64 = -1e30;

/// Dropped caches' storage kept for the next sequences, at most (75 MB each for Gemma 3
/// 270M in bf16).
pub(crate) const MAX_SPARE_CACHES: usize = 32;

/// Dropped caches' storage, for the next sequence.
type Spare = Arc<Spares<CacheParts>>;

/// What the fixed-shape steps of one model share.
pub(crate) struct StepShared {
    tables: RopeTables,
    spare: Spare,
}

impl StepShared {
    pub(super) fn new(cfg: &GemmaConfig, ropes: [&Rope; 2], opts: &DeviceOptions) -> Result<Self> {
        Ok(Self {
            tables: RopeTables::new(cfg, ropes, opts)?,
            spare: Arc::new(Spares::new(MAX_SPARE_CACHES)),
        })
    }
}

/// `[positions, head_dim / 2]` cosines and sines of the local and the global rope on the
/// device, for the first [`STEP_POSITIONS`] positions (fewer where the model's context is
/// shorter): what steps gather their rows' rotations from by position.
pub(super) struct RopeTables {
    local: (Tensor, Tensor),
    global: (Tensor, Tensor),
    pub(super) positions: usize,
}

impl RopeTables {
    pub(super) fn new(cfg: &GemmaConfig, ropes: [&Rope; 2], opts: &DeviceOptions) -> Result<Self> {
        let positions = STEP_POSITIONS.min(cfg.max_position_embeddings);
        let half = cfg.head_dim / 2;
        let table = |rope: &Rope| -> Result<(Tensor, Tensor)> {
            let (cos, sin) = rope.angles(0, positions).into_tables();
            let put = |rows: Vec<f32>| -> Result<Tensor> {
                let t = Tensor::from_vec(rows, (positions, half), &Device::Cpu)?;
                Ok(t.to_dtype(opts.dtype)?.to_device(&opts.device)?)
            };
            Ok((put(cos)?, put(sin)?))
        };
        Ok(Self {
            local: table(ropes[0])?,
            global: table(ropes[1])?,
            positions,
        })
    }

    /// Rotations and masks of `b` blocks of `m` rows whose positions `pos` (`[b * m]` u32,
    /// block-major) are on the device, attending to key positions `keys` (`[1, span]` f32):
    /// computed there, so that a captured step recomputes them from its inputs. Masks are
    /// `[b, 1, m * group, span]`.
    pub(super) fn context(
        &self,
        cfg: &GemmaConfig,
        pos: &Tensor,
        keys: &Tensor,
        (b, m): (usize, usize),
    ) -> Result<Context> {
        let span = keys.dim(1)?;
        let group = cfg.num_attention_heads / cfg.num_key_value_heads;
        let gather = |(cos, sin): &(Tensor, Tensor)| -> Result<(Tensor, Tensor)> {
            Ok((cos.index_select(pos, 0)?, sin.index_select(pos, 0)?))
        };
        // `back[r, j]`: how far key position j lies behind row r's position.
        let back = pos
            .to_dtype(DType::F32)?
            .reshape((b * m, 1))?
            .broadcast_sub(keys)?;
        let causal = back.ge(0.0)?.to_dtype(DType::F32)?;
        let window = back.lt(cfg.sliding_window as f64)?.to_dtype(DType::F32)?;
        let additive = |visible: &Tensor| -> Result<Tensor> {
            Ok(visible
                .affine(-MASKED, MASKED)?
                .reshape((b, m, 1, span))?
                .broadcast_as((b, m, group, span))?
                .reshape((b, 1, m * group, span))?)
        };
        Ok(Context {
            m,
            b,
            local: gather(&self.local)?,
            global: gather(&self.global)?,
            local_mask: Some(additive(&(&causal * &window)?)?),
            global_mask: Some(additive(&causal)?),
        })
    }
}

/// The storage of a cache at fixed addresses, kept across sequences.
pub(crate) struct CacheParts {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    steps: HashMap<StepKey, FixedStep>,
}

/// The fixed-shape steps of a cache at fixed addresses, and where its storage goes when
/// the cache is dropped.
pub(crate) struct CacheSteps {
    steps: HashMap<StepKey, FixedStep>,
    spare: Spare,
}

impl CacheSteps {
    /// Steps (block shapes) built so far.
    pub(crate) fn len(&self) -> usize {
        self.steps.len()
    }

    /// Gives the cache's storage (`k`, `v`, taken from it) back for the next sequence.
    pub(crate) fn give_back(self, k: Vec<Tensor>, v: Vec<Tensor>) {
        let parts = CacheParts {
            k,
            v,
            steps: self.steps,
        };
        self.spare.give(parts);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StepKey {
    rows: usize,
    span: usize,
    taps: Vec<usize>,
}

/// One fixed-shape step: its inputs and outputs at fixed addresses, and its graph once
/// captured.
struct FixedStep {
    key: StepKey,
    io: StepIo,
    replay: Replayed,
}

/// A fixed-shape step's inputs and outputs.
struct StepIo {
    /// `[rows, hidden]` embedded rows.
    x: Tensor,
    /// `[rows]` u32 positions.
    pos: Tensor,
    /// `[1, span]` f32 key positions `0..span`.
    keys: Tensor,
    /// `[rows, hidden]` final-norm rows.
    normed: Tensor,
    taps: Vec<Tensor>,
}

impl FixedStep {
    fn new(model: &DeviceGemma3, key: StepKey) -> Result<Self> {
        let (dev, dtype) = (&model.opts.device, model.opts.dtype);
        let rows = (key.rows, model.cfg.hidden_size);
        let keys = Tensor::arange(0u32, key.span as u32, dev)?
            .to_dtype(DType::F32)?
            .reshape((1, key.span))?;
        let io = StepIo {
            x: Tensor::zeros(rows, dtype, dev)?,
            pos: Tensor::zeros(key.rows, DType::U32, dev)?,
            keys,
            normed: Tensor::zeros(rows, dtype, dev)?,
            taps: (0..key.taps.len())
                .map(|_| Tensor::zeros(rows, dtype, dev))
                .collect::<candle_core::Result<_>>()?,
        };
        Ok(Self {
            key,
            io,
            replay: Replayed::default(),
        })
    }
}

impl DeviceGemma3 {
    /// A cache at fixed addresses for one sequence of at most `max_len` positions, where
    /// graphs are on and it fits (`None`: a plain cache it is).
    pub(super) fn fixed_cache(&self, batch: usize, max_len: usize) -> Option<DeviceCache> {
        let shared = self.steps.as_ref()?;
        if batch != 1 || max_len > shared.tables.positions {
            return None;
        }
        let parts = match shared.spare.take() {
            Some(parts) => parts,
            None => self.new_parts(shared.tables.positions).ok()?,
        };
        let steps = CacheSteps {
            steps: parts.steps,
            spare: shared.spare.clone(),
        };
        let cfg = &self.cfg;
        let dims = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim);
        let at = (self.opts.dtype, self.opts.device.clone());
        let storage = (parts.k, parts.v, shared.tables.positions);
        Some(DeviceCache::fixed(storage, steps, max_len, dims, at))
    }

    fn new_parts(&self, positions: usize) -> Result<CacheParts> {
        let cfg = &self.cfg;
        let shape = (1, positions, cfg.num_key_value_heads, cfg.head_dim);
        let zeros = || {
            (0..cfg.num_hidden_layers)
                .map(|_| Tensor::zeros(shape, self.opts.dtype, &self.opts.device))
                .collect::<candle_core::Result<Vec<_>>>()
        };
        Ok(CacheParts {
            k: zeros()?,
            v: zeros()?,
            steps: HashMap::new(),
        })
    }

    /// Whether a block of `n` tokens in `cache` runs as a fixed-shape step.
    pub(super) fn takes_step(&self, n: usize, cache: &DeviceCache) -> bool {
        cache.steps.is_some() && n <= MAX_STEP_ROWS
    }

    /// [`DeviceGemma3::forward`] as a fixed-shape step (the cache is one at fixed
    /// addresses; the block is at most [`MAX_STEP_ROWS`] tokens).
    pub(super) fn step_forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        let m = tokens.len();
        let capacity = cache.capacity();
        let rows = ROW_BUCKETS
            .iter()
            .copied()
            .find(|&r| r >= m && pos + r <= capacity)
            .unwrap_or(m);
        let span = (pos + rows).next_power_of_two().max(MIN_SPAN).min(capacity);
        let key = StepKey {
            rows,
            span,
            taps: opts.taps.clone(),
        };
        let dev = &self.opts.device;
        let mut clock = StepClock::start(dev);
        let (x, positions) = self.step_inputs(tokens, pos, rows)?;
        let kv = (cache.k.as_slice(), cache.v.as_slice());
        let steps = &mut cache
            .steps
            .as_mut()
            .expect("a cache at fixed addresses")
            .steps;
        let step = match steps.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let step = FixedStep::new(self, e.key().clone())?;
                e.insert(step)
            }
        };
        step.io.x.slice_set(&x, 0, 0)?;
        step.io.pos.slice_set(&positions, 0, 0)?;
        if let Some(clock) = clock.as_mut() {
            clock.mark(dev);
        }
        let (key, io) = (&step.key, &step.io);
        let what = || format!("a target step of {} rows over {}", key.rows, key.span);
        let body = || self.step_body(key, io, kv);
        let replayed = step.replay.run(dev, true, what, body)?;
        let out = self.step_output(io, m, opts)?;
        if let Some(mut clock) = clock {
            clock.mark(dev);
            clock.finish(replayed);
        }
        cache.ledger.commit(m);
        Ok(out)
    }

    /// The block's embedded rows and positions on the device, padded to `rows` with zero
    /// rows at the positions that follow.
    fn step_inputs(&self, tokens: &[u32], pos: usize, rows: usize) -> Result<(Tensor, Tensor)> {
        let positions: Vec<u32> = (pos..pos + rows).map(|p| p as u32).collect();
        Ok((
            self.embed(tokens, rows)?,
            Tensor::new(positions.as_slice(), &self.opts.device)?,
        ))
    }

    /// The layers over the step's inputs, into its outputs and the cache `(k, v)`: what a
    /// graph captures.
    fn step_body(
        &self,
        key: &StepKey,
        step: &StepIo,
        (k, v): (&[Tensor], &[Tensor]),
    ) -> Result<()> {
        with_cached_layouts(&self.opts.device, || -> Result<()> {
            let (ctx, store) = self.step_context(key, step)?;
            let outs = (&step.normed, step.taps.as_slice(), key.taps.as_slice());
            self.run_layers(&step.x, &ctx, (k, v), &store, outs)
        })
    }

    /// Rotations and masks of a step, computed on the device from its positions, and where
    /// its keys and values go.
    fn step_context(&self, key: &StepKey, step: &StepIo) -> Result<(Context, Store)> {
        let shared = self.steps.as_ref().expect("graphs on");
        let ctx = (shared.tables).context(&self.cfg, &step.pos, &step.keys, (1, key.rows))?;
        let pos = step.pos.clone();
        Ok((
            ctx,
            Store::Scatter {
                pos,
                span: key.span,
            },
        ))
    }

    /// The outputs of a step's first `m` rows (the block's, without padding) as
    /// [`DeviceGemma3::forward`] returns them (copies: the next run of the step overwrites
    /// its tensors).
    fn step_output(&self, step: &StepIo, m: usize, opts: &ForwardOptions) -> Result<ForwardOutput> {
        let normed = step.normed.narrow(0, 0, m)?;
        let logits = match opts.logits {
            LogitsMode::All | LogitsMode::BoundedAll | LogitsMode::Top(_) => {
                Some(self.logits(&normed)?)
            }
            LogitsMode::Last | LogitsMode::Bounded => {
                Some(self.logits(&normed.narrow(0, m - 1, 1)?)?)
            }
            LogitsMode::None => None,
        };
        // The taps and the final-norm rows travel in one copy (each copy waits for the
        // device: 15-20 µs apiece on an H100).
        let parts = (step.taps.iter().chain([&step.normed]))
            .map(|t| t.narrow(0, 0, m))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let all = Tensor::cat(&parts, 1)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?;
        let h = self.cfg.hidden_size;
        let mut rows = (0..parts.len())
            .map(|i| all.narrow(1, i * h, h))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let last_hidden = rows.pop().expect("the final-norm rows");
        Ok(ForwardOutput {
            top: None,
            bounded: Vec::new(),
            logits,
            taps: rows,
            last_hidden,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dropped caches go back for the next sequences, at most `MAX_SPARE_CACHES` of them.
    #[test]
    fn at_most_the_spare_limit_of_dropped_caches_is_kept() {
        let spare: Spare = Arc::new(Spares::new(MAX_SPARE_CACHES));
        for _ in 0..MAX_SPARE_CACHES + 5 {
            let steps = CacheSteps {
                steps: HashMap::new(),
                spare: spare.clone(),
            };
            steps.give_back(Vec::new(), Vec::new());
        }
        assert_eq!(spare.len(), MAX_SPARE_CACHES);
    }
}
