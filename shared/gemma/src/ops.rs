//! Row-wise f32 operations of the forward. Every function treats each row on its own with a
//! fixed order of arithmetic, so a row's result never depends on how many rows share a call
//! (the property lossless speculative decoding needs).

use tandem_kernels::dot;

/// In place: each `width`-wide row of `x` becomes `x / rms(x) * scale` (`scale` is `1 + w`).
pub(crate) fn rms_norm_rows(x: &mut [f32], scale: &[f32], eps: f32) {
    let width = scale.len();
    for row in x.chunks_exact_mut(width) {
        let ms = dot(row, row) / width as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, s) in row.iter_mut().zip(scale) {
            *v = (*v * inv) * s;
        }
    }
}

/// Returns RMSNorm of `x` rows without changing `x`.
pub(crate) fn rms_norm(x: &[f32], scale: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    rms_norm_rows(&mut out, scale, eps);
    out
}

/// `tanh`-approximated GELU (`gelu_pytorch_tanh`) of `gate`, times `up`, into `gate`.
pub(crate) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + tanh(inner)) * u;
    }
}

/// `tanh(z)` as `1 - 2 / (e^{2z} + 1)` with [`exp`]: within 2.5e-7 of the exact value
/// (absolute), ±1 beyond ±44, and branch-free, so that loops over it vectorize (libm's
/// `tanhf` is a scalar call per element, a tenth of a verify's time in the FFN activation).
#[inline]
pub(crate) fn tanh(z: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * z) + 1.0)
}

/// `e^x` (Cephes `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`, the exponent `n`
/// put in the bits), within 2 ulp on `[-87, 88]`, clamped to that range outside it.
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let poly = (p * r) * r + r + 1.0;
    poly * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `tanh` soft-capping: `cap * tanh(x / cap)`.
pub(crate) fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// Rotary position embedding in the "rotate half" (NeoX) layout used by Gemma.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Frequencies `1 / base^(2i/d)` divided by the linear scaling `factor`, as transformers
    /// computes them in f32.
    pub(crate) fn new(head_dim: usize, base: f64, factor: f64) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                (1.0 / (base as f32).powf(exponent)) / factor as f32
            })
            .collect();
        Self { inv_freq }
    }

    /// Gemma 4's "proportional" RoPE (transformers' `_compute_proportional_rope_parameters`):
    /// the first `floor(partial * head_dim / 2)` frequency pairs rotate with
    /// `1 / base^(2i / head_dim)` (the exponent over the whole head), the rest stay put.
    /// `partial = 1` is the default RoPE.
    pub(crate) fn proportional(head_dim: usize, base: f64, partial: f64) -> Self {
        let rotated = (partial * head_dim as f64 / 2.0).floor() as usize;
        let mut rope = Self::new(head_dim, base, 1.0);
        rope.inv_freq
            .iter_mut()
            .skip(rotated)
            .for_each(|f| *f = 0.0);
        rope
    }

    /// Rotates every `head_dim`-wide head of `row` for absolute position `pos`.
    pub(crate) fn apply(&self, row: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        let (cos, sin): (Vec<f32>, Vec<f32>) = self
            .inv_freq
            .iter()
            .map(|f| {
                let angle = pos as f32 * f;
                (angle.cos(), angle.sin())
            })
            .unzip();
        for head in row.chunks_exact_mut(2 * half) {
            let (x1, x2) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_and_tanh_match_f64() {
        let mut worst_exp = 0f64;
        let mut worst_tanh = 0f64;
        for i in -197_000..=200_000 {
            let x = i as f32 * 4.4e-4;
            let e = (x as f64).exp();
            worst_exp = worst_exp.max(((exp(x) as f64 - e) / e).abs());
            worst_tanh = worst_tanh.max((tanh(x) as f64 - (x as f64).tanh()).abs());
        }
        assert!(worst_exp < 2.4e-7, "exp relative error {worst_exp}");
        assert!(worst_tanh < 2.5e-7, "tanh absolute error {worst_tanh}");
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert_eq!(tanh(0.0), 0.0);
        assert!(exp(-1000.0) > 0.0 && exp(1000.0).is_finite());
    }

    #[test]
    fn rms_norm_unit_scale_gives_unit_rms() {
        let mut x = vec![3.0f32, -4.0, 0.0, 5.0, 1.0, 2.0];
        rms_norm_rows(&mut x, &[1.0; 3], 0.0);
        for row in x.chunks(3) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 3.0;
            assert!((ms - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn proportional_rope_leaves_unrotated_pairs() {
        let rope = Rope::proportional(8, 10_000.0, 0.5);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, 7);
        // Pairs (0, 4) and (1, 5) rotate; (2, 6) and (3, 7) do not.
        assert_ne!(x[0], orig[0]);
        assert_ne!(x[5], orig[5]);
        assert_eq!(
            [x[2], x[3], x[6], x[7]],
            [orig[2], orig[3], orig[6], orig[7]]
        );
    }

    #[test]
    fn rope_at_zero_is_identity_and_preserves_norm() {
        let rope = Rope::new(8, 10_000.0, 1.0);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, 0);
        assert_eq!(x, orig);
        rope.apply(&mut x, 123);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() / n0 < 1e-5);
    }
}
