//! Calibrating a drafter's confidences (Guo et al. 2017, "On Calibration of Modern Neural
//! Networks": temperature scaling; Zadrozny and Elkan 2002: isotonic regression by pool
//! adjacent violators). A drafter sends one confidence per drafted token; calibrated, it is
//! the probability that the token is accepted given that the tokens before it were, which
//! is what the verifier's block cuts and the batch scheduler need.
//!
//! Fitted per draft position, per source ([`DraftSource`]: the model's tokens and looked-up
//! ones behave differently) and per sampling regime (greedy, or the temperature sampled
//! at), from observed rounds of the real target. Each position takes temperature scaling
//! or isotonic regression, whichever has the lower Brier score under k-fold
//! cross-validation on the fitting rounds; positions with too few observations share the
//! map of the position before them. The result is plain data (serde), saved beside a
//! drafter and applied by its sessions.

use serde::{Deserialize, Serialize};

use crate::proposer::DraftSource;

/// Version of the saved calibration format.
pub const CALIBRATION_VERSION: u32 = 1;
/// Fewest observations a position needs for a map of its own.
pub const MIN_OBSERVATIONS: usize = 30;
/// Folds of the cross-validation that picks a position's method.
const FOLDS: usize = 5;
/// Confidences are clamped into `[CLAMP, 1 − CLAMP]` before taking their logit.
const CLAMP: f64 = 1e-4;

/// One drafted token and whether the verifier kept it (given it kept those before it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The confidence the drafter sent.
    pub confidence: f32,
    /// Whether the token was accepted.
    pub accepted: bool,
}

/// A map from a raw confidence to a calibrated one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum PositionMap {
    /// `σ(logit(c) / temperature)`.
    Temperature {
        /// The fitted temperature (> 0).
        temperature: f64,
    },
    /// Piecewise linear through the knots of an isotonic fit (increasing `x`, non-decreasing
    /// `y`), flat beyond the first and last knot.
    Isotonic {
        /// Raw confidences of the knots.
        x: Vec<f64>,
        /// Calibrated values at the knots.
        y: Vec<f64>,
    },
}

impl PositionMap {
    /// Checks a map read from a file: a finite temperature above 0, or as many knots `x` as
    /// `y`, all finite, `x` non-decreasing and `y` in `[0, 1]`.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Self::Temperature { temperature }
                if !(*temperature > 0.0 && temperature.is_finite()) =>
            {
                Err(format!(
                    "temperature {temperature} is not a finite value above 0"
                ))
            }
            Self::Isotonic { x, y } if x.len() != y.len() => {
                Err(format!("{} knots x for {} values y", x.len(), y.len()))
            }
            Self::Isotonic { x, y }
                if x.iter().any(|v| !v.is_finite()) || x.windows(2).any(|w| w[0] > w[1]) =>
            {
                Err("knots x are not finite and non-decreasing".into())
            }
            Self::Isotonic { y, .. } if y.iter().any(|v| !(0.0..=1.0).contains(v)) => {
                Err("values y are not all in [0, 1]".into())
            }
            _ => Ok(()),
        }
    }

    /// The calibrated confidence of raw confidence `c`.
    pub fn apply(&self, c: f32) -> f32 {
        let c = c as f64;
        let out = match self {
            Self::Temperature { temperature } => sigmoid(logit(c) / temperature),
            Self::Isotonic { x, y } => interpolate(x, y, c),
        };
        out as f32
    }
}

/// What was fitted at one draft position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionFit {
    /// The map.
    pub map: PositionMap,
    /// Observations it was fitted on (0 when it is the previous position's).
    pub observations: usize,
}

/// The maps of one source's draft positions (index 0: the first drafted token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFit {
    /// `model` or `lookup` ([`DraftSource::as_str`]).
    pub source: String,
    /// One map per position; positions past the end use the last one.
    pub positions: Vec<PositionFit>,
}

/// The maps of one sampling regime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Regime {
    /// 0 for greedy decoding, else the temperature the rounds were sampled at.
    pub temperature: f32,
    /// Per source.
    pub sources: Vec<SourceFit>,
}

/// A drafter's calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// [`CALIBRATION_VERSION`].
    pub version: u32,
    /// Per sampling regime.
    pub regimes: Vec<Regime>,
}

