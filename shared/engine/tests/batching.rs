//! Continuous batching on the real Gemma 3 270M: generations that run at the same time on a
//! batched engine (their forwards in shared steps, prompts prefilled in chunks) emit exactly
//! what each emits alone on an unbatched engine — greedy, token-wise and seeded sampling,
//! plain and speculative, fixed γ and scheduled — while sessions of different lengths join and leave
//! mid-run; the steps really held several sessions. The device target's batched steps
//! (slots of a KV pool; here on candle's CPU backend in f32) do the same against the device
//! target run unbatched, with more generations than slots; plain rounds sampled at a
//! temperature alone have their tokens drawn by the device's steps.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device};
use common::{generate, reference, request, spec_270m, Oracle, Spoil, PROMPTS};
use tandem_core::{SamplingParams, Verification};
use tandem_engine::{
    BatchLimits, Engine, GenerationRequest, Placement, StepObserver, StepReport, TargetFiles,
};
use tandem_gemma::DeviceOptions;
use tandem_testkit::{real_gguf, real_tokenizer};

/// Counts steps and the most sessions and rows one step held.
#[derive(Default)]
struct Steps {
    steps: AtomicUsize,
    most_sequences: AtomicUsize,
    most_rows: AtomicUsize,
    rows: Mutex<Vec<usize>>,
    unbatched: AtomicUsize,
    drawn: AtomicUsize,
}

impl StepObserver for Steps {
    fn step(&self, r: &StepReport) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.most_sequences
            .fetch_max(r.sequences, Ordering::Relaxed);
        self.most_rows.fetch_max(r.rows, Ordering::Relaxed);
        self.rows.lock().expect("rows").push(r.rows);
        self.drawn.fetch_add(r.drawn, Ordering::Relaxed);
    }

    fn unbatched(&self) {
        self.unbatched.fetch_add(1, Ordering::Relaxed);
    }
}

/// One generation of the mix: its request and whether an oracle drafts for it.
struct Job {
    req: GenerationRequest,
    oracle: Option<Oracle>,
}

fn jobs() -> Vec<Job> {
    (0..8)
        .map(|i| {
            let prompt = PROMPTS[i * 2 % PROMPTS.len()];
            let max_tokens = 12 + 6 * i;
            let gamma = if i % 2 == 0 { 4 } else { 0 };
            let mut req = request(prompt, max_tokens, gamma);
            // Half the speculating ones take the batch scheduler's lengths.
            req.adaptive_gamma = i % 4 == 0;
            // 2 and 3 sample token-wise at a temperature alone (plain rounds draw from
            // bounded rows), 6 and 7 seeded with top-p.
            if i % 4 == 3 || i % 4 == 2 {
                req.sampling = SamplingParams {
                    temperature: 0.8,
                    top_p: if i < 4 { 1.0 } else { 0.95 },
                    seed: 1000 + i as u64,
                    ..SamplingParams::default()
                };
                if i >= 4 {
                    req.verification = Verification::Seeded;
                }
            }
            let oracle = (gamma > 0).then(|| Oracle {
                reference: reference(prompt, max_tokens),
                spoil: Spoil::Rotating,
                spec: spec_270m(),
                max_gamma: 8,
            });
            Job { req, oracle }
        })
        .collect()
}

/// The tokens `engine` generates for `job` (its oracle drafting, where it has one).
fn tokens(engine: &Engine, job: &Job) -> Vec<u32> {
    let proposer = job.oracle.as_ref().map(|o| o as _);
    let mut sink = |_: &tandem_engine::Update| std::ops::ControlFlow::Continue(());
    let out = engine.generate(&job.req, proposer, &mut sink);
    out.expect("generation").tokens
}

/// Each job's tokens, generated on `engine` on threads of their own, joining a few steps
/// apart (and, with their different lengths, leaving at different times).
fn concurrently(engine: &Engine, jobs: &[Job]) -> Vec<Vec<u32>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(40 * i as u64));
                    tokens(engine, j)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("generation thread"))
            .collect()
    })
}

