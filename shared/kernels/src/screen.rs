//! [`ArgmaxScreen`]: the exact first maximum, or the `k` largest outputs, of
//! each row of a lane-packed Q8_0 product without computing every output in
//! f32.
//!
//! Greedy decoding and greedy verification read, of each logits row, only
//! the index of its first maximum; top-k sampling only the `k` largest
//! logits. For the LM head — 262,144 outputs — the
//! exact f32 product of several rows is bound by the CPU's FMAs, while an
//! 8-bit product of the same codes needs a quarter of the instructions.
//! The screen uses the cheap product to rule outputs out and the exact one
//! for the few that remain:
//!
//! 1. *Screen.* Each activation row is quantized per block of 32 to
//!    `x ≈ dx·q` (`q` 8-bit, `dx = max|x| / 127`); the integer dots `S` of
//!    `q` with the weights' own codes are exact, and are scaled in f32:
//!    `s_j = Σ_b fma(S_jb, dw_jb·dx_b, ·)`.
//! 2. *Bound.* Let `z_j` be output `j` as [`LaneMatrix::matmul`] computes
//!    it, `Z_j` the same sum in real numbers and `e = x − dx·q`. A Q8_0
//!    weight (an f16 scale times an 8-bit code) is exact in f32, so `z_j`
//!    is `k` FMAs of exact products: `|z_j − Z_j| ≤ γ_k Σ|w x| ≤
//!    γ_k‖w_j‖‖x‖` (`γ_n = n·u / (1 − n·u)`, `u = 2⁻²⁴`). The quantization
//!    error is `|Σ w e| ≤ ‖w_j‖‖e‖` (Cauchy–Schwarz), and the screen's own
//!    f32 scaling adds at most `γ_{blocks+1}‖w_j‖(‖x‖ + ‖e‖)`. Hence
//!    `|z_j − s_j| ≤ B_j = ‖w_j‖·K` with one `K` per activation row
//!    (computed in f64, rounded up), the norms `‖w_j‖` computed once.
//! 3. *Candidates.* With `T` the `k`-th largest lower bound `s_i − B_i`,
//!    at least `k` outputs are `≥ T`, so each of the `k` largest outputs —
//!    and any output tied with the `k`-th — lies in `{j : s_j + B_j ≥ T}`
//!    (with slack for the f32 rounding of those sums); for `k = 1` every
//!    other output is strictly below the maximum. The candidates' exact
//!    values come from the lane product's own arithmetic on their one lane
//!    (its portable loop, which gives every kernel's bits): their first
//!    maximum is the index `argmax` of the full row would give, and their
//!    `k` largest (ties to the lower index) are the full row's. The
//!    candidates are gathered while the scores stream past (`screen_scan`),
//!    so no row of 262,144 scores is stored.
//!
//! Rows whose activations are not finite, or whose bound could overflow,
//! are computed in full, as are all rows where the CPU lacks the screen's
//! kernel (AVX-512 with VNNI and VBMI, not capped below [`Isa::AvxVnni`]).

use std::ops::Range;

use rayon::prelude::*;

use crate::lanes::{task_groups, LaneMatrix, LANES};
use crate::matrix::check_len;
use crate::qtype::QK8_0;
use crate::screen_scan::{merge, Collector, RowBound};
use crate::{Isa, KernelError, QType};

#[path = "screen_bounds.rs"]
mod bounds;
pub use bounds::UpperRow;

/// f32 unit roundoff.
const U: f64 = f32::EPSILON as f64 / 2.0;
/// Groups a thread scores before their scores go to the collectors (nine
/// rows' scores of them, 18 KiB, stay in L1).
const PASS_GROUPS: usize = 32;

/// Row norms of a Q8_0 [`LaneMatrix`], for exact argmaxes of its products.
#[derive(Debug, Clone)]
pub struct ArgmaxScreen {
    n: usize,
    k: usize,
    /// `‖w_j‖₂` per output row, rounded up to f32.
    norms: Vec<f32>,
    max_norm: f32,
}

/// The outputs of one activation row that may rank among its `top`
/// largest, with their exact values: a superset of the top `top` (ties at
/// its boundary included), every output for a row computed in full.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRow {
    /// Output indices, ascending.
    pub ids: Vec<u32>,
    /// Their values, bit for bit as [`LaneMatrix::matmul`] computes them.
    pub values: Vec<f32>,
}

