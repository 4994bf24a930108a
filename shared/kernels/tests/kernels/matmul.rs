//! Accuracy of `matmul` against f64 references.
//!
//! Tolerances, per output `y = Σ_e w_e x_e` (w dequantized):
//!
//! * against the *unquantized* activations: the activation codes err by at
//!   most half a step, so `|y − ref| ≤ Σ_e |w_e|·c·amax(block of e)
//!   + 1e-5·Σ_e |w_e x_e|`, where `c = (0.5 + 127/2048)/127` for Q8_0
//!   activations (f16 scale) and `0.5/127` for Q8_K (each +1%), and `c = 0`
//!   for F32/F16 weights; `1e-5` covers f32 rounding of the accumulation;
//! * against the *quantized* activations (an independent re-implementation of
//!   ggml's activation quantizers): only f32 rounding remains,
//!   `|y − ref| ≤ 1e-5·Σ_e |w_e xq_e|`;
//! * scalar vs AVX2: both see identical integer block sums, so they differ
//!   only by f32 summation order: `≤ 1e-5·Σ_e |w_e xq_e|`.

use proptest::prelude::*;
use tandem_kernels::{Isa, QType};

use crate::common::{
    act_error_bound, isas, matmul, quantized_acts, random_acts, random_k, random_matrix, reference,
    Rng,
};

/// f32 accumulation tolerance relative to `Σ |w x|`.
pub const F32_REL: f64 = 1e-5;

/// A random type and shape (m 1..=17, n 1..=70, k up to 4 blocks) and the
/// generator to draw its data from.
pub fn shape(seed: u64) -> (QType, usize, usize, usize, Rng) {
    let mut rng = Rng::new(seed);
    let qtype = QType::ALL[rng.below(QType::ALL.len())];
    let m = 1 + rng.below(17);
    let n = 1 + rng.below(70);
    let k = random_k(qtype, 4, &mut rng);
    (qtype, m, n, k, rng)
}

/// Asserts `|got − want| ≤ tol` element-wise.
pub fn check_close(got: &[f32], want: &[f64], tol: &[f64], what: &str) {
    for (idx, ((&g, &r), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let err = (f64::from(g) - r).abs();
        assert!(
            err <= t + 1e-30,
            "{what}: output {idx}: got {g}, want {r}, err {err:e} > tol {t:e}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matmul_matches_unquantized_f64_reference(seed in any::<u64>()) {
        let (qtype, m, n, k, mut rng) = shape(seed);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let w_deq = w.dequantize();
        let (want, mag) = reference(&w_deq, &x, m, n, k);
        let bound = act_error_bound(qtype, &w_deq, &x, m, n, k);
        let tol: Vec<f64> = bound.iter().zip(&mag).map(|(b, s)| b + F32_REL * s).collect();
        for isa in isas() {
            let got = matmul(&w, isa, &x, m);
            check_close(&got, &want, &tol, &format!("{qtype:?} {isa:?} m={m} n={n} k={k}"));
        }
    }

    #[test]
    fn matmul_matches_quantized_activation_reference(seed in any::<u64>()) {
        let (qtype, m, n, k, mut rng) = shape(seed);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let xq = quantized_acts(qtype, &x);
        let (want, mag) = reference(&w.dequantize(), &xq, m, n, k);
        let tol: Vec<f64> = mag.iter().map(|s| F32_REL * s).collect();
        for isa in isas() {
            let got = matmul(&w, isa, &x, m);
            check_close(&got, &want, &tol, &format!("{qtype:?} {isa:?} m={m} n={n} k={k}"));
        }
    }

    #[test]
    fn scalar_and_avx2_agree(seed in any::<u64>()) {
        // Nothing to compare without it (rejecting every case would fail the test).
        if !Isa::Avx2.is_available() {
            return Ok(());
        }
        let (qtype, m, n, k, mut rng) = shape(seed);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let xq = quantized_acts(qtype, &x);
        let (_, mag) = reference(&w.dequantize(), &xq, m, n, k);
        let scalar = matmul(&w, Isa::Scalar, &x, m);
        let avx2: Vec<f64> = matmul(&w, Isa::Avx2, &x, m).into_iter().map(f64::from).collect();
        let tol: Vec<f64> = mag.iter().map(|s| F32_REL * s).collect();
        check_close(&scalar, &avx2, &tol, &format!("{qtype:?} scalar vs avx2 m={m} n={n} k={k}"));
    }
}

#[test]
fn default_matmul_uses_the_detected_isa() {
    let mut rng = Rng::new(7);
    let w = random_matrix(QType::Q4_K, 9, 512, &mut rng);
    let x = random_acts(3, 512, &mut rng);
    let mut out = vec![0f32; 27];
    assert_eq!(w.matmul(&x, 3, &mut out), Ok(()));
    let expected = matmul(&w, Isa::detect(), &x, 3);
    assert!(out
        .iter()
        .zip(&expected)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn zero_rows_is_a_no_op() {
    let mut rng = Rng::new(8);
    let w = random_matrix(QType::Q8_0, 4, 64, &mut rng);
    for isa in isas() {
        assert_eq!(w.matmul_with(isa, &[], 0, &mut []), Ok(()));
    }
}

#[test]
fn large_shapes_match_reference_on_the_parallel_path() {
    let mut rng = Rng::new(9);
    for qtype in QType::ALL {
        let (m, n, k) = (5, 301, 512);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let (want, mag) = reference(&w.dequantize(), &quantized_acts(qtype, &x), m, n, k);
        let tol: Vec<f64> = mag.iter().map(|s| F32_REL * s).collect();
        for isa in isas() {
            check_close(
                &matmul(&w, isa, &x, m),
                &want,
                &tol,
                &format!("{qtype:?} {isa:?}"),
            );
        }
    }
}

/// One-hot weight rows read back the activation codes: `out[j] = d·q_j`.
fn one_hot(qtype: QType, k: usize) -> tandem_kernels::QMatrix {
    let bb = qtype.block_bytes();
    let mut bytes = vec![0u8; k * k / qtype.block_size() * bb];
    for (j, row) in bytes
        .chunks_exact_mut(k / qtype.block_size() * bb)
        .enumerate()
    {
        let blk = &mut row[j / qtype.block_size() * bb..][..bb];
        if qtype == QType::Q8_0 {
            blk[..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
            blk[2 + j % 32] = 1;
        } else {
            blk[..4].copy_from_slice(&1f32.to_le_bytes());
            blk[4 + j % 256] = 1;
        }
    }
    match tandem_kernels::QMatrix::new(qtype, k, k, bytes) {
        Ok(w) => w,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn activation_codes_round_ties_to_even_like_ggml() {
    for (qtype, k, lead) in [(QType::Q8_0, 32, 127f32), (QType::Q8_K, 256, -127f32)] {
        // The lead element fixes the scale to exactly 1 (Q8_K maps its
        // largest-magnitude element to -127, hence the negative lead), so
        // the codes are the rounded inputs, with halves among them.
        let mut x = vec![lead];
        x.extend((1..k).map(|e| (e as f32 - 60.0) / 2.0));
        x.iter_mut()
            .skip(1)
            .for_each(|v| *v = v.clamp(-126.5, 126.5));
        for isa in isas() {
            let got = matmul(&one_hot(qtype, k), isa, &x, 1);
            for (e, (&g, &v)) in got.iter().zip(&x).enumerate() {
                assert_eq!(
                    g,
                    v.round_ties_even(),
                    "{qtype:?} {isa:?} element {e} of {v}"
                );
            }
        }
    }
}
