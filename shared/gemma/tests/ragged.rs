//! Ragged forwards (several sequences' blocks in one pass, each with its own cache): every
//! segment's logits, top rows, taps and cache equal its own forward bit for bit, on the tiny
//! random model (f32 and quantized GGUF) for any mix of block lengths, positions and logits
//! modes, and on the real Gemma 3 270M across its sliding window; a refused segment changes
//! no cache.

mod common;

use std::sync::OnceLock;

use candle_core::quantized::GgmlDType;
use common::*;
use proptest::prelude::*;
use tandem_gemma::testing::{tiny_config, write_hf};
use tandem_gemma::{ForwardOptions, ForwardOutput, Gemma3, KvCache, LogitsMode, Segment};
use tandem_kernels::first_max;
use tandem_testkit::{bits, real_gguf, Lcg};

/// The tiny model in f32 (HF) and with Q8_0 GGUF weights.
fn tiny_models() -> &'static [(tempfile::TempDir, Gemma3)] {
    static M: OnceLock<Vec<(tempfile::TempDir, Gemma3)>> = OnceLock::new();
    M.get_or_init(|| {
        let cfg = tiny_config();
        let hf = tempfile::tempdir().expect("tempdir");
        write_hf(hf.path(), &cfg, 11);
        let hf_model = Gemma3::load(hf.path()).expect("tiny HF");
        let gguf = tempfile::tempdir().expect("tempdir");
        let path = gguf.path().join("tiny.gguf");
        write_gguf(
            &path,
            &GgufSpec {
                cfg: &cfg,
                seed: 11,
                matrix_type: GgmlDType::Q8_0,
                arch: "gemma3",
                skip: &[],
            },
        );
        let gguf_model = Gemma3::load(&path).expect("tiny GGUF");
        vec![(hf, hf_model), (gguf, gguf_model)]
    })
}

fn tensor_bits(t: &candle_core::Tensor) -> Vec<u32> {
    let v = t.flatten_all().and_then(|t| t.to_vec1::<f32>());
    bits(&v.expect("an f32 tensor"))
}

/// Everything a forward returns, as bits.
#[derive(Debug, PartialEq)]
struct Bits {
    logits: Option<Vec<u32>>,
    top: Option<Vec<(Vec<u32>, Vec<u32>)>>,
    taps: Vec<Vec<u32>>,
    last_hidden: Vec<u32>,
}

fn output_bits(o: &ForwardOutput) -> Bits {
    let top = o.top.as_ref().map(|rows| {
        rows.iter()
            .map(|r| (r.ids.clone(), bits(&r.values)))
            .collect()
    });
    Bits {
        logits: o.logits.as_ref().map(tensor_bits),
        top,
        taps: o.taps.iter().map(tensor_bits).collect(),
        last_hidden: tensor_bits(&o.last_hidden),
    }
}

/// `got` (segment `i` of a ragged forward) equals `want` (its own forward) bit for bit; a
/// one-row greedy segment screened with others may hold top rows where alone it held
/// logits: then its top rows are those logits, bit for bit, with the same first maximum.
fn assert_same_output(m: &Gemma3, got: &ForwardOutput, want: &ForwardOutput, i: usize) {
    let (g, w) = (output_bits(got), output_bits(want));
    assert_eq!(g.taps, w.taps, "segment {i}: taps");
    assert_eq!(
        g.last_hidden, w.last_hidden,
        "segment {i}: final hidden states"
    );
    match (&got.top, &want.top, &want.logits) {
        (Some(top), None, Some(logits)) => {
            assert!(
                got.logits.is_none(),
                "segment {i}: both logits and top rows"
            );
            let vocab = m.config().vocab_size;
            let all = logits.flatten_all().and_then(|t| t.to_vec1::<f32>());
            let all = all.expect("f32 logits");
            assert_eq!(top.len() * vocab, all.len(), "segment {i}: rows");
            for (row, (t, z)) in top.iter().zip(all.chunks(vocab)).enumerate() {
                let at: Vec<f32> = t.ids.iter().map(|id| z[*id as usize]).collect();
                assert_eq!(bits(&t.values), bits(&at), "segment {i} row {row}: values");
                assert_eq!(t.first_max(), first_max(z), "segment {i} row {row}: argmax");
            }
        }
        _ => assert!(g == w, "segment {i} differs from its own forward"),
    }
}

/// One sequence of a ragged test: a context already in its cache and the block to run.
struct Case {
    cache: KvCache,
    block: Vec<u32>,
    opts: ForwardOptions,
}

fn mode(code: usize, k: usize) -> LogitsMode {
    match code % 4 {
        0 => LogitsMode::All,
        1 => LogitsMode::Last,
        2 => LogitsMode::None,
        _ => LogitsMode::Top(k),
    }
}

