//! The caller-owned KV cache of one sequence: append a block at the end, roll back by
//! truncating, account memory in bytes. Rows are stored per layer as f32
//! `[position, kv_heads * head_dim]`, so a rolled-back position is simply overwritten later.

use super::config::GemmaConfig;
use crate::error::Result;
use crate::ledger::{ledger_accessors, LayerKv, Ledger};

/// KV cache of one sequence (one session). Create it with [`crate::Gemma3::new_cache`].
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    ledger: Ledger,
    kv_dim: usize,
}

impl KvCache {
    /// An empty cache for `cfg` holding at most `max_len` positions.
    pub fn new(cfg: &GemmaConfig, max_len: usize) -> Self {
        Self {
            layers: vec![LayerKv::default(); cfg.num_hidden_layers],
            ledger: Ledger::new(max_len),
            kv_dim: cfg.kv_dim(),
        }
    }

    ledger_accessors!();

    /// Rolls back to the first `len` positions; `len` may not exceed the current length.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.ledger.truncate(len)?;
        self.discard_uncommitted();
        Ok(())
    }

    /// Empties the cache, keeping its allocation.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| {
            l.k.clear();
            l.v.clear();
        });
        self.ledger = Ledger::new(self.ledger.max_len());
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
        self.ledger.len() * self.bytes_per_position()
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
        self.ledger.check_append(pos, n)
    }

    pub(crate) fn layer_mut(&mut self, layer: usize) -> &mut LayerKv {
        &mut self.layers[layer]
    }

    /// Marks `n` more positions as committed after every layer appended its rows.
    pub(crate) fn commit(&mut self, n: usize) {
        self.ledger.commit(n);
    }

    /// Drops rows that some layers appended past the committed length (a failed forward).
    pub(crate) fn discard_uncommitted(&mut self) {
        let keep = self.ledger.len() * self.kv_dim;
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
