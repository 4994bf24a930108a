//! The DSpark training loss (arXiv 2607.05147, §3.2) and a teacher-forced acceptance
//! estimate. Per block position `k` (1-based): `0.1·CE(t_k) + 0.9·TV(p_d, p_t) +
//! BCE(c_k, 1 − TV)` with the BCE target detached, weighted by `exp(−(k−1)/γ)`, averaged
//! over the unmasked positions of the batch by weight.
//!
//! The total variation may be taken at a sampling temperature `T` (both distributions
//! sharpened, `p^{1/T}` renormalised): a verifier sampling at `T` accepts a drafted token
//! with probability `1 − TV` of exactly those distributions (DistillSpec, arXiv 2310.08461,
//! picks the divergence by the decoding it serves). `T = 1` is the paper's loss.

use candle_core::{DType, Tensor, D};
use candle_nn::ops::{log_softmax, softmax_last_dim};
use tandem_dspark::TrainOutput;

use crate::batch::Targets;
use crate::error::Result;

/// Weight of the cross-entropy term.
pub const CE_WEIGHT: f64 = 0.1;
/// Weight of the total-variation term.
pub const TV_WEIGHT: f64 = 0.9;
/// Weight of the confidence term.
pub const BCE_WEIGHT: f64 = 1.0;

/// The loss of one batch: the differentiable total and its parts as numbers.
#[derive(Debug)]
pub struct Loss {
    /// Scalar total to differentiate.
    pub total: Tensor,
    /// Its value.
    pub value: f32,
    /// Weighted mean cross-entropy against the target tokens.
    pub ce: f32,
    /// Weighted mean total variation `½‖p_d − p_t‖₁`.
    pub tv: f32,
    /// Weighted mean binary cross-entropy of the confidences.
    pub bce: f32,
    /// Teacher-forced acceptance estimate of the batch (see [`expected_accepted`]).
    pub accepted: f32,
}

/// `[γ]` position weights `exp(−k/γ)`, `k = 0..γ`.
pub fn position_weights(gamma: usize) -> Vec<f32> {
    (0..gamma)
        .map(|k| (-(k as f32) / gamma as f32).exp())
        .collect()
}

/// The loss of `out` against `t`, its total variation at temperature `tv_temperature`.
pub fn loss(out: &TrainOutput, t: &Targets, tv_temperature: f64) -> Result<Loss> {
    let (a, g, _) = out.logits.dims3()?;
    let w = Tensor::from_vec(position_weights(g), (1, g), t.mask.device())?;
    let w = w.broadcast_mul(&t.mask)?;
    let norm = w.sum_all()?.to_scalar::<f32>()?.max(1e-12);
    let weighted = |x: &Tensor| -> Result<Tensor> { Ok(((x * &w)?.sum_all()? / f64::from(norm))?) };

    let logp = log_softmax(&out.logits, D::Minus1)?;
    let ce = logp
        .gather(&t.tokens.unsqueeze(D::Minus1)?, D::Minus1)?
        .squeeze(D::Minus1)?
        .neg()?;
    let (p_d, p_t) = if tv_temperature == 1.0 {
        (logp.exp()?, t.probs.clone())
    } else {
        (
            softmax_last_dim(&(&out.logits / tv_temperature)?)?,
            sharpened(&t.probs, tv_temperature)?,
        )
    };
    let tv = ((&p_d - &p_t)?.abs()?.sum(D::Minus1)? * 0.5)?;
    let y = (1.0 - tv.detach())?;
    let c = out.confidences.clamp(1e-6f32, 1.0 - 1e-6)?;
    let bce = ((&y * c.log()?)? + ((1.0 - &y)? * (1.0 - &c)?.log()?)?)?.neg()?;

    let (ce, tv, bce) = (weighted(&ce)?, weighted(&tv)?, weighted(&bce)?);
    let total = ((&ce * CE_WEIGHT)? + (&tv * TV_WEIGHT)? + (&bce * BCE_WEIGHT)?)?;
    let matches = out
        .logits
        .argmax(D::Minus1)?
        .eq(&t.tokens)?
        .to_dtype(DType::F32)?
        .mul(&t.mask)?;
    let accepted = expected_accepted(&matches.to_vec2::<f32>()?) / a.max(1) as f32;
    Ok(Loss {
        value: total.to_scalar::<f32>()?,
        ce: ce.to_scalar::<f32>()?,
        tv: tv.to_scalar::<f32>()?,
        bce: bce.to_scalar::<f32>()?,
        accepted,
        total,
    })
}

