//! The drafter's parameters frozen for inference: copied once out of their candle `Var`s
//! into row-major `[out, in]` matrices of the batch-invariant kernels (in f16 where every
//! weight is an f16 value, else f32; the Markov head's `W2` as a [`ColumnMatrix`]), and the
//! plain f32 forward of one block over them — the same maths as the candle backbone
//! (`backbone.rs`, DFlash arXiv 2602.06036 Eq. 2–3), without a tensor op per step.
//! Measured on a 2-core CPU while the target runs beside it (Gemma 3 270M, d_draft 256, two
//! layers, 32k draft vocabulary): a one-token round's drafting (propose and extend) cost
//! 8.3 ms through candle's small ops, most of it dispatch rather than arithmetic, and about
//! 4.8 ms here.

use candle_core::Var;
use half::f16;
use rayon::prelude::*;
use tandem_kernels::{
    dot, gelu_tanh_mul, rms_norm, BlockAttention, ColumnMatrix, KeyPanels, KeysValues, QMatrix,
    QType,
};

use crate::error::{DsparkError, Result};
use crate::params::{LayerParams, Params};

/// A frozen `x · W` layer: `W [in, out]` stored transposed for [`QMatrix::matmul`], in
/// f16 where every weight is an f16 value (a drafter saved in f16 is: half the bytes each
/// product streams, the same products), in f32 otherwise.
pub(crate) struct Linear(QMatrix);

impl Linear {
    /// Freezes a `[in, out]` parameter.
    fn of(w: &Var) -> Result<Self> {
        Self::stacked(&[w])
    }

