//! The assistant drafter's output heads (transformers' `Gemma4AssistantMaskedEmbedder` and
//! the tied `lm_head` of `Gemma4AssistantForCausalLM`): greedy token choice only.
//!
//! The centroid head scores `num_centroids` centroids, keeps the top
//! `centroid_intermediate_top_k` (ties to the lower centroid index), and scores only the
//! tokens `token_ordering` assigns to them against the tied embedding. transformers then
//! scatters those scores into a vocabulary-sized row filled below their minimum and takes
//! the argmax, so the winner is the best candidate with ties going to the lowest token id;
//! this applies that rule to the candidates directly, without the vocabulary-sized row. The
//! dense head scores the whole vocabulary, ties again to the lowest id.

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

/// A drafted token and its logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    /// Token id.
    pub token: u32,
    /// Its logit (`embedding[token] · h`).
    pub logit: f32,
}

/// Token choice from the assistant's final hidden state.
pub(crate) struct DraftHead {
    embed: QMatrix,
    centroids: Option<Centroids>,
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
        Ok(Self { embed, centroids })
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

    /// The greedy token of one normed hidden row.
    pub(crate) fn pick(&self, h: &[f32]) -> Result<Pick> {
        match &self.centroids {
            Some(c) => self.pick_centroids(c, h),
            None => {
                let logits = linear(&self.embed, h, 1)?;
                Ok(best((0..logits.len() as u32).zip(logits)))
            }
        }
    }

    fn pick_centroids(&self, c: &Centroids, h: &[f32]) -> Result<Pick> {
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
        Ok(best(candidates.into_iter()))
    }
}

/// The highest logit, ties to the lowest token id. NaN never wins.
fn best(scored: impl Iterator<Item = (u32, f32)>) -> Pick {
    let mut top = Pick {
        token: u32::MAX,
        logit: f32::NEG_INFINITY,
    };
    for (token, logit) in scored {
        if logit > top.logit || (logit == top.logit && token < top.token) {
            top = Pick { token, logit };
        }
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lowest_id_in_any_order() {
        let scored = [(9, 1.0), (4, 2.0), (7, 2.0), (2, -1.0), (5, f32::NAN)];
        assert_eq!(best(scored.into_iter()).token, 4);
        assert_eq!(best(scored.into_iter().rev()).token, 4);
    }
}
