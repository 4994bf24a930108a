//! Verifying a drafted block (Leviathan et al. 2023, "Fast Inference from Transformers via
//! Speculative Decoding"; Chen et al. 2023): greedy acceptance keeps the longest prefix equal
//! to the target's argmax; rejection sampling accepts draft token `d` with probability
//! `min(1, p(d)/q(d))` and, at the first rejection, samples from `norm(max(p - q, 0))`, which
//! leaves the output distributed exactly as the target's. Both always end the round with one
//! token chosen by the target, so a round emits between 1 and γ+1 tokens.

use std::collections::HashMap;

use crate::block::ExpectedKept;
use crate::rows::{BuiltRows, TargetRows};
use crate::sampling::{Sampler, SparseDist};

/// Outcome of verifying one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Draft tokens kept (a prefix of the draft).
    pub accepted: usize,
    /// The target's token after them: the bonus when all were kept, else the correction.
    pub next: u32,
}

impl Verdict {
    /// The tokens this round emits: the accepted draft prefix, then [`Verdict::next`].
    pub fn emitted(&self, draft: &[u32]) -> Vec<u32> {
        let mut out = draft[..self.accepted].to_vec();
        out.push(self.next);
        out
    }
}

/// Greedy verification: `target_argmax[i]` is the target's argmax after the anchor and the
/// first `i` draft tokens (`draft.len() + 1` entries).
pub fn accept_greedy(draft: &[u32], target_argmax: &[u32]) -> Verdict {
    assert_eq!(
        target_argmax.len(),
        draft.len() + 1,
        "need one target token per draft position plus the bonus"
    );
    let accepted = draft
        .iter()
        .zip(target_argmax)
        .take_while(|(d, t)| d == t)
        .count();
    Verdict {
        accepted,
        next: target_argmax[accepted],
    }
}

/// Rejection sampling. `q[i]` is the distribution draft token `draft[i]` was drawn from;
/// `p(i)` the target's (after the request's temperature / top-k / top-p) at the same
/// position, for `i` in `0..=draft.len()` (the last one gives the bonus). `p` is called in
/// order, once per position the round reaches and for no other: after an early rejection
/// the full-vocabulary distributions of the later positions are never built.
pub fn accept_sampled(
    draft: &[u32],
    q: &[SparseDist],
    p: impl FnMut(usize) -> SparseDist,
    rng: &mut Sampler,
) -> Verdict {
    accept_sampled_rows(draft, q, &mut BuiltRows::new(p), rng)
}

/// [`accept_sampled`] reading the target's side from `rows` (in position order, the
/// positions after a rejection never).
pub fn accept_sampled_rows(
    draft: &[u32],
    q: &[SparseDist],
    rows: &mut impl TargetRows,
    rng: &mut Sampler,
) -> Verdict {
    assert_eq!(
        q.len(),
        draft.len(),
        "one draft distribution per draft token"
    );
    for (i, d) in draft.iter().enumerate() {
        let qd = q[i].prob(*d) as f64;
        let u = rng.uniform();
        if qd > 0.0 && rows.exceeds(i, *d, u * qd) {
            continue;
        }
        return Verdict {
            accepted: i,
            next: rows.draw_residual(i, &q[i], rng.uniform()),
        };
    }
    Verdict {
        accepted: draft.len(),
        next: rows.draw(draft.len(), rng.uniform()),
    }
}

/// `norm(max(w·p - q, 0))` and its mass before normalising; `p` itself (and mass 0) when
/// no mass is left. Linear in the sizes of `p` and `q` (full-vocabulary distributions meet
/// 32k-token draft ones here).
pub(crate) fn weighted_residual(p: &SparseDist, w: f64, q: &SparseDist) -> (SparseDist, f64) {
    let mut mass: Vec<f64> = p.probs.iter().map(|x| w * *x as f64).collect();
    let index = ProbIndex::new(p);
    for (id, qp) in q.ids.iter().zip(&q.probs) {
        if let Some(m) = index.position(*id).map(|i| &mut mass[i]) {
            *m -= *qp as f64;
        }
    }
    mass.iter_mut().for_each(|m| *m = m.max(0.0));
    let total: f64 = mass.iter().sum();
    if total <= 0.0 {
        return (p.clone(), 0.0);
    }
    let dist = SparseDist {
        ids: p.ids.clone(),
        probs: mass.iter().map(|m| (m / total) as f32).collect(),
    };
    (dist, total)
}

