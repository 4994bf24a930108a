//! A session's projected context on the device ([`DeviceContext`]) and the fixed-shape
//! steps of the [`crate::DeviceDrafter`] that run over it, replayed as CUDA graphs on a
//! CUDA GPU ([`tandem_gemma::Replayed`]).
//!
//! A block of the DSpark drafter is about ninety launches of microsecond kernels (two
//! backbone layers, the restricted head, the greedy Markov chain), and appending the
//! committed positions' rows to the context a dozen more; on a GPU the host's work per
//! launch sets their pace. A graph replays them in one call, with the shapes and the
//! addresses it was captured with, so:
//!
//! * each layer's keys and values live in storage at fixed addresses, `[spans +
//!   MAX_EXTEND_ROWS, d]`, where `spans` (a power of two, at least [`MIN_SPAN`]) bounds the
//!   positions it serves; a context that outgrows it moves to storage twice as large (its
//!   steps, bound to the old addresses, are dropped), and a dropped context's storage,
//!   with its steps, goes to the next session — up to [`MAX_SPARE`] of them, none serving
//!   more than [`MAX_SPARE_SPANS`] positions, so a burst of sessions or one long context
//!   does not keep its device memory for good;
//! * appended rows are padded to one of [`EXTEND_ROWS`] rows and scattered to their
//!   positions held on the device; the padding lands past the context's length, where the
//!   mask hides it until later rows overwrite it;
//! * a block attends to a fixed span of the storage (the smallest power of two, at least
//!   [`MIN_SPAN`], holding the context) under a mask computed on the device from the
//!   context's length.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use tandem_gemma::{bind_thread, Replayed, Spares};

use crate::device::SampledStep;
use crate::error::Result;

/// The shortest span of the context a block attends to.
pub(crate) const MIN_SPAN: usize = 256;
/// Rows an extend step takes: appended rows are padded to the first that holds them
/// (after a block of the default γ = 8, 1 to 9 rows come); longer runs go in chunks of
/// the last.
pub(crate) const EXTEND_ROWS: [usize; 4] = [1, 4, 9, 16];
/// The most rows one extend step appends, and the rows past `spans` that storage keeps
/// for its padding.
pub(crate) const MAX_EXTEND_ROWS: usize = EXTEND_ROWS[EXTEND_ROWS.len() - 1];

/// Dropped contexts' storage kept for the next sessions, at most.
pub(crate) const MAX_SPARE: usize = 64;
/// The most positions a kept storage serves (larger storage is freed with its context).
pub(crate) const MAX_SPARE_SPANS: usize = 4096;

/// Where contexts' storage comes from: the shape of new storage, and dropped contexts'
/// storage for the next session.
pub(crate) struct StoragePool {
    layers: usize,
    d: usize,
    device: Device,
    spare: Spares<Storage>,
}

impl StoragePool {
    /// A pool of storage for `layers` layers of `d` wide keys and values on `device`.
    pub(crate) fn new(layers: usize, d: usize, device: &Device) -> Arc<Self> {
        Arc::new(Self {
            layers,
            d,
            device: device.clone(),
            spare: Spares::new(MAX_SPARE),
        })
    }

    fn take(&self) -> Result<Storage> {
        match self.spare.take() {
            Some(s) => Ok(s),
            None => Storage::new(self.layers, MIN_SPAN, self.d, &self.device),
        }
    }
}

/// One session's projected context on the device: each layer's keys and values (storage
/// taken at the first rows).
pub struct DeviceContext {
    storage: Option<Storage>,
    len: usize,
    pool: Arc<StoragePool>,
}

impl DeviceContext {
    /// Number of context positions received.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position was received yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A context of no positions, its storage to come from `pool`.
    pub(crate) fn new(pool: &Arc<StoragePool>) -> Self {
        Self {
            storage: None,
            len: 0,
            pool: Arc::clone(pool),
        }
    }

    /// The storage, taken or grown where needed to serve `len` positions.
    pub(crate) fn storage_for(&mut self, len: usize) -> Result<&mut Storage> {
        let storage = match &mut self.storage {
            Some(s) => s,
            none => none.insert(self.pool.take()?),
        };
        if len > storage.spans {
            storage.grow(len.next_power_of_two(), self.len)?;
        }
        Ok(storage)
    }

    /// Whether the context's storage comes from `pool` (its drafter's).
    pub(crate) fn is_from(&self, pool: &Arc<StoragePool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }

    /// Records `n` more positions.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        if let Some(storage) = self.storage.take().filter(|s| s.spans <= MAX_SPARE_SPANS) {
            self.pool.spare.give(storage);
        }
    }
}

/// Keys and values at fixed addresses, with the steps bound to them.
pub(crate) struct Storage {
    /// Each layer's `[spans + MAX_EXTEND_ROWS, d]` keys and values.
    pub(crate) k: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    /// Positions served (a power of two).
    spans: usize,
    /// Extend steps by rows.
    pub(crate) extends: HashMap<usize, ExtendStep>,
    /// Block steps by span.
    pub(crate) blocks: HashMap<usize, BlockStep>,
}

impl Drop for Storage {
    /// The tensors are freed in the device's context, whichever thread drops the storage
    /// (a session ended on a thread that never drafted).
    fn drop(&mut self) {
        if let Some(k) = self.k.first() {
            let _ = bind_thread(k.device());
        }
    }
}

