//! The output head and input embedding of a Gemma 3 target, on their own: what a drafter
//! that reuses the target's frozen LM head needs (DFlash, arXiv 2602.06036, and DSpark,
//! arXiv 2607.05147, both score draft tokens through the target's head). [`TargetHead`]
//! loads only the embedding (plus `lm_head` when untied) and the config, or shares the
//! weights of a loaded [`crate::Gemma3`]; [`RestrictedHead`] scores a subset of the
//! vocabulary (a draft vocabulary) without touching the other rows.

use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use tandem_core::TargetIdentity;
use tandem_kernels::QMatrix;

use super::config::GemmaConfig;
use super::linear::Linear;
use super::model::Precision;
use super::names::Role;
use crate::error::{GemmaError, Result};
use crate::loader::{self, TensorSource};
use crate::ops::softcap;

/// The input embedding and output head of a Gemma 3 target. Cheap to clone (the weights
/// are shared).
#[derive(Debug, Clone)]
pub struct TargetHead {
    cfg: GemmaConfig,
    embed: Arc<Linear>,
    lm_head: Option<Arc<Linear>>,
}

impl TargetHead {
    /// Reads the config and only the embedding (and `lm_head` when untied) of a `.gguf`
    /// file or an HF directory.
    ///
    /// The weights keep their ggml layout ([`RestrictedHead::logits`] then uses 8-bit
    /// activations).
    pub fn load(path: &Path) -> Result<Self> {
        let (src, cfg) = loader::open(path)?;
        Self::read(cfg, src.as_ref(), Precision::Int8)
    }

