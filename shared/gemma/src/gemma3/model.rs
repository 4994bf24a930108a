//! The Gemma 3 text decoder (Gemma Team, "Gemma 3 Technical Report", 2025; reference:
//! transformers' `Gemma3ForCausalLM`).
//!
//! Weights stay in their stored format (GGUF blocks, or f32/f16 from safetensors) and are
//! applied by `tandem_kernels` row-wise matmuls; attention and norms are per-row loops with a
//! fixed order. A position's logits therefore do not depend on the size of the block it was
//! computed in. The KV cache is passed in by the caller.

use std::path::Path;

use candle_core::{Device, Tensor};
use tandem_kernels::{ArgmaxScreen, QType, TopRow};

use super::config::GemmaConfig;
use super::head::TargetHead;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::names::{LayerTensor, Role};
use crate::attention::{attend, AttnSpec};
use crate::error::{GemmaError, Result};
use crate::loader::{self, TensorSource};
use crate::ops::{gelu_tanh_mul, rms_norm, rms_norm_rows, softcap, Rope, RopeAngles};

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
    /// One `[m, hidden]` f32 tensor per requested tap, in request order.
    pub taps: Vec<Tensor>,
    /// `[m, hidden]` f32: the final-norm output of every block position.
    pub last_hidden: Tensor,
}

struct Layer {
    attn_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    pre_ffn_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
    post_ffn_norm: Vec<f32>,
    sliding: bool,
}

/// A loaded Gemma 3 text model. Immutable and shareable across threads.
pub struct Gemma3 {
    cfg: GemmaConfig,
    head: TargetHead,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    rope_local: Rope,
    rope_global: Rope,
    precision: Precision,
    /// Rows' largest logits without all of them: `exact` precision with a Q8_0 head, no
    /// final soft-capping (which could tie distinct logits), and the CPU's screen kernel.
    screen: Option<ArgmaxScreen>,
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

    fn embed_into(&self, token: u32, row: &mut [f32]) -> Result<()> {
        self.head.embed_into(token, row)
    }

