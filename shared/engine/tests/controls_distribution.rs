//! Speculation stays lossless under every logit control: on a tiny synthetic target (six
//! tokens, logits a hash of the whole sequence so that every history has its own
//! distribution), sampled generations of three tokens — plain, and speculative with a
//! drafter that draws from a distribution of its own, verified token by token and as a
//! block, and seeded — are distributed as the target's distribution under the control (the repetition,
//! presence and frequency penalties, min-p, min_tokens), computed exactly by enumerating
//! every sequence. Each control is checked to change that distribution, so a control the
//! engine ignored would fail too.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tandem_core::{
    distribution, DraftBlock, DraftSource, History, LogitControls, Penalties, ProposeError,
    ProposeRequest, Proposer, ProposerSession, SamplingParams, SnapshotRows, SnapshotSpec,
    SnapshotSupport, SparseDist, TargetIdentity, Verification,
};
use tandem_engine::{
    Engine, GenerationRequest, Result, Target, TargetFacts, TargetSequence, TargetStep,
};
use tandem_gemma::{LogitsMode, TargetHead};
use tandem_tokenizer::GemmaTokenizer;

const VOCAB: usize = 6;
/// `<eos>` in the Gemma tokenizer, so the engine's end-of-sequence handling applies.
const EOS: u32 = 1;
const PROMPT: [u32; 3] = [2, 5, 3];
const NEW: usize = 3;
const DRAWS: u64 = 12_000;

/// The logits after `history`: a hash of the whole sequence, in [-2, 2).
fn logits_after(history: &[u32]) -> Vec<f32> {
    let h = history.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, t| {
        (h ^ u64::from(*t + 1)).wrapping_mul(0x100_0000_01b3)
    });
    (0..VOCAB as u64)
        .map(|v| {
            let mut x = h ^ v.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x ^= x >> 31;
            x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^= x >> 29;
            (x % 4000) as f32 / 1000.0 - 2.0
        })
        .collect()
}

struct Synthetic;

struct Sequence {
    tokens: Vec<u32>,
    max_len: usize,
}

impl Target for Synthetic {
    fn facts(&self) -> TargetFacts {
        TargetFacts {
            vocab_size: VOCAB,
            num_layers: 1,
            hidden_size: 1,
            max_context: 64,
            kv_bytes_per_position: 1,
        }
    }
    fn identity(&self) -> Result<TargetIdentity> {
        Ok(TargetIdentity {
            architecture: "synthetic".into(),
            embedding_hash: "0".into(),
        })
    }
    fn snapshot_support(&self) -> SnapshotSupport {
        SnapshotSupport {
            layers: 1,
            hidden: 1,
            ..SnapshotSupport::default()
        }
    }
    fn head(&self) -> Option<TargetHead> {
        None
    }
    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        Box::new(Sequence {
            tokens: Vec::new(),
            max_len,
        })
    }
}

impl TargetSequence for Sequence {
    fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        _: &SnapshotSpec,
    ) -> Result<TargetStep> {
        assert_eq!(pos, self.tokens.len());
        self.tokens.extend_from_slice(tokens);
        let rows: Vec<Vec<f32>> = (pos + 1..=self.tokens.len())
            .map(|end| logits_after(&self.tokens[..end]))
            .collect();
        let rows = match logits {
            LogitsMode::Last | LogitsMode::Bounded => rows[rows.len() - 1..].to_vec(),
            LogitsMode::None => Vec::new(),
            _ => rows,
        };
        let snapshot = vec![0.0; tokens.len()];
        let flat: Vec<f32> = rows.concat();
        let logits = Tensor::from_vec(flat, (rows.len(), VOCAB), &Device::Cpu)?;
        Ok(TargetStep {
            logits: Some(logits),
            top: None,
            bounded: Vec::new(),
            snapshot,
            drawn: None,
        })
    }
    fn len(&self) -> usize {
        self.tokens.len()
    }
    fn max_len(&self) -> usize {
        self.max_len
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.tokens.truncate(len);
        Ok(())
    }
}