impl TopRow {
    /// The index of the row's first maximum ([`first_max`] of the full row).
    pub fn first_max(&self) -> u32 {
        self.ids[first_max(&self.values) as usize]
    }
}

/// What [`ArgmaxScreen::top_rows`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRows {
    /// One per activation row.
    pub rows: Vec<TopRow>,
    /// Outputs computed exactly after the screen, over all screened rows.
    pub candidates: usize,
    /// Activation rows computed in full (no screen kernel, or activations
    /// the bound does not cover).
    pub full_rows: usize,
}

/// One activation row quantized for the screen.
pub(crate) struct QuantRow {
    /// 8-bit codes, `k` of them.
    pub(crate) q: Vec<i8>,
    /// Per block: its scale `dx`.
    pub(crate) dx: Vec<f32>,
    /// Per block: `128 · Σ q`, the offset of unsigned weight codes.
    pub(crate) bias: Vec<i32>,
    /// `K` of the module docs, rounded up.
    pub(crate) bound: f32,
    /// A bound on the magnitude of every screen score of the row:
    /// `‖w_j‖·(‖x‖ + ‖e‖)·(1 + γ_{blocks+2})` at the largest norm, rounded
    /// up (each score is a sum of `|dw·dx·S|` terms, rounded).
    pub(crate) highest: f32,
}

impl QuantRow {
    /// Quantizes `x` (a whole number of blocks); `None` when an activation
    /// or the bound is not finite, or the product could overflow.
    fn new(x: &[f32], max_norm: f32) -> Option<QuantRow> {
        let blocks = x.len() / QK8_0;
        let mut row = QuantRow {
            q: Vec::with_capacity(x.len()),
            dx: Vec::with_capacity(blocks),
            bias: Vec::with_capacity(blocks),
            bound: 0.0,
            highest: 0.0,
        };
        let (mut xx, mut ee) = (0f64, 0f64);
        for block in x.chunks_exact(QK8_0) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            if !amax.is_finite() || block.iter().any(|v| v.is_nan()) {
                return None;
            }
            let dx = amax / 127.0;
            let inv = if dx > 0.0 { 1.0 / dx } else { 0.0 };
            let mut sum = 0i32;
            for &v in block {
                let q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                let e = f64::from(v) - f64::from(dx) * f64::from(q);
                (xx, ee) = (xx + f64::from(v).powi(2), ee + e * e);
                sum += i32::from(q);
                row.q.push(q);
            }
            row.dx.push(dx);
            row.bias.push(128 * sum);
        }
        let gamma = |n: usize| n as f64 * U / (1.0 - n as f64 * U);
        let (xn, en) = (xx.sqrt(), ee.sqrt());
        let k = en + gamma(x.len()) * xn + gamma(blocks + 1) * (xn + en);
        let k = k * (1.0 + 1e-6) + f64::from(f32::MIN_POSITIVE);
        if !(k * f64::from(max_norm) < 1e30 && xn * f64::from(max_norm) < 1e30) {
            return None;
        }
        row.bound = round_up(k);
        let highest = f64::from(max_norm) * (xn + en) * (1.0 + gamma(blocks + 2));
        row.highest = round_up(highest * (1.0 + 1e-6));
        Some(row)
    }
}

/// `v` as f32, rounded up.
fn round_up(v: f64) -> f32 {
    let f = v as f32;
    if f64::from(f) < v {
        f.next_up()
    } else {
        f
    }
}

impl ArgmaxScreen {
    /// The row norms of `w`, which must be Q8_0 with finite scales.
    pub fn new(w: &LaneMatrix) -> Result<Self, KernelError> {
        if w.qtype() != QType::Q8_0 {
            return Err(KernelError::NoScreen(w.qtype()));
        }
        let norms: Vec<f32> = (0..w.n())
            .into_par_iter()
            .map_init(
                || vec![0f32; w.k()],
                |row, j| {
                    w.decode_row(j, row);
                    let ss: f64 = row.iter().map(|&v| f64::from(v).powi(2)).sum();
                    round_up(ss.sqrt() * (1.0 + 1e-9))
                },
            )
            .collect();
        if norms.iter().any(|v| !v.is_finite()) {
            return Err(KernelError::NoScreen(w.qtype()));
        }
        let max_norm = norms.iter().fold(0f32, |m, &v| m.max(v));
        Ok(ArgmaxScreen {
            n: w.n(),
            k: w.k(),
            norms,
            max_norm,
        })
    }