/// Runs the cases alone and together; asserts equal outputs and caches.
fn assert_ragged_equals_alone(m: &Gemma3, cases: Vec<Case>) {
    let mut alone = Vec::new();
    let mut alone_caches = Vec::new();
    for c in &cases {
        let mut cache = c.cache.clone();
        let out = m
            .forward(&c.block, cache.len(), &mut cache, &c.opts)
            .expect("alone");
        alone.push(out);
        alone_caches.push(cache);
    }
    let mut caches: Vec<KvCache> = cases.iter().map(|c| c.cache.clone()).collect();
    let mut segs: Vec<Segment<'_>> = cases
        .iter()
        .zip(caches.iter_mut())
        .map(|(c, cache)| Segment {
            tokens: &c.block,
            pos: cache.len(),
            cache,
            opts: &c.opts,
        })
        .collect();
    let outs = m.forward_ragged(&mut segs).expect("ragged");
    drop(segs);
    for (i, (out, want)) in outs.iter().zip(&alone).enumerate() {
        assert_same_output(m, out, want, i);
    }
    // The caches hold the same keys and values: one more token gives the same logits.
    let next = ForwardOptions::default();
    for (mut got, mut want) in caches.into_iter().zip(alone_caches) {
        assert_eq!(got.len(), want.len());
        let pos = got.len();
        let a = m.forward(&[5], pos, &mut got, &next).expect("next");
        let b = m.forward(&[5], pos, &mut want, &next).expect("next");
        assert_eq!(output_bits(&a).logits, output_bits(&b).logits);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Up to five sequences with contexts of 0..20 tokens (across the tiny model's sliding
    /// window of 6) and blocks of 1..10 tokens, each with its own logits mode and taps.
    #[test]
    fn ragged_segments_equal_their_own_forwards(
        shapes in proptest::collection::vec((0usize..20, 1usize..10, 0usize..4, 1usize..4), 1..6),
        seed in 0u64..1000,
        which in 0usize..2,
    ) {
        let m = &tiny_models()[which].1;
        let mut rng = Lcg::new(seed);
        let layers = m.config().num_hidden_layers;
        let cases = shapes
            .iter()
            .map(|&(ctx, len, code, k)| {
                let mut cache = m.new_cache(64);
                if ctx > 0 {
                    let c = rng.tokens(ctx, 96);
                    forward(m, &c, &mut cache, LogitsMode::None);
                }
                let taps = vec![code % layers, layers];
                Case { cache, block: rng.tokens(len, 96), opts: ForwardOptions { logits: mode(code, k), taps } }
            })
            .collect();
        assert_ragged_equals_alone(m, cases);
    }
}

/// A segment the model refuses (a token outside the vocabulary, a block that does not start
/// at its cache's end) fails the call and leaves every cache as it was.
#[test]
fn a_refused_segment_changes_no_cache() {
    let m = &tiny_models()[0].1;
    let opts = ForwardOptions::default();
    for bad in [(vec![1u32, 500], 0usize), (vec![1, 2], 3)] {
        let mut good = m.new_cache(32);
        let mut other = m.new_cache(32);
        let mut segs = vec![
            Segment {
                tokens: &[1, 2, 3],
                pos: 0,
                cache: &mut good,
                opts: &opts,
            },
            Segment {
                tokens: &bad.0,
                pos: bad.1,
                cache: &mut other,
                opts: &opts,
            },
        ];
        let err = m.forward_ragged(&mut segs).expect_err("refused");
        assert!(err.to_string().contains("invalid forward request"), "{err}");
        drop(segs);
        assert_eq!((good.len(), other.len()), (0, 0));
        assert_eq!(good.used_bytes(), 0);
    }
}

/// The real 270M: a prefill, a decode step and verify blocks of sequences at different
/// positions (one crossing the 512-token sliding window) in one forward equal their own.
#[test]
fn real_model_ragged_step_equals_separate_forwards() {
    let m = Gemma3::load(&real_gguf()).expect("the real GGUF");
    let mut rng = Lcg::new(7);
    let mut case = |ctx: usize, len: usize, logits| {
        let mut cache = m.new_cache(1024);
        if ctx > 0 {
            forward(&m, &rng.tokens(ctx, 20_000), &mut cache, LogitsMode::None);
        }
        let opts = ForwardOptions {
            logits,
            taps: vec![3, 9, 17],
        };
        Case {
            cache,
            block: rng.tokens(len, 20_000),
            opts,
        }
    };
    let cases = vec![
        case(0, 40, LogitsMode::Last),
        case(30, 1, LogitsMode::All),
        case(508, 9, LogitsMode::Top(1)),
        case(100, 5, LogitsMode::All),
        case(60, 1, LogitsMode::Top(1)),
        case(61, 1, LogitsMode::Top(1)),
        case(62, 3, LogitsMode::Top(40)),
    ];
    assert_ragged_equals_alone(&m, cases);
}
