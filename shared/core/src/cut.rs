//! Cutting a drafted block on its confidences (the block sizing of DSpark, arXiv 2607.05147,
//! with the cost model of [`crate::gamma`]). With calibrated confidences `c_k` (the
//! probability that token `k` is accepted given the tokens before it were), token `k`
//! survives with `S_k = Π_{j ≤ k} c_j`, and a round that keeps `L` tokens emits
//! `E(L) = 1 + Σ_{k ≤ L} S_k` tokens in expectation for a cost of
//! `fixed + slope · L` one-token forwards (`fixed`: the anchor's forward plus the draft
//! already spent; `slope`: what each verified token adds). The kept length maximises
//! `E(L) / cost(L)`: a token whose survival no longer pays for its verify row is not
//! verified, nor is anything after it.

/// The number of leading tokens of a block with calibrated confidences `confidences` worth
/// verifying, for a round whose fixed cost is `fixed` and whose verify cost grows by
/// `slope` per token (both in one-token forwards; `fixed` > 0). Ties keep the longer block.
pub fn cut_length(confidences: &[f32], fixed: f64, slope: f64) -> usize {
    let (mut best, mut best_rate) = (0, 1.0 / fixed);
    let (mut survival, mut expected) = (1.0f64, 1.0f64);
    for (k, c) in confidences.iter().enumerate() {
        survival *= (*c as f64).clamp(0.0, 1.0);
        expected += survival;
        let rate = expected / (fixed + slope * (k + 1) as f64);
        if rate >= best_rate {
            (best, best_rate) = (k + 1, rate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn sure_tokens_are_all_verified_and_doubtful_ones_are_cut() {
        assert_eq!(cut_length(&[1.0; 6], 1.2, 0.3), 6);
        assert_eq!(cut_length(&[0.9, 0.9, 0.05, 0.9], 1.2, 0.3), 2);
        assert_eq!(
            cut_length(&[0.1, 0.9], 1.0, 0.3),
            0,
            "0.1 does not pay for 0.3"
        );
        assert_eq!(
            cut_length(&[0.5, 0.5], 1.0, 0.0),
            2,
            "free rows are always worth it"
        );
        assert_eq!(cut_length(&[], 1.0, 0.3), 0);
    }

    #[test]
    fn a_dearer_round_verifies_more_of_the_same_block() {
        let block = [0.8, 0.6, 0.5, 0.4, 0.3];
        let cheap = cut_length(&block, 1.0, 0.3);
        let dear = cut_length(&block, 3.0, 0.3);
        assert!(dear > cheap, "{cheap} {dear}");
    }

    proptest! {
        #[test]
        fn the_kept_length_is_the_best_rate(
            c in proptest::collection::vec(0.0f32..1.0, 0..10),
            fixed in 0.5f64..4.0, slope in 0.0f64..1.5,
        ) {
            let l = cut_length(&c, fixed, slope);
            prop_assert!(l <= c.len());
            let rate = |n: usize| {
                let mut s = 1.0f64;
                let e = 1.0 + c[..n].iter().map(|x| { s *= *x as f64; s }).sum::<f64>();
                e / (fixed + slope * n as f64)
            };
            for n in 0..=c.len() {
                prop_assert!(rate(l) >= rate(n) - 1e-12, "{l} vs {n}");
            }
        }
    }
}