/// The mass `Σ_x max(w·p(x) - q(x), 0)` of [`weighted_residual`] without building it: `w·Σp`
/// less `Σ min(w·p(x), q(x))` over `q`'s ids, in `O(|q|)` once `p` is indexed (`p_total`
/// is `Σp`, summed in f64).
pub(crate) fn residual_mass(index: &ProbIndex<'_>, p_total: f64, w: f64, q: &SparseDist) -> f64 {
    let overlap: f64 = q
        .ids
        .iter()
        .zip(&q.probs)
        .map(|(id, qp)| (w * index.prob(*id)).min(*qp as f64))
        .sum();
    (w * p_total - overlap).max(0.0)
}

/// Where each id of a distribution sits: at its own index when the distribution lists
/// every id in order (a full-vocabulary row), through a hash index otherwise.
pub(crate) struct ProbIndex<'a> {
    p: &'a SparseDist,
    index: Option<HashMap<u32, usize>>,
}

impl<'a> ProbIndex<'a> {
    pub(crate) fn new(p: &'a SparseDist) -> Self {
        let in_order = p.ids.iter().enumerate().all(|(i, id)| *id as usize == i);
        let index = (!in_order).then(|| p.ids.iter().enumerate().map(|(i, id)| (*id, i)).collect());
        Self { p, index }
    }

    /// The index of `id` in the distribution, if listed.
    pub(crate) fn position(&self, id: u32) -> Option<usize> {
        match &self.index {
            None => Some(id as usize).filter(|i| *i < self.p.ids.len()),
            Some(index) => index.get(&id).copied(),
        }
    }

    /// The probability of `id` (0 when absent).
    pub(crate) fn prob(&self, id: u32) -> f64 {
        self.position(id).map_or(0.0, |i| self.p.probs[i] as f64)
    }
}

/// Seeded verification: the token at output index `first + i` is drawn from `p(i)` with
/// the uniform [`keyed_uniform`]`(seed, first + i)`, the draft is kept while it equals
/// those draws, and the first draw it misses (or the one after the whole block) is the
/// next token. Each token is an exact draw from the target's distribution, and which
/// tokens are drawn depends only on the seed, the position and the distributions, never on
/// the draft: the output is plain seeded decoding's, token for token.
pub fn accept_seeded(
    draft: &[u32],
    p: impl FnMut(usize) -> SparseDist,
    seed: u64,
    first: usize,
) -> Verdict {
    accept_seeded_rows(draft, &mut BuiltRows::new(p), seed, first)
}

/// [`accept_seeded`] drawing from `rows`.
pub fn accept_seeded_rows(
    draft: &[u32],
    rows: &mut impl TargetRows,
    seed: u64,
    first: usize,
) -> Verdict {
    let mut i = 0;
    loop {
        let next = rows.draw(i, keyed_uniform(seed, (first + i) as u64));
        match draft.get(i) {
            Some(d) if *d == next => i += 1,
            _ => return Verdict { accepted: i, next },
        }
    }
}

