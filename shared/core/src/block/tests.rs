//! Block verification against exact enumeration (the distribution of whole generations,
//! computed without sampling) and against sampling through the real random stream.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::acceptance::tests::{dist, sampler};
use crate::acceptance::{accept_sampled, weighted_residual};
use crate::sampling::{distribution, SamplingParams};

/// A Markov chain over a small vocabulary: the distribution after each token.
type Chain = Vec<SparseDist>;

/// Which rule the exact enumeration follows.
#[derive(Clone, Copy)]
enum Rule {
    Token,
    Block,
}

/// The kept-prefix lengths of one round and their probabilities, with the distribution
/// of the token after each: token-wise from the acceptance ratios, block-wise from the
/// plan's stop probabilities (`P(τ = t) = h_t · Π_{j>t} (1 − h_j)`, `h_0 = 1`).
fn outcomes(
    rule: Rule,
    draft: &[u32],
    q: &[SparseDist],
    p: &[SparseDist],
) -> Vec<(usize, f64, SparseDist)> {
    let g = draft.len();
    let next = |t: usize, w: f64| match t == g {
        true => p[g].clone(),
        false => weighted_residual(&p[t], w, &q[t]).0,
    };
    match rule {
        Rule::Token => {
            let mut reach = 1.0;
            let mut out = Vec::new();
            for (t, d) in draft.iter().enumerate() {
                let a = (p[t].prob(*d) as f64 / q[t].prob(*d) as f64).min(1.0);
                out.push((t, reach * (1.0 - a), next(t, 1.0)));
                reach *= a;
            }
            out.push((g, reach, next(g, 1.0)));
            out
        }
        Rule::Block => {
            let plan = BlockPlan::new(draft, q, p);
            let mut h = vec![1.0];
            h.extend(&plan.stops);
            (0..=g)
                .map(|t| {
                    let later: f64 = h[t + 1..].iter().map(|x| 1.0 - x).product();
                    (t, h[t] * later, next(t, plan.weights[t]))
                })
                .collect()
        }
    }
}

/// Every draft block of length `g` after `prev` with its probability under `q_chain`.
fn drafts(q_chain: &Chain, prev: u32, g: usize) -> Vec<(Vec<u32>, f64)> {
    let mut all = vec![(Vec::new(), 1.0)];
    for _ in 0..g {
        let mut longer = Vec::new();
        for (d, pr) in &all {
            let last = *d.last().unwrap_or(&prev);
            let q = &q_chain[last as usize];
            for (id, qp) in q.ids.iter().zip(&q.probs) {
                let mut e: Vec<u32> = d.clone();
                e.push(*id);
                longer.push((e, pr * *qp as f64));
            }
        }
        all = longer;
    }
    all
}

/// The exact distribution of the first `len` tokens generated after token 0 by rounds of
/// `g` drafts from `q_chain` verified by `rule` against `p_chain`, as a map from sequences.
fn generated(
    rule: Rule,
    p_chain: &Chain,
    q_chain: &Chain,
    g: usize,
    len: usize,
) -> HashMap<Vec<u32>, f64> {
    let mut pending: Vec<HashMap<Vec<u32>, f64>> = vec![HashMap::new(); len + 1];
    pending[0].insert(Vec::new(), 1.0);
    for n in 0..len {
        for (seq, mass) in std::mem::take(&mut pending[n]) {
            let prev = *seq.last().unwrap_or(&0);
            for (draft, pd) in drafts(q_chain, prev, g) {
                let q: Vec<SparseDist> = std::iter::once(prev)
                    .chain(draft.iter().copied())
                    .take(g)
                    .map(|t| q_chain[t as usize].clone())
                    .collect();
                let p: Vec<SparseDist> = std::iter::once(prev)
                    .chain(draft.iter().copied())
                    .map(|t| p_chain[t as usize].clone())
                    .collect();
                for (t, pt, next) in outcomes(rule, &draft, &q, &p) {
                    for (y, py) in next.ids.iter().zip(&next.probs) {
                        let mut s = seq.clone();
                        s.extend_from_slice(&draft[..t]);
                        s.push(*y);
                        s.truncate(len);
                        *pending[s.len()].entry(s).or_default() += mass * pd * pt * *py as f64;
                    }
                }
            }
        }
    }
    std::mem::take(&mut pending[len])
}

/// The target chain's own distribution of the first `len` tokens after token 0.
fn chain_law(p_chain: &Chain, len: usize) -> HashMap<Vec<u32>, f64> {
    let mut law = HashMap::from([(Vec::new(), 1.0)]);
    for _ in 0..len {
        let mut next = HashMap::new();
        for (seq, mass) in law {
            let p = &p_chain[*seq.last().unwrap_or(&0) as usize];
            for (id, pr) in p.ids.iter().zip(&p.probs) {
                let mut s: Vec<u32> = seq.clone();
                s.push(*id);
                *next.entry(s).or_insert(0.0) += mass * *pr as f64;
            }
        }
        law = next;
    }
    law
}

