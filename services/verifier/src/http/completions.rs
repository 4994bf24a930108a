//! `POST /v1/completions`, OpenAI's legacy completions: a prompt (a string, one string in
//! an array, or token ids), `max_tokens` 16 unless given, log-probabilities in the legacy
//! shape (`logprobs`: alternatives per token), `n` choices, streamed or not. `echo`,
//! `suffix` and `best_of` other than `n` are refused; several prompts in one request are
//! refused (send one request each).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use tandem_engine::Engine;
use tandem_proto::v1 as pb;

use super::choices::Gathered;
use super::error::{ApiError, Body};
use super::openai::{finish_reason, CompletionChoice, CompletionLogprobs, Envelope, Usage};
use super::params::{Common, Shape};
use super::stream::{json, Chunks};
use super::{answer, Api, Label};

/// OpenAI's default `max_tokens` of completions.
const DEFAULT_MAX_TOKENS: u32 = 16;
const OBJECT: &str = "text_completion";

/// A prompt as OpenAI takes it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// Several texts (one accepted).
    Texts(Vec<String>),
    /// Several token-id prompts (one accepted).
    IdLists(Vec<Vec<u32>>),
}

/// The body of `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct CompletionRequest {
    prompt: Prompt,
    max_tokens: Option<u32>,
    logprobs: Option<u32>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<u32>,
    #[serde(flatten)]
    common: Common,
}

impl CompletionRequest {
    fn shape(self) -> Result<(Shape, Common), ApiError> {
        use pb::generate_request::Prompt as Wire;
        if self.echo == Some(true) {
            return Err(ApiError::invalid_param("echo", "echo is not supported"));
        }
        if self.suffix.is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
        }
        if self.best_of.is_some_and(|b| b > 1) {
            return Err(ApiError::invalid_param(
                "best_of",
                "best_of is not supported",
            ));
        }
        let one = || ApiError::invalid_param("prompt", "one prompt per request");
        let prompt = match self.prompt {
            Prompt::Text(t) => Wire::Text(t),
            Prompt::Ids(ids) => Wire::TokenIds(pb::TokenIds { ids }),
            Prompt::Texts(mut v) if v.len() == 1 => Wire::Text(v.remove(0)),
            Prompt::IdLists(mut v) if v.len() == 1 => {
                Wire::TokenIds(pb::TokenIds { ids: v.remove(0) })
            }
            Prompt::Texts(_) | Prompt::IdLists(_) => return Err(one()),
        };
        let shape = Shape {
            prompt,
            max_tokens: Some(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
            logprobs: self.logprobs,
        };
        Ok((shape, self.common))
    }
}

/// `POST /v1/completions`.
pub(crate) async fn handle(
    State(api): State<Api>,
    headers: HeaderMap,
    Body(req): Body<CompletionRequest>,
) -> Result<Response, ApiError> {
    answer(&api, &headers, req.shape()?, |n, logprobs| Writer {
        label: api.label("cmpl"),
        engine: api.core.engine().clone(),
        logprobs,
        offsets: vec![0; n],
    })
    .await
}

/// Writes the completion's responses and chunks.
struct Writer {
    label: Label,
    engine: Engine,
    logprobs: bool,
    /// Bytes of token text each choice has streamed (its next `text_offset`).
    offsets: Vec<usize>,
}

impl Writer {
    fn envelope(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> serde_json::Value {
        json(&Envelope {
            id: &self.label.id,
            object: OBJECT,
            created: self.label.created,
            model: &self.label.model,
            choices,
            usage,
        })
    }

    fn logprobs(
        &self,
        ids: &[u32],
        lps: &[pb::TokenLogprob],
        offset: usize,
    ) -> Option<CompletionLogprobs> {
        self.logprobs
            .then(|| CompletionLogprobs::of(self.engine.tokenizer(), ids, lps, offset))
    }
}

impl Chunks for Writer {
    fn response(&self, gathered: Vec<Gathered>) -> serde_json::Value {
        let mut usage = Usage::default();
        let choices = (0u32..)
            .zip(gathered)
            .map(|(index, g)| {
                usage.add(&g.finished);
                CompletionChoice {
                    index,
                    logprobs: self.logprobs(&g.token_ids, &g.logprobs, 0),
                    finish_reason: Some(finish_reason(&g.finished)),
                    text: g.text,
                }
            })
            .collect();
        self.envelope(choices, Some(usage))
    }

    fn opening(&mut self, _: u32) -> Option<serde_json::Value> {
        None
    }

    fn delta(&mut self, index: u32, msg: &pb::GenerateResponse) -> serde_json::Value {
        let offset = self.offsets.get(index as usize).copied().unwrap_or(0);
        let logprobs = self.logprobs(&msg.token_ids, &msg.logprobs, offset);
        if let (Some(lp), Some(o)) = (&logprobs, self.offsets.get_mut(index as usize)) {
            *o = offset + lp.end();
        }
        let choice = CompletionChoice {
            index,
            text: msg.text.clone(),
            logprobs,
            finish_reason: None,
        };
        self.envelope(vec![choice], None)
    }

    fn finish(&mut self, index: u32, reason: &'static str) -> serde_json::Value {
        let choice = CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(reason),
        };
        self.envelope(vec![choice], None)
    }

    fn usage(&mut self, usage: Usage) -> serde_json::Value {
        self.envelope(Vec::new(), Some(usage))
    }
}