/// Distributions `probs` (last dimension) at temperature `temp`: `p^{1/T}` renormalised;
/// an all-zero row (a masked position) stays zero.
fn sharpened(probs: &Tensor, temp: f64) -> Result<Tensor> {
    let p = probs.powf(1.0 / temp)?;
    let z = p.sum_keepdim(D::Minus1)?.clamp(1e-30f32, f32::MAX)?;
    Ok(p.broadcast_div(&z)?)
}

/// Sum over blocks of the number of leading block positions whose greedy draft equals the
/// target token (`matches[a][k]` is 1 or 0): the tokens a greedy verifier would accept
/// under teacher forcing. Divide by the block count for a mean acceptance length − 1.
pub fn expected_accepted(matches: &[Vec<f32>]) -> f32 {
    matches
        .iter()
        .map(|row| row.iter().take_while(|m| **m > 0.5).count() as f32)
        .sum()
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// One block of two positions over four draft ids: drafter logits, target
    /// distributions (the second position masked, its row zero), tokens.
    fn case() -> (TrainOutput, Targets) {
        let dev = &Device::Cpu;
        let logits = [[1.0f32, 0.5, -0.5, -1.0], [0.0, 0.0, 0.0, 0.0]];
        let probs = [[0.4f32, 0.4, 0.15, 0.05], [0.0; 4]];
        let out = TrainOutput {
            logits: Tensor::new(&[logits], dev).expect("logits"),
            confidences: Tensor::new(&[[0.5f32, 0.5]], dev).expect("confidences"),
        };
        let t = Targets {
            tokens: Tensor::new(&[[1u32, 0]], dev).expect("tokens"),
            probs: Tensor::new(&[probs], dev).expect("probs"),
            mask: Tensor::new(&[[1f32, 0.0]], dev).expect("mask"),
        };
        (out, t)
    }

    /// `½ Σ |a − b|` of `a ∝ softmax(z / T)` and `b ∝ p^{1/T}`, in f64.
    fn tv_by_hand(z: &[f64], p: &[f64], temp: f64) -> f64 {
        let a: Vec<f64> = z.iter().map(|z| (z / temp).exp()).collect();
        let b: Vec<f64> = p.iter().map(|p| p.powf(1.0 / temp)).collect();
        let (za, zb) = (a.iter().sum::<f64>(), b.iter().sum::<f64>());
        a.iter()
            .zip(&b)
            .map(|(a, b)| (a / za - b / zb).abs())
            .sum::<f64>()
            / 2.0
    }

    #[test]
    fn total_variation_is_taken_at_the_asked_temperature() -> Result<()> {
        let (out, t) = case();
        let z = [1.0, 0.5, -0.5, -1.0];
        let p = [0.4, 0.4, 0.15, 0.05];
        for temp in [1.0, 0.7, 0.5] {
            let l = loss(&out, &t, temp)?;
            let want = tv_by_hand(&z, &p, temp);
            assert!(
                (f64::from(l.tv) - want).abs() < 1e-5,
                "T {temp}: {} vs {want}",
                l.tv
            );
            assert!(l.value.is_finite(), "the masked zero row gives no NaN");
        }
        // Sharpened, the drafter's single top id parts from the target's two tied ones.
        assert!(loss(&out, &t, 0.5)?.tv > loss(&out, &t, 1.0)?.tv + 0.05);
        Ok(())
    }
}