    /// Whether this CPU (and the process cap of [`Isa::set_max`]) runs the
    /// screen; without it [`ArgmaxScreen::top_rows`] computes every row
    /// in full.
    pub fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::lanes_x86::wide() && Isa::detect() >= Isa::AvxVnni {
            return crate::screen_x86::available();
        }
        false
    }

    /// Per row of `x` (`m × k`), the outputs of that row of `x · Wᵀ` that
    /// may rank among its `top` largest (`top ≥ 1`), with their exact values
    /// (`w` must be the matrix this screen was built from).
    pub fn top_rows(
        &self,
        w: &LaneMatrix,
        x: &[f32],
        m: usize,
        top: usize,
    ) -> Result<TopRows, KernelError> {
        self.check(w, x, m)?;
        let screen = Self::available() && top < self.n;
        let quant: Vec<Option<QuantRow>> = x
            .chunks_exact(self.k)
            .map(|x| screen.then(|| QuantRow::new(x, self.max_norm)).flatten())
            .collect();
        let rows: Vec<&QuantRow> = quant.iter().flatten().collect();
        let cands = self.screen(w, &rows, top.max(1));
        let mut out = TopRows {
            rows: Vec::with_capacity(m),
            candidates: 0,
            full_rows: 0,
        };
        let mut screened = cands.into_iter();
        for (x, q) in x.chunks_exact(self.k).zip(&quant) {
            let row = match q {
                Some(_) => {
                    let cands = screened.next().expect("candidates per screened row");
                    out.candidates += cands.len();
                    exact_values(w, x, &cands)?
                }
                None => {
                    out.full_rows += 1;
                    let mut values = vec![0f32; self.n];
                    w.matmul(x, 1, &mut values)?;
                    TopRow {
                        ids: (0..self.n as u32).collect(),
                        values,
                    }
                }
            };
            out.rows.push(row);
        }
        Ok(out)
    }

    /// Checks that `w` is the matrix this screen was built from and `x` holds `m` rows.
    fn check(&self, w: &LaneMatrix, x: &[f32], m: usize) -> Result<(), KernelError> {
        if (w.n(), w.k()) != (self.n, self.k) {
            return Err(KernelError::ScreenShape {
                screen: (self.n, self.k),
                matrix: (w.n(), w.k()),
            });
        }
        check_len("activations", x.len(), m.checked_mul(self.k))
    }

    /// The candidates of each of `rows` (module docs), ascending. Threads
    /// take ranges of groups; each scores its range a few groups at a time
    /// into a small buffer and passes the scores to one [`Collector`] per
    /// row, so no row of scores is ever stored whole.
    fn screen(&self, w: &LaneMatrix, rows: &[&QuantRow], top: usize) -> Vec<Vec<usize>> {
        if rows.is_empty() {
            return Vec::new();
        }
        let groups = self.n.div_ceil(LANES);
        let chunk = task_groups((rows.len(), self.k, self.n));
        let ranges: Vec<Range<usize>> = (0..groups)
            .step_by(chunk)
            .map(|g| g..(g + chunk).min(groups))
            .collect();
        let parts: Vec<Vec<Collector>> = match ranges.len() {
            1 => vec![self.scan(w, rows, 0..groups, top)],
            _ => ranges
                .into_par_iter()
                .map(|r| self.scan(w, rows, r, top))
                .collect(),
        };
        let mut per_row: Vec<Vec<Collector>> = rows.iter().map(|_| Vec::new()).collect();
        for part in parts {
            per_row.iter_mut().zip(part).for_each(|(r, c)| r.push(c));
        }
        per_row.into_iter().map(merge).collect()
    }

    /// One [`Collector`] per row over the outputs of `groups`.
    fn scan(
        &self,
        w: &LaneMatrix,
        rows: &[&QuantRow],
        groups: Range<usize>,
        top: usize,
    ) -> Vec<Collector> {
        let mut found: Vec<Collector> = rows
            .iter()
            .map(|q| {
                Collector::new(RowBound {
                    top,
                    bound: q.bound,
                    max_norm: self.max_norm,
                    highest: q.highest,
                })
            })
            .collect();
        let simd = Self::available();
        let width = PASS_GROUPS * LANES;
        let mut buf = vec![0f32; rows.len() * width];
        for g0 in groups.clone().step_by(PASS_GROUPS) {
            let col0 = g0 * LANES;
            let cols = ((groups.end - g0) * LANES).min(width).min(self.n - col0);
            let mut outs: Vec<&mut [f32]> = buf
                .chunks_exact_mut(width)
                .map(|o| &mut o[..cols])
                .collect();
            score_groups(w, rows, g0, &mut outs);
            let norms = &self.norms[col0..col0 + cols];
            for (c, s) in found.iter_mut().zip(&outs) {
                collect(simd, c, col0, s, norms);
            }
        }
        found
    }
}

