//! Tests on the real Gemma 3 270M Q4_K_M GGUF (fetched by scripts/fetch-models.sh):
//! golden greedy continuations from llama.cpp, exact rollback and block invariance across
//! the 512-token sliding window, and agreement of the HF export with the GGUF path.

mod common;

use std::sync::OnceLock;

use common::*;
use serde::Deserialize;
use tandem_core::argmax;
use tandem_gemma::{ForwardOptions, Gemma3, KvCache, LogitsMode};

fn model() -> &'static Gemma3 {
    static M: OnceLock<Gemma3> = OnceLock::new();
    M.get_or_init(|| Gemma3::load(&real_gguf()).expect("load the real GGUF"))
}

fn forward(m: &Gemma3, tokens: &[u32], cache: &mut KvCache, mode: LogitsMode) -> Vec<f32> {
    let pos = cache.len();
    let opts = ForwardOptions { logits: mode, taps: vec![] };
    let out = m.forward(tokens, pos, cache, &opts).expect("forward");
    out.logits.map_or_else(Vec::new, |l| l.flatten_all().expect("flat").to_vec1().expect("vec"))
}

fn greedy(m: &Gemma3, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut cache = m.new_cache(prompt.len() + n);
    let mut logits = forward(m, prompt, &mut cache, LogitsMode::Last);
    let first = logits.clone();
    let mut out = Vec::new();
    while out.len() < n {
        let t = argmax(&logits);
        out.push(t);
        if out.len() < n {
            logits = forward(m, &[t], &mut cache, LogitsMode::Last);
        }
    }
    (out, first)
}

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    /// llama.cpp's top-1 minus top-2 logit at each generated step.
    step_margins: Vec<f32>,
    first_logits_top: Vec<(u32, f32)>,
}

/// Largest |ours - llama.cpp| allowed on the top-32 first-position logits. Both quantize
/// activations to 8 bits per block before the quantized matmuls; what remains is summation
/// order in attention, norms and RoPE.
const FIRST_LOGITS_TOL: f32 = 0.25;

/// A reference step whose top-2 margin is below this is a near-tie: two correct
/// implementations may pick either token, so the comparison stops after it.
const NEAR_TIE: f32 = 0.05;

#[test]
fn greedy_matches_llama_cpp_golden() {
    let text = include_str!("fixtures/gemma3_270m_llamacpp.json");
    let golden: Golden = serde_json::from_str(text).expect("fixture");
    let mut long_matches = 0;
    for case in &golden.cases {
        let n = case.generated_ids.len();
        let comparable = case.step_margins.iter().position(|m| *m < NEAR_TIE).map_or(n, |i| i);
        let (ours, first) = greedy(model(), &case.prompt_ids, comparable.max(1));
        assert_eq!(
            ours[..comparable],
            case.generated_ids[..comparable],
            "{}: greedy continuation differs from llama.cpp",
            case.name
        );
        if comparable >= 32 {
            long_matches += 1;
        }
        let worst = case
            .first_logits_top
            .iter()
            .map(|(id, l)| (first[*id as usize] - l).abs())
            .fold(0.0, f32::max);
        assert!(worst < FIRST_LOGITS_TOL, "{}: first-position logits differ by {worst}", case.name);
    }
    assert!(long_matches >= 5, "only {long_matches} prompts matched over >= 32 tokens");
}

fn tandem_tokenizer_ids(text: &str) -> Vec<u32> {
    let path = models_dir().join("gemma-3-tokenizer/tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&path).expect("tokenizer");
    let mut ids = vec![2];
    ids.extend(tok.encode(text, false).expect("encode").get_ids());
    ids
}

fn context(n: usize) -> Vec<u32> {
    let mut rng = Lcg::new(42);
    let mut ids = vec![2];
    ids.extend(rng.tokens(n - 1, 20_000).into_iter().map(|t| t + 100));
    ids
}

/// forward(prefix + X), truncate, forward(Y) == forward(prefix + Y) bit for bit for blocks of
/// 1..=16, with the blocks straddling position 512 (the sliding window).
#[test]
fn rollback_is_exact_across_the_sliding_window() {
    let m = model();
    let prefix_len = 505;
    let ids = context(prefix_len + 32);
    let mut base = m.new_cache(prefix_len + 32);
    forward(m, &ids[..prefix_len], &mut base, LogitsMode::None);
    for b in 1..=16 {
        let x = &ids[prefix_len + 16..prefix_len + 16 + b];
        let y = &ids[prefix_len..prefix_len + b];
        let mut fresh = base.clone();
        let want = forward(m, y, &mut fresh, LogitsMode::All);
        let mut rolled = base.clone();
        forward(m, x, &mut rolled, LogitsMode::None);
        rolled.truncate(prefix_len).expect("truncate");
        let got = forward(m, y, &mut rolled, LogitsMode::All);
        assert_eq!(bits(&got), bits(&want), "block {b}");
    }
}

/// Logits of blocks of 1..=16 tokens equal one-token-at-a-time decoding, bit for bit, over
/// 300 positions crossing the 512-token sliding window.
#[test]
fn block_forward_equals_single_steps_bitwise() {
    let m = model();
    let (start, end) = (300, 600);
    let ids = context(end);
    let mut base = m.new_cache(end);
    forward(m, &ids[..start], &mut base, LogitsMode::None);
    let mut single = base.clone();
    let want: Vec<f32> = (start..end)
        .flat_map(|i| forward(m, &ids[i..i + 1], &mut single, LogitsMode::All))
        .collect();
    let mut blocked = base;
    let mut got = Vec::with_capacity(want.len());
    let (mut pos, mut b) = (start, 1);
    while pos < end {
        let len = b.min(end - pos);
        got.extend(forward(m, &ids[pos..pos + len], &mut blocked, LogitsMode::All));
        pos += len;
        b = b % 16 + 1;
    }
    let vocab = m.config().vocab_size;
    for (i, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        assert_eq!(bits(g), bits(w), "position {}", start + i);
    }
}

/// The GGUF exported to the HF layout (f32) and loaded through the safetensors path gives
/// the same greedy continuation and close logits (the GGUF path quantizes activations to
/// 8 bits; the f32 path does not).
#[test]
fn hf_export_agrees_with_gguf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    tandem_gemma::export_hf(&real_gguf(), tmp.path()).expect("export");
    let hf = Gemma3::load(tmp.path()).expect("load export");
    assert_eq!(hf.config(), model().config());
    let prompt = tandem_tokenizer_ids("The quick brown fox jumps over the lazy dog. Then it");
    let (a, la) = greedy(model(), &prompt, 24);
    let (b, lb) = greedy(&hf, &prompt, 24);
    assert_eq!(a, b);
    let diff = max_abs_diff(&la, &lb);
    assert!(diff < 0.5, "first-position logits differ by {diff}");
}
