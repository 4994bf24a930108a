//! Golden tests of the real Gemma 3 270M GGUF against independent implementations, with the
//! fixtures and the scripts that made them committed:
//!
//! - `fixtures/gemma3_270m_transformers.json` (scripts/golden/gemma3_transformers.py):
//!   transformers' Gemma 3 in f32 on the GGUF weights dequantized by the `gguf` package;
//! - `fixtures/gemma3_270m_llamacpp.json` (scripts/golden/gemma3_llamacpp.py): llama.cpp
//!   (llama-cpp-python 0.3.16) on the GGUF itself, one token per evaluation.
//!
//! Greedy ids are compared up to the first reference step whose top-2 margin is below a
//! near-tie bound: past a near-tie two correct implementations may legitimately part.

mod common;

use std::sync::OnceLock;

use common::*;
use tandem_gemma::{Gemma3, GoldenFixture, LoadOptions, Precision};
use tandem_testkit::real_gguf;

/// How one model fared on one fixture.
struct Outcome {
    /// Per case: tokens compared (all equal, or the test failed).
    compared: Vec<(String, usize)>,
    /// Largest |ours - reference| over the top-32 first-position logits of all cases.
    worst_logit: f32,
}

fn check(model: &Gemma3, fixture: &str, near_tie: f32) -> Outcome {
    let golden: GoldenFixture = serde_json::from_str(fixture).expect("fixture");
    let mut compared = Vec::new();
    let mut worst_logit = 0f32;
    for case in &golden.cases {
        let n = case.generated_ids.len();
        let upto = case
            .step_margins
            .iter()
            .position(|m| *m < near_tie)
            .unwrap_or(n);
        let (ours, first) = greedy(model, &case.prompt_ids, upto.max(1));
        assert_eq!(
            ours[..upto],
            case.generated_ids[..upto],
            "{}: greedy ids differ from the reference",
            case.name
        );
        let error = case
            .first_logit_error(&first)
            .expect("reference ids in the vocabulary");
        worst_logit = worst_logit.max(error);
        compared.push((case.name.clone(), upto));
    }
    Outcome {
        compared,
        worst_logit,
    }
}

fn gguf() -> &'static Gemma3 {
    static M: OnceLock<Gemma3> = OnceLock::new();
    M.get_or_init(|| Gemma3::load(&real_gguf()).expect("load the real GGUF"))
}

const TRANSFORMERS: &str = include_str!("fixtures/gemma3_270m_transformers.json");
const LLAMA_CPP: &str = include_str!("fixtures/gemma3_270m_llamacpp.json");

/// The default (exact, f32-activation) GGUF path computes what transformers computes in f32:
/// every one of the 48 greedy tokens of all 11 prompts (including a 606-token prompt whose
/// continuation crosses the 512-token sliding window), first logits within 2e-3.
#[test]
fn gguf_matches_transformers() {
    let out = check(gguf(), TRANSFORMERS, 1e-3);
    assert!(
        out.compared.iter().all(|(_, n)| *n == 48),
        "{:?}",
        out.compared
    );
    assert!(
        out.worst_logit < 2e-3,
        "first logits differ by {}",
        out.worst_logit
    );
}

/// The exact path against llama.cpp, whose own arithmetic (f16 KV cache and attention
/// inputs, 8-bit activations) sits 0.2-0.3 logits RMS from exact maths: the greedy ids agree
/// up to every near-tie of margin below 1.0, the top-32 first logits within 1.0.
#[test]
fn gguf_agrees_with_llama_cpp() {
    let out = check(gguf(), LLAMA_CPP, 1.0);
    eprintln!(
        "exact vs llama.cpp: {:?}, worst first logit {}",
        out.compared, out.worst_logit
    );
    assert!(
        out.worst_logit < 1.0,
        "first logits differ by {}",
        out.worst_logit
    );
}

/// The int8 path (llama.cpp-style activations) against llama.cpp: its own 8-bit rounding
/// differs from llama.cpp's in attention and KV precision, so the logit bound is 1.25.
#[test]
fn int8_path_agrees_with_llama_cpp() {
    let opts = LoadOptions {
        precision: Precision::Int8,
    };
    let model = Gemma3::load_with(&real_gguf(), &opts).expect("load int8");
    let out = check(&model, LLAMA_CPP, 1.0);
    eprintln!(
        "int8 vs llama.cpp: {:?}, worst first logit {}",
        out.compared, out.worst_logit
    );
    assert!(
        out.worst_logit < 1.25,
        "first logits differ by {}",
        out.worst_logit
    );
}
