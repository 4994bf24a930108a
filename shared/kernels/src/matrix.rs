//! [`QMatrix`]: a ggml-format weight matrix and its batch-invariant matmul.

use rayon::prelude::*;

use crate::quantize::{Q8KActs, Q8_0Acts};
use crate::{dequant, float, kquants, q8, Isa, KernelError, QType};

/// Below this many multiply-accumulates a matmul runs on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 17;
/// Smallest share of work (multiply-accumulates) handed to one rayon task.
const TASK_MIN_MACS: usize = 1 << 15;
/// Rayon tasks per thread, for load balance.
const TASKS_PER_THREAD: usize = 4;

/// A row-major weight matrix of `n` output rows by `k` inputs stored in a
/// ggml format: each row is `k / block_size` consecutive blocks, exactly as
/// in a GGUF tensor with ggml shape `[k, n]`.
#[derive(Debug, Clone)]
pub struct QMatrix {
    qtype: QType,
    n: usize,
    k: usize,
    row_bytes: usize,
    bytes: Vec<u8>,
}

/// Activations prepared for one matmul.
enum Acts<'a> {
    /// Unquantized (F32 / F16) weights: the f32 activations themselves.
    F32(&'a [f32]),
    Q8_0(Q8_0Acts),
    /// Q8_0 activations packed for the AMX tiles.
    #[cfg(target_arch = "x86_64")]
    Q8_0Tiles(crate::q8_amx::Packed),
    Q8K(Q8KActs),
    /// Two or more Q8_K activation rows interleaved for the AVX-512 pair kernel.
    #[cfg(target_arch = "x86_64")]
    Q8KPairs(crate::kquants_avx512::Pairs),
}

impl QMatrix {
    /// Wraps raw ggml bytes. Fails if `n` or `k` is zero, `k` is not a
    /// multiple of the block size, or `bytes` is not exactly
    /// `n * k / block_size * block_bytes` long.
    pub fn new(qtype: QType, n: usize, k: usize, bytes: Vec<u8>) -> Result<Self, KernelError> {
        if n == 0 || k == 0 {
            return Err(KernelError::EmptyMatrix { n, k });
        }
        let row_bytes = qtype.row_bytes(k)?;
        let expected = row_bytes.checked_mul(n).ok_or(KernelError::SizeOverflow {
            what: "matrix bytes",
        })?;
        n.checked_mul(k).ok_or(KernelError::SizeOverflow {
            what: "matrix elements",
        })?;
        if bytes.len() != expected {
            return Err(KernelError::ByteLength {
                qtype,
                n,
                k,
                expected,
                actual: bytes.len(),
            });
        }
        Ok(QMatrix {
            qtype,
            n,
            k,
            row_bytes,
            bytes,
        })
    }

