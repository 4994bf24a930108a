//! From samples to a training batch: the draft vocabulary (the most frequent target tokens
//! of the continuations), random anchors per sequence, and the tensors of one step — the
//! drafter's inputs ([`TrainBatch`]) and what its outputs are scored against ([`Targets`]).
//!
//! Anchor `j` (a continuation position, as in the engine's round): the drafter sees the
//! taps of positions `0..j` (committed context; the anchor itself is not yet committed),
//! the anchor token `t_j`, and drafts `t_{j+1}..t_{j+γ}`; block position `k` is scored
//! against the target's distribution at position `j + k` restricted to the draft
//! vocabulary and renormalised.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use rand::Rng;
use tandem_dspark::{DraftVocab, TrainBatch};
use tandem_gemma::TargetHead;

use crate::error::{Result, TrainError};
use crate::teacher::Sample;

/// The `k` target ids most frequent in the continuations of `samples` (ties to the lower
/// id), then the most frequent ids of `prompts` (the corpus side, free to count), then the
/// lowest remaining ids, up to `min(k, vocab)`.
pub fn frequent_ids(samples: &[&Sample], prompts: &[Vec<u32>], k: usize, vocab: usize) -> Vec<u32> {
    let (mut cont, mut prompt) = (HashMap::<u32, u64>::new(), HashMap::<u32, u64>::new());
    for s in samples {
        s.tokens[s.prompt_len..]
            .iter()
            .for_each(|t| *cont.entry(*t).or_default() += 1);
    }
    for p in prompts {
        p.iter().for_each(|t| *prompt.entry(*t).or_default() += 1);
    }
    let mut ranked: Vec<u32> = (0..vocab as u32).collect();
    ranked.sort_by_key(|t| {
        let c = cont.get(t).copied().unwrap_or(0);
        let p = prompt.get(t).copied().unwrap_or(0);
        (std::cmp::Reverse(c), std::cmp::Reverse(p), *t)
    });
    ranked.truncate(k.min(vocab));
    ranked
}

/// One anchor: a sample and a continuation position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// Index of the sample.
    pub sample: usize,
    /// Anchor position `j`.
    pub pos: usize,
}

/// The anchor positions of `s` that leave room for a block of `gamma`: `P..=T-1-γ`.
pub fn anchor_range(s: &Sample, gamma: usize) -> std::ops::RangeInclusive<usize> {
    s.prompt_len..=s.tokens.len().saturating_sub(gamma + 1)
}

/// `per_sample` uniformly random anchors in each of `samples` (indices into the caller's
/// list), drawn with replacement.
pub fn random_anchors<R: Rng>(
    rng: &mut R,
    samples: &[(usize, &Sample)],
    per_sample: usize,
    gamma: usize,
) -> Result<Vec<Anchor>> {
    let mut out = Vec::with_capacity(samples.len() * per_sample);
    for (i, s) in samples {
        let range = anchor_range(s, gamma);
        if range.is_empty() {
            return Err(TrainError::Invalid(format!(
                "a continuation of {} tokens leaves no room for a block of {gamma}",
                s.tokens.len() - s.prompt_len
            )));
        }
        for _ in 0..per_sample {
            out.push(Anchor {
                sample: *i,
                pos: rng.random_range(range.clone()),
            });
        }
    }
    Ok(out)
}

/// What a batch's drafted blocks are scored against.
#[derive(Debug, Clone)]
pub struct Targets {
    /// `[A, γ]` u32: draft index of each target token (0 where masked).
    pub tokens: Tensor,
    /// `[A, γ, Vd]` f32: the target distributions over the draft vocabulary.
    pub probs: Tensor,
    /// `[A, γ]` f32: 1 where the target token is in the draft vocabulary, else 0.
    pub mask: Tensor,
}

/// Everything needed to assemble batches.
pub struct BatchMaker<'a> {
    /// The target head (anchor embeddings).
    pub head: &'a TargetHead,
    /// The draft vocabulary.
    pub vocab: &'a DraftVocab,
    /// Block length.
    pub gamma: usize,
    /// Where the batch's tensors go (the drafter's device).
    pub device: &'a Device,
}

