//! One interface over the two Gemma 3 forwards — the CPU kernels ([`Gemma3`]) and a candle
//! device ([`DeviceGemma3`]) — for code that runs either with its own cache, such as the
//! drafter trainer's teacher, which also advances several sequences together.

use candle_core::Tensor;
use rayon::prelude::*;

use super::config::GemmaConfig;
use super::device::DeviceGemma3;
use super::device_cache::DeviceCache;
use super::head::TargetHead;
use super::kv_cache::KvCache;
use super::model::{ForwardOptions, ForwardOutput, Gemma3, LogitsMode};
use crate::error::{GemmaError, Result};

/// The rollback-able KV cache of one sequence.
pub trait SequenceCache: Send {
    /// Committed positions.
    fn len(&self) -> usize;
    /// Whether no position is committed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The most positions the cache may hold.
    fn max_len(&self) -> usize;
    /// Rolls back to the first `len` positions.
    fn truncate(&mut self, len: usize) -> Result<()>;
}

impl SequenceCache for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn max_len(&self) -> usize {
        KvCache::max_len(self)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        KvCache::truncate(self, len)
    }
}

impl SequenceCache for DeviceCache {
    fn len(&self) -> usize {
        DeviceCache::len(self)
    }

    fn max_len(&self) -> usize {
        DeviceCache::max_len(self)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        DeviceCache::truncate(self, len)
    }
}

/// A Gemma 3 text model with a caller-owned KV cache.
pub trait Gemma3Model: Send + Sync {
    /// The KV cache of one sequence.
    type Cache: SequenceCache;

    /// The model's configuration.
    fn config(&self) -> &GemmaConfig;
    /// The input embedding and output head (CPU matrices).
    fn head(&self) -> TargetHead;
    /// A fresh cache for at most `max_len` positions.
    fn new_cache(&self, max_len: usize) -> Self::Cache;
    /// Bytes of keys and values one position of a cache holds.
    fn kv_bytes_per_position(&self) -> usize;
    /// Whether a block shape costs more the first time it runs (a step captured as a CUDA
    /// graph), so that a caller may run the shapes it expects before traffic.
    fn captures_steps(&self) -> bool {
        false
    }
    /// Runs `tokens` at positions `pos..pos + m` of `cache` (which holds exactly `pos`).
    fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut Self::Cache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput>;

    /// The caches of several sequences advanced together.
    type BatchCache: Send;
    /// Fresh caches for `batch` sequences of at most `max_len` positions each.
    fn new_batch_cache(&self, batch: usize, max_len: usize) -> Self::BatchCache;
    /// Runs one block of `m` tokens per sequence (`tokens` sequence-major) at positions
    /// `pos..pos + m` of every sequence; the outputs' rows are sequence-major (one logits
    /// row per sequence with [`crate::LogitsMode::Last`]).
    fn forward_batch(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut Self::BatchCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput>;
}

impl Gemma3Model for Gemma3 {
    type Cache = KvCache;

    fn config(&self) -> &GemmaConfig {
        Gemma3::config(self)
    }

    fn head(&self) -> TargetHead {
        Gemma3::head(self)
    }

    fn new_cache(&self, max_len: usize) -> KvCache {
        Gemma3::new_cache(self, max_len)
    }

    fn kv_bytes_per_position(&self) -> usize {
        KvCache::bytes_per_position_for(Gemma3::config(self))
    }

    fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        Gemma3::forward(self, tokens, pos, cache, opts)
    }

    type BatchCache = Vec<KvCache>;

    fn new_batch_cache(&self, batch: usize, max_len: usize) -> Vec<KvCache> {
        (0..batch.max(1))
            .map(|_| Gemma3::new_cache(self, max_len))
            .collect()
    }

    /// Each sequence runs its own forward, in parallel (the CPU kernels are batch
    /// invariant: this equals running them one by one); [`LogitsMode::Bounded`] and
    /// [`LogitsMode::BoundedAll`] give logits rows, as [`LogitsMode::Last`] and
    /// [`LogitsMode::All`] do.
    fn forward_batch(
        &self,
        tokens: &[u32],
        pos: usize,
        caches: &mut Vec<KvCache>,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        let m = block_len(tokens.len(), caches.len())?;
        let opts = &ForwardOptions {
            logits: match opts.logits {
                LogitsMode::Bounded => LogitsMode::Last,
                LogitsMode::BoundedAll => LogitsMode::All,
                mode => mode,
            },
            taps: opts.taps.clone(),
        };
        let outs = caches
            .par_iter_mut()
            .zip(tokens.par_chunks(m))
            .map(|(cache, block)| Gemma3::forward(self, block, pos, cache, opts))
            .collect::<Result<Vec<_>>>()?;
        concat_outputs(outs)
    }
}

/// The block length of `tokens` tokens split over `batch` sequences, all blocks equal.
pub(crate) fn block_len(tokens: usize, batch: usize) -> Result<usize> {
    if batch == 0 || !tokens.is_multiple_of(batch) {
        return Err(GemmaError::Request(format!(
            "{tokens} tokens do not split into {batch} equal blocks"
        )));
    }
    Ok(tokens / batch)
}

/// Stacks per-sequence outputs by rows, in sequence order.
fn concat_outputs(outs: Vec<ForwardOutput>) -> Result<ForwardOutput> {
    let cat = |parts: Vec<Tensor>| -> Result<Tensor> { Ok(Tensor::cat(&parts, 0)?) };
    let taps = (0..outs.first().map_or(0, |o| o.taps.len()))
        .map(|i| cat(outs.iter().map(|o| o.taps[i].clone()).collect()))
        .collect::<Result<Vec<_>>>()?;
    let logits = outs
        .iter()
        .map(|o| o.logits.clone())
        .collect::<Option<Vec<_>>>()
        .map(cat)
        .transpose()?;
    let top = outs
        .iter()
        .map(|o| o.top.clone())
        .collect::<Option<Vec<_>>>()
        .map(|rows| rows.concat());
    Ok(ForwardOutput {
        logits,
        top,
        bounded: Vec::new(),
        taps,
        last_hidden: cat(outs.into_iter().map(|o| o.last_hidden).collect())?,
    })
}

impl Gemma3Model for DeviceGemma3 {
    type Cache = DeviceCache;

    fn config(&self) -> &GemmaConfig {
        DeviceGemma3::config(self)
    }

    fn head(&self) -> TargetHead {
        DeviceGemma3::head(self)
    }

    fn new_cache(&self, max_len: usize) -> DeviceCache {
        DeviceGemma3::new_cache(self, max_len)
    }

    fn kv_bytes_per_position(&self) -> usize {
        DeviceGemma3::kv_bytes_per_position(self)
    }

    fn captures_steps(&self) -> bool {
        DeviceGemma3::captures_steps(self)
    }

    fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        DeviceGemma3::forward(self, tokens, pos, cache, opts)
    }

    type BatchCache = DeviceCache;

    fn new_batch_cache(&self, batch: usize, max_len: usize) -> DeviceCache {
        DeviceGemma3::new_batch_cache(self, batch, max_len)
    }

    fn forward_batch(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        DeviceGemma3::forward(self, tokens, pos, cache, opts)
    }
}
