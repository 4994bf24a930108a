//! [`ColumnMatrix`]: a dense f32 or f16 matrix of few inputs and many outputs (the second
//! factor of a low-rank head: 64 inputs, 32,768 outputs), packed so that a vector register
//! holds consecutive *outputs*. [`QMatrix`](crate::QMatrix) dots each output's weight row
//! with the input and ends every output with a horizontal sum, which for 64 inputs costs as
//! much as the products; here a product streams panels of [`OUTPUTS`] outputs, each stored
//! input-major, and feeds every output one FMA chain over the inputs in order,
//! `acc = fma(x[e], w[j][e], acc)` for `e = 0..k`, with no sum across lanes.
//!
//! The arithmetic of one output depends only on its weights and the input row, so every
//! implementation (AVX2 with FMA and F16C, the portable `mul_add` loop) gives the same
//! bits, whatever the row count, the thread split or the panel an output falls in.

use half::f16;
use rayon::prelude::*;

use crate::error::KernelError;
use crate::isa::Isa;
use crate::matrix::{check_call, check_len};

/// Outputs per panel: eight 8-lane registers.
const OUTPUTS: usize = 64;

/// Products of at least this many multiply-adds split their panels between threads.
const PARALLEL_MIN_MACS: usize = 1 << 17;

/// Tasks per thread of a split product (so that a thread slowed by another process does
/// not hold the others back for long).
const TASKS_PER_THREAD: usize = 4;

/// Panels of weights, each `[k][OUTPUTS]` (zero past the last output).
enum Panels {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A `n × k` matrix packed for products with many outputs (see the module docs).
pub struct ColumnMatrix {
    n: usize,
    k: usize,
    panels: Panels,
}

impl ColumnMatrix {
    /// Packs `w`, row-major `[n][k]` (one row of `k` weights per output); in f16 when
    /// `half` (each weight rounded to the nearest f16), in f32 otherwise.
    pub fn new(w: &[f32], n: usize, k: usize, half: bool) -> Result<Self, KernelError> {
        check_len("column matrix weights", w.len(), n.checked_mul(k))?;
        let panels = n.div_ceil(OUTPUTS);
        let mut packed = vec![0f32; panels * k * OUTPUTS];
        for (j, row) in w.chunks_exact(k.max(1)).enumerate() {
            let (p, lane) = (j / OUTPUTS, j % OUTPUTS);
            for (e, v) in row.iter().enumerate() {
                packed[(p * k + e) * OUTPUTS + lane] = *v;
            }
        }
        let panels = match half {
            true => Panels::F16(packed.iter().map(|v| f16::from_f32(*v)).collect()),
            false => Panels::F32(packed),
        };
        Ok(Self { n, k, panels })
    }

    /// Outputs.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inputs.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether the weights are stored in f16.
    pub fn is_half(&self) -> bool {
        matches!(self.panels, Panels::F16(_))
    }

    /// `out = x · Wᵀ`: `x` is `m × k` row-major, `out` is `m × n` row-major. Uses the
    /// fastest implementation of this CPU; every one gives the same bits.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::detect(), x, m, out)
    }

    /// [`ColumnMatrix::matmul`] on a chosen implementation.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        check_call(isa, (x, m, self.k), (out, self.n))?;
        if self.k == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let panels = self.n.div_ceil(OUTPUTS);
        let run = |p: usize, rows: &mut [f32]| self.panel(isa, p, x, m, rows);
        let mut staged = vec![0f32; panels * m * OUTPUTS];
        let threads = rayon::current_num_threads();
        if m * self.n * self.k >= PARALLEL_MIN_MACS && threads > 1 {
            let per_task = panels.div_ceil(threads * TASKS_PER_THREAD);
            staged
                .par_chunks_mut(m * OUTPUTS)
                .enumerate()
                .with_min_len(per_task)
                .for_each(|(p, rows)| run(p, rows));
        } else {
            (staged.chunks_mut(m * OUTPUTS).enumerate()).for_each(|(p, rows)| run(p, rows));
        }
        for (p, rows) in staged.chunks(m * OUTPUTS).enumerate() {
            let (j0, len) = (p * OUTPUTS, OUTPUTS.min(self.n - p * OUTPUTS));
            for (r, row) in rows.chunks(OUTPUTS).enumerate() {
                out[r * self.n + j0..r * self.n + j0 + len].copy_from_slice(&row[..len]);
            }
        }
        Ok(())
    }

    /// Panel `p`'s outputs of every row of `x`, into `out` (`m × OUTPUTS`).
    fn panel(&self, isa: Isa, p: usize, x: &[f32], m: usize, out: &mut [f32]) {
        let span = p * self.k * OUTPUTS..(p + 1) * self.k * OUTPUTS;
        for (xr, o) in x
            .chunks_exact(self.k)
            .zip(out.chunks_exact_mut(OUTPUTS))
            .take(m)
        {
            #[cfg(target_arch = "x86_64")]
            if isa != Isa::Scalar {
                // SAFETY: `matmul_with` checked `isa.is_available()`, and every
                // implementation above the portable one has AVX2, FMA and F16C.
                unsafe {
                    match &self.panels {
                        Panels::F32(w) => x86::panel_f32(&w[span.clone()], xr, o),
                        Panels::F16(w) => x86::panel_f16(&w[span.clone()], xr, o),
                    }
                }
                continue;
            }
            match &self.panels {
                Panels::F32(w) => panel_scalar(&w[span.clone()], xr, o, |v| *v),
                Panels::F16(w) => panel_scalar(&w[span.clone()], xr, o, |v| v.to_f32()),
            }
        }
    }
}

