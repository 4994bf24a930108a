//! The Gemma 4 text decoder (Google DeepMind, Gemma 4, 2026; reference: transformers 5.24
//! `Gemma4ForCausalLM` / `Gemma4TextModel`).
//!
//! Per layer: RMSNorm (weight `w`), attention with `q_norm`/`k_norm` and a weightless
//! `v_norm`, scale 1.0, sliding or full with their own head geometry, default RoPE on
//! sliding and proportional (partial) RoPE on full layers; the last
//! `num_kv_shared_layers` layers reuse the keys and values of the last earlier layer of
//! their type; GELU MLP; the per-layer embedding residual; `x *= layer_scalar`. Then the
//! final norm, the (tied) head and logit softcapping. Weights are f32 and every matmul and
//! attention row is computed on its own in a fixed order, so a position's logits do not
//! depend on the block it was computed in. The KV cache is the caller's.

use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use tandem_core::TargetIdentity;
use tandem_kernels::QMatrix;

use super::block::{linear, FeedForward, Query, Weights};
use super::cache::Gemma4Cache;
use super::config::{Gemma4Config, LayerSpec};
use super::ple::{PerLayerGate, PerLayerInputs};
use crate::attention::{attend, AttnSpec};
use crate::error::{GemmaError, Result};
use crate::gemma3::LogitsMode;
use crate::ops::{rms_norm, rms_norm_rows, softcap, Rope};

/// The target's input embedding scaled by `sqrt(hidden)`, as its decoder (and the assistant
/// drafter's input) sees it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gemma4Embedding {
    table: Arc<QMatrix>,
    scale: f32,
}

impl Gemma4Embedding {
    /// Reads the config and only the input embedding of a Gemma 4 HF directory (what the
    /// assistant drafter needs of its target).
    pub fn load(dir: &Path) -> Result<(Gemma4Config, Self)> {
        let (w, text) = Weights::open(dir)?;
        let cfg = parse_config(dir, &text)?;
        let embedding = Self::read(&w, &cfg)?;
        Ok((cfg, embedding))
    }

    fn read(w: &Weights, cfg: &Gemma4Config) -> Result<Self> {
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        Ok(Self {
            table: Arc::new(w.matrix(&w.model("embed_tokens.weight"), v, h)?),
            scale: (h as f64).sqrt() as f32,
        })
    }

    /// The target's identity: architecture `gemma4` and the hash of every 64th (unscaled)
    /// embedding row ([`TargetIdentity::of_embedding`]), as Gemma 3 targets hash theirs.
    pub fn identity(&self) -> Result<TargetIdentity> {
        TargetIdentity::of_embedding("gemma4", self.vocab_size(), self.width(), |r, row| {
            self.table.dequantize_row(r, row)
        })
        .map_err(GemmaError::from)
    }

    /// Width of one embedding.
    pub fn width(&self) -> usize {
        self.table.k()
    }

    /// Rows of the table.
    pub fn vocab_size(&self) -> usize {
        self.table.n()
    }

    /// Writes the scaled embedding of `token` into `row`.
    pub fn embed_into(&self, token: u32, row: &mut [f32]) -> Result<()> {
        let t = token as usize;
        if t >= self.table.n() || row.len() != self.table.k() {
            return Err(GemmaError::Request(format!(
                "token {token} outside the vocabulary of {}",
                self.table.n()
            )));
        }
        self.table.dequantize_row(t, row)?;
        row.iter_mut().for_each(|v| *v *= self.scale);
        Ok(())
    }
}

/// A target config read from `dir/config.json`, with its KV sharing checked.
fn parse_config(dir: &Path, text: &str) -> Result<Gemma4Config> {
    let cfg = Gemma4Config::from_hf_json(text).map_err(|e| match e {
        GemmaError::Config(reason) => GemmaError::format(dir.join("config.json"), reason),
        other => other,
    })?;
    cfg.check_sharing()?;
    Ok(cfg)
}

/// What one forward over a block of `m` tokens returns.
#[derive(Debug)]
pub struct Gemma4Output {
    /// `[rows, vocab]` f32 softcapped logits (`rows` = `m`, 1 or 0 by [`LogitsMode`]).
    pub logits: Option<Tensor>,
    /// `[m, hidden]` f32: the final-norm output of every position (the assistant's input).
    pub last_hidden: Tensor,
}

/// Keys and values a layer computes itself.
struct OwnKv {
    k: QMatrix,
    /// `None` with `attention_k_eq_v`: values come from the key projection.
    v: Option<QMatrix>,
    k_norm: Vec<f32>,
    unit: Vec<f32>,
}

