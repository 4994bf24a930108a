//! Gemma 4 text configuration (transformers' `Gemma4TextConfig`, 5.24) and the assistant's
//! (`Gemma4AssistantConfig`), parsed from an HF `config.json` and resolved once into what
//! the forward needs per layer: type, head geometry and where its keys and values live.
//!
//! Both spellings of the full-attention geometry are read: transformers' own
//! `per_layer_config` (what `save_pretrained` writes) and Google's `global_head_dim` /
//! `num_global_key_value_heads` (what the released checkpoints carry).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::{GemmaError, Result};

/// RoPE of one layer type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Base wavelength.
    pub rope_theta: f64,
    /// Share of each head that rotates, proportional RoPE (1 for `default`).
    pub partial_rotary_factor: f64,
}

fn one() -> f64 {
    1.0
}

fn default_eps() -> f64 {
    1e-6
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
struct RawRope {
    rope_type: String,
    rope_theta: f64,
    #[serde(default = "one")]
    partial_rotary_factor: f64,
    #[serde(default = "one")]
    factor: f64,
}

#[derive(Debug, Default, Deserialize)]
struct LayerOverride {
    head_dim: Option<usize>,
    num_key_value_heads: Option<usize>,
}

/// The `config.json` fields this crate reads; unknown fields are ignored.
#[derive(Debug, Deserialize)]
struct RawText {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    per_layer_config: Option<BTreeMap<String, LayerOverride>>,
    #[serde(default)]
    attention_k_eq_v: bool,
    layer_types: Option<Vec<String>>,
    sliding_window: usize,
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    hidden_size_per_layer_input: usize,
    #[serde(default)]
    vocab_size_per_layer_input: usize,
    #[serde(default)]
    num_kv_shared_layers: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_parameters: Option<BTreeMap<String, RawRope>>,
    hidden_activation: String,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    max_position_embeddings: usize,
    #[serde(default)]
    enable_moe_block: bool,
    #[serde(default)]
    use_double_wide_mlp: bool,
    #[serde(default)]
    attention_bias: bool,
    use_bidirectional_attention: Option<String>,
}

/// Geometry of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// Sliding-window (`true`) or full attention.
    pub sliding: bool,
    /// Width of one head.
    pub head_dim: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values are the keys' projection (no `v_proj`; full layers with `attention_k_eq_v`).
    pub k_eq_v: bool,
}

impl LayerSpec {
    /// Floats of one position's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// A validated Gemma 4 text configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Query heads of every layer.
    pub num_attention_heads: usize,
    /// Per layer: type and head geometry.
    pub layers: Vec<LayerSpec>,
    /// Keys a sliding layer's query sees, itself included.
    pub sliding_window: usize,
    /// `cap * tanh(logits / cap)` on the output logits.
    pub final_logit_softcapping: Option<f64>,
    /// Per-layer embedding width (0: none).
    pub hidden_size_per_layer_input: usize,
    /// Rows of the per-layer embedding.
    pub vocab_size_per_layer_input: usize,
    /// The last this many layers reuse the keys and values of an earlier layer.
    pub num_kv_shared_layers: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE of sliding layers.
    pub rope_sliding: RopeParams,
    /// RoPE of full layers.
    pub rope_full: RopeParams,
    /// Whether the output head is the input embedding.
    pub tie_word_embeddings: bool,
    /// Longest sequence.
    pub max_position_embeddings: usize,
}

fn err(reason: impl Into<String>) -> GemmaError {
    GemmaError::Config(reason.into())
}

