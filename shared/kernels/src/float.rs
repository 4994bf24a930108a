//! f32 activations: the kernels of [`crate::QMatrix::matmul`] for F32 / F16
//! weights.
//!
//! The portable path widens each weight row once and dots it with every
//! activation row; on AVX2 the rows are read in place. Either way, for one
//! (activation row, output row) pair the
//! arithmetic depends on `k` and the [`crate::Isa`] only:
//!
//! * AVX2: per pair, four 8-lane f32 accumulators take consecutive chunks of
//!   32 elements (`acc[i] = fma(w, x, acc[i])`), leftover chunks of 8 go to
//!   `acc[0..]` in order, then `hsum((acc0 + acc1) + (acc2 + acc3))` and the
//!   last `k % 8` products are added one by one.
//! * Scalar: `acc += w * x` in element order.
//!
//! Up to three activation rows share each loaded weight vector; rows,
//! groups and the thread split never touch the per-pair order.

use half::f16;

use crate::qtype::QType;

/// Widens one weight row (`k` elements of F32 or F16 bytes) to `f32`.
pub(crate) fn decode_row(qtype: QType, row: &[u8], out: &mut [f32]) {
    if qtype == QType::F16 {
        for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
            *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
    } else {
        for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

/// Portable path: output rows of `w` (whole rows of `qtype` bytes) against
/// all activation rows `x` (`m * k`); `outs[r][j]` receives row `r` · weight
/// row `j`.
pub(crate) fn rows_scalar(qtype: QType, w: &[u8], k: usize, x: &[f32], outs: &mut [&mut [f32]]) {
    let mut row = vec![0f32; k];
    let row_bytes = k / qtype.block_size() * qtype.block_bytes();
    for (j, wrow) in w.chunks_exact(row_bytes).enumerate() {
        decode_row(qtype, wrow, &mut row);
        for (out, xr) in outs.iter_mut().zip(x.chunks_exact(k)) {
            out[j] = row.iter().zip(xr).fold(0f32, |acc, (&w, &x)| acc + w * x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::rows_avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::qtype::QType;
    use crate::simd::{
        hsum, load_f16x8_bytes, load_f32x8, load_f32x8_bytes, prefetch, PREFETCH_AHEAD,
    };
    use crate::tile::{dispatch_group, groups};

    /// Activation rows per register tile (4 accumulators each).
    const MAX_GROUP: usize = 3;

    /// AVX2 path of [`super::rows_scalar`] for F32 and F16 weights.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn rows_avx2(qtype: QType, w: &[u8], k: usize, x: &[f32], outs: &mut [&mut [f32]]) {
        if qtype == QType::F16 {
            rows::<true>(w, k, x, outs);
        } else {
            rows::<false>(w, k, x, outs);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows<const HALF: bool>(w: &[u8], k: usize, x: &[f32], outs: &mut [&mut [f32]]) {
        let row_bytes = k * if HALF { 2 } else { 4 };
        for (j, wrow) in w.chunks_exact(row_bytes).enumerate() {
            prefetch(w, j * row_bytes + PREFETCH_AHEAD, row_bytes);
            row::<HALF>(wrow, k, x, j, outs);
        }
    }

    /// Weight row `j` against every activation row, in groups of up to
    /// [`MAX_GROUP`] rows, writing column `j` of `outs`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn row<const HALF: bool>(wrow: &[u8], k: usize, x: &[f32], j: usize, outs: &mut [&mut [f32]]) {
        for (r0, len) in groups(outs.len(), MAX_GROUP) {
            let outs = &mut outs[r0..r0 + len];
            let x = &x[r0 * k..];
            dispatch_group!(len, R => group::<HALF, R>(wrow, k, x, j, outs), [1, 2, 3]);
        }
    }

    /// Eight weights starting at element `e`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load_w<const HALF: bool>(wrow: &[u8], e: usize) -> __m256 {
        if HALF {
            load_f16x8_bytes(&wrow[2 * e..])
        } else {
            load_f32x8_bytes(&wrow[4 * e..])
        }
    }

    /// Weight `e` as `f32`.
    #[inline]
    fn weight<const HALF: bool>(wrow: &[u8], e: usize) -> f32 {
        if HALF {
            half::f16::from_le_bytes([wrow[2 * e], wrow[2 * e + 1]]).to_f32()
        } else {
            f32::from_le_bytes([
                wrow[4 * e],
                wrow[4 * e + 1],
                wrow[4 * e + 2],
                wrow[4 * e + 3],
            ])
        }
    }

    /// One weight row against the `R` activation rows at the start of `x`,
    /// writing column `j` of `outs`. The arithmetic per pair is independent
    /// of `R`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn group<const HALF: bool, const R: usize>(
        wrow: &[u8],
        k: usize,
        x: &[f32],
        j: usize,
        outs: &mut [&mut [f32]],
    ) {
        let wb = if HALF { 2 } else { 4 };
        let mut xr: [&[f32]; R] = [&[]; R];
        for (r, xr) in xr.iter_mut().enumerate() {
            *xr = &x[r * k..(r + 1) * k];
        }
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let full = k / 32 * 32;
        for (c, wc) in wrow[..full * wb].chunks_exact(32 * wb).enumerate() {
            let wv = [
                load_w::<HALF>(wc, 0),
                load_w::<HALF>(wc, 8),
                load_w::<HALF>(wc, 16),
                load_w::<HALF>(wc, 24),
            ];
            for r in 0..R {
                let xc = &xr[r][32 * c..32 * c + 32];
                for i in 0..4 {
                    acc[r][i] = _mm256_fmadd_ps(wv[i], load_f32x8(&xc[8 * i..]), acc[r][i]);
                }
            }
        }
        let eights = k / 8 * 8;
        for (i, e) in (full..eights).step_by(8).enumerate() {
            let wv = load_w::<HALF>(wrow, e);
            for r in 0..R {
                acc[r][i] = _mm256_fmadd_ps(wv, load_f32x8(&xr[r][e..]), acc[r][i]);
            }
        }
        for r in 0..R {
            let [a0, a1, a2, a3] = acc[r];
            let mut sum = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for (e, &xe) in xr[r].iter().enumerate().skip(eights) {
                sum += weight::<HALF>(wrow, e) * xe;
            }
            outs[r][j] = sum;
        }
    }
}