impl OwnKv {
    fn load(w: &Weights, cfg: &Gemma4Config, i: usize, spec: LayerSpec) -> Result<Self> {
        let at = |leaf: &str| w.model(&format!("layers.{i}.self_attn.{leaf}"));
        let (n, h) = (spec.kv_dim(), cfg.hidden_size);
        Ok(Self {
            k: w.matrix(&at("k_proj.weight"), n, h)?,
            v: match spec.k_eq_v {
                true => None,
                false => Some(w.matrix(&at("v_proj.weight"), n, h)?),
            },
            k_norm: w.vector(&at("k_norm.weight"), spec.head_dim)?,
            unit: vec![1.0; spec.head_dim],
        })
    }

    /// Normed, rotated keys and normed values of `m` rows at `pos..`.
    fn compute(
        &self,
        x: &[f32],
        pos: usize,
        rope: &Rope,
        eps: f32,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let m = x.len() / self.k.k();
        let mut k = linear(&self.k, x, m)?;
        let mut v = match &self.v {
            Some(v) => linear(v, x, m)?,
            None => k.clone(),
        };
        rms_norm_rows(&mut k, &self.k_norm, eps);
        for (r, row) in k.chunks_exact_mut(self.k.n()).enumerate() {
            rope.apply(row, pos + r);
        }
        rms_norm_rows(&mut v, &self.unit, eps);
        Ok((k, v))
    }
}

struct Layer {
    spec: LayerSpec,
    /// Cache slot read (own, or the donor's for a KV-shared layer).
    slot: usize,
    query: Query,
    kv: Option<OwnKv>,
    o: QMatrix,
    ffn: FeedForward,
    ple: Option<PerLayerGate>,
}

/// A loaded Gemma 4 text model. Immutable and shareable across threads.
pub struct Gemma4 {
    cfg: Gemma4Config,
    embedding: Gemma4Embedding,
    lm_head: Option<QMatrix>,
    ple: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
}

impl Gemma4 {
    /// Loads an HF directory (`config.json` + safetensors). On any error nothing stays loaded.
    pub fn load(dir: &Path) -> Result<Self> {
        let (w, text) = Weights::open(dir)?;
        let cfg = parse_config(dir, &text)?;
        Self::build(cfg, &w)
    }

