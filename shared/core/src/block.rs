//! Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative
//! Decoding", Algorithm 2). Token-wise rejection sampling stops at the first rejected draft
//! token; block verification judges the prefixes of the block jointly and keeps the
//! longest one its coupling allows, so a token the token-wise rule would reject can still be
//! kept when the tokens after it make up for it. The output is distributed exactly as the
//! target's (the paper's Theorem 1) and the expected number of kept tokens is never below
//! the token-wise rule's (Theorem 2).
//!
//! With `p_i` the target's and `q_i` the drafter's distribution at draft position `i`
//! (after the anchor and the first `i − 1` drafts) and `X_i` the drafted tokens:
//!
//! * the prefix weights `w_0 = 1`, `w_i = min(1, w_{i−1} · p_i(X_i) / q_i(X_i))`;
//! * the residual mass after `i` kept tokens, `Z_i = Σ_x max(w_i · p_{i+1}(x) − q_{i+1}(x), 0)`;
//! * the stop probabilities `h_i = Z_i / (Z_i + 1 − w_i)` for `i < γ` (1 when both are 0)
//!   and `h_γ = w_γ`;
//! * `τ = max{i : η_i < h_i}` over uniform draws `η_1..η_γ` (0 when none), and the token after
//!   the kept prefix is drawn from `p_{γ+1}` when `τ = γ`, else from
//!   `norm(max(w_τ · p_{τ+1} − q_{τ+1}, 0))`.
//!
//! At `τ = 0` the residual is token-wise's `norm(max(p − q, 0))`. Unlike the token-wise rule,
//! every position's full target distribution is needed whatever is kept.

use rayon::prelude::*;

use crate::acceptance::{residual_mass, weighted_residual, ProbIndex, Verdict};
use crate::sampling::{Sampler, SparseDist};

/// What block verification derives from a block before drawing: the prefix weights
/// `w_0..=w_γ`, the stop probabilities `h_1..=h_γ` (`stops[i − 1] = h_i`) and the
/// token-wise acceptance ratios `min(1, p_i(X_i) / q_i(X_i))` of the same block.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockPlan {
    /// `w_0..=w_γ`.
    pub weights: Vec<f64>,
    /// `h_1..=h_γ`.
    pub stops: Vec<f64>,
    /// The token-wise rule's acceptance probability of each draft token.
    pub ratios: Vec<f64>,
}

/// The draft tokens one block keeps in expectation under each rule: exact for the block
/// at hand, so the two rules compare on the very same drafts and target distributions.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExpectedKept {
    /// Token-wise: `Σ_k Π_{j ≤ k} min(1, p_j / q_j)`.
    pub token: f64,
    /// Block: `Σ_t t · h_t · Π_{j > t} (1 − h_j)`.
    pub block: f64,
}

impl BlockPlan {
    /// The plan of `draft`, drawn from `q`, against the target distributions `p` of
    /// positions `0..=draft.len()`.
    pub fn new(draft: &[u32], q: &[SparseDist], p: &[SparseDist]) -> Self {
        assert_eq!(
            q.len(),
            draft.len(),
            "one draft distribution per draft token"
        );
        assert_eq!(
            p.len(),
            draft.len() + 1,
            "one target distribution per position"
        );
        let gamma = draft.len();
        let mut weights = vec![1.0f64];
        let mut stops = Vec::with_capacity(gamma);
        let mut ratios = Vec::with_capacity(gamma);
        for (i, d) in draft.iter().enumerate() {
            let (pd, qd) = (p[i].prob(*d) as f64, q[i].prob(*d) as f64);
            let ratio = match qd > 0.0 {
                true => pd / qd,
                false => 0.0,
            };
            ratios.push(ratio.min(1.0));
            let w = (weights[i] * ratio).min(1.0);
            weights.push(w);
            let h = match i + 1 < gamma {
                true => {
                    let next = &p[i + 1];
                    let total: f64 = next.probs.iter().map(|x| *x as f64).sum();
                    let z = residual_mass(&ProbIndex::new(next), total, w, &q[i + 1]);
                    let den = z + 1.0 - w;
                    if den > 0.0 {
                        z / den
                    } else {
                        1.0
                    }
                }
                false => w,
            };
            stops.push(h);
        }
        Self {
            weights,
            stops,
            ratios,
        }
    }

    /// The draft tokens this block keeps in expectation under each rule.
    pub fn expected(&self) -> ExpectedKept {
        let token = self
            .ratios
            .iter()
            .scan(1.0, |reach, a| {
                *reach *= a;
                Some(*reach)
            })
            .sum();
        let block = (1..=self.stops.len())
            .map(|t| {
                let later: f64 = self.stops[t..].iter().map(|h| 1.0 - h).product();
                t as f64 * self.stops[t - 1] * later
            })
            .sum();
        ExpectedKept { token, block }
    }

    /// The residual the token after `kept` tokens is drawn from (`kept < γ`).
    pub fn residual(&self, kept: usize, p: &[SparseDist], q: &[SparseDist]) -> SparseDist {
        weighted_residual(&p[kept], self.weights[kept], &q[kept]).0
    }
}

/// Block verification of `draft` (drawn from `q`) against the target distributions `p(i)`,
/// `i` in `0..=draft.len()`, each asked for once (in parallel: every one is needed). Draws
/// `γ + 1` uniforms from `rng`: `η_1..η_γ`, then the next token's.
pub fn accept_block(
    draft: &[u32],
    q: &[SparseDist],
    p: impl Fn(usize) -> SparseDist + Sync,
    rng: &mut Sampler,
) -> Verdict {
    accept_block_expected(draft, q, p, rng).0
}

/// [`accept_block`], with what each rule keeps of this block in expectation.
pub fn accept_block_expected(
    draft: &[u32],
    q: &[SparseDist],
    p: impl Fn(usize) -> SparseDist + Sync,
    rng: &mut Sampler,
) -> (Verdict, ExpectedKept) {
    let p: Vec<SparseDist> = (0..=draft.len()).into_par_iter().map(&p).collect();
    let plan = BlockPlan::new(draft, q, &p);
    let mut accepted = 0;
    for (i, h) in plan.stops.iter().enumerate() {
        if rng.uniform() < *h {
            accepted = i + 1;
        }
    }
    let next = match accepted == draft.len() {
        true => p[accepted].draw(rng.uniform()),
        false => plan.residual(accepted, &p, q).draw(rng.uniform()),
    };
    (Verdict { accepted, next }, plan.expected())
}

#[cfg(test)]
mod tests;
