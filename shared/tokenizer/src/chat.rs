//! Chat prompts: a conversation rendered with the Jinja chat template that ships in the
//! model's `tokenizer_config.json` (`chat_template`, with its `bos_token` and `eos_token`),
//! through minijinja with Python's string methods (`minijinja-contrib`'s pycompat) and
//! Jinja2's `trim_blocks` / `lstrip_blocks`, as transformers' `apply_chat_template` renders
//! it (golden fixture: scripts/golden/chat_template_jinja2.py).

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::{Result, TokenizerError};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// "system", "user" or "assistant" (the template decides what it accepts).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

/// A chat template with the special tokens it refers to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// A template from its Jinja `source` and its special tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let template = Self {
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
        };
        template.environment()?;
        Ok(template)
    }

    /// The template of a `tokenizer_config.json` (`None` when it has no `chat_template`).
    pub fn from_config(path: &Path) -> Result<Option<Self>> {
        let load_err = |reason: String| TokenizerError::Load {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| load_err(e.to_string()))?;
        let cfg: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| load_err(e.to_string()))?;
        let Some(source) = cfg.get("chat_template").and_then(|t| t.as_str()) else {
            return Ok(None);
        };
        let token = |key: &str| special_token(cfg.get(key)).unwrap_or_default();
        Self::new(source, &token("bos_token"), &token("eos_token"))
            .map(Some)
            .map_err(|e| load_err(e.to_string()))
    }

    /// The prompt text of `messages`, ending with the opening of the model's turn when
    /// `add_generation_prompt`. A conversation the template refuses (its
    /// `raise_exception`) is an error with the template's message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let env = self.environment()?;
        let template = env.get_template("chat").map_err(codec)?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .map_err(codec)
    }

    fn environment(&self) -> Result<Environment<'_>> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template("chat", &self.source).map_err(codec)?;
        Ok(env)
    }
}

/// A special token of `tokenizer_config.json`: a string, or an object with `content`.
fn special_token(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => other.get("content")?.as_str().map(str::to_string),
    }
}

/// A template error as the tokenizer reports it: the template's own message when it raised
/// one, minijinja's otherwise.
fn codec(e: Error) -> TokenizerError {
    let msg = match e.kind() {
        ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid conversation").to_string(),
        _ => e.to_string(),
    };
    TokenizerError::Codec(msg)
}
