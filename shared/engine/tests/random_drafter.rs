//! Speculative decoding with a randomly initialised DSpark drafter on the real Gemma 3
//! 270M: almost every round rejects the first draft token, and greedy output is still the
//! plain output token for token (20 prompts × 64 new tokens, γ ∈ {1, 4, 8}); sampled
//! output reproduces under a seed; the adaptive draft length turns such a drafter off
//! without changing the output, and the next generation of the engine starts with it off;
//! a lookup in the context that keeps missing backs off. The tests whose policies learn
//! from measured timings run with the cores to themselves (`tandem_testkit::timing`).

mod common;

use std::sync::Arc;

use tandem_core::{Proposer, SamplingParams};
use tandem_dspark::{Dspark, DsparkConfig, DsparkProposer, TargetDims};
use tandem_engine::{Engine, GenerationRequest, Update};

use common::{engine, generate, reference, request, PROMPTS};

const NEW_TOKENS: usize = 64;

fn random_drafter() -> DsparkProposer {
    let head = engine().model().head().expect("a Gemma 3 head");
    let cfg = DsparkConfig::small(&TargetDims::of(&head));
    let model = Dspark::init(cfg, &head, 7).expect("init");
    DsparkProposer::new(Arc::new(model), &head).expect("proposer")
}

#[test]
fn greedy_output_is_plain_output() {
    let _cores = tandem_testkit::timing::shared();
    let drafter = random_drafter();
    for prompt in PROMPTS {
        let reference = reference(prompt, NEW_TOKENS);
        let plain = &reference[reference.len() - NEW_TOKENS..];
        for gamma in [1, 4, 8] {
            let (out, updates) = generate(&request(prompt, NEW_TOKENS, gamma), Some(&drafter));
            assert_eq!(out.tokens, plain, "{prompt:?} γ={gamma}");
            assert_eq!(out.spec.proposer_failures, 0);
            assert!(out.spec.drafts > 0);
            let rounds = updates.iter().filter_map(|u| u.round.clone());
            assert!(rounds.filter(|r| r.drafted > 0).all(|r| r.drafted <= gamma));
        }
    }
}

#[test]
fn sampled_output_reproduces_under_a_seed() {
    let _cores = tandem_testkit::timing::shared();
    let drafter = random_drafter();
    let sampling = SamplingParams {
        temperature: 0.7,
        top_k: None,
        top_p: 0.9,
        seed: 5,
    };
    let req = GenerationRequest {
        sampling,
        ..request("In 1969, Neil Armstrong", 32, 4)
    };
    let a = generate(&req, Some(&drafter)).0;
    let b = generate(&req, Some(&drafter)).0;
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(
        (a.spec.drafts, a.spec.accepted_tokens),
        (b.spec.drafts, b.spec.accepted_tokens)
    );
    assert_eq!(a.spec.proposer_failures, 0);
}

#[test]
fn adaptive_gamma_turns_a_useless_drafter_off_and_keeps_the_output() {
    let _cores = tandem_testkit::timing::timed();
    // The drafter's own lookup off too: its looked-up blocks are right where the text
    // repeats itself, and this is about the rounds the model drafts.
    let drafter = random_drafter().with_lookup(false);
    for prompt in &PROMPTS[..4] {
        let reference = reference(prompt, NEW_TOKENS);
        let plain = &reference[reference.len() - NEW_TOKENS..];
        // The rounds the policy gives the drafter: blocks the round finds in the context
        // itself (which counting loops like "1, 2, 3, 4," has) are not the drafter's.
        let req = GenerationRequest {
            adaptive_gamma: true,
            lookup: false,
            ..request(prompt, NEW_TOKENS, 8)
        };
        let (out, updates) = generate(&req, Some(&drafter));
        assert_eq!(out.tokens, plain, "{prompt:?}");
        let rounds: Vec<_> = updates.iter().filter_map(|u| u.round.clone()).collect();
        let drafting = rounds.iter().filter(|r| r.drafted > 0).count();
        assert!(
            drafting > 0,
            "{prompt:?}: the policy never tried the drafter"
        );
        assert!(
            drafting * 3 < rounds.len(),
            "{prompt:?}: {drafting} of {} rounds still drafted",
            rounds.len()
        );
    }
}

