//! A token drawn at a temperature from logits known through upper bounds, by rejection
//! sampling (von Neumann, 1951). The LM head's screen bounds every one of its 262,144
//! logits from 8-bit products (`tandem_kernels::ArgmaxScreen::upper_rows`), cheaper than
//! forming them in f32; a token proposed in proportion to `e^{u_j/T}` (`u_j ≥ z_j`, its
//! bound) is kept with probability `e^{(z_j − u_j)/T}`, from its one exact logit `z_j`, so
//! the tokens kept follow `softmax(z/T)`: the proposal times the keeping is `e^{z_j/T}` up
//! to one normaliser. Each try costs two uniforms and one exact logit; a try keeps its
//! token with probability `Σ e^{z/T} / Σ e^{u/T}`. Block sums are in f64 over eight lanes
//! ([`tandem_kernels::lane_sum`]); a proposal's walk sums in id order, so the two may part
//! in the last bits, and a walk that rounding carries past its block goes on into the next.
//!
//! A draw that has kept nothing after [`TRIES_BEFORE_HEAD`] tries goes on with the ids of
//! the highest bounds (at most [`HEAD`]) proposed with their exact weights and always kept:
//! any set may be, and without it a low temperature would keep almost no try (bounds
//! 1.1–1.6 logits above the logits make `e^{(z − u)/T}` about `e^{−13}` at T = 0.1), while
//! the ids that hold most of the mass have the highest bounds (a head id costs one uniform).
//! Every try's token, kept, follows the softmax, so a draw that changes its proposal midway
//! does too.
//!
//! The proposal's weights are [`tandem_kernels::softmax_weights`]'s (f32 exponentials of
//! f32 arguments, as [`crate::distribution`] makes them from exact logits); the keeping is
//! computed in f64 from the exact difference `z_j − u_j`.

/// Ids whose proposal weights are summed once, so that a proposal walks one block.
const BLOCK: usize = 4096;

/// Most ids proposed with their exact weights: those with the highest bounds.
pub const HEAD: usize = 32;

/// Logits below the highest bound within which ids may join the head.
const HEAD_SPAN: f32 = 4.0;

/// Tries made before the head gets its exact weights: at T = 0.7 on real rows a try keeps
/// its token 0.11–0.22 of the time, so most draws end sooner and never pay for the head;
/// at T = 0.1 none does, and these tries are what a draw pays for not knowing it.
const TRIES_BEFORE_HEAD: usize = 8;

/// Tries after which [`draw_bounded`] gives up: far beyond what bounds within a few
/// temperatures of their logits need (each try keeps its token with probability at least
/// `e^{−max(u − z)/T}`).
pub const MAX_TRIES: usize = 1024;

/// A token drawn from `softmax(z / temperature)`, where `upper[j] ≥ z[j]` for every id and
/// `logit(j)` gives `z[j]`; `uniform` gives numbers in [0, 1) (one or two a try). `None`
/// when the bounds give no proposal (a non-finite or empty row), a logit it needs is not
/// finite, or no try kept its token within [`MAX_TRIES`]: the caller then draws from the
/// exact row.
pub fn draw_bounded(
    upper: &[f32],
    temperature: f32,
    mut logit: impl FnMut(u32) -> f32,
    mut uniform: impl FnMut() -> f64,
) -> Option<u32> {
    Proposal::new(upper, temperature)?.draw(upper, &mut logit, &mut uniform)
}

/// A row's proposal for [`draw_bounded`], kept for several draws from the same row (a
/// residual's rejection sampler proposes from it again and again): the weights
/// `e^{(u − top)/T}` over `top`, the highest bound, their block sums, and the head's exact
/// weights once a draw has made them.
#[derive(Debug, Clone)]
pub struct Proposal {
    scale: f32,
    top: f32,
    weights: Vec<f32>,
    sums: Vec<f64>,
    total: f64,
    /// The bounds' weights summed, before any head got its exact weights.
    bound_total: f64,
    head: Option<Vec<u32>>,
}

impl Proposal {
    /// The proposal of `upper` at `temperature`; `None` where the bounds give none (an
    /// empty or non-finite row).
    pub fn new(upper: &[f32], temperature: f32) -> Option<Self> {
        let scale = 1.0 / temperature;
        let top = tandem_kernels::lane_max(upper);
        let mut weights = vec![0f32; upper.len()];
        // On the generation's own thread: a row of 262,144 takes 0.3–0.4 ms on this
        // project's Xeon, and the thread pool may be running a batched step.
        let sums: Vec<f64> = (weights.chunks_mut(BLOCK))
            .zip(upper.chunks(BLOCK))
            .map(|(w, u)| tandem_kernels::exp_weights(u, top, scale, w))
            .collect();
        let total: f64 = sums.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return None;
        }
        Some(Proposal {
            scale,
            top,
            weights,
            sums,
            total,
            bound_total: total,
            head: None,
        })
    }

    /// `1 / T`.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The highest bound, which every weight is relative to.
    pub fn top(&self) -> f32 {
        self.top
    }

    /// `Σ_j e^{(u_j − top)/T}` over every id, summed in f64 from the f32 weights.
    pub fn bound_total(&self) -> f64 {
        self.bound_total
    }

    /// One token drawn as [`draw_bounded`] draws it (`upper` must be the row this proposal
    /// was made from).
    pub fn draw(
        &mut self,
        upper: &[f32],
        logit: &mut impl FnMut(u32) -> f32,
        uniform: &mut impl FnMut() -> f64,
    ) -> Option<u32> {
        for t in 0..MAX_TRIES {
            if t == TRIES_BEFORE_HEAD && self.head.is_none() {
                self.make_head(upper, logit)?;
            }
            let j = propose(&self.weights, &self.sums, uniform() * self.total)?;
            if self
                .head
                .as_ref()
                .is_some_and(|h| h.binary_search(&j).is_ok())
            {
                return Some(j);
            }
            let z = logit(j);
            if !z.is_finite() {
                return None;
            }
            let gap = f64::from(z) - f64::from(upper[j as usize]);
            if uniform() < (gap * f64::from(self.scale)).exp() {
                return Some(j);
            }
        }
        None
    }

    /// Gives the head its exact weights ([`exact_head`]) and sums their blocks again.
    fn make_head(&mut self, upper: &[f32], logit: &mut impl FnMut(u32) -> f32) -> Option<()> {
        let head = exact_head(upper, self.scale, &mut self.weights, logit)?;
        for b in head.iter().map(|&j| j as usize / BLOCK) {
            let block = &self.weights[b * BLOCK..((b + 1) * BLOCK).min(self.weights.len())];
            self.sums[b] = tandem_kernels::lane_sum(block);
        }
        self.total = self.sums.iter().sum();
        self.head = Some(head);
        Some(())
    }
}

