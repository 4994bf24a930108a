//! Tiny random Gemma 3 checkpoints: agreement with candle-transformers' gemma3.rs, HF vs GGUF
//! loading, rollback, block invariance, and clear errors on bad input.

mod common;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use common::*;
use proptest::prelude::*;
use tandem_gemma::testing::{tiny_config, write_hf};
use tandem_gemma::{ForwardOptions, Gemma3, GemmaError, LogitsMode};
use tandem_testkit::{bits, max_abs_diff, Lcg};

fn tiny_hf(cfg: &tandem_gemma::GemmaConfig) -> (tempfile::TempDir, Gemma3) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), cfg, 11);
    let model = Gemma3::load(dir.path()).expect("load hf");
    (dir, model)
}

#[test]
fn matches_candle_transformers_gemma3_over_blocks() {
    // candle-transformers' KV cache needs contiguous value rows, which holds with a single
    // KV head (as in the real 270M); its sliding mask differs from HF's, so the window is
    // set beyond the sequence.
    let mut cfg = tiny_config();
    cfg.sliding_window = 64;
    cfg.num_key_value_heads = 1;
    let (dir, ours) = tiny_hf(&cfg);
    let ct_cfg = candle_transformers::models::gemma3::Config {
        attention_bias: false,
        head_dim: cfg.head_dim,
        hidden_activation: candle_nn::Activation::GeluPytorchTanh,
        hidden_size: cfg.hidden_size,
        intermediate_size: cfg.intermediate_size,
        num_attention_heads: cfg.num_attention_heads,
        num_hidden_layers: cfg.num_hidden_layers,
        num_key_value_heads: cfg.num_key_value_heads,
        rms_norm_eps: cfg.rms_norm_eps,
        rope_theta: cfg.rope_theta,
        rope_local_base_freq: cfg.rope_local_base_freq,
        vocab_size: cfg.vocab_size,
        final_logit_softcapping: None,
        attn_logit_softcapping: None,
        query_pre_attn_scalar: cfg.head_dim,
        sliding_window: cfg.sliding_window,
        sliding_window_pattern: cfg.sliding_window_pattern,
        max_position_embeddings: 512,
    };
    let st = dir.path().join("model.safetensors");
    // SAFETY: the file was just written by this test and is not modified while mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[st], DType::F32, &Device::Cpu) }
        .expect("vb");
    let mut reference =
        candle_transformers::models::gemma3::Model::new(false, &ct_cfg, vb).expect("ct model");
    let tokens = Lcg::new(5).tokens(19, cfg.vocab_size);
    let mut cache = ours.new_cache(64);
    let mut pos = 0;
    for len in [7usize, 3, 1, 5, 2, 1] {
        let block = &tokens[pos..pos + len];
        let got = forward(&ours, block, &mut cache, LogitsMode::Last);
        let input = Tensor::new(block, &Device::Cpu)
            .expect("t")
            .unsqueeze(0)
            .expect("u");
        let want: Vec<f32> = reference
            .forward(&input, pos)
            .expect("ct forward")
            .flatten_all()
            .expect("flat")
            .to_vec1()
            .expect("vec");
        let diff = max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "block at {pos}: max |diff| {diff}");
        pos += len;
    }
}

#[test]
fn hf_and_gguf_paths_agree() {
    let cfg = tiny_config();
    let (_dir, hf) = tiny_hf(&cfg);
    let tokens = Lcg::new(9).tokens(12, cfg.vocab_size);
    let mut c = hf.new_cache(64);
    let want = forward(&hf, &tokens, &mut c, LogitsMode::All);
    let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
    // F32 GGUF tensors run the very same kernels as the safetensors path: exact. Q8_0 adds
    // 8-bit weight and activation rounding (~0.4% per matmul over 6 layers): 3% of the
    // largest logit.
    for (dtype, tol) in [(GgmlDType::F32, 0.0f32), (GgmlDType::Q8_0, 0.03 * scale)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("tiny.gguf");
        write_gguf(
            &path,
            &GgufSpec {
                cfg: &cfg,
                seed: 11,
                matrix_type: dtype,
                arch: "gemma3",
                skip: &[],
            },
        );
        let gguf = Gemma3::load(&path).expect("load gguf");
        assert_eq!(gguf.config(), hf.config(), "configs differ for {dtype:?}");
        let mut c = gguf.new_cache(64);
        let got = forward(&gguf, &tokens, &mut c, LogitsMode::All);
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff <= tol,
            "{dtype:?}: max |diff| {diff} > {tol} (largest logit {scale})"
        );
    }
}

