//! Blocks of an assistant session on the tiny random Gemma 4 target and assistants of the
//! transformers goldens (`shared/gemma/tests/fixtures/gemma4`), against the assistant run
//! directly on the target's cache: sampled blocks are drawn step by step from the
//! assistant's distribution under the request's sampling, each drawn token fed to the next
//! step, carry exactly those distributions and the drawn tokens' probabilities, and
//! reproduce from the seed; greedy blocks are the greedy drafts as point masses, with the
//! greedy tokens' softmax probabilities. A calibrated assistant sends the same blocks
//! with its confidences mapped by the regime of the request, and its calibration file
//! round-trips, a stale version refused.
#![allow(missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tandem_assistant::{
    load_calibration, save_calibration, AssistantOptions, AssistantProposer, DRAFT_SEED_MIX,
};
use tandem_core::calibration::{
    Calibration, PositionFit, PositionMap, Regime, SourceFit, CALIBRATION_VERSION,
};
use tandem_core::{
    distribution, DraftBlock, DraftSource, ProposeRequest, Proposer, ProposerSession, Sampler,
    SamplingParams, SnapshotRows, SparseDist,
};
use tandem_engine::{Gemma4Target, Target};
use tandem_gemma::gemma4::{DraftRow, Gemma4, Gemma4Assistant, Gemma4Cache};
use tandem_gemma::LogitsMode;

const PROMPT: [u32; 10] = [2, 17, 200, 45, 99, 3, 128, 77, 250, 5];
const ANCHOR: u32 = 61;
const GAMMA: usize = 6;
const ASSISTANTS: [&str; 2] = ["assistant_dense", "assistant_centroids"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gemma/tests/fixtures/gemma4")
}

fn proposer(name: &str) -> AssistantProposer {
    let opts = AssistantOptions { max_gamma: 8 };
    AssistantProposer::load(&fixtures().join(name), &fixtures().join("target_ple"), opts).unwrap()
}

/// The prompt run by the target: its snapshot rows for a session, and its cache and last
/// hidden state for the assistant run directly.
struct Prefix {
    model: Arc<Gemma4>,
    rows: SnapshotRows,
    cache: Gemma4Cache,
    hidden: Vec<f32>,
}

fn prefix() -> Prefix {
    let model = Arc::new(Gemma4::load(&fixtures().join("target_ple")).unwrap());
    let target = Gemma4Target::new(Arc::clone(&model)).unwrap();
    let spec = proposer(ASSISTANTS[0]).snapshot_spec();
    let step = target
        .start(64)
        .forward(&PROMPT, 0, LogitsMode::None, &spec)
        .unwrap();
    let rows = SnapshotRows {
        start: 0,
        width: spec.row_width(),
        data: step.snapshot,
        tokens: Vec::new(),
    };
    let mut cache = model.new_cache(64);
    let out = model
        .forward(&PROMPT, 0, &mut cache, LogitsMode::None)
        .unwrap();
    let hidden = out.last_hidden.to_vec2::<f32>().unwrap().pop().unwrap();
    Prefix {
        model,
        rows,
        cache,
        hidden,
    }
}

const REQUEST: ProposeRequest = ProposeRequest {
    anchor: ANCHOR,
    position: PROMPT.len(),
    gamma: GAMMA,
};

fn session(name: &str, sampling: &SamplingParams, p: &Prefix) -> Box<dyn ProposerSession> {
    let mut session = proposer(name).open(sampling).unwrap();
    session.extend(&p.rows).unwrap();
    session
}

/// The assistant and its first row after the prompt, run on the target's cache.
fn assistant<'p>(name: &str, p: &'p Prefix) -> (Gemma4Assistant, DraftRow<'p>) {
    let row = DraftRow {
        token: ANCHOR,
        hidden: &p.hidden,
        position: PROMPT.len(),
        donors: p.cache.donors().unwrap(),
    };
    (Gemma4Assistant::load(&fixtures().join(name)).unwrap(), row)
}

/// The assistant run on the target's cache after the prompt, `choose` picking each step's
/// token from its logits.
fn direct(name: &str, p: &Prefix, mut choose: impl FnMut(&[f32]) -> u32) -> Vec<u32> {
    let (assistant, row) = assistant(name, p);
    let drafts = assistant
        .draft_with(&p.model.embedding(), &[row], GAMMA, |_, logits| {
            choose(logits)
        })
        .unwrap();
    drafts[0].tokens.clone()
}

/// What every block says of itself: one normalised distribution per token that gives it
/// the probability sent as its confidence, drafted by the model, uncalibrated.
fn check_block(block: &DraftBlock, what: &str) {
    assert_eq!(block.tokens.len(), GAMMA, "{what}");
    assert_eq!(block.dists.len(), GAMMA, "{what}");
    assert_eq!(block.confidences.len(), GAMMA, "{what}");
    for ((t, d), c) in block
        .tokens
        .iter()
        .zip(&block.dists)
        .zip(&block.confidences)
    {
        let total: f64 = d.probs.iter().map(|p| f64::from(*p)).sum();
        assert!((total - 1.0).abs() < 1e-5, "{what}: total {total}");
        assert!(
            d.prob(*t) > 0.0,
            "{what}: token {t} outside its distribution"
        );
        assert!(*c > 0.0 && *c <= 1.0, "{what}: confidence {c}");
    }
    assert_eq!(block.source, DraftSource::Model);
    assert!(!block.calibrated);
}

fn sampled(temperature: f32, top_k: Option<usize>, top_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: 11,
    }
}

