//! Speculative decoding with a randomly initialised DSpark drafter on the real Gemma 3
//! 270M: almost every round rejects the first draft token, and greedy output is still the
//! plain output token for token (20 prompts × 64 new tokens, γ ∈ {1, 4, 8}); sampled
//! output reproduces under a seed; the adaptive draft length turns such a drafter off
//! without changing the output.

mod common;

use std::sync::Arc;

use tandem_core::SamplingParams;
use tandem_dspark::{Dspark, DsparkConfig, DsparkProposer, TargetDims};
use tandem_engine::GenerationRequest;

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
    let drafter = random_drafter();
    for prompt in PROMPTS {
        let reference = reference(prompt, NEW_TOKENS);
        let plain = &reference[reference.len() - NEW_TOKENS..];
        for gamma in [1, 4, 8] {
            let (out, updates) = generate(&request(prompt, NEW_TOKENS, gamma), Some(&drafter));
            assert_eq!(out.tokens, plain, "{prompt:?} γ={gamma}");
            assert_eq!(out.spec.proposer_failures, 0);
            assert!(out.spec.drafts > 0);
            let rounds = updates.iter().filter_map(|u| u.round);
            assert!(rounds.filter(|r| r.drafted > 0).all(|r| r.drafted <= gamma));
        }
    }
}

#[test]
fn sampled_output_reproduces_under_a_seed() {
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
    let drafter = random_drafter();
    for prompt in &PROMPTS[..4] {
        let reference = reference(prompt, NEW_TOKENS);
        let plain = &reference[reference.len() - NEW_TOKENS..];
        let req = GenerationRequest {
            adaptive_gamma: true,
            ..request(prompt, NEW_TOKENS, 8)
        };
        let (out, updates) = generate(&req, Some(&drafter));
        assert_eq!(out.tokens, plain, "{prompt:?}");
        let rounds: Vec<_> = updates.iter().filter_map(|u| u.round).collect();
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
