//! AVX2 kernel of [`crate::QMatrix::matmul_exact`] for quantized weights:
//! f32 activations against weights dequantized on the fly by a
//! [`Decoder`] (bit-identical to [`crate::dequant::dequantize_row`]).
//!
//! The per-pair arithmetic is exactly that of an F32 weight row in the
//! `float` kernel: four 8-lane f32 accumulators, chunk `c` of eight
//! consecutive elements FMA'd into accumulator `c % 4` in increasing `k`
//! order (`k` is a whole number of 32-element blocks, so there is no tail),
//! then one fixed `hsum((a0 + a1) + (a2 + a3))`. Three tile shapes share
//! it, chosen by the shape of the activations and the CPU alone ([`Plan`]):
//!
//! * up to [`FUSED_ROWS`] rows (decoding): *fused*. Each block is decoded
//!   once into registers, eight weights at a time, and FMA'd straight into
//!   the accumulators of every row;
//! * with AVX-512F, up to [`WIDE_ROWS`] rows whose activations fit in L1:
//!   *fused wide*, the same with sixteen weights and two accumulators per
//!   register;
//! * more rows (verification): *staged*. A panel of a few weight rows is
//!   dequantized once into an aligned f32 scratch panel, which the panel
//!   kernel (`panel_avx2`: AVX2 tiles, or AVX-512 tiles with two activation
//!   rows per register) then dots with every activation row.
//!
//! Either way every pair sees the same products in the same accumulators
//! in the same order, so the split cannot change a result.

use std::arch::x86_64::*;

use crate::dequant_avx2::{block_bytes, block_len, Decoder};
use crate::kquants_avx2::{Q4_K, Q5_K, Q6_K, Q8_K};
use crate::panel_avx2::Panel;
use crate::panel_avx512::{wide_available, Paired};
use crate::q8_x86::{Q4_0, Q5_0, Q8_0};
use crate::qtype::QType;
use crate::simd::{hsum, load_f32x8, prefetch, PREFETCH_AHEAD};
use crate::tile::dispatch_group;

/// Most activation rows computed by the fused tile (four accumulators
/// each).
const FUSED_ROWS: usize = 3;

/// Most activation rows of the wide fused tile (two 16-lane accumulators
/// each, 18 of the 32 registers).
const WIDE_ROWS: usize = 9;

/// Most bytes of activations the wide fused tile reads per weight row: they
/// must stay in L1 (beyond, the staged panel is faster).
const WIDE_ACT_BYTES: usize = 24 << 10;

/// How a matmul of `m` activation rows of `k` is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// [`fused`], 8 lanes.
    Fused,
    /// [`fused_wide`], 16 lanes (AVX-512F).
    FusedWide,
    /// A dequantized panel and the panel kernel.
    Staged,
}

impl Plan {
    /// The plan for `m` rows of `k`, given whether AVX-512F and VL exist.
    pub(crate) fn choose(m: usize, k: usize, wide: bool) -> Plan {
        let fits = m <= WIDE_ROWS && m * k * 4 <= WIDE_ACT_BYTES;
        match (wide, m <= FUSED_ROWS) {
            (true, true) => Plan::FusedWide,
            (true, false) if fits => Plan::FusedWide,
            (false, true) => Plan::Fused,
            _ => Plan::Staged,
        }
    }
}

