//! AVX-512 register shuffles of the AMX kernel ([`crate::q8_amx`]): a
//! transposing reduction of row-pair lane sums and a 16 × 16 transpose.
//!
//! These are not `target_feature` functions, so that they can be forced
//! inline into the kernels (which have the features); each requires
//! AVX-512 F.

use std::arch::x86_64::*;

/// Registers per 16 × 16 transpose.
const TILE: usize = 16;

/// The sixteen row sums of eight registers of row pairs: register `p`
/// holds eight `i32` lanes of row `2p` (low half) and eight of row `2p + 1`
/// (high half); lane `n` of the result is the exact sum of row `n`'s
/// lanes. A transposing reduction: 21 shuffles and additions and one
/// permutation for all sixteen rows.
///
/// # Safety
/// AVX-512 F must be available.
#[inline(always)]
pub(crate) unsafe fn sum_row_pairs(lanes: [__m512i; 8]) -> __m512i {
    // SAFETY: the caller guarantees the features.
    unsafe {
        let t = [
            fold32(lanes[0], lanes[1]),
            fold32(lanes[2], lanes[3]),
            fold32(lanes[4], lanes[5]),
            fold32(lanes[6], lanes[7]),
        ];
        let (u0, u1) = (fold64(t[0], t[1]), fold64(t[2], t[3]));
        let sums = _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0b10_00_10_00>(u0, u1),
            _mm512_shuffle_i64x2::<0b11_01_11_01>(u0, u1),
        );
        // Lanes now hold rows 0 2 4 6 1 3 5 7 8 10 12 14 9 11 13 15.
        let order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
        _mm512_permutexvar_epi32(order, sums)
    }
}

/// Per 128-bit lane, `[a0 + a2, b0 + b2, a1 + a3, b1 + b3]`.
///
/// # Safety
/// AVX-512 F must be available.
#[inline(always)]
unsafe fn fold32(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: the caller guarantees the features.
    unsafe { _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b)) }
}

/// Per 128-bit lane, `[a0 + a2, a1 + a3, b0 + b2, b1 + b3]`.
///
/// # Safety
/// AVX-512 F must be available.
#[inline(always)]
unsafe fn fold64(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: the caller guarantees the features.
    unsafe { _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b)) }
}

/// The 16 × 16 transpose of `v` (`out[j]` lane `i` = `v[i]` lane `j`):
/// per weight row registers become per activation row registers, so
/// results leave in one store per activation row.
///
/// # Safety
/// AVX-512 F must be available.
#[inline(always)]
pub(crate) unsafe fn transpose(v: [__m512; TILE]) -> [__m512; TILE] {
    // SAFETY: the caller guarantees the features.
    unsafe {
        let mut a = [_mm512_setzero_pd(); TILE];
        for k in 0..TILE / 2 {
            let (x, y) = (v[2 * k], v[2 * k + 1]);
            a[2 * k] = _mm512_castps_pd(_mm512_unpacklo_ps(x, y));
            a[2 * k + 1] = _mm512_castps_pd(_mm512_unpackhi_ps(x, y));
        }
        // b[4k + e], 128-bit lane l: rows 4k..4k + 4 of column 4l + e.
        let mut b = [_mm512_setzero_ps(); TILE];
        for k in 0..TILE / 4 {
            for h in 0..2 {
                let (x, y) = (a[4 * k + h], a[4 * k + 2 + h]);
                b[4 * k + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
                b[4 * k + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
            }
        }
        let mut out = [_mm512_setzero_ps(); TILE];
        for e in 0..4 {
            let c0 = _mm512_shuffle_f32x4::<0x44>(b[e], b[4 + e]);
            let c1 = _mm512_shuffle_f32x4::<0xEE>(b[e], b[4 + e]);
            let c2 = _mm512_shuffle_f32x4::<0x44>(b[8 + e], b[12 + e]);
            let c3 = _mm512_shuffle_f32x4::<0xEE>(b[8 + e], b[12 + e]);
            out[e] = _mm512_shuffle_f32x4::<0x88>(c0, c2);
            out[4 + e] = _mm512_shuffle_f32x4::<0xDD>(c0, c2);
            out[8 + e] = _mm512_shuffle_f32x4::<0x88>(c1, c3);
            out[12 + e] = _mm512_shuffle_f32x4::<0xDD>(c1, c3);
        }
        out
    }
}
