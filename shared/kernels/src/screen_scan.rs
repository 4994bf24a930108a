//! The candidates of [`crate::ArgmaxScreen`], gathered while the screen's
//! scores stream past rather than from a stored row of scores.
//!
//! For an activation row with bound `K` (the module docs of `screen.rs`),
//! output `j` with score `s_j` and row norm `‖w_j‖` has the lower bound
//! `l_j = s_j − ‖w_j‖·K` and the upper bound `h_j = s_j + ‖w_j‖·K` (f32).
//! With `T` the `top`-th largest `l_j` of the whole row and `H` the largest
//! `|s_j|`, the candidates are `{j : h_j ≥ T − slack(H)}`, where
//! [`slack`] covers the f32 rounding of those sums.
//!
//! A [`Collector`] sees one range of a row's outputs in order. It keeps the
//! `top` largest lower bounds seen so far (their smallest is its *floor*)
//! and every output whose upper bound reaches `floor − slack(Ĥ)`, with
//! `Ĥ ≥ H` known before any score ([`crate::screen`]'s `QuantRow`). The
//! floor only rises and never exceeds `T`, and `slack(Ĥ) ≥ slack(H)`, so
//! what it keeps is a superset of the row's candidates in its range; it
//! drops what its risen floor rules out once it holds many. [`merge`] finds
//! `T` and `H` from the collectors of all ranges and keeps exactly the
//! candidates — the set a pass over the whole stored row would give.

use crate::lanes::LANES;

/// Kept outputs beyond which a collector drops those its floor rules out.
const PRUNE_AT: usize = 256;

/// Rounding slack of the candidates' test for a row whose largest `|s_j|`
/// is `highest`: each of the f32 sums rounds by at most 2⁻²⁴ of `highest +
/// max_norm · bound`; 1e-30 covers products and scales that underflow.
pub(crate) fn slack(highest: f32, max_norm: f32, bound: f32) -> f32 {
    1e-6 * (highest + max_norm * bound) + 1e-30
}

/// What a row's candidates depend on besides its scores.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowBound {
    /// How many largest outputs are wanted (≥ 1).
    pub(crate) top: usize,
    /// `K`: output `j` lies within `norms[j] · K` of its score.
    pub(crate) bound: f32,
    /// The largest row norm of the matrix.
    pub(crate) max_norm: f32,
    /// `Ĥ`: no score of the row exceeds it in magnitude.
    pub(crate) highest: f32,
}

/// One row's candidates over one range of outputs (module docs).
#[derive(Debug, Clone)]
pub(crate) struct Collector {
    row: RowBound,
    /// `slack(Ĥ)`.
    early_slack: f32,
    /// The largest lower bounds seen, ascending, at most `top`.
    best: Vec<f32>,
    /// The largest `|s_j|` seen, per lane.
    highest: [f32; LANES],
    /// Outputs that may be candidates, ascending, with their upper bounds.
    kept: Vec<(u32, f32)>,
}

impl Collector {
    pub(crate) fn new(row: RowBound) -> Self {
        Collector {
            early_slack: slack(row.highest, row.max_norm, row.bound),
            row,
            best: Vec::with_capacity(row.top + 1),
            highest: [0.0; LANES],
            kept: Vec::new(),
        }
    }

    /// The smallest of the `top` largest lower bounds seen (−∞ before `top`).
    fn floor(&self) -> f32 {
        match self.best.len() < self.row.top {
            true => f32::NEG_INFINITY,
            false => self.best[0],
        }
    }

    /// Takes the scores `s` of outputs `col0..col0 + s.len()`, after every
    /// output before them in this collector's range; `norms` are theirs.
    #[inline(always)]
    pub(crate) fn push(&mut self, col0: usize, s: &[f32], norms: &[f32]) {
        let (chunks, norm_chunks) = (s.chunks_exact(LANES), norms.chunks_exact(LANES));
        let (rest, rest_norms) = (chunks.remainder(), norm_chunks.remainder());
        let mut at = col0;
        for (s, norms) in chunks.zip(norm_chunks) {
            let (Ok(s), Ok(norms)) = (s.try_into(), norms.try_into()) else {
                unreachable!("chunks of LANES")
            };
            self.push_chunk(at, s, norms, LANES);
            at += LANES;
        }
        if !rest.is_empty() {
            let (mut s, mut n) = ([0f32; LANES], [0f32; LANES]);
            s[..rest.len()].copy_from_slice(rest);
            n[..rest.len()].copy_from_slice(rest_norms);
            self.push_chunk(at, &s, &n, rest.len());
        }
        if self.kept.len() > PRUNE_AT.max(4 * self.row.top) {
            let keep = self.floor() - self.early_slack;
            self.kept.retain(|&(_, high)| high >= keep);
        }
    }