#[test]
fn sampled_blocks_are_drawn_from_the_assistants_distributions() {
    let p = prefix();
    let settings = [
        sampled(1.0, None, 1.0),
        sampled(0.7, Some(20), 1.0),
        sampled(0.9, None, 0.8),
        sampled(1.3, Some(40), 0.95),
    ];
    for name in ASSISTANTS {
        for params in settings {
            let what = format!("{name} {params:?}");
            let block = session(name, &params, &p).propose(&REQUEST).unwrap();
            check_block(&block, &what);
            let mixed = SamplingParams {
                seed: params.seed ^ DRAFT_SEED_MIX,
                ..params
            };
            let mut sampler = Sampler::new(mixed).unwrap();
            let mut dists: Vec<SparseDist> = Vec::new();
            let tokens = direct(name, &p, |logits| {
                let d = distribution(logits, &params).without_tail(logits.len());
                let t = d.draw(sampler.uniform());
                dists.push(d);
                t
            });
            assert_eq!(block.tokens, tokens, "{what}");
            assert_eq!(block.dists, dists, "{what}");
            let probs: Vec<f32> = tokens.iter().zip(&dists).map(|(t, d)| d.prob(*t)).collect();
            assert_eq!(block.confidences, probs, "{what}");
        }
    }
}

#[test]
fn seeded_sessions_reproduce_and_other_seeds_differ() {
    let p = prefix();
    let blocks = |params: &SamplingParams| -> Vec<Vec<u32>> {
        let mut s = session(ASSISTANTS[1], params, &p);
        (0..3)
            .map(|_| s.propose(&REQUEST).unwrap().tokens)
            .collect()
    };
    let params = sampled(1.0, None, 1.0);
    let first = blocks(&params);
    assert_eq!(blocks(&params), first);
    assert_ne!(first[0], first[1], "the stream goes on from block to block");
    assert_ne!(blocks(&SamplingParams { seed: 12, ..params }), first);
}

/// Greedy requests (temperature 0, or top-k 1) draft the greedy tokens whatever the seed,
/// as point masses sent with the greedy token's probability at temperature 1.
#[test]
fn greedy_blocks_are_the_greedy_drafts_as_point_masses() {
    let p = prefix();
    for name in ASSISTANTS {
        let (model, row) = assistant(name, &p);
        let tokens = model.draft(&p.model.embedding(), &[row], GAMMA).unwrap()[0]
            .tokens
            .clone();
        let mut softmax = Vec::new();
        let forced = direct(name, &p, |logits| {
            let t = tokens[softmax.len()];
            let z: f64 = logits.iter().map(|l| f64::from(*l).exp()).sum();
            softmax.push(f64::from(logits[t as usize]).exp() / z);
            t
        });
        assert_eq!(forced, tokens);
        for params in [
            SamplingParams::default(),
            SamplingParams {
                top_k: Some(1),
                ..sampled(0.7, None, 1.0)
            },
        ] {
            let block = session(name, &params, &p).propose(&REQUEST).unwrap();
            check_block(&block, name);
            assert_eq!(block.tokens, tokens, "{name}");
            assert_eq!(
                block,
                DraftBlock {
                    confidences: block.confidences.clone(),
                    ..DraftBlock::point_masses(tokens.clone(), 1.0)
                }
            );
            for (c, s) in block.confidences.iter().zip(&softmax) {
                assert!((f64::from(*c) - s).abs() < 1e-6, "{name}: {c} vs {s}");
            }
        }
    }
}

/// A calibration whose greedy regime sharpens and whose T = 1 regime flattens every
/// position of the model's tokens.
fn calibration() -> Calibration {
    let regime = |temperature: f32, scale: f64| Regime {
        temperature,
        sources: vec![SourceFit {
            source: DraftSource::Model.as_str().into(),
            positions: vec![PositionFit {
                map: PositionMap::Temperature { temperature: scale },
                observations: 100,
            }],
        }],
    };
    Calibration {
        version: CALIBRATION_VERSION,
        regimes: vec![regime(0.0, 0.5), regime(1.0, 2.0)],
    }
}

#[test]
fn calibrated_sessions_map_confidences_by_the_requests_regime() {
    let (p, cal) = (prefix(), calibration());
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(load_calibration(tmp.path()).unwrap(), None);
    save_calibration(tmp.path(), &cal).unwrap();
    let loaded = load_calibration(tmp.path()).unwrap().unwrap();
    assert_eq!(loaded, cal);
    for params in [SamplingParams::default(), sampled(0.9, None, 1.0)] {
        let raw = session(ASSISTANTS[0], &params, &p)
            .propose(&REQUEST)
            .unwrap();
        let mut s = proposer(ASSISTANTS[0])
            .with_calibration(Some(loaded.clone()))
            .open(&params)
            .unwrap();
        s.extend(&p.rows).unwrap();
        let block = s.propose(&REQUEST).unwrap();
        assert!(block.calibrated);
        assert_eq!((&block.tokens, &block.dists), (&raw.tokens, &raw.dists));
        let mut expected = raw.confidences.clone();
        assert!(cal
            .regime(params.temperature)
            .unwrap()
            .apply(DraftSource::Model, &mut expected));
        assert_eq!(block.confidences, expected);
        assert_ne!(block.confidences, raw.confidences);
    }
    let stale = cal
        .to_json()
        .replacen("\"version\": 1", "\"version\": 7", 1);
    std::fs::write(tmp.path().join("calibration.json"), stale).unwrap();
    let err = load_calibration(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("run tandem calibrate again"), "{err}");
}