    /// Freezes `[in, out_i]` parameters of one input width side by side: one product
    /// gives each one's outputs in turn (`[m, Σ out_i]`), each output bit for bit what
    /// its own matrix gives (an output depends only on its weight row and the input).
    fn stacked(ws: &[&Var]) -> Result<Self> {
        let (mut values, mut n, mut width) = (Vec::new(), 0, None);
        for w in ws {
            let t = w.as_tensor().t()?.contiguous()?;
            let (out, k) = t.dims2()?;
            if *width.get_or_insert(k) != k {
                return Err(DsparkError::Invalid(format!(
                    "stacked parameters of input widths {width:?} and {k}"
                )));
            }
            values.extend(t.flatten_all()?.to_vec1::<f32>()?);
            n += out;
        }
        let (qtype, bytes) = match all_half(&values) {
            true => (
                QType::F16,
                values
                    .iter()
                    .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
            false => (
                QType::F32,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        };
        Ok(Self(QMatrix::new(qtype, n, width.unwrap_or(0), bytes)?))
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

    /// [`Linear::apply`] of a layer stacked of `N` parts of equal widths, its outputs split
    /// back into one `[m, out_i]` matrix per part.
    fn apply_parts<const N: usize>(&self, x: &[f32], m: usize) -> Result<[Vec<f32>; N]> {
        let y = self.apply(x, m)?;
        let w = self.out() / N;
        Ok(std::array::from_fn(|i| {
            y.chunks_exact(self.out())
                .flat_map(|row| &row[i * w..(i + 1) * w])
                .copied()
                .collect()
        }))
    }
}

/// Whether every value is an f16 value (so f16 storage keeps it exactly).
fn all_half(values: &[f32]) -> bool {
    values
        .iter()
        .all(|v| f16::from_f32(*v).to_f32().to_bits() == v.to_bits())
}

/// The Markov head's `W2` frozen for its per-position products (32,768 outputs of 64
/// inputs): a [`ColumnMatrix`], whose outputs take no horizontal sums; in f16 where every
/// weight is an f16 value.
pub(crate) struct MarkovProduct(ColumnMatrix);

impl MarkovProduct {
    /// Freezes `W2 [r, vd]`.
    fn of(w: &Var) -> Result<Self> {
        let t = w.as_tensor().t()?.contiguous()?;
        let (n, k) = t.dims2()?;
        let values = t.flatten_all()?.to_vec1::<f32>()?;
        let half = all_half(&values);
        Ok(Self(ColumnMatrix::new(&values, n, k, half)?))
    }

    /// `x [m, r] · W2` as `[m, vd]`.
    pub(crate) fn apply(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; m * self.0.n()];
        self.0.matmul(x, m, &mut y)?;
        Ok(y)
    }
}

fn flat(v: &Var) -> Result<Vec<f32>> {
    Ok(v.as_tensor().flatten_all()?.to_vec1::<f32>()?)
}

/// One frozen backbone layer. The block's query, key and value projections run as one
/// product (`qkv`), the context's keys and values as another (`kv`), the feed-forward's
/// gate and up as a third: one hand-off to the threads where three or two would be.
pub(crate) struct FrozenLayer {
    attn_norm: Vec<f32>,
    qkv: Linear,
    kv: Linear,
    o: Linear,
    ff_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
}

/// Every parameter the inference forward reads.
pub(crate) struct Frozen {
    pub(crate) layers: Vec<FrozenLayer>,
    pub(crate) w_c: Linear,
    pub(crate) ctx_norm: Vec<f32>,
    pub(crate) out_norm: Vec<f32>,
    pub(crate) out_proj: Linear,
    /// `W2`, for the products of the Markov pass.
    pub(crate) markov_w2: MarkovProduct,
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
            qkv: Linear::stacked(&[&p.q, &p.k, &p.v])?,
            kv: Linear::stacked(&[&p.k, &p.v])?,
            o: Linear::of(&p.o)?,
            ff_norm: flat(&p.ff_norm)?,
            gate_up: Linear::stacked(&[&p.gate, &p.up])?,
            down: Linear::of(&p.down)?,
        })
    }

    /// Appends this layer's keys and values of `n` context rows `h_ctx` to `kv`.
    pub(crate) fn extend_context(
        &self,
        h_ctx: &[f32],
        n: usize,
        eps: f32,
        kv: &mut KeyValues,
    ) -> Result<()> {
        let x = rms_norm(h_ctx, &self.attn_norm, eps);
        let [k, v] = self.kv.apply_parts(&x, n)?;
        kv.keys.push_rows(&k);
        kv.values.extend(v);
        Ok(())
    }

    /// The blocks `h [Σ rows, d]` of sessions with contexts `ctxs` and `rows[i]` block rows
    /// each, after this layer: each block's rows attending over its own session's context,
    /// then its own block (the sessions' attention in parallel).
    pub(crate) fn forward(
        &self,
        h: &[f32],
        blocks: (&[&KeyValues], &[usize]),
        heads: usize,
        eps: f32,
    ) -> Result<Vec<f32>> {
        let d = self.attn_norm.len();
        let rows = h.len() / d;
        let n = rms_norm(h, &self.attn_norm, eps);
        let [q, k, v] = self.qkv.apply_parts(&n, rows)?;
        let attn = attend_blocks(&q, (&k, &v), blocks, d, heads);
        let mut h = add(h, &self.o.apply(&attn, rows)?);
        let n2 = rms_norm(&h, &self.ff_norm, eps);
        let [mut act, up] = self.gate_up.apply_parts(&n2, rows)?;
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
            markov_w2: MarkovProduct::of(&p.markov_w2)?,
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

/// One layer's keys (in panels) and values (row-major) of a session's context.
pub(crate) struct KeyValues {
    keys: KeyPanels,
    values: Vec<f32>,
}

impl KeyValues {
    /// No position yet, `width` values a row.
    pub(crate) fn new(width: usize) -> Self {
        Self {
            keys: KeyPanels::new(width),
            values: Vec::new(),
        }
    }

    fn part(&self) -> KeysValues<'_> {
        KeysValues {
            keys: &self.keys,
            values: &self.values,
        }
    }
}

/// Query rows times context positions under which a layer's attention runs its heads one
/// after another on the calling thread (a rayon hand-off costs more than it saves there).
const PARALLEL_HEADS_FROM: usize = 8 * 512;

