//! `LaneMatrix`: quantized weights repacked with output rows in SIMD lanes.
//!
//! * Its dequantized rows equal `QMatrix::dequantize_row`'s values.
//! * Bit for bit, every implementation gives the sequential f32 chain
//!   `acc = fma(w_e, x_e, acc)` over `e = 0..k` (computed here, independently
//!   of the crate), whatever the number of rows, the partial last group of
//!   sixteen outputs, or the instruction set.
//! * Against the f64 product: a sequential f32 sum of `k` terms is within
//!   `k · 2⁻²⁴ · Σ_e |w_e x_e|` (first-order bound, with a 1 % margin).

use proptest::prelude::*;
use tandem_kernels::{Isa, KernelError, LaneMatrix, QType};
use tandem_testkit::bits;

use crate::common::{isas, random_acts, random_matrix, reference, Rng};
use crate::matmul::check_close;

/// The quantized types.
fn quantized() -> Vec<QType> {
    QType::ALL
        .into_iter()
        .filter(|q| q.block_size() > 1)
        .collect()
}

fn packed(qtype: QType, n: usize, k: usize, rng: &mut Rng) -> (LaneMatrix, Vec<f32>) {
    let w = random_matrix(qtype, n, k, rng);
    let lanes = LaneMatrix::pack(&w).expect("a quantized matrix packs");
    (lanes, w.dequantize())
}

fn lane_matmul(w: &LaneMatrix, isa: Isa, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.n()];
    w.matmul_with(isa, x, m, &mut out).expect("lane matmul");
    out
}

/// `fma(w_e, x_e, acc)` in element order, per (row, output).
fn sequential(w_deq: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(m * n);
    for xr in x.chunks_exact(k).take(m) {
        for wr in w_deq.chunks_exact(k).take(n) {
            out.push(
                wr.iter()
                    .zip(xr)
                    .fold(0f32, |acc, (&w, &x)| w.mul_add(x, acc)),
            );
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_isa_computes_the_sequential_fma_chain_bit_for_bit(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let qtype = quantized()[rng.below(quantized().len())];
        let (m, n) = (1 + rng.below(20), 1 + rng.below(70));
        let k = qtype.block_size() * (1 + rng.below(4));
        let (w, w_deq) = packed(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let mut row = vec![0f32; k];
        for (r, want) in w_deq.chunks_exact(k).enumerate() {
            w.dequantize_row(r, &mut row).expect("row in range");
            prop_assert_eq!(&row[..], want, "{:?} row {}", qtype, r);
        }
        let want = sequential(&w_deq, &x, m, n, k);
        let (exact, mag) = reference(&w_deq, &x, m, n, k);
        let tol: Vec<f64> = mag.iter().map(|s| 1.01 * k as f64 * f64::powi(2.0, -24) * s).collect();
        for isa in isas() {
            let got = lane_matmul(&w, isa, &x, m);
            prop_assert_eq!(bits(&got), bits(&want), "{:?} {:?} m={} n={} k={}", qtype, isa, m, n, k);
            check_close(&got, &exact, &tol, &format!("{qtype:?} {isa:?}"));
        }
    }
}

#[test]
fn a_row_computes_the_same_bits_alone_and_in_any_block() {
    let mut rng = Rng::new(7);
    for qtype in quantized() {
        let k = qtype.block_size() * 3;
        let (w, _) = packed(qtype, 50, k, &mut rng);
        let x = random_acts(16, k, &mut rng);
        for isa in isas() {
            let all = lane_matmul(&w, isa, &x, 16);
            for m in 1..=16 {
                let block = lane_matmul(&w, isa, &x[..m * k], m);
                assert_eq!(
                    bits(&block),
                    bits(&all[..m * 50]),
                    "{qtype:?} {isa:?} m={m}"
                );
            }
        }
    }
}

#[test]
fn selected_rows_and_the_whole_matrix_dequantize_like_the_ggml_rows() {
    let mut rng = Rng::new(11);
    for qtype in quantized() {
        let (n, k) = (37, qtype.block_size() * 2);
        let (w, w_deq) = packed(qtype, n, k, &mut rng);
        assert_eq!(w.dequantize(), w_deq, "{qtype:?}");
        let rows = [
            36, 0, 17, 17, 5, 16, 15, 31, 2, 33, 8, 9, 10, 11, 12, 13, 14, 1,
        ];
        let sel = w.select_rows(&rows).expect("rows in range");
        assert_eq!(sel.n(), rows.len());
        let got = sel.dequantize();
        for (i, &r) in rows.iter().enumerate() {
            assert_eq!(
                &got[i * k..(i + 1) * k],
                &w_deq[r * k..(r + 1) * k],
                "{qtype:?} {i}"
            );
        }
        let x = random_acts(3, k, &mut rng);
        let (all, part) = (
            lane_matmul(&w, Isa::Scalar, &x, 3),
            lane_matmul(&sel, Isa::detect(), &x, 3),
        );
        for (i, &r) in rows.iter().enumerate() {
            for row in 0..3 {
                assert_eq!(
                    part[row * rows.len() + i].to_bits(),
                    all[row * n + r].to_bits()
                );
            }
        }
    }
}

#[test]
fn unquantized_matrices_and_bad_buffers_are_refused() {
    let mut rng = Rng::new(3);
    for qtype in [QType::F32, QType::F16] {
        let w = random_matrix(qtype, 4, 32, &mut rng);
        assert!(matches!(LaneMatrix::pack(&w), Err(KernelError::NotQuantized(q)) if q == qtype));
    }
    let (w, _) = packed(QType::Q8_0, 4, 32, &mut rng);
    let mut out = vec![0f32; 8];
    let err = w.matmul(&[0.0; 63], 2, &mut out);
    assert!(matches!(
        err,
        Err(KernelError::BufferLength {
            what: "activations",
            ..
        })
    ));
    let err = w.matmul(&[0.0; 64], 2, &mut out[..7]);
    assert!(matches!(
        err,
        Err(KernelError::BufferLength { what: "output", .. })
    ));
    let err = w.dequantize_row(4, &mut [0.0; 32]);
    assert!(matches!(
        err,
        Err(KernelError::RowOutOfRange { row: 4, n: 4 })
    ));
}
