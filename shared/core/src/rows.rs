//! The target's side of a sampled round as the rules that read it position by position use
//! it (token-wise rejection sampling and seeded verification): the probability of one
//! drafted token, a draw from a position's distribution, and a draw from the residual
//! `norm(max(p − q, 0))` after a rejection. [`BuiltRows`] serves them from whole
//! distributions built on the host; a source holding its logits elsewhere (a GPU) can
//! serve them from reductions without building any (the engine's device rows).

use crate::acceptance::weighted_residual;
use crate::sampling::SparseDist;

/// A round's target distributions, read in position order: the rules ask about a position
/// only after every earlier one, and never go back.
pub trait TargetRows {
    /// The target's probability of `id` at position `row`.
    fn prob(&mut self, row: usize, id: u32) -> f64;
    /// Whether the target's probability of `id` at position `row` is above `t`: what
    /// rejection sampling asks ([`Self::prob`] compared, unless a source can answer without
    /// the exact probability).
    fn exceeds(&mut self, row: usize, id: u32, t: f64) -> bool {
        self.prob(row, id) > t
    }
    /// The token drawn from position `row`'s distribution with the uniform `u` (in
    /// [`SparseDist::draw`]'s order: by cumulative probability over the listed ids).
    fn draw(&mut self, row: usize, u: f64) -> u32;
    /// The token drawn with `u` from `norm(max(p − q, 0))` at position `row` (from `p`
    /// itself when `q` covers all of it).
    fn draw_residual(&mut self, row: usize, q: &SparseDist, u: f64) -> u32;
}

/// Rows built as whole distributions by a function, each once (the one last built is
/// kept), so a rule that stops early never builds the later ones.
pub struct BuiltRows<F> {
    build: F,
    current: Option<(usize, SparseDist)>,
}

impl<F: FnMut(usize) -> SparseDist> BuiltRows<F> {
    /// Rows built by `build(position)`.
    pub fn new(build: F) -> Self {
        Self {
            build,
            current: None,
        }
    }

    fn row(&mut self, row: usize) -> &SparseDist {
        if self.current.as_ref().map(|c| c.0) != Some(row) {
            self.current = Some((row, (self.build)(row)));
        }
        &self.current.as_ref().expect("just built").1
    }
}

impl<F: FnMut(usize) -> SparseDist> TargetRows for BuiltRows<F> {
    fn prob(&mut self, row: usize, id: u32) -> f64 {
        self.row(row).prob(id) as f64
    }

    fn draw(&mut self, row: usize, u: f64) -> u32 {
        self.row(row).draw(u)
    }

    fn draw_residual(&mut self, row: usize, q: &SparseDist, u: f64) -> u32 {
        weighted_residual(self.row(row), 1.0, q).0.draw(u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_is_built_once_and_only_when_asked() {
        let mut built = Vec::new();
        let mut rows = BuiltRows::new(|i| {
            built.push(i);
            SparseDist {
                ids: vec![0, 1],
                probs: vec![0.25, 0.75],
            }
        });
        assert_eq!(rows.prob(0, 1), 0.75);
        assert_eq!(rows.draw(0, 0.1), 0);
        let q = SparseDist {
            ids: vec![1],
            probs: vec![1.0],
        };
        assert_eq!(rows.draw_residual(0, &q, 0.99), 0, "only id 0 is left");
        assert_eq!(rows.draw(1, 0.5), 1);
        drop(rows);
        assert_eq!(built, vec![0, 1]);
    }
}