fn max_gap(a: &HashMap<Vec<u32>, f64>, b: &HashMap<Vec<u32>, f64>) -> f64 {
    a.keys()
        .chain(b.keys())
        .map(|k| (a.get(k).unwrap_or(&0.0) - b.get(k).unwrap_or(&0.0)).abs())
        .fold(0.0, f64::max)
}

/// Expected kept draft tokens of the first round after token 0.
fn expected_kept(rule: Rule, p_chain: &Chain, q_chain: &Chain, g: usize) -> f64 {
    drafts(q_chain, 0, g)
        .into_iter()
        .map(|(draft, pd)| {
            let q: Vec<SparseDist> = std::iter::once(0)
                .chain(draft.iter().copied())
                .take(g)
                .map(|t| q_chain[t as usize].clone())
                .collect();
            let p: Vec<SparseDist> = std::iter::once(0)
                .chain(draft.iter().copied())
                .map(|t| p_chain[t as usize].clone())
                .collect();
            pd * outcomes(rule, &draft, &q, &p)
                .iter()
                .map(|(t, pt, _)| *t as f64 * pt)
                .sum::<f64>()
        })
        .sum()
}

/// Chains made from logits by the request's sampling rules: temperature, top-k, top-p.
fn chains(params: &SamplingParams) -> (Chain, Chain) {
    let p_logits = [
        [1.0, 0.2, -0.5, 0.3],
        [-1.0, 2.0, 0.1, 0.0],
        [0.3, 0.3, 1.5, -2.0],
        [0.0, 0.5, 0.2, 1.0],
    ];
    let q_logits = [
        [0.2, 1.0, -0.1, 0.0],
        [-0.5, 1.5, 0.9, -1.0],
        [0.3, 0.1, 1.0, 0.5],
        [1.0, 0.5, 0.2, 0.0],
    ];
    let q_params = SamplingParams {
        top_k: None,
        top_p: 1.0,
        ..*params
    };
    (
        p_logits.iter().map(|l| distribution(l, params)).collect(),
        q_logits
            .iter()
            .map(|l| distribution(l, &q_params))
            .collect(),
    )
}

#[test]
fn whole_generations_follow_the_target_exactly_at_several_temperatures_top_k_and_top_p() {
    let settings = [
        (1.0, None, 1.0),
        (0.7, None, 1.0),
        (1.5, None, 1.0),
        (1.0, Some(2), 1.0),
        (0.8, None, 0.8),
        (1.2, Some(3), 0.9),
    ];
    for (temperature, top_k, top_p) in settings {
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: 0,
        };
        let (p, q) = chains(&params);
        let law = chain_law(&p, 4);
        for g in [1, 2, 3] {
            for rule in [Rule::Token, Rule::Block] {
                let gap = max_gap(&generated(rule, &p, &q, g, 4), &law);
                assert!(
                    gap < 1e-6,
                    "T {temperature} k {top_k:?} p {top_p} γ {g}: {gap}"
                );
            }
            let (t, b) = (
                expected_kept(Rule::Token, &p, &q, g),
                expected_kept(Rule::Block, &p, &q, g),
            );
            assert!(b >= t - 1e-9, "γ {g}: block keeps {b}, token-wise {t}");
            if g > 1 && temperature == 1.0 && top_k.is_none() {
                assert!(
                    b > t + 1e-3,
                    "γ {g}: block keeps {b}, token-wise {t}: no gain"
                );
            }
        }
    }
}

#[test]
fn degenerate_blocks_stay_exact_a_draft_equal_to_the_target_and_point_masses() {
    let p = vec![
        dist(&[0.5, 0.3, 0.2]),
        dist(&[0.1, 0.1, 0.8]),
        dist(&[0.3, 0.0, 0.7]),
    ];
    let point = vec![
        dist(&[0.0, 1.0, 0.0]),
        dist(&[0.0, 0.0, 1.0]),
        dist(&[1.0, 0.0, 0.0]),
    ];
    let mixed = vec![p[0].clone(), point[1].clone(), p[2].clone()];
    for q in [&p, &point, &mixed] {
        let law = chain_law(&p, 4);
        for g in [1, 2, 3] {
            let gap = max_gap(&generated(Rule::Block, &p, q, g, 4), &law);
            assert!(gap < 1e-6, "γ {g}: {gap}");
        }
    }
    let kept = expected_kept(Rule::Block, &p, &p, 3);
    assert!((kept - 3.0).abs() < 1e-6, "q = p keeps everything: {kept}");
}

