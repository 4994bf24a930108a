//! Cost of one DSpark drafting round on this CPU with a drafter sized for Gemma 3 270M
//! (hidden 640, 18 layers) and the real Q4_K_M head read from the models folder
//! (`tandem_testkit::models_dir`): `propose` of a γ = 8 block with
//! the context already in the session cache, and `extend` by one round's 9 rows, at context
//! 256 and 1024, with the full 262 144-token vocabulary and with a 32k draft vocabulary;
//! then `propose` of the shipped general drafter (`drafters/gemma-3-270m-dspark-general`,
//! saved in f16) at γ = 1, 2, 4 and 8 from a 128-position context.
//!
//! Run with `cargo bench -p tandem-dspark --bench block_cost` (`-- shipped` for the last
//! group alone).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion};
use tandem_core::{ProposeRequest, Proposer, ProposerSession, SamplingParams, SnapshotRows};
use tandem_dspark::{Dspark, DsparkConfig, DsparkProposer};
use tandem_gemma::TargetHead;
use tandem_testkit::real_gguf;

const GAMMA: usize = 8;
const CONTEXTS: [usize; 2] = [256, 1024];
/// Rows committed by one fully accepted round (γ drafted + the bonus).
const ROUND_ROWS: usize = GAMMA + 1;

fn config(draft_vocab: Option<Vec<u32>>) -> DsparkConfig {
    DsparkConfig {
        gamma: GAMMA,
        d_draft: 512,
        n_layers: 4,
        n_heads: 8,
        markov_rank: 128,
        ff_mult: 2,
        tap_layers: vec![5, 11, 17, 18],
        draft_vocab,
    }
}

fn rows(start: usize, n: usize, width: usize) -> SnapshotRows {
    let data = (0..n * width)
        .map(|i| ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 3.0)
        .collect();
    SnapshotRows {
        start,
        width,
        data,
        tokens: Vec::new(),
    }
}

fn session(p: &DsparkProposer, ctx: usize) -> Box<dyn ProposerSession> {
    let width = p.snapshot_spec().row_width();
    let mut s = p.open(&SamplingParams::default()).expect("open");
    s.extend(&rows(0, ctx, width)).expect("extend");
    s
}

fn bench(c: &mut Criterion) {
    let head = TargetHead::load(&real_gguf()).expect("the real head");
    let vocabs = [("full", None), ("32k", Some((0..32_768).collect()))];
    let mut group = c.benchmark_group("dspark_block");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    for (name, vocab) in vocabs {
        let model = Arc::new(Dspark::init(config(vocab), &head, 1).expect("init"));
        let p = DsparkProposer::new(model, &head).expect("proposer");
        let width = p.snapshot_spec().row_width();
        for ctx in CONTEXTS {
            let mut s = session(&p, ctx);
            let req = ProposeRequest {
                anchor: 818,
                position: ctx,
                gamma: GAMMA,
            };
            group.bench_function(BenchmarkId::new(format!("propose_{name}"), ctx), |b| {
                b.iter(|| s.propose(&req).expect("propose"))
            });
            group.bench_function(BenchmarkId::new(format!("extend9_{name}"), ctx), |b| {
                b.iter_batched(
                    || session(&p, ctx),
                    |mut s| s.extend(&rows(ctx, ROUND_ROWS, width)).expect("extend"),
                    BatchSize::PerIteration,
                )
            });
        }
    }
    group.finish();
}

/// The shipped general drafter's blocks of each length from a 128-position context.
fn shipped(c: &mut Criterion, head: &TargetHead) {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/gemma-3-270m-dspark-general");
    let model = Arc::new(Dspark::load(&dir, head).expect("the shipped general drafter"));
    let p = DsparkProposer::new(model, head).expect("proposer");
    let mut s = session(&p, 128);
    let mut group = c.benchmark_group("dspark_shipped_general");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4));
    for gamma in [1, 2, 4, 8] {
        let req = ProposeRequest {
            anchor: 818,
            position: 128,
            gamma,
        };
        group.bench_function(BenchmarkId::new("propose", gamma), |b| {
            b.iter(|| s.propose(&req).expect("propose"))
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    let head = TargetHead::load(&real_gguf()).expect("the real head");
    shipped(&mut c, &head);
    c.final_summary();
}
