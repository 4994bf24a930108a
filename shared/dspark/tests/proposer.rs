//! The `Proposer` implementation: reproducible sampled drafting, exact draft
//! distributions, greedy point masses, and rejection of every malformed call.

mod common;

use std::sync::Arc;

use candle_core::Device;
use common::*;
use tandem_core::{DraftBlock, DraftSource};
use tandem_core::{
    ProposeError, ProposeRequest, Proposer, ProposerSession, SamplingParams, SnapshotRows,
};
use tandem_dspark::{DsparkConfig, DsparkProposer};
use tandem_testkit::{max_abs_diff, Lcg};

fn proposer(cfg: DsparkConfig) -> DsparkProposer {
    let head = tiny_head(1);
    let model = Arc::new(busy_drafter(cfg, &head, 3));
    DsparkProposer::new(model, &head).expect("proposer")
}

fn rows(start: usize, n: usize, width: usize, seed: u64) -> SnapshotRows {
    SnapshotRows {
        start,
        width,
        data: taps(&mut Lcg::new(seed), n, width),
        tokens: Vec::new(),
    }
}

/// Runs a session: three rounds of extend + propose; returns the blocks.
fn session(p: &dyn Proposer, params: SamplingParams) -> Vec<tandem_core::DraftBlock> {
    session_of(p, params, &[5, 2, 4])
}

/// Runs a session of rounds that each append `extends[i]` rows and propose a block of
/// 4, 1, 2, 3, 4, 1, … tokens (the whole block of the tiny config, and shorter ones that
/// run fewer block rows); returns the blocks.
fn session_of(
    p: &dyn Proposer,
    params: SamplingParams,
    extends: &[usize],
) -> Vec<tandem_core::DraftBlock> {
    let w = p.snapshot_spec().row_width();
    let mut s = p.open(&params).expect("open");
    let mut blocks = Vec::new();
    let mut pos = 0;
    for (round, &n) in extends.iter().enumerate() {
        s.extend(&rows(pos, n, w, round as u64)).expect("extend");
        pos += n;
        let req = ProposeRequest {
            anchor: 11 + round as u32,
            position: pos,
            gamma: 1 + (round + 3) % 4,
        };
        blocks.push(s.propose(&req).expect("propose"));
    }
    blocks
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: Some(40),
        top_p: 0.95,
        seed,
    }
}

#[test]
fn sampled_drafting_is_reproducible_and_exact() {
    let cfg = DsparkConfig {
        draft_vocab: Some((0..48).map(|i| i + 8).collect()),
        ..tiny_config()
    };
    let p = proposer(cfg);
    let a = session(&p, sampled(7));
    assert_eq!(a, session(&p, sampled(7)));
    assert_ne!(a, session(&p, sampled(8)));
    for (block, gamma) in a.iter().zip([4, 1, 2]) {
        assert_eq!(block.tokens.len(), gamma);
        for ((t, dist), c) in block
            .tokens
            .iter()
            .zip(&block.dists)
            .zip(&block.confidences)
        {
            let sum: f32 = dist.probs.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "sum {sum}");
            assert!(
                dist.prob(*t) > 0.0,
                "drawn token {t} not in its distribution"
            );
            assert!(
                dist.ids.iter().all(|i| (8..56).contains(i)),
                "ids are target ids"
            );
            assert!((0.0..=1.0).contains(c));
        }
    }
}

#[test]
fn greedy_drafting_returns_point_masses() {
    let p = proposer(tiny_config());
    let blocks = session(&p, SamplingParams::default());
    assert_eq!(blocks, session(&p, SamplingParams::default()));
    for block in blocks {
        for (t, dist) in block.tokens.iter().zip(&block.dists) {
            assert_eq!(
                (dist.ids.as_slice(), dist.probs.as_slice()),
                ([*t].as_slice(), [1.0f32].as_slice())
            );
        }
    }
    assert_eq!(p.max_gamma(), 4);
    assert_eq!(p.snapshot_spec().tap_layers(), vec![1, 3, LAYERS]);
}

