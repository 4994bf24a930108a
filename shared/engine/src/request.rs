//! A generation request, as every front end (CLI, gRPC) hands it to the engine.

use tandem_core::{SamplingParams, StopConfig, Verification};

use crate::error::{EngineError, Result};

/// What to generate and how.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Prompt token ids (with the BOS token when the model expects one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Temperature, top-k, top-p and seed.
    pub sampling: SamplingParams,
    /// Strings that end the generation (cut from the text).
    pub stop_strings: Vec<String>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Draft this many tokens per round (0 = plain decoding). Capped by the proposer's
    /// maximum; ignored without a proposer.
    pub gamma: usize,
    /// Let a [`tandem_core::GammaPolicy`] choose each round's draft length, up to `gamma`
    /// (plain rounds included, when drafting does not pay).
    pub adaptive_gamma: bool,
    /// How sampled rounds judge their drafts (greedy rounds are the same either way).
    pub verification: Verification,
    /// Let adaptive generations verify only the part of each block whose calibrated
    /// confidences pay for its verify rows (blocks without calibrated confidences are
    /// verified whole).
    pub confidence_cuts: bool,
}

impl Default for GenerationRequest {
    fn default() -> Self {
        Self {
            prompt: Vec::new(),
            max_tokens: 64,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            ignore_eos: false,
            gamma: 0,
            adaptive_gamma: false,
            verification: Verification::default(),
            confidence_cuts: true,
        }
    }
}

impl GenerationRequest {
    /// Checks what can be checked without the model.
    pub fn validate(&self) -> Result<()> {
        if self.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if self.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        self.sampling.validate()?;
        Ok(())
    }

    /// The stop conditions for a target whose end-of-sequence tokens are `eos_ids`.
    pub fn stop_config(&self, eos_ids: &[u32]) -> StopConfig {
        StopConfig {
            max_tokens: self.max_tokens,
            eos_ids: if self.ignore_eos {
                Vec::new()
            } else {
                eos_ids.to_vec()
            },
            stop_strings: self.stop_strings.clone(),
        }
    }
}
