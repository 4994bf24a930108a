//! The training forward (DSpark, arXiv 2607.05147, §3.2): the whole backbone in parallel
//! over a batch of `A` anchors with teacher-forced Markov inputs, built only from candle
//! ops that have gradients. The frozen target head enters as a constant dense tensor.

use candle_core::{DType, Tensor};

use crate::backbone::{padding_bias, softcap, ContextKv};
use crate::error::{DsparkError, Result};
use crate::model::Dspark;

/// One training batch of `A` anchors with `L` context positions each, taken from `S`
/// sequences (several anchors of one sequence share its context, which is projected once).
#[derive(Debug, Clone)]
pub struct TrainBatch {
    /// `[S, L, m·H]` f32: the tapped target hidden states of each sequence's positions.
    pub ctx_taps: Tensor,
    /// `[A]` u32: the sequence of each anchor; `None` when `S = A` and anchor `i` reads
    /// sequence `i`.
    pub ctx_index: Option<Tensor>,
    /// `[A, L]` f32 key-padding mask (1 real, 0 padding); `None` when nothing is padded.
    pub ctx_mask: Option<Tensor>,
    /// `[A, H]` f32: the target's scaled input embedding of each anchor token.
    pub anchor_emb: Tensor,
    /// `[A, γ]` u32 target ids: the token before each block position (`prev[0]` is the
    /// anchor, `prev[k]` the `k`-th target token after it).
    pub prev: Tensor,
}

/// What the training forward returns.
#[derive(Debug, Clone)]
pub struct TrainOutput {
    /// `[A, γ, Vd]` draft logits over the draft vocabulary.
    pub logits: Tensor,
    /// `[A, γ]` confidences in (0, 1).
    pub confidences: Tensor,
}

impl Dspark {
    /// Runs the batch; `head` is the frozen target head restricted to the draft
    /// vocabulary as a dense f32 `[Vd, H]` tensor (see `TargetHead::dense_rows`).
    pub fn forward_train(&self, batch: &TrainBatch, head: &Tensor) -> Result<TrainOutput> {
        let a = self.check_batch(batch, head)?;
        let p = &self.params;
        let eps = self.dims.eps;
        let h_ctx = p.context(&batch.ctx_taps, eps)?;
        let per_anchor = |t: Tensor| -> Result<Tensor> {
            match &batch.ctx_index {
                Some(i) => Ok(t.index_select(i, 0)?),
                None => Ok(t),
            }
        };
        let bias = match &batch.ctx_mask {
            Some(m) => Some(padding_bias(m, self.cfg.gamma)?),
            None => None,
        };
        let mut block = p.block(&batch.anchor_emb)?;
        for layer in &p.layers {
            let (k, v) = layer.context_kv(&h_ctx, eps)?;
            let (k, v) = (per_anchor(k)?, per_anchor(v)?);
            let ctx = ContextKv {
                k: Some(&k),
                v: Some(&v),
                bias: bias.as_ref(),
            };
            block = layer.forward(&block, &ctx, self.shape())?;
        }
        let (out, hidden) = p.outputs(&block, eps)?;
        let base = softcap(
            hidden.broadcast_matmul(&head.t()?)?,
            self.dims.final_softcap,
        )?;
        let rows = self.markov_rows(&batch.prev)?;
        let e1 = p.markov_w1.index_select(&rows, 0)?.reshape((
            a,
            self.cfg.gamma,
            self.cfg.markov_rank,
        ))?;
        let logits = (base + e1.broadcast_matmul(&p.markov_w2)?)?;
        let confidences = p.confidence(&out, &e1)?;
        Ok(TrainOutput {
            logits,
            confidences,
        })
    }

    /// Markov-head rows `[A·γ]` of the previous-token ids.
    fn markov_rows(&self, prev: &Tensor) -> Result<Tensor> {
        let ids = prev.flatten_all()?.to_vec1::<u32>()?;
        let rows = ids
            .iter()
            .map(|t| match (*t as usize) < self.dims.vocab {
                true => Ok(self.vocab.markov_row(*t) as u32),
                false => Err(DsparkError::Invalid(format!(
                    "previous token {t} is outside the target vocabulary of {}",
                    self.dims.vocab
                ))),
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok(Tensor::from_vec(rows, ids.len(), prev.device())?)
    }

    /// Checks every shape and dtype of a batch; returns `A`.
    fn check_batch(&self, b: &TrainBatch, head: &Tensor) -> Result<usize> {
        let (s, l, _) = b.ctx_taps.dims3()?;
        let a = b.anchor_emb.dim(0)?;
        let (h, g) = (self.dims.hidden, self.cfg.gamma);
        let expect = |what: &str, t: &Tensor, dims: &[usize], dtype: DType| {
            if t.dims() != dims || t.dtype() != dtype {
                return Err(DsparkError::Invalid(format!(
                    "{what} is {:?} {:?}, expected {dtype:?} {dims:?}",
                    t.dtype(),
                    t.dims()
                )));
            }
            Ok(())
        };
        if a == 0 || l == 0 {
            return Err(DsparkError::Invalid("empty batch or context".into()));
        }
        expect(
            "ctx_taps",
            &b.ctx_taps,
            &[s, l, self.row_width()],
            DType::F32,
        )?;
        match &b.ctx_index {
            Some(i) => {
                expect("ctx_index", i, &[a], DType::U32)?;
                if i.to_vec1::<u32>()?.iter().any(|x| *x as usize >= s) {
                    return Err(DsparkError::Invalid(format!(
                        "a ctx_index is past the batch's {s} sequences"
                    )));
                }
            }
            None if s != a => {
                return Err(DsparkError::Invalid(format!(
                    "{s} context sequences for {a} anchors need a ctx_index"
                )))
            }
            None => {}
        }
        if let Some(m) = &b.ctx_mask {
            expect("ctx_mask", m, &[a, l], DType::F32)?;
        }
        expect("anchor_emb", &b.anchor_emb, &[a, h], DType::F32)?;
        expect("prev", &b.prev, &[a, g], DType::U32)?;
        expect("head", head, &[self.vocab.len(), h], DType::F32)?;
        Ok(a)
    }
}