impl Calibration {
    /// Reads a saved calibration; the error says what is wrong, e.g. another version or a
    /// map that is not one ([`PositionMap::check`]).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let c: Calibration = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if c.version != CALIBRATION_VERSION {
            return Err(format!(
                "calibration v{} is not v{CALIBRATION_VERSION}: run tandem calibrate again",
                c.version
            ));
        }
        for (r, s) in c
            .regimes
            .iter()
            .flat_map(|r| r.sources.iter().map(move |s| (r, s)))
        {
            for (i, p) in s.positions.iter().enumerate() {
                p.map.check().map_err(|e| {
                    format!("{} map {i} at temperature {}: {e}", s.source, r.temperature)
                })?;
            }
        }
        Ok(c)
    }

    /// The calibration as saved (pretty JSON).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The regime for requests sampled at `temperature`: the greedy one for greedy
    /// requests, the sampled one of nearest temperature otherwise; none if that kind was not
    /// fitted.
    pub fn regime(&self, temperature: f32) -> Option<&Regime> {
        let greedy = temperature <= 0.0;
        self.regimes
            .iter()
            .filter(|r| (r.temperature <= 0.0) == greedy)
            .min_by(|a, b| {
                let d = |r: &Regime| (r.temperature - temperature).abs();
                d(a).total_cmp(&d(b))
            })
    }
}

impl Regime {
    /// Calibrates `confidences` of a block drafted by `source` in place; false (and left
    /// as they are) when that source was not fitted.
    pub fn apply(&self, source: DraftSource, confidences: &mut [f32]) -> bool {
        let Some(fit) = self.sources.iter().find(|s| s.source == source.as_str()) else {
            return false;
        };
        let Some(last) = fit.positions.last() else {
            return false;
        };
        for (i, c) in confidences.iter_mut().enumerate() {
            *c = fit.positions.get(i).unwrap_or(last).map.apply(*c);
        }
        true
    }
}

/// Fits one source's positions: `by_position[i]` holds the observations of position `i`.
/// Positions with fewer than [`MIN_OBSERVATIONS`] take the map of the position before
/// them; the fit stops before the first such position when no position has a map yet.
pub fn fit_source(source: DraftSource, by_position: &[Vec<Observation>]) -> SourceFit {
    let mut positions: Vec<PositionFit> = Vec::new();
    for obs in by_position {
        let fit = match (obs.len() >= MIN_OBSERVATIONS, positions.last()) {
            (true, _) => PositionFit {
                map: fit_position(obs),
                observations: obs.len(),
            },
            (false, Some(prev)) => PositionFit {
                map: prev.map.clone(),
                observations: 0,
            },
            (false, None) => break,
        };
        positions.push(fit);
    }
    SourceFit {
        source: source.as_str().into(),
        positions,
    }
}

/// The better of temperature scaling and isotonic regression for `obs`, by the Brier
/// score of [`FOLDS`]-fold cross-validation (folds by index, so deterministic).
pub fn fit_position(obs: &[Observation]) -> PositionMap {
    let score = |fit: fn(&[Observation]) -> PositionMap| -> f64 {
        (0..FOLDS)
            .map(|k| {
                let train: Vec<Observation> = (0..obs.len())
                    .filter(|i| i % FOLDS != k)
                    .map(|i| obs[i])
                    .collect();
                let held: Vec<Observation> = obs.iter().skip(k).step_by(FOLDS).copied().collect();
                brier(&fit(&train), &held) * held.len() as f64
            })
            .sum()
    };
    match score(fit_isotonic) < score(fit_temperature) {
        true => fit_isotonic(obs),
        false => fit_temperature(obs),
    }
}

/// Temperature scaling: the temperature minimising the log loss, by golden-section
/// search over `ln T` in [ln 0.05, ln 20].
pub fn fit_temperature(obs: &[Observation]) -> PositionMap {
    let loss = |ln_t: f64| {
        let map = PositionMap::Temperature {
            temperature: ln_t.exp(),
        };
        log_loss(&map, obs)
    };
    let (mut lo, mut hi) = (0.05f64.ln(), 20f64.ln());
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..80 {
        let (a, b) = (hi - phi * (hi - lo), lo + phi * (hi - lo));
        match loss(a) < loss(b) {
            true => hi = b,
            false => lo = a,
        }
    }
    PositionMap::Temperature {
        temperature: ((lo + hi) / 2.0).exp(),
    }
}

