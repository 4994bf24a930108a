//! Request handling on the real Gemma 3 270M, shared by plain and speculative decoding:
//! stop strings cut inside accepted blocks, seeded sampling reproduces, cancellation, a
//! failing proposer, and invalid requests.

mod common;

use std::ops::ControlFlow;

use tandem_core::{
    DraftBlock, FinishReason, ProposeError, ProposeRequest, Proposer, ProposerSession,
    SamplingParams, SnapshotRows, SnapshotSpec, Verification,
};
use tandem_engine::{EngineError, GenerationRequest, Update};

use common::{engine, generate, request, spec_270m, Oracle, Spoil};

fn oracle_for(req: &GenerationRequest, spoil: Spoil) -> Oracle {
    let mut plain = req.clone();
    plain.gamma = 0;
    plain.stop_strings.clear();
    let mut reference = req.prompt.clone();
    reference.extend(generate(&plain, None).0.tokens);
    Oracle {
        reference,
        spoil,
        spec: spec_270m(),
        max_gamma: 8,
    }
}

#[test]
fn a_stop_string_inside_an_accepted_block_cuts_exactly_there() {
    let mut req = request("1, 2, 3, 4,", 40, 8);
    req.stop_strings = vec!["8,".into()];
    // The oracle's blocks, not runs the round finds in the counting prompt itself.
    req.lookup = false;
    let oracle = oracle_for(&req, Spoil::Never);
    let (plain, _) = generate(
        &GenerationRequest {
            gamma: 0,
            ..req.clone()
        },
        None,
    );
    let (spec, updates) = generate(&req, Some(&oracle));
    assert_eq!(plain.finish, FinishReason::Stop);
    assert_eq!(plain.text, " 5, 6, 7, ");
    assert_eq!(spec.finish, FinishReason::Stop);
    assert_eq!(spec.tokens, plain.tokens);
    assert_eq!(spec.text, plain.text);
    let streamed: String = updates.iter().map(|u| u.chunk.text.as_str()).collect();
    assert_eq!(streamed, spec.text);
    let round = updates
        .iter()
        .find_map(|u| u.round.clone())
        .expect("a round");
    assert_eq!(
        round.accepted, round.drafted,
        "the stop fell inside a fully accepted block"
    );
}

#[test]
fn seeded_sampling_reproduces_in_both_paths() {
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: Some(40),
        top_p: 0.95,
        seed: 11,
    };
    let mut req = request("Once upon a time", 24, 4);
    req.sampling = sampling;
    let oracle = oracle_for(
        &GenerationRequest {
            sampling: SamplingParams::default(),
            ..req.clone()
        },
        Spoil::Never,
    );
    for (gamma, verification) in [
        (0, Verification::Token),
        (4, Verification::Token),
        (4, Verification::Block),
    ] {
        let req = GenerationRequest {
            gamma,
            verification,
            ..req.clone()
        };
        let a = generate(&req, Some(&oracle)).0;
        let b = generate(&req, Some(&oracle)).0;
        assert_eq!(a.tokens, b.tokens, "γ={gamma} {verification:?}");
        assert_eq!(a.tokens.len(), 24);
        let other = GenerationRequest {
            sampling: SamplingParams {
                seed: 12,
                ..sampling
            },
            ..req.clone()
        };
        assert_ne!(
            generate(&other, Some(&oracle)).0.tokens,
            a.tokens,
            "γ={gamma} {verification:?}"
        );
    }
    let plain = |verification| GenerationRequest {
        gamma: 0,
        verification,
        ..req.clone()
    };
    assert_eq!(
        generate(&plain(Verification::Block), None).0.tokens,
        generate(&plain(Verification::Token), None).0.tokens,
        "plain decoding draws the same stream whichever rule a request names"
    );
}

#[test]
fn a_cancelled_generation_stops_at_once() {
    let req = request("The quick brown fox", 64, 0);
    let mut seen = 0;
    let out = engine()
        .generate(&req, None, &mut |_: &Update| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .expect("generate");
    assert_eq!(out.finish, FinishReason::Cancelled);
    assert_eq!(out.tokens.len(), 3);
}

/// Drafts well for two rounds, then fails like a drafter that went away.
struct Flaky(Oracle);
struct FlakySession(Box<dyn ProposerSession>, usize);

impl Proposer for Flaky {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.0.snapshot_spec()
    }
    fn max_gamma(&self) -> usize {
        8
    }
    fn open(&self, s: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        Ok(Box::new(FlakySession(self.0.open(s)?, 0)))
    }
}

impl ProposerSession for FlakySession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        self.0.extend(rows)
    }
    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        self.1 += 1;
        if self.1 > 2 {
            return Err(ProposeError::Unavailable("connection reset".into()));
        }
        self.0.propose(req)
    }
}

#[test]
fn a_failing_proposer_degrades_to_plain_decoding() {
    // Every round asks the proposer (no lookup in the context first).
    let req = GenerationRequest {
        lookup: false,
        ..request("The three primary colors are", 32, 4)
    };
    let flaky = Flaky(oracle_for(&req, Spoil::Never));
    let (plain, _) = generate(
        &GenerationRequest {
            gamma: 0,
            ..req.clone()
        },
        None,
    );
    let (spec, _) = generate(&req, Some(&flaky));
    assert_eq!(spec.tokens, plain.tokens);
    assert_eq!(spec.spec.proposer_failures, 1);
    assert_eq!(spec.spec.drafts, 2);
}

#[test]
fn invalid_requests_are_refused_with_a_reason() {
    let ok = request("Hello", 4, 0);
    let cases = [
        GenerationRequest {
            prompt: vec![],
            ..ok.clone()
        },
        GenerationRequest {
            max_tokens: 0,
            ..ok.clone()
        },
        GenerationRequest {
            prompt: vec![2, 9_999_999],
            ..ok.clone()
        },
        GenerationRequest {
            sampling: SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            ..ok.clone()
        },
        GenerationRequest {
            sampling: SamplingParams {
                top_p: 0.0,
                temperature: 1.0,
                ..Default::default()
            },
            ..ok.clone()
        },
    ];
    for bad in cases {
        let err = engine()
            .generate(&bad, None, &mut |_: &Update| ControlFlow::Continue(()))
            .expect_err("refused");
        assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
        assert_eq!(err.error_type(), "invalid_request");
        assert!(!err.to_string().contains('\n'));
    }
}
