//! The drafter's parameters frozen for inference: copied once out of their candle `Var`s
//! into row-major `[out, in]` f32 matrices of the batch-invariant kernels, and the plain
//! f32 forward of one block over them — the same maths as the candle backbone
//! (`backbone.rs`, DFlash arXiv 2602.06036 Eq. 2–3), without a tensor op per step.
//! Measured on a 2-core CPU while the target runs beside it (Gemma 3 270M, d_draft 256, two
//! layers, 32k draft vocabulary): a one-token round's drafting (propose and extend) cost
//! 8.3 ms through candle's small ops, most of it dispatch rather than arithmetic, and about
//! 4.8 ms here.

use candle_core::Var;
use rayon::prelude::*;
use tandem_kernels::{dot, gelu_tanh_mul, rms_norm, QMatrix, QType};

use crate::error::Result;
use crate::params::{LayerParams, Params};

/// A frozen `x · W` layer: `W [in, out]` stored transposed for [`QMatrix::matmul`].
pub(crate) struct Linear(QMatrix);

impl Linear {
    /// Freezes a `[in, out]` parameter.
    fn of(w: &Var) -> Result<Self> {
        let t = w.as_tensor().t()?.contiguous()?;
        let (n, k) = t.dims2()?;
        let bytes = t
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        Ok(Self(QMatrix::new(QType::F32, n, k, bytes)?))
    }

    /// Output width.
    pub(crate) fn out(&self) -> usize {
        self.0.n()
    }

    /// `x [m, in] · W` as `[m, out]`.
    pub(crate) fn apply(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; m * self.0.n()];
        self.0.matmul(x, m, &mut y)?;
        Ok(y)
    }
}

fn flat(v: &Var) -> Result<Vec<f32>> {
    Ok(v.as_tensor().flatten_all()?.to_vec1::<f32>()?)
}

/// One frozen backbone layer.
pub(crate) struct FrozenLayer {
    attn_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ff_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// Every parameter the inference forward reads.
pub(crate) struct Frozen {
    pub(crate) layers: Vec<FrozenLayer>,
    pub(crate) w_c: Linear,
    pub(crate) ctx_norm: Vec<f32>,
    pub(crate) out_norm: Vec<f32>,
    pub(crate) out_proj: Linear,
    /// `W2ᵀ`: one row of `r` per draft token.
    pub(crate) markov_w2: Linear,
    pub(crate) heads: BlockHeads,
}

/// What both inference forwards (this one and the device's) compute on the host: a block's
/// input rows, the Markov head's `W1` rows and the confidence head.
pub(crate) struct BlockHeads {
    tok_proj: Linear,
    /// `[γ, d]`: `block_pos[0]`, then `mask_emb[j − 1] + block_pos[j]`.
    block_init: Vec<f32>,
    /// `[vd + 1, r]` row-major.
    markov_w1: Vec<f32>,
    rank: usize,
    /// `[d + r]`.
    conf_w: Vec<f32>,
    conf_b: f32,
}

impl FrozenLayer {
    fn of(p: &LayerParams) -> Result<Self> {
        Ok(Self {
            attn_norm: flat(&p.attn_norm)?,
            q: Linear::of(&p.q)?,
            k: Linear::of(&p.k)?,
            v: Linear::of(&p.v)?,
            o: Linear::of(&p.o)?,
            ff_norm: flat(&p.ff_norm)?,
            gate: Linear::of(&p.gate)?,
            up: Linear::of(&p.up)?,
            down: Linear::of(&p.down)?,
        })
    }

    /// This layer's keys and values `[n, d]` of `n` context rows `h_ctx`.
    pub(crate) fn context_kv(&self, h_ctx: &[f32], n: usize, eps: f32) -> Result<KeyValues> {
        let x = rms_norm(h_ctx, &self.attn_norm, eps);
        Ok(KeyValues {
            k: self.k.apply(&x, n)?,
            v: self.v.apply(&x, n)?,
        })
    }

