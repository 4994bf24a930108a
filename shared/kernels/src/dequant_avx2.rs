//! AVX2 dequantization to `f32`, value for value bit-identical to
//! [`crate::dequant::dequantize_row`]: a block [`Decoder`] that hands out a
//! block's weights eight at a time, used both to dequantize whole rows and
//! directly inside the exact-mode kernel (`exact_avx2`).
//!
//! A block is unpacked to one byte code per weight by the unpackers of the
//! 8-bit kernels, eight codes at a time are sign-extended and converted to
//! f32 (exact), and each weight is then formed by the same f32 expression as
//! the portable dequantizer:
//!
//! * Q4_0 / Q5_0 / Q8_0: `q * d`, one correctly rounded product either way;
//! * Q6_K: `(d * s) * (q - 32)`, the code offset applied to the bytes
//!   (exact) before the conversion;
//! * Q8_K: `d * q`;
//! * Q4_K / Q5_K: `fmsub(d * sc, q, dmin * mn)` where the portable code
//!   rounds `(d * sc) * q` and then subtracts. The product is exact in f32
//!   (an 11-bit f16 significand times a 6-bit scale times a 5-bit code needs
//!   at most 22 bits, far from overflow and underflow), so the fused and the
//!   separate forms round once, at the same place, to the same value.
//!
//! The per-group products `d * s` and `dmin * mn` are formed once per
//! super-block with the same single rounding as the portable code (which
//! forms them per group of 16, so twice per Q4_K / Q5_K sub-block of 32).
//! NaN scales give NaN weights in both; only for Q4_K / Q5_K may the NaN
//! payload bits differ.

use std::arch::x86_64::*;

use crate::kquants::unpack_scales_k4;
use crate::kquants_avx2::{qtype_of, unpack_codes, Q4_K, Q5_K, Q6_K};
use crate::q8_x86::{unpack as unpack_0, Q4_0, Q5_0, Q8_0};
use crate::qtype::{QType, QK_K};
use crate::simd::{f16_splat, store_f32x8, store_u8x32, widen_i8x8};

/// The quantized [`QType`] a type parameter `T` stands for.
const fn qtype<const T: u8>() -> QType {
    match T {
        Q4_0 => QType::Q4_0,
        Q5_0 => QType::Q5_0,
        Q8_0 => QType::Q8_0,
        _ => qtype_of::<T>(),
    }
}

/// Elements per block of the quantized type `T`.
pub(crate) const fn block_len<const T: u8>() -> usize {
    qtype::<T>().block_size()
}

/// Bytes per block of the quantized type `T`.
pub(crate) const fn block_bytes<const T: u8>() -> usize {
    qtype::<T>().block_bytes()
}

/// Produces the f32 weights of one block of the quantized type `T`, eight
/// at a time: [`Decoder::load`] a block, then [`Decoder::weights`] for each
/// chunk `c` of eight (`0..block_len::<T>() / 8`).
pub(crate) struct Decoder {
    /// Codes as signed bytes (Q4_0 / Q5_0 and the k-quants; Q8_0 reads its
    /// block directly).
    codes: [u8; QK_K],
    /// k-quants: `d * sc` per sub-block of 32 (Q4_K / Q5_K), `d * s` per
    /// group of 16 (Q6_K) or `d` (Q8_K).
    scale: [f32; 16],
    /// Q4_K / Q5_K: `dmin * mn` per sub-block of 32.
    min: [f32; 8],
    /// Block scale in every lane (Q4_0 / Q5_0 / Q8_0).
    d: __m256,
}

