//! Token-wise verification from rows whose logits are known through upper bounds
//! ([`crate::bounded`]): a sampled round's rows cost the LM head's 8-bit screen instead of
//! every logit in f32. Rejection sampling (Leviathan et al., 2023; Chen et al., 2023)
//! asks three things of a row, and none needs the whole row:
//!
//! - *Is `p(x) > t`?* (the draft token `x` is kept when `u·q(x) < p(x)`). With
//!   `p(x) = e^{z_x/T} / Z`, the ids `S` formed exactly so far and the bounds of the rest
//!   bracket the normaliser: `Σ_S e^{z/T} ≤ Z ≤ Σ_S e^{z/T} + Σ_{∉S} e^{u/T}`. Most
//!   questions are settled by that bracket; an unsettled one forms more ids exactly, those
//!   of the highest bounds first, and past [`MAX_EXACT`] ids the whole row.
//! - *A draw from `p`*: [`crate::bounded::Proposal`]'s rejection sampler.
//! - *A draw from `norm(max(p − q, 0))`* after a rejection: proposals `y ~ p`, each kept
//!   when `v·p(y) < p(y) − q(y)`, i.e. `p(y) > q(y) / (1 − v)` (always where `q(y) = 0`):
//!   the kept tokens follow the residual exactly, one kept in `1 / Σ max(p − q, 0)` tries
//!   on average; past [`MAX_RESIDUAL_TRIES`] the whole row is formed.
//!
//! Every answer is the exact rule's (to the rounding of sums in f64); what the bounds save
//! is only the work. A row's draws take their uniforms from a stream keyed by the one
//! uniform the rule hands over ([`crate::keyed_uniform`]), so a round is reproducible from
//! its seed; the tokens drawn are not the inverse-distribution draws of the same uniform,
//! so these rows serve the token-wise rule, not the seeded one.

use crate::acceptance::{keyed_uniform, weighted_residual};
use crate::bounded::{ids_at_or_above, Proposal};
use crate::rows::TargetRows;
use crate::sampling::{distribution, SamplingParams, SparseDist};

/// Most ids formed exactly to settle a row's questions before its whole row is formed
/// (one id costs a chain of `hidden` FMAs; the whole row the full head's product).
pub const MAX_EXACT: usize = 4096;

/// Proposals a residual draw makes before it forms the whole row (a residual of mass `r`
/// keeps one in `1 / r`: 64 tries fail alone where `r` is below a few hundredths).
pub const MAX_RESIDUAL_TRIES: usize = 64;

/// Bound weight, relative to the highest, above which ids are formed exactly first; each
/// widening divides it by [`WIDEN`].
const FIRST_FLOOR: f32 = 1e-2;

/// The factor by which each widening lowers the floor.
const WIDEN: f32 = 16.0;

/// Relative slack on the bounds' summed weights: each f32 weight is within `2.4e-7·(1 +
/// |argument|)` of its exponential, and arguments beyond −87 underflow to 0 (`ABSOLUTE`).
const RELATIVE: f64 = 1e-4;
/// Absolute slack on the summed weights (of the highest's scale) for those that underflow.
const ABSOLUTE: f64 = 1e-30;

/// One position's logits through bounds: what [`BoundedRows`] reads of a row.
pub trait BoundedLogits {
    /// Per id, a value never below its logit.
    fn upper(&self) -> &[f32];
    /// The exact logits of `ids`, in order (non-finite where one cannot be formed).
    fn logits_of(&self, ids: &[u32]) -> Vec<f32>;
    /// Every logit exactly (`None` where the row cannot be formed).
    fn logits(&self) -> Option<Vec<f32>>;
}

/// What one row has formed so far.
struct RowState {
    proposal: Option<Proposal>,
    /// Ids formed exactly, ascending, with `e^{(z − top)/T}`.
    exact: Vec<(u32, f64)>,
    /// `Σ_S e^{(z − top)/T}`.
    exact_sum: f64,
    /// `Σ_S e^{(u − top)/T}`, the bounds' weights of the same ids.
    exact_bounds: f64,
    /// Ids with bound weights at or above this are in `exact` (∞ before the first
    /// widening).
    floor: f32,
    /// The whole row's distribution, once formed.
    full: Option<SparseDist>,
}

