//! The drafter's backbone in candle ops (all differentiable), shared by the training and
//! the inference forward. DFlash (arXiv 2602.06036) Eq. 2: `H_ctx = RMSNorm(W_c · [h_l1;
//! …; h_lm])`; Eq. 3: each layer draws `Q` from the block only and `K`/`V` from
//! `[W_k·norm(H_ctx); W_k·norm(H_d)]`, the block attending bidirectionally over context and
//! block; DSpark (arXiv 2607.05147) §3 adds the Markov and confidence heads on top.

use candle_core::{Tensor, D};

use crate::error::Result;
use crate::params::{LayerParams, Params};

/// Additive attention bias of a padded context key (exp underflows to exactly 0).
const PAD_BIAS: f64 = -1e9;

/// Plain RMSNorm over the last axis: `x / rms(x) · w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(w)?)
}

/// `x · w` for `x` of shape `[..., in]` and `w` of shape `[in, out]`.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (lead, inner) = dims.split_at(dims.len() - 1);
    let rows: usize = lead.iter().product();
    let y = x.reshape((rows, inner[0]))?.matmul(w)?;
    let mut shape = lead.to_vec();
    shape.push(w.dim(1)?);
    Ok(y.reshape(shape)?)
}

/// `cap · tanh(x / cap)` when the target soft-caps its logits.
pub(crate) fn softcap(x: Tensor, cap: Option<f32>) -> Result<Tensor> {
    match cap {
        Some(c) => Ok(((x / c as f64)?.tanh()? * c as f64)?),
        None => Ok(x),
    }
}

/// The context keys and values one layer attends to, `[A, L, d]` each (absent for an
/// empty context), and the additive key bias `[A, 1, 1, L + γ]` of a padded batch.
pub(crate) struct ContextKv<'a> {
    pub k: Option<&'a Tensor>,
    pub v: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
}

/// Static sizes of a backbone pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub heads: usize,
    pub eps: f64,
}

impl Params {
    /// Eq. 2: `[.., L, m·H]` taps → `H_ctx [.., L, d]`.
    pub fn context(&self, taps: &Tensor, eps: f64) -> Result<Tensor> {
        rms_norm(&linear(taps, &self.w_c)?, &self.ctx_norm, eps)
    }

    /// The block `[A, γ, d]`: the projected anchor embedding plus `block_pos[0]`, then
    /// `mask_emb[j] + block_pos[j]`.
    pub fn block(&self, anchor_emb: &Tensor) -> Result<Tensor> {
        let a = anchor_emb.dim(0)?;
        let gamma = self.block_pos.dim(0)?;
        let d = self.block_pos.dim(1)?;
        let anchor = linear(anchor_emb, &self.tok_proj)?
            .broadcast_add(&self.block_pos.narrow(0, 0, 1)?)?
            .reshape((a, 1, d))?;
        let masks = (self.mask_emb.as_tensor() + self.block_pos.narrow(0, 1, gamma - 1)?)?
            .unsqueeze(0)?
            .broadcast_as((a, gamma - 1, d))?;
        Ok(Tensor::cat(&[&anchor, &masks], 1)?)
    }

    /// The final block states `[.., γ, d]` after `out_norm`, and the hidden rows
    /// `[.., γ, H]` the target head scores.
    pub fn outputs(&self, block: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
        let out = rms_norm(block, &self.out_norm, eps)?;
        let hidden = linear(&out, &self.out_proj)?;
        Ok((out, hidden))
    }

    /// The confidence head `σ(w · [h; W1[prev]] + b)` over the last axis, squeezed.
    pub fn confidence(&self, out: &Tensor, e1: &Tensor) -> Result<Tensor> {
        let z = linear(&Tensor::cat(&[out, e1], D::Minus1)?, &self.conf_w)?
            .broadcast_add(&self.conf_b)?;
        Ok(candle_nn::ops::sigmoid(&z)?.squeeze(D::Minus1)?)
    }
}

impl LayerParams {
    /// This layer's keys and values of context states `H_ctx [.., L, d]`.
    pub fn context_kv(&self, h_ctx: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
        let n = rms_norm(h_ctx, &self.attn_norm, eps)?;
        Ok((linear(&n, &self.k)?, linear(&n, &self.v)?))
    }

    /// Eq. 3 plus the FFN: the block `[A, γ, d]` after this layer.
    pub fn forward(&self, h: &Tensor, ctx: &ContextKv, s: Shape) -> Result<Tensor> {
        let (a, gamma, d) = h.dims3()?;
        let hd = d / s.heads;
        let n = rms_norm(h, &self.attn_norm, s.eps)?;
        let (kd, vd) = (linear(&n, &self.k)?, linear(&n, &self.v)?);
        let join = |c: Option<&Tensor>, b: Tensor| match c {
            Some(c) => Tensor::cat(&[c, &b], 1),
            None => Ok(b),
        };
        let (k, v) = (join(ctx.k, kd)?, join(ctx.v, vd)?);
        let split = |x: &Tensor| -> Result<Tensor> {
            let t = x.dim(1)?;
            Ok(x.reshape((a, t, s.heads, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = split(&linear(&n, &self.q)?)?;
        let (k, v) = (split(&k)?, split(&v)?);
        let mut scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?;
        if let Some(bias) = ctx.bias {
            scores = scores.broadcast_add(bias)?;
        }
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let attn = probs.matmul(&v)?.transpose(1, 2)?.reshape((a, gamma, d))?;
        let h = (h + linear(&attn, &self.o)?)?;
        let n2 = rms_norm(&h, &self.ff_norm, s.eps)?;
        let act = (linear(&n2, &self.gate)?.gelu()? * linear(&n2, &self.up)?)?;
        Ok((h + linear(&act, &self.down)?)?)
    }
}

/// The key bias `[A, 1, 1, L + γ]` of a context mask `[A, L]` (1 real, 0 padding).
pub(crate) fn padding_bias(mask: &Tensor, gamma: usize) -> Result<Tensor> {
    let (a, l) = mask.dims2()?;
    let ctx = ((mask - 1.0)? * -PAD_BIAS)?.reshape((a, 1, 1, l))?;
    let block = Tensor::zeros((a, 1, 1, gamma), mask.dtype(), mask.device())?;
    Ok(Tensor::cat(&[&ctx, &block], 3)?)
}