impl Decoder {
    /// An empty decoder.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn new() -> Self {
        Decoder {
            codes: [0; QK_K],
            scale: [0.0; 16],
            min: [0.0; 8],
            d: _mm256_setzero_ps(),
        }
    }

    /// Prepares the block `blk` (its bytes) for [`Decoder::weights`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn load<const T: u8>(&mut self, blk: &[u8]) {
        match T {
            Q8_0 => self.d = f16_splat(blk),
            Q4_0 | Q5_0 => {
                self.d = f16_splat(blk);
                store_u8x32(&mut self.codes, unpack_0::<T>(blk));
            }
            _ => self.load_k::<T>(blk),
        }
    }

    /// [`Decoder::load`] of a k-quant super-block. Kept out of line on
    /// purpose: the caller then reads codes and scales back from memory
    /// (cheap broadcasts and widening loads) instead of the compiler
    /// forwarding all 256 codes through registers and spilling them.
    #[inline(never)]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load_k<const T: u8>(&mut self, blk: &[u8]) {
        for (dst, &q) in self.codes.chunks_exact_mut(32).zip(&unpack_codes::<T>(blk)) {
            let q = if T == Q6_K {
                _mm256_sub_epi8(q, _mm256_set1_epi8(32))
            } else {
                q
            };
            store_u8x32(dst, q);
        }
        match T {
            Q4_K | Q5_K => {
                let (sc, mn) = unpack_scales_k4(&blk[4..16]);
                let d = f16_splat(&blk[0..2]);
                store_f32x8(&mut self.scale, _mm256_mul_ps(d, widen_i8x8(&sc)));
                let dmin = f16_splat(&blk[2..4]);
                store_f32x8(&mut self.min, _mm256_mul_ps(dmin, widen_i8x8(&mn)));
            }
            Q6_K => {
                let d = f16_splat(&blk[208..210]);
                store_f32x8(&mut self.scale, _mm256_mul_ps(d, widen_i8x8(&blk[192..])));
                store_f32x8(
                    &mut self.scale[8..],
                    _mm256_mul_ps(d, widen_i8x8(&blk[200..])),
                );
            }
            _ => self.scale[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
        }
    }

    /// Weights `8c..8c + 8` of the loaded block `blk`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn weights<const T: u8>(&self, blk: &[u8], c: usize) -> __m256 {
        match T {
            Q8_0 => _mm256_mul_ps(widen_i8x8(&blk[2 + 8 * c..]), self.d),
            Q4_0 | Q5_0 => _mm256_mul_ps(widen_i8x8(&self.codes[8 * c..]), self.d),
            Q4_K | Q5_K => {
                let q = widen_i8x8(&self.codes[8 * c..]);
                let min = _mm256_set1_ps(self.min[c / 4]);
                _mm256_fmsub_ps(_mm256_set1_ps(self.scale[c / 4]), q, min)
            }
            Q6_K => _mm256_mul_ps(
                _mm256_set1_ps(self.scale[c / 2]),
                widen_i8x8(&self.codes[8 * c..]),
            ),
            _ => _mm256_mul_ps(
                _mm256_set1_ps(self.scale[0]),
                widen_i8x8(&self.codes[8 * c..]),
            ),
        }
    }

    /// Dequantizes one row of whole blocks of `T` into `out`, bit-identical
    /// to [`crate::dequant::dequantize_row`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn row<const T: u8>(&mut self, row: &[u8], out: &mut [f32]) {
        let len = block_len::<T>();
        for (blk, o) in row
            .chunks_exact(block_bytes::<T>())
            .zip(out.chunks_exact_mut(len))
        {
            self.load::<T>(blk);
            for (c, o) in o.chunks_exact_mut(8).enumerate() {
                store_f32x8(o, self.weights::<T>(blk, c));
            }
        }
    }
}

/// Sixteen signed bytes at the start of `s`, converted to `f32` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
fn widen_i8x16(s: &[u8]) -> __m512 {
    assert!(s.len() >= 16);
    // SAFETY: `s` has at least 16 readable bytes and `loadu` has no alignment
    // requirement.
    let bytes = unsafe { _mm_loadu_si128(s.as_ptr().cast()) };
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))
}

