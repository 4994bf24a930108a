//! The one error type of the model crate.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a Gemma model.
#[derive(Debug, thiserror::Error)]
pub enum GemmaError {
    /// A model file is missing or unreadable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a valid GGUF / safetensors / config file.
    #[error("invalid model file {path}: {reason}")]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor uses a storage type this crate cannot run.
    #[error("tensor {tensor} has unsupported type {dtype}")]
    UnsupportedType {
        /// Tensor name.
        tensor: String,
        /// The type as the file names it.
        dtype: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has a shape that contradicts the config.
    #[error("tensor {tensor} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Tensor name.
        tensor: String,
        /// Shape found in the file.
        actual: Vec<usize>,
        /// Shape the config implies.
        expected: Vec<usize>,
    },
    /// The configuration is inconsistent or unsupported.
    #[error("invalid config: {0}")]
    Config(String),
    /// A forward call that cannot be honoured (bad token, wrong position, ...).
    #[error("invalid forward request: {0}")]
    Request(String),
    /// The KV cache cannot grow further.
    #[error("context full: {needed} positions needed, capacity {capacity}")]
    ContextFull {
        /// Positions the call needs.
        needed: usize,
        /// The cache's maximum.
        capacity: usize,
    },
    /// A file's content does not match its expected SHA-256.
    #[error("checksum mismatch for {path}: expected sha256 {expected}, found {actual}")]
    Checksum {
        /// The file involved.
        path: PathBuf,
        /// The expected digest (hex).
        expected: String,
        /// The digest of the file (hex).
        actual: String,
    },
    /// An error from candle (shown without the backtrace candle may attach).
    #[error("{}", candle_message(.0))]
    Candle(#[from] candle_core::Error),
    /// An error from the CPU kernels.
    #[error(transparent)]
    Kernel(#[from] tandem_kernels::KernelError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, GemmaError>;

/// The first line of a candle error: candle appends a backtrace when `RUST_BACKTRACE` is set.
pub(crate) fn candle_message(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

impl GemmaError {
    pub(crate) fn format(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Format {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
