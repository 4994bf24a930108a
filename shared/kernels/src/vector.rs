//! Row-wise f32 operations shared by the model forwards (target and drafter). Every
//! function treats each row on its own with a fixed order of arithmetic, so a row's result
//! never depends on how many rows share a call.

/// Dot product with eight fixed accumulator lanes and a fixed final reduction (so the
/// result never depends on the caller). Always inlined, so that callers compiled with wider
/// registers (attention) vectorize it.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    for i in chunks..a.len() {
        acc[i - chunks] += a[i] * b[i];
    }
    let s0 = (acc[0] + acc[4]) + (acc[1] + acc[5]);
    let s1 = (acc[2] + acc[6]) + (acc[3] + acc[7]);
    s0 + s1
}

/// In place: each `width`-wide row of `x` becomes `x / rms(x) * scale` (for Gemma, `scale` is `1 + w`).
pub fn rms_norm_rows(x: &mut [f32], scale: &[f32], eps: f32) {
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
pub fn rms_norm(x: &[f32], scale: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    rms_norm_rows(&mut out, scale, eps);
    out
}

/// `tanh`-approximated GELU (`gelu_pytorch_tanh`) of `gate`, times `up`, into `gate`;
/// compiled for AVX-512 or AVX2 where present, with the same per-lane operations, so the
/// results do not depend on the CPU.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was just detected.
            return unsafe { gelu_tanh_mul_avx512(gate, up) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            return unsafe { gelu_tanh_mul_avx2(gate, up) };
        }
    }
    gelu_tanh_mul_body(gate, up)
}

/// [`gelu_tanh_mul_body`] compiled with AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
fn gelu_tanh_mul_avx512(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_body(gate, up)
}

/// [`gelu_tanh_mul_body`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_body(gate, up)
}

#[inline(always)]
fn gelu_tanh_mul_body(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + tanh(inner)) * u;
    }
}

/// `out[i] = e^{(x[i] - max(x)) · scale}` for every element (`out` is overwritten), and
/// their sum in f64: the weights of a softmax at temperature `1 / scale`
/// ([`exp_weights`] over [`lane_max`]).
pub fn softmax_weights(x: &[f32], scale: f32, out: &mut Vec<f32>) -> f64 {
    out.clear();
    out.resize(x.len(), 0.0);
    exp_weights(x, lane_max(x), scale, out)
}

/// `out[i] = e^{(x[i] - max) · scale}` for every element of `x` (`out` as long), and their
/// sum in f64 ([`lane_sum`]). The argument is rounded to f32 and its exponential is within
/// 2.4e-7 relative (`scale > 0`); compiled for AVX-512 or AVX2 where present, with the same
/// per-lane operations, so the results do not depend on the CPU, nor on how a row is cut
/// into parts.
pub fn exp_weights(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was just detected.
            return unsafe { exp_weights_avx512(x, max, scale, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            return unsafe { exp_weights_avx2(x, max, scale, out) };
        }
    }
    exp_weights_body(x, max, scale, out)
}

/// [`exp_weights_body`] compiled with AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
fn exp_weights_avx512(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f64 {
    exp_weights_body(x, max, scale, out)
}

/// [`exp_weights_body`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_weights_avx2(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f64 {
    exp_weights_body(x, max, scale, out)
}

#[inline(always)]
fn exp_weights_body(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f64 {
    for (o, v) in out.iter_mut().zip(x) {
        *o = exp((*v - max) * scale);
    }
    lane_sum(out)
}

/// The largest of `x` (−∞ for none): the maximum of sixteen lanes, then of the lanes — the
/// same value as one running maximum (only the sign of a zero maximum can differ), in a loop
/// that vectorizes.
#[inline(always)]
pub fn lane_max(x: &[f32]) -> f32 {
    let mut highest = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (h, v) in highest.iter_mut().zip(c) {
            *h = h.max(*v);
        }
    }
    highest.iter().copied().fold(rest, f32::max)
}

