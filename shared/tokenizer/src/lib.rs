//! Gemma tokenizer for tandem: a thin wrapper over the `tokenizers` crate that makes BOS
//! handling explicit, plus [`StreamDecoder`], which turns a stream of token ids into text
//! deltas without ever emitting half of a multi-byte or byte-fallback character.

mod chat;

use std::path::Path;

pub use chat::{ChatMessage, ChatTemplate};

/// Errors of tokenization.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The tokenizer file is missing or invalid.
    #[error("cannot load tokenizer {path}: {reason}")]
    Load {
        /// The file involved.
        path: String,
        /// Why it failed.
        reason: String,
    },
    /// Encoding or decoding failed.
    #[error("tokenizer: {0}")]
    Codec(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, TokenizerError>;

/// The Gemma 3 tokenizer (`tokenizer.json`, BPE with byte fallback).
pub struct GemmaTokenizer {
    inner: tokenizers::Tokenizer,
    bos: u32,
    stop_ids: Vec<u32>,
    chat: Option<ChatTemplate>,
}

impl GemmaTokenizer {
    /// Loads `tokenizer.json`, and the chat template of the `tokenizer_config.json` beside
    /// it when there is one.
    pub fn from_file(path: &Path) -> Result<Self> {
        let load_err = |reason: String| TokenizerError::Load {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_file() {
            return Err(load_err("file not found".into()));
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| load_err(e.to_string()))?;
        let bos = inner
            .token_to_id("<bos>")
            .ok_or_else(|| load_err("no <bos> token".into()))?;
        let stop_ids = ["<eos>", "<end_of_turn>"]
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        let config = path.with_file_name("tokenizer_config.json");
        let chat = match config.is_file() {
            true => ChatTemplate::from_config(&config)?,
            false => None,
        };
        Ok(Self {
            inner,
            bos,
            stop_ids,
            chat,
        })
    }

    /// The chat template, when the tokenizer came with one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }

    /// Token ids of a conversation rendered with the chat template (one `<bos>` first).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let template = self.chat.as_ref().ok_or_else(|| {
            TokenizerError::Codec("this model's tokenizer has no chat template".into())
        })?;
        self.encode(&template.render(messages, add_generation_prompt)?, true)
    }

    /// Token ids of `text`, with `<bos>` first when `add_bos` (never twice).
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Codec(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && enc.get_ids().first() != Some(&self.bos) {
            ids.push(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, true)
    }

    /// Text of `ids`, with or without the special tokens.
    pub fn decode_with(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Codec(e.to_string()))
    }

    /// The vocabulary entry of `id` (byte-fallback and word-boundary markers as stored).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Id of a token string, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The `<bos>` id.
    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    /// Ids that end a generation by default (`<eos>`, `<end_of_turn>`).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A fresh incremental decoder.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tok: self,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }
}

/// Incremental detokenizer: feed ids one by one, get the text they complete.
///
/// It decodes a short window of recent ids and emits only the part after what was already
/// emitted, holding text back while it ends in U+FFFD (an incomplete UTF-8 sequence from
/// byte-fallback tokens).
pub struct StreamDecoder<'a> {
    tok: &'a GemmaTokenizer,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl StreamDecoder<'_> {
    /// Adds one id; returns the newly completed text, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let prefix = self
            .tok
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.tok.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(delta) = full.get(prefix.len()..) {
                let delta = delta.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                return Ok(Some(delta));
            }
        }
        Ok(None)
    }

    /// Text still held back (an incomplete character at the very end, rendered as U+FFFD).
    pub fn finish(&mut self) -> Result<Option<String>> {
        let prefix = self
            .tok
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.tok.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full
            .get(prefix.len()..)
            .filter(|d| !d.is_empty())
            .map(str::to_string))
    }
}
