//! Upper bounds on every output of a screened product ([`ArgmaxScreen::upper_rows`]): what
//! drawing a token at a temperature needs of the LM head without forming every logit in
//! f32. A row's bound on output `j` is its screen score plus `‖w_j‖·K` (the screen's bound,
//! module docs of `screen.rs`) plus twice the rounding slack the candidates' test allows
//! (`screen_scan`), so it is never below the output [`LaneMatrix::matmul`] computes, and
//! [`LaneMatrix::output`] gives any one output exactly. The scores are stored whole here
//! (a row of 262,144 is 1 MiB), one range of outputs of every row per task.

use rayon::prelude::*;

use super::{score_groups, ArgmaxScreen, QuantRow};
use crate::lanes::{task_groups, LaneMatrix, LANES};
use crate::screen_scan::slack;
use crate::KernelError;

/// One activation row's outputs through [`ArgmaxScreen::upper_rows`].
#[derive(Debug, Clone, PartialEq)]
pub struct UpperRow {
    /// Per output, a value never below it as [`LaneMatrix::matmul`] computes it.
    pub upper: Vec<f32>,
    /// Whether `upper` holds the outputs themselves (a row computed in full: no screen
    /// kernel on this CPU, or activations the bound does not cover).
    pub exact: bool,
}

impl ArgmaxScreen {
    /// Per row of `x` (`m × k`), an upper bound on every output of `x · Wᵀ` (`w` must be
    /// the matrix this screen was built from). A row's bounds do not depend on the other
    /// rows.
    pub fn upper_rows(
        &self,
        w: &LaneMatrix,
        x: &[f32],
        m: usize,
    ) -> Result<Vec<UpperRow>, KernelError> {
        self.check(w, x, m)?;
        let screen = Self::available();
        let quant: Vec<Option<QuantRow>> = x
            .chunks_exact(self.k)
            .map(|x| screen.then(|| QuantRow::new(x, self.max_norm)).flatten())
            .collect();
        let rows: Vec<&QuantRow> = quant.iter().flatten().collect();
        let mut scores: Vec<Vec<f32>> = rows.iter().map(|_| vec![0f32; self.n]).collect();
        self.score_all(w, &rows, &mut scores);
        let mut scores = scores.into_iter();
        x.chunks_exact(self.k)
            .zip(&quant)
            .map(|(x, q)| match q {
                Some(q) => {
                    let mut upper = scores.next().expect("scores per screened row");
                    self.raise(&mut upper, q);
                    Ok(UpperRow {
                        upper,
                        exact: false,
                    })
                }
                None => {
                    let mut upper = vec![0f32; self.n];
                    w.matmul(x, 1, &mut upper)?;
                    Ok(UpperRow { upper, exact: true })
                }
            })
            .collect()
    }

    /// The screen scores of every output of each of `rows` into `scores`: a task per range
    /// of outputs, over all rows.
    fn score_all(&self, w: &LaneMatrix, rows: &[&QuantRow], scores: &mut [Vec<f32>]) {
        let width = task_groups((rows.len(), self.k, self.n)) * LANES;
        let mut tasks: Vec<Vec<&mut [f32]>> = Vec::new();
        for row in scores.iter_mut() {
            for (t, part) in row.chunks_mut(width).enumerate() {
                match tasks.get_mut(t) {
                    Some(task) => task.push(part),
                    None => tasks.push(vec![part]),
                }
            }
        }
        tasks
            .into_par_iter()
            .enumerate()
            .for_each(|(t, mut outs)| score_groups(w, rows, t * width / LANES, &mut outs));
    }

    /// Turns a row's scores into upper bounds: `s_j + ‖w_j‖·K + 2·slack` (module docs).
    fn raise(&self, scores: &mut [f32], q: &QuantRow) {
        let margin = 2.0 * slack(q.highest, self.max_norm, q.bound);
        for (s, norm) in scores.iter_mut().zip(&self.norms) {
            *s = (*s + norm * q.bound) + margin;
        }
    }
}