#[test]
fn batched_generations_equal_their_unbatched_runs() {
    let files = TargetFiles {
        model: real_gguf(),
        tokenizer: real_tokenizer(),
    };
    let steps = Arc::new(Steps::default());
    let limits = BatchLimits {
        max_rows: 64,
        prefill_chunk: 8,
        ..BatchLimits::default()
    };
    let placement = Placement::Cpu(Default::default());
    let batched =
        Engine::load_batched(&files, &placement, Some(limits)).expect("the batched target");
    assert!(
        batched.model().observe_steps(steps.clone()),
        "the target batches"
    );
    let jobs = jobs();
    let want: Vec<Vec<u32>> = jobs
        .iter()
        .map(|j| generate(&j.req, j.oracle.as_ref().map(|o| o as _)).0.tokens)
        .collect();
    let got = concurrently(&batched, &jobs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "generation {i} differs from its unbatched run");
        assert_eq!(g.len(), jobs[i].req.max_tokens);
    }
    let most = steps.most_sequences.load(Ordering::Relaxed);
    assert!(most >= 2, "no step held two sessions (most {most})");
    let rows = steps.rows.lock().expect("rows");
    assert!(
        rows.iter().all(|r| *r <= 64),
        "a step exceeded max_rows: {rows:?}"
    );
}

/// The device target (candle's CPU backend, f32) unbatched, and batched over a pool of
/// `slots` KV slots with its steps counted.
fn device_engines(slots: usize) -> (Engine, Engine, Arc<Steps>) {
    let files = TargetFiles {
        model: real_gguf(),
        tokenizer: real_tokenizer(),
    };
    let placement = Placement::Device(DeviceOptions::new(Device::Cpu, DType::F32));
    let alone = Engine::load(&files, &placement).expect("the device target");
    let limits = BatchLimits {
        slots,
        prefill_chunk: 8,
        ..BatchLimits::default()
    };
    let batched =
        Engine::load_batched(&files, &placement, Some(limits)).expect("the batched target");
    let steps = Arc::new(Steps::default());
    assert!(batched.model().observe_steps(steps.clone()));
    (alone, batched, steps)
}

/// The device target batched over a pool of 3 KV slots against the same target unbatched:
/// five generations (plain, speculative, seeded sampling) at once, the two that find no
/// free slot running alone beside the batch; steps held several sessions.
#[test]
fn batched_device_generations_equal_their_unbatched_runs() {
    let (alone, batched, steps) = device_engines(3);
    let jobs: Vec<Job> = jobs()
        .into_iter()
        .take(5)
        .map(|mut j| {
            j.req.max_tokens = j.req.max_tokens.min(20);
            j
        })
        .collect();
    let want: Vec<Vec<u32>> = jobs.iter().map(|j| tokens(&alone, j)).collect();
    let got = concurrently(&batched, &jobs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "generation {i} differs from its unbatched run");
    }
    let most = steps.most_sequences.load(Ordering::Relaxed);
    assert!(most >= 2, "no step held two sessions (most {most})");
    assert_eq!(steps.unbatched.load(Ordering::Relaxed), 2, "two ran alone");
}

/// Plain generations sampled at a temperature alone (token-wise and seeded) on the device
/// target's batched steps, which draw their tokens (every row's reduced together), emit
/// what each emits alone.
#[test]
fn batched_device_steps_draw_plain_sampled_tokens() {
    let (alone, batched, steps) = device_engines(4);
    let jobs: Vec<Job> = (0..3)
        .map(|i| {
            let mut req = request(PROMPTS[i], 10, 0);
            req.sampling = SamplingParams {
                temperature: [0.7, 1.0, 0.9][i],
                seed: 77 + i as u64,
                ..SamplingParams::default()
            };
            req.verification = [Verification::Token, Verification::Seeded][i % 2];
            Job { req, oracle: None }
        })
        .collect();
    let want: Vec<Vec<u32>> = jobs.iter().map(|j| tokens(&alone, j)).collect();
    let got = concurrently(&batched, &jobs);
    assert_eq!(got, want, "drawn in the steps as each draws alone");
    assert_eq!(steps.unbatched.load(Ordering::Relaxed), 0);
    // Every token after a generation's first comes from a plain round its step drew.
    let drawn = steps.drawn.load(Ordering::Relaxed);
    assert_eq!(drawn, 3 * 9, "tokens drawn by the steps");
    assert!(steps.most_sequences.load(Ordering::Relaxed) >= 2);
}
