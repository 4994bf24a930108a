//! Shared test helpers: the tiny random Gemma 3 checkpoints of `tandem_gemma::testing`
//! written as GGUF, and forward and greedy runs of a model.
#![allow(dead_code)]

use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use tandem_gemma::testing::random_weights;
use tandem_gemma::{ForwardOptions, Gemma3, GemmaConfig, KvCache, LogitsMode};

pub mod gemma4;

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

/// Writes the same random checkpoint as `tandem_gemma::testing::write_hf` as a llama.cpp-style GGUF file.
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