impl BatchMaker<'_> {
    /// The batch of `anchors` into `samples`: each sequence an anchor reads is sent once,
    /// right-padded to the longest context, and every anchor masks the positions past its
    /// own. Target distributions travel sparse and are spread over the draft vocabulary on
    /// the device.
    pub fn make(&self, samples: &[&Sample], anchors: &[Anchor]) -> Result<(TrainBatch, Targets)> {
        let get = |a: &Anchor| {
            samples
                .get(a.sample)
                .copied()
                .filter(|s| anchor_range(s, self.gamma).contains(&a.pos))
                .ok_or_else(|| TrainError::Invalid(format!("anchor {a:?} is out of range")))
        };
        let (n, g) = (anchors.len(), self.gamma);
        let width = samples.first().map_or(0, |s| s.width);
        let len = anchors.iter().map(|a| a.pos).max().unwrap_or(0);
        if n == 0 || len == 0 {
            return Err(TrainError::Invalid("an empty batch".into()));
        }
        let mut slots: Vec<usize> = Vec::new();
        let (mut index, mut mask) = (Vec::with_capacity(n), vec![0f32; n * len]);
        let mut emb = Vec::with_capacity(n * self.head.hidden());
        let mut prev = Vec::with_capacity(n * g);
        let mut sparse = SparseRows::new(n * g, self.vocab.len());
        for (i, a) in anchors.iter().enumerate() {
            let s = get(a)?;
            let slot = match slots.iter().position(|x| *x == a.sample) {
                Some(slot) => slot,
                None => {
                    slots.push(a.sample);
                    slots.len() - 1
                }
            };
            index.push(slot as u32);
            mask[i * len..][..a.pos].fill(1.0);
            emb.extend(self.head.embed(s.tokens[a.pos])?);
            prev.extend_from_slice(&s.tokens[a.pos..a.pos + g]);
            for k in 0..g {
                let Some(d) = self.vocab.draft_index(s.tokens[a.pos + k + 1]) else {
                    sparse.skip();
                    continue;
                };
                let dist = s.dist(a.pos + k).ok_or_else(|| {
                    TrainError::Invalid(format!("no target distribution at {}", a.pos + k))
                })?;
                let kept = dist.ids.iter().zip(&dist.probs);
                sparse.push(d, kept.map(|(id, p)| (self.vocab.draft_index(*id), *p)));
            }
        }
        let mut taps = vec![0f32; slots.len() * len * width];
        for (slot, i) in slots.iter().enumerate() {
            // A shorter sequence's tail stays zero: its anchors mask it.
            let s = samples[*i];
            let have = (s.rows.len() / width.max(1)).min(len);
            taps[slot * len * width..][..have * width].copy_from_slice(s.context(have));
        }
        let dev = self.device;
        let padded = anchors.iter().any(|a| a.pos < len);
        let batch = TrainBatch {
            ctx_taps: Tensor::from_vec(taps, (slots.len(), len, width), dev)?,
            ctx_index: Some(Tensor::from_vec(index, n, dev)?),
            ctx_mask: padded
                .then(|| Tensor::from_vec(mask, (n, len), dev))
                .transpose()?,
            anchor_emb: Tensor::from_vec(emb, (n, self.head.hidden()), dev)?,
            prev: Tensor::from_vec(prev, (n, g), dev)?,
        };
        Ok((batch, sparse.targets((n, g), dev)?))
    }
}

/// Target distributions of a batch's block positions as `(draft index, probability)`
/// lists, padded to one length with a sink column past the draft vocabulary.
struct SparseRows {
    vd: usize,
    tokens: Vec<u32>,
    mask: Vec<f32>,
    rows: Vec<Vec<(u32, f32)>>,
}

impl SparseRows {
    fn new(capacity: usize, vd: usize) -> Self {
        Self {
            vd,
            tokens: Vec::with_capacity(capacity),
            mask: Vec::with_capacity(capacity),
            rows: Vec::with_capacity(capacity),
        }
    }

    /// A position whose target token is outside the draft vocabulary (masked).
    fn skip(&mut self) {
        self.tokens.push(0);
        self.mask.push(0.0);
        self.rows.push(Vec::new());
    }

    /// A position whose target token has draft index `token`; ids outside the draft
    /// vocabulary (`None`) are dropped.
    fn push(&mut self, token: usize, kept: impl Iterator<Item = (Option<usize>, f32)>) {
        self.tokens.push(token as u32);
        self.mask.push(1.0);
        let row = kept.filter_map(|(d, p)| d.map(|d| (d as u32, p)));
        self.rows.push(row.collect());
    }

    /// `[A, γ, Vd]` distributions, renormalised over the draft vocabulary, built on `dev`.
    fn targets(self, (n, g): (usize, usize), dev: &Device) -> Result<Targets> {
        let k = self.rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let (mut ids, mut probs) = (vec![self.vd as u32; n * g * k], vec![0f32; n * g * k]);
        for (r, row) in self.rows.iter().enumerate() {
            let z = row
                .iter()
                .map(|(_, p)| p)
                .sum::<f32>()
                .max(f32::MIN_POSITIVE);
            for (j, (d, p)) in row.iter().enumerate() {
                (ids[r * k + j], probs[r * k + j]) = (*d, p / z);
            }
        }
        let ids = Tensor::from_vec(ids, (n * g, k), dev)?;
        let probs = Tensor::from_vec(probs, (n * g, k), dev)?;
        let dense = Tensor::zeros((n * g, self.vd + 1), DType::F32, dev)?
            .scatter_add(&ids, &probs, 1)?
            .narrow(1, 0, self.vd)?
            .reshape((n, g, self.vd))?;
        Ok(Targets {
            tokens: Tensor::from_vec(self.tokens, (n, g), dev)?,
            probs: dense,
            mask: Tensor::from_vec(self.mask, (n, g), dev)?,
        })
    }
}