/// The rounds of one generation on `engine`, which must reproduce plain decoding.
fn rounds_of(
    engine: &Engine,
    prompt: &str,
    drafter: &DsparkProposer,
) -> Vec<tandem_engine::RoundStats> {
    // Every round asks the drafter (no lookup first), so that its first is the policy's.
    let req = GenerationRequest {
        adaptive_gamma: true,
        lookup: false,
        ..request(prompt, 32, 8)
    };
    let mut rounds = Vec::new();
    let out = engine
        .generate(&req, Some(drafter), &mut |u: &Update| {
            rounds.extend(u.round.clone());
            std::ops::ControlFlow::Continue(())
        })
        .expect("generate");
    let reference = reference(prompt, 32);
    assert_eq!(out.tokens, reference[reference.len() - 32..], "{prompt:?}");
    rounds
}

/// The first draft position's acceptance rate, and the γ, that the next adaptive greedy
/// generation of `engine` starts from.
fn next_start(engine: &Engine, drafter: &DsparkProposer) -> (f64, usize) {
    let policy = engine
        .starting_policy(&SamplingParams::default(), drafter.max_gamma().min(8))
        .expect("policy");
    (policy.acceptance(1), policy.choose())
}

/// Which γ a round picks also depends on measured timings, so each generation's first round
/// is checked against the policy the engine hands out just before it (not against a fixed
/// γ), and the learning against the acceptance rate it carries.
#[test]
fn the_next_generation_starts_from_what_the_last_one_learnt() {
    let _cores = tandem_testkit::timing::timed();
    let shared = engine();
    let fresh = Engine::new(shared.model().clone(), shared.tokenizer().clone());
    let drafter = random_drafter();
    let (prior, gamma) = next_start(&fresh, &drafter);
    assert!(gamma > 0, "a new engine starts by drafting");
    let first = rounds_of(&fresh, PROMPTS[0], &drafter);
    assert_eq!(first[0].drafted, gamma);
    let (learnt, gamma) = next_start(&fresh, &drafter);
    assert!(
        learnt <= 0.75 * prior,
        "the engine learnt that this drafter is not accepted: {learnt} vs {prior}"
    );
    let second = rounds_of(&fresh, PROMPTS[1], &drafter);
    assert_eq!(
        second[0].drafted, gamma,
        "the second generation starts from it"
    );
    let clone = fresh.clone();
    let (rate, gamma) = next_start(&clone, &drafter);
    assert_eq!(
        (rate, gamma),
        next_start(&fresh, &drafter),
        "clones share it"
    );
    assert_eq!(rounds_of(&clone, PROMPTS[2], &drafter)[0].drafted, gamma);
}

/// With lookup on (the default), the rounds of a counting loop find runs of the context
/// whose continuations are mostly wrong (the numbers move on): each looked-up block rejected
/// whole makes the lookup sit out as many rounds as it sat out last time, doubled (1, 2, 4,
/// …), and one accepted token ends that; the output stays plain. The back-off counts rounds,
/// not seconds, so it holds whatever γ the measured timings make the policy choose. The
/// drafter's own lookup (which has no back-off) is off, so every looked-up block counted is
/// the round's.
#[test]
fn a_lookup_that_keeps_missing_backs_off() {
    let _cores = tandem_testkit::timing::timed();
    let drafter = random_drafter().with_lookup(false);
    let prompt = "1, 2, 3, 4,";
    let reference = reference(prompt, NEW_TOKENS);
    let plain = &reference[reference.len() - NEW_TOKENS..];
    let req = GenerationRequest {
        adaptive_gamma: true,
        ..request(prompt, NEW_TOKENS, 8)
    };
    let (out, updates) = generate(&req, Some(&drafter));
    assert_eq!(out.tokens, plain);
    let rounds: Vec<_> = updates.iter().filter_map(|u| u.round.clone()).collect();
    let looked_up = |r: &tandem_engine::RoundStats| {
        r.drafted > 0 && r.source == tandem_core::DraftSource::Lookup
    };
    let (mut backoff, mut quiet, mut misses) = (1usize, 0usize, 0usize);
    for (i, r) in rounds.iter().enumerate() {
        if quiet > 0 {
            assert!(!looked_up(r), "round {i} looked up while backing off");
            quiet -= 1;
        } else if looked_up(r) && r.accepted == 0 {
            (quiet, backoff, misses) = (backoff, (2 * backoff).min(32), misses + 1);
        } else if looked_up(r) {
            backoff = 1;
        }
    }
    assert!(misses >= 2, "the loop's lookups missed {misses} times");
}
