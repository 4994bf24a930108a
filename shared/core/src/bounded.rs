//! A token drawn at a temperature from logits known through upper bounds, by rejection
//! sampling (von Neumann, 1951). The LM head's screen bounds every one of its 262,144
//! logits from 8-bit products (`tandem_kernels::ArgmaxScreen::upper_rows`), cheaper than
//! forming them in f32; a token proposed in proportion to `e^{u_j/T}` (`u_j ≥ z_j`, its
//! bound) is kept with probability `e^{(z_j − u_j)/T}`, from its one exact logit `z_j`, so
//! the tokens kept follow `softmax(z/T)`: the proposal times the keeping is `e^{z_j/T}` up
//! to one normaliser. Each try costs two uniforms and one exact logit; a try keeps its
//! token with probability `Σ e^{z/T} / Σ e^{u/T}`.
//!
//! The proposal's weights are [`tandem_kernels::softmax_weights`]'s (f32 exponentials of
//! f32 arguments, as [`crate::distribution`] makes them from exact logits); the keeping is
//! computed in f64 from the exact difference `z_j − u_j`.

/// Ids whose proposal weights are summed once, so that a proposal walks one block.
const BLOCK: usize = 4096;

/// Tries after which [`draw_bounded`] gives up: far beyond what bounds within a few
/// temperatures of their logits need (each try keeps its token with probability at least
/// `e^{−max(u − z)/T}`).
pub const MAX_TRIES: usize = 1024;

/// A token drawn from `softmax(z / temperature)`, where `upper[j] ≥ z[j]` for every id and
/// `logit(j)` gives `z[j]`; `uniform` gives numbers in [0, 1) (two a try). `None` when the
/// bounds give no proposal (a non-finite or empty row) or no try kept its token within
/// [`MAX_TRIES`]: the caller then draws from the exact row.
pub fn draw_bounded(
    upper: &[f32],
    temperature: f32,
    mut logit: impl FnMut(u32) -> f32,
    mut uniform: impl FnMut() -> f64,
) -> Option<u32> {
    let scale = 1.0 / temperature;
    let mut weights = Vec::new();
    let total = tandem_kernels::softmax_weights(upper, scale, &mut weights);
    if !(total.is_finite() && total > 0.0) {
        return None;
    }
    let sums: Vec<f64> = weights.chunks(BLOCK).map(lane_sum).collect();
    for _ in 0..MAX_TRIES {
        let j = propose(&weights, &sums, uniform() * total)?;
        let kept = ((f64::from(logit(j)) - f64::from(upper[j as usize])) * f64::from(scale)).exp();
        // A NaN logit keeps its token.
        if kept.is_nan() || uniform() < kept {
            return Some(j);
        }
    }
    None
}

