//! Paired A/B statistics for comparing two drafters on one target: the same prompts, seeds
//! and settings run through drafter A and drafter B, each prompt being the pairing unit, so
//! the per-prompt differences B − A cancel what makes one prompt easier or slower than
//! another. Means, sample standard deviations, Student-t confidence intervals on the mean
//! paired difference (the t quantile computed exactly for integer degrees of freedom), and
//! the adoption rule: B replaces A iff its mean acceptance drop is at most a bound in
//! percentage points and it is faster per generated token with 95 % confidence.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Confidence level of every interval.
pub const CONFIDENCE: f64 = 0.95;

/// Why a comparison cannot be made.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AbError {
    /// The arms have different numbers of prompts.
    #[error("arms differ in length: A has {a} prompts, B has {b}")]
    LengthMismatch {
        /// A's prompts.
        a: usize,
        /// B's prompts.
        b: usize,
    },
    /// Fewer than two pairs: no spread, no interval.
    #[error("a paired interval needs at least 2 prompts, got {0}")]
    TooFew(usize),
    /// A prompt (its index) decoded no timed token, or its time is not finite.
    #[error("prompt {0} has no timed token or a non-finite time")]
    Untimed(usize),
    /// The acceptance drop bound is negative or not finite.
    #[error("the acceptance drop bound must be finite and >= 0, got {0}")]
    BadBound(f64),
    /// A sample holds a NaN or an infinity.
    #[error("a value is not finite")]
    NotFinite,
}

/// What one arm did on one prompt (summed over repeats).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PromptRun {
    /// Draft blocks proposed.
    pub drafts: u64,
    /// Draft tokens proposed.
    pub drafted: u64,
    /// Draft tokens the target accepted.
    pub accepted: u64,
    /// Tokens decoded in the timed span.
    pub tokens: usize,
    /// Seconds of that span.
    pub secs: f64,
}

impl PromptRun {
    /// Accepted over drafted tokens (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Mean acceptance length τ = 1 + accepted / drafts (1 when nothing was drafted).
    pub fn tau(&self) -> f64 {
        1.0 + ratio(self.accepted, self.drafts)
    }

    /// Seconds per decoded token.
    pub fn s_per_token(&self) -> f64 {
        self.secs / self.tokens as f64
    }
}

fn ratio(num: u64, den: u64) -> f64 {
    match den {
        0 => 0.0,
        d => num as f64 / d as f64,
    }
}

/// One arm over all prompts: means of the per-prompt figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ArmSummary {
    /// Prompts run.
    pub prompts: usize,
    /// Mean per-prompt acceptance rate, in percent.
    pub acceptance_pct: f64,
    /// Mean per-prompt τ.
    pub tau: f64,
    /// Mean per-prompt seconds per decoded token.
    pub s_per_token: f64,
    /// Every decoded token over every second.
    pub tok_s: f64,
}

/// The mean of a sample with its confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Sample size.
    pub n: usize,
    /// Sample mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator).
    pub sd: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
}

/// A paired comparison of B against A and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Arm A.
    pub a: ArmSummary,
    /// Arm B.
    pub b: ArmSummary,
    /// B − A in acceptance rate, percentage points.
    pub acceptance_pts: Interval,
    /// B − A in seconds per decoded token (negative: B faster).
    pub s_per_token: Interval,
    /// A's mean seconds per token over B's (above 1: B faster).
    pub relative_speed: f64,
    /// The largest acceptance drop, in points, B may have and still be adopted.
    pub max_drop_pts: f64,
    /// Whether B is adopted.
    pub adopt: bool,
    /// The verdict in words.
    pub reason: String,
}

/// The arithmetic mean (NaN for an empty sample).
pub fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// The sample standard deviation (n − 1 in the denominator; 0 below two values).
pub fn sd(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let m = mean(x);
    let ss: f64 = x.iter().map(|v| (v - m) * (v - m)).sum();
    (ss / (x.len() - 1) as f64).sqrt()
}