#[test]
fn malformed_calls_are_invalid_and_never_panic() {
    let p = proposer(tiny_config());
    let w = p.snapshot_spec().row_width();
    let invalid = |r: Result<(), ProposeError>, what: &str| match r {
        Err(ProposeError::Invalid(_)) => {}
        other => panic!("{what}: {other:?}"),
    };
    let bad_params = SamplingParams {
        temperature: -1.0,
        ..SamplingParams::default()
    };
    assert!(matches!(p.open(&bad_params), Err(ProposeError::Invalid(_))));
    let mut s = p.open(&SamplingParams::default()).expect("open");
    invalid(s.extend(&rows(0, 2, w + 1, 0)), "wrong width");
    let mut ragged = rows(0, 2, w, 0);
    ragged.data.pop();
    invalid(s.extend(&ragged), "ragged rows");
    invalid(s.extend(&rows(1, 2, w, 0)), "rows out of order");
    s.extend(&rows(0, 3, w, 0)).expect("extend");
    invalid(s.extend(&rows(2, 1, w, 0)), "rows overlap");
    let req = ProposeRequest {
        anchor: 5,
        position: 3,
        gamma: 4,
    };
    let propose = |s: &mut Box<dyn ProposerSession>, r: ProposeRequest| s.propose(&r).map(|_| ());
    invalid(
        propose(&mut s, ProposeRequest { position: 2, ..req }),
        "position behind",
    );
    invalid(
        propose(&mut s, ProposeRequest { position: 4, ..req }),
        "position ahead",
    );
    invalid(
        propose(&mut s, ProposeRequest { gamma: 5, ..req }),
        "gamma above max",
    );
    invalid(
        propose(&mut s, ProposeRequest { gamma: 0, ..req }),
        "gamma zero",
    );
    invalid(
        propose(
            &mut s,
            ProposeRequest {
                anchor: VOCAB as u32,
                ..req
            },
        ),
        "anchor",
    );
    propose(&mut s, req).expect("a valid call still works");
    propose(&mut s, ProposeRequest { gamma: 1, ..req }).expect("shorter block");
}

/// A session with no context yet can still draft (attention over the block alone).
#[test]
fn drafting_with_an_empty_context_works() {
    let p = proposer(tiny_config());
    let mut s = p.open(&SamplingParams::default()).expect("open");
    let req = ProposeRequest {
        anchor: 2,
        position: 0,
        gamma: 3,
    };
    assert_eq!(s.propose(&req).expect("propose").tokens.len(), 3);
}

/// The same blocks up to float rounding: equal tokens and ids, close probabilities and
/// confidences.
fn assert_same_blocks(a: &[DraftBlock], b: &[DraftBlock]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.tokens, y.tokens);
        assert!(max_abs_diff(&x.confidences, &y.confidences) < 1e-5);
        for (p, q) in x.dists.iter().zip(&y.dists) {
            assert_eq!(p.ids, q.ids);
            assert!(max_abs_diff(&p.probs, &q.probs) < 1e-5);
        }
    }
}

/// The device drafter (here on candle's CPU backend, its fixed-shape steps op by op)
/// drafts the host drafter's blocks, greedy and sampled (at a temperature alone, drawn on
/// the device, and with top-k and top-p, drawn on the host), with and without a draft
/// vocabulary, with and without context; over a context that outgrows its first storage
/// (more than 256 positions, appended in runs longer than one extend step) too, and in a
/// second session reusing the first's storage.
#[test]
fn device_drafting_matches_the_host_drafter() {
    let head = tiny_head(1);
    let vocab = DsparkConfig {
        draft_vocab: Some((10..40).rev().collect()),
        ..tiny_config()
    };
    for cfg in [tiny_config(), vocab] {
        let model = Arc::new(busy_drafter(cfg, &head, 3));
        let host = DsparkProposer::new(Arc::clone(&model), &head).expect("host");
        let device = DsparkProposer::on_device(model, &head, &Device::Cpu, true).expect("device");
        let warm = SamplingParams {
            temperature: 0.7,
            seed: 11,
            ..SamplingParams::default()
        };
        for params in [SamplingParams::default(), sampled(7), warm] {
            assert_same_blocks(&session(&host, params), &session(&device, params));
            let long = [40, 1, 230, 9, 3];
            for _ in 0..2 {
                let (a, b) = (
                    session_of(&host, params, &long),
                    session_of(&device, params, &long),
                );
                assert_same_blocks(&a, &b);
            }
            let req = ProposeRequest {
                anchor: 2,
                position: 0,
                gamma: 3,
            };
            let empty = |p: &dyn Proposer| {
                p.open(&params)
                    .expect("open")
                    .propose(&req)
                    .expect("propose")
            };
            assert_same_blocks(&[empty(&host)], &[empty(&device)]);
        }
    }
}