/// The sum of `w` in f64, over eight running lanes (one sequential sum of 262,144 weights is
/// bound by the latency of its additions: a tenth of a draw's time). A proposal's walk sums
/// in id order, so the two may part in the last bits; a walk that rounding carries past its
/// block goes on into the next one.
fn lane_sum(w: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = w.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| f64::from(x)).sum();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f64::from(x);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// The first id whose cumulative weight (in id order) passes `target`; where rounding
/// leaves `target` past the total, the last id with a non-zero weight.
fn propose(weights: &[f32], sums: &[f64], target: f64) -> Option<u32> {
    let mut acc = 0f64;
    let mut last = None;
    for (b, &sum) in sums.iter().enumerate() {
        if sum > 0.0 {
            last = Some(b);
        }
        if acc + sum <= target {
            acc += sum;
            continue;
        }
        for (i, &w) in weights[b * BLOCK..].iter().take(BLOCK).enumerate() {
            acc += f64::from(w);
            if target < acc && w > 0.0 {
                return Some((b * BLOCK + i) as u32);
            }
        }
    }
    let b = last?;
    let block = &weights[b * BLOCK..(b * BLOCK + BLOCK).min(weights.len())];
    let i = block.iter().rposition(|&w| w > 0.0)?;
    Some((b * BLOCK + i) as u32)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    use super::*;

    /// Logits, their bounds (each at most `slack` above) and the softmax at `t`.
    fn case(n: usize, slack: f32, t: f32, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let z: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 6.0 - 3.0).collect();
        let upper: Vec<f32> = z.iter().map(|z| z + rng.random::<f32>() * slack).collect();
        let w: Vec<f64> = z
            .iter()
            .map(|&z| (f64::from(z) / f64::from(t)).exp())
            .collect();
        let sum: f64 = w.iter().sum();
        (z, upper, w.iter().map(|w| w / sum).collect())
    }

    /// The tokens drawn follow `softmax(z / T)`: over 200,000 draws, every id's share
    /// lies within 5 standard deviations of its probability, with bounds far from the
    /// logits (most tries rejected) and with exact ones.
    #[test]
    fn draws_follow_the_exact_softmax() {
        for (slack, t, seed) in [(0.0, 0.7, 1), (1.5, 0.7, 2), (4.0, 1.0, 3), (0.3, 0.2, 4)] {
            let (z, upper, p) = case(7, slack, t, seed);
            let mut rng = ChaCha20Rng::seed_from_u64(seed + 100);
            let draws = 200_000;
            let mut counts = vec![0usize; z.len()];
            for _ in 0..draws {
                let j = draw_bounded(&upper, t, |j| z[j as usize], || rng.random::<f64>());
                counts[j.expect("a token") as usize] += 1;
            }
            for (j, (&c, &p)) in counts.iter().zip(&p).enumerate() {
                let share = c as f64 / draws as f64;
                let sd = (p * (1.0 - p) / draws as f64).sqrt();
                assert!(
                    (share - p).abs() <= 5.0 * sd + 1e-9,
                    "slack {slack}, T {t}: id {j} drawn {share:.5}, probability {p:.5}"
                );
            }
        }
    }

    /// A proposal walks whole blocks it passes and ids within one, skipping ids of zero
    /// weight, and rounding past the total gives the last id with a weight.
    #[test]
    fn proposals_are_the_cumulative_walk() {
        let mut weights = vec![0f32; 2 * BLOCK + 10];
        weights[3] = 1.0;
        weights[BLOCK + 5] = 2.0;
        weights[2 * BLOCK + 1] = 1.0;
        let sums: Vec<f64> = weights.chunks(BLOCK).map(lane_sum).collect();
        let at = |t| propose(&weights, &sums, t);
        assert_eq!(at(0.0), Some(3));
        assert_eq!(at(0.999), Some(3));
        assert_eq!(at(1.0), Some(BLOCK as u32 + 5));
        assert_eq!(at(2.5), Some(BLOCK as u32 + 5));
        assert_eq!(at(3.5), Some(2 * BLOCK as u32 + 1));
        assert_eq!(at(4.0), Some(2 * BLOCK as u32 + 1));
        assert_eq!(propose(&[0.0; 4], &[0.0], 0.0), None);
    }

    /// Rows without a proposal, and bounds no try can keep, give `None`; a NaN logit keeps
    /// its token.
    #[test]
    fn hopeless_rows_give_none() {
        let mut u = 0.0f64;
        let mut uniform = || {
            u = (u + 0.37) % 1.0;
            u
        };
        assert_eq!(draw_bounded(&[], 1.0, |_| 0.0, &mut uniform), None);
        assert_eq!(
            draw_bounded(&[f32::NAN, 1.0], 1.0, |_| 0.0, &mut uniform),
            None
        );
        assert_eq!(
            draw_bounded(&[f32::INFINITY, 1.0], 1.0, |_| 0.0, &mut uniform),
            None
        );
        assert_eq!(draw_bounded(&[0.0, 0.0], 0.5, |_| -1e4, &mut uniform), None);
        assert_eq!(
            draw_bounded(&[0.0], 0.5, |_| f32::NAN, &mut uniform),
            Some(0)
        );
    }

    proptest! {
        /// Every token drawn has a finite bound whose proposal weight is not zero.
        #[test]
        fn draws_have_weight(
            upper in proptest::collection::vec(-80.0f32..20.0, 1..50),
            t in 0.05f32..2.0,
            seed in any::<u64>(),
        ) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let z = upper.clone();
            let j = draw_bounded(&upper, t, |j| z[j as usize], || rng.random::<f64>());
            let j = j.expect("exact bounds keep the first proposal") as usize;
            let mut w = Vec::new();
            tandem_kernels::softmax_weights(&upper, 1.0 / t, &mut w);
            prop_assert!(w[j] > 0.0);
        }
    }
}