/// The multi-head attention of each session's block (`q`, `k`, `v`: `[Σ rows, d]`, a block
/// of `rows[i]` rows per session) over its own context `ctxs[i]` and then its own block,
/// softmax over both, scores scaled by `hd^-½`: `[Σ rows, d]`. Sessions and heads are
/// independent, so they run in parallel where contexts are long, with the same bits
/// either way.
fn attend_blocks(
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    (ctxs, rows): (&[&KeyValues], &[usize]),
    d: usize,
    heads: usize,
) -> Vec<f32> {
    let hd = d / heads;
    let spans: Vec<std::ops::Range<usize>> = first_rows(rows)
        .into_iter()
        .zip(rows)
        .map(|(first, n)| first * d..(first + n) * d)
        .collect();
    let blocks: Vec<KeyPanels> = spans
        .iter()
        .map(|s| KeyPanels::of_rows(d, &k[s.clone()]))
        .collect();
    let head = |(i, h): (usize, usize)| {
        let own = spans[i].clone();
        let block = KeysValues {
            keys: &blocks[i],
            values: &v[own.clone()],
        };
        BlockAttention {
            q: &q[own],
            parts: &[ctxs[i].part(), block],
            heads,
            scale: (hd as f32).powf(-0.5),
        }
        .head(h)
    };
    let tasks: Vec<(usize, usize)> = (0..ctxs.len())
        .flat_map(|i| (0..heads).map(move |h| (i, h)))
        .collect();
    let work: usize = ctxs.iter().zip(rows).map(|(c, n)| c.keys.len() * n).sum();
    let outs: Vec<Vec<f32>> = if work >= PARALLEL_HEADS_FROM {
        tasks.par_iter().map(|t| head(*t)).collect()
    } else {
        tasks.iter().map(|t| head(*t)).collect()
    };
    let mut out = vec![0f32; q.len()];
    for ((i, h), o) in tasks.into_iter().zip(outs) {
        let block = out[spans[i].clone()].chunks_exact_mut(d);
        for (row, x) in block.zip(o.chunks_exact(hd)) {
            row[h * hd..(h + 1) * hd].copy_from_slice(x);
        }
    }
    out
}

/// The first row of each session's block in a batch whose sessions run `rows[i]` block
/// rows each, one block after another.
pub(crate) fn first_rows(rows: &[usize]) -> Vec<usize> {
    rows.iter()
        .scan(0, |at, n| {
            *at += n;
            Some(*at - n)
        })
        .collect()
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// The logistic function.
pub(crate) fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};
    use tandem_testkit::bits;

    use super::*;

    /// A `[rows, cols]` parameter of values `f(i)`.
    fn var(rows: usize, cols: usize, f: impl Fn(usize) -> f32) -> Var {
        let v: Vec<f32> = (0..rows * cols).map(f).collect();
        Var::from_tensor(&Tensor::from_vec(v, (rows, cols), &Device::Cpu).expect("tensor"))
            .expect("var")
    }

    fn f16_value(i: usize) -> f32 {
        f16::from_f32(((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 0.3).to_f32()
    }

    #[test]
    fn weights_that_are_f16_values_are_stored_in_f16_with_the_same_products() -> Result<()> {
        let (k, n, m) = (40, 24, 5);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let half = Linear::of(&var(k, n, f16_value))?;
        assert_eq!(half.0.qtype(), QType::F16);
        let wide = var(k, n, |i| f16_value(i) + if i == 7 { 1e-7 } else { 0.0 });
        assert_eq!(Linear::of(&wide)?.0.qtype(), QType::F32);
        let t = var(k, n, f16_value).as_tensor().t()?.contiguous()?;
        let bytes = (t.flatten_all()?.to_vec1::<f32>()?.iter())
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut want = vec![0f32; m * n];
        QMatrix::new(QType::F32, n, k, bytes)?.matmul(&x, m, &mut want)?;
        let got = half.apply(&x, m)?;
        assert_eq!(bits(&got), bits(&want));
        Ok(())
    }

    #[test]
    fn a_stacked_product_gives_each_part_bit_for_bit() -> Result<()> {
        let (k, m) = (32, 3);
        let parts = [
            var(k, 16, f16_value),
            var(k, 16, |i| f16_value(i + 5)),
            var(k, 16, |i| (i as f32).cos()),
        ];
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let stacked = Linear::stacked(&[&parts[0], &parts[1], &parts[2]])?;
        let got: [Vec<f32>; 3] = stacked.apply_parts(&x, m)?;
        for (part, got) in parts.iter().zip(got) {
            let want = Linear::of(part)?.apply(&x, m)?;
            assert_eq!(bits(&got), bits(&want));
        }
        let other = var(k + 1, 16, f16_value);
        assert!(Linear::stacked(&[&parts[0], &other]).is_err());
        Ok(())
    }
}
