//! The drafter's trainable parameters as candle `Var`s, their canonical names and shapes,
//! and the paper's initialisation (DSpark, arXiv 2607.05147, §3.3): normal(0, 0.02)
//! matrices, norms = 1, `W2 = 0` so training starts as pure parallel DFlash, and a zero
//! confidence head. Matrices are stored `[in, out]` and applied as `x · W`.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, Normal};

use crate::config::{DsparkConfig, TargetDims};
use crate::error::{DsparkError, Result};

/// Standard deviation of the initial matrices.
const INIT_STD: f32 = 0.02;

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Init {
    Normal,
    Ones,
    Zeros,
}

/// Parameters of one backbone layer.
pub(crate) struct LayerParams {
    pub attn_norm: Var,
    pub q: Var,
    pub k: Var,
    pub v: Var,
    pub o: Var,
    pub ff_norm: Var,
    pub gate: Var,
    pub up: Var,
    pub down: Var,
}

/// All parameters of a drafter.
pub(crate) struct Params {
    pub layers: Vec<LayerParams>,
    pub w_c: Var,
    pub ctx_norm: Var,
    pub tok_proj: Var,
    pub mask_emb: Var,
    pub block_pos: Var,
    pub out_norm: Var,
    pub out_proj: Var,
    pub markov_w1: Var,
    pub markov_w2: Var,
    pub conf_w: Var,
    pub conf_b: Var,
}

/// Name, shape and initialisation of every parameter, in canonical order.
fn specs(cfg: &DsparkConfig, dims: &TargetDims, vd: usize) -> Vec<(String, Vec<usize>, Init)> {
    let (d, r, h) = (cfg.d_draft, cfg.markov_rank, dims.hidden);
    let ff = cfg.ff_mult * d;
    let mut s = Vec::new();
    for i in 0..cfg.n_layers {
        let mut put =
            |leaf: &str, shape: Vec<usize>, init| s.push((format!("bb.{i}.{leaf}"), shape, init));
        put("attn_norm", vec![d], Init::Ones);
        for w in ["q", "k", "v", "o"] {
            put(w, vec![d, d], Init::Normal);
        }
        put("ff_norm", vec![d], Init::Ones);
        put("gate", vec![d, ff], Init::Normal);
        put("up", vec![d, ff], Init::Normal);
        put("down", vec![ff, d], Init::Normal);
    }
    let m_h = cfg.tap_layers.len() * h;
    let rest = [
        ("W_c", vec![m_h, d], Init::Normal),
        ("ctx_norm", vec![d], Init::Ones),
        ("tok_proj", vec![h, d], Init::Normal),
        ("mask_emb", vec![cfg.gamma - 1, d], Init::Normal),
        ("block_pos", vec![cfg.gamma, d], Init::Normal),
        ("out_norm", vec![d], Init::Ones),
        ("out_proj", vec![d, h], Init::Normal),
        ("markov.w1", vec![vd + 1, r], Init::Normal),
        ("markov.w2", vec![r, vd], Init::Zeros),
        ("conf.w", vec![d + r, 1], Init::Zeros),
        ("conf.b", vec![1], Init::Zeros),
    ];
    s.extend(rest.into_iter().map(|(n, sh, i)| (n.to_string(), sh, i)));
    s
}

/// `n` values drawn as a fresh matrix is initialised, reproducible from `seed`.
pub(crate) fn normal_values(n: usize, seed: u64) -> Result<Vec<f32>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let normal = Normal::new(0f32, INIT_STD)
        .map_err(|e| DsparkError::Config(format!("init distribution: {e}")))?;
    Ok((0..n).map(|_| normal.sample(&mut rng)).collect())
}

