//! Shared test helpers: a tiny random target head, tiny drafter configs and random taps.
#![allow(dead_code)]

use std::sync::Arc;

use candle_core::{Device, Tensor};
use tandem_dspark::{Dspark, DsparkConfig};
use tandem_gemma::testing::tiny_config as tiny_gemma;
use tandem_gemma::{GemmaConfig, TargetHead};
use tandem_kernels::{QMatrix, QType};
use tandem_testkit::{bits, Lcg};

pub const HIDDEN: usize = 16;
pub const VOCAB: usize = 64;
pub const LAYERS: usize = 4;

/// The target of the drafter tests: the tiny Gemma 3 of `tandem_gemma::testing`, narrower
/// and with 4 layers and a final logit softcap.
pub fn target_config() -> GemmaConfig {
    GemmaConfig {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 32,
        num_hidden_layers: LAYERS,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        sliding_window: 8,
        final_logit_softcapping: Some(30.0),
        ..tiny_gemma()
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
            (n, bits(&vals))
        })
        .collect()
}

/// The values of `model`'s parameter `name`, flattened.
pub fn param_values(model: &Dspark, name: &str) -> Vec<f32> {
    let var = model
        .vars()
        .into_iter()
        .find(|(n, _)| n == name)
        .expect("param")
        .1;
    var.flatten_all().expect("flat").to_vec1().expect("vec")
}
