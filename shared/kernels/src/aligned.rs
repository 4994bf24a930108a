//! 64-byte-aligned copies of activation rows: the 512-bit kernels load
//! activations straight from the caller's rows, and a load from an address
//! that is not a multiple of 64 reads two cache lines. Where the caller's
//! buffer is not aligned (its allocator decides), a matmul works on a copy.

/// One cache line of `f32`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([f32; 16]);

/// `x` itself when it starts on a 64-byte boundary, else an aligned copy.
pub(crate) enum AlignedRows<'a> {
    /// The caller's rows, already aligned.
    Borrowed(&'a [f32]),
    /// A copy: `len` values at the start of `lines`.
    Copied { lines: Vec<Line>, len: usize },
}

impl<'a> AlignedRows<'a> {
    /// `x` or an aligned copy of it.
    pub(crate) fn new(x: &'a [f32]) -> Self {
        if (x.as_ptr() as usize).is_multiple_of(64) {
            return AlignedRows::Borrowed(x);
        }
        let mut lines = vec![Line([0.0; 16]); x.len().div_ceil(16)];
        for (line, chunk) in lines.iter_mut().zip(x.chunks(16)) {
            line.0[..chunk.len()].copy_from_slice(chunk);
        }
        AlignedRows::Copied {
            lines,
            len: x.len(),
        }
    }

    /// The rows, starting on a 64-byte boundary.
    pub(crate) fn as_slice(&self) -> &[f32] {
        match self {
            AlignedRows::Borrowed(x) => x,
            // SAFETY: `lines` holds `16 * lines.len() >= len` initialised
            // `f32` laid out contiguously (`Line` is `repr(C)` of `[f32; 16]`
            // with size 64, so no padding), borrowed for `self`'s lifetime.
            AlignedRows::Copied { lines, len } => unsafe {
                std::slice::from_raw_parts(lines.as_ptr().cast::<f32>(), *len)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedRows;

    #[test]
    fn copies_are_aligned_and_equal() {
        let x: Vec<f32> = (0..101).map(|i| i as f32 * 0.5).collect();
        for start in 0..17 {
            let rows = AlignedRows::new(&x[start..]);
            let s = rows.as_slice();
            assert_eq!(s.as_ptr() as usize % 64, 0);
            assert_eq!(s, &x[start..]);
        }
    }
}
