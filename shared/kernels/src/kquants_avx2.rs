//! AVX2 kernel for k-quant weights (Q4_K, Q5_K, Q6_K, Q8_K) against Q8_K
//! activations.
//!
//! A super-block is unpacked once into eight vectors of 32 codes plus the
//! 16 per-group scales and mins (see [`crate::kquants`]), then dotted with
//! every activation row of the group, following ggml's AVX2 `vec_dot_*_q8_K`:
//! `maddubs` (codes × activations → i16 pairs), `madd` with the scales
//! (→ i32), summed exactly over the super-block; the mins use the activation
//! group sums. Per super-block and pair the f32 steps are fixed:
//! Q4_K / Q5_K: `acc = fma(d·dx, sumi, acc); acc = fma(−(dmin·dx), summ, acc)`;
//! Q6_K: `acc = fma(d·dx, sumi − summ, acc)`; Q8_K: `acc = fma(d·dx, sumi, acc)`,
//! each on 8 lanes, followed by one fixed horizontal sum.
//!
//! Three instantiations differ only in how `madd` and the running `add` are
//! done: two AVX2 instructions or one `dpwssd`, VEX-encoded (AVX-VNNI) or
//! EVEX-encoded (AVX-512 VNNI). The integer sums are exact either way, so
//! the three are bit-identical.

use std::arch::x86_64::*;

use crate::kquants::unpack_scales_k4;
use crate::qtype::{QType, QK_K};
use crate::quantize::Q8KActs;
use crate::simd::{
    f16_at, hsum, load_f32x8, load_i16x16, load_i8x32, load_u8x16, load_u8x32, prefetch,
    PREFETCH_AHEAD,
};
use crate::tile::dispatch_tiles;

pub(crate) const Q4_K: u8 = QType::Q4_K as u8;
pub(crate) const Q5_K: u8 = QType::Q5_K as u8;
pub(crate) const Q6_K: u8 = QType::Q6_K as u8;
pub(crate) const Q8_K: u8 = QType::Q8_K as u8;

/// The [`QType`] a kernel type parameter `T` stands for.
pub(crate) const fn qtype_of<const T: u8>() -> QType {
    match T {
        Q4_K => QType::Q4_K,
        Q5_K => QType::Q5_K,
        Q6_K => QType::Q6_K,
        _ => QType::Q8_K,
    }
}

/// One super-block unpacked to registers.
pub(crate) struct Unpacked {
    /// Codes of the eight 32-element chunks, in element order.
    q: [__m256i; 8],
    /// `i16` scale of each group of 16 elements.
    pub(crate) scales: __m256i,
    /// `i16` multiplier of each activation group sum.
    pub(crate) mins: __m256i,
    pub(crate) d: f32,
    pub(crate) dmin: f32,
}

/// Widens eight bytes to sixteen `i16`, each repeated twice (one value per
/// sub-block of 32 becomes one value per group of 16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn per_group(v: [u8; 8]) -> __m256i {
    let w = _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(v)));
    _mm256_set_m128i(_mm_unpackhi_epi16(w, w), _mm_unpacklo_epi16(w, w))
}

/// Unpacks one super-block of type `T` (the bytes of `blk`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn unpack<const T: u8>(blk: &[u8]) -> Unpacked {
    let q = unpack_codes::<T>(blk);
    match T {
        Q4_K | Q5_K => {
            let (sc, mn) = unpack_scales_k4(&blk[4..16]);
            Unpacked {
                q,
                scales: per_group(sc),
                mins: per_group(mn),
                d: f16_at(&blk[0..2]),
                dmin: f16_at(&blk[2..4]),
            }
        }
        Q6_K => {
            let scales = _mm256_cvtepi8_epi16(load_u8x16(&blk[192..208]));
            Unpacked {
                q,
                scales,
                mins: _mm256_slli_epi16::<5>(scales),
                d: f16_at(&blk[208..210]),
                dmin: 0.0,
            }
        }
        _ => Unpacked {
            q,
            scales: _mm256_set1_epi16(1),
            mins: _mm256_setzero_si256(),
            d: f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            dmin: 0.0,
        },
    }
}

