//! Shared test helpers: a tiny random target head, tiny drafter configs and random taps.
#![allow(dead_code, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use tandem_dspark::{Dspark, DsparkConfig};
use tandem_gemma::{GemmaConfig, TargetHead};
use tandem_kernels::{QMatrix, QType};

pub const HIDDEN: usize = 16;
pub const VOCAB: usize = 64;
pub const LAYERS: usize = 4;

/// Deterministic pseudo-random numbers in [-1, 1).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

pub fn target_config() -> GemmaConfig {
    GemmaConfig {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 32,
        num_hidden_layers: LAYERS,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 8,
        query_pre_attn_scalar: 8.0,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_local_base_freq: 10_000.0,
        rope_scaling: None,
        sliding_window: 8,
        sliding_window_pattern: 6,
        layer_types: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: Some(30.0),
        max_position_embeddings: 4096,
        tie_word_embeddings: true,
        hidden_activation: "gelu_pytorch_tanh".into(),
        bos_token_id: 2,
        eos_token_id: vec![1],
    }
}

/// A tiny tied f32 target head with random weights.
pub fn tiny_head(seed: u64) -> TargetHead {
    let mut rng = Lcg::new(seed);
    let bytes = rng
        .vec(VOCAB * HIDDEN)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let embed = QMatrix::new(QType::F32, VOCAB, HIDDEN, bytes).expect("matrix");
    TargetHead::new(target_config(), Arc::new(embed), None).expect("head")
}

pub fn tiny_config() -> DsparkConfig {
    DsparkConfig {
        gamma: 4,
        d_draft: 16,
        n_layers: 2,
        n_heads: 4,
        markov_rank: 8,
        ff_mult: 2,
        tap_layers: vec![1, 3, LAYERS],
        draft_vocab: None,
    }
}

/// A tiny drafter whose Markov and confidence heads are non-zero (not the initial
/// state), so every term of the forward is exercised.
pub fn busy_drafter(cfg: DsparkConfig, head: &TargetHead, seed: u64) -> Dspark {
    let model = Dspark::init(cfg, head, seed).expect("init");
    let mut rng = Lcg::new(seed ^ 0xABCD);
    for (name, var) in model.vars() {
        if ["markov.w2", "conf.w", "conf.b"].contains(&name.as_str()) {
            let t = Tensor::from_vec(rng.vec(var.elem_count()), var.shape(), &Device::Cpu)
                .expect("tensor");
            var.set(&(t * 0.5).expect("scale")).expect("set");
        }
    }
    model
}

/// `n` random snapshot rows of `width` floats.
pub fn taps(rng: &mut Lcg, n: usize, width: usize) -> Vec<f32> {
    rng.vec(n * width)
}

/// Bit patterns of every parameter, by name.
pub fn param_bits(model: &Dspark) -> Vec<(String, Vec<u32>)> {
    model
        .vars()
        .into_iter()
        .map(|(n, v)| {
            let vals: Vec<f32> = v.flatten_all().expect("flat").to_vec1().expect("vec");
            (n, vals.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Folder of the fetched real models.
pub fn models_dir() -> PathBuf {
    std::env::var_os("TANDEM_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tandem/models")
        })
}

/// The real Gemma 3 270M GGUF; panics with instructions when it was not fetched.
pub fn real_gguf() -> PathBuf {
    let p = models_dir().join("gemma-3-270m/gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} missing: run scripts/fetch-models.sh first",
        p.display()
    );
    p
}
