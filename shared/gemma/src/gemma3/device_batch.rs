//! Continuous batching of [`DeviceGemma3`] (iteration-level scheduling as in Orca, Yu et
//! al., OSDI 2022; CUDA graphs per batch-size bucket as in vLLM): [`DeviceBatch`] runs the
//! blocks of many sequences, each with its own tokens, positions and KV cache, as steps of
//! one pass over the weights.
//!
//! A captured graph replays the addresses it was captured with, so the caches of a batch
//! are slots of one pool per layer (`[1, (slots + 1) * positions, kv_heads, head_dim]`,
//! [`super::device_slots`]) and which rows a step reads and writes are among its inputs:
//!
//! * every block of a step is padded to the step's block length, and the step to a batch
//!   bucket, so that a few graphs serve every batch; padding rows write their keys and
//!   values to a scratch slot no sequence holds;
//! * a step's inputs are its embedded rows and one `u32` tensor of each row's position,
//!   the pool row its key and value go to, and the pool rows each sequence attends to (its
//!   slot's first `span` positions, gathered per layer; the mask, computed on the device
//!   from the positions, hides the uncommitted ones);
//! * a graph is keyed by batch bucket, block length, span and taps, captured after its
//!   first run and replayed after ([`crate::Replayed`]); blocks longer than
//!   [`MAX_STEP_ROWS`] run op by op.
//!
//! Blocks of at most [`SHARED_BLOCK`] tokens (decode and verify blocks) share one step;
//! longer ones (prompt chunks) step apart by their bucket, so a decode step never carries a
//! prompt chunk's padding. Logits are computed for the rows that need them in one product
//! after the step, and a greedy block's argmax with them: one read of the head serves the
//! whole batch. The copy back of taps and final-norm rows is one for the whole step.
//!
//! On a GPU this path is not batch invariant (cuBLAS chooses kernels by shape): a
//! sequence's logits in a batch can differ in the last bits from its logits alone, as its
//! logits in a block differ from one-token decoding ([`DeviceGemma3`]'s docs).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use candle_core::{DType, Device, Tensor};
use tandem_core::batching::bucket;

use super::device::DeviceGemma3;
use super::device_frame::Store;
use super::device_slots::{DeviceSlots, SlotCache};
use super::device_step::{RopeTables, MAX_STEP_ROWS, MIN_SPAN};
use super::model::{ForwardOptions, ForwardOutput, LogitsMode};
use crate::error::{GemmaError, Result};
use crate::graph::Replayed;
use crate::launch::{argmax_with_max, bind_thread, with_cached_layouts};
use crate::TopRow;

/// Sequences one step runs at most (more run in several steps).
pub const MAX_BATCH: usize = 64;
/// Sequences a step runs: a step is padded to the first bucket that holds its sequences.
const BATCH_BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Rows each block of a step has: blocks are padded to the first that holds the longest
/// (9 is a verify block of the default γ = 8); longer blocks keep their length.
pub const BLOCK_BUCKETS: [usize; 8] = [1, 2, 4, 8, 9, 12, 16, 32];
/// Blocks of at most this many tokens share a step.
pub const SHARED_BLOCK: usize = 16;

/// One sequence's block in a batched step.
pub struct SlotSegment<'a> {
    /// The block's tokens (at least one).
    pub tokens: &'a [u32],
    /// The position of its first token: what `cache` holds.
    pub pos: usize,
    /// The sequence's cache.
    pub cache: &'a mut SlotCache,
    /// What the forward returns for this block.
    pub opts: &'a ForwardOptions,
}

impl<'a> SlotSegment<'a> {
    /// One segment of `tokens` with `opts` per cache, each at its cache's end.
    pub fn at_ends(
        caches: &'a mut [SlotCache],
        tokens: &'a [u32],
        opts: &'a ForwardOptions,
    ) -> Vec<Self> {
        (caches.iter_mut())
            .map(|cache| SlotSegment {
                tokens,
                pos: cache.len(),
                cache,
                opts,
            })
            .collect()
    }
}