/// [`Collector::push`], compiled for AVX-512 when `simd` (the screen runs:
/// [`ArgmaxScreen::available`], checked once per range by the caller).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn collect(simd: bool, c: &mut Collector, col0: usize, s: &[f32], norms: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the screen kernel's features include AVX-512 F.
        return unsafe { crate::screen_x86::collect(c, col0, s, norms) };
    }
    c.push(col0, s, norms);
}

/// Screen scores of groups `g0..` (covering `outs[r]`) for every row `r`.
pub(crate) fn score_groups(w: &LaneMatrix, rows: &[&QuantRow], g0: usize, outs: &mut [&mut [f32]]) {
    #[cfg(target_arch = "x86_64")]
    crate::screen_x86::score(w, rows, g0, outs);
    #[cfg(not(target_arch = "x86_64"))]
    score_portable(w, rows, g0, outs);
}

/// [`score_groups`] in plain Rust: the arithmetic every kernel follows
/// (the tests hold the AVX-512 kernel to it).
#[cfg(any(test, not(target_arch = "x86_64")))]
pub(crate) fn score_portable(
    w: &LaneMatrix,
    rows: &[&QuantRow],
    g0: usize,
    outs: &mut [&mut [f32]],
) {
    let (format, gb) = (w.format(), w.group_bytes());
    let rec = format.record_bytes();
    let cols = outs.first().map_or(0, |o| o.len());
    for col in 0..cols {
        let (g, lane) = (g0 + col / LANES, col % LANES);
        let group = &w.bytes()[g * gb..][..gb];
        for (out, q) in outs.iter_mut().zip(rows) {
            let mut acc = 0f32;
            for (b, record) in group.chunks_exact(rec).enumerate() {
                let dw = half::f16::from_le_bytes([record[2 * lane], record[2 * lane + 1]]);
                let codes = &record[format.codes_at()..];
                let dot: i32 = (0..QK8_0)
                    .map(|e| {
                        let c = i32::from(codes[e * LANES + lane] as i8);
                        (c + 128) * i32::from(q.q[b * QK8_0 + e])
                    })
                    .sum();
                let dd = dw.to_f32() * q.dx[b];
                acc = ((dot - q.bias[b]) as f32).mul_add(dd, acc);
            }
            out[col] = acc;
        }
    }
}

/// The exact outputs `cands` (ascending) of row `x`: the lane product's
/// own chain on each one lane ([`LaneMatrix::outputs`]).
fn exact_values(w: &LaneMatrix, x: &[f32], cands: &[usize]) -> Result<TopRow, KernelError> {
    Ok(TopRow {
        ids: cands.iter().map(|&j| j as u32).collect(),
        values: w.outputs(x, cands)?,
    })
}

