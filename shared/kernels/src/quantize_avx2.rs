//! The activation block quantizers of [`crate::quantize`] in 256-bit
//! registers, giving the same codes, sums and scales.
//!
//! Every step has an exact vector twin: the largest magnitude is a maximum
//! (order-free; a NaN never wins, as with `f32::max`), the products are the
//! same single f32 multiplications, `cvtps` rounds to nearest, ties to even,
//! like the magic-number rounding (NaN lanes are zeroed first, since Rust's
//! `as i32` maps NaN to 0), and the saturating packs clamp to `-128..=127`.

use std::arch::x86_64::*;

use half::f16;

use crate::simd::{load_f32x8, store_i8x32};

/// `|v|` lane by lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs(v: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
}

/// The largest lane of `|v|` over `vs`, NaN lanes ignored, at least 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs_max(vs: &[__m256]) -> f32 {
    let mut m = _mm256_setzero_ps();
    for &v in vs {
        // `max_ps` returns its second operand when either is NaN.
        m = _mm256_max_ps(abs(v), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
}

/// `round_even(scale * v)` per lane as `i32` (NaN → 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn codes(scale: f32, v: __m256) -> __m256i {
    let p = _mm256_mul_ps(_mm256_set1_ps(scale), v);
    let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(p, p);
    _mm256_cvtps_epi32(_mm256_and_ps(p, ordered))
}

/// The first `8 * N` values of `xb` in `N` registers. Loops rather than
/// closures throughout this module: a closure is compiled without the
/// enclosing function's target features, so its intrinsics are not inlined.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_blocks<const N: usize>(xb: &[f32]) -> [__m256; N] {
    let mut v = [_mm256_setzero_ps(); N];
    for (c, v) in v.iter_mut().enumerate() {
        *v = load_f32x8(&xb[8 * c..]);
    }
    v
}

/// Four vectors of eight `i32` codes to 32 bytes in element order,
/// saturated to `-128..=127`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack(q: [__m256i; 4]) -> __m256i {
    let words = [
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    ];
    let bytes = _mm256_packs_epi16(words[0], words[1]);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// [`crate::quantize`]'s Q8_0 block quantizer: the codes of `xb` (32
/// values) XOR `flip` into `qb`, returning the f16-rounded scale.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_0_block(xb: &[f32], qb: &mut [i8], flip: i8) -> f32 {
    let v = load_blocks::<4>(xb);
    let amax = abs_max(&v);
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [_mm256_setzero_si256(); 4];
    for (q, &v) in q.iter_mut().zip(&v) {
        *q = codes(id, v);
    }
    let bytes = pack(q);
    store_i8x32(qb, _mm256_xor_si256(bytes, _mm256_set1_epi8(flip)));
    f16::from_f32(amax / 127.0).to_f32()
}

/// [`crate::quantize`]'s Q8_K super-block quantizer: the codes of `xb`
/// (256 values) into `qb`, the sums of each 16 into `sb`, returning the
/// scale (0 for an all-zero block, whose codes and sums stay untouched).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_k_block(xb: &[f32], qb: &mut [i8], sb: &mut [i16]) -> f32 {
    let v = load_blocks::<32>(xb);
    let amax = abs_max(&v);
    if amax == 0.0 {
        return 0.0;
    }
    // The first element of largest magnitude, as the scalar scan finds it.
    let mut at = 0;
    for (c, &v) in v.iter().enumerate() {
        let hits = _mm256_cmp_ps::<_CMP_EQ_OQ>(abs(v), _mm256_set1_ps(amax));
        let mask = _mm256_movemask_ps(hits);
        if mask != 0 {
            at = 8 * c + mask.trailing_zeros() as usize;
            break;
        }
    }
    let iscale = -127.0 / xb[at];
    for (c, v) in v.chunks_exact(4).enumerate() {
        let mut q = [_mm256_setzero_si256(); 4];
        for (q, &v) in q.iter_mut().zip(v) {
            *q = codes(iscale, v);
        }
        for (g, pair) in q.chunks_exact(2).enumerate() {
            let s = _mm256_add_epi32(pair[0], pair[1]);
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
            sb[2 * c + g] = _mm_cvtsi128_si32(s1) as i16;
        }
        store_i8x32(&mut qb[32 * c..], pack(q));
    }
    1.0 / iscale
}