    /// The blocks `h [n · γ, d]` of `n = ctxs.len()` sessions after this layer, each
    /// block's rows attending over its own session's context, then its own block (the
    /// sessions' attention in parallel).
    pub(crate) fn forward(
        &self,
        h: &[f32],
        ctxs: &[&KeyValues],
        heads: usize,
        eps: f32,
    ) -> Result<Vec<f32>> {
        let d = self.attn_norm.len();
        let rows = h.len() / d;
        let n = rms_norm(h, &self.attn_norm, eps);
        let q = self.q.apply(&n, rows)?;
        let k = self.k.apply(&n, rows)?;
        let v = self.v.apply(&n, rows)?;
        let per = q.len() / ctxs.len().max(1);
        let attn: Vec<f32> = ctxs
            .par_iter()
            .enumerate()
            .flat_map_iter(|(i, ctx)| {
                let own = i * per..(i + 1) * per;
                let block = KeyValues {
                    k: k[own.clone()].to_vec(),
                    v: v[own.clone()].to_vec(),
                };
                attend(&q[own], [ctx, &block], d, heads)
            })
            .collect();
        let mut h = add(h, &self.o.apply(&attn, rows)?);
        let n2 = rms_norm(&h, &self.ff_norm, eps);
        let mut act = self.gate.apply(&n2, rows)?;
        let up = self.up.apply(&n2, rows)?;
        gelu_tanh_mul(&mut act, &up);
        let down = self.down.apply(&act, rows)?;
        h.iter_mut().zip(&down).for_each(|(x, y)| *x += y);
        Ok(h)
    }
}

impl Frozen {
    /// Copies `p` out of its `Var`s.
    pub(crate) fn of(p: &Params) -> Result<Self> {
        Ok(Self {
            layers: p
                .layers
                .iter()
                .map(FrozenLayer::of)
                .collect::<Result<_>>()?,
            w_c: Linear::of(&p.w_c)?,
            ctx_norm: flat(&p.ctx_norm)?,
            out_norm: flat(&p.out_norm)?,
            out_proj: Linear::of(&p.out_proj)?,
            markov_w2: Linear::of(&p.markov_w2)?,
            heads: BlockHeads::of(p)?,
        })
    }
}

impl BlockHeads {
    /// Copies the pieces of `p` it needs out of their `Var`s.
    pub(crate) fn of(p: &Params) -> Result<Self> {
        let pos = flat(&p.block_pos)?;
        let mask = flat(&p.mask_emb)?;
        let d = pos.len() / p.block_pos.as_tensor().dim(0)?;
        let mut block_init = pos.clone();
        block_init[d..]
            .iter_mut()
            .zip(&mask)
            .for_each(|(b, m)| *b += m);
        Ok(Self {
            tok_proj: Linear::of(&p.tok_proj)?,
            block_init,
            markov_w1: flat(&p.markov_w1)?,
            rank: p.markov_w1.as_tensor().dim(1)?,
            conf_w: flat(&p.conf_w)?,
            // `[1]`: the loader checks every shape.
            conf_b: flat(&p.conf_b)?[0],
        })
    }

    /// The drafter's width `d`.
    pub(crate) fn width(&self) -> usize {
        self.tok_proj.out()
    }

    /// The block's input rows `[γ, d]` for an anchor whose target embedding is `emb`.
    pub(crate) fn block(&self, emb: &[f32]) -> Result<Vec<f32>> {
        let mut block = self.block_init.clone();
        block
            .iter_mut()
            .zip(self.tok_proj.apply(emb, 1)?)
            .for_each(|(b, e)| *b += e);
        Ok(block)
    }

    /// The Markov head's `W1` row of Markov row `row`.
    pub(crate) fn markov_e1(&self, row: usize) -> &[f32] {
        &self.markov_w1[row * self.rank..(row + 1) * self.rank]
    }

    /// The confidence of a block position with final state `out` and Markov row `row`.
    pub(crate) fn confidence(&self, out: &[f32], row: usize) -> f32 {
        let d = out.len();
        let z = dot(out, &self.conf_w[..d]) + dot(self.markov_e1(row), &self.conf_w[d..]);
        sigmoid(z + self.conf_b)
    }
}

/// Keys and values `[n, d]`, row-major.
#[derive(Default)]
pub(crate) struct KeyValues {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
}

/// Multi-head attention of the rows of `q [γ, d]` over the keys of `parts` in order,
/// softmax over all of them, scaled by `hd^-½`; compiled for AVX2 where present.
fn attend(q: &[f32], parts: [&KeyValues; 2], d: usize, heads: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return unsafe { attend_avx2(q, parts, d, heads) };
    }
    attend_body(q, parts, d, heads)
}

/// [`attend_body`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_avx2(q: &[f32], parts: [&KeyValues; 2], d: usize, heads: usize) -> Vec<f32> {
    attend_body(q, parts, d, heads)
}

/// [`attend`], head-major, so each key and value row is read once for all the block's
/// queries.
#[inline(always)]
fn attend_body(q: &[f32], parts: [&KeyValues; 2], d: usize, heads: usize) -> Vec<f32> {
    let hd = d / heads;
    let scale = (hd as f32).powf(-0.5);
    let keys: usize = parts.iter().map(|p| p.k.len() / d).sum();
    let rows = q.len() / d;
    let mut out = vec![0f32; q.len()];
    let mut scores = vec![0f32; rows * keys];
    for h in 0..heads {
        let cols = h * hd..(h + 1) * hd;
        let key_rows = parts.iter().flat_map(|p| p.k.chunks_exact(d));
        for (j, k) in key_rows.enumerate() {
            let kh = &k[cols.clone()];
            for (i, qi) in q.chunks_exact(d).enumerate() {
                scores[i * keys + j] = dot(&qi[cols.clone()], kh) * scale;
            }
        }
        scores.chunks_exact_mut(keys).for_each(softmax);
        let value_rows = parts.iter().flat_map(|p| p.v.chunks_exact(d));
        for (j, v) in value_rows.enumerate() {
            let vh = &v[cols.clone()];
            for (i, row) in out.chunks_exact_mut(d).enumerate() {
                let p = scores[i * keys + j];
                row[cols.clone()]
                    .iter_mut()
                    .zip(vh)
                    .for_each(|(o, x)| *o += p * x);
            }
        }
    }
    out
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    x.iter_mut().for_each(|v| {
        *v = (*v - max).exp();
        sum += *v;
    });
    x.iter_mut().for_each(|v| *v /= sum);
}

/// The logistic function.
pub(crate) fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = vec![1.0, 3.0, -2.0, 3.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] == x[3] && x[1] > x[0] && x[0] > x[2]);
    }
}
