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
//! plain round, so speculation that does not pay turns itself off; every `probe_every`
//! plain rounds a one-token draft measures the drafter again. Acceptance rates are estimated
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
    /// Plain rounds since the last drafted round.
    plain_rounds: usize,
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
            plain_rounds: 0,
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
    fn acceptances(&self) -> impl Iterator<Item = f64> + '_ {
        let counts = self.accepted.iter().zip(&self.drafted);
        counts.scan(PRIOR_FIRST, |prior, (a, n)| {
            *prior = (a + PRIOR_WEIGHT * *prior) / (n + PRIOR_WEIGHT);
            Some(*prior)
        })
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
        let rates = self
            .expected()
            .enumerate()
            .map(|(g, e)| (g, e / self.cost(g)));
        let (best, _) = rates.fold((0, f64::NEG_INFINITY), |b, r| if r.1 > b.1 { r } else { b });
        match best {
            0 if self.plain_rounds >= self.cfg.probe_every => 1,
            g => g,
        }
    }

    /// Whether the next round should be plain to time a one-token forward: drafting has
    /// begun, and no plain round was recorded here nor a step time inherited.
    fn needs_step_timing(&self) -> bool {
        self.step_s.is_none() && !self.timed_plain && self.drafted.first() > Some(&0.0)
    }

    /// Records a round: `drafted` tokens of which the first `accepted` were accepted, the
    /// seconds spent drafting and verifying.
    pub fn record(&mut self, drafted: usize, accepted: usize, draft_s: f64, verify_s: f64) {
        self.record_cut(drafted, drafted, accepted, draft_s, verify_s);
    }

    /// Records a round whose block of `drafted` tokens was cut to its first `verified`
    /// ([`crate::cut`]) before verification, of which `accepted` were accepted. A cut token
    /// counts as not accepted, so the acceptance rates stay those of whole drafted blocks
    /// (what choosing γ before drafting needs) rather than of the confident tokens the cuts
    /// let through; the verify time is per verified token.
    pub fn record_cut(
        &mut self,
        drafted: usize,
        verified: usize,
        accepted: usize,
        draft_s: f64,
        verify_s: f64,
    ) {
        let d = self.cfg.decay;
        let ema = |old: Option<f64>, x: f64| Some(old.map_or(x, |o| d * o + (1.0 - d) * x));
        let timed = verify_s.is_finite() && verify_s > 0.0 && draft_s.is_finite() && draft_s >= 0.0;
        let drafted = drafted.min(self.cfg.max_gamma);
        let verified = verified.min(drafted);
        if drafted == 0 {
            self.plain_rounds += 1;
            self.timed_plain = true;
            if timed {
                self.step_s = ema(self.step_s, verify_s);
            }
            return;
        }
        self.plain_rounds = 0;
        for (accepted_k, drafted_k) in [
            (&mut self.accepted, &mut self.drafted),
            (&mut self.own_accepted, &mut self.own_drafted),
        ] {
            accepted_k.iter_mut().for_each(|a| *a *= d);
            drafted_k.iter_mut().for_each(|n| *n *= d);
            // Positions past the first rejection were never judged.
            for k in 0..drafted.min(accepted + 1) {
                drafted_k[k] += 1.0;
                if k < accepted {
                    accepted_k[k] += 1.0;
                }
            }
        }
        if !timed {
            return;
        }
        if verified == 0 {
            // A block cut whole: its verify was a one-token forward.
            self.step_s = ema(self.step_s, verify_s);
        }
        let step_s = match self.step_s {
            Some(step) => {
                if verified > 0 {
                    let extra = ((verify_s - step) / verified as f64).max(0.0);
                    self.extra_s = ema(self.extra_s, extra);
                }
                step
            }
            None => verify_s / (1.0 + self.cfg.verify_slope * verified as f64),
        };
        self.draft_cost = d * self.draft_cost + (1.0 - d) * draft_s / step_s;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy(max: usize) -> GammaPolicy {
        GammaPolicy::new(GammaPolicyConfig::new(max)).expect("valid")
    }

    /// A policy after `rounds` rounds of its own choosing in which every draft is fully
    /// accepted (`accept_all`) or fully rejected; a rejected drafter is made to draft at least
    /// one token each round, so that it keeps being judged.
    fn trained(max: usize, rounds: usize, accept_all: bool) -> GammaPolicy {
        let mut p = policy(max);
        for _ in 0..rounds {
            let g = match accept_all {
                true => p.choose(),
                false => p.choose().max(1),
            };
            p.record(g, if accept_all { g } else { 0 }, 0.002, 0.03);
        }
        p
    }

    #[test]
    fn expected_tokens_follow_the_acceptance_rates() {
        let p = policy(4);
        assert!((p.expected_tokens(0) - 1.0).abs() < 1e-12);
        assert!((p.expected_tokens(2) - (1.0 + 2.0 / 3.0 + 4.0 / 9.0)).abs() < 1e-12);
        assert!(p.choose() > 0, "a new generation starts by drafting");
    }

    #[test]
    fn a_drafter_that_is_never_accepted_turns_speculation_off_then_is_probed() {
        let mut p = trained(8, 30, false);
        assert_eq!(p.choose(), 0);
        for _ in 0..16 {
            assert_eq!(p.choose(), 0);
            p.record(0, 0, 0.0, 0.02);
        }
        assert_eq!(p.choose(), 1, "a probe after 16 plain rounds");
        p.record(1, 0, 0.002, 0.026);
        assert_eq!(p.choose(), 0);
    }

    #[test]
    fn a_drafter_that_is_always_accepted_drafts_the_longest_block() {
        assert_eq!(trained(8, 40, true).choose(), 8);
    }

    #[test]
    fn the_verify_slope_is_learnt_from_plain_and_drafted_rounds() {
        let mut p = policy(4);
        assert!((p.verify_slope() - 0.3).abs() < 1e-12);
        p.record(0, 0, 0.0, 0.020);
        p.record(4, 1, 0.001, 0.060);
        assert!(
            (p.verify_slope() - 0.5).abs() < 1e-9,
            "{}",
            p.verify_slope()
        );
        assert!((p.cost(0) - 1.0).abs() < 1e-12);
    }

    /// Runs 40 rounds whose blocks are accepted up to the lengths in `cycle` (in turn),
    /// with a one-token step of 4 ms and `per_token` seconds more per drafted token;
    /// returns the choices and the policy.
    fn run(cycle: &[usize], per_token: f64) -> (Vec<usize>, GammaPolicy) {
        let mut p = policy(8);
        let mut chosen = Vec::new();
        for r in 0..40 {
            let g = p.choose();
            chosen.push(g);
            p.record(
                g,
                g.min(cycle[r % cycle.len()]),
                0.001,
                0.004 + per_token * g as f64,
            );
        }
        (chosen, p)
    }

    /// Where a verify costs little more than a step (a launch-bound GPU: 0.2 ms per drafted
    /// token on 4 ms), the second round times a plain step, the slope learnt replaces the
    /// CPU prior and blocks grow longer than where each token costs 0.3 steps; the timing
    /// is taken once, and not again by a generation that inherits it.
    #[test]
    fn a_plain_round_times_the_step_once_and_frees_long_blocks() {
        let cycle = [8, 2, 5, 1, 8, 3, 6, 0];
        let (gpu, p) = run(&cycle, 0.0002);
        assert_eq!(gpu[1], 0, "the second round is plain: {gpu:?}");
        assert!(gpu[2..].iter().all(|g| *g > 0), "{gpu:?}");
        assert!(
            (p.verify_slope() - 0.05).abs() < 1e-9,
            "{}",
            p.verify_slope()
        );
        let (cpu, _) = run(&cycle, 0.0012);
        let tail = |c: &[usize]| c[20..].iter().sum::<usize>();
        assert!(tail(&gpu) > tail(&cpu), "gpu {gpu:?} cpu {cpu:?}");
        let next = GammaPolicy::with_learnt(GammaPolicyConfig::new(8), &p.learnt()).expect("valid");
        assert!(
            !next.needs_step_timing(),
            "an inherited step time is not measured again"
        );
        let mut untimed = policy(8);
        untimed.record(4, 2, 0.001, 0.01);
        assert_eq!(untimed.choose(), 0);
        untimed.record(0, 0, 0.0, f64::NAN);
        assert!(
            untimed.choose() > 0,
            "an untimed plain round is not repeated"
        );
    }

    #[test]
    fn invalid_settings_are_refused() {
        let bad = |f: fn(&mut GammaPolicyConfig)| {
            let mut c = GammaPolicyConfig::new(4);
            f(&mut c);
            GammaPolicy::new(c).is_err()
        };
        assert!(bad(|c| c.decay = 0.0));
        assert!(bad(|c| c.decay = 1.5));
        assert!(bad(|c| c.verify_slope = f64::NAN));
        assert!(bad(|c| c.draft_cost = -1.0));
    }

    #[test]
    fn a_new_generation_starts_from_what_the_last_one_learnt() {
        let mut memory = Learnt::default();
        memory.absorb(trained(8, 30, false).learnt());
        let next = GammaPolicy::with_learnt(GammaPolicyConfig::new(8), &memory).expect("valid");
        assert!(policy(8).choose() > 0, "without memory a generation drafts");
        assert_eq!(
            next.choose(),
            0,
            "a drafter never accepted is not tried again at once"
        );
        assert!(next.acceptance(1) < 0.3);
        assert!(memory.drafted[0] <= CARRIED_ROUNDS + 1e-9);
        memory.absorb(trained(8, 40, true).learnt());
        let after = GammaPolicy::with_learnt(GammaPolicyConfig::new(4), &memory).expect("valid");
        assert!(after.acceptance(1) > 0.6, "newer evidence outweighs older");
        assert!(after.choose() > 0);
    }

    /// A generation hands on only what it observed: one that started from the memory and
    /// drafted nothing halves the memory's evidence (so a drafter judged long ago is tried
    /// again after a few such generations) instead of counting the inherited rounds again.
    #[test]
    fn a_generation_hands_on_only_its_own_evidence() {
        let cfg = GammaPolicyConfig::new(8);
        let mut memory = Learnt::default();
        memory.absorb(trained(8, 30, false).learnt());
        let before = memory.drafted[0];
        let mut generations = 0;
        loop {
            let mut idle = GammaPolicy::with_learnt(cfg, &memory).expect("valid");
            if idle.choose() > 0 {
                break;
            }
            idle.record(0, 0, 0.0, 0.02);
            memory.absorb(idle.learnt());
            generations += 1;
            if generations == 1 {
                assert!(
                    (memory.drafted[0] - before / 2.0).abs() < 1e-9,
                    "{memory:?}"
                );
            }
            assert!(
                generations < 8,
                "the drafter is never tried again: {memory:?}"
            );
        }
        let mut judged = GammaPolicy::with_learnt(cfg, &memory).expect("valid");
        judged.record(1, 1, 0.001, 0.03);
        let own = judged.learnt();
        assert_eq!((own.accepted[0], own.drafted[0]), (1.0, 1.0));
        assert!(own.drafted[1..].iter().all(|n| *n == 0.0));
    }

    /// A cut token counts as not accepted (the rates stay those of whole blocks, so a
    /// drafter whose confident tokens pass but whose blocks mostly get cut is not drafted
    /// more for it), and the verify time is spread over the verified tokens only.
    #[test]
    fn cut_rounds_count_the_cut_as_rejected_and_time_what_was_verified() {
        let mut cut = policy(8);
        let mut whole = policy(8);
        for p in [&mut cut, &mut whole] {
            p.record(0, 0, 0.0, 0.02);
        }
        for _ in 0..20 {
            cut.record_cut(8, 1, 1, 0.004, 0.026);
            whole.record(1, 1, 0.004, 0.026);
        }
        assert!(cut.acceptance(2) < 0.2, "{}", cut.acceptance(2));
        assert!(
            whole.acceptance(2) > 0.6,
            "position 2 was never judged whole"
        );
        assert!((cut.verify_slope() - whole.verify_slope()).abs() < 1e-12);
        assert!(
            (cut.verify_slope() - 0.3).abs() < 1e-6,
            "{}",
            cut.verify_slope()
        );
        let mut all_cut = policy(8);
        all_cut.record(0, 0, 0.0, 0.02);
        all_cut.record_cut(8, 0, 0, 0.004, 0.022);
        assert!(all_cut.acceptance(1) < PRIOR_FIRST);
        assert!(all_cut.verify_slope().is_finite());
    }

    proptest! {
        #[test]
        fn choices_stay_in_range_and_rates_in_the_unit_interval(
            max in 0usize..10,
            rounds in proptest::collection::vec((0usize..12, 0usize..12, 0.0f64..0.1, 0.0f64..0.2), 0..60),
        ) {
            let mut p = policy(max);
            for (drafted, accepted, draft_s, verify_s) in rounds {
                let g = p.choose();
                prop_assert!(g <= max);
                p.record(drafted.min(g), accepted.min(drafted.min(g)), draft_s, verify_s);
            }
            for k in 1..=max {
                let a = p.acceptance(k);
                prop_assert!(a > 0.0 && a < 1.0);
            }
            prop_assert!(p.expected_tokens(max) <= 1.0 + max as f64);
        }
    }
}