fn tiny_model() -> &'static (tempfile::TempDir, Gemma3) {
    static M: std::sync::OnceLock<(tempfile::TempDir, Gemma3)> = std::sync::OnceLock::new();
    M.get_or_init(|| tiny_hf(&tiny_config()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// forward(prefix + X), truncate to prefix, forward(Y) == forward(prefix + Y), bit for bit,
    /// across the sliding window (6) of the tiny model.
    #[test]
    fn rollback_equals_fresh(prefix_len in 1usize..20, x_len in 1usize..16, y_len in 1usize..16, seed in 0u64..1000) {
        let model = &tiny_model().1;
        let mut rng = Lcg::new(seed);
        let prefix = rng.tokens(prefix_len, 96);
        let (x, y) = (rng.tokens(x_len, 96), rng.tokens(y_len, 96));
        let mut rolled = model.new_cache(64);
        forward(model, &prefix, &mut rolled, LogitsMode::None);
        forward(model, &x, &mut rolled, LogitsMode::None);
        rolled.truncate(prefix_len).expect("truncate");
        let got = forward(model, &y, &mut rolled, LogitsMode::All);
        let mut fresh = model.new_cache(64);
        let mut all = prefix.clone();
        all.extend_from_slice(&y);
        let want = forward(model, &all, &mut fresh, LogitsMode::All);
        prop_assert_eq!(bits(&got), bits(&want[prefix_len * 96..]));
        prop_assert_eq!(rolled.len(), fresh.len());
    }

    /// Any split of a sequence into blocks gives the logits of one-token-at-a-time decoding.
    #[test]
    fn blocks_equal_single_steps(sizes in proptest::collection::vec(1usize..17, 1..6), seed in 0u64..1000) {
        let model = &tiny_model().1;
        let total: usize = sizes.iter().sum();
        let tokens = Lcg::new(seed).tokens(total, 96);
        let mut single = model.new_cache(128);
        let mut want = Vec::new();
        for t in &tokens {
            want.extend(forward(model, &[*t], &mut single, LogitsMode::All));
        }
        let mut blocked = model.new_cache(128);
        let mut got = Vec::new();
        let mut pos = 0;
        for s in sizes {
            got.extend(forward(model, &tokens[pos..pos + s], &mut blocked, LogitsMode::All));
            pos += s;
        }
        prop_assert_eq!(bits(&got), bits(&want));
    }
}

#[test]
fn taps_are_layer_outputs_and_final_norm() {
    let model = &tiny_model().1;
    let tokens = Lcg::new(3).tokens(5, 96);
    let mut cache = model.new_cache(16);
    let opts = ForwardOptions {
        logits: LogitsMode::Last,
        taps: vec![0, 5, 6],
    };
    let out = model
        .forward(&tokens, 0, &mut cache, &opts)
        .expect("forward");
    assert_eq!(out.taps.len(), 3);
    for t in &out.taps {
        assert_eq!(t.dims(), &[5, 32]);
    }
    let last: Vec<f32> = out
        .last_hidden
        .flatten_all()
        .expect("f")
        .to_vec1()
        .expect("v");
    let tap6: Vec<f32> = out.taps[2].flatten_all().expect("f").to_vec1().expect("v");
    assert_eq!(bits(&last), bits(&tap6));
    let tap0: Vec<f32> = out.taps[0].flatten_all().expect("f").to_vec1().expect("v");
    assert_ne!(bits(&tap0), bits(&tap6));
    assert_eq!(out.logits.expect("logits").dims(), &[1, 96]);
}

#[test]
fn kv_cache_accounts_bytes_and_rejects_misuse() {
    let model = &tiny_model().1;
    let mut cache = model.new_cache(10);
    assert_eq!(cache.bytes_per_position(), 2 * 6 * 16 * 4);
    forward(model, &[1, 2, 3], &mut cache, LogitsMode::None);
    assert_eq!(cache.used_bytes(), 3 * cache.bytes_per_position());
    assert!(cache.allocated_bytes() >= cache.used_bytes());
    let opts = ForwardOptions::default();
    let err = model
        .forward(&[1], 2, &mut cache, &opts)
        .expect_err("wrong position");
    assert!(matches!(err, GemmaError::Request(_)), "{err}");
    let err = model
        .forward(&[1; 8], 3, &mut cache, &opts)
        .expect_err("too long");
    assert!(
        matches!(
            err,
            GemmaError::ContextFull {
                needed: 11,
                capacity: 10
            }
        ),
        "{err}"
    );
    let err = model
        .forward(&[96], 3, &mut cache, &opts)
        .expect_err("bad token");
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let err = model.forward(&[], 3, &mut cache, &opts).expect_err("empty");
    assert!(matches!(err, GemmaError::Request(_)));
    let bad_tap = ForwardOptions {
        logits: LogitsMode::None,
        taps: vec![7],
    };
    assert!(model.forward(&[1], 3, &mut cache, &bad_tap).is_err());
    assert_eq!(cache.len(), 3, "failed calls must not change the cache");
    assert!(cache.truncate(4).is_err());
    cache.truncate(1).expect("truncate");
    assert_eq!(cache.len(), 1);
}

fn load_err(path: &std::path::Path) -> String {
    match Gemma3::load(path) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_model_files_give_clear_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = tiny_config();
    let missing = tmp.path().join("nope.gguf");
    assert!(load_err(&missing).contains("cannot read"));

    let garbage = tmp.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").expect("write");
    assert!(
        load_err(&garbage).contains("not a readable GGUF"),
        "{}",
        load_err(&garbage)
    );

    let good = tmp.path().join("good.gguf");
    write_gguf(
        &good,
        &GgufSpec {
            cfg: &cfg,
            seed: 1,
            matrix_type: GgmlDType::Q8_0,
            arch: "gemma3",
            skip: &[],
        },
    );
    let bytes = std::fs::read(&good).expect("read");
    let truncated = tmp.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).expect("write");
    let msg = load_err(&truncated);
    assert!(
        msg.contains("truncated") || msg.contains("past the end"),
        "{msg}"
    );

    let variant = |name: &str, matrix_type, arch, skip| {
        let path = tmp.path().join(name);
        let spec = GgufSpec {
            cfg: &cfg,
            seed: 1,
            matrix_type,
            arch,
            skip,
        };
        write_gguf(&path, &spec);
        load_err(&path)
    };
    let msg = variant("llama.gguf", GgmlDType::F32, "llama", &[]);
    assert!(msg.contains("not supported"), "{msg}");
    let msg = variant("q4_1.gguf", GgmlDType::Q4_1, "gemma3", &[]);
    assert!(msg.contains("unsupported type Q4_1"), "{msg}");
    let msg = variant(
        "holey.gguf",
        GgmlDType::F32,
        "gemma3",
        &["blk.3.ffn_up.weight"],
    );
    assert_eq!(msg, "missing tensor blk.3.ffn_up.weight");
}