/// A round's rows through bounds, for the token-wise rule ([`crate::accept_sampled_rows`]).
pub struct BoundedRows<'a, R> {
    rows: &'a [R],
    params: SamplingParams,
    current: Option<(usize, RowState)>,
    /// Ids formed exactly over the round (for tests and reports).
    formed: usize,
    /// Rows formed whole over the round.
    whole: usize,
}

impl<'a, R: BoundedLogits> BoundedRows<'a, R> {
    /// `rows` (position order) sampled with `params`, which must sample at a temperature
    /// alone ([`SamplingParams::temperature_alone`]: the bounds know nothing of top-k or
    /// top-p).
    pub fn new(rows: &'a [R], params: SamplingParams) -> Self {
        BoundedRows {
            rows,
            params,
            current: None,
            formed: 0,
            whole: 0,
        }
    }

    /// Ids formed exactly so far, and rows formed whole.
    pub fn work(&self) -> (usize, usize) {
        (self.formed, self.whole)
    }

    /// Position `row`'s state (a new one when the rule moves on).
    fn state(&mut self, row: usize) -> &mut RowState {
        if self.current.as_ref().map(|c| c.0) != Some(row) {
            let proposal = Proposal::new(self.rows[row].upper(), self.params.temperature);
            let state = RowState {
                proposal,
                exact: Vec::new(),
                exact_sum: 0.0,
                exact_bounds: 0.0,
                floor: f32::INFINITY,
                full: None,
            };
            self.current = Some((row, state));
        }
        &mut self.current.as_mut().expect("just made").1
    }

    /// The whole row's distribution, formed once; `None` where it cannot be.
    fn full(&mut self, row: usize) -> Option<&SparseDist> {
        if self.state(row).full.is_none() {
            let logits = self.rows[row].logits()?;
            self.whole += 1;
            let dist = distribution(&logits, &self.params);
            self.state(row).full = Some(dist);
        }
        self.state(row).full.as_ref()
    }

    /// Forms exactly `ids` of `row` (or, for `None`, those whose bound weights reach the
    /// next floor down) and adds them to its bracket; `false` where it may form no more
    /// ([`MAX_EXACT`]), the floor is spent or the row has no proposal.
    fn widen(&mut self, row: usize, ids: Option<&[u32]>) -> bool {
        let upper = self.rows[row].upper();
        let state = self.state(row);
        let Some(p) = state.proposal.as_ref() else {
            return false;
        };
        let (top, scale) = (p.top(), p.scale());
        let fresh: Vec<u32> = match ids {
            Some(ids) => ids.to_vec(),
            None if state.floor < f32::MIN_POSITIVE => return false,
            None => {
                state.floor = match state.floor.is_finite() {
                    true => state.floor / WIDEN,
                    false => FIRST_FLOOR,
                };
                ids_at_or_above(upper, top + state.floor.ln() / scale)
            }
        };
        let fresh: Vec<u32> = (fresh.into_iter())
            .filter(|j| state.exact.binary_search_by_key(j, |e| e.0).is_err())
            .collect();
        if state.exact.len() + fresh.len() > MAX_EXACT {
            return false;
        }
        let logits = self.rows[row].logits_of(&fresh);
        self.formed += fresh.len();
        let state = self.state(row);
        for (&j, &z) in fresh.iter().zip(&logits) {
            let w = ((f64::from(z) - f64::from(top)) * f64::from(scale)).exp();
            let bound = tandem_kernels::exp((upper[j as usize] - top) * scale);
            state.exact_sum += w;
            state.exact_bounds += f64::from(bound);
            state.exact.push((j, w));
        }
        state.exact.sort_unstable_by_key(|e| e.0);
        true
    }

