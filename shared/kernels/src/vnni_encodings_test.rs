//! The 256-bit 8-bit kernels in every encoding this CPU runs, against the
//! AVX2 kernel bit for bit: the AVX-VNNI (VEX) and the AVX-512 VNNI (EVEX)
//! instantiations. [`crate::Isa::AvxVnni`] picks only one of them per CPU
//! (VEX where both exist), so the crate-level proptests cannot reach the
//! other; these call each directly.

use proptest::prelude::*;

use crate::isa::{evex_vnni, vex_vnni};
use crate::quantize::{Q8KActs, Q8_0Acts};
use crate::{Isa, QType};

/// `len` pseudo-random bytes from `seed` (an LCG; every byte pattern,
/// non-finite scales included, is a valid block).
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect()
}

/// `m` activation rows of `k` values with mixed magnitudes.
fn random_acts(m: usize, k: usize, seed: u64) -> Vec<f32> {
    random_bytes(m * k, seed)
        .iter()
        .enumerate()
        .map(|(i, &b)| f32::from(b as i8) * [0.013, 0.37, 5.1][i % 3])
        .collect()
}

/// Output bits of one kernel call over `m` rows and `n` weight rows.
fn run(m: usize, n: usize, kernel: impl FnOnce(&mut [&mut [f32]])) -> Vec<u32> {
    let mut out = vec![f32::NAN; m * n];
    let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
    kernel(&mut outs);
    out.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn q8_0_activation_kernels_match_avx2(
        t in 0usize..3,
        m in 1usize..5,
        n in 1usize..10,
        blocks in 1usize..4,
        seed in any::<u64>(),
    ) {
        // Nothing to compare without AVX2 (rejecting every case would fail the test).
        if !Isa::Avx2.is_available() {
            return Ok(());
        }
        let qtype = [QType::Q4_0, QType::Q5_0, QType::Q8_0][t];
        let k = blocks * qtype.block_size();
        let w = random_bytes(n * blocks * qtype.block_bytes(), seed);
        let x = random_acts(m, k, !seed);
        let (plain, offset) = (Q8_0Acts::quantize(&x, m, k, false), Q8_0Acts::quantize(&x, m, k, true));
        // SAFETY: AVX2, FMA and F16C were detected above, and each VNNI
        // kernel runs only where its encoding was detected.
        let want = run(m, n, |outs| unsafe { crate::q8_x86::rows_avx2(qtype, &w, k, &plain, outs) });
        if vex_vnni() {
            let got = run(m, n, |outs| unsafe { crate::q8_x86::rows_vnni(qtype, &w, k, &offset, outs) });
            prop_assert_eq!(&got, &want, "VEX {:?}", qtype);
        }
        if evex_vnni() {
            let got = run(m, n, |outs| unsafe { crate::q8_x86::rows_vnni_evex(qtype, &w, k, &offset, outs) });
            prop_assert_eq!(&got, &want, "EVEX {:?}", qtype);
        }
    }

    #[test]
    fn k_quant_kernels_match_avx2(
        t in 0usize..4,
        m in 1usize..4,
        n in 1usize..6,
        blocks in 1usize..3,
        seed in any::<u64>(),
    ) {
        // Nothing to compare without AVX2 (rejecting every case would fail the test).
        if !Isa::Avx2.is_available() {
            return Ok(());
        }
        let qtype = [QType::Q4_K, QType::Q5_K, QType::Q6_K, QType::Q8_K][t];
        let k = blocks * qtype.block_size();
        let w = random_bytes(n * blocks * qtype.block_bytes(), seed);
        let acts = Q8KActs::quantize(&random_acts(m, k, !seed), m, k);
        // SAFETY: as in the Q8_0 test above.
        let want = run(m, n, |outs| unsafe { crate::kquants_avx2::rows_avx2(qtype, &w, k, &acts, outs) });
        if vex_vnni() {
            let got = run(m, n, |outs| unsafe { crate::kquants_avx2::rows_vnni(qtype, &w, k, &acts, outs) });
            prop_assert_eq!(&got, &want, "VEX {:?}", qtype);
        }
        if evex_vnni() {
            let got = run(m, n, |outs| unsafe { crate::kquants_avx2::rows_vnni_evex(qtype, &w, k, &acts, outs) });
            prop_assert_eq!(&got, &want, "EVEX {:?}", qtype);
        }
    }
}
