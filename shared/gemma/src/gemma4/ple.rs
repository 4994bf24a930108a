//! Per-layer embeddings of Gemma 4 (transformers' `Gemma4TextModel.get_per_layer_inputs`,
//! `project_per_layer_inputs` and the per-layer residual of `Gemma4TextDecoderLayer`): a
//! second, narrow embedding of each token per layer, mixed with a projection of the main
//! embedding, gates a small residual added after every layer's MLP.

use tandem_kernels::QMatrix;

use super::block::{linear, Weights};
use super::config::Gemma4Config;
use crate::error::Result;
use crate::ops::{gelu_tanh_mul, rms_norm_rows};

/// The model-level half: per token, one `hidden_size_per_layer_input` vector per layer.
pub(crate) struct PerLayerInputs {
    embed: QMatrix,
    projection: QMatrix,
    norm: Vec<f32>,
    layers: usize,
    embed_scale: f32,
    projection_scale: f32,
}

/// `m × layers × width` per-layer inputs of a block.
pub(crate) struct PerLayerValues {
    data: Vec<f32>,
    layers: usize,
    width: usize,
}

impl PerLayerValues {
    /// The `m × width` inputs of layer `i`.
    pub(crate) fn layer(&self, i: usize) -> Vec<f32> {
        self.data
            .chunks_exact(self.layers * self.width)
            .flat_map(|row| &row[i * self.width..(i + 1) * self.width])
            .copied()
            .collect()
    }
}

impl PerLayerInputs {
    pub(crate) fn load(w: &Weights, cfg: &Gemma4Config) -> Result<Self> {
        let (p, n) = (cfg.hidden_size_per_layer_input, cfg.num_layers());
        Ok(Self {
            embed: w.matrix(
                &w.model("embed_tokens_per_layer.weight"),
                cfg.vocab_size_per_layer_input,
                n * p,
            )?,
            projection: w.matrix(
                &w.model("per_layer_model_projection.weight"),
                n * p,
                cfg.hidden_size,
            )?,
            norm: w.vector(&w.model("per_layer_projection_norm.weight"), p)?,
            layers: n,
            embed_scale: (p as f64).sqrt() as f32,
            projection_scale: (cfg.hidden_size as f64).powf(-0.5) as f32,
        })
    }

    /// `(norm(W x / sqrt(hidden)) + E_pl[token] * sqrt(width)) / sqrt(2)` for every row of
    /// the scaled main embeddings `x`.
    pub(crate) fn compute(&self, tokens: &[u32], x: &[f32], eps: f32) -> Result<PerLayerValues> {
        let m = tokens.len();
        let mut proj = linear(&self.projection, x, m)?;
        proj.iter_mut().for_each(|v| *v *= self.projection_scale);
        rms_norm_rows(&mut proj, &self.norm, eps);
        let mut row = vec![0f32; self.embed.k()];
        let half = std::f64::consts::FRAC_1_SQRT_2 as f32;
        for (out, t) in proj.chunks_exact_mut(self.embed.k()).zip(tokens) {
            self.embed.dequantize_row(*t as usize, &mut row)?;
            for (o, e) in out.iter_mut().zip(&row) {
                *o = (*o + e * self.embed_scale) * half;
            }
        }
        Ok(PerLayerValues {
            data: proj,
            layers: self.layers,
            width: self.norm.len(),
        })
    }
}

/// The layer-level half: `x += norm(W_p (gelu(W_g x) * input))`.
pub(crate) struct PerLayerGate {
    gate: QMatrix,
    projection: QMatrix,
    norm: Vec<f32>,
}

impl PerLayerGate {
    pub(crate) fn load(w: &Weights, cfg: &Gemma4Config, i: usize) -> Result<Self> {
        let at = |leaf: &str| w.model(&format!("layers.{i}.{leaf}"));
        let (h, p) = (cfg.hidden_size, cfg.hidden_size_per_layer_input);
        Ok(Self {
            gate: w.matrix(&at("per_layer_input_gate.weight"), p, h)?,
            projection: w.matrix(&at("per_layer_projection.weight"), h, p)?,
            norm: w.vector(&at("post_per_layer_input_norm.weight"), h)?,
        })
    }

    pub(crate) fn apply(&self, x: &mut [f32], input: &[f32], eps: f32) -> Result<()> {
        let m = x.len() / self.norm.len();
        let mut g = linear(&self.gate, x, m)?;
        gelu_tanh_mul(&mut g, input);
        let mut p = linear(&self.projection, &g, m)?;
        rms_norm_rows(&mut p, &self.norm, eps);
        x.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
        Ok(())
    }
}