    /// The model's input embedding and output head, sharing its weights.
    pub fn head(&self) -> TargetHead {
        self.head.clone()
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|t| **t as usize >= self.cfg.vocab_size) {
            Some(t) => Err(GemmaError::Request(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// Runs `tokens` at positions `pos..pos+m`, appending their keys and values to `cache`
    /// (which must hold exactly `pos` positions).
    pub fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        // Run the whole forward on a pool worker: every matmul then starts on an awake
        // thread instead of waking the pool from outside (measured: ~3 ms of 12 per token).
        rayon::scope(|_| self.forward_inner(tokens, pos, cache, opts))
    }

    fn forward_inner(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        let m = tokens.len();
        if m == 0 {
            return Err(GemmaError::Request("empty block".into()));
        }
        self.check_tokens(tokens)?;
        if let Some(t) = opts.taps.iter().find(|t| **t > self.cfg.num_hidden_layers) {
            return Err(GemmaError::Request(format!(
                "tap {t} is out of range (the model has {} layers)",
                self.cfg.num_hidden_layers
            )));
        }
        cache.check_append(pos, m)?;
        let h = self.cfg.hidden_size;
        let mut x = vec![0f32; m * h];
        for (row, t) in x.chunks_exact_mut(h).zip(tokens) {
            self.embed_into(*t, row)?;
        }
        let mut taps: Vec<Option<Vec<f32>>> = vec![None; opts.taps.len()];
        let at = Positions {
            pos,
            local: self.rope_local.angles(pos, m),
            global: self.rope_global.angles(pos, m),
        };
        for (i, layer) in self.layers.iter().enumerate() {
            if let Err(e) = self.layer_forward(layer, i, &mut x, &at, cache) {
                cache.discard_uncommitted();
                return Err(e);
            }
            for (slot, t) in taps.iter_mut().zip(&opts.taps) {
                if *t == i {
                    *slot = Some(x.clone());
                }
            }
        }
        cache.commit(m);
        let eps = self.cfg.rms_norm_eps as f32;
        let normed = rms_norm(&x, &self.final_norm, eps);
        let (mut logits, mut top) = (None, None);
        match opts.logits {
            LogitsMode::All => logits = Some(self.logits(&normed, m)?),
            LogitsMode::Last => logits = Some(self.logits(&normed[(m - 1) * h..], 1)?),
            LogitsMode::Top(k) => match self.top(&normed, m, k)? {
                Some(rows) => top = Some(rows),
                None => logits = Some(self.logits(&normed, m)?),
            },
            LogitsMode::None => {}
        }
        let taps = taps
            .into_iter()
            .map(|t| Tensor::from_vec(t.unwrap_or_else(|| normed.clone()), (m, h), &Device::Cpu))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(ForwardOutput {
            logits,
            top,
            taps,
            last_hidden: Tensor::from_vec(normed, (m, h), &Device::Cpu)?,
        })
    }

    fn logits(&self, normed: &[f32], rows: usize) -> Result<Tensor> {
        let mut out = self.head.head().matmul(normed, rows)?;
        if let Some(cap) = self.cfg.final_logit_softcapping {
            softcap(&mut out, cap as f32);
        }
        Ok(Tensor::from_vec(
            out,
            (rows, self.cfg.vocab_size),
            &Device::Cpu,
        )?)
    }

    /// The logits that can rank among each row's `k` largest, through the screen for
    /// several rows (one row is bound by reading the head either way); `None` where the
    /// model has no screen.
    fn top(&self, normed: &[f32], rows: usize, k: usize) -> Result<Option<Vec<TopRow>>> {
        match (&self.screen, self.head.head().lanes(), rows) {
            (Some(screen), Some(w), 2..) => Ok(Some(screen.top_rows(w, normed, rows, k)?.rows)),
            _ => Ok(None),
        }
    }

    fn layer_forward(
        &self,
        l: &Layer,
        idx: usize,
        x: &mut [f32],
        at: &Positions,
        cache: &mut KvCache,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps as f32);
        let m = x.len() / h;
        let normed = rms_norm(x, &l.attn_norm, eps);
        let mut q = l.q.matmul(&normed, m)?;
        let mut k = l.k.matmul(&normed, m)?;
        let v = l.v.matmul(&normed, m)?;
        rms_norm_rows(&mut q, &l.q_norm, eps);
        rms_norm_rows(&mut k, &l.k_norm, eps);
        let angles = if l.sliding { &at.local } else { &at.global };
        for (r, (qr, kr)) in q
            .chunks_exact_mut(cfg.q_dim())
            .zip(k.chunks_exact_mut(cfg.kv_dim()))
            .enumerate()
        {
            angles.apply(qr, r);
            angles.apply(kr, r);
        }
        let kv = cache.layer_mut(idx);
        kv.k.extend_from_slice(&k);
        kv.v.extend_from_slice(&v);
        let spec = AttnSpec {
            pos0: at.pos,
            n_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads,
            head_dim: hd,
            scale: (cfg.query_pre_attn_scalar as f32).powf(-0.5),
            window: l.sliding.then_some(cfg.sliding_window),
            softcap: cfg.attn_logit_softcapping.map(|c| c as f32),
        };
        let attn = attend(&q, &kv.k, &kv.v, spec);
        let mut o = l.o.matmul(&attn, m)?;
        rms_norm_rows(&mut o, &l.post_attn_norm, eps);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

        let normed = rms_norm(x, &l.pre_ffn_norm, eps);
        let mut gate = l.gate.matmul(&normed, m)?;
        let up = l.up.matmul(&normed, m)?;
        gelu_tanh_mul(&mut gate, &up);
        let mut down = l.down.matmul(&gate, m)?;
        rms_norm_rows(&mut down, &l.post_ffn_norm, eps);
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

/// Where a forward's block sits: its first position and the rotary angles of its positions
/// for the sliding (local) and global layers, computed once for all layers.
struct Positions {
    pos: usize,
    local: RopeAngles,
    global: RopeAngles,
}
