//! Prompts from a text corpus: files and folders walked in sorted order, text files kept by
//! extension (HTML with its tags crudely stripped), each file assigned to the held-out split
//! by a hash of its path (so a held-out file never trains), documents shuffled by seed and
//! cut into prompts of a fixed number of tokens.
//!
//! A `.jsonl` file holds whole prompts, one JSON object `{"text": "..."}` a line (a question
//! in a chat turn, an instruction): each line is a document of its own, split by a hash of
//! `path#line`, and becomes one prompt that ends where its text ends (the start is cut when
//! it is longer than the prompt length), so the target continues exactly where a user's
//! request stops.

use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

use crate::error::{Result, TrainError};

/// Extensions of the files a corpus reads.
pub const TEXT_EXTENSIONS: [&str; 7] = ["md", "txt", "rs", "py", "html", "htm", "jsonl"];

/// How prompts are cut from a corpus.
#[derive(Debug, Clone)]
pub struct CorpusConfig {
    /// Tokens per prompt, the BOS included.
    pub prompt_tokens: usize,
    /// Token that starts every prompt (Gemma's `<bos>`), if any.
    pub bos: Option<u32>,
    /// Training prompts wanted (none: only held-out prompts, as a benchmark wants them).
    pub train_prompts: usize,
    /// Held-out prompts wanted.
    pub held_out_prompts: usize,
    /// Share of files, in percent, that are held out.
    pub held_out_percent: u32,
    /// Most prompts taken from one file (diversity).
    pub prompts_per_file: usize,
    /// Multipliers of `prompts_per_file` for the documents under a path (the last that
    /// holds a document wins): a kind of text weighs more in the mix without a corpus of
    /// its own.
    pub weights: Vec<(PathBuf, f64)>,
    /// Seed of the shuffles.
    pub seed: u64,
}

impl CorpusConfig {
    /// Most prompts taken from `path`: `prompts_per_file` times its weight, at least 1.
    pub fn room(&self, path: &Path) -> usize {
        let weight = (self.weights.iter().rev())
            .find(|(under, _)| path.starts_with(under))
            .map_or(1.0, |(_, w)| *w);
        ((self.prompts_per_file.max(1) as f64 * weight).round() as usize).max(1)
    }
}

/// Training and held-out prompts (token ids).
#[derive(Debug, Clone, Default)]
pub struct Prompts {
    /// Prompts the trainer learns from.
    pub train: Vec<Vec<u32>>,
    /// Prompts from held-out files only.
    pub held_out: Vec<Vec<u32>>,
}

/// Every text file under `paths` (files are taken as they are, folders walked), sorted.
pub fn text_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        walk(p, &mut out)?;
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn walk(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| TrainError::io(path, e))?;
    if meta.is_file() {
        if is_text(path) {
            out.push(path.to_path_buf());
        }
        return Ok(());
    }
    for entry in std::fs::read_dir(path).map_err(|e| TrainError::io(path, e))? {
        let entry = entry.map_err(|e| TrainError::io(path, e))?;
        let child = entry.path();
        let kind = entry.file_type().map_err(|e| TrainError::io(&child, e))?;
        if kind.is_dir() || (kind.is_file() && is_text(&child)) {
            walk(&child, out)?;
        }
    }
    Ok(())
}

fn is_text(path: &Path) -> bool {
    extension_in(path, &TEXT_EXTENSIONS)
}

/// Whether `path`'s extension is one of `names` (lowercase), in any case.
fn extension_in(path: &Path, names: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| names.contains(&e.to_ascii_lowercase().as_str()))
}

/// Whether `path` belongs to the held-out split: FNV-1a of its text, modulo 100, below
/// `percent`. Stable across runs and machines for the same path text.
pub fn is_held_out(path: &Path, percent: u32) -> bool {
    (fnv1a(path.to_string_lossy().bytes()) % 100) < u64::from(percent)
}

/// The 64-bit FNV-1a hash of `bytes`.
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The readable text of a file: HTML loses its tags, scripts and styles; other files are
/// returned as they are. Invalid UTF-8 is replaced.
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let html = extension_in(path, &["html", "htm"]);
    Ok(if html { strip_html(&text) } else { text })
}