fn rope(raw: &Option<BTreeMap<String, RawRope>>, kind: &str) -> Result<RopeParams> {
    let (default_theta, default_partial) = match kind {
        "sliding_attention" => (10_000.0, 1.0),
        _ => (1_000_000.0, 0.25),
    };
    let Some(r) = raw.as_ref().and_then(|m| m.get(kind)) else {
        return Ok(RopeParams {
            rope_theta: default_theta,
            partial_rotary_factor: default_partial,
        });
    };
    let proportional = match r.rope_type.as_str() {
        "default" => false,
        "proportional" => true,
        other => return Err(err(format!("{kind}: unsupported rope_type {other:?}"))),
    };
    if r.factor != 1.0 {
        return Err(err(format!(
            "{kind}: RoPE factor {} is not supported",
            r.factor
        )));
    }
    if !(0.0..=1.0).contains(&r.partial_rotary_factor) {
        return Err(err(format!("{kind}: partial_rotary_factor outside [0, 1]")));
    }
    Ok(RopeParams {
        rope_theta: r.rope_theta,
        partial_rotary_factor: if proportional {
            r.partial_rotary_factor
        } else {
            1.0
        },
    })
}

impl RawText {
    fn unsupported(&self) -> Option<&'static str> {
        [
            (self.enable_moe_block, "enable_moe_block"),
            (self.use_double_wide_mlp, "use_double_wide_mlp"),
            (self.attention_bias, "attention_bias"),
            (
                self.use_bidirectional_attention.as_deref() == Some("all"),
                "use_bidirectional_attention = all",
            ),
            (
                self.hidden_activation != "gelu_pytorch_tanh",
                "a hidden_activation other than gelu_pytorch_tanh",
            ),
        ]
        .into_iter()
        .find_map(|(bad, what)| bad.then_some(what))
    }

    fn layer(&self, i: usize, kind: &str) -> Result<LayerSpec> {
        let sliding = match kind {
            "sliding_attention" => true,
            "full_attention" => false,
            other => return Err(err(format!("layer {i}: unknown layer type {other:?}"))),
        };
        let k_eq_v = self.attention_k_eq_v && !sliding;
        let (head_dim, kv_heads) = match &self.per_layer_config {
            Some(map) => {
                let o = map.get(&i.to_string());
                (
                    o.and_then(|o| o.head_dim).unwrap_or(self.head_dim),
                    o.and_then(|o| o.num_key_value_heads)
                        .unwrap_or(self.num_key_value_heads),
                )
            }
            None if sliding => (self.head_dim, self.num_key_value_heads),
            None => (
                self.global_head_dim.unwrap_or(512),
                match (self.attention_k_eq_v, self.num_global_key_value_heads) {
                    (true, Some(n)) => n,
                    _ => self.num_key_value_heads,
                },
            ),
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(err(format!(
                "layer {i}: head_dim {head_dim} must be even and > 0"
            )));
        }
        if kv_heads == 0 || !self.num_attention_heads.is_multiple_of(kv_heads) {
            return Err(err(format!(
                "layer {i}: {} query heads are not a multiple of {kv_heads} key/value heads",
                self.num_attention_heads
            )));
        }
        Ok(LayerSpec {
            sliding,
            head_dim,
            kv_heads,
            k_eq_v,
        })
    }
}

