//! Export of a GGUF Gemma 3 to the HF layout (`config.json` + f32 `model.safetensors`):
//! dequantizes every tensor, renames it and turns GGUF's `1 + w` norm weights back into
//! HF's `w`. Used to cross-check the two loading paths and to feed dense (GPU) backends.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::config::GemmaConfig;
use super::names::{LayerTensor, Role};
use crate::error::{GemmaError, Result};
use crate::loader::{GgufSource, TensorSource};

fn roles(cfg: &GemmaConfig) -> Vec<Role> {
    let mut roles = vec![Role::Embed, Role::FinalNorm];
    if !cfg.tie_word_embeddings {
        roles.push(Role::LmHead);
    }
    for i in 0..cfg.num_hidden_layers {
        roles.extend(LayerTensor::ALL.iter().map(|t| Role::Layer(i, *t)));
    }
    roles
}

/// The HF `config.json` text of `cfg`.
pub fn hf_config_json(cfg: &GemmaConfig) -> String {
    let mut v = serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_local_base_freq": cfg.rope_local_base_freq,
        "sliding_window": cfg.sliding_window,
        "sliding_window_pattern": cfg.sliding_window_pattern,
        "attn_logit_softcapping": cfg.attn_logit_softcapping,
        "final_logit_softcapping": cfg.final_logit_softcapping,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_activation": cfg.hidden_activation,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "torch_dtype": "float32",
    });
    if let Some(s) = &cfg.rope_scaling {
        v["rope_scaling"] = serde_json::json!({"rope_type": s.rope_type, "factor": s.factor});
    }
    if let Some(t) = &cfg.layer_types {
        v["layer_types"] = serde_json::json!(t);
    }
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// Writes `gguf` as an HF directory `out_dir` (created if absent) with f32 weights.
pub fn export_hf(gguf: &Path, out_dir: &Path) -> Result<()> {
    let src = GgufSource::open(gguf)?;
    let cfg = src.config()?;
    std::fs::create_dir_all(out_dir).map_err(|e| GemmaError::io(out_dir, e))?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for role in roles(&cfg) {
        let shape = role.shape(&cfg);
        let data = if shape.len() == 2 {
            src.matrix(role, shape[0], shape[1])?.dequantize()
        } else {
            let mut v = src.vector(role, shape[0])?;
            if role.is_norm() {
                v.iter_mut().for_each(|w| *w -= 1.0);
            }
            v
        };
        tensors.insert(role.hf_name(), Tensor::from_vec(data, shape, &Device::Cpu)?);
    }
    let st = out_dir.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &st)?;
    let cfg_path = out_dir.join("config.json");
    std::fs::write(&cfg_path, hf_config_json(&cfg)).map_err(|e| GemmaError::io(&cfg_path, e))?;
    Ok(())
}