/// Batched steps of a [`DeviceGemma3`] over a pool of KV slots (see the module docs).
/// Owned by the one thread that runs steps; sequences take slots through
/// [`Self::slots`].
pub struct DeviceBatch {
    model: Arc<DeviceGemma3>,
    tables: RopeTables,
    /// Per layer `[1, (slots + 1) * positions, kv_heads, head_dim]`; the last slot is the
    /// padding rows' scratch.
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    slots: Arc<DeviceSlots>,
    scratch: usize,
    steps: HashMap<StepKey, BatchStep>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StepKey {
    batch: usize,
    rows: usize,
    span: usize,
    taps: Vec<usize>,
}

/// One step shape: its inputs and outputs at fixed addresses, and its graph once captured.
struct BatchStep {
    io: StepIo,
    replay: Replayed,
}

/// A step's inputs and outputs.
struct StepIo {
    /// `[batch * rows, hidden]` embedded rows.
    x: Tensor,
    /// `u32`: `batch * rows` positions, then as many pool rows to store at, then `batch *
    /// span` pool rows to attend to.
    ids: Tensor,
    /// `[1, span]` f32 key positions `0..span`.
    keys: Tensor,
    /// `[batch * rows, hidden]` final-norm rows, then the taps.
    normed: Tensor,
    taps: Vec<Tensor>,
}

impl BatchStep {
    fn new(model: &DeviceGemma3, key: &StepKey) -> Result<Self> {
        let (dev, dtype) = (&model.opts.device, model.opts.dtype);
        let rows = (key.batch * key.rows, model.cfg.hidden_size);
        let zeros = || Tensor::zeros(rows, dtype, dev);
        let ids = 2 * key.batch * key.rows + key.batch * key.span;
        let io = StepIo {
            x: zeros()?,
            ids: Tensor::zeros(ids, DType::U32, dev)?,
            keys: Tensor::arange(0u32, key.span as u32, dev)?
                .to_dtype(DType::F32)?
                .reshape((1, key.span))?,
            normed: zeros()?,
            taps: (0..key.taps.len())
                .map(|_| zeros())
                .collect::<candle_core::Result<_>>()?,
        };
        Ok(Self {
            io,
            replay: Replayed::default(),
        })
    }
}

impl DeviceBatch {
    /// A pool of `slots` sequences of the model's step positions
    /// ([`super::STEP_POSITIONS`] or its context, the shorter) on the model's device.
    pub fn new(model: Arc<DeviceGemma3>, slots: usize) -> Result<Self> {
        let cfg = &model.cfg;
        let ropes = [&model.rope_local, &model.rope_global];
        let tables = RopeTables::new(cfg, ropes, &model.opts)?;
        let slots = slots.max(1);
        let rows = (slots + 1) * tables.positions;
        let shape = (1, rows, cfg.num_key_value_heads, cfg.head_dim);
        let pool = || {
            (0..cfg.num_hidden_layers)
                .map(|_| Tensor::zeros(shape, model.opts.dtype, &model.opts.device))
                .collect::<candle_core::Result<Vec<_>>>()
        };
        Ok(Self {
            k: pool()?,
            v: pool()?,
            slots: Arc::new(DeviceSlots::new(slots, tables.positions)),
            scratch: slots,
            tables,
            model,
            steps: HashMap::new(),
        })
    }

    /// The pool's slots, which sequences take their caches from.
    pub fn slots(&self) -> Arc<DeviceSlots> {
        self.slots.clone()
    }

    /// Step shapes built so far.
    pub fn step_shapes(&self) -> usize {
        self.steps.len()
    }