/// The codes of one super-block of type `T` as eight vectors of 32 bytes
/// in element order (see [`Unpacked::q`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn unpack_codes<const T: u8>(blk: &[u8]) -> [__m256i; 8] {
    let nib = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    match T {
        Q4_K | Q5_K => {
            let qs = if T == Q5_K {
                &blk[48..176]
            } else {
                &blk[16..144]
            };
            let mut hb = if T == Q5_K {
                load_u8x32(&blk[16..48])
            } else {
                _mm256_setzero_si256()
            };
            let one = _mm256_set1_epi8(1);
            for j in 0..4 {
                let bits = load_u8x32(&qs[32 * j..]);
                let mut lo = _mm256_and_si256(bits, nib);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), nib);
                if T == Q5_K {
                    let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(hb, one));
                    let h1 = _mm256_slli_epi16::<3>(_mm256_and_si256(hb, _mm256_set1_epi8(2)));
                    lo = _mm256_or_si256(lo, h0);
                    hi = _mm256_or_si256(hi, h1);
                    hb = _mm256_srli_epi16::<2>(hb);
                }
                q[2 * j] = lo;
                q[2 * j + 1] = hi;
            }
        }
        Q6_K => {
            let top = _mm256_set1_epi8(0x30);
            for half in 0..2 {
                let ql0 = load_u8x32(&blk[64 * half..]);
                let ql1 = load_u8x32(&blk[64 * half + 32..]);
                let qh = load_u8x32(&blk[128 + 32 * half..]);
                let h = |v: __m256i| _mm256_and_si256(v, top);
                q[4 * half] =
                    _mm256_or_si256(_mm256_and_si256(ql0, nib), h(_mm256_slli_epi16::<4>(qh)));
                q[4 * half + 1] =
                    _mm256_or_si256(_mm256_and_si256(ql1, nib), h(_mm256_slli_epi16::<2>(qh)));
                let ql0_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), nib);
                let ql1_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), nib);
                q[4 * half + 2] = _mm256_or_si256(ql0_hi, h(qh));
                q[4 * half + 3] = _mm256_or_si256(ql1_hi, h(_mm256_srli_epi16::<2>(qh)));
            }
        }
        _ => {
            for (c, v) in q.iter_mut().enumerate() {
                *v = load_u8x32(&blk[4 + 32 * c..]);
            }
        }
    }
    q
}

/// Byte shuffle that, applied to a vector holding groups `8h..8h+8` in both
/// 128-bit lanes, broadcasts group `8h + 2c` to the low lane and group
/// `8h + 2c + 1` to the high lane (the scales of chunk `4h + c`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scale_shuffle(c: usize) -> __m256i {
    let pick = |g: usize| i16::from_le_bytes([2 * g as u8, 2 * g as u8 + 1]);
    _mm256_set_m128i(_mm_set1_epi16(pick(2 * c + 1)), _mm_set1_epi16(pick(2 * c)))
}

/// `sumi + madd(pairs, scales)` with AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn madd_acc(sumi: __m256i, pairs: __m256i, scales: __m256i) -> __m256i {
    _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales))
}

/// `sumi + madd(pairs, scales)` with one AVX-VNNI `dpwssd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn madd_acc_vnni(sumi: __m256i, pairs: __m256i, scales: __m256i) -> __m256i {
    _mm256_dpwssd_avx_epi32(sumi, pairs, scales)
}

/// `sumi + madd(pairs, scales)` with one EVEX-encoded (AVX-512 VNNI) `dpwssd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn madd_acc_evex(sumi: __m256i, pairs: __m256i, scales: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(sumi, pairs, scales)
}

