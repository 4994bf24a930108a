//! The 256-bit 8-bit kernels in every encoding this CPU runs, against the
//! AVX2 kernel bit for bit: the AVX-VNNI (VEX) and the AVX-512 VNNI (EVEX)
//! instantiations. [`crate::Isa::AvxVnni`] picks only one of them per CPU
//! (VEX where both exist), so the crate-level proptests cannot reach the
//! other; these call each directly.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::isa::{evex_vnni, vex_vnni};
use crate::quantize::{Q8KActs, Q8_0Acts};
use crate::test_data::random_bytes;
use crate::{Isa, QType};

/// A 256-bit kernel entry point taking activations `A`.
type Kernel<A> = unsafe fn(QType, &[u8], usize, &A, &mut [&mut [f32]]);

/// `m` activation rows of `k` values with mixed magnitudes.
fn random_acts(m: usize, k: usize, seed: u64) -> Vec<f32> {
    random_bytes(m * k, seed)
        .iter()
        .enumerate()
        .map(|(i, &b)| f32::from(b as i8) * [0.013, 0.37, 5.1][i % 3])
        .collect()
}

/// `n` random weight rows of `qtype` over `k` inputs, against `m`
/// activation rows.
struct Product {
    qtype: QType,
    w: Vec<u8>,
    k: usize,
    m: usize,
    n: usize,
}

impl Product {
    fn new(qtype: QType, blocks: usize, m: usize, n: usize, seed: u64) -> Product {
        let w = random_bytes(n * blocks * qtype.block_bytes(), seed);
        let k = blocks * qtype.block_size();
        Product { qtype, w, k, m, n }
    }

    /// Output bits of `kernel` on `acts`.
    ///
    /// # Safety
    /// The instruction sets `kernel` is compiled for must be present.
    unsafe fn bits<A>(&self, kernel: Kernel<A>, acts: &A) -> Vec<u32> {
        let mut out = vec![f32::NAN; self.m * self.n];
        let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(self.n).collect();
        // SAFETY: the caller vouches for the instruction sets.
        unsafe { kernel(self.qtype, &self.w, self.k, acts, &mut outs) };
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// Checks the VEX and EVEX kernels `[vex, evex]` that this CPU runs, on
    /// `acts`, against `want`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be present.
    unsafe fn check_vnni<A>(
        &self,
        want: &[u32],
        [vex, evex]: [Kernel<A>; 2],
        acts: &A,
    ) -> Result<(), TestCaseError> {
        for (name, present, kernel) in [("VEX", vex_vnni(), vex), ("EVEX", evex_vnni(), evex)] {
            if present {
                // SAFETY: the caller vouches for AVX2, FMA and F16C, and this
                // kernel's VNNI encoding was just detected.
                let got = unsafe { self.bits(kernel, acts) };
                prop_assert_eq!(&got[..], want, "{} {:?}", name, self.qtype);
            }
        }
        Ok(())
    }
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
        let p = Product::new([QType::Q4_0, QType::Q5_0, QType::Q8_0][t], blocks, m, n, seed);
        let x = random_acts(m, p.k, !seed);
        let offset = Q8_0Acts::quantize(&x, m, p.k, true);
        // SAFETY: AVX2, FMA and F16C were detected above.
        unsafe {
            let want = p.bits(crate::q8_x86::rows_avx2, &Q8_0Acts::quantize(&x, m, p.k, false));
            p.check_vnni(&want, [crate::q8_x86::rows_vnni, crate::q8_x86::rows_vnni_evex], &offset)?;
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
        let p = Product::new([QType::Q4_K, QType::Q5_K, QType::Q6_K, QType::Q8_K][t], blocks, m, n, seed);
        let acts = Q8KActs::quantize(&random_acts(m, p.k, !seed), m, p.k);
        // SAFETY: AVX2, FMA and F16C were detected above.
        unsafe {
            let want = p.bits(crate::kquants_avx2::rows_avx2, &acts);
            p.check_vnni(&want, [crate::kquants_avx2::rows_vnni, crate::kquants_avx2::rows_vnni_evex], &acts)?;
        }
    }
}
