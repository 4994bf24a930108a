//! AVX-512 VNNI kernel for Q4_0, Q5_0 and Q8_0 weights against two or more
//! Q8_0 activation rows, bit-identical to the kernels of [`crate::q8_x86`].
//!
//! [`crate::quantize::Q8_0Acts`] stores block `b` of consecutive rows one
//! after the other, so one 64-byte load holds the codes of rows `r` and
//! `r + 1`. With the unpacked weight block broadcast to both 256-bit halves,
//! one 512-bit `dpbusd` forms the eight `i32` lane sums of two (activation
//! row, weight row) pairs: the lane sums of [`crate::simd::vnni_dot_i8x32`],
//! half by half. The scale of each half is the same single f32 product
//! `dw * dx` as in `q8_x86`, and the conversion and the FMA act lane by lane
//! on accumulators of their own, so every pair sees exactly the arithmetic
//! of the 256-bit kernel, at half the instructions. An odd last row of a
//! group runs the 256-bit arithmetic itself.

use std::arch::x86_64::*;

use crate::qtype::{QType, QK8_0};
use crate::quantize::Q8_0Acts;
use crate::simd::{f16_at, hsum, load_i8x32, load_u8x32, prefetch, PREFETCH_AHEAD};
use crate::tile::{dispatch_group, groups, MAX_GROUP};

use crate::q8_x86::{unpack, Q4_0, Q5_0, Q8_0};

/// Whether this CPU can run [`rows`] (besides AVX2, FMA, F16C, AVX-VNNI).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

const fn block_bytes<const T: u8>() -> usize {
    match T {
        Q4_0 => QType::Q4_0.block_bytes(),
        Q5_0 => QType::Q5_0.block_bytes(),
        _ => QType::Q8_0.block_bytes(),
    }
}

/// Loads 64 bytes from the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn load_i8x64(s: &[i8]) -> __m512i {
    assert!(s.len() >= 64);
    // SAFETY: `s` has at least 64 readable bytes and `loadu` has no alignment
    // requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// `[a; 8]` in the low half and `[b; 8]` in the high half, from `ab = [a, b]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) fn split_splat(ab: &[f32]) -> __m512 {
    let low = _mm256_castps_pd(_mm256_set1_ps(ab[0]));
    let high = _mm256_castps_pd(_mm256_set1_ps(ab[1]));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(low), high))
}

