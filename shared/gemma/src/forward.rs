//! One interface over the two Gemma 3 forwards — the CPU kernels ([`Gemma3`]) and a candle
//! device ([`DeviceGemma3`]) — for code that runs either with its own cache, such as the
//! drafter trainer's teacher.

use crate::config::GemmaConfig;
use crate::device::{DeviceCache, DeviceGemma3};
use crate::error::Result;
use crate::head::TargetHead;
use crate::kv_cache::KvCache;
use crate::model::{ForwardOptions, ForwardOutput, Gemma3};

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
    /// Runs `tokens` at positions `pos..pos + m` of `cache` (which holds exactly `pos`).
    fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut Self::Cache,
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

    fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        Gemma3::forward(self, tokens, pos, cache, opts)
    }
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

    fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        DeviceGemma3::forward(self, tokens, pos, cache, opts)
    }
}