    /// Runs (and so captures) the steps of blocks of 1 to `rows` tokens with `opts`, at
    /// the shortest span, for every batch bucket the free slots allow: a server pays its
    /// captures before traffic. Returns the step shapes built.
    pub fn warm(&mut self, rows: usize, opts: &ForwardOptions) -> Result<usize> {
        let before = self.steps.len();
        let free = self.slots.available();
        let mut buckets: Vec<usize> = (1..=rows.min(MAX_STEP_ROWS)).map(block_rows).collect();
        buckets.dedup();
        for batch in BATCH_BUCKETS.into_iter().filter(|&b| b <= free) {
            let mut caches: Vec<SlotCache> = (0..batch)
                .filter_map(|_| self.slots.take(MIN_SPAN))
                .collect();
            for &r in &buckets {
                let tokens = vec![0; r];
                self.forward(&mut SlotSegment::at_ends(&mut caches, &tokens, opts))?;
                caches.iter_mut().try_for_each(|c| c.truncate(0))?;
            }
        }
        Ok(self.steps.len() - before)
    }

    /// Fails where [`Self::forward`] would refuse `seg`: an empty block, a token outside
    /// the vocabulary, a tap past the last layer, a cache of another pool, a block that
    /// does not start at the cache's end or does not fit it.
    pub fn check(&self, seg: &SlotSegment<'_>) -> Result<()> {
        let cfg = &self.model.cfg;
        if seg.tokens.is_empty() {
            return Err(GemmaError::Request("empty block".into()));
        }
        if let Some(t) = seg.tokens.iter().find(|t| **t as usize >= cfg.vocab_size) {
            return Err(GemmaError::Request(format!(
                "token {t} is outside the vocabulary of {}",
                cfg.vocab_size
            )));
        }
        if let Some(t) = seg.opts.taps.iter().find(|t| **t > cfg.num_hidden_layers) {
            return Err(GemmaError::Request(format!(
                "tap {t} is out of range (the model has {} layers)",
                cfg.num_hidden_layers
            )));
        }
        if !seg.cache.is_of(&self.slots) {
            return Err(GemmaError::Request("a cache of another pool".into()));
        }
        seg.cache.ledger.check_append(seg.pos, seg.tokens.len())
    }