/// A uniform number in [0, 1) that depends only on `seed` and `index` (SplitMix64 of both,
/// 53 bits).
pub fn keyed_uniform(seed: u64, index: u64) -> f64 {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (mix(seed ^ mix(index)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// How a sampled round judges its draft (greedy rounds keep the prefix that matches the
/// target's argmax either way, which both rules reduce to). Token-wise is the default:
/// measured on the evaluation sets, block verification keeps about 1 % more tokens and
/// costs more than that in the target distributions it builds (docs/performance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verification {
    /// Token by token ([`accept_sampled`]): the round stops at the first rejection.
    #[default]
    Token,
    /// The block jointly ([`crate::block::accept_block`]): never fewer kept tokens in
    /// expectation, at the price of every position's full target distribution.
    Block,
    /// Every position's token is the target's own draw with a uniform keyed by the seed
    /// and the token's index in the output ([`accept_seeded`]): a seeded generation emits
    /// the same text with any drafter, any γ, or none. Drafts are kept while they equal
    /// those draws, which is less often than rejection sampling keeps them.
    Seeded,
}

impl Verification {
    /// Both rules.
    pub const ALL: [Verification; 3] = [
        Verification::Token,
        Verification::Block,
        Verification::Seeded,
    ];

    /// The rule's name in flags, reports and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Block => "block",
            Self::Seeded => "seeded",
        }
    }

    /// Verifies a sampled draft by this rule (see [`accept_sampled`] for the arguments;
    /// `first` is the output index of the token the first position chooses, which seeded
    /// verification keys its draws by; block verification builds every position's `p` at
    /// once, in parallel, and then also says what each rule keeps of this block in
    /// expectation).
    pub fn accept(
        self,
        draft: &[u32],
        q: &[SparseDist],
        p: impl Fn(usize) -> SparseDist + Sync,
        rng: &mut Sampler,
        first: usize,
    ) -> (Verdict, Option<ExpectedKept>) {
        match self {
            Self::Token => (accept_sampled(draft, q, p, rng), None),
            Self::Seeded => (accept_seeded(draft, p, rng.params().seed, first), None),
            Self::Block => {
                let (v, e) = crate::block::accept_block_expected(draft, q, p, rng);
                (v, Some(e))
            }
        }
    }

    /// Verifies by this rule reading the target's side from `rows`, in position order
    /// (arguments as for [`Verification::accept`]); `None` for block verification, which
    /// needs every position's whole distribution at once.
    pub fn accept_in_order(
        self,
        draft: &[u32],
        q: &[SparseDist],
        rows: &mut impl TargetRows,
        rng: &mut Sampler,
        first: usize,
    ) -> Option<Verdict> {
        match self {
            Self::Token => Some(accept_sampled_rows(draft, q, rows, rng)),
            Self::Seeded => Some(accept_seeded_rows(draft, rows, rng.params().seed, first)),
            Self::Block => None,
        }
    }

    /// The uniform [`Self::accept_in_order`] draws an empty draft's token with (a plain
    /// round's): token-wise the sampler's next, seeded the one keyed by `first`; `None`
    /// for block verification. Token-wise it is taken from `rng`: a round whose token is
    /// drawn with it elsewhere (in its target's step) does not also run the rule.
    pub fn plain_uniform(self, rng: &mut Sampler, first: usize) -> Option<f64> {
        match self {
            Self::Token => Some(rng.uniform()),
            Self::Seeded => Some(keyed_uniform(rng.params().seed, first as u64)),
            Self::Block => None,
        }
    }
}

impl std::str::FromStr for Verification {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("unknown verification {s:?} (token, block or seeded)"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sampling::SamplingParams;
    use proptest::prelude::*;

    /// The target distributions of a round, looked up by position.
    fn at(p: &[SparseDist]) -> impl FnMut(usize) -> SparseDist + '_ {
        move |i| p[i].clone()
    }

