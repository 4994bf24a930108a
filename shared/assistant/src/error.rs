//! The crate's one error type.

use tandem_gemma::GemmaError;

/// Why an assistant proposer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AssistantError {
    /// Loading the assistant or the target's embedding failed.
    #[error(transparent)]
    Model(#[from] GemmaError),
    /// The assistant was not made for this target (sizes or donor geometry differ).
    #[error("the assistant does not fit the target: {0}")]
    Mismatch(String),
    /// Its calibration file cannot be read or written.
    #[error("{path}: {message}")]
    Calibration {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}
