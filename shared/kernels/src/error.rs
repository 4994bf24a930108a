//! The crate's error type.

use crate::{Isa, QType};

/// Errors reported by matrix construction and the kernels. Kernels validate
/// every size up front and never panic on bad input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A ggml type id this crate does not support.
    #[error("unsupported ggml type id {0}")]
    UnsupportedGgmlType(u32),
    /// A matrix with zero rows or zero columns.
    #[error("matrix must have at least one row and one column, got {n}x{k}")]
    EmptyMatrix {
        /// Output rows.
        n: usize,
        /// Inputs per row.
        k: usize,
    },
    /// `k` is not a whole number of blocks of the storage type.
    #[error("k = {k} is not a multiple of the {qtype:?} block size {block_size}")]
    MisalignedK {
        /// Storage type.
        qtype: QType,
        /// Inputs per row.
        k: usize,
        /// Elements per block of `qtype`.
        block_size: usize,
    },
    /// The matrix byte buffer does not match `n`, `k` and the storage type.
    #[error("a {qtype:?} matrix of {n}x{k} needs {expected} bytes, got {actual}")]
    ByteLength {
        /// Storage type.
        qtype: QType,
        /// Output rows.
        n: usize,
        /// Inputs per row.
        k: usize,
        /// Required byte count.
        expected: usize,
        /// Provided byte count.
        actual: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size of {what} overflows usize")]
    SizeOverflow {
        /// What was being sized.
        what: &'static str,
    },
    /// An activation or output buffer has the wrong length.
    #[error("{what} has length {actual}, expected {expected}")]
    BufferLength {
        /// Which buffer.
        what: &'static str,
        /// Required length.
        expected: usize,
        /// Provided length.
        actual: usize,
    },
    /// A row index past the end of the matrix.
    #[error("row {row} is out of range for a matrix with {n} rows")]
    RowOutOfRange {
        /// Requested row.
        row: usize,
        /// Number of rows.
        n: usize,
    },
    /// Only quantized matrices can be repacked into a [`crate::LaneMatrix`].
    #[error("a {0:?} matrix is not quantized: only quantized types have a lane layout")]
    NotQuantized(QType),
    /// [`crate::ArgmaxScreen`] needs Q8_0 weights with finite scales.
    #[error("an argmax screen needs Q8_0 weights with finite scales, got {0:?}")]
    NoScreen(QType),
    /// An [`crate::ArgmaxScreen`] used with a matrix of another shape.
    #[error("an argmax screen of a {screen:?} matrix used with a {matrix:?} one")]
    ScreenShape {
        /// `(n, k)` the screen was built for.
        screen: (usize, usize),
        /// `(n, k)` of the matrix passed.
        matrix: (usize, usize),
    },
    /// The requested instruction set is not supported by this CPU.
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
    /// A name that is not one of [`Isa::name`]'s.
    #[error("unknown CPU kernels {0:?}: expected portable, avx2, avx-vnni or amx")]
    UnknownIsa(String),
    /// [`Isa::set_max`] with a cap other than the one already set.
    #[error("the CPU kernels are already capped at {set}, cannot cap them at {wanted}")]
    IsaCapAlreadySet {
        /// The cap in force.
        set: Isa,
        /// The cap asked for.
        wanted: Isa,
    },
}
