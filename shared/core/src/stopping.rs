//! When a generation ends and what its client sees: the tokens and text deltas of every
//! chunk, cut exactly at a stop string, at end-of-sequence or at the token limit.
//!
//! Text follows the approach of vLLM's detokenizer: a stop string ends the output at the
//! token that completes it, the text stops just before the stop string, and while stop
//! strings are configured the last `longest - 1` bytes of text are held back from the stream
//! so a client never sees the beginning of a stop string that is later cut.

use serde::{Deserialize, Serialize};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FinishReason {
    /// The token limit was reached.
    Length,
    /// An end-of-sequence token was generated.
    Eos,
    /// A stop string was generated.
    Stop,
    /// The client went away.
    Cancelled,
    /// The server failed.
    Error,
}

impl FinishReason {
    /// Lower-case name, for metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Eos => "eos",
            Self::Stop => "stop",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }
}

/// What ends a generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopConfig {
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Tokens that end the generation (included in the tokens, not in the text).
    pub eos_ids: Vec<u32>,
    /// Strings that end the generation (excluded from the text).
    pub stop_strings: Vec<String>,
    /// Tokens that end the generation with [`FinishReason::Stop`] (included in the tokens,
    /// not in the text).
    pub stop_ids: Vec<u32>,
    /// Before this many tokens, only the token limit ends the generation.
    pub min_tokens: usize,
}

/// Tokens and text produced since the previous chunk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Text delta.
    pub text: String,
}

/// The growing output of one generation.
#[derive(Debug, Clone)]
pub struct Output {
    cfg: StopConfig,
    tokens: Vec<u32>,
    text: String,
    released: usize,
    chunked_tokens: usize,
    hold: usize,
    finish: Option<FinishReason>,
}

impl Output {
    /// An empty output governed by `cfg`. Empty stop strings are ignored.
    pub fn new(mut cfg: StopConfig) -> Self {
        cfg.stop_strings.retain(|s| !s.is_empty());
        let hold = cfg
            .stop_strings
            .iter()
            .map(|s| s.len() - 1)
            .max()
            .unwrap_or(0);
        Self {
            cfg,
            tokens: Vec::new(),
            text: String::new(),
            released: 0,
            chunked_tokens: 0,
            hold,
            finish: None,
        }
    }

    /// Adds a generated token and the text it completed; returns the finish reason when this
    /// token ends the generation. Tokens after the end are ignored.
    pub fn push(&mut self, token: u32, text: Option<&str>) -> Option<FinishReason> {
        if self.finish.is_some() {
            return self.finish;
        }
        self.tokens.push(token);
        if self.tokens.len() < self.cfg.min_tokens {
            self.text.push_str(text.unwrap_or_default());
            return None;
        }
        if self.cfg.eos_ids.contains(&token) {
            return self.end(FinishReason::Eos);
        }
        if self.cfg.stop_ids.contains(&token) {
            return self.end(FinishReason::Stop);
        }
        if let Some(delta) = text {
            if self.append_text(delta) {
                return self.end(FinishReason::Stop);
            }
        }
        if self.tokens.len() >= self.cfg.max_tokens {
            return self.end(FinishReason::Length);
        }
        None
    }

    /// Ends the generation with `reason` unless it already ended, and appends `tail`, text
    /// the detokenizer still held back. The tail can complete a stop string, which then wins;
    /// nothing is appended after a stop string.
    pub fn finish(&mut self, reason: FinishReason, tail: Option<&str>) -> FinishReason {
        if self.finish == Some(FinishReason::Stop) {
            return FinishReason::Stop;
        }
        let stopped = tail.is_some_and(|t| self.append_text(t));
        let reason = match self.finish {
            _ if stopped => FinishReason::Stop,
            Some(done) => done,
            None => reason,
        };
        self.end(reason);
        reason
    }

    /// The finish reason, once the generation ended.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Tokens remaining before the limit.
    pub fn remaining(&self) -> usize {
        self.cfg.max_tokens.saturating_sub(self.tokens.len())
    }

    /// All tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// All text so far (after the end: exactly the client's text).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Tokens and text not yet handed out. Text near the end stays back while a stop
    /// string could still complete; after the end everything is released.
    pub fn take_chunk(&mut self) -> Chunk {
        let mut upto = if self.finish.is_some() {
            self.text.len()
        } else {
            self.text.len().saturating_sub(self.hold).max(self.released)
        };
        while !self.text.is_char_boundary(upto) {
            upto -= 1;
        }
        let chunk = Chunk {
            tokens: self.tokens[self.chunked_tokens..].to_vec(),
            text: self.text[self.released..upto].to_string(),
        };
        self.chunked_tokens = self.tokens.len();
        self.released = upto;
        chunk
    }

    fn end(&mut self, reason: FinishReason) -> Option<FinishReason> {
        self.finish = Some(reason);
        self.finish
    }

