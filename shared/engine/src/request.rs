//! A generation request, as every front end (CLI, gRPC) hands it to the engine.

use tandem_core::{
    LogitControls, Penalties, SamplingParams, StopConfig, Verification, MAX_TOP_LOGPROBS,
};

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
    /// Repetition, presence and frequency penalties.
    pub penalties: Penalties,
    /// min-p (0: off).
    pub min_p: f32,
    /// Generate at least this many tokens (end tokens masked, stop strings ignored before).
    pub min_tokens: usize,
    /// Tokens that end the generation with finish reason stop.
    pub stop_token_ids: Vec<u32>,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// When speculating, verify a continuation of the anchor found in the committed context
    /// (prompt included) before asking the proposer.
    pub lookup: bool,
}

/// Most stop token ids per request.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

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
            penalties: Penalties::default(),
            min_p: 0.0,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            logprobs: None,
            lookup: true,
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
        self.controls(&[]).validate()?;
        let invalid = |m: String| Err(EngineError::InvalidRequest(m));
        if self.min_tokens > self.max_tokens {
            return invalid(format!(
                "min_tokens ({}) exceeds max_tokens ({})",
                self.min_tokens, self.max_tokens
            ));
        }
        if self.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return invalid(format!("logprobs must be at most {MAX_TOP_LOGPROBS}"));
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return invalid(format!("at most {MAX_STOP_TOKEN_IDS} stop token ids"));
        }
        Ok(())
    }

    /// The end-of-sequence tokens that end this request (none when it ignores them).
    fn end_of_sequence(&self, eos_ids: &[u32]) -> Vec<u32> {
        match self.ignore_eos {
            true => Vec::new(),
            false => eos_ids.to_vec(),
        }
    }

    /// The logit controls for a target whose end-of-sequence tokens are `eos_ids`.
    pub fn controls(&self, eos_ids: &[u32]) -> LogitControls {
        let mut end_ids = self.end_of_sequence(eos_ids);
        end_ids.extend(&self.stop_token_ids);
        LogitControls {
            penalties: self.penalties,
            min_p: self.min_p,
            min_tokens: self.min_tokens,
            end_ids,
        }
    }

    /// The stop conditions for a target whose end-of-sequence tokens are `eos_ids`.
    pub fn stop_config(&self, eos_ids: &[u32]) -> StopConfig {
        StopConfig {
            max_tokens: self.max_tokens,
            eos_ids: self.end_of_sequence(eos_ids),
            stop_strings: self.stop_strings.clone(),
            stop_ids: self.stop_token_ids.clone(),
            min_tokens: self.min_tokens,
        }
    }
}
