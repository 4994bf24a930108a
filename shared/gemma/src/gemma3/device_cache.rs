//! [`DeviceCache`]: the KV cache of [`crate::DeviceGemma3`], passed in by the caller,
//! grown by doubling (or, for fixed-shape steps, allocated whole at fixed addresses) and
//! rolled back by length.

use candle_core::{DType, Device, Tensor};

use super::device_step::CacheSteps;
use crate::error::Result;
use crate::ledger::{ledger_accessors, Ledger};

/// The KV cache of one sequence, or of a batch of sequences advanced together, on a device:
/// per layer `[batch, capacity, kv_heads, head_dim]` keys and values (position-major, as the
/// forward produces them), of which the first [`DeviceCache::len`] positions are committed.
pub struct DeviceCache {
    /// Per layer (empty until the first forward).
    pub(crate) k: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    pub(crate) ledger: Ledger,
    capacity: usize,
    pub(crate) batch: usize,
    /// `(layers, kv_heads, head_dim)`.
    dims: (usize, usize, usize),
    dtype: DType,
    device: Device,
    /// The fixed-shape steps of a cache allocated whole (`None`: a growing cache).
    pub(crate) steps: Option<CacheSteps>,
}

/// Positions a cache first allocates room for; it doubles from there.
const FIRST_CAPACITY: usize = 256;

impl DeviceCache {
    /// An empty cache of `batch` sequences of at most `max_len` positions; `dims` are
    /// `(layers, kv_heads, head_dim)`.
    pub(crate) fn new(
        batch: usize,
        max_len: usize,
        dims: (usize, usize, usize),
        (dtype, device): (DType, Device),
    ) -> Self {
        Self {
            k: Vec::new(),
            v: Vec::new(),
            ledger: Ledger::new(max_len),
            capacity: 0,
            batch: batch.max(1),
            dims,
            dtype,
            device,
            steps: None,
        }
    }

    /// A cache of one sequence of at most `max_len` positions in `(k, v, capacity)`,
    /// storage allocated whole for `capacity` positions, with its fixed-shape steps.
    pub(crate) fn fixed(
        (k, v, capacity): (Vec<Tensor>, Vec<Tensor>, usize),
        steps: CacheSteps,
        max_len: usize,
        dims: (usize, usize, usize),
        at: (DType, Device),
    ) -> Self {
        let mut cache = Self::new(1, max_len, dims, at);
        (cache.k, cache.v, cache.capacity) = (k, v, capacity);
        cache.steps = Some(steps);
        cache
    }

    /// How many fixed-shape steps (distinct block shapes) its storage has run, across the
    /// sequences that used it; `None` for a growing cache, which runs none.
    pub fn fixed_steps(&self) -> Option<usize> {
        self.steps.as_ref().map(CacheSteps::len)
    }

    /// Positions its storage has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    ledger_accessors!();

    /// Sequences it holds.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Rolls back to the first `len` positions.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.ledger.truncate(len)
    }

    /// Makes room for `needed` positions, keeping the committed ones.
    pub(crate) fn reserve(&mut self, needed: usize) -> Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed
            .max(2 * self.capacity)
            .max(FIRST_CAPACITY)
            .min(self.ledger.max_len());
        let (layers, heads, hd) = self.dims;
        let shape = (self.batch, capacity, heads, hd);
        let zeros = || Tensor::zeros(shape, self.dtype, &self.device);
        if self.k.is_empty() {
            self.k = (0..layers)
                .map(|_| zeros())
                .collect::<candle_core::Result<_>>()?;
            self.v = (0..layers)
                .map(|_| zeros())
                .collect::<candle_core::Result<_>>()?;
        } else {
            for t in self.k.iter_mut().chain(self.v.iter_mut()) {
                let grown = zeros()?;
                let len = self.ledger.len();
                if len > 0 {
                    grown.slice_set(&t.narrow(1, 0, len)?, 1, 0)?;
                }
                *t = grown;
            }
        }
        self.capacity = capacity;
        Ok(())
    }
}

impl Drop for DeviceCache {
    /// A cache allocated whole gives its storage back to its model for the next sequence.
    fn drop(&mut self) {
        if let Some(steps) = self.steps.take() {
            steps.give_back(std::mem::take(&mut self.k), std::mem::take(&mut self.v));
        }
    }
}