    fn build(cfg: Gemma4Config, w: &Weights) -> Result<Self> {
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embedding = Gemma4Embedding::read(w, &cfg)?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(w.matrix("lm_head.weight", v, h)?),
        };
        let ple = match cfg.hidden_size_per_layer_input {
            0 => None,
            _ => Some(PerLayerInputs::load(w, &cfg)?),
        };
        let layers = (0..cfg.num_layers())
            .map(|i| Self::layer(w, &cfg, i))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embedding,
            lm_head,
            ple,
            layers,
            final_norm: w.vector(&w.model("norm.weight"), h)?,
            cfg,
        })
    }

    fn layer(w: &Weights, cfg: &Gemma4Config, i: usize) -> Result<Layer> {
        let spec = cfg.layers[i];
        let own = i < cfg.first_shared_layer();
        let slot = match own {
            true => i,
            false => cfg
                .donor_layer(spec.sliding)
                .ok_or_else(|| GemmaError::Config(format!("shared layer {i} has no donor")))?,
        };
        let q_dim = cfg.num_attention_heads * spec.head_dim;
        let o_name = w.model(&format!("layers.{i}.self_attn.o_proj.weight"));
        Ok(Layer {
            spec,
            slot,
            query: Query::load(w, cfg, i, spec)?,
            kv: own.then(|| OwnKv::load(w, cfg, i, spec)).transpose()?,
            o: w.matrix(&o_name, cfg.hidden_size, q_dim)?,
            ffn: FeedForward::load(w, cfg, i)?,
            ple: match cfg.hidden_size_per_layer_input {
                0 => None,
                _ => Some(PerLayerGate::load(w, cfg, i)?),
            },
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Gemma4Config {
        &self.cfg
    }

    /// A fresh KV cache for one sequence of at most `max_len` positions.
    pub fn new_cache(&self, max_len: usize) -> Gemma4Cache {
        Gemma4Cache::new(&self.cfg, max_len.min(self.cfg.max_position_embeddings))
    }

    /// The scaled input embedding (what the assistant drafter concatenates with the hidden).
    pub fn embedding(&self) -> Gemma4Embedding {
        self.embedding.clone()
    }

    /// The scaled input embedding of `token`.
    pub fn embed_token(&self, token: u32) -> Result<Vec<f32>> {
        let mut row = vec![0f32; self.cfg.hidden_size];
        self.embedding.embed_into(token, &mut row)?;
        Ok(row)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let limit = match self.ple {
            Some(_) => self.cfg.vocab_size.min(self.cfg.vocab_size_per_layer_input),
            None => self.cfg.vocab_size,
        };
        match tokens.iter().find(|t| **t as usize >= limit) {
            Some(t) => Err(GemmaError::Request(format!(
                "token id {t} is outside the vocabulary of {limit}"
            ))),
            None => Ok(()),
        }
    }

    /// Runs `tokens` at positions `pos..pos+m`, appending their keys and values to `cache`
    /// (which must hold exactly `pos` positions). On error the cache is unchanged.
    pub fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut Gemma4Cache,
        logits: LogitsMode,
    ) -> Result<Gemma4Output> {
        let m = tokens.len();
        if m == 0 {
            return Err(GemmaError::Request("empty block".into()));
        }
        self.check_tokens(tokens)?;
        cache.check_append(pos, m)?;
        let h = self.cfg.hidden_size;
        let mut x = vec![0f32; m * h];
        for (row, t) in x.chunks_exact_mut(h).zip(tokens) {
            self.embedding.embed_into(*t, row)?;
        }
        let per_layer = match &self.ple {
            Some(p) => Some(p.compute(tokens, &x, self.cfg.rms_norm_eps as f32)?),
            None => None,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let pli = per_layer.as_ref().map(|p| p.layer(i));
            if let Err(e) = self.layer_forward(layer, &mut x, pos, cache, pli.as_deref()) {
                cache.discard_uncommitted();
                return Err(e);
            }
        }
        cache.commit(m);
        let normed = rms_norm(&x, &self.final_norm, self.cfg.rms_norm_eps as f32);
        let logits = match logits {
            LogitsMode::All | LogitsMode::BoundedAll | LogitsMode::Top(_) => {
                Some(self.logits(&normed, m)?)
            }
            LogitsMode::Last | LogitsMode::Bounded => Some(self.logits(&normed[(m - 1) * h..], 1)?),
            LogitsMode::None => None,
        };
        Ok(Gemma4Output {
            logits,
            last_hidden: Tensor::from_vec(normed, (m, h), &Device::Cpu)?,
        })
    }

    fn logits(&self, normed: &[f32], rows: usize) -> Result<Tensor> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embedding.table);
        let mut out = linear(head, normed, rows)?;
        if let Some(cap) = self.cfg.final_logit_softcapping {
            softcap(&mut out, cap as f32);
        }
        Ok(Tensor::from_vec(
            out,
            (rows, self.cfg.vocab_size),
            &Device::Cpu,
        )?)
    }

    fn layer_forward(
        &self,
        l: &Layer,
        x: &mut [f32],
        pos: usize,
        cache: &mut Gemma4Cache,
        per_layer_input: Option<&[f32]>,
    ) -> Result<()> {
        let eps = self.cfg.rms_norm_eps as f32;
        let m = x.len() / self.cfg.hidden_size;
        let normed = rms_norm(x, &l.ffn.input_norm, eps);
        let positions: Vec<usize> = (pos..pos + m).collect();
        let q = l.query.compute(&normed, &positions, eps)?;
        if let Some(own) = &l.kv {
            let (k, v) = own.compute(&normed, pos, &l.query.rope, eps)?;
            let slot = cache.slot_mut(l.slot);
            slot.k.extend_from_slice(&k);
            slot.v.extend_from_slice(&v);
        }
        let kv = cache.slot(l.slot);
        let spec = AttnSpec {
            pos0: pos,
            n_heads: self.cfg.num_attention_heads,
            n_kv_heads: l.spec.kv_heads,
            head_dim: l.spec.head_dim,
            scale: 1.0,
            window: l.spec.sliding.then_some(self.cfg.sliding_window),
            softcap: None,
        };
        let attn = attend(&q, &kv.k, &kv.v, spec);
        let o = linear(&l.o, &attn, m)?;
        l.ffn.finish(x, o, eps)?;
        if let (Some(gate), Some(input)) = (&l.ple, per_layer_input) {
            gate.apply(x, input, eps)?;
        }
        l.ffn.scale(x);
        Ok(())
    }
}