    /// Whether `p(id) > t` at `row`, from the bracket where it settles the question.
    fn settles(&mut self, row: usize, id: u32, t: f64) -> Option<bool> {
        let state = self.state(row);
        let p = state.proposal.as_ref()?;
        let i = state.exact.binary_search_by_key(&id, |e| e.0).ok()?;
        let e = state.exact[i].1;
        let tail = (p.bound_total() - state.exact_bounds).max(0.0) * (1.0 + RELATIVE)
            + ABSOLUTE * p.bound_total().max(1.0);
        if e > t * (state.exact_sum + tail) {
            return Some(true);
        }
        if e <= t * state.exact_sum {
            return Some(false);
        }
        None
    }
}

impl<R: BoundedLogits> TargetRows for BoundedRows<'_, R> {
    fn prob(&mut self, row: usize, id: u32) -> f64 {
        self.full(row).map_or(0.0, |d| f64::from(d.prob(id)))
    }

    fn exceeds(&mut self, row: usize, id: u32, t: f64) -> bool {
        if t >= 1.0 {
            return false;
        }
        if self.state(row).full.is_none() && self.widen(row, Some(&[id])) {
            loop {
                if let Some(answer) = self.settles(row, id, t) {
                    return answer;
                }
                if !self.widen(row, None) {
                    break;
                }
            }
        }
        self.prob(row, id) > t
    }

    fn draw(&mut self, row: usize, u: f64) -> u32 {
        let mut stream = Stream::new(u);
        self.draw_from(row, &mut stream)
            .unwrap_or_else(|| self.full(row).map_or(0, |d| d.draw(stream.next())))
    }

    fn draw_residual(&mut self, row: usize, q: &SparseDist, u: f64) -> u32 {
        let mut stream = Stream::new(u);
        for _ in 0..MAX_RESIDUAL_TRIES {
            let Some(y) = self.draw_from(row, &mut stream) else {
                break;
            };
            let qy = f64::from(q.prob(y));
            if qy <= 0.0 || self.exceeds(row, y, qy / (1.0 - stream.next())) {
                return y;
            }
        }
        let v = stream.next();
        self.full(row)
            .map_or(0, |p| weighted_residual(p, 1.0, q).0.draw(v))
    }
}

impl<R: BoundedLogits> BoundedRows<'_, R> {
    /// A draw from `row`'s proposal with `stream`'s uniforms; `None` where it gives none.
    fn draw_from(&mut self, row: usize, stream: &mut Stream) -> Option<u32> {
        let source = &self.rows[row];
        let upper = source.upper();
        let mut formed = 0;
        let mut logit = |j: u32| {
            formed += 1;
            source.logits_of(&[j]).first().copied().unwrap_or(f32::NAN)
        };
        let state = self.state(row);
        let drawn = (state.proposal.as_mut())
            .and_then(|p| p.draw(upper, &mut logit, &mut || stream.next()));
        self.formed += formed;
        drawn
    }
}

/// Uniforms keyed by one uniform: [`keyed_uniform`] of its bits and a counter.
struct Stream {
    key: u64,
    next: u64,
}

impl Stream {
    fn new(u: f64) -> Self {
        Stream {
            key: u.to_bits(),
            next: 0,
        }
    }

    fn next(&mut self) -> f64 {
        self.next += 1;
        keyed_uniform(self.key, self.next)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    use super::*;
    use crate::acceptance::accept_sampled_rows;
    use crate::sampling::Sampler;

    /// A row of logits and bounds at most `slack` above them.
    struct Row {
        z: Vec<f32>,
        upper: Vec<f32>,
    }

    impl BoundedLogits for Row {
        fn upper(&self) -> &[f32] {
            &self.upper
        }
        fn logits_of(&self, ids: &[u32]) -> Vec<f32> {
            ids.iter().map(|&j| self.z[j as usize]).collect()
        }
        fn logits(&self) -> Option<Vec<f32>> {
            Some(self.z.clone())
        }
    }

    fn row(n: usize, spread: f32, slack: f32, rng: &mut ChaCha20Rng) -> Row {
        let z: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * spread).collect();
        let upper = z.iter().map(|z| z + rng.random::<f32>() * slack).collect();
        Row { z, upper }
    }

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    /// The exact softmax of `z` at `t`, in f64.
    fn softmax(z: &[f32], t: f32) -> Vec<f64> {
        let max = z.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let w: Vec<f64> = (z.iter())
            .map(|&v| (f64::from(v - max) / f64::from(t)).exp())
            .collect();
        let sum: f64 = w.iter().sum();
        w.iter().map(|w| w / sum).collect()
    }