/// The index of the first maximum of `z` (0 when empty; a `NaN` never
/// replaces an earlier value): the greedy choice, and what
/// [`TopRow::first_max`] gives.
pub fn first_max(z: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in z.iter().enumerate() {
        if *v > z[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QMatrix;

    /// A random Q8_0 matrix (scales up to `scale`) with rows 1 and 2
    /// copies of row 0 (exact ties), packed.
    fn matrix(n: usize, k: usize, scale: f32, seed: u64) -> LaneMatrix {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let row_bytes = k / QK8_0 * 34;
        let mut bytes: Vec<u8> = (0..n * row_bytes).map(|_| next() as u8).collect();
        for blk in bytes.chunks_exact_mut(34) {
            let d = half::f16::from_f32(scale * (next() % 1000) as f32 / 1000.0);
            blk[..2].copy_from_slice(&d.to_le_bytes());
        }
        for r in 1..n.min(3) {
            bytes.copy_within(..row_bytes, r * row_bytes);
        }
        let w = QMatrix::new(QType::Q8_0, n, k, bytes).expect("valid bytes");
        LaneMatrix::pack(&w).expect("quantized")
    }

    fn activations(m: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..m * k)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if i % 37 == 0 {
                    v * 40.0
                } else {
                    v
                }
            })
            .collect()
    }

    /// The kernel's scores equal the portable loop's bit for bit, and every
    /// exact output lies within its bound of its score.
    #[test]
    fn scores_are_the_portable_ones_and_within_the_bound() {
        let (n, k, m) = (77, 640, 11);
        let w = matrix(n, k, 0.05, 7);
        let screen = ArgmaxScreen::new(&w).expect("Q8_0");
        let x = activations(m, k, 3);
        let rows: Vec<QuantRow> = x
            .chunks_exact(k)
            .map(|x| QuantRow::new(x, screen.max_norm).expect("finite"))
            .collect();
        let refs: Vec<&QuantRow> = rows.iter().collect();
        let mut want = vec![0f32; m * n];
        let mut outs: Vec<&mut [f32]> = want.chunks_exact_mut(n).collect();
        score_portable(&w, &refs, 0, &mut outs);
        if ArgmaxScreen::available() {
            let mut got = vec![f32::NAN; m * n];
            let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(n).collect();
            score_groups(&w, &refs, 0, &mut outs);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want));
        }
        let mut z = vec![0f32; m * n];
        w.matmul_with(Isa::Scalar, &x, m, &mut z).expect("product");
        for (r, q) in rows.iter().enumerate() {
            for j in 0..n {
                let err = (z[r * n + j] - want[r * n + j]).abs();
                assert!(
                    err <= screen.norms[j] * q.bound,
                    "row {r} output {j}: {err}"
                );
            }
        }
    }

    /// Screened argmaxes equal the first maximum of the full product, ties
    /// (rows 0–2 are equal) included, and non-finite rows are computed in
    /// full.
    #[test]
    fn argmaxes_are_the_full_products_first_maxima() {
        for (n, seed) in [(3, 1), (40, 2), (257, 3)] {
            let k = 128;
            let w = matrix(n, k, 0.05, seed);
            let screen = ArgmaxScreen::new(&w).expect("Q8_0");
            let m = 10;
            let mut x = activations(m, k, seed + 10);
            x[3 * k + 5] = f32::NAN;
            x[4 * k + 9] = f32::INFINITY;
            x[5 * k..6 * k].fill(0.0);
            let got = screen.top_rows(&w, &x, m, 1).expect("argmaxes");
            let mut z = vec![0f32; m * n];
            w.matmul_with(Isa::Scalar, &x, m, &mut z).expect("product");
            let want: Vec<u32> = z.chunks_exact(n).map(first_max).collect();
            let ids: Vec<u32> = got.rows.iter().map(TopRow::first_max).collect();
            assert_eq!(ids, want, "n = {n}");
            if ArgmaxScreen::available() {
                assert_eq!(got.full_rows, 2);
                assert!(got.candidates >= m - 2);
            }
        }
    }

    #[test]
    fn other_types_and_shapes_are_refused() {
        let w = matrix(20, 64, 0.05, 5);
        let screen = ArgmaxScreen::new(&w).expect("Q8_0");
        let other = matrix(21, 64, 0.05, 5);
        assert!(matches!(
            screen.top_rows(&other, &[0.0; 64], 1, 1),
            Err(KernelError::ScreenShape { .. })
        ));
        assert!(matches!(
            screen.top_rows(&w, &[0.0; 63], 1, 1),
            Err(KernelError::BufferLength { .. })
        ));
        let q4 = QMatrix::new(QType::Q4_0, 16, 32, vec![0; 16 * 18]).expect("valid bytes");
        let q4 = LaneMatrix::pack(&q4).expect("quantized");
        assert_eq!(
            ArgmaxScreen::new(&q4).err(),
            Some(KernelError::NoScreen(QType::Q4_0))
        );
    }
}