/// P(|T| < t) for Student's t with `df` degrees of freedom (Abramowitz & Stegun 26.7.3–4,
/// exact for integer `df`).
fn two_sided_cdf(t: f64, df: u32) -> f64 {
    let theta = (t / f64::from(df).sqrt()).atan();
    let (s, c2) = (theta.sin(), theta.cos().powi(2));
    // The series 1 + a₁c² + a₂c⁴ + …, each coefficient the last times k / (k + 1).
    let series = |first: u32| {
        let (mut term, mut sum, mut k) = (1.0, 1.0, first);
        while k + 2 <= df {
            term *= f64::from(k) / f64::from(k + 1) * c2;
            sum += term;
            k += 2;
        }
        sum
    };
    if df.is_multiple_of(2) {
        s * series(1)
    } else if df == 1 {
        2.0 * theta / std::f64::consts::PI
    } else {
        2.0 / std::f64::consts::PI * (theta + s * theta.cos() * series(2))
    }
}

/// The `p` quantile (0.5 < p < 1) of Student's t with `df` ≥ 1 degrees of freedom, found by
/// bisection on the exact distribution function to about 1e-12.
pub fn t_quantile(p: f64, df: u32) -> f64 {
    assert!(df >= 1 && p > 0.5 && p < 1.0, "t_quantile({p}, {df})");
    let target = 2.0 * p - 1.0;
    let mut hi = 1.0;
    while two_sided_cdf(hi, df) < target {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    while hi - lo > 1e-12 * hi {
        let mid = 0.5 * (lo + hi);
        match two_sided_cdf(mid, df) < target {
            true => lo = mid,
            false => hi = mid,
        }
    }
    0.5 * (lo + hi)
}

/// The mean of `x` with its two-sided `confidence` Student-t interval.
pub fn mean_interval(x: &[f64], confidence: f64) -> Result<Interval, AbError> {
    if x.len() < 2 {
        return Err(AbError::TooFew(x.len()));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(AbError::NotFinite);
    }
    let (m, s) = (mean(x), sd(x));
    let df = u32::try_from(x.len() - 1).unwrap_or(u32::MAX);
    let half = t_quantile(0.5 + confidence / 2.0, df) * s / (x.len() as f64).sqrt();
    Ok(Interval {
        n: x.len(),
        mean: m,
        sd: s,
        low: m - half,
        high: m + half,
    })
}

/// The mean paired difference `b[i] − a[i]` with its 95 % interval.
pub fn paired(a: &[f64], b: &[f64]) -> Result<Interval, AbError> {
    if a.len() != b.len() {
        return Err(AbError::LengthMismatch {
            a: a.len(),
            b: b.len(),
        });
    }
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| y - x).collect();
    mean_interval(&d, CONFIDENCE)
}

/// The summary of one arm's runs.
pub fn summarize(runs: &[PromptRun]) -> ArmSummary {
    let per = |f: fn(&PromptRun) -> f64| mean(&runs.iter().map(f).collect::<Vec<_>>());
    let tokens: usize = runs.iter().map(|r| r.tokens).sum();
    let secs: f64 = runs.iter().map(|r| r.secs).sum();
    ArmSummary {
        prompts: runs.len(),
        acceptance_pct: 100.0 * per(PromptRun::acceptance),
        tau: per(PromptRun::tau),
        s_per_token: per(PromptRun::s_per_token),
        tok_s: tokens as f64 / secs,
    }
}

