//! `POST /v1/chat/completions`: `messages` (system, user and assistant turns; content a
//! string or an array of text parts, joined) rendered through the tokenizer's chat
//! template with the assistant's turn opened, `max_completion_tokens` (or the older
//! `max_tokens`; neither: the server's default), `logprobs` with `top_logprobs`
//! alternatives, `n` choices, streamed or not. Other content parts (images, audio) and
//! tools are refused.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use tandem_engine::Engine;
use tandem_proto::v1 as pb;

use super::choices::Gathered;
use super::error::{ApiError, Body};
use super::openai::{finish_reason, ChatChoice, ChatDelta, ChatLogprobs, Envelope, Message, Usage};
use super::params::{Common, Shape};
use super::stream::{json, Chunks};
use super::{answer, Api, Label};

const OBJECT: &str = "chat.completion";
const CHUNK_OBJECT: &str = "chat.completion.chunk";
const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// One part of a message's content.
#[derive(Debug, Deserialize)]
pub(crate) struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// A message's content.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    /// Text.
    Text(String),
    /// Parts (text only).
    Parts(Vec<Part>),
}

/// One turn.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatTurn {
    role: String,
    content: Option<Content>,
}

/// The body of `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    messages: Vec<ChatTurn>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    tools: Option<Vec<serde_json::Value>>,
    #[serde(flatten)]
    common: Common,
}

impl ChatTurn {
    fn wire(self) -> Result<pb::ChatMessage, ApiError> {
        if !ROLES.contains(&self.role.as_str()) {
            let msg = format!("role {:?}: expected one of {ROLES:?}", self.role);
            return Err(ApiError::invalid_param("messages", msg));
        }
        let content = match self.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            let msg = format!(
                                "content parts of type {kind:?} are not supported (text only)"
                            );
                            return Err(ApiError::invalid_param("messages", msg));
                        }
                    }
                }
                text
            }
        };
        Ok(pb::ChatMessage {
            role: self.role,
            content,
        })
    }
}

impl ChatRequest {
    fn shape(self) -> Result<(Shape, Common), ApiError> {
        if self.tools.is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid_param("tools", "tools are not supported"));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param("messages", "messages is empty"));
        }
        let messages = self
            .messages
            .into_iter()
            .map(ChatTurn::wire)
            .collect::<Result<_, _>>()?;
        let logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (true, top) => Some(top.unwrap_or(0)),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ))
            }
        };
        let shape = Shape {
            prompt: pb::generate_request::Prompt::Chat(pb::Chat {
                messages,
                add_generation_prompt: Some(true),
            }),
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            logprobs,
        };
        Ok((shape, self.common))
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn handle(
    State(api): State<Api>,
    headers: HeaderMap,
    Body(req): Body<ChatRequest>,
) -> Result<Response, ApiError> {
    answer(&api, &headers, req.shape()?, |_, logprobs| Writer {
        label: api.label("chatcmpl"),
        engine: api.core.engine().clone(),
        logprobs,
    })
    .await
}

/// Writes the chat completion's responses and chunks.
struct Writer {
    label: Label,
    engine: Engine,
    logprobs: bool,
}

impl Writer {
    fn envelope<C: serde::Serialize>(
        &self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> serde_json::Value {
        json(&Envelope {
            id: &self.label.id,
            object,
            created: self.label.created,
            model: &self.label.model,
            choices,
            usage,
        })
    }

    fn logprobs(&self, ids: &[u32], lps: &[pb::TokenLogprob]) -> Option<ChatLogprobs> {
        self.logprobs
            .then(|| ChatLogprobs::of(self.engine.tokenizer(), ids, lps))
    }

    fn chunk(&self, delta: ChatDelta) -> serde_json::Value {
        self.envelope(CHUNK_OBJECT, vec![delta], None)
    }
}

impl Chunks for Writer {
    fn response(&self, gathered: Vec<Gathered>) -> serde_json::Value {
        let mut usage = Usage::default();
        let choices: Vec<ChatChoice> = (0u32..)
            .zip(gathered)
            .map(|(index, g)| {
                usage.add(&g.finished);
                ChatChoice {
                    index,
                    logprobs: self.logprobs(&g.token_ids, &g.logprobs),
                    finish_reason: Some(finish_reason(&g.finished)),
                    message: Message {
                        role: Some("assistant"),
                        content: Some(g.text),
                    },
                }
            })
            .collect();
        self.envelope(OBJECT, choices, Some(usage))
    }

    fn opening(&mut self, index: u32) -> Option<serde_json::Value> {
        Some(self.chunk(ChatDelta {
            index,
            delta: Message {
                role: Some("assistant"),
                content: Some(String::new()),
            },
            logprobs: None,
            finish_reason: None,
        }))
    }

    fn delta(&mut self, index: u32, msg: &pb::GenerateResponse) -> serde_json::Value {
        self.chunk(ChatDelta {
            index,
            delta: Message {
                role: None,
                content: Some(msg.text.clone()),
            },
            logprobs: self.logprobs(&msg.token_ids, &msg.logprobs),
            finish_reason: None,
        })
    }

    fn finish(&mut self, index: u32, reason: &'static str) -> serde_json::Value {
        self.chunk(ChatDelta {
            index,
            delta: Message::default(),
            logprobs: None,
            finish_reason: Some(reason),
        })
    }

    fn usage(&mut self, usage: Usage) -> serde_json::Value {
        self.envelope::<ChatDelta>(CHUNK_OBJECT, Vec::new(), Some(usage))
    }
}