/// A drafter that draws each token from a fixed skewed distribution of its own.
struct Skewed;

struct SkewedSession(ChaCha20Rng);

impl Proposer for Skewed {
    fn snapshot_spec(&self) -> SnapshotSpec {
        SnapshotSpec::taps(&[1], 1)
    }
    fn max_gamma(&self) -> usize {
        2
    }
    fn open(
        &self,
        s: &SamplingParams,
    ) -> std::result::Result<Box<dyn ProposerSession>, ProposeError> {
        Ok(Box::new(SkewedSession(ChaCha20Rng::seed_from_u64(
            s.seed ^ 0xd5,
        ))))
    }
}

impl ProposerSession for SkewedSession {
    fn extend(&mut self, _: &SnapshotRows) -> std::result::Result<(), ProposeError> {
        Ok(())
    }
    fn propose(&mut self, req: &ProposeRequest) -> std::result::Result<DraftBlock, ProposeError> {
        let q = SparseDist {
            ids: (0..VOCAB as u32).collect(),
            probs: vec![0.05, 0.1, 0.15, 0.2, 0.2, 0.3],
        };
        let tokens: Vec<u32> = (0..req.gamma)
            .map(|_| q.draw(self.0.random::<f64>()))
            .collect();
        Ok(DraftBlock {
            confidences: vec![0.5; tokens.len()],
            dists: vec![q; tokens.len()],
            tokens,
            source: DraftSource::Model,
            calibrated: false,
        })
    }
}

fn engine() -> Engine {
    let tokenizer =
        GemmaTokenizer::from_file(&tandem_testkit::real_tokenizer()).expect("tokenizer");
    Engine::new(Arc::new(Synthetic), Arc::new(tokenizer))
}

/// The request: three tokens at T = 0.9 (EOS ends only when `min_tokens` is in play).
fn request(controls: &LogitControls, verification: Verification) -> GenerationRequest {
    GenerationRequest {
        prompt: PROMPT.to_vec(),
        max_tokens: NEW,
        sampling: SamplingParams {
            temperature: 0.9,
            ..SamplingParams::default()
        },
        ignore_eos: controls.min_tokens == 0,
        penalties: controls.penalties,
        min_p: controls.min_p,
        min_tokens: controls.min_tokens,
        verification,
        ..GenerationRequest::default()
    }
}

/// Every output's exact probability under `controls`: the sequences of up to `NEW`
/// tokens (shorter ones end at EOS).
fn exact(controls: &LogitControls, eos_ends: bool) -> HashMap<Vec<u32>, f64> {
    let sampling = SamplingParams {
        temperature: 0.9,
        ..SamplingParams::default()
    };
    let mut out = HashMap::new();
    let mut open = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, p)) = open.pop() {
        if seq.len() == NEW || (eos_ends && seq.last() == Some(&EOS)) {
            *out.entry(seq).or_default() += p;
            continue;
        }
        let mut history = History::new(&PROMPT);
        seq.iter().for_each(|t| history.push(*t));
        let full: Vec<u32> = PROMPT.iter().chain(&seq).copied().collect();
        let mut logits = logits_after(&full);
        controls.apply(&mut logits, &history, &[], sampling.temperature);
        let dist = distribution(&logits, &sampling);
        for (id, q) in dist.ids.iter().zip(&dist.probs) {
            if *q > 0.0 {
                let mut next = seq.clone();
                next.push(*id);
                open.push((next, p * *q as f64));
            }
        }
    }
    out
}

