//! AVX2 kernel of [`crate::QMatrix::matmul_exact`] for quantized weights:
//! f32 activations against weights dequantized on the fly by a
//! [`Decoder`] (bit-identical to [`crate::dequant::dequantize_row`]).
//!
//! The per-pair arithmetic is exactly that of an F32 weight row in the
//! `float` kernel: four 8-lane f32 accumulators, chunk `c` of eight
//! consecutive elements FMA'd into accumulator `c % 4` in increasing `k`
//! order (`k` is a whole number of 32-element blocks, so there is no tail),
//! then one fixed `hsum((a0 + a1) + (a2 + a3))`. Two tile shapes share it,
//! chosen by the number of activation rows alone:
//!
//! * up to [`FUSED_ROWS`] rows (decoding): *fused*. Each block is decoded
//!   once into registers, eight weights at a time, and FMA'd straight into
//!   the accumulators of every row;
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
use crate::panel_avx512::Paired;
use crate::q8_x86::{Q4_0, Q5_0, Q8_0};
use crate::qtype::QType;
use crate::simd::{hsum, load_f32x8, prefetch, PREFETCH_AHEAD};
use crate::tile::dispatch_group;

/// Most activation rows computed by the fused tile (four accumulators
/// each).
pub(crate) const FUSED_ROWS: usize = 3;

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
    if outs.len() <= FUSED_ROWS {
        dispatch_group!(outs.len(), R => fused::<T, R>(&mut dec, w, rb, x, outs), [1, 2, 3]);
        return;
    }
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
