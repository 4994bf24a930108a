//! Small AVX2 helpers shared by the x86-64 kernels.
//!
//! Every function here requires AVX2, FMA and F16C (the `vnni_*` ones also
//! AVX-VNNI); callers are themselves `#[target_feature]` functions reached
//! only after runtime detection.

use std::arch::x86_64::*;

/// Loads 32 bytes from the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_u8x32(s: &[u8]) -> __m256i {
    assert!(s.len() >= 32);
    // SAFETY: `s` has at least 32 readable bytes and `loadu` has no alignment
    // requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Loads 32 signed bytes from the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_i8x32(s: &[i8]) -> __m256i {
    assert!(s.len() >= 32);
    // SAFETY: `s` has at least 32 readable bytes and `loadu` has no alignment
    // requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Loads 16 bytes from the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_u8x16(s: &[u8]) -> __m128i {
    assert!(s.len() >= 16);
    // SAFETY: `s` has at least 16 readable bytes and `loadu` has no alignment
    // requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// Loads 16 `i16` from the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_i16x16(s: &[i16]) -> __m256i {
    assert!(s.len() >= 16);
    // SAFETY: `s` has at least 16 readable `i16` (32 bytes) and `loadu` has
    // no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Loads 8 `f32` from the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_f32x8(s: &[f32]) -> __m256 {
    assert!(s.len() >= 8);
    // SAFETY: `s` has at least 8 readable `f32` and `loadu` has no alignment
    // requirement.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Stores 32 signed bytes at the start of `s` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn store_i8x32(s: &mut [i8], v: __m256i) {
    assert!(s.len() >= 32);
    // SAFETY: `s` has at least 32 writable bytes and `storeu` has no
    // alignment requirement.
    unsafe { _mm256_storeu_si256(s.as_mut_ptr().cast(), v) }
}

/// Loads 8 little-endian `f32` from the start of the byte slice `s`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_f32x8_bytes(s: &[u8]) -> __m256 {
    assert!(s.len() >= 32);
    // SAFETY: `s` has at least 32 readable bytes and `loadu` has no alignment
    // requirement; every bit pattern is a valid `f32`.
    unsafe { _mm256_loadu_ps(s.as_ptr().cast()) }
}

/// Loads 8 little-endian `f16` from the start of the byte slice `s` and
/// widens them (exactly) to `f32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_f16x8_bytes(s: &[u8]) -> __m256 {
    _mm256_cvtph_ps(load_u8x16(s))
}

/// Converts the little-endian `f16` in `s[0..2]` to `f32` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_at(s: &[u8]) -> f32 {
    let bits = u16::from_le_bytes([s[0], s[1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Sums the eight lanes in a fixed order: halves, then pairs, then the last
/// two (the same tree as ggml's `hsum_float_8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// `|w|` per byte (`-128` maps to `128` read as unsigned): the per-block
/// preparation of [`dot_i8x32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn abs_i8(w: __m256i) -> __m256i {
    _mm256_sign_epi8(w, w)
}

/// Dot product of 32 signed bytes `w` and `x` (`|x| <= 127`) as eight `i32`
/// lane sums of four consecutive products (ggml's `mul_sum_i8_pairs` sign
/// trick); `abs_w = abs_i8(w)`. Exact: `maddubs` pairs are at most
/// `2 * 128 * 127`, inside `i16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_i8x32(abs_w: __m256i, w: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// `-128 * (sum of four consecutive w)` per `i32` lane: the per-block
/// preparation of [`vnni_dot_i8x32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) fn vnni_offset(w: __m256i) -> __m256i {
    let sums = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), w);
    _mm256_sub_epi32(_mm256_setzero_si256(), sums)
}

/// The same eight lane sums as [`dot_i8x32`] with one AVX-VNNI `dpbusd`,
/// given the activation codes stored offset by 128 (`x_plus_128`, unsigned);
/// `offset = vnni_offset(w)` removes the `128 * Σw` the offset adds. Exact:
/// `dpbusd` accumulates in `i32` without saturation.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) fn vnni_dot_i8x32(offset: __m256i, w: __m256i, x_plus_128: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(offset, x_plus_128, w)
}

/// [`vnni_offset`] with the EVEX-encoded `dpbusd` of AVX-512 VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn evex_offset(w: __m256i) -> __m256i {
    let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), w);
    _mm256_sub_epi32(_mm256_setzero_si256(), sums)
}

/// [`vnni_dot_i8x32`] with the EVEX-encoded `dpbusd` of AVX-512 VNNI: the
/// same instruction and lane sums, for CPUs without AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn evex_dot_i8x32(offset: __m256i, w: __m256i, x_plus_128: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(offset, x_plus_128, w)
}

/// Distance, in bytes, at which weight rows are prefetched ahead of use.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Hints the cache lines of `bytes[at..at + len]` (clamped to the slice)
/// into L1, one prefetch per 64 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch(bytes: &[u8], at: usize, len: usize) {
    prefetch_lines::<_MM_HINT_T0>(bytes, at, len);
}

/// Hints the cache lines of `bytes[at..at + len]` (clamped to the slice)
/// into L2 only, one prefetch per 64 bytes: for data needed a little later,
/// without evicting what L1 holds now.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch_l2(bytes: &[u8], at: usize, len: usize) {
    prefetch_lines::<_MM_HINT_T1>(bytes, at, len);
}

/// Hints into L1 the `len` bytes of the lane-packed record `records` ahead
/// of the one at `record` (`len` bytes each), one prefetch per 64 bytes; the
/// address need not lie in the matrix (a prefetch never faults, and one past
/// the end is dropped). Measured on a Zen 5 with eight records ahead: the
/// nine-row screen of the LM head 11.3–11.9 → 8.7–9.1 ms (it waited on its
/// code loads), the exact nine-row product 9.7–9.9 → 9.1 ms in one process
/// and 13.3–14.6 → 11.3–11.9 ms in the matmul bench (cold weights).
#[inline(always)]
pub(crate) fn prefetch_record(record: *const u8, records: usize, len: usize) {
    let ahead = record.wrapping_add(records * len);
    for l in (0..len).step_by(64) {
        // SAFETY: a prefetch never faults or changes program state.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast()) };
    }
}

/// One `_mm_prefetch` with hint `HINT` per 64 bytes of `bytes[at..at + len]`
/// (clamped to the slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch_lines<const HINT: i32>(bytes: &[u8], at: usize, len: usize) {
    let end = at.saturating_add(len).min(bytes.len());
    for i in (at..end).step_by(64) {
        // SAFETY: `i < bytes.len()` keeps the pointer inside the slice, and a
        // prefetch never faults or changes program state.
        unsafe { _mm_prefetch::<HINT>(bytes.as_ptr().add(i).cast()) };
    }
}
