//! The verifier's one error type and its one mapping to a gRPC status.

use tandem_engine::EngineError;
use tonic::Status;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    /// The request is malformed or out of range.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request can never fit the server's capacity.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The server is shutting down or a worker died.
    #[error("{0}")]
    Unavailable(String),
    /// The request's deadline passed.
    #[error("{0}")]
    DeadlineExceeded(String),
}

impl VerifierError {
    /// A short, bounded name for metric labels.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "invalid_argument",
            Self::ResourceExhausted(_) => "resource_exhausted",
            Self::Engine(e) => e.error_type(),
            Self::Unavailable(_) => "unavailable",
            Self::DeadlineExceeded(_) => "deadline_exceeded",
        }
    }
}

impl From<VerifierError> for Status {
    fn from(e: VerifierError) -> Self {
        let msg = e.to_string();
        match e {
            VerifierError::InvalidArgument(_)
            | VerifierError::Engine(EngineError::InvalidRequest(_)) => {
                Status::invalid_argument(msg)
            }
            VerifierError::ResourceExhausted(_) => Status::resource_exhausted(msg),
            VerifierError::Unavailable(_) => Status::unavailable(msg),
            VerifierError::DeadlineExceeded(_) => Status::deadline_exceeded(msg),
            VerifierError::Engine(_) => Status::internal(msg),
        }
    }
}