    /// Appends text; on a stop string, cuts the text before it and returns true.
    fn append_text(&mut self, delta: &str) -> bool {
        let mut from = self.text.len().saturating_sub(self.hold);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(delta);
        let window = &self.text[from..];
        let hit = self
            .cfg
            .stop_strings
            .iter()
            .filter_map(|s| window.find(s.as_str()).map(|i| (i + s.len(), i)))
            .min();
        match hit {
            Some((_, start)) => {
                self.text.truncate(from + start);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(max: usize, stops: &[&str]) -> StopConfig {
        StopConfig {
            max_tokens: max,
            eos_ids: vec![1],
            stop_strings: stops.iter().map(|s| s.to_string()).collect(),
            ..StopConfig::default()
        }
    }

    #[test]
    fn stop_ids_end_with_stop_and_nothing_but_the_limit_ends_before_min_tokens() {
        let mut out = Output::new(StopConfig {
            stop_ids: vec![7],
            min_tokens: 3,
            ..cfg(10, &["b"])
        });
        assert_eq!(
            out.push(1, Some("a")),
            None,
            "end of sequence before min_tokens"
        );
        assert_eq!(
            out.push(7, Some("b")),
            None,
            "stop id and stop string before it"
        );
        assert_eq!(out.push(7, Some("c")), Some(FinishReason::Stop));
        assert_eq!(out.tokens(), &[1, 7, 7]);
        assert_eq!(out.text(), "ab", "a stop id's text is left out");
        let mut eos = Output::new(StopConfig {
            stop_ids: vec![7],
            ..cfg(10, &[])
        });
        assert_eq!(eos.push(1, None), Some(FinishReason::Eos));
    }

    /// Feeds one piece of text per token (token id = index + 10) until the end.
    fn run(out: &mut Output, pieces: &[&str]) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let done = out.push(i as u32 + 10, Some(p));
            chunks.push(out.take_chunk());
            if done.is_some() {
                return chunks;
            }
        }
        out.finish(FinishReason::Length, None);
        chunks.push(out.take_chunk());
        chunks
    }

    #[test]
    fn stop_string_inside_a_token_cuts_there() {
        let mut out = Output::new(cfg(100, &["\n\n"]));
        let chunks = run(&mut out, &["Hello", " world.\n", "\nNext", " line"]);
        assert_eq!(out.finished(), Some(FinishReason::Stop));
        assert_eq!(out.text(), "Hello world.");
        assert_eq!(out.tokens(), &[10, 11, 12]);
        let streamed: String = chunks.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(streamed, "Hello world.");
        assert!(chunks.iter().all(|c| !c.text.contains('\n')));
    }

    #[test]
    fn eos_and_length() {
        let mut out = Output::new(cfg(3, &[]));
        assert_eq!(out.push(5, Some("a")), None);
        assert_eq!(out.push(1, None), Some(FinishReason::Eos));
        assert_eq!(out.push(6, Some("b")), Some(FinishReason::Eos));
        assert_eq!(out.tokens(), &[5, 1]);
        let mut out = Output::new(cfg(2, &[]));
        out.push(5, Some("a"));
        assert_eq!(out.remaining(), 1);
        assert_eq!(out.push(6, Some("b")), Some(FinishReason::Length));
        assert_eq!(out.take_chunk().text, "ab");
        assert_eq!(
            out.finish(FinishReason::Cancelled, Some("c")),
            FinishReason::Length
        );
        assert_eq!(out.take_chunk().text, "c");
    }

    #[test]
    fn held_back_tail_can_complete_a_stop_string() {
        let mut out = Output::new(cfg(10, &["END"]));
        out.push(5, Some("xxEN"));
        assert_eq!(out.take_chunk().text, "xx");
        assert_eq!(
            out.finish(FinishReason::Length, Some("D!")),
            FinishReason::Stop
        );
        assert_eq!(out.take_chunk().text, "");
        assert_eq!(out.text(), "xx");
    }

    #[test]
    fn multibyte_text_is_released_on_char_boundaries() {
        let mut out = Output::new(cfg(10, &["éé"]));
        out.push(5, Some("aéb"));
        let c = out.take_chunk();
        assert_eq!(c.text, "a");
        out.push(6, Some("é"));
        assert_eq!(out.take_chunk().text, "é");
        assert_eq!(out.finish(FinishReason::Length, None), FinishReason::Length);
        assert_eq!(out.take_chunk().text, "bé");
    }

    proptest! {
        #[test]
        fn streamed_text_is_the_final_text_and_never_shows_a_stop(
            pieces in proptest::collection::vec("[ab\n]{0,3}", 1..30),
            stops in proptest::collection::vec("[ab\n]{1,3}", 0..3),
        ) {
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let piece_refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let mut out = Output::new(cfg(1000, &stop_refs));
            let chunks = run(&mut out, &piece_refs);
            let streamed: String = chunks.iter().map(|c| c.text.as_str()).collect();
            let tokens: Vec<u32> = chunks.iter().flat_map(|c| c.tokens.clone()).collect();
            prop_assert_eq!(&streamed, out.text());
            prop_assert_eq!(&tokens[..], out.tokens());
            let full: String = pieces[..out.tokens().len()].concat();
            prop_assert!(full.starts_with(out.text()));
            for s in &stops {
                prop_assert!(!out.text().contains(s.as_str()));
            }
            if out.finished() == Some(FinishReason::Stop) {
                let rest = &full[out.text().len()..];
                prop_assert!(stops.iter().any(|s| rest.starts_with(s.as_str())));
                let before: String = pieces[..out.tokens().len() - 1].concat();
                prop_assert!(stops.iter().all(|s| !before.contains(s.as_str())));
            } else {
                prop_assert_eq!(out.text(), full);
            }
        }
    }
}