/// The same property through `accept_block` and the real random stream: 3-token
/// sequences from rounds of γ = 2 are distributed as the target chain.
#[test]
fn sampled_block_rounds_reproduce_the_target_sequence_distribution() {
    let params = SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: 1.0,
        seed: 0,
    };
    let (p, q) = chains(&params);
    let (mut draws, mut rng) = (sampler(11), sampler(12));
    let n = 200_000;
    let mut counts: HashMap<Vec<u32>, f64> = HashMap::new();
    for _ in 0..n {
        let mut seq: Vec<u32> = Vec::new();
        while seq.len() < 3 {
            let prev = *seq.last().unwrap_or(&0);
            let (mut draft, mut qs, mut ps) =
                (Vec::new(), Vec::new(), vec![p[prev as usize].clone()]);
            let mut last = prev;
            for _ in 0..2 {
                qs.push(q[last as usize].clone());
                last = qs[qs.len() - 1].draw(draws.uniform());
                draft.push(last);
                ps.push(p[last as usize].clone());
            }
            let v = accept_block(&draft, &qs, |i| ps[i].clone(), &mut rng);
            seq.extend(v.emitted(&draft));
        }
        seq.truncate(3);
        *counts.entry(seq).or_default() += 1.0 / n as f64;
    }
    let law = chain_law(&p, 3);
    let gap = max_gap(&counts, &law);
    assert!(gap < 0.004, "largest gap {gap}");
    assert!(
        max_gap(&chain_law(&q, 3), &law) > 10.0 * gap,
        "the draft's own law is far"
    );
}

#[test]
fn a_draft_equal_to_the_target_is_kept_whole() {
    let p = dist(&[0.5, 0.25, 0.25]);
    let mut rng = sampler(4);
    for _ in 0..200 {
        let v = accept_block(&[0, 2, 1], &vec![p.clone(); 3], |_| p.clone(), &mut rng);
        assert_eq!(v.accepted, 3);
    }
}

proptest! {
    #[test]
    fn block_rounds_emit_a_draft_prefix_then_a_target_token_and_keep_at_least_token_wise_on_average(
        gamma in 1usize..5, seed in any::<u64>(),
        w in proptest::collection::vec(proptest::collection::vec(0.0f64..1.0, 4), 11),
    ) {
        let ds: Vec<SparseDist> = w.iter().map(|x| { let mut x = x.clone(); x[0] += 0.01; dist(&x) }).collect();
        let (q, p) = (&ds[..gamma], &ds[5..5 + gamma + 1]);
        let mut draws = sampler(seed);
        let draft: Vec<u32> = q.iter().map(|d| d.draw(draws.uniform())).collect();
        let asked = std::sync::Mutex::new(Vec::new());
        let v = accept_block(&draft, q, |i| { asked.lock().expect("lock").push(i); p[i].clone() }, &mut sampler(seed ^ 1));
        let mut asked = asked.into_inner().expect("lock");
        asked.sort_unstable();
        prop_assert_eq!(asked, (0..=gamma).collect::<Vec<_>>(), "every position once");
        let out = v.emitted(&draft);
        prop_assert!(v.accepted <= gamma && out.len() == v.accepted + 1);
        prop_assert!(p[v.accepted].prob(v.next) > 0.0, "the last token comes from the target");
        prop_assert_eq!(accept_block(&draft, q, |i| p[i].clone(), &mut sampler(seed ^ 1)), v);
        let plan = BlockPlan::new(&draft, q, p);
        prop_assert!(plan.stops.iter().all(|h| (0.0..=1.0).contains(h)));
        prop_assert!(plan.weights.iter().all(|w| (0.0..=1.0).contains(w)));
        let e = plan.expected();
        let kept = |rule| outcomes(rule, &draft, q, p).iter().map(|(t, pt, _)| *t as f64 * pt).sum::<f64>();
        prop_assert!((e.token - kept(Rule::Token)).abs() < 1e-9, "{e:?}");
        prop_assert!((e.block - kept(Rule::Block)).abs() < 1e-9, "{e:?}");
        // The first weight is the token-wise acceptance ratio of the first draft.
        let token_first = (p[0].prob(draft[0]) as f64 / q[0].prob(draft[0]) as f64).min(1.0);
        prop_assert!((plan.weights[1] - token_first).abs() < 1e-9);
    }

    #[test]
    fn token_wise_and_block_agree_on_a_one_token_block(
        seed in any::<u64>(),
        w in proptest::collection::vec(proptest::collection::vec(0.0f64..1.0, 4), 3),
    ) {
        let ds: Vec<SparseDist> = w.iter().map(|x| { let mut x = x.clone(); x[1] += 0.01; dist(&x) }).collect();
        let (q, p) = (&ds[..1], &ds[1..3]);
        let d = [q[0].draw(sampler(seed).uniform())];
        let block = accept_block(&d, q, |i| p[i].clone(), &mut sampler(seed ^ 7));
        let token = accept_sampled(&d, q, |i| p[i].clone(), &mut sampler(seed ^ 7));
        prop_assert_eq!(block, token, "γ = 1: h_1 = w_1 = min(1, p/q), the same draws");
    }
}