/// The sum of `x` in f64 over eight running lanes (then the lanes, then the remainder): a
/// loop that vectorizes, where one running sum is bound by the latency of its additions.
#[inline(always)]
pub fn lane_sum(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|e| *e as f64).sum();
    for c in chunks {
        for (l, e) in lanes.iter_mut().zip(c) {
            *l += *e as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Soft-caps each value in place: `cap · tanh(x / cap)` (libm's `tanhf`).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// `tanh(z)` as `1 - 2 / (e^{2z} + 1)` with [`exp`]: within 2.5e-7 of the exact value
/// (absolute), ±1 beyond ±44, and branch-free, so that loops over it vectorize (libm's
/// `tanhf` is a scalar call per element, a tenth of a verify's time in the FFN activation).
#[inline(always)]
fn tanh(z: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * z) + 1.0)
}

/// `e^x` (Cephes `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`, the exponent `n`
/// put in the bits), within 2 ulp on `[-87, 88]`, clamped to that range outside it.
/// Branch-free, so loops over it vectorize, with the same bits in every lane width.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let poly = (p * r) * r + r + 1.0;
    // `n` (in [-126, 127]) sits in the low mantissa bits of `shifted`: integer arithmetic
    // on them builds `2^n` and vectorizes, where a float-to-int cast would not.
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    poly * f32::from_bits(biased << 23)
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
    fn softmax_weights_match_f64() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 37) % 101) as f32 * 0.3 - 12.0)
            .collect();
        let mut out = Vec::new();
        let total = softmax_weights(&x, 1.0 / 0.7, &mut out);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let arg = |v: f32| ((v - max) * (1.0 / 0.7f32)) as f64;
        let exact: Vec<f64> = x.iter().map(|v| arg(*v).exp()).collect();
        for (e, w) in out.iter().zip(&exact) {
            assert!(((*e as f64 - w) / w).abs() < 3e-7, "{e} vs {w}");
        }
        let sum: f64 = exact.iter().sum();
        assert!(((total - sum) / sum).abs() < 3e-7);
        assert_eq!(out.iter().copied().fold(0f32, f32::max), 1.0);
    }

    /// The dispatched softmax weights (AVX-512 or AVX2 where present) are the portable
    /// loop's, bit for bit, with a running maximum instead of the lane maxima, and the
    /// same cut into parts.
    #[test]
    fn softmax_weights_give_the_portable_bits() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for len in [1, 5, 16, 17, 100, 1000] {
            let mut x: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 211) as f32 * 0.2 - 20.0)
                .collect();
            x[len / 2] = if len % 2 == 0 { 0.0 } else { -0.0 };
            for scale in [0.5f32, 1.0 / 0.7, 3.0] {
                let mut fast = Vec::new();
                let total = softmax_weights(&x, scale, &mut fast);
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let plain: Vec<f32> = x.iter().map(|v| exp((*v - max) * scale)).collect();
                let mut again = vec![0f32; len];
                assert_eq!(
                    total.to_bits(),
                    exp_weights_body(&x, max, scale, &mut again).to_bits()
                );
                assert_eq!(bits(&fast), bits(&plain), "length {len}");
                assert_eq!(bits(&fast), bits(&again), "length {len}");
                let mut parts = vec![0f32; len];
                let (a, b) = x.split_at(len / 3);
                let (pa, pb) = parts.split_at_mut(len / 3);
                exp_weights(a, max, scale, pa);
                exp_weights(b, max, scale, pb);
                assert_eq!(bits(&parts), bits(&plain), "length {len} in parts");
            }
        }
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
    fn rms_norm_gives_unit_rms_rows_and_keeps_zeros() {
        let x = [3.0, 4.0, 0.0, 0.0, -1.0, 1.0];
        let y = rms_norm(&x, &[1.0, 1.0], 1e-6);
        assert_eq!(&y[2..4], &[0.0, 0.0]);
        for row in [&y[..2], &y[4..]] {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / 2.0;
            assert!((ms - 1.0).abs() < 1e-5, "{ms}");
        }
    }

    #[test]
    fn gelu_matches_known_values() {
        let mut g = [0.0, 1.0, -1.0];
        gelu_tanh_mul(&mut g, &[1.0; 3]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 0.841_192).abs() < 1e-5);
        assert!((g[2] + 0.158_808).abs() < 1e-5);
    }

    /// The dispatched activation (AVX-512 or AVX2 where present) gives the portable loop's
    /// bits, over ordinary values, the clamped range of `exp`, zeros, infinities and NaN,
    /// and lengths that leave every vector tail.
    #[test]
    fn gelu_gives_the_portable_bits() {
        let specials = [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            50.0,
            -50.0,
            1e6,
            -1e6,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let values: Vec<f32> = (0..997)
            .map(|i| ((i * 7919) % 2003) as f32 * 0.01 - 10.0)
            .chain(specials)
            .collect();
        for len in [1, 7, 8, 15, 16, 17, 33, values.len()] {
            let up: Vec<f32> = (0..len).map(|i| 1.0 - 0.01 * i as f32).collect();
            let (mut fast, mut plain) = (values[..len].to_vec(), values[..len].to_vec());
            gelu_tanh_mul(&mut fast, &up);
            gelu_tanh_mul_body(&mut plain, &up);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&plain), "length {len}");
        }
    }

    #[test]
    fn dot_matches_f64() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - exact).abs() < 1e-5);
    }
}
