//! The response bodies of OpenAI's API, as tandem fills them: usage, finish reasons and
//! log-probabilities in the legacy completions shape and in the chat shape.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use tandem_proto::v1 as pb;
use tandem_tokenizer::GemmaTokenizer;

/// Token counts of a request (summed over its choices).
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(crate) struct Usage {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
}

impl Usage {
    /// Adds a finished choice: the prompt counts once, every choice's tokens count.
    pub(crate) fn add(&mut self, f: &pb::Finished) {
        let u = f.usage.unwrap_or_default();
        self.prompt_tokens = u.prompt_tokens;
        self.completion_tokens += u.completion_tokens;
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
    }
}

/// OpenAI's name of a finish: `stop` (EOS or a stop string or token), `length`; `abort`
/// and `error` (vLLM's) for generations the server ended.
pub(crate) fn finish_reason(f: &pb::Finished) -> &'static str {
    use pb::FinishReason as R;
    match f.reason() {
        R::Length => "length",
        R::Eos | R::Stop | R::Unspecified => "stop",
        R::Cancelled => "abort",
        R::Error => "error",
    }
}

/// A token as text: its decoding, special tokens kept.
pub(crate) fn token_text(tokenizer: &GemmaTokenizer, id: u32) -> String {
    tokenizer.decode_with(&[id], false).unwrap_or_default()
}

/// `{token: logprob, …}` in the order given (most likely first).
#[derive(Debug, Default)]
pub(crate) struct TopMap(Vec<(String, f32)>);

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

/// Log-probabilities in the legacy completions shape.
#[derive(Debug, Default, Serialize)]
pub(crate) struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<TopMap>,
    text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// The log-probabilities of `ids`, their text starting at byte `offset` of the choice.
    pub(crate) fn of(
        tokenizer: &GemmaTokenizer,
        ids: &[u32],
        logprobs: &[pb::TokenLogprob],
        mut offset: usize,
    ) -> Self {
        let mut out = Self::default();
        for (id, lp) in ids.iter().zip(logprobs) {
            let token = token_text(tokenizer, *id);
            out.text_offset.push(offset);
            offset += token.len();
            out.tokens.push(token);
            out.token_logprobs.push(lp.logprob);
            let top = lp.top_ids.iter().zip(&lp.top_logprobs);
            out.top_logprobs.push(TopMap(
                top.map(|(t, l)| (token_text(tokenizer, *t), *l)).collect(),
            ));
        }
        out
    }

    /// Bytes of token text these entries span.
    pub(crate) fn end(&self) -> usize {
        self.tokens.iter().map(String::len).sum()
    }
}

/// One alternative of a chat token.
#[derive(Debug, Serialize)]
pub(crate) struct TopLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

/// One chat token's log-probability and its most likely alternatives.
#[derive(Debug, Serialize)]
pub(crate) struct ChatTokenLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    top_logprobs: Vec<TopLogprob>,
}

/// Log-probabilities in the chat shape.
#[derive(Debug, Default, Serialize)]
pub(crate) struct ChatLogprobs {
    /// One entry per generated token.
    pub(crate) content: Vec<ChatTokenLogprob>,
}

impl ChatLogprobs {
    /// The log-probabilities of `ids`.
    pub(crate) fn of(
        tokenizer: &GemmaTokenizer,
        ids: &[u32],
        logprobs: &[pb::TokenLogprob],
    ) -> Self {
        let entry = |id: u32, logprob: f32| {
            let token = token_text(tokenizer, id);
            (token.as_bytes().to_vec(), token, logprob)
        };
        let content = ids
            .iter()
            .zip(logprobs)
            .map(|(id, lp)| {
                let (bytes, token, logprob) = entry(*id, lp.logprob);
                let top = lp.top_ids.iter().zip(&lp.top_logprobs);
                let top_logprobs = top
                    .map(|(t, l)| {
                        let (bytes, token, logprob) = entry(*t, *l);
                        TopLogprob {
                            token,
                            logprob,
                            bytes,
                        }
                    })
                    .collect();
                ChatTokenLogprob {
                    token,
                    logprob,
                    bytes,
                    top_logprobs,
                }
            })
            .collect();
        Self { content }
    }
}

/// `choices[i]` of a completion (or of a completion chunk, `text` then the delta).
#[derive(Debug, Serialize)]
pub(crate) struct CompletionChoice {
    pub(crate) index: u32,
    pub(crate) text: String,
    pub(crate) logprobs: Option<CompletionLogprobs>,
    pub(crate) finish_reason: Option<&'static str>,
}

/// The assistant's message of a chat choice, or a chunk's delta.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Message {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<String>,
}

/// `choices[i]` of a chat completion.
#[derive(Debug, Serialize)]
pub(crate) struct ChatChoice {
    pub(crate) index: u32,
    pub(crate) message: Message,
    pub(crate) logprobs: Option<ChatLogprobs>,
    pub(crate) finish_reason: Option<&'static str>,
}

/// `choices[i]` of a chat completion chunk.
#[derive(Debug, Serialize)]
pub(crate) struct ChatDelta {
    pub(crate) index: u32,
    pub(crate) delta: Message,
    pub(crate) logprobs: Option<ChatLogprobs>,
    pub(crate) finish_reason: Option<&'static str>,
}

/// A whole response or one chunk of a stream: OpenAI's envelope around `choices`.
#[derive(Debug, Serialize)]
pub(crate) struct Envelope<'a, C> {
    pub(crate) id: &'a str,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<Usage>,
}
