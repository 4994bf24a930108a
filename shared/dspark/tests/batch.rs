//! Batched drafting: the blocks of several sessions drafted in one pass are bit for bit
//! the blocks each session gets drafting alone (tokens, confidences, distributions and
//! the sampler draws after), on the tiny head and on the real Gemma 3 270M head; an
//! invalid request fails alone; a batched proposer's concurrent sessions get the plain
//! proposer's blocks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tandem_core::batching::{StepObserver, StepReport};
use tandem_core::{DraftBlock, ProposeRequest, Proposer, Sampler, SamplingParams, SnapshotRows};
use tandem_dspark::{
    ContextCache, DraftBatching, DraftJob, DraftRequest, Drafter, DsparkConfig, DsparkError,
    DsparkProposer, TargetDims,
};
use tandem_gemma::TargetHead;
use tandem_testkit::{bits, real_gguf, Lcg};

/// One session of a batch: its context, request and sampling.
struct Case {
    cache: ContextCache,
    req: DraftRequest,
    params: SamplingParams,
}

fn params(rng: &mut Lcg, seed: u64) -> SamplingParams {
    match rng.bits32() % 3 {
        0 => SamplingParams::default(),
        1 => SamplingParams {
            temperature: 0.7,
            seed,
            ..SamplingParams::default()
        },
        _ => SamplingParams {
            temperature: 1.0,
            top_k: Some(20),
            top_p: 0.9,
            seed,
        },
    }
}

/// `n` sessions with random contexts (some empty), anchors, lengths and sampling.
fn cases(d: &Drafter, rng: &mut Lcg, n: usize, vocab: u32, gamma: usize) -> Vec<Case> {
    (0..n)
        .map(|i| {
            let mut cache = d.new_cache();
            let len = rng.bits32() as usize % 12;
            d.extend(&mut cache, &taps(rng, len, d.row_width()))
                .expect("extend");
            Case {
                cache,
                req: DraftRequest {
                    anchor: rng.bits32() % vocab,
                    gamma: 1 + rng.bits32() as usize % gamma,
                },
                params: params(rng, 100 + i as u64),
            }
        })
        .collect()
}

/// A block's tokens, confidence bits and distributions (ids, probability bits).
type BlockBits = (Vec<u32>, Vec<u32>, Vec<(Vec<u32>, Vec<u32>)>);

fn block_bits(b: &DraftBlock) -> BlockBits {
    let dists = b
        .dists
        .iter()
        .map(|d| (d.ids.clone(), bits(&d.probs)))
        .collect();
    (b.tokens.clone(), bits(&b.confidences), dists)
}

/// Drafts `cases` alone and together; asserts equal blocks and equal sampler states.
fn assert_batch_equals_alone(d: &Drafter, cases: &[Case]) {
    let samplers = || -> Vec<Sampler> {
        cases
            .iter()
            .map(|c| Sampler::new(c.params).expect("sampler"))
            .collect()
    };
    let mut alone_s = samplers();
    let alone: Vec<DraftBlock> = cases
        .iter()
        .zip(&mut alone_s)
        .map(|(c, s)| d.draft(&c.cache, &c.req, s).expect("draft alone"))
        .collect();
    let mut batch_s = samplers();
    let mut jobs: Vec<DraftJob<'_>> = cases
        .iter()
        .zip(&mut batch_s)
        .map(|(c, s)| DraftJob {
            cache: &c.cache,
            req: c.req,
            sampler: s,
        })
        .collect();
    let batch = d.draft_many(&mut jobs);
    assert_eq!(batch.len(), cases.len());
    for (i, (a, b)) in alone.iter().zip(batch).enumerate() {
        let b = b.expect("draft in a batch");
        assert_eq!(
            block_bits(a),
            block_bits(&b),
            "session {i} of {}",
            cases.len()
        );
    }
    for (a, b) in alone_s.iter_mut().zip(&mut batch_s) {
        assert_eq!(
            a.uniform().to_bits(),
            b.uniform().to_bits(),
            "sampler states"
        );
    }
}

#[test]
fn batched_blocks_equal_blocks_drafted_alone() {
    let head = tiny_head(1);
    for (c, vocab) in [(0u64, None), (1, Some((10..40).rev().collect()))] {
        let cfg = DsparkConfig {
            draft_vocab: vocab,
            ..tiny_config()
        };
        let d = busy_drafter(cfg, &head, 3 + c)
            .drafter(&head)
            .expect("drafter");
        let mut rng = Lcg::new(7 + c);
        for n in [1, 2, 3, 5, 8] {
            let cases = cases(&d, &mut rng, n, VOCAB as u32, 4);
            assert_batch_equals_alone(&d, &cases);
        }
    }
}