impl Params {
    /// Fresh parameters, reproducible from `seed`.
    pub fn init(cfg: &DsparkConfig, dims: &TargetDims, vd: usize, seed: u64) -> Result<Self> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let normal = Normal::new(0f32, INIT_STD)
            .map_err(|e| DsparkError::Config(format!("init distribution: {e}")))?;
        let mut vars = HashMap::new();
        for (name, shape, init) in specs(cfg, dims, vd) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match init {
                Init::Normal => (0..n).map(|_| normal.sample(&mut rng)).collect(),
                Init::Ones => vec![1.0; n],
                Init::Zeros => vec![0.0; n],
            };
            vars.insert(
                name,
                Var::from_tensor(&Tensor::from_vec(data, shape, &Device::Cpu)?)?,
            );
        }
        Self::assemble(cfg, vars)
    }

    /// Parameters from loaded tensors; every name must be present with its exact shape,
    /// stored in f32, f16 or bf16 (the narrower ones widened to f32 here).
    pub fn from_tensors(
        cfg: &DsparkConfig,
        dims: &TargetDims,
        vd: usize,
        mut tensors: HashMap<String, Tensor>,
    ) -> Result<Self> {
        let mut vars = HashMap::new();
        for (name, shape, _) in specs(cfg, dims, vd) {
            let t = tensors
                .remove(&name)
                .ok_or_else(|| DsparkError::Invalid(format!("parameter {name} is missing")))?;
            let stored = [DType::F32, DType::F16, DType::BF16].contains(&t.dtype());
            if t.dims() != shape.as_slice() || !stored {
                return Err(DsparkError::Invalid(format!(
                    "parameter {name} is {:?} {:?}, expected F32 (or F16, BF16) {shape:?}",
                    t.dtype(),
                    t.dims()
                )));
            }
            vars.insert(name, Var::from_tensor(&t.to_dtype(DType::F32)?)?);
        }
        if let Some(extra) = tensors.keys().next() {
            return Err(DsparkError::Invalid(format!(
                "unexpected parameter {extra}"
            )));
        }
        Self::assemble(cfg, vars)
    }

    fn assemble(cfg: &DsparkConfig, mut vars: HashMap<String, Var>) -> Result<Self> {
        let mut take = |name: String| {
            vars.remove(&name)
                .ok_or_else(|| DsparkError::Invalid(format!("parameter {name} is missing")))
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let mut leaf = |l: &str| take(format!("bb.{i}.{l}"));
                Ok(LayerParams {
                    attn_norm: leaf("attn_norm")?,
                    q: leaf("q")?,
                    k: leaf("k")?,
                    v: leaf("v")?,
                    o: leaf("o")?,
                    ff_norm: leaf("ff_norm")?,
                    gate: leaf("gate")?,
                    up: leaf("up")?,
                    down: leaf("down")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut top = |n: &str| take(n.to_string());
        Ok(Self {
            layers,
            w_c: top("W_c")?,
            ctx_norm: top("ctx_norm")?,
            tok_proj: top("tok_proj")?,
            mask_emb: top("mask_emb")?,
            block_pos: top("block_pos")?,
            out_norm: top("out_norm")?,
            out_proj: top("out_proj")?,
            markov_w1: top("markov.w1")?,
            markov_w2: top("markov.w2")?,
            conf_w: top("conf.w")?,
            conf_b: top("conf.b")?,
        })
    }

    /// Every parameter with its canonical name, in canonical order.
    pub fn named(&self) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let leaves = [
                ("attn_norm", &l.attn_norm),
                ("q", &l.q),
                ("k", &l.k),
                ("v", &l.v),
                ("o", &l.o),
                ("ff_norm", &l.ff_norm),
                ("gate", &l.gate),
                ("up", &l.up),
                ("down", &l.down),
            ];
            out.extend(leaves.map(|(n, v)| (format!("bb.{i}.{n}"), v.clone())));
        }
        let top = [
            ("W_c", &self.w_c),
            ("ctx_norm", &self.ctx_norm),
            ("tok_proj", &self.tok_proj),
            ("mask_emb", &self.mask_emb),
            ("block_pos", &self.block_pos),
            ("out_norm", &self.out_norm),
            ("out_proj", &self.out_proj),
            ("markov.w1", &self.markov_w1),
            ("markov.w2", &self.markov_w2),
            ("conf.w", &self.conf_w),
            ("conf.b", &self.conf_b),
        ];
        out.extend(top.map(|(n, v)| (n.to_string(), v.clone())));
        out
    }
}
