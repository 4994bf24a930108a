//! The drafter service's one error type and its one mapping to a gRPC status.

use tandem_core::ProposeError;
use tandem_proto::codec::DecodeError;
use tonic::Status;

/// Why a drafting session failed.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// A message other than Open started the stream.
    #[error("unknown session: a Draft stream must start with Open")]
    UnknownSession,
    /// The verifier serves another target than this drafter was made for.
    #[error("target mismatch: this drafter was made for {ours}, the verifier serves {theirs}")]
    TargetMismatch {
        /// This drafter's target.
        ours: String,
        /// The verifier's.
        theirs: String,
    },
    /// Every session slot is taken.
    #[error("drafter busy: {0} sessions open")]
    Busy(usize),
    /// A malformed message (wrong order, empty, bad rows).
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The verifier sent nothing for the idle timeout.
    #[error("session idle for {0:?}: closed")]
    Idle(std::time::Duration),
    /// The proposer refused or failed a call.
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

impl From<DecodeError> for DrafterError {
    fn from(e: DecodeError) -> Self {
        Self::Invalid(e.0)
    }
}

impl DrafterError {
    /// Every value of [`DrafterError::error_type`].
    pub const TYPES: [&'static str; 7] = [
        "unknown_session",
        "idle",
        "target_mismatch",
        "busy",
        "invalid",
        "propose_invalid",
        "propose_unavailable",
    ];

    /// A short, bounded name for metric labels.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::UnknownSession => "unknown_session",
            Self::TargetMismatch { .. } => "target_mismatch",
            Self::Busy(_) => "busy",
            Self::Invalid(_) => "invalid",
            Self::Idle(_) => "idle",
            Self::Propose(ProposeError::Invalid(_)) => "propose_invalid",
            Self::Propose(ProposeError::Unavailable(_)) => "propose_unavailable",
        }
    }
}

impl From<DrafterError> for Status {
    fn from(e: DrafterError) -> Self {
        let msg = e.to_string();
        match e {
            DrafterError::UnknownSession | DrafterError::TargetMismatch { .. } => {
                Status::failed_precondition(msg)
            }
            DrafterError::Busy(_) => Status::resource_exhausted(msg),
            DrafterError::Idle(_) => Status::deadline_exceeded(msg),
            DrafterError::Invalid(_) | DrafterError::Propose(ProposeError::Invalid(_)) => {
                Status::invalid_argument(msg)
            }
            DrafterError::Propose(ProposeError::Unavailable(_)) => Status::unavailable(msg),
        }
    }
}
