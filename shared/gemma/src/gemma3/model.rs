//! The Gemma 3 text decoder (Gemma Team, "Gemma 3 Technical Report", 2025; reference:
//! transformers' `Gemma3ForCausalLM`).
//!
//! Weights stay in their stored format (GGUF blocks, or f32/f16 from safetensors) and are
//! applied by `tandem_kernels` row-wise matmuls; attention and norms are per-row loops with a
//! fixed order. A position's logits therefore do not depend on the size of the block it was
//! computed in. The KV cache is passed in by the caller.

use std::path::Path;

use candle_core::Tensor;
use tandem_kernels::{ArgmaxScreen, QType, TopRow};

use super::bounded::BoundedRow;
use super::config::GemmaConfig;
use super::head::TargetHead;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::names::{LayerTensor, Role};
use crate::error::{GemmaError, Result};
use crate::loader::{self, TensorSource};
use crate::ops::Rope;

/// How quantized weights meet activations on the CPU. Both are batch invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 activations against exactly dequantized weights: the model transformers computes on
    /// the dequantized checkpoint.
    #[default]
    Exact,
    /// Activations quantized to 8 bits per block before integer dot products, as llama.cpp
    /// does: cheaper for multi-token blocks, at the cost of ~0.1-0.7 logits of noise.
    Int8,
}

/// Options of [`Gemma3::load_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Activation precision of quantized matmuls.
    pub precision: Precision,
}

/// Which positions of a block get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogitsMode {
    /// Every block position (verification).
    #[default]
    All,
    /// Only the last position (prefill, plain decoding).
    Last,
    /// None (context-only forwards).
    None,
    /// Every block position, of which only the `k` largest logits per row are read
    /// (greedy verification: `k = 1`; top-k sampling): [`ForwardOutput::top`] where the
    /// model can find them without all logits (the CPU model in `exact` precision,
    /// through `tandem_kernels::ArgmaxScreen`, for two or more rows), else every row's
    /// logits as with [`LogitsMode::All`].
    Top(usize),
    /// Only the last position, as an upper bound on each logit for drawing its token at a
    /// temperature ([`ForwardOutput::bounded`]) where the model bounds them without forming
    /// them all (the CPU model in `exact` precision, through
    /// `tandem_kernels::ArgmaxScreen`), else its logits as with [`LogitsMode::Last`].
    Bounded,
    /// Every block position as [`LogitsMode::Bounded`] bounds the last (sampled
    /// verification), else every row's logits as with [`LogitsMode::All`].
    BoundedAll,
}

/// What a forward should return besides updating the cache.
#[derive(Debug, Clone, Default)]
pub struct ForwardOptions {
    /// Which positions get logits.
    pub logits: LogitsMode,
    /// Hidden states to return: `i < num_layers` is the output of decoder layer `i`,
    /// `i == num_layers` the output of the final norm.
    pub taps: Vec<usize>,
}

/// Result of one forward over a block of `m` tokens.
#[derive(Debug)]
pub struct ForwardOutput {
    /// `[rows, vocab]` f32 logits (`rows` = `m`, 1 or 0 by [`LogitsMode`]).
    pub logits: Option<Tensor>,
    /// With [`LogitsMode::Top`], per block position the ids (ascending) that can rank
    /// among its `k` largest logits with those logits, bit for bit as in the full row.
    pub top: Option<Vec<TopRow>>,
    /// With [`LogitsMode::Bounded`], the last position's logits as bounds, with
    /// [`LogitsMode::BoundedAll`] every position's, where the model gives them (else
    /// none).
    pub bounded: Vec<BoundedRow>,
    /// One `[m, hidden]` f32 tensor per requested tap, in request order.
    pub taps: Vec<Tensor>,
    /// `[m, hidden]` f32: the final-norm output of every block position.
    pub last_hidden: Tensor,
}

pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    pub(super) q: Linear,
    pub(super) k: Linear,
    pub(super) v: Linear,
    pub(super) o: Linear,
    pub(super) q_norm: Vec<f32>,
    pub(super) k_norm: Vec<f32>,
    pub(super) post_attn_norm: Vec<f32>,
    pub(super) pre_ffn_norm: Vec<f32>,
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
    pub(super) post_ffn_norm: Vec<f32>,
    pub(super) sliding: bool,
}

