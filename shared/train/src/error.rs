//! The one error type of the training crate.

use std::path::PathBuf;

/// Everything that can go wrong preparing data, training or checkpointing a drafter.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting or input that cannot work (no prompts, continuation too short, ...).
    #[error("invalid training setup: {0}")]
    Invalid(String),
    /// A training checkpoint is missing, unreadable or does not fit the run.
    #[error("invalid training checkpoint {path}: {reason}")]
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
    /// Tokenizing a document failed.
    #[error("cannot tokenize {path}: {reason}")]
    Tokenize {
        /// The document.
        path: PathBuf,
        /// The tokenizer's message.
        reason: String,
    },
    /// An error of the target model.
    #[error(transparent)]
    Target(#[from] tandem_gemma::GemmaError),
    /// An error of the drafter.
    #[error(transparent)]
    Drafter(#[from] tandem_dspark::DsparkError),
    /// An error from candle (first line only: candle may append a backtrace).
    #[error("{}", .0.to_string().lines().next().unwrap_or_default())]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;

impl TrainError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn checkpoint(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Checkpoint {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
