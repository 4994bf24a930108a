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

use candle_core::{Device, Tensor};
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
}

impl BatchMaker<'_> {
    /// The batch of `anchors` into `samples`; contexts are right-padded to the longest.
    pub fn make(&self, samples: &[&Sample], anchors: &[Anchor]) -> Result<(TrainBatch, Targets)> {
        let get = |a: &Anchor| {
            samples
                .get(a.sample)
                .copied()
                .filter(|s| anchor_range(s, self.gamma).contains(&a.pos))
                .ok_or_else(|| TrainError::Invalid(format!("anchor {a:?} is out of range")))
        };
        let (n, g, vd) = (anchors.len(), self.gamma, self.vocab.len());
        let width = samples.first().map_or(0, |s| s.width);
        let len = anchors.iter().map(|a| a.pos).max().unwrap_or(0);
        if n == 0 || len == 0 {
            return Err(TrainError::Invalid("an empty batch".into()));
        }
        let (mut taps, mut mask) = (vec![0f32; n * len * width], vec![0f32; n * len]);
        let mut emb = Vec::with_capacity(n * self.head.hidden());
        let (mut prev, mut tok) = (Vec::with_capacity(n * g), vec![0u32; n * g]);
        let (mut probs, mut tmask) = (vec![0f32; n * g * vd], vec![0f32; n * g]);
        for (i, a) in anchors.iter().enumerate() {
            let s = get(a)?;
            taps[i * len * width..][..a.pos * width].copy_from_slice(s.context(a.pos));
            mask[i * len..][..a.pos].fill(1.0);
            emb.extend(self.head.embed(s.tokens[a.pos])?);
            prev.extend_from_slice(&s.tokens[a.pos..a.pos + g]);
            for k in 0..g {
                let row = i * g + k;
                let Some(d) = self.vocab.draft_index(s.tokens[a.pos + k + 1]) else {
                    continue;
                };
                let dist = s.dist(a.pos + k).ok_or_else(|| {
                    TrainError::Invalid(format!("no target distribution at {}", a.pos + k))
                })?;
                let p = &mut probs[row * vd..][..vd];
                for (id, pr) in dist.ids.iter().zip(&dist.probs) {
                    if let Some(j) = self.vocab.draft_index(*id) {
                        p[j] = *pr;
                    }
                }
                let z: f32 = p.iter().sum();
                p.iter_mut().for_each(|x| *x /= z);
                (tok[row], tmask[row]) = (d as u32, 1.0);
            }
        }
        let dev = Device::Cpu;
        let padded = anchors.iter().any(|a| a.pos < len);
        let batch = TrainBatch {
            ctx_taps: Tensor::from_vec(taps, (n, len, width), &dev)?,
            ctx_mask: padded
                .then(|| Tensor::from_vec(mask, (n, len), &dev))
                .transpose()?,
            anchor_emb: Tensor::from_vec(emb, (n, self.head.hidden()), &dev)?,
            prev: Tensor::from_vec(prev, (n, g), &dev)?,
        };
        let targets = Targets {
            tokens: Tensor::from_vec(tok, (n, g), &dev)?,
            probs: Tensor::from_vec(probs, (n, g, vd), &dev)?,
            mask: Tensor::from_vec(tmask, (n, g), &dev)?,
        };
        Ok((batch, targets))
    }
}
