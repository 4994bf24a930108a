//! AdamW (Loshchilov & Hutter 2019; the update of `candle_nn::AdamW`, whose moments are
//! private) with global-norm gradient clipping, its moments exposed by name so a
//! checkpoint can store and restore them exactly, and the learning-rate schedule: linear
//! warm-up, then cosine decay to a floor.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator guard.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norms or biases).
    pub weight_decay: f64,
    /// Largest global gradient norm; larger gradients are scaled down (0 = no clipping).
    pub clip_norm: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
            clip_norm: 1.0,
        }
    }
}

/// Warm-up then cosine decay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub peak: f64,
    /// Steps of linear warm-up from `peak / warmup`.
    pub warmup: usize,
    /// Total steps; the rate reaches `floor · peak` at the last one.
    pub total: usize,
    /// Final rate as a fraction of the peak.
    pub floor: f64,
}

impl LrSchedule {
    /// The rate of step `step` (0-based).
    pub fn at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let t = ((step - self.warmup) as f64 / span).min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * t).cos());
        self.peak * (self.floor + (1.0 - self.floor) * cos)
    }
}

struct Slot {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
    decay: bool,
}

/// AdamW over named variables.
pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    step: usize,
}

impl AdamW {
    /// An optimizer over `vars` with zero moments.
    pub fn new(vars: Vec<(String, Var)>, cfg: AdamWConfig) -> Result<Self> {
        let slots = vars
            .into_iter()
            .map(|(name, var)| {
                let zeros = var.as_tensor().zeros_like()?;
                Ok(Slot {
                    decay: var.rank() >= 2,
                    name,
                    m: zeros.clone(),
                    v: zeros,
                    var,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg,
            slots,
            step: 0,
        })
    }

    /// Updates taken so far.
    pub fn steps(&self) -> usize {
        self.step
    }

    /// One update at learning rate `lr`; returns the global gradient norm before clipping.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<f64> {
        let mut sq = 0f64;
        for s in &self.slots {
            if let Some(g) = grads.get(s.var.as_tensor()) {
                sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
            }
        }
        let norm = sq.sqrt();
        let clip = match self.cfg.clip_norm > 0.0 && norm > self.cfg.clip_norm {
            true => self.cfg.clip_norm / norm,
            false => 1.0,
        };
        self.step += 1;
        let c = &self.cfg;
        let t = self.step as i32;
        let (scale_m, scale_v) = (1.0 / (1.0 - c.beta1.powi(t)), 1.0 / (1.0 - c.beta2.powi(t)));
        for s in &mut self.slots {
            let Some(g) = grads.get(s.var.as_tensor()) else {
                continue;
            };
            // Gradients carry the backward graph (and through it the step's activations);
            // moments built on them would chain every step's graph to the next one.
            let g = (g.detach() * clip)?;
            s.m = ((&s.m * c.beta1)? + (&g * (1.0 - c.beta1))?)?.detach();
            s.v = ((&s.v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?.detach();
            let update = ((&s.m * scale_m)? / ((&s.v * scale_v)?.sqrt()? + c.eps)?)?;
            let decay = if s.decay { lr * c.weight_decay } else { 0.0 };
            let theta = ((s.var.as_tensor() * (1.0 - decay))? - (update * lr)?)?;
            s.var.set(&theta)?;
        }
        Ok(norm)
    }

    /// The moments as `m.<name>` / `v.<name>` tensors.
    pub fn moments(&self) -> HashMap<String, Tensor> {
        self.slots
            .iter()
            .flat_map(|s| {
                [
                    (format!("m.{}", s.name), s.m.clone()),
                    (format!("v.{}", s.name), s.v.clone()),
                ]
            })
            .collect()
    }

    /// Restores moments saved by [`AdamW::moments`] after `steps` updates.
    pub fn restore(&mut self, mut moments: HashMap<String, Tensor>, steps: usize) -> Result<()> {
        for s in &mut self.slots {
            for (kind, slot) in [("m", &mut s.m), ("v", &mut s.v)] {
                let key = format!("{kind}.{}", s.name);
                let t = moments
                    .remove(&key)
                    .ok_or_else(|| TrainError::Invalid(format!("optimizer state lacks {key}")))?;
                if t.dims() != slot.dims() {
                    return Err(TrainError::Invalid(format!(
                        "optimizer state {key} is {:?}, expected {:?}",
                        t.dims(),
                        slot.dims()
                    )));
                }
                *slot = t;
            }
        }
        self.step = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let s = LrSchedule {
            peak: 1.0,
            warmup: 4,
            total: 14,
            floor: 0.1,
        };
        assert!((s.at(0) - 0.25).abs() < 1e-12);
        assert!((s.at(3) - 1.0).abs() < 1e-12);
        assert!((s.at(4) - 1.0).abs() < 1e-12);
        assert!((s.at(9) - 0.55).abs() < 1e-12);
        assert!((s.at(14) - 0.1).abs() < 1e-12);
        assert!(s.at(5) < s.at(4) && s.at(6) < s.at(5));
    }

    /// Moments must hold values only: built on the gradients' graph, each step's
    /// activations stayed alive through the next step's moments (a trainer grew by
    /// gigabytes per step).
    #[test]
    fn moments_do_not_keep_the_graph_alive() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &dev)?)?;
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            clip_norm: 1.0,
        };
        let mut opt = AdamW::new(vec![("w".into(), w.clone())], cfg)?;
        for _ in 0..2 {
            // d/dw of w·w is formed from w itself: a tracked gradient.
            let loss = (w.as_tensor() * w.as_tensor())?.sum_all()?;
            let grads = loss.backward()?;
            assert!(grads.get(w.as_tensor()).is_some_and(Tensor::track_op));
            opt.step(&grads, 0.1)?;
        }
        for (name, m) in opt.moments() {
            assert!(!m.track_op(), "{name} tracks the graph");
        }
        Ok(())
    }
}
