//! Adaptive draft length. Each round drafts the γ that maximises the expected tokens per
//! unit of time given what the generation has measured so far (Leviathan et al. 2023, §3.5,
//! with per-position acceptance rates instead of one α):
//!
//! `E(γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} p_i`, `cost(γ) = verify(γ + 1) + [γ > 0]·draft`,
//!
//! in units of a one-token target forward, `verify(b) = 1 + slope·(b − 1)` (the slope and
//! the draft cost are learnt from the rounds' timings once a plain round has measured a
//! one-token forward; until then the configured priors stand). A generation that neither
//! measured nor inherited a one-token forward makes its second round a plain one to time
//! it: the slope prior is a CPU figure (a 9-token verify ≈ 3.4 steps), and where a step is
//! launch-bound (the H200: ≈ 1.3 steps) it would keep blocks short. `γ = 0` is a
//! plain round, so speculation that does not pay turns itself off; after `probe_every`
//! plain rounds a one-token draft measures the drafter again, and each probe after which
//! drafting still does not pay doubles the wait before the next (up to
//! [`MAX_PROBE_BACKOFF`] times `probe_every`): a probe costs a drafter call and a verify,
//! which where drafting keeps losing is all it buys (a round trip and, on a CPU target
//! sampling, full rows of logits). Acceptance rates are estimated
//! from exponentially decayed counts under a prior that expects each position to do as well
//! as the one before it (and the first to be accepted 2 times in 3, so a new generation
//! starts by drafting).
//! A new generation can start from what earlier ones of the same kind learnt ([`Learnt`],
//! at most [`CARRIED_ROUNDS`] rounds' worth, so it still adapts to its own text quickly);
//! it hands on only what it observed itself, so evidence is never counted twice and
//! generations that draft nothing let the memory fade.
//! Which γ a round uses never changes what is generated (each round is lossless on its own).

/// Prior acceptance rate of the first draft position (optimistic, so that a new generation
/// starts by drafting).
const PRIOR_FIRST: f64 = 2.0 / 3.0;
/// Weight, in rounds, of each position's prior.
const PRIOR_WEIGHT: f64 = 3.0;

/// A round's timing counts at most this many times what the policy expected of it. One-off
/// costs (a kernel compiled or a CUDA graph captured on first use, a page fault, a
/// preempted thread) would otherwise stand for dozens of rounds in the decayed means: on an
/// H100 the first drafted round of a process took 60 ms against 0.5 ms after, and the
/// policy then judged drafting too dear for the rest of every generation. A cost that truly
/// rose still gets through, by this factor per round.
pub const SPIKE: f64 = 4.0;

/// Accepted probes a generation may hope for ([`GammaPolicy::hopeful_survival`]).
pub const HOPE: f64 = 2.0;

/// Most times `probe_every` a generation whose probes keep failing waits between them.
pub const MAX_PROBE_BACKOFF: usize = 8;

/// Most rounds of evidence a generation hands on to the next (see [`Learnt`]).
pub const CARRIED_ROUNDS: f64 = 8.0;

/// What generations learnt about their drafter: decayed acceptance counts per draft
/// position and the measured costs. Made by [`GammaPolicy::learnt`], combined by
/// [`Learnt::absorb`], and the starting point of [`GammaPolicy::with_learnt`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learnt {
    accepted: Vec<f64>,
    drafted: Vec<f64>,
    draft_cost: Option<f64>,
    step_s: Option<f64>,
    extra_s: Option<f64>,
}

impl Learnt {
    /// Folds in a newer generation's figures: older counts weigh half, timings measured by
    /// the newer one replace the older ones, and the total stays within
    /// [`CARRIED_ROUNDS`].
    pub fn absorb(&mut self, newer: Learnt) {
        let n = self.drafted.len().max(newer.drafted.len());
        for (old, new) in [
            (&mut self.accepted, &newer.accepted),
            (&mut self.drafted, &newer.drafted),
        ] {
            old.resize(n, 0.0);
            old.iter_mut().for_each(|c| *c *= 0.5);
            old.iter_mut().zip(new).for_each(|(c, x)| *c += x);
        }
        self.draft_cost = newer.draft_cost.or(self.draft_cost);
        self.step_s = newer.step_s.or(self.step_s);
        self.extra_s = newer.extra_s.or(self.extra_s);
        self.cap();
    }

