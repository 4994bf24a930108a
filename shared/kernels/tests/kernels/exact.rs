//! `matmul_exact`: f32 activations against weights dequantized exactly as
//! `dequantize_row` does, accumulated in f32.
//!
//! Tolerances, per output `y = Σ_e w_e x_e` (w dequantized, x the f32
//! activations themselves):
//!
//! * against the f64 product: only f32 rounding of the accumulation,
//!   `|y − ref| ≤ 1e-5·Σ_e |w_e x_e|`, with no activation-quantization term.
//!   Since `Σ|w x| ≤ Σ|w|·amax`, this is at least `c/1e-5 ≈ 390` times
//!   tighter than the bound `matmul` is held to (`matmul.rs`), and `matmul`
//!   does break it;
//! * bit for bit: `matmul_exact` equals `matmul` of an F32 matrix holding
//!   `dequantize()`, on every Isa. This pins each dequantized weight and the
//!   summation order;
//! * scalar vs AVX2: they differ only in summation order,
//!   `≤ 1e-5·Σ_e |w_e x_e|`.

use proptest::prelude::*;
use tandem_kernels::{Isa, KernelError, QType};

use crate::common::{
    act_error_bound, dequantized_f32, isas, matmul, matmul_exact, random_acts, random_matrix,
    reference, Rng,
};
use crate::matmul::{check_close, shape, F32_REL};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn exact_matches_the_f64_product_of_the_dequantized_weights(seed in any::<u64>()) {
        let (qtype, m, n, k, mut rng) = shape(seed);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let w_deq = w.dequantize();
        let (want, mag) = reference(&w_deq, &x, m, n, k);
        let tol: Vec<f64> = mag.iter().map(|s| F32_REL * s).collect();
        if qtype.block_size() > 1 {
            let int8_tol: f64 = act_error_bound(qtype, &w_deq, &x, m, n, k)
                .iter()
                .zip(&mag)
                .map(|(b, s)| b + F32_REL * s)
                .sum();
            let exact_tol: f64 = tol.iter().sum();
            prop_assert!(exact_tol <= 0.01 * int8_tol, "{:?}: {} vs {}", qtype, exact_tol, int8_tol);
        }
        for isa in isas() {
            let got = matmul_exact(&w, isa, &x, m);
            check_close(&got, &want, &tol, &format!("{qtype:?} {isa:?} m={m} n={n} k={k}"));
        }
    }

    #[test]
    fn exact_is_the_f32_matmul_of_the_dequantized_matrix_bit_for_bit(seed in any::<u64>()) {
        let (qtype, m, n, k, mut rng) = shape(seed);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let f = dequantized_f32(&w);
        for isa in isas() {
            let got = bits(&matmul_exact(&w, isa, &x, m));
            let want = bits(&matmul(&f, isa, &x, m));
            prop_assert!(got == want, "{:?} {:?} m={} n={} k={}", qtype, isa, m, n, k);
        }
    }

    #[test]
    fn exact_scalar_and_avx2_agree(seed in any::<u64>()) {
        // Nothing to compare without it (rejecting every case would fail the test).
        if !Isa::Avx2.is_available() {
            return Ok(());
        }
        let (qtype, m, n, k, mut rng) = shape(seed);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let (_, mag) = reference(&w.dequantize(), &x, m, n, k);
        let scalar = matmul_exact(&w, Isa::Scalar, &x, m);
        let avx2: Vec<f64> = matmul_exact(&w, Isa::Avx2, &x, m).into_iter().map(f64::from).collect();
        let tol: Vec<f64> = mag.iter().map(|s| F32_REL * s).collect();
        check_close(&scalar, &avx2, &tol, &format!("{qtype:?} scalar vs avx2 m={m} n={n} k={k}"));
    }
}

fn quantized() -> impl Iterator<Item = QType> {
    QType::ALL.into_iter().filter(|q| q.block_size() > 1)
}

