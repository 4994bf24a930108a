//! AVX-512 VNNI kernel for Q4_0, Q5_0 and Q8_0 weights against two or more
//! Q8_0 activation rows, bit-identical to the kernels of [`crate::q8_x86`].
//!
//! The two 256-bit halves of a register hold one block of two weight rows
//! (`j` low, `j + 1` high), and each activation block is broadcast to both
//! halves, so one 512-bit `dpbusd` forms the eight `i32` lane sums of two
//! (activation row, weight row) pairs: the lane sums of
//! [`crate::simd::vnni_dot_i8x32`], half by half. The weight-side work (the
//! unpacking, the `dpbusd` offset, the block scales) is done once for two
//! weight rows and reused by every activation row. The scale of each half
//! is the same single f32 product `dw * dx` as in `q8_x86`, and the
//! conversion and the FMA act lane by lane on accumulators of their own, so
//! every pair sees exactly the arithmetic of the 256-bit kernel. (Pairing
//! two activation rows per register instead, the weight block broadcast,
//! was measured slower: 7.8 against 7.0 ms for the nine-row LM head.)

use std::arch::x86_64::*;

use crate::block_types::block_bytes;
use crate::qtype::{QType, QK8_0};
use crate::quantize::Q8_0Acts;
use crate::simd::{f16_at, hsum, load_i8x32, load_u8x32, prefetch, PREFETCH_AHEAD};
use crate::tile::{dispatch_group, groups, MAX_GROUP};

use crate::q8_x86::{unpack, Q4_0, Q5_0, Q8_0};

/// Whether this CPU can run [`rows`] (besides AVX2, FMA, F16C).
pub(crate) fn available() -> bool {
    crate::isa::evex_vnni()
}

/// `[a; 8]` in the low half and `[b; 8]` in the high half, from `ab = [a, b]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) fn split_splat(ab: &[f32]) -> __m512 {
    let low = _mm256_castps_pd(_mm256_set1_ps(ab[0]));
    let high = _mm256_castps_pd(_mm256_set1_ps(ab[1]));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(low), high))
}

/// `outs[r][j - j0]` for every activation row `r` (at least two) and weight
/// row `j` of `w` (whole rows of `qtype` blocks over `k` inputs), from
/// activations quantized with the `+128` offset.
///
/// # Safety
/// [`available`] and AVX2, FMA, F16C must hold.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn rows(qtype: QType, w: &[u8], k: usize, acts: &Q8_0Acts, outs: &mut [&mut [f32]]) {
    match qtype {
        QType::Q4_0 => rows_of::<Q4_0>(w, k, acts, outs),
        QType::Q5_0 => rows_of::<Q5_0>(w, k, acts, outs),
        _ => rows_of::<Q8_0>(w, k, acts, outs),
    }
}

/// [`rows`] for block type `T`: weight rows two at a time, each pair against
/// every group of up to [`MAX_GROUP`] activation rows before the next pair.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn rows_of<const T: u8>(w: &[u8], k: usize, acts: &Q8_0Acts, outs: &mut [&mut [f32]]) {
    let rb = k / QK8_0 * block_bytes::<T>();
    let n = w.len() / rb;
    let row_groups: Vec<_> = groups(outs.len(), MAX_GROUP).collect();
    for j in (0..n).step_by(2) {
        prefetch(w, j * rb + PREFETCH_AHEAD, 2 * rb);
        let pair = [
            &w[j * rb..(j + 1) * rb],
            w.get((j + 1) * rb..(j + 2) * rb).unwrap_or(&[]),
        ];
        for &(r0, len) in &row_groups {
            dispatch_group!(
                len,
                R => row_pair::<T, R>(pair, acts, r0, j, outs),
                [1, 2, 3, 4, 5, 6, 7, 8, 9]
            );
        }
    }
}

/// Weight rows `j` and `j + 1` (`wrows[1]` empty when there is no row
/// `j + 1`) against activation rows `r0..r0 + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn row_pair<const T: u8, const R: usize>(
    wrows: [&[u8]; 2],
    acts: &Q8_0Acts,
    r0: usize,
    j: usize,
    outs: &mut [&mut [f32]],
) {
    let bb = block_bytes::<T>();
    let both = !wrows[1].is_empty();
    let mut acc = [_mm512_setzero_ps(); R];
    let minus_128 = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    let half = |blk: &[u8]| match T {
        Q8_0 => load_u8x32(&blk[2..34]),
        _ => unpack::<T>(blk),
    };
    for b in 0..wrows[0].len() / bb {
        let blocks = [
            &wrows[0][b * bb..(b + 1) * bb],
            wrows[1].get(b * bb..(b + 1) * bb).unwrap_or(&[]),
        ];
        let low = _mm512_zextsi256_si512(half(blocks[0]));
        let w = match both {
            true => _mm512_inserti64x4::<1>(low, half(blocks[1])),
            false => low,
        };
        let offset = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, minus_128, w));
        let dw = split_splat(&[
            f16_at(blocks[0]),
            if both { f16_at(blocks[1]) } else { 0.0 },
        ]);
        let (xs, dx) = (acts.codes(b, r0, R), acts.scales(b, r0, R));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_broadcast_i64x4(load_i8x32(&xs[r * QK8_0..]));
            let lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(offset, x, w));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx[r])), lanes, *acc);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        outs[r0 + r][j] = hsum(_mm512_castps512_ps256(*a));
        if both {
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a));
            outs[r0 + r][j + 1] = hsum(_mm256_castpd_ps(high));
        }
    }
}