/// Compares B against A prompt by prompt and decides whether B is adopted: its mean
/// acceptance drop (A − B) is at most `max_drop_pts` points and the whole 95 % interval of
/// its time per token minus A's lies below 0.
pub fn compare(a: &[PromptRun], b: &[PromptRun], max_drop_pts: f64) -> Result<Comparison, AbError> {
    if !max_drop_pts.is_finite() || max_drop_pts < 0.0 {
        return Err(AbError::BadBound(max_drop_pts));
    }
    if a.len() != b.len() {
        return Err(AbError::LengthMismatch {
            a: a.len(),
            b: b.len(),
        });
    }
    if let Some(i) = a
        .iter()
        .chain(b)
        .position(|r| r.tokens == 0 || !r.secs.is_finite())
    {
        return Err(AbError::Untimed(i % a.len().max(1)));
    }
    let pct = |r: &[PromptRun]| -> Vec<f64> { r.iter().map(|x| 100.0 * x.acceptance()).collect() };
    let spt = |r: &[PromptRun]| -> Vec<f64> { r.iter().map(PromptRun::s_per_token).collect() };
    let acceptance_pts = paired(&pct(a), &pct(b))?;
    let s_per_token = paired(&spt(a), &spt(b))?;
    let (sa, sb) = (summarize(a), summarize(b));
    let drop = -acceptance_pts.mean;
    let ci = format!("[{:.3e}, {:.3e}] s", s_per_token.low, s_per_token.high);
    let (adopt, reason) = if drop > max_drop_pts {
        let why = format!("acceptance drops {drop:.2} points, more than {max_drop_pts}");
        (false, format!("reject B: {why}"))
    } else if s_per_token.high >= 0.0 {
        let why = format!("not faster with 95 % confidence (B − A per token in {ci})");
        (false, format!("reject B: {why}"))
    } else {
        let why = format!("acceptance drop {drop:.2} ≤ {max_drop_pts} points");
        (
            true,
            format!("adopt B: {why}, faster (B − A per token in {ci})"),
        )
    };
    Ok(Comparison {
        a: sa,
        b: sb,
        acceptance_pts,
        s_per_token,
        relative_speed: sa.s_per_token / sb.s_per_token,
        max_drop_pts,
        adopt,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(x: f64, y: f64, tol: f64) -> bool {
        (x - y).abs() <= tol
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        for (df, q) in [
            (1, 12.706_204_736),
            (2, 4.302_652_730),
            (3, 3.182_446_305),
            (4, 2.776_445_105),
            (5, 2.570_581_836),
            (10, 2.228_138_852),
            (30, 2.042_272_456),
            (100, 1.983_971_519),
        ] {
            let got = t_quantile(0.975, df);
            assert!(close(got, q, 1e-7), "df {df}: {got} vs {q}");
        }
        assert!(close(t_quantile(0.995, 1), 63.656_741_163, 1e-6));
        assert!(close(t_quantile(0.95, 7), 1.894_578_605, 1e-8));
        assert!(close(t_quantile(0.975, 100_000), 1.959_986, 1e-5));
    }

    #[test]
    fn textbook_interval() {
        // d = 1..5: mean 3, sd √2.5, se √0.5, t(0.975, 4) = 2.776445.
        let iv = mean_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95).expect("comparable");
        assert!(close(iv.mean, 3.0, 1e-12));
        assert!(close(iv.sd, 2.5f64.sqrt(), 1e-12));
        let half = 2.776_445_105 * 0.5f64.sqrt();
        assert!(close(iv.low, 3.0 - half, 1e-8) && close(iv.high, 3.0 + half, 1e-8));
        let p = paired(
            &[10.0, 10.0, 10.0, 10.0, 10.0],
            &[11.0, 12.0, 13.0, 14.0, 15.0],
        )
        .expect("comparable");
        assert!(close(p.low, iv.low, 1e-12) && close(p.high, iv.high, 1e-12));
    }

    fn run(accepted: u64, secs: f64) -> PromptRun {
        PromptRun {
            drafts: 25,
            drafted: 100,
            accepted,
            tokens: 100,
            secs,
        }
    }

    fn arm(accepted: u64, secs: &[f64]) -> Vec<PromptRun> {
        secs.iter().map(|&s| run(accepted, s)).collect()
    }

    #[test]
    fn per_prompt_figures() {
        let r = run(60, 2.0);
        assert!(close(r.acceptance(), 0.6, 1e-12) && close(r.tau(), 3.4, 1e-12));
        assert!(close(r.s_per_token(), 0.02, 1e-12));
        assert_eq!(PromptRun::default().acceptance(), 0.0);
        assert_eq!(PromptRun::default().tau(), 1.0);
    }

    #[test]
    fn clearly_faster_b_is_adopted() {
        let a = arm(60, &[2.0, 2.1, 1.9, 2.05]);
        let b = arm(60, &[1.5, 1.6, 1.4, 1.52]);
        let c = compare(&a, &b, 1.0).expect("comparable");
        assert!(c.adopt, "{}", c.reason);
        assert_eq!(c.acceptance_pts.mean, 0.0);
        assert!(c.s_per_token.high < 0.0 && c.relative_speed > 1.3);
        assert!(close(c.a.acceptance_pct, 60.0, 1e-9) && close(c.b.tau, 3.4, 1e-9));
    }

    #[test]
    fn slower_or_noisy_b_is_rejected() {
        let a = arm(60, &[2.0, 2.1, 1.9, 2.05]);
        let slower = compare(&a, &arm(60, &[2.5, 2.6, 2.4, 2.55]), 1.0).expect("comparable");
        assert!(!slower.adopt && slower.reason.contains("not faster"));
        // Faster on average, but the interval reaches above 0.
        let noisy = compare(&a, &arm(60, &[1.0, 3.0, 1.0, 2.9]), 1.0).expect("comparable");
        assert!(noisy.s_per_token.mean < 0.0 && !noisy.adopt);
    }

    #[test]
    fn an_acceptance_drop_beyond_the_bound_rejects_even_a_faster_b() {
        let a = arm(60, &[2.0, 2.1, 1.9, 2.05]);
        let b = arm(58, &[1.0, 1.1, 0.9, 1.05]);
        let c = compare(&a, &b, 1.0).expect("comparable");
        assert!(close(c.acceptance_pts.mean, -2.0, 1e-9));
        assert!(!c.adopt && c.reason.contains("acceptance drops"));
        assert!(compare(&a, &b, 2.5).expect("comparable").adopt);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let one = arm(60, &[2.0]);
        assert_eq!(compare(&one, &one, 1.0), Err(AbError::TooFew(1)));
        let two = arm(60, &[2.0, 2.0]);
        assert_eq!(
            compare(&two, &one, 1.0),
            Err(AbError::LengthMismatch { a: 2, b: 1 })
        );
        assert_eq!(compare(&two, &two, -1.0), Err(AbError::BadBound(-1.0)));
        let mut untimed = two.clone();
        untimed[1].tokens = 0;
        assert_eq!(compare(&two, &untimed, 1.0), Err(AbError::Untimed(1)));
    }

    fn sample() -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
        (2usize..20).prop_flat_map(|n| {
            (
                prop::collection::vec(-100.0f64..100.0, n),
                prop::collection::vec(-100.0f64..100.0, n),
            )
        })
    }

    proptest! {
        #[test]
        fn paired_interval_invariants((a, b) in sample(), shift in -50.0f64..50.0) {
            let ab = paired(&a, &b).expect("comparable");
            let ba = paired(&b, &a).expect("comparable");
            prop_assert!(close(ab.mean, -ba.mean, 1e-9));
            prop_assert!(close(ab.low, -ba.high, 1e-9));
            prop_assert!(ab.low <= ab.mean && ab.mean <= ab.high);
            let shifted: Vec<f64> = b.iter().map(|x| x + shift).collect();
            let s = paired(&a, &shifted).expect("comparable");
            prop_assert!(close(s.mean, ab.mean + shift, 1e-8));
            prop_assert!(close(s.low, ab.low + shift, 1e-6));
            prop_assert!(close(s.high, ab.high + shift, 1e-6));
        }

        #[test]
        fn quantiles_grow_with_p_and_shrink_with_df(df in 1u32..200, p in 0.55f64..0.999) {
            let q = t_quantile(p, df);
            prop_assert!(q > 0.0);
            prop_assert!(t_quantile(p + 0.0005, df) > q);
            prop_assert!(t_quantile(p, df + 1) < q);
            prop_assert!(close(two_sided_cdf(q, df), 2.0 * p - 1.0, 1e-9));
        }
    }
}