    /// Reads the embedding (and `lm_head` when untied) of `cfg`'s model from `src`, in the
    /// layout `precision` computes with (see [`Linear`]).
    pub(crate) fn read(
        cfg: GemmaConfig,
        src: &dyn TensorSource,
        precision: Precision,
    ) -> Result<Self> {
        let mat = |role: Role| {
            let shape = role.shape(&cfg);
            Linear::new(src.matrix(role, shape[0], shape[1])?, precision).map(Arc::new)
        };
        let embed = mat(Role::Embed)?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(mat(Role::LmHead)?),
        };
        Self::with_layout(cfg, embed, lm_head)
    }

    /// A head from its parts; `embed` (and `lm_head`) must be `vocab_size × hidden_size`.
    pub fn new(
        cfg: GemmaConfig,
        embed: Arc<QMatrix>,
        lm_head: Option<Arc<QMatrix>>,
    ) -> Result<Self> {
        let ggml = |m: Arc<QMatrix>| Arc::new(Linear::Ggml(Arc::unwrap_or_clone(m)));
        Self::with_layout(cfg, ggml(embed), lm_head.map(ggml))
    }

    fn with_layout(
        cfg: GemmaConfig,
        embed: Arc<Linear>,
        lm_head: Option<Arc<Linear>>,
    ) -> Result<Self> {
        let want = [cfg.vocab_size, cfg.hidden_size];
        for (name, m) in
            std::iter::once(("embedding", &embed)).chain(lm_head.iter().map(|m| ("lm_head", m)))
        {
            if [m.n(), m.k()] != want {
                return Err(GemmaError::ShapeMismatch {
                    tensor: name.into(),
                    actual: vec![m.n(), m.k()],
                    expected: want.to_vec(),
                });
            }
        }
        Ok(Self {
            cfg,
            embed,
            lm_head,
        })
    }

    /// The target's configuration.
    pub fn config(&self) -> &GemmaConfig {
        &self.cfg
    }

    /// Hidden size.
    pub fn hidden(&self) -> usize {
        self.cfg.hidden_size
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.cfg.vocab_size
    }

    /// RMSNorm epsilon of the target.
    pub fn eps(&self) -> f64 {
        self.cfg.rms_norm_eps
    }

    /// `tanh` soft-capping of the final logits, when the target applies it.
    pub fn final_softcap(&self) -> Option<f32> {
        self.cfg.final_logit_softcapping.map(|c| c as f32)
    }

    /// The output head matrix (`lm_head`, or the embedding when tied).
    pub(crate) fn head(&self) -> &Arc<Linear> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The input embedding of `token`, scaled by `sqrt(hidden)` as the decoder sees it.
    pub fn embed(&self, token: u32) -> Result<Vec<f32>> {
        let mut row = vec![0f32; self.hidden()];
        self.embed_into(token, &mut row)?;
        Ok(row)
    }

    /// [`TargetHead::embed`] into `row` (`hidden` floats).
    pub fn embed_into(&self, token: u32, row: &mut [f32]) -> Result<()> {
        if token as usize >= self.vocab() {
            return Err(GemmaError::Request(format!(
                "token id {token} is outside the vocabulary of {}",
                self.vocab()
            )));
        }
        self.embed.dequantize_row(token as usize, row)?;
        let scale = (self.hidden() as f32).sqrt();
        row.iter_mut().for_each(|x| *x *= scale);
        Ok(())
    }

    /// The full-vocabulary head as a [`RestrictedHead`] (shares the weights).
    pub fn full(&self) -> RestrictedHead {
        RestrictedHead {
            rows: Arc::clone(self.head()),
            ids: (0..self.vocab() as u32).collect(),
            softcap: self.final_softcap(),
        }
    }

    /// The head restricted to `ids` (target token ids, in draft-vocabulary order). When
    /// `ids` is the whole vocabulary in order, the weights are shared, not copied.
    pub fn restrict(&self, ids: &[u32]) -> Result<RestrictedHead> {
        if ids.iter().enumerate().all(|(i, t)| i == *t as usize) && ids.len() == self.vocab() {
            return Ok(self.full());
        }
        let rows: Vec<usize> = ids.iter().map(|t| *t as usize).collect();
        Ok(RestrictedHead {
            rows: Arc::new(self.head().select_rows(&rows)?),
            ids: ids.to_vec(),
            softcap: self.final_softcap(),
        })
    }

    /// The unscaled head rows of `ids` as a dense f32 tensor `[ids.len(), hidden]` (the
    /// frozen head of a training forward).
    pub fn dense_rows(&self, ids: &[u32]) -> Result<Tensor> {
        let h = self.hidden();
        let mut data = vec![0f32; ids.len() * h];
        for (row, id) in data.chunks_exact_mut(h).zip(ids) {
            self.head().dequantize_row(*id as usize, row)?;
        }
        Ok(Tensor::from_vec(data, (ids.len(), h), &Device::Cpu)?)
    }

    /// The target's identity (see [`TargetIdentity::of_embedding`]).
    pub fn identity(&self) -> Result<TargetIdentity> {
        TargetIdentity::of_embedding("gemma3", self.vocab(), self.hidden(), |r, row| {
            self.embed.dequantize_row(r, row)
        })
    }
}

/// The target head restricted to a list of token ids: row `i` scores `ids[i]`.
#[derive(Debug, Clone)]
pub struct RestrictedHead {
    rows: Arc<Linear>,
    ids: Vec<u32>,
    softcap: Option<f32>,
}

impl RestrictedHead {
    /// Target ids of the rows, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Number of rows (the draft vocabulary size).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the head has no rows (never true for a constructed head).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Logits `[m, len]` of `m` f32 hidden rows (`m × hidden`, already final-normed), with
    /// the target's final soft-capping. 8-bit activations (`QMatrix::matmul`): measured
    /// faster than the exact product for drafting blocks, and deterministic; exact where
    /// the head was packed for an `exact` target's lane kernels (shared with it).
    pub fn logits(&self, hidden: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut out = self.rows.matmul(hidden, m)?;
        if let Some(cap) = self.softcap {
            softcap(&mut out, cap);
        }
        Ok(out)
    }
}