    /// `exceeds` answers as the exact probability does, on rows settled by the bracket
    /// (narrow bounds, a peaked row) and on rows that need the whole row (wide bounds over
    /// more ids than [`MAX_EXACT`], flat logits).
    #[test]
    fn exceeds_answers_as_the_exact_probability() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        for (n, spread, slack, t) in [(300, 30.0, 0.5, 0.7), (6000, 2.0, 3.0, 1.0)] {
            let rows = [row(n, spread, slack, &mut rng)];
            let p = softmax(&rows[0].z, t);
            let mut bounded = BoundedRows::new(&rows, params(t));
            for _ in 0..400 {
                let id = rng.random_range(0..n as u32);
                let at = p[id as usize] * rng.random_range(0.5..1.5);
                if (at - p[id as usize]).abs() < 1e-9 {
                    continue;
                }
                assert_eq!(bounded.exceeds(0, id, at), p[id as usize] > at, "id {id}");
            }
            let (formed, whole) = bounded.work();
            match n > MAX_EXACT {
                true => assert_eq!(whole, 1, "the wide row is formed whole once"),
                false => assert!(whole == 0 && formed < n, "{formed} of {n} formed"),
            }
        }
    }

    /// Token-wise verification through bounded rows is lossless: over 100,000 rounds of
    /// one drafted token, the first emitted token follows the target's softmax and the
    /// draft is kept as often as `Σ min(p, q)` says, on rows the bracket settles and rows
    /// formed whole.
    #[test]
    fn verdicts_follow_the_target() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        for (n, spread, slack, t) in [(40, 6.0, 1.5, 0.7), (5000, 1.5, 2.0, 1.0)] {
            let rows = [
                row(n, spread, slack, &mut rng),
                row(n, spread, slack, &mut rng),
            ];
            let p = softmax(&rows[0].z, t);
            let noisy: Vec<f32> = (rows[0].z.iter())
                .map(|z| z + rng.random::<f32>() * 2.0)
                .collect();
            let q = distribution(&noisy, &params(t));
            let mut sampler = Sampler::new(params(t)).expect("sampler");
            let (draws, mut kept) = (100_000, 0usize);
            let mut counts = vec![0usize; n];
            for _ in 0..draws {
                let x = q.draw(rng.random::<f64>());
                let mut bounded = BoundedRows::new(&rows, params(t));
                let v =
                    accept_sampled_rows(&[x], std::slice::from_ref(&q), &mut bounded, &mut sampler);
                let first = match v.accepted {
                    1 => x,
                    _ => v.next,
                };
                kept += v.accepted;
                counts[first as usize] += 1;
            }
            let overlap: f64 = (0..n).map(|j| p[j].min(f64::from(q.prob(j as u32)))).sum();
            let rate = kept as f64 / draws as f64;
            let sd = (overlap * (1.0 - overlap) / draws as f64).sqrt();
            assert!(
                (rate - overlap).abs() < 5.0 * sd,
                "kept {rate}, Σ min {overlap}"
            );
            for (j, (&c, &p)) in counts.iter().zip(&p).enumerate() {
                let share = c as f64 / draws as f64;
                let sd = (p * (1.0 - p) / draws as f64).sqrt();
                assert!(
                    (share - p).abs() <= 5.0 * sd + 5.0 / draws as f64,
                    "n {n}: id {j} emitted {share:.5}, probability {p:.5}"
                );
            }
        }
    }

    /// A row without a proposal (non-finite bounds) is drawn from whole.
    #[test]
    fn rows_without_a_proposal_are_formed_whole() {
        let rows = [Row {
            z: vec![0.0, 5.0],
            upper: vec![f32::NAN, 5.0],
        }];
        let mut bounded = BoundedRows::new(&rows, params(0.5));
        assert!(bounded.exceeds(0, 1, 0.5));
        assert_eq!(bounded.draw(0, 0.3), 1);
        assert_eq!(bounded.work().1, 1);
    }
}