    /// Scales the counts down to at most [`CARRIED_ROUNDS`] judged first positions.
    fn cap(&mut self) {
        let first = self.drafted.first().copied().unwrap_or(0.0);
        if first > CARRIED_ROUNDS {
            let f = CARRIED_ROUNDS / first;
            self.accepted.iter_mut().for_each(|c| *c *= f);
            self.drafted.iter_mut().for_each(|c| *c *= f);
        }
    }
}

/// Settings of a [`GammaPolicy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GammaPolicyConfig {
    /// The largest γ (the request's, capped by the drafter's).
    pub max_gamma: usize,
    /// Extra cost of each verified token beyond the first, in one-token forwards (measured
    /// here: a 9-token verify costs about 3.4 decode steps on a 2-core CPU, so ≈ 0.3).
    pub verify_slope: f64,
    /// Draft cost per round, in one-token forwards, before any round has measured it.
    pub draft_cost: f64,
    /// Weight kept by old observations at each new round (1 = never forget).
    pub decay: f64,
    /// Plain rounds between one-token probes of the drafter.
    pub probe_every: usize,
}

impl GammaPolicyConfig {
    /// Defaults for `max_gamma` (CPU figures of this repository).
    pub fn new(max_gamma: usize) -> Self {
        Self {
            max_gamma,
            verify_slope: 0.3,
            draft_cost: 0.2,
            decay: 0.95,
            probe_every: 16,
        }
    }
}

/// One round as a [`GammaPolicy`] learns from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed<'a> {
    /// Drafted tokens verified (the block, less any cut; 0 for a plain round).
    pub verified: usize,
    /// Of those, accepted.
    pub accepted: usize,
    /// The calibrated confidences of the tokens cut after the verified ones.
    pub cut: &'a [f32],
    /// Seconds spent drafting.
    pub draft_s: f64,
    /// Seconds spent verifying.
    pub verify_s: f64,
}

/// Per-generation draft-length controller.
#[derive(Debug, Clone)]
pub struct GammaPolicy {
    cfg: GammaPolicyConfig,
    /// Decayed counts of accepted and drafted tokens at each draft position (inherited
    /// ones included).
    accepted: Vec<f64>,
    drafted: Vec<f64>,
    /// The part of those counts this generation observed itself (what it hands on).
    own_accepted: Vec<f64>,
    own_drafted: Vec<f64>,
    /// Draft cost per round, in one-token forwards (learnt once `step_s` is known).
    draft_cost: f64,
    /// Decayed mean seconds of a plain round's one-token forward.
    step_s: Option<f64>,
    /// Decayed mean seconds each drafted token adds to a verify.
    extra_s: Option<f64>,
    /// Decayed mean seconds of the generation's own work per verified row (its
    /// distribution made and drawn from), once a round was timed.
    row_s: Option<f64>,
    /// Plain rounds since the last drafted round.
    plain_rounds: usize,
    /// Plain rounds before the next probe: `probe_every`, doubled by each probe after
    /// which drafting did not pay.
    probe_wait: usize,
    /// Whether a plain round was recorded (timed or not).
    timed_plain: bool,
}

impl GammaPolicy {
    /// A controller; the slope and costs must be finite and non-negative, the decay in
    /// (0, 1].
    pub fn new(cfg: GammaPolicyConfig) -> Result<Self, String> {
        let finite = |x: f64| x.is_finite() && x >= 0.0;
        if !finite(cfg.verify_slope) || !finite(cfg.draft_cost) {
            return Err("verify slope and draft cost must be finite and non-negative".into());
        }
        if !(cfg.decay > 0.0 && cfg.decay <= 1.0) {
            return Err(format!("decay {} is outside (0, 1]", cfg.decay));
        }
        Ok(Self {
            accepted: vec![0.0; cfg.max_gamma],
            drafted: vec![0.0; cfg.max_gamma],
            own_accepted: vec![0.0; cfg.max_gamma],
            own_drafted: vec![0.0; cfg.max_gamma],
            draft_cost: cfg.draft_cost,
            step_s: None,
            extra_s: None,
            row_s: None,
            plain_rounds: 0,
            probe_wait: cfg.probe_every,
            timed_plain: false,
            cfg,
        })
    }

