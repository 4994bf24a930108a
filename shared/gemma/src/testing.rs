//! Fixtures for tests (the `testing` feature): a tiny Gemma 3 config and random checkpoints
//! of it in the HF layout. Here, not in each crate's tests, so that this crate's tests and
//! the crates built on it (the trainer's) share one copy.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};
use tandem_testkit::Lcg;

use crate::{hf_config_json, GemmaConfig};

/// A tiny config: 6 layers (5 sliding : 1 full, as Gemma 3), GQA 4:2, window 6.
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

/// HF tensor name → (shape, values) of a random checkpoint of `cfg`, drawn from
/// [`Lcg::new`]`(seed)`.
pub fn random_weights(cfg: &GemmaConfig, seed: u64) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut rng = Lcg::new(seed);
    let mut w = BTreeMap::new();
    let (h, f, q, kv, hd) = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.head_dim,
    );
    let mut put = |name: String, shape: Vec<usize>, scale: f32| {
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.next() * scale).collect();
        w.insert(name, (shape, v));
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
    w
}

/// Writes `config.json` + `model.safetensors` of [`random_weights`] into `dir`.
pub fn write_hf(dir: &Path, cfg: &GemmaConfig, seed: u64) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let tensors: HashMap<String, Tensor> = random_weights(cfg, seed)
        .into_iter()
        .map(|(k, (s, v))| (k, Tensor::from_vec(v, s, &Device::Cpu).expect("tensor")))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).expect("save");
    std::fs::write(dir.join("config.json"), hf_config_json(cfg)).expect("config");
}
