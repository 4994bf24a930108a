//! The DSpark training loss (arXiv 2607.05147, §3.2) and a teacher-forced acceptance
//! estimate. Per block position `k` (1-based): `0.1·CE(t_k) + 0.9·TV(p_d, p_t) +
//! BCE(c_k, 1 − TV)` with the BCE target detached, weighted by `exp(−(k−1)/γ)`, averaged
//! over the unmasked positions of the batch by weight.

use candle_core::{DType, Tensor, D};
use candle_nn::ops::log_softmax;
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

/// The loss of `out` against `t`.
pub fn loss(out: &TrainOutput, t: &Targets) -> Result<Loss> {
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
    let p_d = logp.exp()?;
    let tv = ((&p_d - &t.probs)?.abs()?.sum(D::Minus1)? * 0.5)?;
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

/// Sum over blocks of the number of leading block positions whose greedy draft equals the
/// target token (`matches[a][k]` is 1 or 0): the tokens a greedy verifier would accept
/// under teacher forcing. Divide by the block count for a mean acceptance length − 1.
pub fn expected_accepted(matches: &[Vec<f32>]) -> f32 {
    matches
        .iter()
        .map(|row| row.iter().take_while(|m| **m > 0.5).count() as f32)
        .sum()
}