/// Defines a kernel entry point `$name` compiled for `$features` that
/// accumulates scaled pairs with `$madd_acc`.
macro_rules! kquant_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $madd_acc:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(crate) fn $name(qtype: QType, w: &[u8], k: usize, acts: &Q8KActs, outs: &mut [&mut [f32]]) {
            #[target_feature(enable = $features)]
            fn rows<const T: u8>(w: &[u8], k: usize, acts: &Q8KActs, outs: &mut [&mut [f32]]) {
                dispatch_tiles!(tile::<T>(w, k / QK_K * qtype_of::<T>().block_bytes(), acts, outs), false);
            }

            /// Weight rows `rows` (of `w`, `rb` bytes each) against
            /// activation rows `r0..r0 + R`, `J` weight rows at a time.
            #[inline]
            #[target_feature(enable = $features)]
            fn tile<const T: u8, const R: usize, const J: usize>(
                w: &[u8],
                rb: usize,
                rows: std::ops::Range<usize>,
                acts: &Q8KActs,
                r0: usize,
                outs: &mut [&mut [f32]],
            ) {
                let mut j = rows.start;
                while j < rows.end {
                    prefetch(w, j * rb + PREFETCH_AHEAD, J * rb);
                    if j + J <= rows.end {
                        group::<T, R, J>(std::array::from_fn(|i| &w[(j + i) * rb..(j + i + 1) * rb]), acts, r0, j, outs);
                        j += J;
                    } else {
                        group::<T, R, 1>([&w[j * rb..(j + 1) * rb]], acts, r0, j, outs);
                        j += 1;
                    }
                }
            }

            /// Weight rows `j..j + J` against activation rows `r0..r0 + R`,
            /// writing columns `j..j + J` of `outs`. The arithmetic per
            /// (row, output) pair is independent of `R`, `J` and `r0`: each
            /// pair has its own accumulators, and a lane of a scale vector
            /// holds the same product whichever lane (or vector) it sits in.
            #[inline]
            #[target_feature(enable = $features)]
            fn group<const T: u8, const R: usize, const J: usize>(
                wrows: [&[u8]; J],
                acts: &Q8KActs,
                r0: usize,
                j: usize,
                outs: &mut [&mut [f32]],
            ) {
                let bb = qtype_of::<T>().block_bytes();
                let lane: [__m256i; R] = std::array::from_fn(|r| _mm256_set1_epi32((r % 8) as i32));
                let mut acc = [[_mm256_setzero_ps(); R]; J];
                for s in 0..wrows[0].len() / bb {
                    let (xs, sums) = (acts.codes(s, r0, R), acts.bsums(s, r0, R));
                    let dx = acts.scales(s, r0);
                    let dx = [load_f32x8(dx), if R > 8 { load_f32x8(&dx[8..]) } else { _mm256_setzero_ps() }];
                    for (acc, wrow) in acc.iter_mut().zip(wrows) {
                        let u = unpack::<T>(&wrow[s * bb..(s + 1) * bb]);
                        let halves = [
                            _mm256_permute2x128_si256::<0x00>(u.scales, u.scales),
                            _mm256_permute2x128_si256::<0x11>(u.scales, u.scales),
                        ];
                        let mut sumi = [_mm256_setzero_si256(); R];
                        for (c, &wq) in u.q.iter().enumerate() {
                            let sv = _mm256_shuffle_epi8(halves[c / 4], scale_shuffle(c % 4));
                            let abs_w = _mm256_sign_epi8(wq, wq);
                            for r in 0..R {
                                let x = load_i8x32(&xs[r * QK_K + 32 * c..]);
                                let pairs = if T == Q8_K {
                                    _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, wq))
                                } else {
                                    _mm256_maddubs_epi16(wq, x)
                                };
                                sumi[r] = $madd_acc(sumi[r], pairs, sv);
                            }
                        }
                        let d = _mm256_set1_ps(u.d);
                        let main = [_mm256_mul_ps(d, dx[0]), _mm256_mul_ps(d, dx[1])];
                        let dmin = _mm256_set1_ps(u.dmin);
                        let neg = _mm256_set1_ps(-0.0);
                        let min = [
                            _mm256_xor_ps(_mm256_mul_ps(dmin, dx[0]), neg),
                            _mm256_xor_ps(_mm256_mul_ps(dmin, dx[1]), neg),
                        ];
                        for r in 0..R {
                            let main = _mm256_permutevar8x32_ps(main[r / 8], lane[r]);
                            if T == Q8_K {
                                acc[r] = _mm256_fmadd_ps(main, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                                continue;
                            }
                            let summ = _mm256_madd_epi16(u.mins, load_i16x16(&sums[16 * r..]));
                            if T == Q6_K {
                                let total = _mm256_sub_epi32(sumi[r], summ);
                                acc[r] = _mm256_fmadd_ps(main, _mm256_cvtepi32_ps(total), acc[r]);
                            } else {
                                acc[r] = _mm256_fmadd_ps(main, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                                let min = _mm256_permutevar8x32_ps(min[r / 8], lane[r]);
                                acc[r] = _mm256_fmadd_ps(min, _mm256_cvtepi32_ps(summ), acc[r]);
                            }
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate() {
                    for r in 0..R {
                        outs[r0 + r][j + i] = hsum(acc[r]);
                    }
                }
            }

            match qtype {
                QType::Q4_K => rows::<Q4_K>(w, k, acts, outs),
                QType::Q5_K => rows::<Q5_K>(w, k, acts, outs),
                QType::Q6_K => rows::<Q6_K>(w, k, acts, outs),
                _ => rows::<Q8_K>(w, k, acts, outs),
            }
        }
    };
}

kquant_kernel!(
    /// AVX2 path of [`crate::kquants::rows_scalar`].
    rows_avx2,
    "avx2,fma,f16c",
    madd_acc
);

kquant_kernel!(
    /// AVX-VNNI path of [`crate::kquants::rows_scalar`], bit-identical to
    /// [`rows_avx2`].
    rows_vnni,
    "avx2,fma,f16c,avxvnni",
    madd_acc_vnni
);

kquant_kernel!(
    /// AVX-512 VNNI path of [`crate::kquants::rows_scalar`] for CPUs without
    /// AVX-VNNI, bit-identical to [`rows_avx2`].
    rows_vnni_evex,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    madd_acc_evex
);