/// The activation scales of rows `r0..r0 + len` in pairs, `[block][pair]`:
/// rows `r` and `r + 1` of a block as `[dx_r; 8]` and `[dx_r+1; 8]` in one
/// register's halves (an odd last row has none).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn pair_scales(acts: &Q8_0Acts, blocks: usize, r0: usize, len: usize) -> Vec<__m512> {
    (0..blocks)
        .flat_map(|b| {
            let dx = acts.scales(b, r0, len);
            dx.chunks_exact(2)
                .map(|ab| split_splat(ab))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `outs[r][j - j0]` for every activation row `r` (at least two) and weight
/// row `j` of `w` (whole rows of `qtype` blocks over `k` inputs), from
/// activations quantized with the `+128` offset.
///
/// # Safety
/// [`available`] and AVX2, FMA, F16C must hold.
#[target_feature(enable = "avx2,fma,f16c,avxvnni,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn rows(qtype: QType, w: &[u8], k: usize, acts: &Q8_0Acts, outs: &mut [&mut [f32]]) {
    match qtype {
        QType::Q4_0 => rows_of::<Q4_0>(w, k, acts, outs),
        QType::Q5_0 => rows_of::<Q5_0>(w, k, acts, outs),
        _ => rows_of::<Q8_0>(w, k, acts, outs),
    }
}

/// [`rows`] for block type `T`: activation rows in groups of up to
/// [`MAX_GROUP`], weight rows two at a time (measured faster than four side
/// by side even for few rows, and than one), every group visiting a tile of
/// weight rows before the next tile.
#[target_feature(enable = "avx2,fma,f16c,avxvnni,avx512f,avx512bw,avx512vl,avx512vnni")]
fn rows_of<const T: u8>(w: &[u8], k: usize, acts: &Q8_0Acts, outs: &mut [&mut [f32]]) {
    assert!(
        outs.len() >= 2,
        "the pair kernel needs two or more activation rows"
    );
    let rb = k / QK8_0 * block_bytes::<T>();
    let n = w.len() / rb;
    let row_groups: Vec<_> = groups(outs.len(), MAX_GROUP)
        .map(|(r0, len)| (r0, len, pair_scales(acts, k / QK8_0, r0, len)))
        .collect();
    let mut j = 0;
    while j < n {
        let jn = if n - j >= 2 { 2 } else { 1 };
        prefetch(w, j * rb + PREFETCH_AHEAD, jn * rb);
        let tile = &w[j * rb..(j + jn) * rb];
        for (r0, len, scales) in &row_groups {
            let (r0, len) = (*r0, *len);
            dispatch_group!(jn, J => {
                let wrows: [&[u8]; J] = std::array::from_fn(|i| &tile[i * rb..(i + 1) * rb]);
                dispatch_group!(
                    len,
                    R => group::<T, { R / 2 }, { R % 2 }, J>(wrows, acts, scales, r0, j, outs),
                    [2, 3, 4, 5, 6, 7, 8, 9]
                )
            }, [1, 2]);
        }
        j += jn;
    }
}

/// Weight rows `j..j + J` against activation rows `r0..r0 + 2P + S`: `P`
/// pairs in 512-bit registers, then `S` (0 or 1) single row in a 256-bit one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const T: u8, const P: usize, const S: usize, const J: usize>(
    wrows: [&[u8]; J],
    acts: &Q8_0Acts,
    scales: &[__m512],
    r0: usize,
    j: usize,
    outs: &mut [&mut [f32]],
) {
    let bb = block_bytes::<T>();
    let rows = 2 * P + S;
    let mut acc = [[_mm512_setzero_ps(); P]; J];
    let mut last = [[_mm256_setzero_ps(); S]; J];
    let minus_128 = _mm512_set1_epi8(-128);
    for b in 0..wrows[0].len() / bb {
        let xs = acts.codes(b, r0, rows);
        let dx = acts.scales(b, r0, rows);
        let xp: [__m512i; P] = std::array::from_fn(|p| load_i8x64(&xs[2 * p * QK8_0..]));
        let xl: [__m256i; S] = std::array::from_fn(|_| load_i8x32(&xs[2 * P * QK8_0..]));
        for ((acc, last), wrow) in acc.iter_mut().zip(&mut last).zip(wrows) {
            let blk = &wrow[b * bb..(b + 1) * bb];
            let w = match T {
                Q8_0 => _mm512_broadcast_i64x4(load_u8x32(&blk[2..34])),
                _ => _mm512_broadcast_i64x4(unpack::<T>(blk)),
            };
            let zero = _mm512_setzero_si512();
            let offset = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, minus_128, w));
            let dw = f16_at(blk);
            let dwz = _mm512_set1_ps(dw);
            for p in 0..P {
                let lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(offset, xp[p], w));
                acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dwz, scales[b * P + p]), lanes, acc[p]);
            }
            for (last, &x) in last.iter_mut().zip(&xl) {
                let sums = _mm256_dpbusd_avx_epi32(
                    _mm512_castsi512_si256(offset),
                    x,
                    _mm512_castsi512_si256(w),
                );
                let scale = _mm256_set1_ps(dw * dx[2 * P]);
                *last = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), *last);
            }
        }
    }
    for (i, (acc, last)) in acc.iter().zip(&last).enumerate() {
        for (p, a) in acc.iter().enumerate() {
            outs[r0 + 2 * p][j + i] = hsum(_mm512_castps512_ps256(*a));
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a));
            outs[r0 + 2 * p + 1][j + i] = hsum(_mm256_castpd_ps(high));
        }
        for l in last {
            outs[r0 + 2 * P][j + i] = hsum(*l);
        }
    }
}