    /// Storage type.
    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Number of output rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of inputs per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The raw ggml bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// `out = x · Wᵀ`: `x` is `m × k` row-major activations, `out` is
    /// `m × n` row-major. Uses the fastest [`Isa`] of this CPU. Each output
    /// row is bit-identical whatever `m` and the other rows are.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::detect(), x, m, out)
    }

    /// [`QMatrix::matmul`] on a chosen implementation.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        check_call(isa, (x, m, self.k), (out, self.n))?;
        if m == 0 {
            return Ok(());
        }
        let k = self.k;
        let acts = match self.qtype {
            QType::F32 | QType::F16 => Acts::F32(x),
            QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => q8_0_acts(isa, x, m, k),
            QType::Q4_K | QType::Q5_K | QType::Q6_K | QType::Q8_K => {
                q8k_acts(isa, self.qtype, x, m, k)
            }
        };
        self.run(isa, &acts, m, out);
        Ok(())
    }

    /// Splits the output rows between threads (or runs on the calling thread
    /// for small products) and computes `out` from the prepared `acts`.
    fn run(&self, isa: Isa, acts: &Acts<'_>, m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        let macs = m.saturating_mul(k).saturating_mul(n);
        let threads = rayon::current_num_threads();
        if threads <= 1 || macs < PARALLEL_MIN_MACS {
            let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
            self.rows(isa, acts, 0, &mut outs);
            return;
        }
        let min_rows = TASK_MIN_MACS.div_ceil(m * k);
        let chunk = n.div_ceil(threads * TASKS_PER_THREAD).max(min_rows);
        let mut per_row: Vec<_> = out
            .chunks_exact_mut(n)
            .map(|row| row.chunks_mut(chunk))
            .collect();
        let tasks: Vec<(usize, Vec<&mut [f32]>)> = (0..n.div_ceil(chunk))
            .map(|c| {
                (
                    c * chunk,
                    per_row.iter_mut().filter_map(Iterator::next).collect(),
                )
            })
            .collect();
        tasks
            .into_par_iter()
            .for_each(|(j0, mut outs)| self.rows(isa, acts, j0, &mut outs));
    }

    /// Computes output rows `j0..j0 + outs[0].len()` for every activation
    /// row: `outs[r][j - j0] = x[r] · w[j]`.
    fn rows(&self, isa: Isa, acts: &Acts<'_>, j0: usize, outs: &mut [&mut [f32]]) {
        let len = outs.first().map_or(0, |o| o.len());
        let w = &self.bytes[j0 * self.row_bytes..(j0 + len) * self.row_bytes];
        let (q, k) = (self.qtype, self.k);
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar {
            // SAFETY: `matmul_with` checked `isa.is_available()`: AVX2, FMA
            // and F16C were detected at runtime, and AVX-VNNI or AVX-512 VNNI
            // (the kernel matching the one detected runs) for
            // `Isa::AvxVnni` and `Isa::Amx`, and AMX with its permission for
            // `Isa::Amx`; the AVX-512 kernels run only where their own
            // detection (`available`, `handles`) succeeded.
            unsafe {
                match acts {
                    Acts::F32(x) => crate::float::rows_avx2(q, w, k, x, outs),
                    Acts::Q8_0Tiles(a) => crate::q8_amx::rows(q, w, k, a, outs),
                    Acts::Q8_0(a) if isa == Isa::AvxVnni => {
                        if outs.len() >= 2 && crate::q8_avx512::available() {
                            crate::q8_avx512::rows(q, w, k, a, outs)
                        } else if crate::isa::vex_vnni() {
                            crate::q8_x86::rows_vnni(q, w, k, a, outs)
                        } else {
                            crate::q8_x86::rows_vnni_evex(q, w, k, a, outs)
                        }
                    }
                    Acts::Q8_0(a) => crate::q8_x86::rows_avx2(q, w, k, a, outs),
                    Acts::Q8KPairs(p) => crate::kquants_avx512::rows(q, w, k, p, outs),
                    Acts::Q8K(a) if matches!(isa, Isa::AvxVnni | Isa::Amx) => {
                        if crate::isa::vex_vnni() {
                            crate::kquants_avx2::rows_vnni(q, w, k, a, outs)
                        } else {
                            crate::kquants_avx2::rows_vnni_evex(q, w, k, a, outs)
                        }
                    }
                    Acts::Q8K(a) => crate::kquants_avx2::rows_avx2(q, w, k, a, outs),
                }
            }
            return;
        }
        debug_assert_eq!(isa, Isa::Scalar);
        match acts {
            Acts::F32(x) => float::rows_scalar(q, w, k, x, outs),
            Acts::Q8_0(a) => q8::rows_scalar(q, w, k, a, outs),
            #[cfg(target_arch = "x86_64")]
            Acts::Q8_0Tiles(a) => q8::rows_scalar(q, w, k, a.acts(), outs),
            Acts::Q8K(a) => kquants::rows_scalar(q, w, k, a, outs),
            #[cfg(target_arch = "x86_64")]
            Acts::Q8KPairs(p) => kquants::rows_scalar(q, w, k, p.acts(), outs),
        }
    }

    /// A new matrix made of rows `rows` of this one, in that order (repeats allowed): each
    /// row is an independent run of bytes, so the selection is exact and its products are
    /// bit-identical to the corresponding outputs of the whole matrix.
    pub fn select_rows(&self, rows: &[usize]) -> Result<QMatrix, KernelError> {
        let mut bytes = Vec::with_capacity(rows.len().saturating_mul(self.row_bytes));
        for &row in rows {
            if row >= self.n {
                return Err(KernelError::RowOutOfRange { row, n: self.n });
            }
            bytes.extend_from_slice(&self.bytes[row * self.row_bytes..(row + 1) * self.row_bytes]);
        }
        QMatrix::new(self.qtype, rows.len(), self.k, bytes)
    }

    /// Dequantizes row `row` into `out` (`k` values), e.g. for an embedding
    /// lookup.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.n {
            return Err(KernelError::RowOutOfRange { row, n: self.n });
        }
        check_len("dequantized row", out.len(), Some(self.k))?;
        let bytes = &self.bytes[row * self.row_bytes..(row + 1) * self.row_bytes];
        dequant::dequantize_row(self.qtype, bytes, out);
        Ok(())
    }

    /// Dequantizes the whole matrix to `n × k` row-major `f32`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        let rows = self
            .bytes
            .chunks_exact(self.row_bytes)
            .zip(out.chunks_exact_mut(self.k));
        for (bytes, row) in rows {
            dequant::dequantize_row(self.qtype, bytes, row);
        }
        out
    }
}

