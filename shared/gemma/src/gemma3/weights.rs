//! The CPU model's weight matrices as a list, in the layout each computes with: what a
//! benchmark needs to time every product on its own (`tandem bench target`'s row costs per
//! weight type).

use tandem_kernels::QType;

use super::linear::Linear;
use super::model::Gemma3;
use crate::error::Result;

/// One weight matrix of a [`Gemma3`].
pub struct Weight<'a> {
    name: String,
    linear: &'a Linear,
}

impl Weight<'_> {
    /// Its role and layer (`blk.3.ffn_up`, `lm_head`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its storage type.
    pub fn qtype(&self) -> QType {
        self.linear.qtype()
    }

    /// The kernels it runs on: `lanes` (exact) or `ggml` (8-bit activations, or f32).
    pub fn layout(&self) -> &'static str {
        match self.linear.lanes() {
            Some(_) => "lanes",
            None => "ggml",
        }
    }

    /// Output rows.
    pub fn n(&self) -> usize {
        self.linear.n()
    }

    /// Inputs per output row.
    pub fn k(&self) -> usize {
        self.linear.k()
    }

    /// `x · Wᵀ` for `m` rows of `k` inputs, as the forward computes it.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        self.linear.matmul(x, m)
    }
}

impl Gemma3 {
    /// Every weight matrix a forward multiplies by: each layer's attention and MLP
    /// projections in order, then the LM head.
    pub fn weights(&self) -> Vec<Weight<'_>> {
        let mut out = Vec::with_capacity(self.layers.len() * 7 + 1);
        for (i, l) in self.layers.iter().enumerate() {
            let roles = [
                ("attn_q", &l.q),
                ("attn_k", &l.k),
                ("attn_v", &l.v),
                ("attn_output", &l.o),
                ("ffn_gate", &l.gate),
                ("ffn_up", &l.up),
                ("ffn_down", &l.down),
            ];
            out.extend(roles.into_iter().map(|(role, linear)| Weight {
                name: format!("blk.{i}.{role}"),
                linear,
            }));
        }
        out.push(Weight {
            name: "lm_head".into(),
            linear: self.head.head(),
        });
        out
    }
}