impl Gemma4Config {
    /// Parses a `config.json`: a text config at the top level or under `text_config`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| err(format!("not JSON: {e}")))?;
        let body = value.get("text_config").unwrap_or(&value).clone();
        let raw: RawText = serde_json::from_value(body).map_err(|e| err(e.to_string()))?;
        Self::from_raw(&raw)
    }

    fn from_raw(raw: &RawText) -> Result<Self> {
        if let Some(what) = raw.unsupported() {
            return Err(err(format!("{what} is not supported")));
        }
        let types = raw
            .layer_types
            .as_ref()
            .ok_or_else(|| err("layer_types is required"))?;
        if types.len() != raw.num_hidden_layers || types.is_empty() {
            return Err(err(format!(
                "{} layer_types for {} layers",
                types.len(),
                raw.num_hidden_layers
            )));
        }
        if raw.num_kv_shared_layers > raw.num_hidden_layers {
            return Err(err("num_kv_shared_layers exceeds num_hidden_layers"));
        }
        if raw.hidden_size_per_layer_input > 0 && raw.vocab_size_per_layer_input == 0 {
            return Err(err(
                "per-layer embeddings need vocab_size_per_layer_input > 0",
            ));
        }
        if raw.vocab_size == 0 || raw.hidden_size == 0 || raw.sliding_window == 0 {
            return Err(err(
                "vocab_size, hidden_size and sliding_window must be > 0",
            ));
        }
        let layers = types
            .iter()
            .enumerate()
            .map(|(i, t)| raw.layer(i, t))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_attention_heads: raw.num_attention_heads,
            layers,
            sliding_window: raw.sliding_window,
            final_logit_softcapping: raw.final_logit_softcapping,
            hidden_size_per_layer_input: raw.hidden_size_per_layer_input,
            vocab_size_per_layer_input: raw.vocab_size_per_layer_input,
            num_kv_shared_layers: raw.num_kv_shared_layers,
            rms_norm_eps: raw.rms_norm_eps,
            rope_sliding: rope(&raw.rope_parameters, "sliding_attention")?,
            rope_full: rope(&raw.rope_parameters, "full_attention")?,
            tie_word_embeddings: raw.tie_word_embeddings,
            max_position_embeddings: raw.max_position_embeddings,
        })
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layers below this index compute their own keys and values.
    pub fn first_shared_layer(&self) -> usize {
        self.layers.len() - self.num_kv_shared_layers
    }

    /// The last layer below [`Self::first_shared_layer`] of the given type: where the shared
    /// layers of that type (and the assistant) read keys and values.
    pub fn donor_layer(&self, sliding: bool) -> Option<usize> {
        (0..self.first_shared_layer())
            .rev()
            .find(|i| self.layers[*i].sliding == sliding)
    }

    /// Checks that every shared layer has a donor of the same geometry.
    pub(crate) fn check_sharing(&self) -> Result<()> {
        for (i, spec) in self
            .layers
            .iter()
            .enumerate()
            .skip(self.first_shared_layer())
        {
            let donor = self
                .donor_layer(spec.sliding)
                .ok_or_else(|| err(format!("shared layer {i} has no earlier layer of its type")))?;
            let d = &self.layers[donor];
            if (d.head_dim, d.kv_heads) != (spec.head_dim, spec.kv_heads) {
                return Err(err(format!(
                    "shared layer {i} and its donor {donor} differ in head geometry"
                )));
            }
        }
        Ok(())
    }

    /// Bytes of keys and values one position costs in a cache (f32, layers with their own
    /// keys and values only).
    pub fn kv_bytes_per_position(&self) -> usize {
        let floats: usize = self.layers[..self.first_shared_layer()]
            .iter()
            .map(|l| 2 * l.kv_dim())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// The RoPE of a layer type.
    pub fn rope(&self, sliding: bool) -> RopeParams {
        if sliding {
            self.rope_sliding
        } else {
            self.rope_full
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawAssistant {
    text_config: serde_json::Value,
    backbone_hidden_size: usize,
    #[serde(default)]
    use_ordered_embeddings: bool,
    #[serde(default = "default_centroids")]
    num_centroids: usize,
    #[serde(default = "default_top_k")]
    centroid_intermediate_top_k: usize,
}

fn default_centroids() -> usize {
    2048
}

fn default_top_k() -> usize {
    32
}

/// A validated `Gemma4AssistantConfig`.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantConfig {
    /// The drafter's own decoder (every layer reads the target's keys and values).
    pub text: Gemma4Config,
    /// Hidden size of the target the assistant drafts for.
    pub backbone_hidden_size: usize,
    /// Whether the config asks for the centroid head.
    pub use_ordered_embeddings: bool,
    /// Centroids of the centroid head.
    pub num_centroids: usize,
    /// Centroids kept per step.
    pub centroid_intermediate_top_k: usize,
}

impl AssistantConfig {
    /// Parses an assistant `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: RawAssistant =
            serde_json::from_str(text).map_err(|e| err(format!("assistant config: {e}")))?;
        let inner: RawText =
            serde_json::from_value(raw.text_config).map_err(|e| err(e.to_string()))?;
        let mut text = Gemma4Config::from_raw(&inner)?;
        if text.num_kv_shared_layers == 0 {
            // transformers' Gemma4AssistantConfig.__post_init__: every layer is shared.
            text.num_kv_shared_layers = text.num_layers();
        }
        if text.num_kv_shared_layers != text.num_layers() {
            return Err(err(
                "every assistant layer must read shared keys and values",
            ));
        }
        if text.hidden_size_per_layer_input != 0 {
            return Err(err("assistant hidden_size_per_layer_input must be 0"));
        }
        let cfg = Self {
            text,
            backbone_hidden_size: raw.backbone_hidden_size,
            use_ordered_embeddings: raw.use_ordered_embeddings,
            num_centroids: raw.num_centroids,
            centroid_intermediate_top_k: raw.centroid_intermediate_top_k,
        };
        cfg.check_head()?;
        Ok(cfg)
    }

    fn check_head(&self) -> Result<()> {
        if !self.use_ordered_embeddings {
            return Ok(());
        }
        let (c, k, v) = (
            self.num_centroids,
            self.centroid_intermediate_top_k,
            self.text.vocab_size,
        );
        if c == 0 || !v.is_multiple_of(c) {
            return Err(err(format!(
                "vocab_size {v} is not a multiple of {c} centroids"
            )));
        }
        if k == 0 || k > c {
            return Err(err(format!("centroid top-k {k} must be in 1..={c}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEQV: &str = include_str!("../../tests/fixtures/gemma4/target_keqv/config.json");

    /// Google's spelling (nested `text_config`, `global_head_dim`,
    /// `num_global_key_value_heads`) resolves to what transformers' `per_layer_config` says.
    #[test]
    fn both_spellings_of_full_layer_geometry_agree() {
        let ours = Gemma4Config::from_hf_json(KEQV).expect("transformers spelling");
        let mut text: serde_json::Value = serde_json::from_str(KEQV).expect("json");
        let obj = text.as_object_mut().expect("object");
        obj.remove("per_layer_config");
        obj.insert("global_head_dim".into(), 32.into());
        obj.insert("num_global_key_value_heads".into(), 1.into());
        let google = serde_json::json!({ "model_type": "gemma4", "text_config": text });
        let theirs = Gemma4Config::from_hf_json(&google.to_string()).expect("google spelling");
        assert_eq!(ours, theirs);
        let full = ours.layers[2];
        assert_eq!(
            (full.sliding, full.head_dim, full.kv_heads, full.k_eq_v),
            (false, 32, 1, true)
        );
        let sliding = ours.layers[3];
        assert_eq!(
            (sliding.head_dim, sliding.kv_heads, sliding.k_eq_v),
            (16, 2, false)
        );
        assert_eq!(
            (ours.donor_layer(true), ours.donor_layer(false)),
            (Some(3), Some(2))
        );
        assert_eq!(ours.rope_full.partial_rotary_factor, 0.25);
    }

    #[test]
    fn moe_and_unknown_rope_are_refused() {
        let mut v: serde_json::Value = serde_json::from_str(KEQV).expect("json");
        v["enable_moe_block"] = true.into();
        let e = Gemma4Config::from_hf_json(&v.to_string()).expect_err("moe");
        assert!(e.to_string().contains("enable_moe_block"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(KEQV).expect("json");
        v["rope_parameters"]["full_attention"]["rope_type"] = "yarn".into();
        let e = Gemma4Config::from_hf_json(&v.to_string()).expect_err("yarn");
        assert!(e.to_string().contains("yarn"), "{e}");
    }
}
