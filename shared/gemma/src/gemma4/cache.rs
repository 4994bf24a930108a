//! The caller-owned KV cache of one Gemma 4 sequence. Only layers that compute their own
//! keys and values have a slot (KV-shared layers read their donor's), each with its own
//! width; rows are f32 `[position, kv_heads * head_dim]`, full length on every layer
//! (sliding layers mask at read time), so rolling back is a truncation. The slots of the
//! last sliding and last full non-shared layers are the donors the assistant drafter reads.

use super::config::Gemma4Config;
use crate::error::{GemmaError, Result};
use crate::ledger::{ledger_accessors, LayerKv, Ledger};

/// Keys and values of one layer for positions `0..len`.
#[derive(Debug, Clone, Copy)]
pub struct DonorKv<'a> {
    /// `len × kv_heads*head_dim` keys (normed, rotated).
    pub k: &'a [f32],
    /// `len × kv_heads*head_dim` values (normed).
    pub v: &'a [f32],
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl DonorKv<'_> {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.k.len() / (self.kv_heads * self.head_dim).max(1)
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }
}

/// The target keys and values the assistant's layers attend to.
#[derive(Debug, Clone, Copy)]
pub struct Donors<'a> {
    /// Of the last non-shared sliding layer.
    pub sliding: DonorKv<'a>,
    /// Of the last non-shared full layer.
    pub full: DonorKv<'a>,
}

/// KV cache of one sequence. Create it with [`super::Gemma4::new_cache`].
#[derive(Debug, Clone)]
pub struct Gemma4Cache {
    slots: Vec<LayerKv>,
    dims: Vec<(usize, usize)>,
    donors: (Option<usize>, Option<usize>),
    ledger: Ledger,
}

impl Gemma4Cache {
    pub(crate) fn new(cfg: &Gemma4Config, max_len: usize) -> Self {
        let own = &cfg.layers[..cfg.first_shared_layer()];
        Self {
            slots: vec![LayerKv::default(); own.len()],
            dims: own.iter().map(|l| (l.kv_heads, l.head_dim)).collect(),
            donors: (cfg.donor_layer(true), cfg.donor_layer(false)),
            ledger: Ledger::new(max_len),
        }
    }

    ledger_accessors!();

    /// Rolls back to the first `len` positions; `len` may not exceed the current length.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.ledger.truncate(len)?;
        self.discard_uncommitted();
        Ok(())
    }

    /// Bytes of keys and values of the committed positions.
    pub fn used_bytes(&self) -> usize {
        let per: usize = self.dims.iter().map(|(h, d)| 2 * h * d).sum();
        self.ledger.len() * per * std::mem::size_of::<f32>()
    }

    /// The keys and values (committed positions only) of target layer `layer`, when that
    /// layer computes its own (it is below the first KV-shared layer).
    pub fn layer_kv(&self, layer: usize) -> Option<DonorKv<'_>> {
        let (kv_heads, head_dim) = *self.dims.get(layer)?;
        let n = self.ledger.len() * kv_heads * head_dim;
        Some(DonorKv {
            k: &self.slots[layer].k[..n],
            v: &self.slots[layer].v[..n],
            kv_heads,
            head_dim,
        })
    }

    /// The donor keys and values (committed positions only) the assistant drafter reads.
    pub fn donors(&self) -> Result<Donors<'_>> {
        let slot = |i: Option<usize>, kind: &str| -> Result<DonorKv<'_>> {
            i.and_then(|i| self.layer_kv(i)).ok_or_else(|| {
                GemmaError::Config(format!("the target has no non-shared {kind} layer"))
            })
        };
        Ok(Donors {
            sliding: slot(self.donors.0, "sliding")?,
            full: slot(self.donors.1, "full")?,
        })
    }

    pub(crate) fn check_append(&self, pos: usize, n: usize) -> Result<()> {
        self.ledger.check_append(pos, n)
    }

    pub(crate) fn slot_mut(&mut self, slot: usize) -> &mut LayerKv {
        &mut self.slots[slot]
    }

    pub(crate) fn slot(&self, slot: usize) -> &LayerKv {
        &self.slots[slot]
    }

    pub(crate) fn commit(&mut self, n: usize) {
        self.ledger.commit(n);
    }

    /// Drops rows appended past the committed length (a failed forward, a rollback).
    pub(crate) fn discard_uncommitted(&mut self) {
        let len = self.ledger.len();
        for (slot, (h, d)) in self.slots.iter_mut().zip(&self.dims) {
            slot.k.truncate(len * h * d);
            slot.v.truncate(len * h * d);
        }
    }
}
