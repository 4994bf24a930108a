//! The inference forward (DSpark, arXiv 2607.05147, §3.1 and Alg. 1): a per-session
//! context cache holding each layer's projected context keys and values (committed
//! context never changes, so rows are appended once and never re-projected), then one
//! parallel backbone pass over the block and sequential Markov sampling of its tokens.

use tandem_core::{DraftBlock, Sampler};
use tandem_gemma::{RestrictedHead, TargetHead};

use crate::batch::{DraftJob, MarkovRow};
use crate::config::DraftVocab;
use crate::error::{DsparkError, Result};
use tandem_kernels::rms_norm;

use crate::frozen::{Frozen, KeyValues};
use crate::model::Dspark;

/// A drafter frozen for inference against one target: its parameters copied out of their
/// `Var`s, the target's anchor embedding and its head restricted to the draft vocabulary.
/// Made by [`Dspark::drafter`], which checks the target; a trainer stepping the model
/// afterwards does not change it.
pub struct Drafter {
    pub(crate) frozen: Frozen,
    pub(crate) target: TargetHead,
    pub(crate) restricted: RestrictedHead,
    pub(crate) vocab: DraftVocab,
    pub(crate) gamma: usize,
    pub(crate) heads: usize,
    pub(crate) eps: f32,
    pub(crate) vocab_size: usize,
    row_width: usize,
}

/// One session's committed context as the drafter has projected it: each layer's keys
/// and values of every position received (committed context never changes, so rows are
/// appended once and never re-projected).
pub struct ContextCache {
    pub(crate) layers: Vec<KeyValues>,
    len: usize,
}

impl ContextCache {
    /// Number of context positions received.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position was received yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A block to draft after `anchor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftRequest {
    /// The target token the block follows (target id).
    pub anchor: u32,
    /// Tokens to draft, `1..=gamma` of the config.
    pub gamma: usize,
}

/// Teacher-forced draft outputs of one block (for evaluation and tests).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredBlock {
    /// One row of draft-vocabulary logits per block position.
    pub logits: Vec<Vec<f32>>,
    /// One confidence per block position.
    pub confidences: Vec<f32>,
}

impl Dspark {
    /// The drafter frozen for inference through `head`. Fails with
    /// [`DsparkError::TargetMismatch`] when `head` belongs to another target.
    pub fn drafter(&self, head: &TargetHead) -> Result<Drafter> {
        self.check_target(head)?;
        Ok(Drafter {
            frozen: Frozen::of(&self.params)?,
            restricted: head.restrict(self.vocab.ids())?,
            target: head.clone(),
            vocab: self.vocab.clone(),
            gamma: self.cfg.gamma,
            heads: self.cfg.n_heads,
            eps: self.dims.eps as f32,
            vocab_size: self.dims.vocab,
            row_width: self.row_width(),
        })
    }
}

impl Drafter {
    /// The underlying target head.
    pub fn target(&self) -> &TargetHead {
        &self.target
    }

    /// The head restricted to the draft vocabulary.
    pub fn restricted(&self) -> &RestrictedHead {
        &self.restricted
    }

    /// Floats per snapshot row (see [`Dspark::row_width`]).
    pub fn row_width(&self) -> usize {
        self.row_width
    }

    /// An empty context cache for one session.
    pub fn new_cache(&self) -> ContextCache {
        ContextCache {
            layers: self
                .frozen
                .layers
                .iter()
                .map(|_| KeyValues::new(self.frozen.heads.width()))
                .collect(),
            len: 0,
        }
    }

    /// Appends snapshot rows (row-major, [`Dspark::row_width`] floats each) of the next
    /// committed positions: projects them once into every layer's keys and values.
    pub fn extend(&self, cache: &mut ContextCache, rows: &[f32]) -> Result<()> {
        let same_layers = cache.layers.len() == self.frozen.layers.len();
        let n = whole_rows(rows, self.row_width, same_layers)?;
        if n == 0 {
            return Ok(());
        }
        let f = &self.frozen;
        let h_ctx = rms_norm(&f.w_c.apply(rows, n)?, &f.ctx_norm, self.eps);
        for (layer, kv) in f.layers.iter().zip(&mut cache.layers) {
            layer.extend_context(&h_ctx, n, self.eps, kv)?;
        }
        cache.len += n;
        Ok(())
    }

