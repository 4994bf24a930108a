//! Tests on the real Gemma 3 270M Q4_K_M GGUF (fetched by scripts/fetch-models.sh): exact
//! rollback and block invariance across the 512-token sliding window, and agreement of the
//! HF export with the GGUF path.

mod common;

use std::sync::OnceLock;

use common::*;
use tandem_gemma::{ForwardOptions, Gemma3, LoadOptions, LogitsMode, Precision, TopRow};
use tandem_kernels::ArgmaxScreen;
use tandem_testkit::{bits, max_abs_diff, real_gguf, real_tokenizer, Lcg};

fn model() -> &'static Gemma3 {
    static M: OnceLock<Gemma3> = OnceLock::new();
    M.get_or_init(|| Gemma3::load(&real_gguf()).expect("load the real GGUF"))
}

fn int8_model() -> Gemma3 {
    let opts = LoadOptions {
        precision: Precision::Int8,
    };
    Gemma3::load_with(&real_gguf(), &opts).expect("load the real GGUF, int8")
}

fn tandem_tokenizer_ids(text: &str) -> Vec<u32> {
    let tok = tokenizers::Tokenizer::from_file(real_tokenizer()).expect("tokenizer");
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
    assert_blocks_equal_single_steps(model());
}

/// The same for the int8 precision (8-bit activations; on a CPU with AMX, the tile kernels
/// for the Q5_0 and Q8_0 weights).
#[test]
fn int8_block_forward_equals_single_steps_bitwise() {
    assert_blocks_equal_single_steps(&int8_model());
}

fn assert_blocks_equal_single_steps(m: &Gemma3) {
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
        got.extend(forward(
            m,
            &ids[pos..pos + len],
            &mut blocked,
            LogitsMode::All,
        ));
        pos += len;
        b = b % 16 + 1;
    }
    let vocab = m.config().vocab_size;
    for (i, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        assert_eq!(bits(g), bits(w), "position {}", start + i);
    }
}

/// Greedy verification's argmaxes ([`LogitsMode::Top`] of 1: the exact head's first maxima
/// through `tandem_kernels::ArgmaxScreen` for blocks of two or more where the CPU runs it,
/// else the full logits) equal the first maxima of the full logits of the same blocks, and
/// top-k verification's rows hold the 40 largest logits bit for bit, for blocks of 1..=16
/// over 240 positions of text and of random tokens (flat and peaked distributions).
#[test]
fn argmax_blocks_equal_the_full_logits_first_maxima() {
    let m = model();
    let text = tandem_tokenizer_ids(
        &"The committee met on Tuesday to discuss the budget for \
        the coming year, and after a long debate about roads, schools and the library, it \
        agreed to "
            .repeat(6),
    );
    for ids in [text, context(240)] {
        let end = ids.len().min(240);
        let mut cache = m.new_cache(end);
        forward(m, &ids[..8], &mut cache, LogitsMode::None);
        let (mut pos, mut b) = (8, 1);
        while pos < end {
            let block = &ids[pos..(pos + b).min(end)];
            let mut full = cache.clone();
            let logits = forward(m, block, &mut full, LogitsMode::All);
            let want: Vec<u32> = logits
                .chunks(m.config().vocab_size)
                .map(tandem_core::argmax)
                .collect();
            let opts = ForwardOptions {
                logits: LogitsMode::Top(1),
                taps: vec![],
            };
            let mut top_cache = cache.clone();
            let out = m.forward(block, pos, &mut cache, &opts).expect("forward");
            let screened = ArgmaxScreen::available() && block.len() > 1;
            assert_eq!(out.top.is_some(), screened);
            assert_eq!(out.logits.is_none(), screened);
            let got: Vec<u32> = match (out.top, out.logits) {
                (Some(top), _) => top.iter().map(TopRow::first_max).collect(),
                (None, Some(l)) => l
                    .flatten_all()
                    .and_then(|l| l.to_vec1::<f32>())
                    .expect("logits")
                    .chunks(m.config().vocab_size)
                    .map(tandem_core::argmax)
                    .collect(),
                (None, None) => panic!("no logits"),
            };
            assert_eq!(got, want, "block of {} at {pos}", block.len());
            let opts = ForwardOptions {
                logits: LogitsMode::Top(40),
                taps: vec![],
            };
            let out = m
                .forward(block, pos, &mut top_cache, &opts)
                .expect("forward");
            if let Some(top) = out.top {
                assert_top_rows(&top, &logits, m.config().vocab_size, 40);
            }
            pos += block.len();
            b = b % 16 + 1;
        }
    }
}

/// Each row of `top` holds the `k` largest of its logits row (ties to the lower id) with
/// their exact bits.
fn assert_top_rows(top: &[TopRow], logits: &[f32], vocab: usize, k: usize) {
    for (row, z) in top.iter().zip(logits.chunks(vocab)) {
        for (&j, &v) in row.ids.iter().zip(&row.values) {
            assert_eq!(v.to_bits(), z[j as usize].to_bits());
        }
        let mut order: Vec<u32> = (0..vocab as u32).collect();
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b))
        });
        for want in &order[..k] {
            assert!(row.ids.binary_search(want).is_ok(), "top id {want} missing");
        }
    }
}

/// The GGUF exported to the HF layout (f32) and loaded through the safetensors path computes
/// what the GGUF path computes in its exact precision: same greedy ids, logits within 1e-3
/// (only the summation order of the dequantized products differs).
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
    assert!(diff < 1e-3, "first-position logits differ by {diff}");
}
