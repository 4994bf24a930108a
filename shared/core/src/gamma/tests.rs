//! Tests of the adaptive draft length.

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

/// Plain rounds a policy makes before its next probe (recording them).
fn plain_until_probe(p: &mut GammaPolicy) -> usize {
    let mut plain = 0;
    while p.choose() == 0 {
        p.record(0, 0, 0.0, 0.02);
        plain += 1;
        assert!(plain <= 1000, "no probe");
    }
    plain
}

#[test]
fn each_failed_probe_doubles_the_wait_and_a_paying_one_ends_the_backoff() {
    let mut p = trained(8, 30, false);
    let mut waits = Vec::new();
    for _ in 0..5 {
        waits.push(plain_until_probe(&mut p));
        p.record(1, 0, 0.002, 0.026);
    }
    assert_eq!(waits, [16, 32, 64, 128, 128]);
    // Probes accepted until drafting pays again: the next stretch of plain rounds (if
    // any) waits the base interval.
    while p.choose() <= 1 {
        plain_until_probe(&mut p);
        p.record(1, 1, 0.002, 0.026);
    }
    assert_eq!(p.probe_wait(), 16);
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

/// Rounds of a GPU-like regime (a 1.4 ms step, 0.08 ms a drafted token, most drafts
/// accepted) drafting for `draft_s` seconds, but for `spike` seconds in round 5, when a
/// new block shape is met (graphs captured on first use); returns the choices.
fn gpu_rounds(p: &mut GammaPolicy, rounds: usize, spike: f64, draft_s: f64) -> Vec<usize> {
    let mut chosen = Vec::new();
    for r in 0..rounds {
        let g = p.choose();
        chosen.push(g);
        let draft = if r == 5 { spike } else { draft_s };
        p.record(g, g.min(6), draft, 0.0014 + 0.00008 * g as f64);
    }
    chosen
}

/// A one-off cost (a 60 ms first drafted block on an H100 against 0.5 ms after) leaves
/// the policy drafting long blocks at its measured cost (without the `SPIKE` cap it
/// counted 43 steps into the decayed cost, then more as further shapes came); a cost that
/// truly rose still gets through within a few rounds.
#[test]
fn a_one_off_spike_does_not_make_drafting_look_dear() {
    let mut p = policy(8);
    let chosen = gpu_rounds(&mut p, 30, 0.06, 0.0005);
    assert!(chosen[3..].iter().all(|g| *g >= 6), "{chosen:?}");
    assert!(p.draft_cost() < 0.6, "draft cost {}", p.draft_cost());
    let dearer = gpu_rounds(&mut p, 40, 0.014, 0.014);
    assert!(p.draft_cost() > 5.0, "a lasting rise: {}", p.draft_cost());
    assert!(
        dearer[39] < 6,
        "dearer drafting, shorter blocks: {dearer:?}"
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

fn cut_round<'a>(verified: usize, accepted: usize, cut: &'a [f32]) -> Observed<'a> {
    Observed {
        verified,
        accepted,
        cut,
        draft_s: 0.004,
        verify_s: 0.02 + 0.006 * verified as f64,
    }
}

/// A cut token counts by its calibrated confidence (the rates stay those of whole
/// blocks: a drafter whose confident tokens pass but whose cut tails would fail is not
/// drafted more for it, nor less than its tails deserve), and the verify time is spread
/// over the verified tokens only.
#[test]
fn cut_rounds_count_the_cut_by_confidence_and_time_what_was_verified() {
    let mut cut = policy(8);
    let mut whole = policy(8);
    for p in [&mut cut, &mut whole] {
        p.record(0, 0, 0.0, 0.02);
    }
    let doubtful = [0.1f32; 7];
    for _ in 0..40 {
        cut.observe(&cut_round(1, 1, &doubtful));
        whole.record(1, 1, 0.004, 0.026);
    }
    // 0.1 pulled up by a prior of 3 rounds centred on position 1 (about 1).
    assert!(cut.acceptance(2) < 0.3, "{}", cut.acceptance(2));
    assert!(
        cut.acceptance(3) < cut.acceptance(2),
        "{}",
        cut.acceptance(3)
    );
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
    let mut sure = policy(8);
    sure.record(0, 0, 0.0, 0.02);
    for _ in 0..40 {
        sure.observe(&cut_round(2, 2, &[0.95; 6]));
    }
    assert!(sure.acceptance(4) > 0.85, "{}", sure.acceptance(4));
    let mut rejected = policy(8);
    rejected.record(0, 0, 0.0, 0.02);
    for _ in 0..40 {
        rejected.observe(&cut_round(2, 1, &[0.95; 6]));
    }
    assert!(rejected.acceptance(2) < 0.2, "{}", rejected.acceptance(2));
    let never_judged = rejected
        .acceptances()
        .skip(2)
        .all(|a| a <= rejected.acceptance(2));
    assert!(
        never_judged,
        "a rejection ends what was judged: the cut tail adds nothing"
    );
    let mut all_cut = policy(8);
    all_cut.record(0, 0, 0.0, 0.02);
    all_cut.observe(&cut_round(0, 0, &[0.01; 8]));
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
        let (survival, hopeful) = (p.survival(), p.hopeful_survival());
        for (s, h) in survival.iter().zip(&hopeful) {
            prop_assert!(h >= s && *h <= 1.0, "{hopeful:?} against {survival:?}");
        }
    }
}

/// The hope is that of accepted one-token probes: the first position as if `HOPE` more
/// were accepted, the later ones following it through their priors; evidence outweighs it.
#[test]
fn hope_is_what_accepted_probes_would_show() {
    let h = policy(2).hopeful_survival();
    // (2 + 3 · 2/3) / (2 + 3), then (0 + 3 · 0.8) / (0 + 3) more.
    assert!((h[0] - 0.8).abs() < 1e-12, "{h:?}");
    assert!((h[1] - 0.64).abs() < 1e-12, "{h:?}");
    let rejected = trained(8, 60, false);
    let (s, h) = (rejected.survival(), rejected.hopeful_survival());
    assert!(h[0] > s[0], "{h:?} against {s:?}");
    assert!(
        h[0] < 0.2,
        "sixty rejections outweigh two hoped-for probes: {h:?}"
    );
}

/// Drafting seconds come from the generation's own plain rounds once it has timed one (in
/// a batch, the wait for a shared step), from the caller's step time before.
#[test]
fn draft_seconds_are_in_the_generations_own_step_time() {
    let mut p = policy(8);
    assert!(
        (p.draft_seconds(0.002) - 0.2 * 0.002).abs() < 1e-12,
        "the prior"
    );
    p.record(0, 0, 0.0, 0.004);
    for _ in 0..200 {
        p.record(4, 4, 0.008, 0.005);
    }
    assert!(
        (p.draft_seconds(0.001) - 0.008).abs() < 1e-4,
        "{}",
        p.draft_seconds(0.001)
    );
}

/// The work per verified row is a decayed mean of the rounds' own timings per row.
#[test]
fn verify_work_is_timed_per_row() {
    let mut p = policy(8);
    assert_eq!(p.row_seconds(), 0.0);
    p.verify_work(0.004, 4);
    assert!((p.row_seconds() - 0.001).abs() < 1e-12);
    p.verify_work(f64::NAN, 2);
    p.verify_work(0.1, 0);
    assert!((p.row_seconds() - 0.001).abs() < 1e-12, "nothing timed");
    for _ in 0..300 {
        p.verify_work(0.006, 3);
    }
    assert!((p.row_seconds() - 0.002).abs() < 1e-6);
}