    /// A controller that starts from what earlier generations learnt instead of the
    /// configured priors (counts beyond `max_gamma` are dropped).
    pub fn with_learnt(cfg: GammaPolicyConfig, learnt: &Learnt) -> Result<Self, String> {
        let mut p = Self::new(cfg)?;
        for (mine, theirs) in [
            (&mut p.accepted, &learnt.accepted),
            (&mut p.drafted, &learnt.drafted),
        ] {
            mine.iter_mut().zip(theirs).for_each(|(m, t)| *m = *t);
        }
        p.draft_cost = learnt.draft_cost.unwrap_or(p.draft_cost);
        p.step_s = learnt.step_s;
        p.extra_s = learnt.extra_s;
        Ok(p)
    }

    /// What this generation observed itself (not what it inherited, which the memory
    /// already holds), capped at [`CARRIED_ROUNDS`] rounds of evidence, with the timings
    /// it knows.
    pub fn learnt(&self) -> Learnt {
        let mut l = Learnt {
            accepted: self.own_accepted.clone(),
            drafted: self.own_drafted.clone(),
            draft_cost: (self.own_drafted.first() > Some(&0.0)).then_some(self.draft_cost),
            step_s: self.step_s,
            extra_s: self.extra_s,
        };
        l.cap();
        l
    }

    /// Estimated probability that draft position `k` (1-based) is accepted, given that the
    /// positions before it were: the decayed counts of position `k` over a prior of weight
    /// [`PRIOR_WEIGHT`] centred on the estimate of position `k − 1` (2/3 for the first), so
    /// that positions never reached are expected to do as well as the last one measured.
    pub fn acceptance(&self, k: usize) -> f64 {
        self.acceptances().nth(k - 1).unwrap_or(PRIOR_FIRST)
    }