/// Q8_0 activations as the kernels of `isa` take them: with the `+128`
/// offset for VNNI, packed into tiles for AMX.
fn q8_0_acts<'a>(isa: Isa, x: &[f32], m: usize, k: usize) -> Acts<'a> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx {
        let acts = Q8_0Acts::quantize(x, m, k, false);
        return Acts::Q8_0Tiles(crate::q8_amx::Packed::new(acts, m, k));
    }
    Acts::Q8_0(Q8_0Acts::quantize(x, m, k, isa == Isa::AvxVnni))
}

/// Q8_K activations as the kernels of `isa` take them for `qtype` weights:
/// two or more rows interleaved by pairs where the AVX-512 pair kernel runs.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn q8k_acts<'a>(isa: Isa, qtype: QType, x: &[f32], m: usize, k: usize) -> Acts<'a> {
    let acts = Q8KActs::quantize(x, m, k);
    #[cfg(target_arch = "x86_64")]
    if m >= 2 && matches!(isa, Isa::AvxVnni | Isa::Amx) && crate::kquants_avx512::handles(qtype) {
        // SAFETY: `handles` detected AVX-512 F, BW, VL and VNNI at runtime,
        // and `isa` (checked available by `matmul_with`) AVX2, FMA, F16C.
        return Acts::Q8KPairs(unsafe { crate::kquants_avx512::Pairs::new(acts, m, k) });
    }
    Acts::Q8K(acts)
}

/// Validates the implementation and the buffer sizes of a matmul call: `m`
/// activation rows of `k` in `x`, `m` output rows of `n` in `out`.
pub(crate) fn check_call(
    isa: Isa,
    (x, m, k): (&[f32], usize, usize),
    (out, n): (&[f32], usize),
) -> Result<(), KernelError> {
    if !isa.is_available() {
        return Err(KernelError::IsaUnavailable(isa));
    }
    check_len("activations", x.len(), m.checked_mul(k))?;
    check_len("output", out.len(), m.checked_mul(n))
}

pub(crate) fn check_len(
    what: &'static str,
    actual: usize,
    expected: Option<usize>,
) -> Result<(), KernelError> {
    let expected = expected.ok_or(KernelError::SizeOverflow { what })?;
    if actual == expected {
        Ok(())
    } else {
        Err(KernelError::BufferLength {
            what,
            expected,
            actual,
        })
    }
}