    /// Runs every segment's block and returns their outputs in order, as
    /// [`DeviceGemma3::forward`] returns them (logits on the device, taps and final-norm
    /// rows on the host), with top rows besides for [`LogitsMode::Top`]`(1)` blocks (each
    /// row's argmax). Fails, committing no position, if any segment fails [`Self::check`]
    /// or a step fails.
    pub fn forward(&mut self, segs: &mut [SlotSegment<'_>]) -> Result<Vec<ForwardOutput>> {
        segs.iter().try_for_each(|s| self.check(s))?;
        let model = self.model.clone();
        let _turn = model.turn.lock().unwrap_or_else(PoisonError::into_inner);
        let mut outs: Vec<Option<ForwardOutput>> = segs.iter().map(|_| None).collect();
        let lengths: Vec<usize> = segs.iter().map(|s| s.tokens.len()).collect();
        for group in groups(&lengths) {
            match self.run_group(segs, &group) {
                Ok(done) => group.iter().zip(done).for_each(|(&i, o)| outs[i] = Some(o)),
                Err(e) => {
                    for s in segs.iter_mut() {
                        let _ = s.cache.ledger.truncate(s.pos.min(s.cache.len()));
                    }
                    return Err(e);
                }
            }
        }
        Ok(outs.into_iter().flatten().collect())
    }

    /// One step of the segments `group` (indices into `segs`), committing their blocks.
    fn run_group(
        &mut self,
        segs: &mut [SlotSegment<'_>],
        group: &[usize],
    ) -> Result<Vec<ForwardOutput>> {
        let longest = group.iter().map(|&i| segs[i].tokens.len()).max();
        let rows = block_rows(longest.unwrap_or(1));
        let reach = group
            .iter()
            .map(|&i| segs[i].pos + segs[i].tokens.len())
            .max();
        let positions = self.slots.positions();
        let mut taps: Vec<usize> = group
            .iter()
            .flat_map(|&i| segs[i].opts.taps.iter().copied())
            .collect();
        taps.sort_unstable();
        taps.dedup();
        let key = StepKey {
            batch: batch_rows(group.len()),
            rows,
            span: (reach.unwrap_or(1).next_power_of_two())
                .max(MIN_SPAN)
                .min(positions),
            taps,
        };
        let mut step = match self.steps.remove(&key) {
            Some(step) => step,
            None => BatchStep::new(&self.model, &key)?,
        };
        self.load_inputs(&key, &step.io, segs, group)?;
        let dev = &self.model.opts.device;
        let what = || format!("a batched step of {} × {} rows", key.batch, key.rows);
        let capture = rows <= MAX_STEP_ROWS;
        step.replay
            .run(dev, capture, what, || self.step_body(&key, &step.io))?;
        let outs = self.outputs(&key, &step.io, segs, group)?;
        if capture {
            self.steps.insert(key, step);
        }
        for &i in group {
            let m = segs[i].tokens.len();
            segs[i].cache.ledger.commit(m);
        }
        Ok(outs)
    }

    /// Copies the step's embedded rows and its positions and pool rows in.
    fn load_inputs(
        &self,
        key: &StepKey,
        step: &StepIo,
        segs: &[SlotSegment<'_>],
        group: &[usize],
    ) -> Result<()> {
        let (n, p) = (key.batch * key.rows, self.slots.positions());
        let scratch = self.scratch * p;
        let mut pos = vec![0u32; n];
        let mut store: Vec<u32> = (0..n).map(|r| (scratch + r % p) as u32).collect();
        let mut gather: Vec<u32> = (0..key.batch * key.span)
            .map(|j| (scratch + j % key.span) as u32)
            .collect();
        let mut placed = Vec::new();
        for (b, &i) in group.iter().enumerate() {
            let s = &segs[i];
            let base = s.cache.slot * p;
            for (r, t) in s.tokens.iter().enumerate() {
                let row = b * key.rows + r;
                placed.push((row, *t));
                pos[row] = (s.pos + r) as u32;
                store[row] = (base + s.pos + r) as u32;
            }
            let span = &mut gather[b * key.span..(b + 1) * key.span];
            span.iter_mut()
                .enumerate()
                .for_each(|(j, g)| *g = (base + j) as u32);
        }
        let ids: Vec<u32> = pos.into_iter().chain(store).chain(gather).collect();
        let dev = &self.model.opts.device;
        step.x
            .slice_set(&self.model.embed_placed(&placed, n)?, 0, 0)?;
        step.ids.slice_set(&Tensor::new(ids, dev)?, 0, 0)?;
        Ok(())
    }

    /// The layers over a step's inputs, into its outputs and the pool: what a graph
    /// captures.
    fn step_body(&self, key: &StepKey, step: &StepIo) -> Result<()> {
        let model = &self.model;
        with_cached_layouts(&model.opts.device, || -> Result<()> {
            let n = key.batch * key.rows;
            let pos = step.ids.narrow(0, 0, n)?;
            let ctx = (self.tables).context(&model.cfg, &pos, &step.keys, (key.batch, key.rows))?;
            let store = Store::Pooled {
                store: step.ids.narrow(0, n, n)?,
                gather: step.ids.narrow(0, 2 * n, key.batch * key.span)?,
                span: key.span,
            };
            let outs = (&step.normed, step.taps.as_slice(), key.taps.as_slice());
            model.run_layers(&step.x, &ctx, (&self.k, &self.v), &store, outs)
        })
    }

    /// Each segment's outputs from a step that ran (copies: the step's next run
    /// overwrites its tensors).
    fn outputs(
        &self,
        key: &StepKey,
        step: &StepIo,
        segs: &[SlotSegment<'_>],
        group: &[usize],
    ) -> Result<Vec<ForwardOutput>> {
        let h = self.model.cfg.hidden_size;
        let rows = |b: usize, r: std::ops::Range<usize>| r.map(move |r| (b * key.rows + r) as u32);
        let real: Vec<u32> = group
            .iter()
            .enumerate()
            .flat_map(|(b, &i)| rows(b, 0..segs[i].tokens.len()))
            .collect();
        // The taps and the final-norm rows travel in one copy.
        let parts = (step.taps.iter().chain([&step.normed]))
            .map(|t| pick_rows(t, &real))
            .collect::<Result<Vec<_>>>()?;
        let host = Tensor::cat(&parts, 1)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?;
        let mut heads = self.heads(key, &step.normed, segs, group)?;
        let mut outs = Vec::with_capacity(group.len());
        let mut at = 0;
        for (b, &i) in group.iter().enumerate() {
            let s = &segs[i];
            let m = s.tokens.len();
            let mine = host.narrow(0, at, m)?;
            at += m;
            let taps = (s.opts.taps.iter())
                .map(|t| {
                    let col = key.taps.iter().position(|k| k == t).expect("a step tap");
                    Ok(mine.narrow(1, col * h, h)?.contiguous()?)
                })
                .collect::<Result<Vec<_>>>()?;
            let (logits, top) = heads[b].take().unwrap_or((None, None));
            outs.push(ForwardOutput {
                logits,
                top,
                bounded: Vec::new(),
                taps,
                last_hidden: mine.narrow(1, key.taps.len() * h, h)?.contiguous()?,
            });
        }
        Ok(outs)
    }

    /// Each segment's logits as its [`LogitsMode`] asks (in one product for the step), and
    /// for [`LogitsMode::Top`]`(1)` each row's argmax as its top row.
    #[allow(clippy::type_complexity)]
    fn heads(
        &self,
        key: &StepKey,
        normed: &Tensor,
        segs: &[SlotSegment<'_>],
        group: &[usize],
    ) -> Result<Vec<Option<(Option<Tensor>, Option<Vec<TopRow>>)>>> {
        // Greedy blocks' rows first, so that one argmax covers them.
        let greedy = |i: usize| segs[i].opts.logits == LogitsMode::Top(1);
        let order: Vec<usize> = (0..group.len())
            .filter(|&b| greedy(group[b]))
            .chain((0..group.len()).filter(|&b| !greedy(group[b])))
            .collect();
        let mut ids = Vec::new();
        let mut spans = vec![None; group.len()];
        for &b in &order {
            let s = &segs[group[b]];
            let m = s.tokens.len();
            let first = b * key.rows;
            let wanted = match s.opts.logits {
                LogitsMode::All | LogitsMode::BoundedAll | LogitsMode::Top(_) => first..first + m,
                LogitsMode::Last | LogitsMode::Bounded => first + m - 1..first + m,
                LogitsMode::None => continue,
            };
            spans[b] = Some(ids.len()..ids.len() + wanted.len());
            ids.extend(wanted.map(|r| r as u32));
        }
        if ids.is_empty() {
            return Ok(vec![None; group.len()]);
        }
        let normed = pick_rows(normed, &ids)?;
        let logits = self.model.logits(&normed)?;
        let greedy_rows: usize = (group.iter().filter(|&&i| greedy(i)))
            .map(|&i| segs[i].tokens.len())
            .sum();
        let mut tops = match greedy_rows {
            0 => Vec::new(),
            n => (argmax_with_max(&logits.narrow(0, 0, n)?)?.into_iter())
                .map(|(id, v)| TopRow {
                    ids: vec![id],
                    values: vec![v],
                })
                .collect(),
        }
        .into_iter();
        let mut out = vec![None; group.len()];
        for &b in &order {
            let Some(span) = spans[b].clone() else {
                continue;
            };
            let top = greedy(group[b]).then(|| tops.by_ref().take(span.len()).collect());
            out[b] = Some((Some(logits.narrow(0, span.start, span.len())?), top));
        }
        Ok(out)
    }
}

impl Drop for DeviceBatch {
    /// The pool and the steps' tensors are freed in the device's context, whichever thread
    /// drops the batch ([`crate::bind_thread`]).
    fn drop(&mut self) {
        let _ = bind_thread(&self.model.opts.device);
    }
}

/// The segments of a forward, by their blocks' `lengths`, grouped into steps: every block
/// of at most [`SHARED_BLOCK`] tokens together, longer ones by their block length, at most
/// [`MAX_BATCH`] a step.
fn groups(lengths: &[usize]) -> Vec<Vec<usize>> {
    let mut by_rows: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, &m) in lengths.iter().enumerate() {
        let class = if m <= SHARED_BLOCK { 0 } else { block_rows(m) };
        match by_rows.iter_mut().find(|(c, _)| *c == class) {
            Some((_, members)) => members.push(i),
            None => by_rows.push((class, vec![i])),
        }
    }
    by_rows
        .into_iter()
        .flat_map(|(_, members)| {
            members
                .chunks(MAX_BATCH)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Rows `ids` of `t`: a view where they are consecutive (a full step's), else a copy.
fn pick_rows(t: &Tensor, ids: &[u32]) -> Result<Tensor> {
    let first = ids.first().copied().unwrap_or(0);
    if (ids.iter())
        .enumerate()
        .all(|(i, &r)| r == first + i as u32)
    {
        return Ok(t.narrow(0, first as usize, ids.len())?);
    }
    Ok(t.index_select(&Tensor::new(ids, t.device())?, 0)?)
}

/// The rows a block of `m` tokens is padded to.
fn block_rows(m: usize) -> usize {
    bucket(&BLOCK_BUCKETS, m)
}

/// The rows a step of blocks of these lengths runs with every block padded to its group's
/// block length (not counting the sequences a batch bucket adds, which no draft length
/// changes): what the draft scheduler prices on a device (`StepCosts::padded`).
pub fn padded_rows(lengths: &[usize]) -> usize {
    groups(lengths)
        .iter()
        .map(|g| g.len() * block_rows(g.iter().map(|&i| lengths[i]).max().unwrap_or(1)))
        .sum()
}

/// The sequences a step of `n` is padded to.
fn batch_rows(n: usize) -> usize {
    bucket(&BATCH_BUCKETS, n)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn padded_rows_count_each_block_at_its_steps_length() {
        assert_eq!(padded_rows(&[1, 1, 1]), 3);
        // One verify block of 9 makes every short block 9 rows long.
        assert_eq!(padded_rows(&[1, 9, 1]), 27);
        assert_eq!(padded_rows(&[3, 5]), 16);
        // A prompt chunk steps apart at its own length.
        assert_eq!(padded_rows(&[1, 40]), 41);
    }

    proptest! {
        /// Every segment steps exactly once, at most `MAX_BATCH` to a step, every block fits
        /// its step's padded length, and a step mixes no short block with a long one nor
        /// long blocks of different lengths.
        #[test]
        fn every_segment_steps_once_in_a_step_that_fits_it(
            lengths in proptest::collection::vec(1usize..80, 0..150),
        ) {
            let steps = groups(&lengths);
            let mut seen: Vec<usize> = steps.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
            for step in &steps {
                prop_assert!(!step.is_empty() && step.len() <= MAX_BATCH);
                prop_assert!(batch_rows(step.len()) >= step.len());
                let longest = step.iter().map(|&i| lengths[i]).max().unwrap_or(1);
                let rows = block_rows(longest);
                prop_assert!(step.iter().all(|&i| lengths[i] <= rows));
                if longest > SHARED_BLOCK {
                    prop_assert!(step.iter().all(|&i| block_rows(lengths[i]) == rows));
                }
            }
        }
    }

    /// Blocks pad to the buckets, and past the largest keep their length.
    #[test]
    fn blocks_pad_to_their_bucket() {
        let padded: Vec<usize> = [1, 3, 5, 9, 10, 13, 17, 32, 33].map(block_rows).to_vec();
        assert_eq!(padded, vec![1, 4, 8, 9, 12, 16, 32, 32, 33]);
        assert_eq!([1, 3, 33, 64].map(batch_rows), [1, 4, 64, 64]);
    }
}