    /// [`GammaPolicy::acceptance`] of positions `1..=max_gamma`, each from the one before.
    pub fn acceptances(&self) -> impl Iterator<Item = f64> + '_ {
        self.rates(0.0)
    }

    /// The acceptance estimates had `hope` more one-token drafts been accepted (the later
    /// positions follow the first through their priors).
    fn rates(&self, hope: f64) -> impl Iterator<Item = f64> + '_ {
        let counts = self.accepted.iter().zip(&self.drafted);
        let hopes = std::iter::once(hope).chain(std::iter::repeat(0.0));
        counts.zip(hopes).scan(PRIOR_FIRST, |prior, ((a, n), h)| {
            *prior = (a + h + PRIOR_WEIGHT * *prior) / (n + h + PRIOR_WEIGHT);
            Some(*prior)
        })
    }

    /// The probability that draft positions `1..=max_gamma` all survive up to each
    /// ([`crate::schedule::survivals`] of the acceptance estimates).
    pub fn survival(&self) -> Vec<f64> {
        crate::schedule::survivals(&self.acceptances().collect::<Vec<_>>())
    }

    /// [`GammaPolicy::survival`] as it would stand had the next [`HOPE`] probes (one-token
    /// drafts) been accepted: the most a probe or two could show. Where drafts this good would
    /// still not be given a length, a probe cannot change what the generation does and
    /// only costs its round (a drafter call, and on a CPU target full rows).
    pub fn hopeful_survival(&self) -> Vec<f64> {
        crate::schedule::survivals(&self.rates(HOPE).collect::<Vec<_>>())
    }

    /// Whether enough plain rounds passed that a one-token draft should measure the drafter
    /// again, for a generation sharing steps with `sessions − 1` others (a probe delays
    /// all of them, so each probes that many times less often).
    pub fn probe_due(&self, sessions: usize) -> bool {
        self.plain_rounds >= self.probe_wait * sessions.max(1)
    }

    /// Plain rounds a probe waits for now (alone; [`GammaPolicy::probe_due`]).
    pub fn probe_wait(&self) -> usize {
        self.probe_wait
    }

    /// `E(0), E(1), …, E(max_gamma)`: expected tokens of a round drafting each γ.
    fn expected(&self) -> impl Iterator<Item = f64> + '_ {
        let tail = self.acceptances().scan((1.0, 1.0), |(reach, total), p| {
            *reach *= p;
            *total += *reach;
            Some(*total)
        });
        std::iter::once(1.0).chain(tail)
    }

    /// Expected tokens emitted by a round drafting `gamma` tokens.
    pub fn expected_tokens(&self, gamma: usize) -> f64 {
        self.expected()
            .nth(gamma.min(self.cfg.max_gamma))
            .unwrap_or(1.0)
    }

    /// Extra verify cost per drafted token, in one-token forwards.
    pub fn verify_slope(&self) -> f64 {
        match (self.step_s, self.extra_s) {
            (Some(step), Some(extra)) if step > 0.0 => extra / step,
            _ => self.cfg.verify_slope,
        }
    }

    /// Draft cost per round, in one-token forwards (learnt, or the configured prior).
    pub fn draft_cost(&self) -> f64 {
        self.draft_cost
    }

    /// Seconds of drafting per round: the draft cost in units of this generation's own
    /// one-token forward where it has timed one (in a batch, the wait for a shared step),
    /// of `step_s` otherwise.
    pub fn draft_seconds(&self, step_s: f64) -> f64 {
        self.draft_cost * self.step_s.unwrap_or(step_s)
    }

    /// Takes in the seconds a round's verification of `rows` rows took on the generation's
    /// own thread (after the forward).
    pub fn verify_work(&mut self, seconds: f64, rows: usize) {
        if rows > 0 && seconds.is_finite() && seconds >= 0.0 {
            self.row_s = ema(self.cfg.decay, self.row_s, seconds / rows as f64);
        }
    }

    /// Seconds of the generation's own work per verified row (0 before any was timed).
    pub fn row_seconds(&self) -> f64 {
        self.row_s.unwrap_or(0.0)
    }

    /// Cost of a round drafting `gamma` tokens, in one-token forwards.
    pub fn cost(&self, gamma: usize) -> f64 {
        let draft = if gamma > 0 { self.draft_cost } else { 0.0 };
        1.0 + self.verify_slope() * gamma as f64 + draft
    }

    /// The γ of the next round.
    pub fn choose(&self) -> usize {
        if self.cfg.max_gamma == 0 || self.needs_step_timing() {
            return 0;
        }
        match self.best() {
            0 if self.probe_due(1) => 1,
            g => g,
        }
    }

    /// The γ that maximises expected tokens per unit of cost (0: a plain round).
    fn best(&self) -> usize {
        let rates = self
            .expected()
            .enumerate()
            .map(|(g, e)| (g, e / self.cost(g)));
        rates
            .fold((0, f64::NEG_INFINITY), |b, r| if r.1 > b.1 { r } else { b })
            .0
    }

    /// Whether the next round should be plain to time a one-token forward: drafting has
    /// begun, and no plain round was recorded here nor a step time inherited.
    fn needs_step_timing(&self) -> bool {
        self.step_s.is_none() && !self.timed_plain && self.drafted.first() > Some(&0.0)
    }

    /// Records a round: `drafted` tokens of which the first `accepted` were accepted, the
    /// seconds spent drafting and verifying.
    pub fn record(&mut self, drafted: usize, accepted: usize, draft_s: f64, verify_s: f64) {
        self.observe(&Observed {
            verified: drafted,
            accepted,
            cut: &[],
            draft_s,
            verify_s,
        });
    }

    /// Records a round, its block possibly cut before verification ([`crate::cut`]). The
    /// verified positions count as in [`GammaPolicy::record`]; when every verified token
    /// was accepted, each cut position counts in expectation, by the calibrated
    /// confidences it was cut on: reached with the survival of the cut tokens before it,
    /// accepted with its own confidence on top. So the rates stay those of whole drafted
    /// blocks (what choosing γ before drafting needs), neither inflated by the confident
    /// tokens the cuts let through nor deflated by counting every cut token as rejected.
    /// The verify time is per verified token.
    pub fn observe(&mut self, round: &Observed<'_>) {
        let Observed {
            verified,
            accepted,
            cut,
            draft_s,
            verify_s,
        } = *round;
        let d = self.cfg.decay;
        let timed = verify_s.is_finite() && verify_s > 0.0 && draft_s.is_finite() && draft_s >= 0.0;
        let drafted = (verified + cut.len()).min(self.cfg.max_gamma);
        let verified = verified.min(drafted);
        let accepted = accepted.min(verified);
        if drafted == 0 {
            self.plain_rounds += 1;
            self.timed_plain = true;
            if timed {
                self.step_s = step_ema(d, self.step_s, verify_s);
            }
            return;
        }
        let probed = self.plain_rounds >= self.probe_wait;
        self.plain_rounds = 0;
        for (accepted_k, drafted_k) in [
            (&mut self.accepted, &mut self.drafted),
            (&mut self.own_accepted, &mut self.own_drafted),
        ] {
            accepted_k.iter_mut().for_each(|a| *a *= d);
            drafted_k.iter_mut().for_each(|n| *n *= d);
            // Positions past the first rejection were never judged.
            for k in 0..verified.min(accepted + 1) {
                drafted_k[k] += 1.0;
                if k < accepted {
                    accepted_k[k] += 1.0;
                }
            }
            if accepted == verified {
                let mut reach = 1.0;
                for k in verified..drafted {
                    let c = f64::from(cut[k - verified]).clamp(0.0, 1.0);
                    drafted_k[k] += reach;
                    accepted_k[k] += reach * c;
                    reach *= c;
                }
            }
        }
        if timed {
            self.learn_costs(verified, draft_s, verify_s);
        }
        self.probe_wait = match probed && self.best() == 0 {
            true => (2 * self.probe_wait).min(MAX_PROBE_BACKOFF * self.cfg.probe_every),
            false => self.cfg.probe_every,
        };
    }

    /// Takes in a drafted round's timings: `verified` tokens verified in `verify_s`
    /// seconds after `draft_s` seconds of drafting.
    fn learn_costs(&mut self, verified: usize, draft_s: f64, verify_s: f64) {
        let d = self.cfg.decay;
        if verified == 0 {
            // A block cut whole: its verify was a one-token forward.
            self.step_s = step_ema(d, self.step_s, verify_s);
        }
        let step_s = match self.step_s {
            Some(step) => {
                if verified > 0 {
                    let expected = step * (1.0 + self.verify_slope() * verified as f64);
                    let verify_s = verify_s.min(SPIKE * expected);
                    let extra = ((verify_s - step) / verified as f64).max(0.0);
                    self.extra_s = ema(d, self.extra_s, extra);
                }
                step
            }
            None => verify_s / (1.0 + self.cfg.verify_slope * verified as f64),
        };
        let cap = SPIKE * self.draft_cost.max(self.cfg.draft_cost);
        self.draft_cost = d * self.draft_cost + (1.0 - d) * (draft_s / step_s).min(cap);
    }
}

/// `old` decayed by `d` towards `x` (`x` itself when there is no `old`).
fn ema(d: f64, old: Option<f64>, x: f64) -> Option<f64> {
    Some(old.map_or(x, |o| d * o + (1.0 - d) * x))
}

/// [`ema`] of a step's time, which counts at most [`SPIKE`] times the step time measured
/// so far.
fn step_ema(d: f64, old: Option<f64>, x: f64) -> Option<f64> {
    ema(d, old, old.map_or(x, |o| x.min(SPIKE * o)))
}

#[cfg(test)]
mod tests;