impl Storage {
    fn new(layers: usize, spans: usize, d: usize, device: &Device) -> Result<Self> {
        let zeros = || -> Result<Vec<Tensor>> {
            (0..layers)
                .map(|_| {
                    Ok(Tensor::zeros(
                        (spans + MAX_EXTEND_ROWS, d),
                        DType::F32,
                        device,
                    )?)
                })
                .collect()
        };
        Ok(Self {
            k: zeros()?,
            v: zeros()?,
            spans,
            extends: HashMap::new(),
            blocks: HashMap::new(),
        })
    }

    /// Moves the first `len` positions to storage serving `spans` positions.
    fn grow(&mut self, spans: usize, len: usize) -> Result<()> {
        let (d, device) = (self.k[0].dim(1)?, self.k[0].device().clone());
        let grown = Self::new(self.k.len(), spans, d, &device)?;
        let old = self.k.iter().chain(&self.v);
        for (new, old) in grown.k.iter().chain(&grown.v).zip(old) {
            if len > 0 {
                new.slice_set(&old.narrow(0, 0, len)?, 0, 0)?;
            }
        }
        *self = grown;
        Ok(())
    }
}

/// The span a block over a context of `len` positions attends to.
pub(crate) fn span_of(len: usize) -> usize {
    len.next_power_of_two().max(MIN_SPAN)
}

/// The rows of the extend step that appends `n` rows (at most [`MAX_EXTEND_ROWS`]).
pub(crate) fn extend_rows(n: usize) -> usize {
    EXTEND_ROWS
        .into_iter()
        .find(|&r| r >= n)
        .unwrap_or(MAX_EXTEND_ROWS)
}

/// An extend step: projects `rows` snapshot rows into every layer's keys and values at
/// their positions.
pub(crate) struct ExtendStep {
    /// `[rows, row_width]` snapshot rows (zero rows pad).
    pub(crate) taps: Tensor,
    /// `[rows]` u32 positions.
    pub(crate) pos: Tensor,
    pub(crate) replay: Replayed,
}

impl ExtendStep {
    pub(crate) fn new(rows: usize, row_width: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            taps: Tensor::zeros((rows, row_width), DType::F32, device)?,
            pos: Tensor::zeros(rows, DType::U32, device)?,
            replay: Replayed::default(),
        })
    }
}

/// A block step over a span of the context, and the sampled pass over its base logits
/// (made at the first sampled block).
pub(crate) struct BlockStep {
    pub(crate) io: BlockIo,
    pub(crate) replay: Replayed,
    pub(crate) sampled: Option<SampledStep>,
}

/// A block step's inputs and outputs.
pub(crate) struct BlockIo {
    /// `[γ, d]` block input rows.
    pub(crate) block: Tensor,
    /// `[3]` u32: the context's length, the anchor's Markov row and the block rows seen.
    pub(crate) meta: Tensor,
    /// `[1, span + γ]` f32 key positions: `0..span` for the context (visible below its
    /// length), then −1, −2, … for the block's own keys (row `j` visible where the block
    /// has more than `j` rows).
    pub(crate) keys: Tensor,
    /// `[γ, d]` final states.
    pub(crate) out: Tensor,
    /// `[γ, Vd]` base logits (before the Markov term).
    pub(crate) base: Tensor,
    /// `[γ]` u32 greedy picks (draft indices).
    pub(crate) picks: Tensor,
}

impl BlockStep {
    /// A step of `gamma` positions `d` wide over `span` context positions, scoring a draft
    /// vocabulary of `vd`.
    pub(crate) fn new(
        span: usize,
        (gamma, d, vd): (usize, usize, usize),
        device: &Device,
    ) -> Result<Self> {
        let keys: Vec<f32> = (0..span)
            .map(|j| j as f32)
            .chain((1..=gamma).map(|j| -(j as f32)))
            .collect();
        let io = BlockIo {
            block: Tensor::zeros((gamma, d), DType::F32, device)?,
            meta: Tensor::zeros(3, DType::U32, device)?,
            keys: Tensor::from_vec(keys, (1, span + gamma), device)?,
            out: Tensor::zeros((gamma, d), DType::F32, device)?,
            base: Tensor::zeros((gamma, vd), DType::F32, device)?,
            picks: Tensor::zeros(gamma, DType::U32, device)?,
        };
        Ok(Self {
            io,
            replay: Replayed::default(),
            sampled: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spans of the pool's spares (taken out to look and given back).
    fn spares(pool: &StoragePool) -> Vec<usize> {
        let kept: Vec<Storage> = std::iter::from_fn(|| pool.spare.take()).collect();
        let spans = kept.iter().map(|s| s.spans).collect();
        kept.into_iter().for_each(|s| pool.spare.give(s));
        spans
    }

    /// A dropped context's storage goes back to the pool for the next session, but the
    /// pool keeps at most `MAX_SPARE` of them and none grown past `MAX_SPARE_SPANS`.
    #[test]
    fn the_pool_keeps_a_bounded_number_of_small_spares() -> Result<()> {
        let pool = StoragePool::new(1, 4, &Device::Cpu);
        let mut contexts: Vec<DeviceContext> = (0..MAX_SPARE + 3)
            .map(|_| DeviceContext::new(&pool))
            .collect();
        for c in &mut contexts {
            c.storage_for(1)?;
        }
        let mut long = DeviceContext::new(&pool);
        long.storage_for(MAX_SPARE_SPANS + 1)?;
        drop(long);
        assert!(
            spares(&pool).is_empty(),
            "storage past the span limit is freed"
        );
        drop(contexts);
        assert_eq!(spares(&pool), vec![MIN_SPAN; MAX_SPARE]);
        let mut next = DeviceContext::new(&pool);
        next.storage_for(1)?;
        assert_eq!(
            spares(&pool).len(),
            MAX_SPARE - 1,
            "a new session reuses a spare"
        );
        Ok(())
    }
}