/// Crude HTML to text: drops `<script>`/`<style>` bodies and every tag, decodes the
/// common entities and squeezes runs of blank lines.
pub fn strip_html(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let lower: String = tag.chars().take(8).collect::<String>().to_ascii_lowercase();
        let skip_to = ["script", "style"]
            .iter()
            .find(|t| lower.starts_with(&format!("<{t}")))
            .and_then(|t| tag.find(&format!("</{t}>")).map(|i| i + t.len() + 3));
        let end = skip_to.or_else(|| tag.find('>').map(|i| i + 1));
        match end {
            Some(e) => rest = &tag[e..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    let decoded = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    let mut squeezed = String::with_capacity(decoded.len());
    let mut blank = 0;
    for line in decoded.lines() {
        blank = if line.trim().is_empty() { blank + 1 } else { 0 };
        if blank <= 1 {
            squeezed.push_str(line.trim_end());
            squeezed.push('\n');
        }
    }
    squeezed
}

/// Cuts `tokens` into at most `max` non-overlapping prompts of exactly `n` tokens, each
/// starting with `bos` when given.
pub fn chunk(tokens: &[u32], n: usize, bos: Option<u32>, max: usize) -> Vec<Vec<u32>> {
    let body = n.saturating_sub(usize::from(bos.is_some())).max(1);
    tokens
        .chunks_exact(body)
        .take(max)
        .map(|c| bos.into_iter().chain(c.iter().copied()).collect())
        .collect()
}

/// A unit of a corpus: a text file, cut into prompts, or one line of a `.jsonl` file, taken
/// whole.
#[derive(Debug, Clone)]
enum Doc {
    File(PathBuf),
    Line {
        path: PathBuf,
        line: usize,
        text: String,
    },
}

impl Doc {
    fn is_held_out(&self, percent: u32) -> bool {
        match self {
            Doc::File(p) => is_held_out(p, percent),
            Doc::Line { path, line, .. } => {
                is_held_out(Path::new(&format!("{}#{line}", path.display())), percent)
            }
        }
    }

    fn path(&self) -> &Path {
        match self {
            Doc::File(p) | Doc::Line { path: p, .. } => p,
        }
    }
}

/// The prompt lines of a `.jsonl` file (blank lines skipped).
pub fn jsonl_prompts(path: &Path) -> Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Line {
        text: String,
    }
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Line>(l)
                .map(|x| x.text)
                .map_err(|e| TrainError::Invalid(format!("{}:{}: {e}", path.display(), i + 1)))
        })
        .collect()
}

/// Every document under `paths`: text files, and the lines of `.jsonl` files.
fn documents(paths: &[PathBuf]) -> Result<Vec<Doc>> {
    let mut docs = Vec::new();
    for file in text_files(paths)? {
        if !extension_in(&file, &["jsonl"]) {
            docs.push(Doc::File(file));
            continue;
        }
        let lines = jsonl_prompts(&file)?;
        docs.extend(lines.into_iter().enumerate().map(|(line, text)| Doc::Line {
            path: file.clone(),
            line,
            text,
        }));
    }
    Ok(docs)
}

/// The prompts of one document: a file's cut by [`chunk`], a prompt line's last
/// `n - 1` tokens after `bos`.
fn doc_prompts<E>(doc: &Doc, cfg: &CorpusConfig, room: usize, encode: &E) -> Result<Vec<Vec<u32>>>
where
    E: Fn(&str) -> std::result::Result<Vec<u32>, String> + Sync,
{
    let tokenize = |text: &str| {
        encode(text).map_err(|reason| TrainError::Tokenize {
            path: doc.path().to_path_buf(),
            reason,
        })
    };
    match doc {
        Doc::File(path) => Ok(chunk(
            &tokenize(&read_text(path)?)?,
            cfg.prompt_tokens,
            cfg.bos,
            room,
        )),
        Doc::Line { text, .. } => {
            let tokens = tokenize(text)?;
            let body = cfg.prompt_tokens - usize::from(cfg.bos.is_some());
            let tail = &tokens[tokens.len().saturating_sub(body)..];
            Ok(match tail.is_empty() {
                true => Vec::new(),
                false => vec![cfg.bos.into_iter().chain(tail.iter().copied()).collect()],
            })
        }
    }
}

/// Training and held-out prompts from the documents under `paths`. `encode` tokenizes one
/// document without a BOS (`cfg.bos` starts every prompt). Documents are visited in a
/// seeded shuffle until both splits are full; prompts are then shuffled by the same seed.
pub fn prompts<E>(paths: &[PathBuf], cfg: &CorpusConfig, encode: E) -> Result<Prompts>
where
    E: Fn(&str) -> std::result::Result<Vec<u32>, String> + Sync,
{
    if cfg.prompt_tokens < 2 || cfg.train_prompts + cfg.held_out_prompts == 0 {
        return Err(TrainError::Invalid(
            "prompts need at least 2 tokens, and some prompts must be wanted".into(),
        ));
    }
    let mut docs = documents(paths)?;
    let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed);
    docs.shuffle(&mut rng);
    let mut out = Prompts::default();
    let full = |o: &Prompts| {
        o.train.len() >= cfg.train_prompts && o.held_out.len() >= cfg.held_out_prompts
    };
    // Documents are read and tokenized in parallel, a chunk at a time, and taken in order.
    for batch in docs.chunks(64) {
        if full(&out) {
            break;
        }
        let cut: Vec<(bool, usize, Vec<Vec<u32>>)> = batch
            .par_iter()
            .map(|doc| {
                let held = doc.is_held_out(cfg.held_out_percent);
                let room = cfg.room(doc.path());
                Ok((held, room, doc_prompts(doc, cfg, room, &encode)?))
            })
            .collect::<Result<_>>()?;
        for (held, room, prompts) in cut {
            let (split, want) = match held {
                true => (&mut out.held_out, cfg.held_out_prompts),
                false => (&mut out.train, cfg.train_prompts),
            };
            let take = want.saturating_sub(split.len()).min(room);
            split.extend(prompts.into_iter().take(take));
        }
    }
    if out.train.is_empty() && cfg.train_prompts > 0 {
        return Err(TrainError::Invalid(format!(
            "no training prompt of {} tokens in the corpus",
            cfg.prompt_tokens
        )));
    }
    out.train.shuffle(&mut rng);
    out.held_out.shuffle(&mut rng);
    Ok(out)
}
