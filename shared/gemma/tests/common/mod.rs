//! Shared test helpers: tiny random Gemma 3 checkpoints written in the HF layout and as
//! GGUF, and the location of the real model fetched by scripts/fetch-models.sh.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use tandem_gemma::{hf_config_json, ForwardOptions, Gemma3, GemmaConfig, KvCache, LogitsMode};

pub mod gemma4;

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

/// Deterministic pseudo-random numbers in [-1, 1).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Self(
            seed.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        )
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

/// HF tensor name → (shape, values) of a random checkpoint of `cfg`.
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
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let lin = |fan_in: usize| 1.7 / (fan_in as f32).sqrt();
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

/// Writes `config.json` + `model.safetensors` into `dir`.
pub fn write_hf(dir: &Path, cfg: &GemmaConfig, seed: u64) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let tensors: std::collections::HashMap<String, Tensor> = random_weights(cfg, seed)
        .into_iter()
        .map(|(k, (s, v))| (k, Tensor::from_vec(v, s, &Device::Cpu).expect("tensor")))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).expect("save");
    std::fs::write(dir.join("config.json"), hf_config_json(cfg)).expect("config");
}

fn gguf_name(hf: &str) -> String {
    let map = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
    ];
    if let Some((_, g)) = map.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").expect("layer tensor");
    let (idx, leaf) = rest.split_once('.').expect("layer index");
    let leaf = leaf.strip_suffix(".weight").expect("weight");
    let g = match leaf {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" => "post_attention_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "post_feedforward_layernorm" => "post_ffw_norm",
        other => panic!("unknown leaf {other}"),
    };
    format!("blk.{idx}.{g}.weight")
}

/// Options of [`write_gguf`].
pub struct GgufSpec<'a> {
    pub cfg: &'a GemmaConfig,
    pub seed: u64,
    /// Storage type of 2-D weights.
    pub matrix_type: GgmlDType,
    pub arch: &'a str,
    /// Tensors to leave out.
    pub skip: &'a [&'a str],
}

/// Writes the same random checkpoint as [`write_hf`] as a llama.cpp-style GGUF file.
pub fn write_gguf(path: &Path, spec: &GgufSpec) {
    let cfg = spec.cfg;
    let mut qt: Vec<(String, QTensor)> = Vec::new();
    for (name, (shape, mut v)) in random_weights(cfg, spec.seed) {
        let g = gguf_name(&name);
        if spec.skip.contains(&g.as_str()) {
            continue;
        }
        let dtype = if shape.len() == 2 {
            spec.matrix_type
        } else {
            GgmlDType::F32
        };
        if name.contains("norm") {
            v.iter_mut().for_each(|x| *x += 1.0);
        }
        let t = Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor");
        qt.push((g, QTensor::quantize(&t, dtype).expect("quantize")));
    }
    let a = spec.arch;
    let u = |x: usize| gguf_file::Value::U32(x as u32);
    let meta: Vec<(String, gguf_file::Value)> = vec![
        (
            "general.architecture".into(),
            gguf_file::Value::String(a.into()),
        ),
        (
            format!("{a}.context_length"),
            u(cfg.max_position_embeddings),
        ),
        (format!("{a}.embedding_length"), u(cfg.hidden_size)),
        (format!("{a}.block_count"), u(cfg.num_hidden_layers)),
        (format!("{a}.feed_forward_length"), u(cfg.intermediate_size)),
        (
            format!("{a}.attention.head_count"),
            u(cfg.num_attention_heads),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            u(cfg.num_key_value_heads),
        ),
        (format!("{a}.attention.key_length"), u(cfg.head_dim)),
        (format!("{a}.attention.value_length"), u(cfg.head_dim)),
        (
            format!("{a}.attention.sliding_window"),
            u(cfg.sliding_window),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            gguf_file::Value::F32(cfg.rms_norm_eps as f32),
        ),
        (
            format!("{a}.rope.freq_base"),
            gguf_file::Value::F32(cfg.rope_theta as f32),
        ),
    ];
    let meta_refs: Vec<(&str, &gguf_file::Value)> =
        meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = qt.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).expect("create gguf");
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).expect("write gguf");
}

/// Folder of the fetched real models.
pub fn models_dir() -> PathBuf {
    std::env::var_os("TANDEM_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tandem/models")
        })
}

/// The real Gemma 3 270M GGUF; panics with instructions when it was not fetched.
pub fn real_gguf() -> PathBuf {
    let p = models_dir().join("gemma-3-270m/gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} missing: run scripts/fetch-models.sh first",
        p.display()
    );
    p
}

/// Max |a - b| over two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Bit patterns, for exact comparisons with readable failures.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `tokens` at the end of `cache`; returns the logits (empty for [`LogitsMode::None`]).
pub fn forward(m: &Gemma3, tokens: &[u32], cache: &mut KvCache, mode: LogitsMode) -> Vec<f32> {
    let pos = cache.len();
    let opts = ForwardOptions {
        logits: mode,
        taps: vec![],
    };
    let out = m.forward(tokens, pos, cache, &opts).expect("forward");
    out.logits.map_or_else(Vec::new, |l| {
        l.flatten_all().expect("flat").to_vec1().expect("vec")
    })
}

/// `n` greedy tokens after `prompt`, and the logits of the first of them.
pub fn greedy(m: &Gemma3, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut cache = m.new_cache(prompt.len() + n);
    let mut logits = forward(m, prompt, &mut cache, LogitsMode::Last);
    let first = logits.clone();
    let mut out = Vec::new();
    while out.len() < n {
        let t = tandem_core::argmax(&logits);
        out.push(t);
        if out.len() < n {
            logits = forward(m, &[t], &mut cache, LogitsMode::Last);
        }
    }
    (out, first)
}
