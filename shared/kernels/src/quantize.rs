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

/// Activations quantized to Q8_0: per block of 32, `x ≈ d * q`.
pub(crate) struct Q8_0Acts {
    /// Codes `q`, or the bytes of `q + 128` when quantized with `offset`
    /// (for AVX-VNNI's unsigned operand), `[block][row][32]`.
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
        let flip = if offset { i8::MIN } else { 0 };
        let nb = k / QK8_0;
        let mut qs = vec![0i8; m * k];
        let mut d = vec![0f32; m * nb];
        for (r, row) in x.chunks_exact(k).enumerate() {
            for (b, xb) in row.chunks_exact(QK8_0).enumerate() {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                d[b * m + r] = f16::from_f32(amax / 127.0).to_f32();
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                let qb = &mut qs[(b * m + r) * QK8_0..][..QK8_0];
                for (q, v) in qb.iter_mut().zip(xb) {
                    *q = (round_even(v * id).clamp(-128, 127) as i8) ^ flip;
                }
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
        let nb = k / QK_K;
        let mut qs = vec![0i8; m * k];
        let mut d = vec![0f32; m * nb + SCALE_PAD];
        let mut bsums = vec![0i16; m * k / 16];
        for (r, row) in x.chunks_exact(k).enumerate() {
            for (b, xb) in row.chunks_exact(QK_K).enumerate() {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in xb {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                if amax == 0.0 {
                    continue;
                }
                let iscale = -127.0 / max;
                let qb = &mut qs[(b * m + r) * QK_K..][..QK_K];
                for (q, v) in qb.iter_mut().zip(xb) {
                    *q = round_even(iscale * v).clamp(-128, 127) as i8;
                }
                let sb = &mut bsums[(b * m + r) * 16..][..16];
                for (s, g) in sb.iter_mut().zip(qb.chunks_exact(16)) {
                    *s = g.iter().map(|&q| i16::from(q)).sum();
                }
                d[b * m + r] = 1.0 / iscale;
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