    /// A sampler at temperature 1 over every token, seeded `seed`.
    pub(crate) fn sampler(seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            seed,
        })
        .expect("valid")
    }

    /// The distribution proportional to `weights` over ids `0..`, zero weights left out.
    pub(crate) fn dist(weights: &[f64]) -> SparseDist {
        let total: f64 = weights.iter().sum();
        let (ids, probs) = weights
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0.0)
            .map(|(i, w)| (i as u32, (w / total) as f32))
            .unzip();
        SparseDist { ids, probs }
    }

    fn l2(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            .sqrt()
    }

    fn as_dense(d: &SparseDist, vocab: usize) -> Vec<f64> {
        let mut v = vec![0.0; vocab];
        for (id, p) in d.ids.iter().zip(&d.probs) {
            v[*id as usize] = *p as f64;
        }
        v
    }

    /// In the manner of vLLM's rejection-sampler test: the first emitted token of a round is
    /// distributed as the target `p`, whatever the draft `q`; the L2 distance of the
    /// empirical distribution shrinks with the sample count and stays far below the distance
    /// to unrelated distributions.
    #[test]
    fn rejection_sampling_reproduces_the_target_distribution() {
        let vocab = 6;
        let p0 = dist(&[0.05, 0.4, 0.1, 0.25, 0.0, 0.2]);
        let q0 = dist(&[0.3, 0.1, 0.3, 0.05, 0.25, 0.0]);
        let p1 = dist(&[0.2, 0.2, 0.2, 0.2, 0.1, 0.1]);
        let target = as_dense(&p0, vocab);
        let mut draws = sampler(99);
        let mut rng = sampler(7);
        let mut distances = Vec::new();
        for n in [1_000usize, 10_000, 100_000] {
            let mut counts = vec![0f64; vocab];
            for _ in 0..n {
                let d = q0.draw(draws.uniform());
                let v = accept_sampled(
                    &[d],
                    std::slice::from_ref(&q0),
                    at(&[p0.clone(), p1.clone()]),
                    &mut rng,
                );
                counts[v.emitted(&[d])[0] as usize] += 1.0;
            }
            let emp: Vec<f64> = counts.iter().map(|c| c / n as f64).collect();
            distances.push(l2(&emp, &target));
        }
        assert!(distances[2] < distances[0], "{distances:?}");
        assert!(distances[2] < 0.01, "{distances:?}");
        let unrelated = [
            as_dense(&q0, vocab),
            as_dense(&p1, vocab),
            vec![1.0 / 6.0; 6],
        ];
        for u in &unrelated {
            assert!(l2(u, &target) > 20.0 * distances[2]);
        }
    }

    /// Whole generations, not just one token: a 3-token sequence produced by rounds of
    /// γ = 2 (accepted prefixes, corrections and bonus tokens) from a context-dependent draft
    /// `q(·|prev)` is distributed exactly as the target's `p(·|prev)` chain.
    #[test]
    fn speculative_rounds_reproduce_the_target_sequence_distribution() {
        let p_table = [[0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]];
        let q_table = [[0.2, 0.2, 0.6], [0.5, 0.5, 0.0], [0.9, 0.05, 0.05]];
        let (p_of, q_of) = (
            |t: u32| dist(&p_table[t as usize]),
            |t: u32| dist(&q_table[t as usize]),
        );
        let (mut draws, mut rng) = (sampler(5), sampler(6));
        let n = 200_000;
        let mut counts = vec![0f64; 27];
        for _ in 0..n {
            let mut seq: Vec<u32> = Vec::new();
            let mut prev = 0u32;
            while seq.len() < 3 {
                let mut draft = Vec::new();
                let (mut q, mut p) = (Vec::new(), vec![p_of(prev)]);
                let mut last = prev;
                for _ in 0..2 {
                    q.push(q_of(last));
                    last = q[q.len() - 1].draw(draws.uniform());
                    draft.push(last);
                    p.push(p_of(last));
                }
                let v = accept_sampled(&draft, &q, at(&p), &mut rng);
                seq.extend(v.emitted(&draft));
                prev = *seq.last().expect("a token");
            }
            counts[(seq[0] * 9 + seq[1] * 3 + seq[2]) as usize] += 1.0;
        }
        let mut exact = vec![0f64; 27];
        for (i, e) in exact.iter_mut().enumerate() {
            let (a, b, c) = (i / 9, i / 3 % 3, i % 3);
            *e = p_table[0][a] * p_table[a][b] * p_table[b][c];
        }
        let emp: Vec<f64> = counts.iter().map(|c| c / n as f64).collect();
        let d = l2(&emp, &exact);
        assert!(d < 0.005, "L2 {d}");
        let mut drafted = vec![0f64; 27];
        for (i, e) in drafted.iter_mut().enumerate() {
            let (a, b, c) = (i / 9, i / 3 % 3, i % 3);
            *e = q_table[0][a] * q_table[a][b] * q_table[b][c];
        }
        assert!(l2(&drafted, &exact) > 20.0 * d);
    }

    /// `norm(max(p - q, 0))` as the rules build it.
    fn residual(p: &SparseDist, q: &SparseDist) -> SparseDist {
        weighted_residual(p, 1.0, q).0
    }

    /// `norm(max(p - q, 0))` computed id by id.
    fn naive_residual(p: &SparseDist, q: &SparseDist) -> Vec<f32> {
        let mass: Vec<f64> = p
            .ids
            .iter()
            .zip(&p.probs)
            .map(|(id, pp)| (*pp as f64 - q.prob(*id) as f64).max(0.0))
            .collect();
        let total: f64 = mass.iter().sum();
        mass.iter().map(|m| (m / total) as f32).collect()
    }

    #[test]
    fn residuals_of_ordered_and_unordered_targets_agree_with_the_definition() {
        let p = dist(&[0.1, 0.4, 0.2, 0.3]);
        let q = SparseDist {
            ids: vec![3, 1, 9],
            probs: vec![0.5, 0.3, 0.2],
        };
        let r = residual(&p, &q);
        assert_eq!(r.ids, p.ids);
        assert_eq!(r.probs, naive_residual(&p, &q));
        let shuffled = SparseDist {
            ids: vec![2, 0, 3, 1],
            probs: vec![0.2, 0.1, 0.3, 0.4],
        };
        let r = residual(&shuffled, &q);
        assert_eq!(r.ids, shuffled.ids);
        assert_eq!(r.probs, naive_residual(&shuffled, &q));
        assert_eq!(residual(&p, &p), p, "no mass left: p itself");
    }

    #[test]
    fn the_residual_mass_over_q_alone_equals_the_full_residual_mass() {
        let q = SparseDist {
            ids: vec![3, 1, 9],
            probs: vec![0.5, 0.3, 0.2],
        };
        let ordered = dist(&[0.1, 0.4, 0.2, 0.3]);
        let shuffled = SparseDist {
            ids: vec![2, 0, 3, 1],
            probs: vec![0.2, 0.1, 0.3, 0.4],
        };
        for p in [&ordered, &shuffled] {
            let total: f64 = p.probs.iter().map(|x| *x as f64).sum();
            for w in [1.0, 0.7, 0.25, 0.0] {
                let full = weighted_residual(p, w, &q).1;
                let fast = residual_mass(&ProbIndex::new(p), total, w, &q);
                assert!((full - fast).abs() < 1e-9, "w {w}: {full} vs {fast}");
            }
        }
    }

    /// A plain round drawn with [`Verification::plain_uniform`] elsewhere chooses the
    /// token the rule would, and leaves the sampler where the rule would.
    #[test]
    fn a_plain_rounds_uniform_is_the_rules() {
        let p = dist(&[0.1, 0.2, 0.3, 0.4]);
        for rule in [Verification::Token, Verification::Seeded] {
            for (seed, first) in (0..50).zip(3..) {
                let (mut ruled, mut drawn) = (sampler(seed), sampler(seed));
                let mut rows = BuiltRows::new(|_| p.clone());
                let want = rule.accept_in_order(&[], &[], &mut rows, &mut ruled, first);
                let u = rule.plain_uniform(&mut drawn, first).expect("a uniform");
                let got = Verdict {
                    accepted: 0,
                    next: p.draw(u),
                };
                assert_eq!(Some(got), want, "{rule:?} seed {seed}");
                assert_eq!(drawn.uniform(), ruled.uniform(), "{rule:?} seed {seed}");
            }
        }
        assert_eq!(Verification::Block.plain_uniform(&mut sampler(0), 0), None);
    }

    #[test]
    fn identical_distributions_accept_everything() {
        let p = dist(&[0.5, 0.5]);
        let mut rng = sampler(1);
        for _ in 0..200 {
            let v = accept_sampled(
                &[0, 1, 1],
                &vec![p.clone(); 3],
                at(&vec![p.clone(); 4]),
                &mut rng,
            );
            assert_eq!(v.accepted, 3);
        }
    }

    #[test]
    fn token_outside_target_support_is_always_rejected() {
        let p = dist(&[0.0, 1.0]);
        let q = dist(&[1.0, 0.0]);
        let v = accept_sampled(&[0], &[q], at(&[p.clone(), p]), &mut sampler(3));
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                next: 1
            }
        );
    }

    /// Seeded verification emits the draws plain seeded decoding makes, whatever the
    /// draft: every draft token that equals its draw is kept, the first that does not is
    /// replaced by it.
    #[test]
    fn seeded_verification_emits_the_draws_whatever_the_draft() {
        let p = |i: usize| SparseDist {
            ids: vec![0, 1, 2],
            probs: match i % 2 {
                0 => vec![0.5, 0.3, 0.2],
                _ => vec![0.1, 0.1, 0.8],
            },
        };
        let draws: Vec<u32> = (0..5)
            .map(|i| p(i).draw(keyed_uniform(9, 40 + i as u64)))
            .collect();
        let plain = accept_seeded(&[], p, 9, 40);
        assert_eq!((plain.accepted, plain.next), (0, draws[0]));
        let all = accept_seeded(&draws[..4], p, 9, 40);
        assert_eq!((all.accepted, all.next), (4, draws[4]));
        let mut spoiled = draws[..4].to_vec();
        spoiled[2] = (spoiled[2] + 1) % 3;
        let cut = accept_seeded(&spoiled, p, 9, 40);
        assert_eq!(cut.emitted(&spoiled), draws[..3]);
        assert_ne!(keyed_uniform(9, 40), keyed_uniform(10, 40));
        assert!((0..1000).all(|i| (0.0..1.0).contains(&keyed_uniform(i, i * 7))));
    }

    proptest! {
        #[test]
        fn greedy_keeps_the_matching_prefix(draft in proptest::collection::vec(0u32..4, 0..9), target in proptest::collection::vec(0u32..4, 9)) {
            let t = &target[..draft.len() + 1];
            let v = accept_greedy(&draft, t);
            let out = v.emitted(&draft);
            prop_assert!(out.len() <= draft.len() + 1);
            prop_assert_eq!(&out[..v.accepted], &draft[..v.accepted]);
            prop_assert_eq!(&out[..], &t[..=v.accepted]);
            prop_assert_eq!(*out.last().expect("one token"), t[v.accepted]);
        }

        #[test]
        fn sampled_rounds_emit_a_draft_prefix_then_a_target_token(
            gamma in 0usize..6, seed in any::<u64>(),
            w in proptest::collection::vec(proptest::collection::vec(0.0f64..1.0, 5), 13),
        ) {
            let ds: Vec<SparseDist> = w.iter().map(|x| { let mut x = x.clone(); x[0] += 0.01; dist(&x) }).collect();
            let (q, p) = (&ds[..gamma], &ds[6..6 + gamma + 1]);
            let mut draws = sampler(seed);
            let draft: Vec<u32> = q.iter().map(|d| d.draw(draws.uniform())).collect();
            let mut asked = Vec::new();
            let v = accept_sampled(&draft, q, |i| { asked.push(i); p[i].clone() }, &mut sampler(seed ^ 1));
            prop_assert_eq!(asked, (0..=v.accepted).collect::<Vec<_>>(), "p is asked for the positions reached, in order");
            let out = v.emitted(&draft);
            prop_assert!(v.accepted <= gamma && out.len() == v.accepted + 1);
            prop_assert_eq!(&out[..v.accepted], &draft[..v.accepted]);
            prop_assert!(p[v.accepted].prob(v.next) > 0.0, "the last token comes from the target");
            let again = accept_sampled(&draft, q, at(p), &mut sampler(seed ^ 1));
            prop_assert_eq!(again, v);
        }
    }
}
