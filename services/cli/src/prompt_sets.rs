//! Evaluation prompt sets, read from a JSON file in one of two shapes: a list of strings
//! (prompt texts without BOS, as committed under drafters/eval/), each encoded with the
//! target tokenizer after a BOS; or a list of token-id lists (as `bench speculative
//! --save-prompts` writes them), used as they are. Prompts are kept whole, up to
//! [`MAX_PROMPT_TOKENS`].

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tandem_tokenizer::GemmaTokenizer;

/// The longest prompt accepted, in tokens (BOS included).
pub const MAX_PROMPT_TOKENS: usize = 2048;

/// The prompts of a file, as written there.
#[derive(Debug, PartialEq)]
enum Prompts {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

/// A prompt file read and checked (a non-empty list of non-empty prompts), not yet encoded.
#[derive(Debug)]
pub struct PromptSet {
    path: PathBuf,
    prompts: Prompts,
}

/// Reads and checks the prompt file at `path`.
pub fn read(path: &Path) -> Result<PromptSet> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(path, &text)
}

/// The first `n` prompts of the file at `path` as token ids, texts encoded by `tok`.
pub fn load(path: &Path, tok: &GemmaTokenizer, n: usize) -> Result<Vec<Vec<u32>>> {
    read(path)?.encode(tok, n)
}

fn parse(path: &Path, text: &str) -> Result<PromptSet> {
    let shape = || {
        format!(
            "{}: expected a JSON list of prompt strings or of token-id lists",
            path.display()
        )
    };
    let value: serde_json::Value = serde_json::from_str(text).with_context(shape)?;
    let prompts = if let Ok(texts) = serde_json::from_value::<Vec<String>>(value.clone()) {
        Prompts::Texts(texts)
    } else {
        Prompts::Ids(serde_json::from_value(value).with_context(shape)?)
    };
    let (count, empty) = match &prompts {
        Prompts::Texts(t) => (t.len(), t.iter().position(|p| p.trim().is_empty())),
        Prompts::Ids(t) => (t.len(), t.iter().position(Vec::is_empty)),
    };
    if count == 0 {
        bail!("{}: the list of prompts is empty", path.display());
    }
    if let Some(i) = empty {
        bail!("{}: prompt {i} is empty", path.display());
    }
    Ok(PromptSet {
        path: path.to_path_buf(),
        prompts,
    })
}

impl PromptSet {
    /// The first `n` prompts as token ids, texts encoded by `tok` after its BOS.
    pub fn encode(&self, tok: &GemmaTokenizer, n: usize) -> Result<Vec<Vec<u32>>> {
        self.tokens(n, tok.bos_id(), |t| Ok(tok.encode(t, false)?))
    }

    /// [`Self::encode`] through any encoder (`encode` never adds the BOS itself).
    fn tokens(
        &self,
        n: usize,
        bos: u32,
        encode: impl Fn(&str) -> Result<Vec<u32>>,
    ) -> Result<Vec<Vec<u32>>> {
        let all = match &self.prompts {
            Prompts::Ids(ids) => ids.iter().take(n).cloned().collect(),
            Prompts::Texts(texts) => texts
                .iter()
                .take(n)
                .map(|t| Ok([vec![bos], encode(t)?].concat()))
                .collect::<Result<Vec<_>>>()?,
        };
        if let Some((i, p)) = all
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() > MAX_PROMPT_TOKENS)
        {
            bail!(
                "{}: prompt {i} has {} tokens, more than {MAX_PROMPT_TOKENS}",
                self.path.display(),
                p.len()
            );
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per byte, offset so no id is the BOS.
    fn bytes(t: &str) -> Result<Vec<u32>> {
        Ok(t.bytes().map(|b| u32::from(b) + 10).collect())
    }

    fn tokens(json: &str, n: usize) -> Result<Vec<Vec<u32>>> {
        parse(Path::new("p.json"), json)?.tokens(n, 2, bytes)
    }

    fn error(json: &str) -> String {
        let e = tokens(json, 10).expect_err("an error");
        let line = format!("{e:#}");
        assert_eq!(line.lines().count(), 1, "{line}");
        line
    }

    #[test]
    fn token_id_lists_are_used_as_they_are() {
        let got = tokens("[[2, 5, 6], [2, 7]]", 10).expect("ids");
        assert_eq!(got, vec![vec![2, 5, 6], vec![2, 7]]);
        assert_eq!(
            tokens("[[2, 5, 6], [2, 7]]", 1).expect("ids"),
            vec![vec![2, 5, 6]]
        );
    }

    #[test]
    fn texts_are_encoded_after_a_bos() {
        let got = tokens(r#"["ab", "c"]"#, 10).expect("texts");
        assert_eq!(got, vec![vec![2, 107, 108], vec![2, 109]]);
        assert_eq!(tokens(r#"["ab", "c"]"#, 1).expect("texts").len(), 1);
    }

    #[test]
    fn bad_files_are_one_clear_line() {
        for (json, needle) in [
            (r#"{"a": 1}"#, "expected a JSON list"),
            ("[1, 2]", "expected a JSON list"),
            (r#"["a", [2]]"#, "expected a JSON list"),
            ("not json", "expected a JSON list"),
            ("[]", "the list of prompts is empty"),
            (r#"["a", "  "]"#, "prompt 1 is empty"),
            ("[[2], []]", "prompt 1 is empty"),
        ] {
            let e = error(json);
            assert!(
                e.starts_with("p.json: ") && e.contains(needle),
                "{json}: {e}"
            );
        }
        let long = format!("[\"{}\"]", "x".repeat(MAX_PROMPT_TOKENS));
        assert!(error(&long).contains("prompt 0 has 2049 tokens, more than 2048"));
    }
}