#[test]
fn the_int8_path_breaks_the_exact_tolerance() {
    let mut rng = Rng::new(21);
    for qtype in quantized() {
        let (m, n, k) = (4, 16, 512);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let (want, mag) = reference(&w.dequantize(), &x, m, n, k);
        let outside = |got: Vec<f32>| {
            got.iter()
                .zip(&want)
                .zip(&mag)
                .filter(|((&g, &r), &s)| (f64::from(g) - r).abs() > F32_REL * s)
                .count()
        };
        for isa in isas() {
            let int8 = outside(matmul(&w, isa, &x, m));
            assert!(int8 > m * n / 2, "{qtype:?} {isa:?}: only {int8} outputs");
            assert_eq!(
                outside(matmul_exact(&w, isa, &x, m)),
                0,
                "{qtype:?} {isa:?}"
            );
        }
    }
}

#[test]
fn exact_is_matmul_for_float_weights() {
    let mut rng = Rng::new(22);
    for qtype in [QType::F32, QType::F16] {
        let (m, n, k) = (5, 37, 203);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        for isa in isas() {
            assert_eq!(
                bits(&matmul_exact(&w, isa, &x, m)),
                bits(&matmul(&w, isa, &x, m)),
                "{qtype:?} {isa:?}"
            );
        }
    }
}

/// Gemma 3 270M widths (k = 640 for the 32-blocks, 2048 for all) and one
/// row longer than a staging panel, long enough for the thread split, with
/// fused (m ≤ 3) and staged tiles.
#[test]
fn large_shapes_match_the_reference() {
    let mut rng = Rng::new(23);
    for qtype in quantized() {
        for (m, k) in [(1, 2048), (3, 640), (9, 640), (9, 2048), (4, 4608)] {
            if k % qtype.block_size() != 0 {
                continue;
            }
            let n = 131;
            let w = random_matrix(qtype, n, k, &mut rng);
            let x = random_acts(m, k, &mut rng);
            let (want, mag) = reference(&w.dequantize(), &x, m, n, k);
            let tol: Vec<f64> = mag.iter().map(|s| F32_REL * s).collect();
            for isa in isas() {
                let got = matmul_exact(&w, isa, &x, m);
                check_close(&got, &want, &tol, &format!("{qtype:?} {isa:?} m={m} k={k}"));
            }
        }
    }
}

#[test]
fn default_matmul_exact_uses_the_detected_isa() {
    let mut rng = Rng::new(24);
    let w = random_matrix(QType::Q6_K, 9, 512, &mut rng);
    let x = random_acts(5, 512, &mut rng);
    let mut out = vec![0f32; 45];
    assert_eq!(w.matmul_exact(&x, 5, &mut out), Ok(()));
    assert_eq!(bits(&out), bits(&matmul_exact(&w, Isa::detect(), &x, 5)));
}

#[test]
fn exact_call_errors_and_empty_batches() {
    let w = random_matrix(QType::Q5_0, 3, 64, &mut Rng::new(25));
    let mut out = vec![0f32; 6];
    for isa in isas() {
        assert_eq!(w.matmul_exact_with(isa, &[], 0, &mut []), Ok(()));
        assert_eq!(
            w.matmul_exact_with(isa, &[0.0; 127], 2, &mut out),
            Err(KernelError::BufferLength {
                what: "activations",
                expected: 128,
                actual: 127
            })
        );
        assert_eq!(
            w.matmul_exact_with(isa, &[0.0; 128], 2, &mut out[..5]),
            Err(KernelError::BufferLength {
                what: "output",
                expected: 6,
                actual: 5
            })
        );
        assert!(matches!(
            w.matmul_exact_with(isa, &[0.0; 128], usize::MAX, &mut out),
            Err(KernelError::SizeOverflow { .. })
        ));
    }
    for isa in [Isa::Avx2, Isa::AvxVnni]
        .into_iter()
        .filter(|i| !i.is_available())
    {
        assert_eq!(
            w.matmul_exact_with(isa, &[0.0; 128], 2, &mut out),
            Err(KernelError::IsaUnavailable(isa))
        );
    }
}
