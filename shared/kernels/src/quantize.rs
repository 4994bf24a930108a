//! Per-row activation quantization to Q8_0 and Q8_K.
//!
//! Rows are quantized independently (a row's codes never depend on other
//! rows), and both the scalar and the AVX2 matmul paths consume the same
//! codes, so quantization never breaks batch invariance.
//!
//! Storage is block-major: block `b` of all `m` rows is contiguous
//! (`[block][row][codes]`), so a kernel visiting block `b` for a group of
//! rows reads one contiguous run. The Q8_K scale array carries [`SCALE_PAD`]
//! spare zeros so a kernel can load eight consecutive scales from any row.

use half::f16;

use crate::qtype::{QK8_0, QK_K};

/// Zero scales appended after the last block so eight-wide loads starting at
/// any row stay in bounds.
pub(crate) const SCALE_PAD: usize = 8;

/// Rounds to the nearest integer, ties to even, for `|v| < 2^22` (ggml's
/// `nearest_int`; also what `_mm256_round_ps` does). The magic constant
/// moves the value into a binade where the float spacing is 1.
fn round_even(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    ((v + MAGIC) - MAGIC) as i32
}

/// Whether the 256-bit block quantizers can run here.
fn vector_available() -> bool {
    cfg!(target_arch = "x86_64") && crate::Isa::Avx2.is_available()
}

/// Quantizes one block of 32 to `qb` (codes XOR `flip`), returning its scale.
fn q8_0_block(xb: &[f32], qb: &mut [i8], flip: i8, vector: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if vector {
        // SAFETY: `vector` is set only where AVX2, FMA and F16C were detected.
        return unsafe { crate::quantize_avx2::q8_0_block(xb, qb, flip) };
    }
    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, v) in qb.iter_mut().zip(xb) {
        *q = (round_even(v * id).clamp(-128, 127) as i8) ^ flip;
    }
    f16::from_f32(amax / 127.0).to_f32()
}

/// Quantizes one super-block of 256 to `qb`, its group sums to `sb`,
/// returning its scale (zero, with zero codes, for an all-zero block).
fn q8_k_block(xb: &[f32], qb: &mut [i8], sb: &mut [i16], vector: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if vector {
        // SAFETY: `vector` is set only where AVX2, FMA and F16C were detected.
        return unsafe { crate::quantize_avx2::q8_k_block(xb, qb, sb) };
    }
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, v) in qb.iter_mut().zip(xb) {
        *q = round_even(iscale * v).clamp(-128, 127) as i8;
    }
    for (s, g) in sb.iter_mut().zip(qb.chunks_exact(16)) {
        *s = g.iter().map(|&q| i16::from(q)).sum();
    }
    1.0 / iscale
}

/// Activations quantized to Q8_0: per block of 32, `x ≈ d * q`.
pub(crate) struct Q8_0Acts {
    /// Codes `q`, or the bytes of `q + 128` when quantized with `offset`
    /// (for VNNI's unsigned operand), `[block][row][32]`.
    qs: Vec<i8>,
    /// Scales (f16-rounded, as ggml stores them), `[block][row]`.
    d: Vec<f32>,
    m: usize,
}

impl Q8_0Acts {
    /// Quantizes `m` rows of `k` values (`k` a multiple of 32) like ggml's
    /// x86 `quantize_row_q8_0`: `d = amax / 127` stored as f16,
    /// `q = round_ties_even(x * (127 / amax))`. With `offset` the codes are
    /// stored as `q + 128` (same `q`, different bytes).
    pub(crate) fn quantize(x: &[f32], m: usize, k: usize, offset: bool) -> Self {
        Self::quantize_with(x, m, k, offset, vector_available())
    }

    /// [`Q8_0Acts::quantize`], with 256-bit registers when `vector` (the
    /// same codes and scales either way).
    fn quantize_with(x: &[f32], m: usize, k: usize, offset: bool, vector: bool) -> Self {
        let flip = if offset { i8::MIN } else { 0 };
        let nb = k / QK8_0;
        let mut qs = vec![0i8; m * k];
        let mut d = vec![0f32; m * nb];
        for (r, row) in x.chunks_exact(k).enumerate() {
            for (b, xb) in row.chunks_exact(QK8_0).enumerate() {
                let qb = &mut qs[(b * m + r) * QK8_0..][..QK8_0];
                d[b * m + r] = q8_0_block(xb, qb, flip, vector);
            }
        }
        Q8_0Acts { qs, d, m }
    }

    /// Codes of block `b` for rows `r0..r0 + rows`, row after row.
    #[inline]
    pub(crate) fn codes(&self, b: usize, r0: usize, rows: usize) -> &[i8] {
        &self.qs[(b * self.m + r0) * QK8_0..][..rows * QK8_0]
    }