/// Gives the (at most [`HEAD`]) ids with the highest bounds, within [`HEAD_SPAN`] of the
/// highest, their exact weights on the proposal's scale (`e^{(z − top)/T}` where the others
/// are `e^{(u − top)/T}`, `top` the highest bound) and returns them, ascending; `None` for
/// a non-finite logit among them.
fn exact_head(
    upper: &[f32],
    scale: f32,
    weights: &mut [f32],
    logit: &mut impl FnMut(u32) -> f32,
) -> Option<Vec<u32>> {
    let top = tandem_kernels::lane_max(upper);
    // Bounds within `HEAD_SPAN` of the highest: where few are, the ids below weigh little
    // (at most e^{−HEAD_SPAN/T} of the top each) and are kept by their tries.
    let mut near: Vec<(f32, u32)> = (ids_at_or_above(upper, top - HEAD_SPAN).into_iter())
        .map(|j| (upper[j as usize], j))
        .collect();
    if near.len() > HEAD {
        near.select_nth_unstable_by(HEAD - 1, |a, b| b.0.total_cmp(&a.0));
        near.truncate(HEAD);
    }
    let mut ids: Vec<u32> = near.into_iter().map(|(_, j)| j).collect();
    ids.sort_unstable();
    for &j in &ids {
        let z = logit(j);
        if !z.is_finite() {
            return None;
        }
        weights[j as usize] = tandem_kernels::exp((z - top) * scale);
    }
    Some(ids)
}

/// The ids whose bounds are at or above `floor`, ascending.
pub(crate) fn ids_at_or_above(upper: &[f32], floor: f32) -> Vec<u32> {
    let mut ids = Vec::new();
    for (c, chunk) in upper.chunks(16).enumerate() {
        // Most chunks hold no such id: one comparison of sixteen lanes rules them out.
        if chunk.iter().fold(false, |any, &u| any | (u >= floor)) {
            let at = (c * 16) as u32..;
            ids.extend(
                chunk
                    .iter()
                    .zip(at)
                    .filter(|(u, _)| **u >= floor)
                    .map(|p| p.1),
            );
        }
    }
    ids
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
    /// logits (most tries outside the head rejected) and with exact ones, from rows of a
    /// few ids (all in the head) and of more than the head holds, down to T = 0.05 with
    /// bounds 30 temperatures above the logits, where no draw gives up.
    #[test]
    fn draws_follow_the_exact_softmax() {
        let cases = [
            (7, 1.5, 0.7, 1),
            (100, 0.0, 0.7, 1),
            (100, 1.5, 0.7, 2),
            (100, 4.0, 1.0, 3),
            (100, 0.3, 0.2, 4),
            (100, 1.5, 0.05, 5),
        ];
        for (n, slack, t, seed) in cases {
            let (z, upper, p) = case(n, slack, t, seed);
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
                // Five draws of slack for ids too unlikely for the normal approximation.
                assert!(
                    (share - p).abs() <= 5.0 * sd + 5.0 / draws as f64,
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
        let sums: Vec<f64> = weights
            .chunks(BLOCK)
            .map(tandem_kernels::lane_sum)
            .collect();
        let at = |t| propose(&weights, &sums, t);
        assert_eq!(at(0.0), Some(3));
        assert_eq!(at(0.999), Some(3));
        assert_eq!(at(1.0), Some(BLOCK as u32 + 5));
        assert_eq!(at(2.5), Some(BLOCK as u32 + 5));
        assert_eq!(at(3.5), Some(2 * BLOCK as u32 + 1));
        assert_eq!(at(4.0), Some(2 * BLOCK as u32 + 1));
        assert_eq!(propose(&[0.0; 4], &[0.0], 0.0), None);
    }

    /// Rows without a proposal, a logit that is not finite and bounds no try beyond the
    /// head can keep give `None`; the head, once made, is kept.
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
        // Beyond the head, bounds far above their logits keep no try.
        let far = vec![0.0; HEAD + 8];
        assert_eq!(draw_bounded(&far, 0.5, |_| -1e4, &mut uniform), None);
        // After the first tries the head is kept whatever its bounds.
        assert_eq!(draw_bounded(&[0.0], 0.5, |_| -1e4, &mut uniform), Some(0));
        // A logit that is not finite gives up.
        assert_eq!(draw_bounded(&[0.0], 0.5, |_| f32::NAN, &mut uniform), None);
        assert_eq!(
            draw_bounded(&far, 0.5, |_| f32::INFINITY, &mut uniform),
            None
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