impl Decoder {
    /// Weights `16h..16h + 16` of the loaded block `blk`: lane for lane the
    /// values of [`Decoder::weights`] (the same conversions and the same
    /// single rounding per weight), sixteen at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(crate) fn weights16<const T: u8>(&self, blk: &[u8], h: usize) -> __m512 {
        let splat = |v: f32| _mm512_set1_ps(v);
        let d = || _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(self.d)));
        match T {
            Q8_0 => _mm512_mul_ps(widen_i8x16(&blk[2 + 16 * h..]), d()),
            Q4_0 | Q5_0 => _mm512_mul_ps(widen_i8x16(&self.codes[16 * h..]), d()),
            Q4_K | Q5_K => {
                let q = widen_i8x16(&self.codes[16 * h..]);
                _mm512_fmsub_ps(splat(self.scale[h / 2]), q, splat(self.min[h / 2]))
            }
            Q6_K => _mm512_mul_ps(splat(self.scale[h]), widen_i8x16(&self.codes[16 * h..])),
            _ => _mm512_mul_ps(splat(self.scale[0]), widen_i8x16(&self.codes[16 * h..])),
        }
    }

    /// [`Decoder::row`] sixteen weights at a time (AVX-512F), bit-identical.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(crate) fn row_wide<const T: u8>(&mut self, row: &[u8], out: &mut [f32]) {
        let len = block_len::<T>();
        for (blk, o) in row
            .chunks_exact(block_bytes::<T>())
            .zip(out.chunks_exact_mut(len))
        {
            self.load::<T>(blk);
            for (h, o) in o.chunks_exact_mut(16).enumerate() {
                // SAFETY: `o` has exactly 16 writable `f32`; `storeu` has no
                // alignment requirement.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), self.weights16::<T>(blk, h)) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::kquants_avx2::Q8_K;
    use crate::Isa;

    /// [`Decoder::row`] for a runtime `qtype`.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dequantize_row(qtype: QType, row: &[u8], out: &mut [f32]) {
        let mut dec = Decoder::new();
        match qtype {
            QType::F32 | QType::F16 => unreachable!("not a quantized type"),
            QType::Q4_0 => dec.row::<Q4_0>(row, out),
            QType::Q5_0 => dec.row::<Q5_0>(row, out),
            QType::Q8_0 => dec.row::<Q8_0>(row, out),
            QType::Q4_K => dec.row::<Q4_K>(row, out),
            QType::Q5_K => dec.row::<Q5_K>(row, out),
            QType::Q6_K => dec.row::<Q6_K>(row, out),
            QType::Q8_K => dec.row::<Q8_K>(row, out),
        }
    }

    /// [`Decoder::row_wide`] for a runtime `qtype`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    fn dequantize_row_wide(qtype: QType, row: &[u8], out: &mut [f32]) {
        let mut dec = Decoder::new();
        match qtype {
            QType::F32 | QType::F16 => unreachable!("not a quantized type"),
            QType::Q4_0 => dec.row_wide::<Q4_0>(row, out),
            QType::Q5_0 => dec.row_wide::<Q5_0>(row, out),
            QType::Q8_0 => dec.row_wide::<Q8_0>(row, out),
            QType::Q4_K => dec.row_wide::<Q4_K>(row, out),
            QType::Q5_K => dec.row_wide::<Q5_K>(row, out),
            QType::Q6_K => dec.row_wide::<Q6_K>(row, out),
            QType::Q8_K => dec.row_wide::<Q8_K>(row, out),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random bytes everywhere, scales included (subnormal, huge,
        /// infinite and NaN f16 / f32 values among them).
        #[test]
        fn matches_the_portable_dequantizer_bit_for_bit(
            t in 2..QType::ALL.len(),
            blocks in 1usize..4,
            seed in any::<u64>(),
        ) {
            // Nothing to compare without it (rejecting every case would fail the test).
            if !Isa::Avx2.is_available() {
                return Ok(());
            }
            let qtype = QType::ALL[t];
            let k = blocks * qtype.block_size();
            let row = crate::test_data::random_bytes(k / qtype.block_size() * qtype.block_bytes(), seed);
            let mut want = vec![0f32; k];
            crate::dequant::dequantize_row(qtype, &row, &mut want);
            let mut got = vec![f32::NAN; k];
            // SAFETY: AVX2, FMA and F16C were detected above.
            unsafe { dequantize_row(qtype, &row, &mut got) };
            for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                prop_assert!(same, "{:?} element {}: {} vs {}", qtype, e, g, w);
            }
            if crate::panel_avx512::wide_available() {
                let mut wide = vec![f32::NAN; k];
                // SAFETY: AVX-512F and VL (and AVX2, FMA, F16C) were detected.
                unsafe { dequantize_row_wide(qtype, &row, &mut wide) };
                for (e, (g, w)) in wide.iter().zip(&want).enumerate() {
                    let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                    prop_assert!(same, "{:?} wide element {}: {} vs {}", qtype, e, g, w);
                }
            }
        }
    }
}
