//! The engine's one error type.

use tandem_core::{ControlError, SamplingError};
use tandem_gemma::GemmaError;

/// Why a generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is malformed (empty prompt, zero tokens, prompt too long, bad sampling).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The target model failed.
    #[error("model: {0}")]
    Model(#[from] GemmaError),
    /// A target or tokenizer could not be loaded (the message names the file).
    #[error("{0}")]
    Load(String),
    /// Detokenization failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] tandem_tokenizer::TokenizerError),
}

impl From<SamplingError> for EngineError {
    fn from(e: SamplingError) -> Self {
        Self::InvalidRequest(e.to_string())
    }
}

impl From<ControlError> for EngineError {
    fn from(e: ControlError) -> Self {
        Self::InvalidRequest(e.to_string())
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        Self::Model(GemmaError::from(e))
    }
}

impl EngineError {
    /// A short, bounded name for metric labels.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) => "invalid_request",
            Self::Model(_) => "model",
            Self::Load(_) => "load",
            Self::Tokenizer(_) => "tokenizer",
        }
    }
}

/// Result with [`EngineError`].
pub type Result<T> = std::result::Result<T, EngineError>;
