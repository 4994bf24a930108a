//! The request fields completions and chat share (OpenAI's, vLLM's extensions and
//! tandem's `speculative` and `max_gamma`) and the wire requests they become: one per
//! choice, choice `i` seeded `seed + i` when the request gives a seed (so `n` samples
//! differ, and a request repeated with its seed repeats every choice, speculation or not)
//! and from a random seed otherwise (the core's rule for unseeded requests). Ranges are the
//! engine's to check; what OpenAI has and tandem does not is refused here.

use serde::Deserialize;
use tandem_proto::v1 as pb;

use super::error::ApiError;
use super::Api;

/// Most choices (`n`) per request.
pub(crate) const MAX_CHOICES: u32 = 16;

/// OpenAI's default sampling temperature (the gRPC API's is 0, greedy).
const OPENAI_TEMPERATURE: f32 = 1.0;

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the usage of all choices.
    pub(crate) include_usage: Option<bool>,
}

/// Fields both endpoints take.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Common {
    model: Option<String>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    stop: Option<Stop>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    min_tokens: Option<u32>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: Option<bool>,
    speculative: Option<bool>,
    max_gamma: Option<u32>,
}

/// What differs between the endpoints: the prompt and the token and logprob counts.
pub(crate) struct Shape {
    /// The prompt.
    pub(crate) prompt: pb::generate_request::Prompt,
    /// Most tokens generated (`None`: the server's default).
    pub(crate) max_tokens: Option<u32>,
    /// Alternatives reported per token (`None`: no log-probabilities).
    pub(crate) logprobs: Option<u32>,
}

impl Common {
    /// Whether the answer streams.
    pub(crate) fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a stream ends with a usage chunk.
    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// The wire requests of every choice; refused when the model is not served or a field
    /// asks for what tandem does not do.
    pub(crate) fn requests(
        &self,
        api: &Api,
        shape: Shape,
    ) -> Result<Vec<pb::GenerateRequest>, ApiError> {
        api.check_model(self.model.as_deref())?;
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                "logit_bias is not supported",
            ));
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::invalid_param(
                "n",
                format!("n must be between 1 and {MAX_CHOICES}"),
            ));
        }
        let base = self.request(shape)?;
        Ok((0..n)
            .map(|i| {
                let mut r = base.clone();
                if let (Some(s), Some(seed)) = (r.sampling.as_mut(), self.seed) {
                    s.seed = Some(seed.wrapping_add(u64::from(i)));
                }
                r
            })
            .collect())
    }

    fn request(&self, shape: Shape) -> Result<pb::GenerateRequest, ApiError> {
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) => Some(u32::try_from(k).map_err(|_| {
                ApiError::invalid_param("top_k", "top_k must be -1 (off) or a positive integer")
            })?),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        Ok(pb::GenerateRequest {
            prompt: Some(shape.prompt),
            sampling: Some(pb::SamplingParams {
                temperature: Some(self.temperature.unwrap_or(OPENAI_TEMPERATURE)),
                top_k,
                top_p: self.top_p,
                seed: None,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
            }),
            max_tokens: shape.max_tokens,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            speculative: self.speculative,
            max_gamma: self.max_gamma,
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            min_tokens: self.min_tokens,
            logprobs: shape.logprobs,
            ..pb::GenerateRequest::default()
        })
    }
}
