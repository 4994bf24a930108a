//! The assistant drafter's output heads (transformers' `Gemma4AssistantMaskedEmbedder` and
//! the tied `lm_head` of `Gemma4AssistantForCausalLM`): a vocabulary-sized row of logits
//! per step, exactly the row transformers returns, and the greedy choice from it.
//!
//! The dense head scores the whole vocabulary against the tied embedding. The centroid head
//! scores `num_centroids` centroids, keeps the top `centroid_intermediate_top_k` (ties to
//! the lower centroid index), and scores only the tokens `token_ordering` assigns to them
//! against the tied embedding; as transformers does, every other id gets the candidates'
//! lowest logit minus 1 (not -inf: at temperature 1 they share some probability, which
//! transformers' `_speculative_sampling` counts too). The greedy token is the highest logit,
//! ties to the lowest id, which with that fill is always a candidate.

use tandem_kernels::QMatrix;

use super::block::{linear, Weights};
use super::config::AssistantConfig;
use crate::error::{GemmaError, Result};
use tandem_kernels::dot;

const CENTROIDS: &str = "masked_embedding.centroids.weight";
const ORDERING: &str = "masked_embedding.token_ordering";

struct Centroids {
    weights: QMatrix,
    /// Token ids grouped by centroid: group `c` is `ordering[c*per..(c+1)*per]`.
    ordering: Vec<u32>,
    per: usize,
    top_k: usize,
}

/// Logits from the assistant's final hidden state.
pub(crate) struct DraftHead {
    embed: QMatrix,
    centroids: Option<Centroids>,
    vocab: usize,
}

impl DraftHead {
    /// The centroid head when the config asks for it and the checkpoint carries its
    /// tensors; the dense tied head otherwise (the large released assistants declare
    /// centroids but ship only the tied embedding).
    pub(crate) fn load(w: &Weights, cfg: &AssistantConfig) -> Result<Self> {
        let (v, h) = (cfg.text.vocab_size, cfg.text.hidden_size);
        let embed = w.matrix(&w.model("embed_tokens.weight"), v, h)?;
        let centroids = match cfg.use_ordered_embeddings && w.contains(CENTROIDS) {
            true => Some(Self::centroids(w, cfg)?),
            false => None,
        };
        Ok(Self {
            embed,
            centroids,
            vocab: v,
        })
    }

    fn centroids(w: &Weights, cfg: &AssistantConfig) -> Result<Centroids> {
        let (v, c) = (cfg.text.vocab_size, cfg.num_centroids);
        let weights = w.matrix(CENTROIDS, c, cfg.text.hidden_size)?;
        let raw = w.ids(ORDERING, v)?;
        let mut seen = vec![false; v];
        let mut ordering = Vec::with_capacity(v);
        for id in raw {
            let ok = usize::try_from(id).ok().filter(|i| *i < v && !seen[*i]);
            let i = ok.ok_or_else(|| {
                GemmaError::Config(format!(
                    "{ORDERING} is not a permutation of the {v} token ids (bad entry {id})"
                ))
            })?;
            seen[i] = true;
            ordering.push(i as u32);
        }
        Ok(Centroids {
            weights,
            ordering,
            per: v / c,
            top_k: cfg.centroid_intermediate_top_k,
        })
    }

    /// Whether the centroid head is in use.
    pub(crate) fn uses_centroids(&self) -> bool {
        self.centroids.is_some()
    }

    /// transformers' logits of one normed hidden row: `vocab_size` of them.
    pub(crate) fn logits(&self, h: &[f32]) -> Result<Vec<f32>> {
        match &self.centroids {
            Some(c) => self.scattered(c, h),
            None => linear(&self.embed, h, 1),
        }
    }

    /// The candidates' logits at their ids, every other id at the lowest of them minus 1
    /// (computed as transformers does: `min().item() - 1.0` in f64, stored as f32).
    fn scattered(&self, c: &Centroids, h: &[f32]) -> Result<Vec<f32>> {
        let scores = linear(&c.weights, h, 1)?;
        let mut order: Vec<usize> = (0..scores.len()).collect();
        let by_score = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
        order.select_nth_unstable_by(c.top_k - 1, by_score);
        let mut row = vec![0f32; h.len()];
        let mut candidates = Vec::with_capacity(c.top_k * c.per);
        for group in &order[..c.top_k] {
            for &t in &c.ordering[group * c.per..(group + 1) * c.per] {
                self.embed.dequantize_row(t as usize, &mut row)?;
                candidates.push((t, dot(&row, h)));
            }
        }
        let min = candidates.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
        let mut logits = vec![(f64::from(min) - 1.0) as f32; self.vocab];
        for (t, logit) in candidates {
            logits[t as usize] = logit;
        }
        Ok(logits)
    }
}

/// The greedy token of a row of logits: the highest, ties to the lowest id; NaN never
/// wins (`u32::MAX` when nothing else is there).
pub fn greedy_token(logits: &[f32]) -> u32 {
    let mut top = (u32::MAX, f32::NEG_INFINITY);
    for (token, &logit) in (0u32..).zip(logits) {
        if logit > top.1 || (logit == top.1 && token < top.0) {
            top = (token, logit);
        }
    }
    top.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lowest_id_and_nan_never_wins() {
        assert_eq!(greedy_token(&[f32::NAN, 1.0, 2.0, -1.0, 2.0]), 2);
        assert_eq!(greedy_token(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(greedy_token(&[f32::NAN]), u32::MAX);
    }
}
