//! AVX2 kernels for Q4_0, Q5_0 and Q8_0 weights against Q8_0 activations.
//!
//! Three instantiations of one kernel differ only in how the exact integer
//! dot of a 32-byte block pair is formed (see [`crate::simd`]): AVX2's
//! `maddubs`/`madd` sign trick, or a single `dpbusd`, VEX-encoded (AVX-VNNI)
//! or EVEX-encoded (AVX-512 VNNI). All produce the same eight `i32` lane
//! sums (four consecutive products each), and the f32 steps are shared, so
//! the three are bit-identical.

use std::arch::x86_64::*;

use crate::block_types::block_bytes;
use crate::qtype::{QType, QK8_0};
use crate::quantize::Q8_0Acts;
use crate::simd::{load_u8x16, load_u8x32};

pub(crate) const Q4_0: u8 = QType::Q4_0 as u8;
pub(crate) const Q5_0: u8 = QType::Q5_0 as u8;
pub(crate) const Q8_0: u8 = QType::Q8_0 as u8;

/// Unpacks one block to 32 signed weights in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn unpack<const T: u8>(blk: &[u8]) -> __m256i {
    match T {
        Q4_0 => _mm256_sub_epi8(nibbles(&blk[2..18]), _mm256_set1_epi8(8)),
        Q5_0 => {
            // `(nibble | bit << 4) - 16` is the nibble itself where the fifth
            // bit is set and `nibble - 16 = nibble | 0xF0` (as an i8) where
            // it is clear.
            let high = _mm256_andnot_si256(bits_to_bytes(&blk[2..6]), _mm256_set1_epi8(-16));
            _mm256_or_si256(nibbles(&blk[6..22]), high)
        }
        _ => load_u8x32(&blk[2..34]),
    }
}

/// 16 bytes of packed nibbles to 32 bytes: low nibbles first, then high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[u8]) -> __m256i {
    let lo = load_u8x16(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(lo), lo);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Spreads the 32 bits of a little-endian `u32` to 32 bytes of `0x00` /
/// `0xFF` (byte `i` is `0xFF` iff bit `i` is set).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits_to_bytes(qh: &[u8]) -> __m256i {
    let word = i32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(word),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// Defines a kernel entry point `$name` compiled for `$features`, whose
/// block dot is `$dot(prepared, w, x)` with `prepared = $prep(w)` computed
/// once per weight block.
macro_rules! q8_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $prep:path, $dot:path) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(crate) fn $name(qtype: QType, w: &[u8], k: usize, acts: &Q8_0Acts, outs: &mut [&mut [f32]]) {
            use crate::simd::{f16_at, hsum, load_i8x32, prefetch, PREFETCH_AHEAD};
            use crate::tile::dispatch_tiles;

            #[target_feature(enable = $features)]
            fn rows<const T: u8>(w: &[u8], k: usize, acts: &Q8_0Acts, outs: &mut [&mut [f32]]) {
                dispatch_tiles!(tile::<T>(w, k / QK8_0 * block_bytes::<T>(), acts, outs), T != Q8_0);
            }

            /// Weight rows `rows` (of `w`, `rb` bytes each) against activation
            /// rows `r0..r0 + R`, `J` weight rows at a time for instruction
            /// level parallelism when `R` is small.
            #[inline]
            #[target_feature(enable = $features)]
            fn tile<const T: u8, const R: usize, const J: usize>(
                w: &[u8],
                rb: usize,
                rows: std::ops::Range<usize>,
                acts: &Q8_0Acts,
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
            /// pair has its own accumulator, and its block scale `dw * dx` is the
            /// same single f32 product whichever tile computes it.
            #[inline]
            #[target_feature(enable = $features)]
            fn group<const T: u8, const R: usize, const J: usize>(
                wrows: [&[u8]; J],
                acts: &Q8_0Acts,
                r0: usize,
                j: usize,
                outs: &mut [&mut [f32]],
            ) {
                let bb = block_bytes::<T>();
                let mut acc = [[_mm256_setzero_ps(); R]; J];
                for b in 0..wrows[0].len() / bb {
                    let xs = acts.codes(b, r0, R);
                    let dx = acts.scales(b, r0, R);
                    for (acc, wrow) in acc.iter_mut().zip(wrows) {
                        let blk = &wrow[b * bb..(b + 1) * bb];
                        let w = unpack::<T>(blk);
                        let prepared = $prep(w);
                        let dw = f16_at(blk);
                        for r in 0..R {
                            let lanes = _mm256_cvtepi32_ps($dot(prepared, w, load_i8x32(&xs[r * QK8_0..])));
                            let scale = _mm256_set1_ps(dw * dx[r]);
                            acc[r] = _mm256_fmadd_ps(scale, lanes, acc[r]);
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
                QType::Q4_0 => rows::<Q4_0>(w, k, acts, outs),
                QType::Q5_0 => rows::<Q5_0>(w, k, acts, outs),
                _ => rows::<Q8_0>(w, k, acts, outs),
            }
        }
    };
}

q8_kernel!(
    /// AVX2 path of [`crate::q8::rows_scalar`].
    rows_avx2,
    "avx2,fma,f16c",
    crate::simd::abs_i8,
    crate::simd::dot_i8x32
);

q8_kernel!(
    /// AVX-VNNI path of [`crate::q8::rows_scalar`], bit-identical to
    /// [`rows_avx2`].
    rows_vnni,
    "avx2,fma,f16c,avxvnni",
    crate::simd::vnni_offset,
    crate::simd::vnni_dot_i8x32
);

q8_kernel!(
    /// AVX-512 VNNI path of [`crate::q8::rows_scalar`] for CPUs without
    /// AVX-VNNI, bit-identical to [`rows_avx2`].
    rows_vnni_evex,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    crate::simd::evex_offset,
    crate::simd::evex_dot_i8x32
);