/// Output rows of `w` (whole rows of `qtype` bytes) against all activation
/// rows `x` (`m * k` f32); `outs[r][j]` receives row `r` · weight row `j`.
/// F32 and F16 weights go to the `float` kernel unchanged.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn rows_avx2(
    qtype: QType,
    w: &[u8],
    k: usize,
    x: &[f32],
    paired: Option<&Paired>,
    outs: &mut [&mut [f32]],
) {
    match qtype {
        QType::F32 | QType::F16 => crate::float::rows_avx2(qtype, w, k, x, outs),
        QType::Q4_0 => rows::<Q4_0>(w, k, x, paired, outs),
        QType::Q5_0 => rows::<Q5_0>(w, k, x, paired, outs),
        QType::Q8_0 => rows::<Q8_0>(w, k, x, paired, outs),
        QType::Q4_K => rows::<Q4_K>(w, k, x, paired, outs),
        QType::Q5_K => rows::<Q5_K>(w, k, x, paired, outs),
        QType::Q6_K => rows::<Q6_K>(w, k, x, paired, outs),
        QType::Q8_K => rows::<Q8_K>(w, k, x, paired, outs),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows<const T: u8>(
    w: &[u8],
    k: usize,
    x: &[f32],
    paired: Option<&Paired>,
    outs: &mut [&mut [f32]],
) {
    let rb = k / block_len::<T>() * block_bytes::<T>();
    let mut dec = Decoder::new();
    match Plan::choose(outs.len(), k, wide_available()) {
        Plan::Fused => {
            dispatch_group!(outs.len(), R => fused::<T, R>(&mut dec, w, rb, x, outs), [1, 2, 3]);
        }
        // SAFETY: `choose` picks `FusedWide` only where AVX-512F and VL exist.
        Plan::FusedWide => unsafe { fused_wide::<T>(&mut dec, w, rb, x, outs) },
        Plan::Staged => staged::<T>(&mut dec, w, rb, x, paired, outs),
    }
}

/// Every weight row of `w` (`rb` bytes each) against all activation rows,
/// a dequantized panel at a time; the panel kernel is the wide one when
/// the activations were `paired` for it.
#[target_feature(enable = "avx2,fma,f16c")]
fn staged<const T: u8>(
    dec: &mut Decoder,
    w: &[u8],
    rb: usize,
    x: &[f32],
    paired: Option<&Paired>,
    outs: &mut [&mut [f32]],
) {
    let k = rb / block_bytes::<T>() * block_len::<T>();
    let mut kernel = Panel::new(paired);
    let panel_rows = kernel.rows(k);
    let mut lanes = vec![_mm256_setzero_ps(); panel_rows * k / 8];
    // SAFETY: the `f32` slice covers exactly the memory of `lanes` (eight
    // plain `f32` per `__m256`), which it borrows mutably; the registers
    // keep the panel 32-byte aligned, so no load of a chunk splits a line.
    let scratch: &mut [f32] =
        unsafe { std::slice::from_raw_parts_mut(lanes.as_mut_ptr().cast(), panel_rows * k) };
    let step = panel_rows * rb;
    for (p, panel) in w.chunks(step).enumerate() {
        for (wrow, dst) in panel.chunks_exact(rb).zip(scratch.chunks_exact_mut(k)) {
            if paired.is_some() {
                // SAFETY: a `Paired` exists only where AVX-512F and VL were
                // detected.
                unsafe { dec.row_wide::<T>(wrow, dst) };
            } else {
                dec.row::<T>(wrow, dst);
            }
        }
        let len = panel.len() / rb;
        let ahead = w
            .get((p + 1) * step..)
            .map_or(&[][..], |a| &a[..a.len().min(step)]);
        kernel.run(&scratch[..len * k], k, x, p * panel_rows, outs, ahead);
    }
}

/// Every weight row of `w` (`rb` bytes each) against the `R` activation
/// rows of `x`, decoding each block once for all `R` rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fused<const T: u8, const R: usize>(
    dec: &mut Decoder,
    w: &[u8],
    rb: usize,
    x: &[f32],
    outs: &mut [&mut [f32]],
) {
    let (len, bb) = (block_len::<T>(), block_bytes::<T>());
    let k = rb / bb * len;
    for (j, wrow) in w.chunks_exact(rb).enumerate() {
        prefetch(w, j * rb + PREFETCH_AHEAD, rb);
        // acc[i][r]: accumulator i (chunks c ≡ i mod 4) of activation row r.
        let mut acc = [[_mm256_setzero_ps(); R]; 4];
        for (b, blk) in wrow.chunks_exact(bb).enumerate() {
            dec.load::<T>(blk);
            let mut xb: [&[f32]; R] = [&[]; R];
            for (r, xb) in xb.iter_mut().enumerate() {
                *xb = &x[r * k + b * len..r * k + (b + 1) * len];
            }
            for c4 in 0..len / 32 {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let c = 4 * c4 + i;
                    let wv = dec.weights::<T>(blk, c);
                    for r in 0..R {
                        acc[r] = _mm256_fmadd_ps(wv, load_f32x8(&xb[r][8 * c..]), acc[r]);
                    }
                }
            }
        }
        let [a0, a1, a2, a3] = acc;
        for r in 0..R {
            let (low, high) = (_mm256_add_ps(a0[r], a1[r]), _mm256_add_ps(a2[r], a3[r]));
            outs[r][j] = hsum(_mm256_add_ps(low, high));
        }
    }
}

