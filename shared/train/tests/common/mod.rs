//! Test helpers: a tiny random Gemma 3 target (`tandem_gemma::testing`) and a tiny drafter
//! setup over it.

use tandem_dspark::{Dspark, DsparkConfig};
use tandem_gemma::testing::{tiny_config, write_hf};
use tandem_gemma::Gemma3;
use tandem_testkit::Lcg;
use tandem_train::optim::{AdamWConfig, LrSchedule};
use tandem_train::teacher::{Pool, TeacherConfig};
use tandem_train::TrainConfig;

pub const GAMMA: usize = 4;

/// A tiny target loaded from a fresh temporary folder.
pub fn tiny_target() -> (tempfile::TempDir, Gemma3) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &tiny_config(), 7);
    let model = Gemma3::load(dir.path()).expect("load tiny target");
    (dir, model)
}

pub fn teacher() -> TeacherConfig {
    TeacherConfig {
        taps: vec![1, 3, 5, 6],
        continuation_tokens: 16,
        keep: 16,
        forced: false,
        batch: 4,
        temperatures: Vec::new(),
        seed: 0,
    }
}

/// Train and held-out pools of random prompts (BOS first).
pub fn pools(train: usize, held_out: usize) -> (Pool, Pool) {
    let mut rng = Lcg::new(11);
    let mut prompt = || {
        let mut p = vec![2];
        p.extend(rng.tokens(7, 96).into_iter().map(|t| t.max(3)));
        p
    };
    let train = (0..train).map(|_| prompt()).collect();
    let held = (0..held_out).map(|_| prompt()).collect();
    (Pool::new(train, teacher()), Pool::new(held, teacher()))
}

/// A tiny drafter over the `vocab` ids.
pub fn drafter(model: &Gemma3, vocab: Vec<u32>, seed: u64) -> Dspark {
    let cfg = DsparkConfig {
        gamma: GAMMA,
        d_draft: 32,
        n_layers: 1,
        n_heads: 4,
        markov_rank: 8,
        ff_mult: 2,
        tap_layers: teacher().taps,
        draft_vocab: Some(vocab),
    };
    Dspark::init(cfg, &model.head(), seed).expect("init drafter")
}

pub fn train_config(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        samples_per_step: 4,
        anchors_per_sample: 4,
        schedule: LrSchedule {
            peak: 3e-3,
            warmup: 3,
            total: steps,
            floor: 0.1,
        },
        adamw: AdamWConfig::default(),
        seed: 5,
        eval_every: 0,
        eval_stride: 1,
        checkpoint_every: 0,
        train_only: Vec::new(),
        corpus_weights: Vec::new(),
        tv_temperature: 1.0,
        device: candle_core::Device::Cpu,
    }
}
