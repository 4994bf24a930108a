//! How a session chooses each drafted token from the assistant's logits at that step (the
//! head's full row, transformers' logits), and what the block says of it.
//!
//! - Greedy requests: the highest logit, ties to the lowest id (transformers' loop), sent as
//!   a point mass.
//! - Sampled requests: a draw from the distribution the request's temperature, top-k and
//!   top-p make of the logits ([`tandem_core::distribution`], the rules the target's
//!   tokens are sampled by) without its negligible tail
//!   ([`tandem_core::SparseDist::without_tail`], so that a block stays small on the wire),
//!   sent as that exact distribution, so that rejection sampling stays lossless and accepts
//!   what the assistant and the target agree on.
//!
//! The confidence sent with a token is the assistant's probability of it at that step:
//! greedy, the softmax probability at temperature 1 of the greedy token; sampled, the
//! probability of the drawn token in the distribution it was drawn from. It is not
//! calibrated.

use tandem_core::{distribution, Sampler, SamplingParams, SparseDist};
use tandem_gemma::gemma4::greedy_token;

/// One drafted token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Choice {
    pub(crate) token: u32,
    /// The distribution `token` was drawn from (a point mass when greedy).
    pub(crate) dist: SparseDist,
    /// The assistant's probability of `token` (see the module docs).
    pub(crate) confidence: f32,
}

/// Chooses a token from one step's `logits` with `sampler`'s parameters; draws consume one
/// uniform number of its stream, greedy choices none.
pub(crate) fn choose(sampler: &mut Sampler, logits: &[f32]) -> Choice {
    let params = *sampler.params();
    if params.is_greedy() {
        let token = greedy_token(logits);
        let full = SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        };
        return Choice {
            token,
            dist: SparseDist {
                ids: vec![token],
                probs: vec![1.0],
            },
            confidence: distribution(logits, &full).prob(token),
        };
    }
    let dist = distribution(logits, &params).without_tail(logits.len());
    let token = dist.draw(sampler.uniform());
    Choice {
        token,
        confidence: dist.prob(token),
        dist,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: Option<usize>, seed: u64) -> Sampler {
        let params = SamplingParams {
            temperature,
            top_k,
            top_p: 1.0,
            seed,
        };
        Sampler::new(params).expect("valid")
    }

    #[test]
    fn greedy_is_a_point_mass_on_the_lowest_top_id_with_its_softmax_probability() {
        let logits = [0.0f32, 2.0, 2.0, (0.5f32).ln()];
        let c = choose(&mut sampler(0.0, None, 1), &logits);
        assert_eq!(c.token, 1);
        assert_eq!(c.dist.ids, vec![1]);
        assert_eq!(c.dist.probs, vec![1.0]);
        let z = 1.0 + 2.0 * 2f64.exp() + 0.5;
        assert!((f64::from(c.confidence) - 2f64.exp() / z).abs() < 1e-6);
        assert_eq!(choose(&mut sampler(0.7, Some(1), 1), &logits), c);
    }

    #[test]
    fn sampled_tokens_come_with_their_distribution_and_probability() {
        let logits: Vec<f32> = (0..16).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
        let mut s = sampler(0.7, Some(5), 9);
        let mut seen = [0usize; 16];
        for _ in 0..200 {
            let c = choose(&mut s, &logits);
            assert_eq!(c.dist, distribution(&logits, s.params()));
            assert_eq!(c.confidence, c.dist.prob(c.token));
            assert!(c.confidence > 0.0);
            seen[c.token as usize] += 1;
        }
        assert_eq!(seen.iter().filter(|n| **n > 0).count(), 5, "{seen:?}");
    }
}