/// [`fused`] sixteen weights at a time (AVX-512F), for every weight row
/// of `w` against all (at most [`WIDE_ROWS`]) activation rows. The
/// accumulators of a pair
/// are held two per 16-lane register, `[a0 | a1]` and `[a2 | a3]`, and
/// sixteen consecutive weights (chunks `2h` and `2h + 1`) advance one of the
/// two with one FMA: lane for lane the 8-lane arithmetic of [`fused`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
fn fused_wide<const T: u8>(
    dec: &mut Decoder,
    w: &[u8],
    rb: usize,
    x: &[f32],
    outs: &mut [&mut [f32]],
) {
    let k = rb / block_bytes::<T>() * block_len::<T>();
    let x = &x[..outs.len() * k];
    for (j, wrow) in w.chunks_exact(rb).enumerate() {
        prefetch(w, j * rb + PREFETCH_AHEAD, rb);
        dispatch_group!(
            outs.len(),
            R => wide_row::<T, R>(dec, wrow, x, j, outs),
            [1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
    }
}

/// One weight row `wrow` against the `R` activation rows of `x`, into
/// column `j` of `outs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
fn wide_row<const T: u8, const R: usize>(
    dec: &mut Decoder,
    wrow: &[u8],
    x: &[f32],
    j: usize,
    outs: &mut [&mut [f32]],
) {
    let (len, bb) = (block_len::<T>(), block_bytes::<T>());
    let k = wrow.len() / bb * len;
    assert!(x.len() == R * k && outs.len() == R);
    // acc[0][r] = [a0 | a1], acc[1][r] = [a2 | a3] of activation row r.
    let mut acc = [[_mm512_setzero_ps(); R]; 2];
    for (b, blk) in wrow.chunks_exact(bb).enumerate() {
        dec.load::<T>(blk);
        for h in 0..len / 16 {
            let wv = dec.weights16::<T>(blk, h);
            let at = b * len + 16 * h;
            for (r, acc) in acc[h % 2].iter_mut().enumerate() {
                // SAFETY: `at + 16 <= k`, so the 16 floats lie in row `r` of
                // `x` (R rows of k, asserted).
                let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(r * k + at)) };
                *acc = _mm512_fmadd_ps(wv, xv, *acc);
            }
        }
    }
    for r in 0..R {
        let halves = |v: __m512| {
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
            (_mm512_castps512_ps256(v), _mm256_castpd_ps(high))
        };
        let ((a0, a1), (a2, a3)) = (halves(acc[0][r]), halves(acc[1][r]));
        let (low, high) = (_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        outs[r][j] = hsum(_mm256_add_ps(low, high));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Isa;

    /// Rows of a `T` matrix `w` against `m` activation rows by one plan (the
    /// staged plan with the narrow or, when `paired`, the wide panel).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn by_plan<const T: u8>(
        plan: Plan,
        wide_panel: bool,
        w: &[u8],
        k: usize,
        x: &[f32],
    ) -> Vec<u32> {
        let (rb, m) = (k / block_len::<T>() * block_bytes::<T>(), x.len() / k);
        let n = w.len() / rb;
        let mut out = vec![vec![f32::NAN; n]; m];
        let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
        let mut dec = Decoder::new();
        match plan {
            Plan::Fused => {
                dispatch_group!(m, R => fused::<T, R>(&mut dec, w, rb, x, &mut outs), [1, 2, 3]);
            }
            // SAFETY: the caller checked AVX-512F and VL.
            Plan::FusedWide => unsafe { fused_wide::<T>(&mut dec, w, rb, x, &mut outs) },
            Plan::Staged => {
                // SAFETY: the caller checked AVX-512F and VL when `wide_panel`.
                let paired = wide_panel.then(|| unsafe { Paired::new(x, m, k) });
                staged::<T>(&mut dec, w, rb, x, paired.as_ref(), &mut outs);
            }
        }
        out.iter().flatten().map(|v| v.to_bits()).collect()
    }

    /// Every plan that can run `m` rows, by the type parameter of `qtype`.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn all_plans(qtype: QType, w: &[u8], k: usize, x: &[f32]) -> Vec<Vec<u32>> {
        let m = x.len() / k;
        let wide = wide_available();
        let mut plans = vec![(Plan::Staged, false)];
        if m <= FUSED_ROWS {
            plans.push((Plan::Fused, false));
        }
        if wide {
            plans.push((Plan::Staged, true));
            if m <= WIDE_ROWS {
                plans.push((Plan::FusedWide, false));
            }
        }
        let run = |(plan, panel): (Plan, bool)| match qtype {
            QType::Q4_0 => by_plan::<Q4_0>(plan, panel, w, k, x),
            QType::Q5_0 => by_plan::<Q5_0>(plan, panel, w, k, x),
            QType::Q8_0 => by_plan::<Q8_0>(plan, panel, w, k, x),
            QType::Q4_K => by_plan::<Q4_K>(plan, panel, w, k, x),
            QType::Q5_K => by_plan::<Q5_K>(plan, panel, w, k, x),
            QType::Q6_K => by_plan::<Q6_K>(plan, panel, w, k, x),
            _ => by_plan::<Q8_K>(plan, panel, w, k, x),
        };
        plans.into_iter().map(run).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Fused, wide fused and both staged panels give the same bits for
        /// every output, whichever one `Plan::choose` would pick here.
        #[test]
        fn every_plan_gives_the_same_bits(
            t in 2..QType::ALL.len(),
            blocks in 1usize..5,
            n in 1usize..20,
            m in 1usize..12,
            seed in any::<u64>(),
        ) {
            // Nothing to compare without it (rejecting every case would fail the test).
            if !Isa::Avx2.is_available() {
                return Ok(());
            }
            let qtype = QType::ALL[t];
            let k = blocks * qtype.block_size();
            let mut state = seed | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let mut w: Vec<u8> = (0..n * qtype.row_bytes(k).unwrap_or(0)).map(|_| next() as u8).collect();
            for blk in w.chunks_exact_mut(qtype.block_bytes()) {
                // Small finite scales where the format keeps them.
                match qtype {
                    QType::Q6_K => blk[208..210].copy_from_slice(&[0x00, 0x20]),
                    QType::Q8_K => blk[0..4].copy_from_slice(&0.01f32.to_le_bytes()),
                    QType::Q4_K | QType::Q5_K => blk[0..4].copy_from_slice(&[0x00, 0x20, 0x00, 0x20]),
                    _ => blk[0..2].copy_from_slice(&[0x00, 0x20]),
                }
            }
            let x: Vec<f32> = (0..m * k).map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect();
            // SAFETY: AVX2, FMA and F16C were detected above.
            let results = unsafe { all_plans(qtype, &w, k, &x) };
            for r in &results[1..] {
                prop_assert_eq!(r, &results[0], "{:?} m={} n={} k={}", qtype, m, n, k);
            }
        }
    }
}
