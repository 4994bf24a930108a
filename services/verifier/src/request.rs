//! A wire `GenerateRequest` as the engine takes it: the prompt (text tokenized, or token
//! ids), the stop strings within their limits, and this server's defaults for every field
//! the request leaves unset. The checks that need the target (prompt length, ids in the
//! vocabulary, sampling ranges) are the engine's plan's.

use tandem_core::Verification;
use tandem_engine::GenerationRequest;
use tandem_proto::codec::{sampling_from_pb, verification_from_pb};
use tandem_proto::v1 as pb;
use tandem_tokenizer::GemmaTokenizer;

use crate::error::VerifierError;

/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;

/// What a request gets for the fields it leaves unset.
#[derive(Debug, Clone)]
pub struct RequestDefaults {
    /// Tokens drafted per round (capped per request by `max_gamma`).
    pub gamma: usize,
    /// Let each generation choose its rounds' draft lengths up to that γ
    /// ([`tandem_core::GammaPolicy`]), plain rounds included when drafting does not pay.
    pub adaptive_gamma: bool,
    /// How sampled rounds verify drafts when a request does not say.
    pub verification: Verification,
    /// Whether adaptive generations cut blocks on calibrated confidences when a request
    /// does not say.
    pub confidence_cuts: bool,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
}

/// The engine request of wire request `r`, `defaults` filling what it leaves unset.
pub fn generation_request(
    r: pb::GenerateRequest,
    defaults: &RequestDefaults,
    tokenizer: &GemmaTokenizer,
) -> Result<GenerationRequest, VerifierError> {
    let invalid = |m: String| VerifierError::InvalidArgument(m);
    let verification = verification_from_pb(r.verification(), defaults.verification);
    let prompt = match r.prompt {
        Some(pb::generate_request::Prompt::Text(t)) if !t.is_empty() => tokenizer
            .encode(&t, true)
            .map_err(|e| invalid(e.to_string()))?,
        Some(pb::generate_request::Prompt::TokenIds(ids)) if !ids.ids.is_empty() => ids.ids,
        _ => {
            return Err(invalid(
                "the prompt is empty: give text or token_ids".into(),
            ))
        }
    };
    if r.stop.len() > MAX_STOPS || r.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(invalid(format!(
            "at most {MAX_STOPS} stop strings of {MAX_STOP_BYTES} bytes each"
        )));
    }
    Ok(GenerationRequest {
        prompt,
        max_tokens: r
            .max_tokens
            .map_or(defaults.default_max_tokens, |m| m as usize),
        sampling: sampling_from_pb(r.sampling.as_ref()),
        stop_strings: r.stop,
        ignore_eos: r.ignore_eos,
        gamma: r.max_gamma.map_or(defaults.gamma, |g| g as usize),
        adaptive_gamma: defaults.adaptive_gamma,
        verification,
        confidence_cuts: r.confidence_cuts.unwrap_or(defaults.confidence_cuts),
    })
}
