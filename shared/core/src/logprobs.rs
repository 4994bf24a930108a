//! Log-probabilities a client asks for: each generated token's under the target's own
//! distribution (log-softmax of its raw logits, before temperature, penalties and
//! truncation, as vLLM reports them by default) and the most likely alternatives at its
//! position.

use serde::{Deserialize, Serialize};

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A generated token's log-probability and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's log-probability.
    pub logprob: f32,
    /// The most likely `(id, log-probability)`, most likely first (ties to the lower id).
    pub top: Vec<(u32, f32)>,
}

/// The log-probability of `token` under the log-softmax of `logits`, with the `top` most
/// likely ids.
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|l| (*l as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    let lp = |l: f32| (l as f64 - lse) as f32;
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let rank = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let top = top.min(ids.len());
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, rank);
    }
    ids.truncate(top);
    ids.sort_unstable_by(rank);
    TokenLogprob {
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |l| lp(*l)),
        top: ids
            .iter()
            .map(|&id| (id, lp(logits[id as usize])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn logprobs_are_the_log_softmax_with_the_top_ids_in_order() {
        let logits = [1.0f32, 3.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|l| (*l as f64).exp()).sum();
        let got = token_logprob(&logits, 0, 3);
        assert!((got.logprob as f64 - (1.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 2, 0], "ties to the lower id");
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprob(&logits, 0, 99).top.len(), 4);
    }

    proptest! {
        /// The probabilities of every id sum to 1, the token's entry matches its top entry,
        /// and the top list is sorted.
        #[test]
        fn logprobs_normalise(logits in proptest::collection::vec(-30.0f32..30.0, 1..200), pick in any::<usize>()) {
            let token = (pick % logits.len()) as u32;
            let all = token_logprob(&logits, token, logits.len());
            let total: f64 = all.top.iter().map(|t| (t.1 as f64).exp()).sum();
            prop_assert!((total - 1.0).abs() < 1e-4);
            let entry = all.top.iter().find(|t| t.0 == token).map(|t| t.1);
            prop_assert_eq!(entry, Some(all.logprob));
            prop_assert!(all.top.windows(2).all(|w| w[0].1 >= w[1].1));
            prop_assert!(all.logprob <= 0.0);
        }
    }
}