/// Portable panel: one `mul_add` chain per output over the inputs in order.
fn panel_scalar<T>(w: &[T], x: &[f32], out: &mut [f32], widen: impl Fn(&T) -> f32) {
    out.fill(0.0);
    for (xe, we) in x.iter().zip(w.chunks_exact(OUTPUTS)) {
        for (o, v) in out.iter_mut().zip(we) {
            *o = xe.mul_add(widen(v), *o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::OUTPUTS;

    const REGS: usize = OUTPUTS / 8;

    /// AVX2 panel of f32 weights: eight registers of outputs, one FMA each per input.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn panel_f32(w: &[f32], x: &[f32], out: &mut [f32]) {
        let mut acc = [_mm256_setzero_ps(); REGS];
        for (xe, we) in x.iter().zip(w.chunks_exact(OUTPUTS)) {
            let xv = _mm256_set1_ps(*xe);
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: `we` holds OUTPUTS = 8 · REGS floats.
                let wv = unsafe { _mm256_loadu_ps(we.as_ptr().add(8 * i)) };
                *a = _mm256_fmadd_ps(xv, wv, *a);
            }
        }
        store(&acc, out);
    }

    /// AVX2 panel of f16 weights, widened exactly (F16C) before the same FMAs.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn panel_f16(w: &[f16], x: &[f32], out: &mut [f32]) {
        let mut acc = [_mm256_setzero_ps(); REGS];
        for (xe, we) in x.iter().zip(w.chunks_exact(OUTPUTS)) {
            let xv = _mm256_set1_ps(*xe);
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: `we` holds OUTPUTS = 8 · REGS halves (16 bytes a register).
                let h = unsafe { _mm_loadu_si128(we.as_ptr().add(8 * i).cast()) };
                *a = _mm256_fmadd_ps(xv, _mm256_cvtph_ps(h), *a);
            }
        }
        store(&acc, out);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn store(acc: &[__m256; REGS], out: &mut [f32]) {
        for (a, o) in acc.iter().zip(out.chunks_exact_mut(8)) {
            // SAFETY: `o` holds 8 floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use tandem_testkit::bits;

    use super::*;

    fn weights(n: usize, k: usize) -> Vec<f32> {
        (0..n * k)
            .map(|i| ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 0.5)
            .collect()
    }

    /// The product in f64 of weights as stored (rounded to f16 when `half`).
    fn reference(w: &[f32], x: &[f32], k: usize, half: bool) -> Vec<f64> {
        let stored = |v: f32| match half {
            true => f64::from(f16::from_f32(v).to_f32()),
            false => f64::from(v),
        };
        x.chunks_exact(k)
            .flat_map(|xr| {
                w.chunks_exact(k).map(move |wr| {
                    wr.iter()
                        .zip(xr)
                        .map(|(a, b)| stored(*a) * f64::from(*b))
                        .sum()
                })
            })
            .collect()
    }

    #[test]
    fn every_implementation_gives_the_same_bits_close_to_the_exact_product() {
        let (n, k, m) = (200, 37, 3);
        let w = weights(n, k);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.13).sin()).collect();
        for half in [false, true] {
            let c = ColumnMatrix::new(&w, n, k, half).expect("packed");
            assert_eq!(c.is_half(), half);
            let want = reference(&w, &x, k, half);
            let mut first: Option<Vec<f32>> = None;
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let mut out = vec![f32::NAN; m * n];
                c.matmul_with(isa, &x, m, &mut out).expect("product");
                for (o, r) in out.iter().zip(&want) {
                    assert!((f64::from(*o) - r).abs() < 1e-5, "{isa:?}: {o} vs {r}");
                }
                match &first {
                    None => first = Some(out),
                    Some(f) => assert_eq!(bits(f), bits(&out), "{isa:?}"),
                }
            }
        }
    }

    #[test]
    fn each_row_is_what_it_is_alone_whatever_the_threads() {
        let (n, k, m) = (4100, 64, 4);
        let w = weights(n, k);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.29).cos()).collect();
        let c = ColumnMatrix::new(&w, n, k, true).expect("packed");
        let mut all = vec![0f32; m * n];
        c.matmul(&x, m, &mut all).expect("product");
        for r in 0..m {
            let mut one = vec![0f32; n];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("pool");
            pool.install(|| c.matmul(&x[r * k..(r + 1) * k], 1, &mut one))
                .expect("product");
            let row = &all[r * n..(r + 1) * n];
            assert_eq!(bits(row), bits(&one), "row {r}");
        }
    }

    #[test]
    fn wrong_lengths_are_refused_and_no_inputs_give_zeros() {
        assert!(ColumnMatrix::new(&[0.0; 5], 2, 3, false).is_err());
        let c = ColumnMatrix::new(&[0.0; 6], 2, 3, false).expect("packed");
        assert!(c.matmul(&[0.0; 4], 1, &mut [0.0; 2]).is_err());
        assert!(c.matmul(&[0.0; 3], 1, &mut [0.0; 3]).is_err());
        let empty = ColumnMatrix::new(&[], 3, 0, true).expect("no inputs");
        let mut out = [f32::NAN; 6];
        empty
            .matmul(&[], 2, &mut out)
            .expect("a product of no inputs");
        assert_eq!(out, [0.0; 6]);
    }
}
