//! Function-preserving growth of a trained drafter (Net2Net's identity layers, Chen et
//! al., arXiv 1511.05641): more backbone layers and a wider feed-forward whose new
//! weights start so that the grown drafter computes exactly what the trained one did. A
//! new layer's residual branches end in zero matrices (`o`, `down`), a widened
//! feed-forward's new units in zero rows of `down`; everything that feeds them starts as
//! [`Dspark::init`] starts it. Training the larger shape then begins from the smaller
//! one's skill instead of from scratch.

use std::collections::HashMap;

use candle_core::{Device, Tensor};

use crate::config::DsparkConfig;
use crate::error::{DsparkError, Result};
use crate::model::Dspark;
use crate::params::{normal_values, Params};

/// The shape a drafter grows to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Growth {
    /// Backbone layers (at least the current count; new ones are appended).
    pub layers: usize,
    /// FFN width as a multiple of `d_draft` (at least the current multiple).
    pub ff_mult: usize,
}

impl Dspark {
    /// This drafter grown to `to`, new weights drawn from `seed`. Every logit and
    /// confidence it produces is unchanged: new layers add exact zeros to the residual,
    /// a widened feed-forward adds zero terms to longer sums (equal up to their rounding).
    pub fn grown(&self, to: Growth, seed: u64) -> Result<Self> {
        let cfg = &self.cfg;
        if to.layers < cfg.n_layers || to.ff_mult < cfg.ff_mult {
            return Err(DsparkError::Config(format!(
                "a drafter of {} layers and ff_mult {} cannot shrink to {} and {}",
                cfg.n_layers, cfg.ff_mult, to.layers, to.ff_mult
            )));
        }
        let grown = DsparkConfig {
            n_layers: to.layers,
            ff_mult: to.ff_mult,
            ..cfg.clone()
        };
        grown.validate(&self.dims)?;
        let mut tensors = self.tensors_on(&Device::Cpu)?;
        let (d, ff) = (cfg.d_draft, cfg.ff_mult * cfg.d_draft);
        let ff_new = to.ff_mult * d;
        let mut fresh = Fresh { seed, drawn: 0 };
        for i in 0..to.layers {
            let name = |leaf: &str| format!("bb.{i}.{leaf}");
            if i >= cfg.n_layers {
                tensors.insert(name("attn_norm"), Tensor::ones(d, DTYPE, &Device::Cpu)?);
                tensors.insert(name("ff_norm"), Tensor::ones(d, DTYPE, &Device::Cpu)?);
                for w in ["q", "k", "v"] {
                    tensors.insert(name(w), fresh.normal(d, d)?);
                }
                tensors.insert(name("o"), Tensor::zeros((d, d), DTYPE, &Device::Cpu)?);
                tensors.insert(name("gate"), fresh.normal(d, ff_new)?);
                tensors.insert(name("up"), fresh.normal(d, ff_new)?);
                tensors.insert(
                    name("down"),
                    Tensor::zeros((ff_new, d), DTYPE, &Device::Cpu)?,
                );
                continue;
            }
            if ff_new == ff {
                continue;
            }
            for w in ["gate", "up"] {
                let old = take(&mut tensors, &name(w))?;
                let wider = Tensor::cat(&[&old, &fresh.normal(d, ff_new - ff)?], 1)?;
                tensors.insert(name(w), wider);
            }
            let old = take(&mut tensors, &name("down"))?;
            let zeros = Tensor::zeros((ff_new - ff, d), DTYPE, &Device::Cpu)?;
            tensors.insert(name("down"), Tensor::cat(&[&old, &zeros], 0)?);
        }
        Ok(Self {
            params: Params::from_tensors(&grown, &self.dims, self.vocab.len(), tensors)?,
            cfg: grown,
            dims: self.dims,
            target: self.target.clone(),
            vocab: self.vocab.clone(),
        })
    }
}

const DTYPE: candle_core::DType = candle_core::DType::F32;

fn take(tensors: &mut HashMap<String, Tensor>, name: &str) -> Result<Tensor> {
    tensors
        .remove(name)
        .ok_or_else(|| DsparkError::Invalid(format!("parameter {name} is missing")))
}

/// Fresh normal matrices, each drawn from its own seed derived from one.
struct Fresh {
    seed: u64,
    drawn: u64,
}

impl Fresh {
    fn normal(&mut self, rows: usize, cols: usize) -> Result<Tensor> {
        self.drawn += 1;
        let seed = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.drawn;
        let values = normal_values(rows * cols, seed)?;
        Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?)
    }
}