    /// [`Collector::push`] of the first `len` of sixteen outputs (the others
    /// are zeros: they raise no magnitude and are neither inserted nor
    /// kept), in fixed-width loops the compiler vectorizes; a chunk none of
    /// whose lower bounds beats the floor leaves the best ones alone.
    #[inline(always)]
    fn push_chunk(&mut self, col0: usize, s: &[f32; LANES], norms: &[f32; LANES], len: usize) {
        let (mut low, mut high) = ([0f32; LANES], [0f32; LANES]);
        let floor = self.floor();
        let mut beats = false;
        for i in 0..LANES {
            let b = norms[i] * self.row.bound;
            low[i] = s[i] - b;
            high[i] = s[i] + b;
            beats |= low[i] > floor;
            let a = s[i].abs();
            self.highest[i] = if a > self.highest[i] {
                a
            } else {
                self.highest[i]
            };
        }
        if beats {
            for &v in &low[..len] {
                self.insert(v);
            }
        }
        let keep = self.floor() - self.early_slack;
        let mut hits = 0u32;
        for (i, &h) in high.iter().enumerate() {
            hits |= u32::from(h >= keep) << i;
        }
        hits &= (1u32 << len) - 1;
        while hits != 0 {
            let i = hits.trailing_zeros() as usize;
            self.kept.push(((col0 + i) as u32, high[i]));
            hits &= hits - 1;
        }
    }

    /// Adds lower bound `v` to the best ones if it ranks among them.
    fn insert(&mut self, v: f32) {
        if self.best.len() < self.row.top || v > self.best[0] {
            let at = self.best.partition_point(|&x| x < v);
            self.best.insert(at, v);
            if self.best.len() > self.row.top {
                self.best.remove(0);
            }
        }
    }
}

/// The candidates of one row, ascending, from the collectors of its ranges
/// in output order (module docs).
pub(crate) fn merge(parts: Vec<Collector>) -> Vec<usize> {
    let Some(first) = parts.first() else {
        return Vec::new();
    };
    let row = first.row;
    let mut best: Vec<f32> = parts.iter().flat_map(|c| c.best.iter().copied()).collect();
    best.sort_unstable_by(|a, b| b.total_cmp(a));
    let highest = parts
        .iter()
        .flat_map(|c| c.highest)
        .fold(0f32, |m, v| m.max(v));
    let floor = match best.get(row.top - 1) {
        Some(&t) => t - slack(highest, row.max_norm, row.bound),
        None => f32::NEG_INFINITY,
    };
    parts
        .iter()
        .flat_map(|c| &c.kept)
        .filter(|&&(_, high)| high >= floor)
        .map(|&(j, _)| j as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: the `top`-th largest lower bound and the largest
    /// magnitude of the whole stored row, then one pass over it.
    fn reference(s: &[f32], norms: &[f32], row: RowBound) -> Vec<usize> {
        let mut low: Vec<f32> = s
            .iter()
            .zip(norms)
            .map(|(s, n)| s - n * row.bound)
            .collect();
        low.sort_unstable_by(|a, b| b.total_cmp(a));
        let highest = s.iter().fold(0f32, |m, v| m.max(v.abs()));
        let floor = match low.get(row.top - 1) {
            Some(&t) => t - slack(highest, row.max_norm, row.bound),
            None => f32::NEG_INFINITY,
        };
        (0..s.len())
            .filter(|&j| s[j] + norms[j] * row.bound >= floor)
            .collect()
    }

    proptest! {
        /// Any split of a row into ranges, and of each range into pushes,
        /// gives the reference's candidates: scores drawn from few values
        /// (ties), norms from few values, long rows that prune.
        #[test]
        fn collected_candidates_are_the_stored_rows(
            values in proptest::collection::vec(-50i32..50, 1..1500),
            norm_of in proptest::collection::vec(1u8..4, 1..8),
            scale in prop_oneof![Just(1e-3f32), Just(0.37), Just(25.0)],
            bound in prop_oneof![Just(0f32), Just(1e-4), Just(0.02), Just(3.0)],
            top in 1usize..50,
            cuts in proptest::collection::vec(0usize..1500, 0..6),
            step in 1usize..70,
        ) {
            let s: Vec<f32> = values.iter().map(|&v| v as f32 * scale).collect();
            let norms: Vec<f32> = (0..s.len()).map(|j| f32::from(norm_of[j % norm_of.len()])).collect();
            let highest = s.iter().fold(0f32, |m, v| m.max(v.abs())) * 1.5;
            let row = RowBound { top, bound, max_norm: 3.0, highest };
            let mut ends: Vec<usize> = cuts.iter().map(|c| c % s.len()).collect();
            ends.push(s.len());
            ends.sort_unstable();
            let mut parts = Vec::new();
            let mut start = 0;
            for end in ends {
                let mut c = Collector::new(row);
                for at in (start..end).step_by(step) {
                    let to = (at + step).min(end);
                    c.push(at, &s[at..to], &norms[at..to]);
                }
                parts.push(c);
                start = end;
            }
            prop_assert_eq!(merge(parts), reference(&s, &norms, row));
        }
    }
}