/// Draws `DRAWS` generations and checks every output's frequency against its exact
/// probability (within 4.5 standard errors, plus a little slack for tiny masses).
fn check(controls: &LogitControls, proposer: Option<&dyn Proposer>, v: Verification) {
    let engine = engine();
    let want = exact(controls, controls.min_tokens > 0);
    let mut seen: HashMap<Vec<u32>, u64> = HashMap::new();
    let mut accepted = 0;
    for seed in 0..DRAWS {
        let mut req = request(controls, v);
        req.sampling.seed = seed;
        req.gamma = if proposer.is_some() { 2 } else { 0 };
        let out = engine
            .generate(&req, proposer, &mut |_| std::ops::ControlFlow::Continue(()))
            .expect("generate");
        assert_eq!(out.spec.proposer_failures, 0);
        accepted += out.spec.accepted_tokens;
        *seen.entry(out.tokens).or_default() += 1;
    }
    if proposer.is_some() {
        assert!(
            accepted > DRAWS / 10,
            "{accepted} drafts accepted in {DRAWS} generations"
        );
    }
    for seq in seen.keys() {
        assert!(
            want.contains_key(seq),
            "{seq:?} has probability 0 under {controls:?}"
        );
    }
    for (seq, p) in &want {
        let freq = *seen.get(seq).unwrap_or(&0) as f64 / DRAWS as f64;
        let se = (p * (1.0 - p) / DRAWS as f64).sqrt();
        assert!(
            (freq - p).abs() <= 4.5 * se + 5e-4,
            "{seq:?}: frequency {freq:.4}, probability {p:.4} under {controls:?} ({v:?}, speculative: {})",
            proposer.is_some()
        );
    }
}

fn total_variation(a: &HashMap<Vec<u32>, f64>, b: &HashMap<Vec<u32>, f64>) -> f64 {
    let keys: std::collections::HashSet<_> = a.keys().chain(b.keys()).collect();
    keys.iter()
        .map(|k| (a.get(*k).unwrap_or(&0.0) - b.get(*k).unwrap_or(&0.0)).abs())
        .sum::<f64>()
        / 2.0
}

fn cases() -> Vec<(&'static str, LogitControls)> {
    let penalties = |repetition, presence, frequency| LogitControls {
        penalties: Penalties {
            repetition,
            presence,
            frequency,
        },
        ..LogitControls::default()
    };
    vec![
        ("repetition", penalties(1.8, 0.0, 0.0)),
        ("presence", penalties(1.0, 1.5, 0.0)),
        ("frequency", penalties(1.0, 0.0, -1.2)),
        (
            "min_p",
            LogitControls {
                min_p: 0.3,
                ..LogitControls::default()
            },
        ),
        (
            "min_tokens",
            LogitControls {
                min_tokens: 2,
                end_ids: vec![EOS],
                ..LogitControls::default()
            },
        ),
    ]
}

#[test]
fn every_control_changes_the_target_distribution() {
    for (name, controls) in cases() {
        let off = LogitControls {
            end_ids: controls.end_ids.clone(),
            ..LogitControls::default()
        };
        let eos = controls.min_tokens > 0;
        let tv = total_variation(&exact(&controls, eos), &exact(&off, eos));
        assert!(tv > 0.05, "{name}: total variation {tv}");
    }
}

#[test]
fn plain_sampling_follows_each_control() {
    for (_, controls) in cases() {
        check(&controls, None, Verification::Token);
    }
}

#[test]
fn speculative_sampling_follows_each_control_token_by_token() {
    for (_, controls) in cases() {
        check(&controls, Some(&Skewed), Verification::Token);
    }
}

#[test]
fn speculative_sampling_follows_each_control_as_a_block() {
    for (_, controls) in cases() {
        check(&controls, Some(&Skewed), Verification::Block);
    }
}

#[test]
fn seeded_sampling_follows_each_control_and_speculation_changes_no_token() {
    let engine = engine();
    for (_, controls) in cases() {
        check(&controls, Some(&Skewed), Verification::Seeded);
        for seed in 0..200 {
            let mut req = request(&controls, Verification::Seeded);
            req.sampling.seed = seed;
            let run = |gamma, p: Option<&dyn Proposer>| {
                let req = GenerationRequest {
                    gamma,
                    ..req.clone()
                };
                let flow = &mut |_: &_| std::ops::ControlFlow::Continue(());
                engine.generate(&req, p, flow).expect("generate").tokens
            };
            assert_eq!(run(0, None), run(2, Some(&Skewed)), "seed {seed}");
        }
    }
}
