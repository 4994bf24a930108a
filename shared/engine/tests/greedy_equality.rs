//! Greedy speculative decoding on the real Gemma 3 270M emits exactly the plain tokens:
//! 20 prompts × 64 new tokens, γ ∈ {1, 4, 8}, with an oracle proposer that drafts the
//! target's own continuation (every round accepts all) and one that spoils its blocks in
//! rotation (accept-all, reject-first and partial rounds).

mod common;

use common::{generate, reference, request, spec_270m, Oracle, Spoil, PROMPTS};
use tandem_engine::GenerationRequest;

const NEW_TOKENS: usize = 64;

fn check(spoil: Spoil) {
    for prompt in PROMPTS {
        let reference = reference(prompt, NEW_TOKENS);
        let plain = &reference[reference.len() - NEW_TOKENS..];
        for gamma in [1, 4, 8] {
            let oracle = Oracle {
                reference: reference.clone(),
                spoil,
                spec: spec_270m(),
                max_gamma: 8,
            };
            // Every block is the oracle's: a looked-up block is not, and may be rejected.
            let req = GenerationRequest {
                lookup: false,
                ..request(prompt, NEW_TOKENS, gamma)
            };
            let (spec, updates) = generate(&req, Some(&oracle));
            assert_eq!(spec.tokens, plain, "{prompt:?} γ={gamma} {spoil:?}");
            assert_eq!(spec.spec.proposer_failures, 0);
            let rounds: Vec<_> = updates
                .iter()
                .filter_map(|u| u.round.clone())
                .filter(|r| r.drafted > 0)
                .collect();
            assert!(rounds
                .iter()
                .all(|r| r.drafted <= gamma && r.accepted <= r.drafted));
            let all = rounds.iter().filter(|r| r.accepted == r.drafted).count();
            let first = rounds.iter().filter(|r| r.accepted == 0).count();
            let partial = rounds.len() - all - first;
            match spoil {
                Spoil::Never => assert_eq!(all, rounds.len(), "{prompt:?} γ={gamma}"),
                Spoil::Rotating => {
                    assert!(all > 0 && first > 0, "{prompt:?} γ={gamma}: {all} {first}");
                    assert!(gamma == 1 || partial > 0, "{prompt:?} γ={gamma}");
                }
            }
        }
    }
}

#[test]
fn oracle_that_is_always_right() {
    check(Spoil::Never);
}

#[test]
fn oracle_spoiling_blocks_in_rotation() {
    check(Spoil::Rotating);
}
