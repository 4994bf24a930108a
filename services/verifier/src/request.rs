//! A wire `GenerateRequest` as the engine takes it: the prompt (text tokenized, or token
//! ids), the stop strings within their limits, and this server's defaults for every field
//! the request leaves unset. The checks that need the target (prompt length, ids in the
//! vocabulary, sampling ranges) are the engine's plan's.

use tandem_core::{SamplingParams, Verification};
use tandem_engine::GenerationRequest;
use tandem_proto::codec::{penalties_from_pb, sampling_from_pb, verification_from_pb};
use tandem_proto::v1 as pb;
use tandem_tokenizer::{ChatMessage, GemmaTokenizer};

use crate::error::VerifierError;

/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Most turns in a chat prompt.
pub const MAX_CHAT_MESSAGES: usize = 1024;

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
    let (params, verification) = sampling_and_verification(&r, defaults);
    let prompt = prompt_ids(r.prompt, tokenizer)?;
    if r.stop.len() > MAX_STOPS || r.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(invalid(format!(
            "at most {MAX_STOPS} stop strings of {MAX_STOP_BYTES} bytes each"
        )));
    }
    let sampling = r.sampling.as_ref();
    Ok(GenerationRequest {
        prompt,
        max_tokens: r
            .max_tokens
            .map_or(defaults.default_max_tokens, |m| m as usize),
        sampling: params,
        penalties: penalties_from_pb(sampling),
        min_p: sampling.and_then(|s| s.min_p).unwrap_or(0.0),
        min_tokens: r.min_tokens.unwrap_or(0) as usize,
        stop_token_ids: r.stop_token_ids,
        logprobs: r.logprobs.map(|n| n as usize),
        stop_strings: r.stop,
        ignore_eos: r.ignore_eos,
        gamma: r.max_gamma.map_or(defaults.gamma, |g| g as usize),
        adaptive_gamma: defaults.adaptive_gamma,
        verification,
        confidence_cuts: r.confidence_cuts.unwrap_or(defaults.confidence_cuts),
        lookup: true,
    })
}

/// The sampling parameters and verification rule of `r`: a request without a seed gets a
/// random one and the server's rule; a sampled request with a seed is verified seeded
/// unless it names a rule, so that its seed gives the same text with or without
/// speculation.
fn sampling_and_verification(
    r: &pb::GenerateRequest,
    defaults: &RequestDefaults,
) -> (SamplingParams, Verification) {
    let wire = r.sampling.as_ref();
    let mut params = sampling_from_pb(wire);
    let seeded = wire.and_then(|s| s.seed).is_some();
    if !seeded {
        params.seed = rand::random();
    }
    let verification = match r.verification() {
        pb::Verification::Unspecified if seeded && !params.is_greedy() => Verification::Seeded,
        v => verification_from_pb(v, defaults.verification),
    };
    (params, verification)
}

/// The token ids of a wire prompt: text tokenized with BOS, ids as given, a conversation
/// through the tokenizer's chat template.
fn prompt_ids(
    prompt: Option<pb::generate_request::Prompt>,
    tokenizer: &GemmaTokenizer,
) -> Result<Vec<u32>, VerifierError> {
    use pb::generate_request::Prompt;
    let invalid = |m: String| VerifierError::InvalidArgument(m);
    match prompt {
        Some(Prompt::Text(t)) if !t.is_empty() => tokenizer
            .encode(&t, true)
            .map_err(|e| invalid(e.to_string())),
        Some(Prompt::TokenIds(ids)) if !ids.ids.is_empty() => Ok(ids.ids),
        Some(Prompt::Chat(chat)) if !chat.messages.is_empty() => {
            if chat.messages.len() > MAX_CHAT_MESSAGES {
                return Err(invalid(format!(
                    "at most {MAX_CHAT_MESSAGES} chat messages"
                )));
            }
            let messages: Vec<ChatMessage> = chat
                .messages
                .into_iter()
                .map(|m| ChatMessage {
                    role: m.role,
                    content: m.content,
                })
                .collect();
            let open_turn = chat.add_generation_prompt.unwrap_or(true);
            tokenizer
                .encode_chat(&messages, open_turn)
                .map_err(|e| invalid(e.to_string()))
        }
        _ => Err(invalid(
            "the prompt is empty: give text, token_ids or chat messages".into(),
        )),
    }
}