#[test]
fn an_invalid_request_fails_alone() {
    let head = tiny_head(1);
    let d = busy_drafter(tiny_config(), &head, 3)
        .drafter(&head)
        .expect("drafter");
    let mut rng = Lcg::new(5);
    let cases = cases(&d, &mut rng, 3, VOCAB as u32, 4);
    let bad = [
        DraftRequest {
            anchor: VOCAB as u32,
            gamma: 2,
        },
        DraftRequest {
            anchor: 3,
            gamma: 0,
        },
    ];
    for req in bad {
        let mut samplers: Vec<Sampler> = cases
            .iter()
            .map(|c| Sampler::new(c.params).expect("s"))
            .collect();
        let mut jobs: Vec<DraftJob<'_>> = cases
            .iter()
            .zip(&mut samplers)
            .enumerate()
            .map(|(i, (c, s))| DraftJob {
                cache: &c.cache,
                req: if i == 1 { req } else { c.req },
                sampler: s,
            })
            .collect();
        let out = d.draft_many(&mut jobs);
        assert!(
            matches!(out[1], Err(DsparkError::Invalid(_))),
            "{:?}",
            out[1]
        );
        for i in [0, 2] {
            let mut s = Sampler::new(cases[i].params).expect("s");
            let alone = d
                .draft(&cases[i].cache, &cases[i].req, &mut s)
                .expect("alone");
            let batched = out[i].as_ref().expect("valid job drafted");
            assert_eq!(block_bits(&alone), block_bits(batched));
        }
    }
}

/// On the real target head (8-bit activations in the restricted head, 32k draft ids).
#[test]
fn batched_blocks_equal_blocks_drafted_alone_on_the_real_head() {
    let head = TargetHead::load(&real_gguf()).expect("real head");
    let cfg = DsparkConfig::small(&TargetDims::of(&head));
    let d = busy_drafter(cfg, &head, 9).drafter(&head).expect("drafter");
    let mut rng = Lcg::new(11);
    let cases = cases(&d, &mut rng, 4, 32_768, 8);
    assert_batch_equals_alone(&d, &cases);
}

/// Counts the blocks of every batched step.
#[derive(Default)]
struct Blocks(std::sync::atomic::AtomicUsize);

impl StepObserver for Blocks {
    fn step(&self, r: &StepReport) {
        self.0
            .fetch_add(r.sequences, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Sessions of a batched proposer drafting at once from their own threads get the blocks
/// the plain proposer gives them, and every block went through the batching thread.
#[test]
fn a_batched_proposer_drafts_what_the_plain_one_drafts() {
    let head = tiny_head(1);
    let model = Arc::new(busy_drafter(tiny_config(), &head, 3));
    let plain = DsparkProposer::new(Arc::clone(&model), &head).expect("plain");
    let batching = DraftBatching {
        max_sessions: 3,
        max_wait: Duration::from_millis(20),
    };
    let batched = DsparkProposer::batched(model, &head, batching).expect("batched");
    let seen = Arc::new(Blocks::default());
    assert!(batched.observe_steps(seen.clone()));
    assert!(!plain.observe_steps(seen.clone()));
    let run = |p: &dyn Proposer| -> Vec<Vec<DraftBlock>> {
        let sessions: Vec<_> = (0..4)
            .map(|i| p.open(&params(&mut Lcg::new(i), 50 + i)).expect("open"))
            .collect();
        std::thread::scope(|s| {
            let threads: Vec<_> = sessions
                .into_iter()
                .enumerate()
                .map(|(i, mut session)| {
                    s.spawn(move || {
                        let width = session_width();
                        let mut rng = Lcg::new(90 + i as u64);
                        let mut blocks = Vec::new();
                        for round in 0..3 {
                            let rows = SnapshotRows {
                                start: round * 2,
                                width,
                                data: taps(&mut rng, 2, width),
                                tokens: Vec::new(),
                            };
                            session.extend(&rows).expect("extend");
                            let req = ProposeRequest {
                                anchor: (5 + i + round) as u32,
                                position: round * 2 + 2,
                                gamma: 1 + (i + round) % 4,
                            };
                            blocks.push(session.propose(&req).expect("propose"));
                        }
                        // Kept open until every session is done, so none drafts alone.
                        (blocks, session)
                    })
                })
                .collect();
            let done: Vec<_> = threads
                .into_iter()
                .map(|t| t.join().expect("session"))
                .collect();
            done.into_iter().map(|(blocks, _)| blocks).collect()
        })
    };
    let want = run(&plain);
    let got = run(&batched);
    for (w, g) in want.iter().zip(&got) {
        let bits = |b: &[DraftBlock]| b.iter().map(block_bits).collect::<Vec<_>>();
        assert_eq!(bits(w), bits(g));
    }
    assert_eq!(seen.0.load(std::sync::atomic::Ordering::SeqCst), 4 * 3);
}

/// Floats per snapshot row of the tiny drafter.
fn session_width() -> usize {
    let head = tiny_head(1);
    busy_drafter(tiny_config(), &head, 3)
        .drafter(&head)
        .expect("drafter")
        .row_width()
}
