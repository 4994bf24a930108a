//! The caller-owned KV cache of one sequence: append a block at the end, roll back by
//! truncating, account memory in bytes. Rows are stored per layer as f32
//! `[position, kv_heads * head_dim]`, so a rolled-back position is simply overwritten later.

use super::config::GemmaConfig;
use crate::error::{GemmaError, Result};

/// Keys and values of one layer.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerKv {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
}

/// KV cache of one sequence (one session). Create it with [`crate::Gemma3::new_cache`].
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    max_len: usize,
    kv_dim: usize,
}

impl KvCache {
    /// An empty cache for `cfg` holding at most `max_len` positions.
    pub fn new(cfg: &GemmaConfig, max_len: usize) -> Self {
        Self {
            layers: vec![LayerKv::default(); cfg.num_hidden_layers],
            len: 0,
            max_len,
            kv_dim: cfg.kv_dim(),
        }
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions this cache may hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Rolls back to the first `len` positions; `len` may not exceed the current length.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        check_rollback(self.len, len)?;
        for layer in &mut self.layers {
            layer.k.truncate(len * self.kv_dim);
            layer.v.truncate(len * self.kv_dim);
        }
        self.len = len;
        Ok(())
    }

    /// Empties the cache, keeping its allocation.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| {
            l.k.clear();
            l.v.clear();
        });
        self.len = 0;
    }

    /// Bytes allocated for keys and values (what the cache costs, not only what it uses).
    pub fn allocated_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.capacity() + l.v.capacity()) * std::mem::size_of::<f32>())
            .sum()
    }

    /// Bytes of keys and values of the committed positions.
    pub fn used_bytes(&self) -> usize {
        self.len * self.bytes_per_position()
    }

    /// Bytes one position costs across all layers.
    pub fn bytes_per_position(&self) -> usize {
        position_bytes(self.layers.len(), self.kv_dim)
    }

    /// Bytes one position costs in a cache for `cfg`, without making one.
    pub fn bytes_per_position_for(cfg: &GemmaConfig) -> usize {
        position_bytes(cfg.num_hidden_layers, cfg.kv_dim())
    }

    pub(crate) fn check_append(&self, pos: usize, n: usize) -> Result<()> {
        if pos != self.len {
            return Err(GemmaError::Request(format!(
                "block starts at position {pos} but the cache holds {} positions",
                self.len
            )));
        }
        if pos + n > self.max_len {
            return Err(GemmaError::ContextFull {
                needed: pos + n,
                capacity: self.max_len,
            });
        }
        Ok(())
    }

    pub(crate) fn layer_mut(&mut self, layer: usize) -> &mut LayerKv {
        &mut self.layers[layer]
    }

    /// Marks `n` more positions as committed after every layer appended its rows.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Drops rows that some layers appended past the committed length (a failed forward).
    pub(crate) fn discard_uncommitted(&mut self) {
        let keep = self.len * self.kv_dim;
        for layer in &mut self.layers {
            layer.k.truncate(keep);
            layer.v.truncate(keep);
        }
    }
}

/// Keys and values of every layer, f32.
fn position_bytes(layers: usize, kv_dim: usize) -> usize {
    2 * layers * kv_dim * std::mem::size_of::<f32>()
}

/// Fails unless a cache of `len` committed positions can roll back to `to` (the check
/// every cache's `truncate` makes).
pub(crate) fn check_rollback(len: usize, to: usize) -> Result<()> {
    if to > len {
        return Err(GemmaError::Request(format!(
            "cannot truncate a cache of {len} positions to {to}"
        )));
    }
    Ok(())
}
