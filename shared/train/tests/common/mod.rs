//! Test helpers: a tiny random Gemma 3 target in the HF layout (the approach of
//! shared/gemma/tests/common) and a tiny drafter setup over it.
#![allow(dead_code, missing_docs)]

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use tandem_dspark::{Dspark, DsparkConfig};
use tandem_gemma::{hf_config_json, Gemma3, GemmaConfig};
use tandem_train::optim::{AdamWConfig, LrSchedule};
use tandem_train::teacher::{Pool, TeacherConfig};
use tandem_train::TrainConfig;

pub const GAMMA: usize = 4;

pub fn tiny_config() -> GemmaConfig {
    GemmaConfig {
        vocab_size: 96,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 6,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        query_pre_attn_scalar: 8.0,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_local_base_freq: 10_000.0,
        rope_scaling: None,
        sliding_window: 6,
        sliding_window_pattern: 6,
        layer_types: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        max_position_embeddings: 4096,
        tie_word_embeddings: true,
        hidden_activation: "gelu_pytorch_tanh".into(),
        bos_token_id: 2,
        eos_token_id: vec![1],
    }
}

/// Deterministic pseudo-random numbers in [-1, 1).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (((self.next() + 1.0) / 2.0) * vocab as f32) as u32 % vocab as u32)
            .collect()
    }
}

/// Writes a random tiny target (`config.json` + `model.safetensors`) into `dir`.
pub fn write_target(dir: &Path, cfg: &GemmaConfig, seed: u64) {
    let mut rng = Lcg::new(seed);
    let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv, hd) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.head_dim,
    );
    let mut w = HashMap::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f32| {
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.next() * scale).collect();
        w.insert(
            name,
            Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor"),
        );
    };
    put(
        "model.embed_tokens.weight".into(),
        vec![cfg.vocab_size, h],
        1.0,
    );
    put("model.norm.weight".into(), vec![h], 0.3);
    let lin = |fan_in: usize| 1.7 / (fan_in as f32).sqrt();
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        put(format!("{p}.self_attn.q_proj.weight"), vec![q, h], lin(h));
        put(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], lin(h));
        put(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], lin(h));
        put(format!("{p}.self_attn.o_proj.weight"), vec![h, q], lin(q));
        put(format!("{p}.mlp.gate_proj.weight"), vec![f, h], lin(h));
        put(format!("{p}.mlp.up_proj.weight"), vec![f, h], lin(h));
        put(format!("{p}.mlp.down_proj.weight"), vec![h, f], lin(f));
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            put(format!("{p}.{norm}.weight"), vec![h], 0.3);
        }
        put(format!("{p}.self_attn.q_norm.weight"), vec![hd], 0.3);
        put(format!("{p}.self_attn.k_norm.weight"), vec![hd], 0.3);
    }
    std::fs::create_dir_all(dir).expect("mkdir");
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).expect("save");
    std::fs::write(dir.join("config.json"), hf_config_json(cfg)).expect("config");
}

/// A tiny target loaded from a fresh temporary folder.
pub fn tiny_target() -> (tempfile::TempDir, Gemma3) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_target(dir.path(), &tiny_config(), 7);
    let model = Gemma3::load(dir.path()).expect("load tiny target");
    (dir, model)
}

pub fn teacher() -> TeacherConfig {
    TeacherConfig {
        taps: vec![1, 3, 5, 6],
        continuation_tokens: 16,
        keep: 16,
        forced: false,
        batch: 4,
        temperatures: Vec::new(),
        seed: 0,
    }
}

/// Train and held-out pools of random prompts (BOS first).
pub fn pools(train: usize, held_out: usize) -> (Pool, Pool) {
    let mut rng = Lcg::new(11);
    let mut prompt = || {
        let mut p = vec![2];
        p.extend(rng.tokens(7, 96).into_iter().map(|t| t.max(3)));
        p
    };
    let train = (0..train).map(|_| prompt()).collect();
    let held = (0..held_out).map(|_| prompt()).collect();
    (Pool::new(train, teacher()), Pool::new(held, teacher()))
}

/// A tiny drafter over the `vocab` ids.
pub fn drafter(model: &Gemma3, vocab: Vec<u32>, seed: u64) -> Dspark {
    let cfg = DsparkConfig {
        gamma: GAMMA,
        d_draft: 32,
        n_layers: 1,
        n_heads: 4,
        markov_rank: 8,
        ff_mult: 2,
        tap_layers: teacher().taps,
        draft_vocab: Some(vocab),
    };
    Dspark::init(cfg, &model.head(), seed).expect("init drafter")
}

pub fn train_config(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        samples_per_step: 4,
        anchors_per_sample: 4,
        schedule: LrSchedule {
            peak: 3e-3,
            warmup: 3,
            total: steps,
            floor: 0.1,
        },
        adamw: AdamWConfig::default(),
        seed: 5,
        eval_every: 0,
        eval_stride: 1,
        checkpoint_every: 0,
        device: candle_core::Device::Cpu,
    }
}
