//! Chosen outputs of a lane-packed product ([`LaneMatrix::outputs`]), each bit for bit as
//! [`LaneMatrix::matmul`] computes it: the portable FMA chain of its lane, in element
//! order from zero. What forms a bounded row's logits one id at a time (the LM head's
//! screen bounds the rest). Chains run eight at a time, so that their FMAs overlap: one
//! chain of 640 dependent FMAs waits on each, and without FMA in the compiled target each
//! `mul_add` was a call (about 3 µs an output on this project's Xeon).

use crate::lanes::LaneMatrix;
use crate::matrix::check_len;
use crate::KernelError;

/// Outputs whose chains run together.
const CHAINS: usize = 8;

impl LaneMatrix {
    /// Output `j` (`< n`) of `x · Wᵀ` for one activation row `x` (`k` values), bit for bit
    /// as [`LaneMatrix::matmul`] computes it: the portable chain of its lane.
    pub fn output(&self, x: &[f32], j: usize) -> Result<f32, KernelError> {
        Ok(self.outputs(x, &[j])?[0])
    }

    /// Outputs `ids` (each `< n`, in order) of `x · Wᵀ`, each as [`LaneMatrix::output`]
    /// gives it.
    pub fn outputs(&self, x: &[f32], ids: &[usize]) -> Result<Vec<f32>, KernelError> {
        if let Some(&row) = ids.iter().find(|&&j| j >= self.n()) {
            return Err(KernelError::RowOutOfRange { row, n: self.n() });
        }
        check_len("activations", x.len(), Some(self.k()))?;
        let mut rows = vec![0f32; CHAINS * self.k()];
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHAINS) {
            for (row, &j) in rows.chunks_exact_mut(self.k()).zip(chunk) {
                self.decode_row(j, row);
            }
            out.extend_from_slice(&chains(&rows, x)[..chunk.len()]);
        }
        Ok(out)
    }
}

/// The FMA chains of [`CHAINS`] rows (`rows`, `CHAINS × k`) with `x`.
fn chains(rows: &[f32], x: &[f32]) -> [f32; CHAINS] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: FMA was just detected.
            return unsafe { chains_fma(rows, x) };
        }
    }
    chains_body(rows, x)
}

/// [`chains_body`] compiled with FMA (the same correctly rounded operation as the
/// portable `mul_add`, as an instruction).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn chains_fma(rows: &[f32], x: &[f32]) -> [f32; CHAINS] {
    chains_body(rows, x)
}

#[inline(always)]
fn chains_body(rows: &[f32], x: &[f32]) -> [f32; CHAINS] {
    let k = x.len();
    let mut acc = [0f32; CHAINS];
    for (e, &xe) in x.iter().enumerate() {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = rows[l * k + e].mul_add(xe, *a);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use crate::lanes::fma_chain;
    use crate::test_data::{random_bytes, sine};
    use crate::{LaneMatrix, QMatrix, QType};

    /// Chosen outputs, alone, together, repeated and past a chunk of chains, are the full
    /// product's bit for bit; an id past the matrix is an error.
    #[test]
    fn outputs_are_the_products() {
        let (n, k) = (48, 64);
        let mut bytes = random_bytes(n * k / 32 * 34, 7);
        for (i, block) in bytes.chunks_exact_mut(34).enumerate() {
            let d = half::f16::from_f32(0.01 + (i % 7) as f32 * 0.003);
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
        let w = QMatrix::new(QType::Q8_0, n, k, bytes).expect("valid bytes");
        let lanes = LaneMatrix::pack(&w).expect("lanes");
        let x = sine(k, 1.3, 0.7);
        let mut full = vec![0f32; n];
        lanes.matmul(&x, 1, &mut full).expect("matmul");
        let ids: Vec<usize> = vec![5, 0, 47, 5, 16, 17, 31, 2, 9, 40, 41];
        let got = lanes.outputs(&x, &ids).expect("outputs");
        for (&j, g) in ids.iter().zip(&got) {
            assert_eq!(g.to_bits(), full[j].to_bits(), "output {j}");
            let one = lanes.output(&x, j).expect("output");
            assert_eq!(one.to_bits(), full[j].to_bits());
        }
        let mut row = vec![0f32; k];
        lanes.decode_row(3, &mut row);
        assert_eq!(fma_chain(&row, &x).to_bits(), full[3].to_bits());
        assert!(lanes.outputs(&x, &[1, n]).is_err());
        assert!(lanes.outputs(&x[1..], &[1]).is_err());
    }
}
