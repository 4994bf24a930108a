//! Reads a [`GemmaConfig`] from the metadata of a llama.cpp Gemma 3 GGUF file.
//!
//! llama.cpp hard-codes what the file does not carry for `gemma3`: a 5:1 sliding pattern,
//! a local RoPE base of 10 000 and an attention scale of `key_length^-0.5`; we do the same.

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::config::{GemmaConfig, RopeScaling};
use crate::error::{GemmaError, Result};

/// A GGUF header and the file it was read from (for errors).
pub(crate) struct Header<'a> {
    pub(crate) content: &'a Content,
    pub(crate) path: &'a Path,
}

impl Header<'_> {
    fn metadata(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn dims(&self, tensor: &str) -> Option<&[usize]> {
        self.content
            .tensor_infos
            .get(tensor)
            .map(|t| t.shape.dims())
    }
}

struct Meta<'a> {
    src: &'a Header<'a>,
    arch: String,
}

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.src.metadata(&format!("{}.{key}", self.arch))
    }

    fn err(&self, reason: String) -> GemmaError {
        GemmaError::format(self.src.path, reason)
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let v = self
            .get(key)
            .ok_or_else(|| self.err(format!("metadata {}.{key} is missing", self.arch)))?;
        value_usize(v)
            .ok_or_else(|| self.err(format!("metadata {}.{key} is not an integer", self.arch)))
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => value_f64(v)
                .ok_or_else(|| self.err(format!("metadata {}.{key} is not a number", self.arch))),
        }
    }
}

fn value_usize(v: &Value) -> Option<usize> {
    match v {
        Value::U8(x) => Some(*x as usize),
        Value::U16(x) => Some(*x as usize),
        Value::U32(x) => Some(*x as usize),
        Value::U64(x) => usize::try_from(*x).ok(),
        Value::I32(x) => usize::try_from(*x).ok(),
        Value::I64(x) => usize::try_from(*x).ok(),
        _ => None,
    }
}

fn value_f64(v: &Value) -> Option<f64> {
    match v {
        // The shortest decimal that round-trips the f32 (1e-6, not 9.99999997e-7).
        Value::F32(x) => x.to_string().parse().ok(),
        Value::F64(x) => Some(*x),
        other => value_usize(other).map(|x| x as f64),
    }
}

/// Builds and validates the config of a Gemma 3 GGUF file.
pub(crate) fn config_from_gguf(src: &Header<'_>) -> Result<GemmaConfig> {
    let arch = match src.metadata("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(GemmaError::format(
                src.path,
                "metadata general.architecture is missing",
            ))
        }
    };
    if arch != "gemma3" {
        return Err(GemmaError::format(
            src.path,
            format!("architecture {arch:?} is not supported (expected \"gemma3\")"),
        ));
    }
    let m = Meta { src, arch };
    let hidden = m.usize("embedding_length")?;
    let head_dim = m.usize("attention.key_length")?;
    let vocab = match src.dims("token_embd.weight") {
        Some(d) if d.len() == 2 => d[0],
        _ => return Err(GemmaError::MissingTensor("token_embd.weight".into())),
    };
    let rope_scaling = match m.get("rope.scaling.factor").and_then(value_f64) {
        Some(f) if f != 1.0 => Some(RopeScaling {
            rope_type: "linear".into(),
            factor: f,
        }),
        _ => None,
    };
    let meta_u32 = |key: &str, default: u32| {
        src.metadata(key)
            .and_then(value_usize)
            .map_or(default, |x| x as u32)
    };
    let cfg = GemmaConfig {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: m.usize("feed_forward_length")?,
        num_hidden_layers: m.usize("block_count")?,
        num_attention_heads: m.usize("attention.head_count")?,
        num_key_value_heads: m.usize("attention.head_count_kv")?,
        head_dim,
        query_pre_attn_scalar: head_dim as f64,
        rms_norm_eps: m.f64_or("attention.layer_norm_rms_epsilon", 1e-6)?,
        rope_theta: m.f64_or("rope.freq_base", 1_000_000.0)?,
        rope_local_base_freq: m.f64_or("rope.freq_base_swa", 10_000.0)?,
        rope_scaling,
        sliding_window: m.usize("attention.sliding_window")?,
        sliding_window_pattern: 6,
        layer_types: None,
        attn_logit_softcapping: m.get("attn_logit_softcapping").and_then(value_f64),
        final_logit_softcapping: m.get("final_logit_softcapping").and_then(value_f64),
        max_position_embeddings: m.usize("context_length").unwrap_or(32_768),
        tie_word_embeddings: src.dims("output.weight").is_none(),
        hidden_activation: "gelu_pytorch_tanh".into(),
        bos_token_id: meta_u32("tokenizer.ggml.bos_token_id", 2),
        eos_token_id: vec![meta_u32("tokenizer.ggml.eos_token_id", 1)],
    };
    cfg.validate()
        .map_err(|e| GemmaError::format(src.path, e.to_string()))?;
    Ok(cfg)
}