    /// The block after `anchor` with teacher-forced previous tokens `prev` (target ids,
    /// `prev[0] == anchor`), one position per entry, over the rows a draft of that many
    /// tokens runs ([`block_rows`]): the logits and confidences of the training forward
    /// (of the whole block where `prev` fills it), computed through the cache and the
    /// quantized head.
    pub fn score(&self, cache: &ContextCache, prev: &[u32]) -> Result<ScoredBlock> {
        let anchor = *prev
            .first()
            .ok_or_else(|| DsparkError::Invalid("no previous tokens".into()))?;
        let req = DraftRequest {
            anchor,
            gamma: prev.len(),
        };
        check_request(req, self.gamma, self.vocab_size)?;
        let bb = self.backbones(&[(cache, req)])?;
        let rows: Vec<MarkovRow> = prev
            .iter()
            .enumerate()
            .map(|(k, t)| MarkovRow {
                item: 0,
                k,
                prev: *t,
            })
            .collect();
        let (logits, confidences) = self.markov_rows(&bb, &rows)?.into_iter().unzip();
        Ok(ScoredBlock {
            logits,
            confidences,
        })
    }

    /// Drafts `req.gamma` tokens after `req.anchor`: greedy or sampled by `sampler`'s
    /// parameters, each token's distribution returned exactly (target ids). The batch of
    /// one of [`Drafter::draft_many`].
    pub fn draft(
        &self,
        cache: &ContextCache,
        req: &DraftRequest,
        sampler: &mut Sampler,
    ) -> Result<DraftBlock> {
        let job = DraftJob {
            cache,
            req: *req,
            sampler,
        };
        self.draft_many(&mut [job])
            .pop()
            .unwrap_or_else(|| Err(DsparkError::Invalid("no block was drafted".into())))
    }
}

/// The number of snapshot rows of `width` floats in `rows`, for a context cache made by
/// the drafter extending it (`same_layers`); fails otherwise.
pub(crate) fn whole_rows(rows: &[f32], width: usize, same_layers: bool) -> Result<usize> {
    if !same_layers || !rows.len().is_multiple_of(width) {
        return Err(DsparkError::Invalid(format!(
            "{} floats is not a whole number of rows of {width}",
            rows.len()
        )));
    }
    Ok(rows.len() / width)
}

/// The block rows a draft of `gamma` tokens runs through the backbone, of a block
/// configured (and trained) with `configured` rows: its drafted positions and one more
/// mask row, not the whole block. A drafted position attends to every row of its block,
/// so rows past it change it only slightly: on the shipped general drafter τ at γ = 1, 2,
/// 4 stayed within 0.02 of the whole block's and a γ = 1 block cost 1.7–1.8 ms against
/// 2.5 (`docs/performance/2026-12-08-drafter-block-rows-epyc.md`); without the extra row,
/// τ at γ = 1 fell by 0.04–0.05.
pub(crate) fn block_rows(gamma: usize, configured: usize) -> usize {
    (gamma + 1).min(configured)
}

/// Fails unless `req` asks for `1..=gamma` tokens after a token of the target vocabulary.
pub(crate) fn check_request(req: DraftRequest, gamma: usize, vocab_size: usize) -> Result<()> {
    if req.gamma == 0 || req.gamma > gamma {
        return Err(DsparkError::Invalid(format!(
            "gamma {} is outside 1..={gamma}",
            req.gamma
        )));
    }
    check_token(req.anchor, vocab_size)
}

pub(crate) fn check_token(t: u32, vocab_size: usize) -> Result<()> {
    if t as usize >= vocab_size {
        return Err(DsparkError::Invalid(format!(
            "token {t} is outside the target vocabulary of {vocab_size}"
        )));
    }
    Ok(())
}