/// Isotonic regression by pool adjacent violators over the observations sorted by
/// confidence; each pooled block becomes a knot at its mean confidence and mean outcome.
pub fn fit_isotonic(obs: &[Observation]) -> PositionMap {
    let mut sorted: Vec<(f64, f64)> = obs
        .iter()
        .map(|o| (o.confidence as f64, f64::from(u8::from(o.accepted))))
        .collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Blocks of (sum of x, sum of y, count); equal confidences start in one block.
    let mut blocks: Vec<(f64, f64, f64)> = Vec::new();
    for (x, y) in sorted {
        match blocks.last_mut() {
            Some(b) if b.0 / b.2 == x => *b = (b.0 + x, b.1 + y, b.2 + 1.0),
            _ => blocks.push((x, y, 1.0)),
        }
        while blocks.len() > 1 {
            let (b, a) = (blocks[blocks.len() - 1], blocks[blocks.len() - 2]);
            if a.1 / a.2 < b.1 / b.2 {
                break;
            }
            blocks.pop();
            *blocks.last_mut().expect("two blocks") = (a.0 + b.0, a.1 + b.1, a.2 + b.2);
        }
    }
    let (x, y) = blocks.iter().map(|(sx, sy, n)| (sx / n, sy / n)).unzip();
    PositionMap::Isotonic { x, y }
}

/// Expected calibration error over `bins` equal-width bins of the confidences `conf`:
/// `Σ_b (n_b / N) · |mean outcome_b − mean confidence_b|`.
pub fn ece(pairs: impl IntoIterator<Item = (f32, bool)>, bins: usize) -> f64 {
    let (mut sum_c, mut sum_a, mut n) = (vec![0f64; bins], vec![0f64; bins], vec![0f64; bins]);
    for (c, a) in pairs {
        let b = ((c as f64 * bins as f64) as usize).min(bins - 1);
        sum_c[b] += c as f64;
        sum_a[b] += f64::from(u8::from(a));
        n[b] += 1.0;
    }
    let total: f64 = n.iter().sum();
    (0..bins)
        .filter(|b| n[*b] > 0.0)
        .map(|b| (sum_a[b] - sum_c[b]).abs() / total.max(1.0))
        .fold(0.0, |acc, x| acc + x)
}

/// Mean squared error of the calibrated confidences of `obs`.
pub fn brier(map: &PositionMap, obs: &[Observation]) -> f64 {
    let sq: f64 = obs
        .iter()
        .map(|o| (map.apply(o.confidence) as f64 - f64::from(u8::from(o.accepted))).powi(2))
        .sum();
    sq / obs.len().max(1) as f64
}

fn log_loss(map: &PositionMap, obs: &[Observation]) -> f64 {
    obs.iter()
        .map(|o| {
            let p = (map.apply(o.confidence) as f64).clamp(CLAMP, 1.0 - CLAMP);
            -match o.accepted {
                true => p.ln(),
                false => (1.0 - p).ln(),
            }
        })
        .sum()
}

fn logit(c: f64) -> f64 {
    let c = c.clamp(CLAMP, 1.0 - CLAMP);
    (c / (1.0 - c)).ln()
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Linear interpolation through knots `(x, y)`, flat outside them.
fn interpolate(x: &[f64], y: &[f64], c: f64) -> f64 {
    let (Some(first), Some(last)) = (x.first(), x.last()) else {
        return c;
    };
    if c.is_nan() {
        return c;
    }
    if c <= *first {
        return y[0];
    }
    if c >= *last {
        return y[y.len() - 1];
    }
    let i = x.partition_point(|k| *k <= c);
    let (x0, x1, y0, y1) = (x[i - 1], x[i], y[i - 1], y[i]);
    match x1 > x0 {
        true => y0 + (y1 - y0) * (c - x0) / (x1 - x0),
        false => y1,
    }
}

#[cfg(test)]
mod tests;