    /// Scales of block `b` for rows `r0..r0 + rows`.
    #[inline]
    pub(crate) fn scales(&self, b: usize, r0: usize, rows: usize) -> &[f32] {
        &self.d[b * self.m + r0..][..rows]
    }
}

/// Activations quantized to Q8_K: per block of 256, `x ≈ d * q`, plus the
/// sums of each group of 16 codes.
pub(crate) struct Q8KActs {
    /// Codes, `[block][row][256]`.
    qs: Vec<i8>,
    /// Scales, `[block][row]` + padding.
    d: Vec<f32>,
    /// Sums of 16 consecutive codes, `[block][row][16]`.
    bsums: Vec<i16>,
    m: usize,
}

impl Q8KActs {
    /// Quantizes `m` rows of `k` values (`k` a multiple of 256) like ggml's
    /// `quantize_row_q8_K_ref`: the element of largest magnitude maps to
    /// -127, `q = min(127, round_ties_even(x * iscale))`, `d = 1 / iscale`.
    pub(crate) fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        Self::quantize_with(x, m, k, vector_available())
    }

    /// [`Q8KActs::quantize`], with 256-bit registers when `vector` (the
    /// same codes, sums and scales either way).
    fn quantize_with(x: &[f32], m: usize, k: usize, vector: bool) -> Self {
        let nb = k / QK_K;
        let mut qs = vec![0i8; m * k];
        let mut d = vec![0f32; m * nb + SCALE_PAD];
        let mut bsums = vec![0i16; m * k / 16];
        for (r, row) in x.chunks_exact(k).enumerate() {
            for (b, xb) in row.chunks_exact(QK_K).enumerate() {
                let qb = &mut qs[(b * m + r) * QK_K..][..QK_K];
                let sb = &mut bsums[(b * m + r) * 16..][..16];
                d[b * m + r] = q8_k_block(xb, qb, sb, vector);
            }
        }
        Q8KActs { qs, d, bsums, m }
    }

    /// Codes of super-block `b` for rows `r0..r0 + rows`, row after row.
    #[inline]
    pub(crate) fn codes(&self, b: usize, r0: usize, rows: usize) -> &[i8] {
        &self.qs[(b * self.m + r0) * QK_K..][..rows * QK_K]
    }

    /// Group-of-16 code sums of super-block `b` for rows `r0..r0 + rows`.
    #[inline]
    pub(crate) fn bsums(&self, b: usize, r0: usize, rows: usize) -> &[i16] {
        &self.bsums[(b * self.m + r0) * 16..][..rows * 16]
    }

    /// Scales of super-block `b` from row `r0` on (at least eight values).
    #[inline]
    pub(crate) fn scales(&self, b: usize, r0: usize) -> &[f32] {
        &self.d[b * self.m + r0..]
    }
}

#[cfg(test)]
mod tests {
    use super::{vector_available, Q8KActs, Q8_0Acts};

    /// Rows of 512 with the cases that could tell the two quantizers apart:
    /// ties after scaling, a largest magnitude met twice with both signs,
    /// all-zero blocks, NaN and infinities, and random values.
    fn rows() -> Vec<f32> {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut unit = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let mut x: Vec<f32> = (0..6 * 512).map(|_| unit() * 3.0).collect();
        for (i, v) in x[..256].iter_mut().enumerate() {
            *v = (i % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32;
        }
        x[300] = -9.0;
        x[301] = 9.0;
        x[512..768].fill(0.0);
        x[1100] = f32::NAN;
        x[1400] = f32::INFINITY;
        x[1800] = f32::NEG_INFINITY;
        x[2100] = f32::NAN;
        x[2101] = 40.0;
        x
    }

    #[test]
    fn vector_quantizers_give_the_scalar_codes() {
        if !vector_available() {
            return;
        }
        let x = rows();
        for offset in [false, true] {
            let (s, v) = (
                Q8_0Acts::quantize_with(&x, 6, 512, offset, false),
                Q8_0Acts::quantize_with(&x, 6, 512, offset, true),
            );
            assert_eq!(s.qs, v.qs, "Q8_0 codes, offset {offset}");
            let bits = |d: &[f32]| d.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s.d), bits(&v.d), "Q8_0 scales");
        }
        let (s, v) = (
            Q8KActs::quantize_with(&x, 6, 512, false),
            Q8KActs::quantize_with(&x, 6, 512, true),
        );
        assert_eq!(s.qs, v.qs, "Q8_K codes");
        assert_eq!(s.bsums, v.bsums, "Q8_K sums");
        let bits = |d: &[f32]| d.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&s.d), bits(&v.d), "Q8_K scales");
    }
}
