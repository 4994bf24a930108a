//! Row-wise f32 operations of the forward. Every function treats each row on its own with a
//! fixed order of arithmetic, so a row's result never depends on how many rows share a call
//! (the property lossless speculative decoding needs).

pub(crate) use tandem_kernels::{gelu_tanh_mul, rms_norm, rms_norm_rows, softcap};

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

    /// The cosines and sines of the `head_dim / 2` rotation angles at position `pos`.
    pub(crate) fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|f| {
                let angle = pos as f32 * f;
                (angle.cos(), angle.sin())
            })
            .unzip()
    }

    /// Rotates every `head_dim`-wide head of `row` for absolute position `pos`.
    pub(crate) fn apply(&self, row: &mut [f32], pos: usize) {
        self.angles(pos, 1).apply(row, 0);
    }

    /// The cosines and sines of positions `pos..pos + m`, for every layer of a forward
    /// that uses this rope (one `sin`/`cos` evaluation per angle and position).
    pub(crate) fn angles(&self, pos: usize, m: usize) -> RopeAngles {
        let (cos, sin) = (pos..pos + m)
            .map(|p| self.cos_sin(p))
            .unzip::<_, _, Vec<_>, Vec<_>>();
        RopeAngles {
            half: self.inv_freq.len(),
            cos: cos.concat(),
            sin: sin.concat(),
        }
    }
}

/// [`Rope::angles`]: the cosines and sines of consecutive positions.
#[derive(Debug, Clone)]
pub(crate) struct RopeAngles {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    /// The cosines and the sines, each position-major `[positions, head_dim / 2]`.
    pub(crate) fn into_tables(self) -> (Vec<f32>, Vec<f32>) {
        (self.cos, self.sin)
    }

    /// Rotates each head of `row`, the `r`-th of the positions.
    pub(crate) fn apply(&self, row: &mut [f32], r: usize) {
        let half = self.half;
        let (cos, sin) = (&self.cos[r * half..][..half], &self.sin[r * half..][..half]);
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
