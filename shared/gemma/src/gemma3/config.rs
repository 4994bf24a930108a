//! Gemma 3 text configuration: parsed from an HF `config.json` or from GGUF metadata,
//! validated once, then shared read-only by the model and its KV caches.

use serde::Deserialize;

use crate::error::{GemmaError, Result};

/// RoPE frequency scaling of the full-attention layers (Gemma 3 4B+ use `linear`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RopeScaling {
    /// Only `linear` is defined for Gemma 3.
    #[serde(alias = "type")]
    pub rope_type: String,
    /// Positions are divided by this factor.
    pub factor: f64,
}

/// Hyper-parameters of a Gemma 3 text decoder (the fields of transformers' `Gemma3TextConfig`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GemmaConfig {
    /// Vocabulary size (rows of the embedding / LM head).
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Attention scores are scaled by `query_pre_attn_scalar^-0.5`.
    pub query_pre_attn_scalar: f64,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base of full-attention layers.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// RoPE base of sliding-window layers.
    #[serde(default = "default_rope_local")]
    pub rope_local_base_freq: f64,
    /// RoPE scaling of full-attention layers.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Keys a sliding-window query sees, itself included.
    pub sliding_window: usize,
    /// Every `sliding_window_pattern`-th layer is a full-attention layer.
    #[serde(default = "default_pattern")]
    pub sliding_window_pattern: usize,
    /// Explicit per-layer types (`sliding_attention` / `full_attention`); overrides the pattern.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// `tanh` soft-capping of attention scores, when set.
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    /// `tanh` soft-capping of the final logits, when set.
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    /// Longest sequence the model was trained for.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head is the embedding matrix.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Activation of the FFN; Gemma uses `gelu_pytorch_tanh`.
    #[serde(default = "default_act", alias = "hidden_act")]
    pub hidden_activation: String,
    /// Beginning-of-sequence token id.
    #[serde(default = "default_bos")]
    pub bos_token_id: u32,
    /// End-of-sequence token ids.
    #[serde(default = "default_eos", deserialize_with = "one_or_many")]
    pub eos_token_id: Vec<u32>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_rope_theta() -> f64 {
    1_000_000.0
}
fn default_rope_local() -> f64 {
    10_000.0
}
fn default_pattern() -> usize {
    6
}
fn default_max_pos() -> usize {
    32_768
}
fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}
fn default_bos() -> u32 {
    2
}
fn default_eos() -> Vec<u32> {
    vec![1]
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(x) => vec![x],
        OneOrMany::Many(v) => v,
    })
}

impl GemmaConfig {
    /// Parses an HF `config.json` (a bare text config or one nesting it under `text_config`).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| GemmaError::Config(e.to_string()))?;
        let value = match value.get("text_config") {
            Some(inner) if inner.is_object() => inner.clone(),
            _ => value,
        };
        let cfg: Self =
            serde_json::from_value(value).map_err(|e| GemmaError::Config(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the invariants the forward relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(GemmaError::Config(msg));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_hidden_layers == 0 {
            return bad("vocab_size, hidden_size and num_hidden_layers must be positive".into());
        }
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 || self.head_dim == 0 {
            return bad("head counts and head_dim must be positive".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.sliding_window == 0 || self.sliding_window_pattern == 0 {
            return bad("sliding_window and sliding_window_pattern must be positive".into());
        }
        if self.query_pre_attn_scalar <= 0.0 || self.rms_norm_eps <= 0.0 {
            return bad("query_pre_attn_scalar and rms_norm_eps must be positive".into());
        }
        if !matches!(
            self.hidden_activation.as_str(),
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu"
        ) {
            return bad(format!("unsupported activation {}", self.hidden_activation));
        }
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers {
                return bad(format!(
                    "layer_types has {} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                ));
            }
            if let Some(t) = types
                .iter()
                .find(|t| *t != "sliding_attention" && *t != "full_attention")
            {
                return bad(format!("unknown layer type {t}"));
            }
        }
        if let Some(s) = &self.rope_scaling {
            if s.rope_type != "linear" || s.factor <= 0.0 {
                return bad(format!("unsupported rope_scaling {s:?}"));
            }
        }
        Ok(())
    }

    /// Whether layer `layer` attends through the sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        match &self.layer_types {
            Some(types) => types[layer] == "sliding_attention",
            None => !(layer + 1).is_multiple_of(self.sliding_window_pattern),
        }
    }

    /// Width of the key (or value) row of one position: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Width of the query row of one position: `heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }
}
