//! Pieces shared by the Gemma 4 target and its assistant (transformers'
//! `Gemma4TextDecoderLayer`): the safetensors reader, row-wise f32 linears, the attention
//! query path (projection, `q_norm`, RoPE) and the feed-forward half of a layer with its
//! norms. Gemma 4's RMSNorm multiplies by the stored weight `w` itself (Gemma 3 used `1 + w`),
//! always in f32.

use std::path::Path;

use tandem_kernels::{QMatrix, QType};

use super::config::{Gemma4Config, LayerSpec, RopeParams};
use crate::error::{GemmaError, Result};
use crate::loader::HfSource;
use crate::ops::{gelu_tanh_mul, rms_norm, rms_norm_rows, Rope};

/// Tensors of an HF checkpoint directory, by name.
pub(crate) struct Weights {
    src: HfSource,
    /// Prefix of the decoder's tensors (`model.`, or `model.language_model.` in the
    /// multimodal checkpoints).
    prefix: &'static str,
}

impl Weights {
    /// Reads `dir/config.json` and maps the safetensors next to it.
    pub(crate) fn open(dir: &Path) -> Result<(Self, String)> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| GemmaError::io(&cfg_path, e))?;
        let src = HfSource::open_tensors(dir)?;
        let prefix = if src.contains("model.language_model.embed_tokens.weight") {
            "model.language_model."
        } else {
            "model."
        };
        Ok((Self { src, prefix }, text))
    }

    /// The decoder tensor `leaf` (`layers.3.mlp.up_proj.weight`) under the model prefix.
    pub(crate) fn model(&self, leaf: &str) -> String {
        format!("{}{leaf}", self.prefix)
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.src.contains(name)
    }

    /// An `n × k` matrix (`n` outputs) as f32.
    pub(crate) fn matrix(&self, name: &str, n: usize, k: usize) -> Result<QMatrix> {
        let data = self.src.load_f32(name, &[n, k])?;
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(QMatrix::new(QType::F32, n, k, bytes)?)
    }

    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.src.load_f32(name, &[len])
    }

    pub(crate) fn ids(&self, name: &str, len: usize) -> Result<Vec<i64>> {
        self.src.load_i64(name, &[len])
    }
}

/// `x` (`m × w.k()`) times `wᵀ`, one row at a time in a fixed order.
pub(crate) fn linear(w: &QMatrix, x: &[f32], m: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; m * w.n()];
    w.matmul(x, m, &mut out)?;
    Ok(out)
}

/// The RoPE of a layer: proportional (partial) on full layers, default on sliding ones.
pub(crate) fn layer_rope(params: RopeParams, head_dim: usize) -> Rope {
    Rope::proportional(head_dim, params.rope_theta, params.partial_rotary_factor)
}

/// The query half of attention: `q_proj`, per-head `q_norm`, RoPE.
pub(crate) struct Query {
    pub(crate) proj: QMatrix,
    pub(crate) norm: Vec<f32>,
    pub(crate) rope: Rope,
}

impl Query {
    pub(crate) fn load(w: &Weights, cfg: &Gemma4Config, i: usize, spec: LayerSpec) -> Result<Self> {
        let at = |leaf: &str| w.model(&format!("layers.{i}.self_attn.{leaf}"));
        let q_dim = cfg.num_attention_heads * spec.head_dim;
        Ok(Self {
            proj: w.matrix(&at("q_proj.weight"), q_dim, cfg.hidden_size)?,
            norm: w.vector(&at("q_norm.weight"), spec.head_dim)?,
            rope: layer_rope(cfg.rope(spec.sliding), spec.head_dim),
        })
    }

    /// Queries of `m` rows of normed input; row `r` sits at `positions[r]`.
    pub(crate) fn compute(&self, x: &[f32], positions: &[usize], eps: f32) -> Result<Vec<f32>> {
        let mut q = linear(&self.proj, x, positions.len())?;
        rms_norm_rows(&mut q, &self.norm, eps);
        let width = self.proj.n();
        for (row, pos) in q.chunks_exact_mut(width).zip(positions) {
            self.rope.apply(row, *pos);
        }
        Ok(q)
    }
}

/// Everything of a decoder layer but attention: its norms, the GELU MLP, the layer scalar.
pub(crate) struct FeedForward {
    pub(crate) input_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    pre_ffn_norm: Vec<f32>,
    post_ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    pub(crate) scalar: f32,
}

impl FeedForward {
    pub(crate) fn load(w: &Weights, cfg: &Gemma4Config, i: usize) -> Result<Self> {
        let at = |leaf: &str| w.model(&format!("layers.{i}.{leaf}"));
        let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            input_norm: w.vector(&at("input_layernorm.weight"), h)?,
            post_attn_norm: w.vector(&at("post_attention_layernorm.weight"), h)?,
            pre_ffn_norm: w.vector(&at("pre_feedforward_layernorm.weight"), h)?,
            post_ffn_norm: w.vector(&at("post_feedforward_layernorm.weight"), h)?,
            gate: w.matrix(&at("mlp.gate_proj.weight"), f, h)?,
            up: w.matrix(&at("mlp.up_proj.weight"), f, h)?,
            down: w.matrix(&at("mlp.down_proj.weight"), h, f)?,
            scalar: w.vector(&at("layer_scalar"), 1)?[0],
        })
    }

    /// `x += post_attention_norm(attn_out)`, then the MLP residual.
    pub(crate) fn finish(&self, x: &mut [f32], mut attn_out: Vec<f32>, eps: f32) -> Result<()> {
        rms_norm_rows(&mut attn_out, &self.post_attn_norm, eps);
        x.iter_mut().zip(&attn_out).for_each(|(a, b)| *a += b);
        let m = x.len() / self.input_norm.len();
        let normed = rms_norm(x, &self.pre_ffn_norm, eps);
        let mut gate = linear(&self.gate, &normed, m)?;
        let up = linear(&self.up, &normed, m)?;
        gelu_tanh_mul(&mut gate, &up);
        let mut down = linear(&self.down, &gate, m)?;
        rms_norm_rows(&mut down, &self.post_ffn_norm, eps);
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// The closing `x *= layer_scalar`.
    pub(crate) fn scale(&self, x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v *= self.scalar);
    }
}