/// A session that sees its generation repeat itself proposes what followed the repeated
/// run (point masses, sampled or not), without running the model; with lookup off, and
/// before any repeat, the model drafts.
#[test]
fn a_repeating_generation_is_drafted_by_lookup() {
    let head = tiny_head(1);
    let model = Arc::new(busy_drafter(tiny_config(), &head, 3));
    let with = DsparkProposer::new(Arc::clone(&model), &head).expect("proposer");
    let without = DsparkProposer::new(model, &head)
        .expect("proposer")
        .with_lookup(false);
    let w = with.snapshot_spec().row_width();
    // The generation commits 21 22 23 24 21 22 23 24 ...: each round accepts the drafted
    // tokens that continue the cycle (what a greedy verifier would do).
    let cycle = [21u32, 22, 23, 24];
    for (p, lookup) in [(&with as &dyn Proposer, true), (&without, false)] {
        let mut s = p.open(&sampled(5)).expect("open");
        let mut pos = 3;
        s.extend(&rows(0, 3, w, 9)).expect("extend");
        let mut looked_up = 0;
        for _ in 0..16 {
            let anchor = cycle[pos % 4];
            let req = ProposeRequest {
                anchor,
                position: pos,
                gamma: 4,
            };
            let block = s.propose(&req).expect("propose");
            let accepted = (0..block.tokens.len())
                .take_while(|i| block.tokens[*i] == cycle[(pos + 1 + i) % 4])
                .count();
            if block.dists.iter().all(|d| d.ids.len() == 1) && block.tokens.len() >= 2 {
                looked_up += 1;
                let want: Vec<u32> = (1..=block.tokens.len())
                    .map(|i| cycle[(pos + i) % 4])
                    .collect();
                assert_eq!(block.tokens, want, "a looked-up block continues the cycle");
                assert!(block
                    .dists
                    .iter()
                    .zip(&block.tokens)
                    .all(|(d, t)| d.ids == [*t]));
            }
            s.extend(&rows(pos, 1 + accepted, w, pos as u64))
                .expect("extend");
            pos += 1 + accepted;
        }
        match lookup {
            true => assert!(looked_up >= 10, "only {looked_up} rounds looked up"),
            false => assert_eq!(looked_up, 0),
        }
    }
}

/// When the rows carry their tokens, the first proposal already finds a run of the prompt:
/// the anchor completes `5 6 7`, so what followed it in the prompt is proposed (source
/// lookup, point masses); without tokens the session knows no prompt and runs the model.
#[test]
fn the_prompt_is_looked_up_when_rows_carry_their_tokens() {
    let p = proposer(tiny_config());
    let w = p.snapshot_spec().row_width();
    let prompt = [2u32, 5, 6, 7, 30, 31, 9, 5, 6];
    for with_tokens in [true, false] {
        let mut s = p.open(&sampled(5)).expect("open");
        let mut r = rows(0, prompt.len(), w, 3);
        if with_tokens {
            r.tokens = prompt.to_vec();
        }
        s.extend(&r).expect("extend");
        let req = ProposeRequest {
            anchor: 7,
            position: prompt.len(),
            gamma: 4,
        };
        let block = s.propose(&req).expect("propose");
        match with_tokens {
            true => {
                assert_eq!(block.source, DraftSource::Lookup);
                assert_eq!(block.tokens, [30, 31, 9, 5]);
            }
            false => assert_eq!(block.source, DraftSource::Model),
        }
    }
    let mut s = p.open(&sampled(5)).expect("open");
    let mut bad = rows(0, 3, w, 3);
    bad.tokens = vec![1, 2];
    assert!(matches!(s.extend(&bad), Err(ProposeError::Invalid(_))));
}

/// A proposer's warm-up (a session through every block length) runs on the host and the
/// device drafter alike, and leaves them drafting what they drafted before.
#[test]
fn warming_up_leaves_drafting_unchanged() {
    let head = tiny_head(1);
    let model = Arc::new(busy_drafter(tiny_config(), &head, 3));
    let host = DsparkProposer::new(Arc::clone(&model), &head).expect("host");
    let device = DsparkProposer::on_device(model, &head, &Device::Cpu, true).expect("device");
    for p in [&host as &dyn Proposer, &device] {
        let before = session_of(p, SamplingParams::default(), &[40, 1, 9]);
        p.warm_up().expect("warm-up");
        assert_eq!(
            before,
            session_of(p, SamplingParams::default(), &[40, 1, 9])
        );
    }
}