/// A loaded Gemma 3 text model. Immutable and shareable across threads.
pub struct Gemma3 {
    pub(super) cfg: GemmaConfig,
    pub(super) head: TargetHead,
    pub(super) layers: Vec<Layer>,
    pub(super) final_norm: Vec<f32>,
    pub(super) rope_local: Rope,
    pub(super) rope_global: Rope,
    pub(super) precision: Precision,
    /// Rows' largest logits without all of them: `exact` precision with a Q8_0 head, no
    /// final soft-capping (which could tie distinct logits), and the CPU's screen kernel.
    pub(super) screen: Option<ArgmaxScreen>,
}

impl Gemma3 {
    /// Loads a `.gguf` file or an HF directory (`config.json` + safetensors) with default
    /// options.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// Loads a `.gguf` file (quantized weights stay quantized) or an HF directory.
    pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let (src, cfg) = loader::open(path)?;
        Self::build(cfg, src.as_ref(), opts.precision)
    }

    fn build(cfg: GemmaConfig, src: &dyn TensorSource, precision: Precision) -> Result<Self> {
        let mat = |role: Role| {
            let shape = role.shape(&cfg);
            Linear::new(src.matrix(role, shape[0], shape[1])?, precision)
        };
        let vec = |role: Role| src.vector(role, role.shape(&cfg)[0]);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                use LayerTensor::*;
                let at = |t| Role::Layer(i, t);
                Ok(Layer {
                    attn_norm: vec(at(AttnNorm))?,
                    q: mat(at(Q))?,
                    k: mat(at(K))?,
                    v: mat(at(V))?,
                    o: mat(at(O))?,
                    q_norm: vec(at(QNorm))?,
                    k_norm: vec(at(KNorm))?,
                    post_attn_norm: vec(at(PostAttnNorm))?,
                    pre_ffn_norm: vec(at(PreFfnNorm))?,
                    gate: mat(at(Gate))?,
                    up: mat(at(Up))?,
                    down: mat(at(Down))?,
                    post_ffn_norm: vec(at(PostFfnNorm))?,
                    sliding: cfg.is_sliding(i),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head = TargetHead::read(cfg.clone(), src, precision)?;
        let screen = match (head.head().lanes(), cfg.final_logit_softcapping) {
            (Some(w), None) if w.qtype() == QType::Q8_0 && ArgmaxScreen::available() => {
                Some(ArgmaxScreen::new(w)?)
            }
            _ => None,
        };
        let final_norm = vec(Role::FinalNorm)?;
        let hd = cfg.head_dim;
        let factor = cfg.rope_scaling.as_ref().map_or(1.0, |s| s.factor);
        Ok(Self {
            final_norm,
            rope_local: Rope::new(hd, cfg.rope_local_base_freq, 1.0),
            rope_global: Rope::new(hd, cfg.rope_theta, factor),
            head,
            layers,
            cfg,
            precision,
            screen,
        })
    }

    /// The activation precision of quantized matmuls.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The model's configuration.
    pub fn config(&self) -> &GemmaConfig {
        &self.cfg
    }

    /// A fresh KV cache for one sequence of at most `max_len` positions.
    pub fn new_cache(&self, max_len: usize) -> KvCache {
        KvCache::new(&self.cfg, max_len.min(self.cfg.max_position_embeddings))
    }

    /// The input embedding of `token`, scaled by `sqrt(hidden)` as the decoder sees it.
    pub fn embed_token(&self, token: u32) -> Result<Vec<f32>> {
        self.head.embed(token)
    }

    pub(super) fn embed_into(&self, token: u32, row: &mut [f32]) -> Result<()> {
        self.head.embed_into(token, row)
    }

    /// The model's input embedding and output head, sharing its weights.
    pub fn head(&self) -> TargetHead {
        self.head.clone()
    }

    pub(super) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|t| **t as usize >= self.cfg.vocab_size) {
            Some(t) => Err(GemmaError::Request(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab_size
            ))),
            None => Ok(()),
        }
    }
}
