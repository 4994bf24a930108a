//! The one error type of the DSpark drafter crate.

use std::path::PathBuf;

use tandem_core::TargetIdentity;

/// Everything that can go wrong building, loading, training or running a drafter.
#[derive(Debug, thiserror::Error)]
pub enum DsparkError {
    /// The drafter configuration is inconsistent with itself or with the target.
    #[error("invalid drafter config: {0}")]
    Config(String),
    /// A call that does not fit the model or the session (shapes, positions, tokens).
    #[error("invalid drafter call: {0}")]
    Invalid(String),
    /// A batched draft failed as a whole (every session in it gets this).
    #[error("a batched draft failed: {0}")]
    Batch(String),
    /// The checkpoint was made for another target model.
    #[error("drafter was made for target {expected}, but the target is {found}")]
    TargetMismatch {
        /// The identity recorded in the checkpoint.
        expected: TargetIdentity,
        /// The identity of the target it is being loaded for.
        found: TargetIdentity,
    },
    /// A checkpoint file is missing, unreadable or not a DSpark checkpoint.
    #[error("invalid checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file or directory involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An error of the target model crate (head loading, logits).
    #[error(transparent)]
    Target(#[from] tandem_gemma::GemmaError),
    /// An error of the frozen inference kernels.
    #[error(transparent)]
    Kernel(#[from] tandem_kernels::KernelError),
    /// An error from candle (first line only: candle may append a backtrace).
    #[error("{}", .0.to_string().lines().next().unwrap_or_default())]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, DsparkError>;

impl DsparkError {
    pub(crate) fn checkpoint(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Checkpoint {
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