#[test]
fn unknown_gguf_type_id_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("t.gguf");
    write_gguf(
        &path,
        &GgufSpec {
            cfg: &tiny_config(),
            seed: 1,
            matrix_type: GgmlDType::F32,
            arch: "gemma3",
            skip: &[],
        },
    );
    let mut bytes = std::fs::read(&path).expect("read");
    // The first tensor info follows the metadata; patch its type id (u32 after name, n_dims,
    // dims) to 99, a type no ggml version defines.
    let name = b"blk.0.attn_k.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor name");
    let dims_at = at + name.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().expect("4")) as usize;
    let type_at = dims_at + 4 + 8 * n_dims;
    bytes[type_at..type_at + 4].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write");
    let msg = load_err(&path);
    assert!(
        msg.contains("unknown dtype") || msg.contains("not a readable GGUF"),
        "{msg}"
    );
}

#[test]
fn hf_config_mismatch_and_missing_files_are_errors() {
    let cfg = tiny_config();
    let tmp = tempfile::tempdir().expect("tempdir");
    write_hf(tmp.path(), &cfg, 2);
    let mut wrong = cfg.clone();
    wrong.intermediate_size = 48;
    std::fs::write(
        tmp.path().join("config.json"),
        tandem_gemma::hf_config_json(&wrong),
    )
    .expect("write");
    let msg = load_err(tmp.path());
    assert!(
        msg.contains("has shape") && msg.contains("mlp.gate_proj"),
        "{msg}"
    );

    std::fs::write(tmp.path().join("config.json"), "{\"hidden_size\": 3").expect("write");
    assert!(load_err(tmp.path()).contains("config.json"));

    std::fs::remove_file(tmp.path().join("model.safetensors")).expect("rm");
    std::fs::write(
        tmp.path().join("config.json"),
        tandem_gemma::hf_config_json(&cfg),
    )
    .expect("write");
    assert!(load_err(tmp.path()).contains("model.safetensors"));
}

#[test]
fn checksum_mismatch_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let p = tmp.path().join("f.bin");
    std::fs::write(&p, b"abc").expect("write");
    let sha_abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    tandem_gemma::verify_sha256(&p, sha_abc).expect("matches");
    let err = tandem_gemma::verify_sha256(&p, &"0".repeat(64)).expect_err("mismatch");
    assert!(matches!(err, GemmaError::Checksum { .. }));
    assert!(err.to_string().contains(sha_abc));
}
