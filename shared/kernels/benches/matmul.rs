//! Matmul benchmarks at Gemma 3 270M shapes, M = 1 (decode) and M = 9
//! (speculative verification), of `matmul` (8-bit activations) and
//! the exact product (f32 activations: `LaneMatrix::matmul` for quantized
//! weights, `matmul` for F32 / F16), followed by a table of median times and
//! each precision's M = 9 / M = 1 cost ratio.
//!
//! The criterion runs and the "hot" columns reuse one matrix, which then
//! sits in cache. The "cold" columns cycle through enough copies of it
//! (about [`COLD_BYTES`]) that every call streams its weights from memory, as
//! in a real forward pass over all layers.
//!
//! Run with `cargo bench -p tandem-kernels --bench matmul`; pass
//! `-- --summary-only` to skip the criterion runs and print only the table,
//! and set `TANDEM_BENCH_ONLY` to a substring of the case names (e.g.
//! `Q8_0 262144`) to run only those cases.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use half::f16;
use tandem_kernels::{LaneMatrix, QMatrix, QType};

/// `(n, k)` projection shapes of Gemma 3 270M (hidden 640, MLP 2048).
const SHAPES: [(usize, usize); 3] = [(640, 640), (2048, 640), (640, 2048)];
/// The tied embedding / LM head: vocabulary 262144 × hidden 640.
const LM_HEAD: (usize, usize) = (262_144, 640);
const BATCHES: [usize; 2] = [1, 9];
/// Total size of the matrix copies used for cold-weight timings.
const COLD_BYTES: usize = 256 << 20;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random codes with small finite scales.
fn matrix(qtype: QType, n: usize, k: usize, rng: &mut XorShift) -> QMatrix {
    let bb = qtype.block_bytes();
    let mut bytes = vec![0u8; n * k / qtype.block_size() * bb];
    for blk in bytes.chunks_exact_mut(bb) {
        blk.iter_mut().for_each(|b| *b = rng.next() as u8);
        let scale = f16::from_f32(0.01 * rng.unit()).to_le_bytes();
        match qtype {
            QType::F32 => blk.copy_from_slice(&rng.unit().to_le_bytes()),
            QType::F16 => blk.copy_from_slice(&f16::from_f32(rng.unit()).to_le_bytes()),
            QType::Q6_K => blk[208..210].copy_from_slice(&scale),
            QType::Q8_K => blk[0..4].copy_from_slice(&(0.01 * rng.unit()).to_le_bytes()),
            QType::Q4_K | QType::Q5_K => {
                blk[0..2].copy_from_slice(&scale);
                blk[2..4].copy_from_slice(&scale);
            }
            _ => blk[0..2].copy_from_slice(&scale),
        }
    }
    match QMatrix::new(qtype, n, k, bytes) {
        Ok(w) => w,
        Err(e) => panic!("bench matrix: {e}"),
    }
}

/// Every benchmarked (type, n, k): each type on the shapes its block size
/// allows, plus the Q8_0 LM head.
fn cases() -> Vec<(QType, usize, usize)> {
    let mut cases: Vec<_> = QType::ALL
        .into_iter()
        .flat_map(|q| SHAPES.into_iter().map(move |(n, k)| (q, n, k)))
        .filter(|&(q, _, k)| k % q.block_size() == 0)
        .collect();
    cases.push((QType::Q8_0, LM_HEAD.0, LM_HEAD.1));
    cases
}

/// A matrix in ggml layout, and in lane layout when quantized.
#[derive(Clone)]
struct Weights {
    q: QMatrix,
    lanes: Option<LaneMatrix>,
}

impl Weights {
    fn new(q: QMatrix) -> Self {
        let lanes = (q.qtype().block_size() > 1).then(|| match LaneMatrix::pack(&q) {
            Ok(l) => l,
            Err(e) => panic!("lane layout: {e}"),
        });
        Weights { q, lanes }
    }
}

struct Case {
    name: String,
    w: Weights,
    x: Vec<f32>,
    out: Vec<f32>,
}

fn prepare(rng: &mut XorShift) -> Vec<Case> {
    let max_m = BATCHES[BATCHES.len() - 1];
    cases()
        .into_iter()
        .map(|(q, n, k)| Case {
            name: format!("{q:?} {n}x{k}"),
            w: Weights::new(matrix(q, n, k, rng)),
            x: (0..max_m * k).map(|_| rng.unit()).collect(),
            out: vec![0f32; max_m * n],
        })
        .collect()
}

/// The two products being compared.
#[derive(Clone, Copy)]
enum Path {
    /// `matmul`: activations quantized to 8 bits.
    Int8,
    /// The exact product: f32 activations.
    Exact,
}

fn run(w: &Weights, case: &mut Case, path: Path, m: usize) {
    let (k, n) = (w.q.k(), w.q.n());
    let (x, out) = (black_box(&case.x[..m * k]), &mut case.out[..m * n]);
    let result = match (path, &w.lanes) {
        (Path::Exact, Some(lanes)) => lanes.matmul(x, m, out),
        _ => w.q.matmul(x, m, out),
    };
    if let Err(e) = result {
        panic!("{}: {e}", case.name);
    }
    black_box(&case.out);
}

/// Median wall time of one call, over at least 0.4 s and 5 calls, cycling
/// through `copies` of the case's matrix (just the matrix itself if empty).
fn median_time(case: &mut Case, copies: &[Weights], path: Path, m: usize) -> Duration {
    let w = case.w.clone();
    let pick = |i: usize| copies.get(i % copies.len().max(1)).unwrap_or(&w);
    run(pick(0), case, path, m);
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || start.elapsed() < Duration::from_millis(400) {
        let w = pick(times.len() + 1);
        let t = Instant::now();
        run(w, case, path, m);
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

fn criterion_runs(cases: &mut [Case]) {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args();
    for case in cases.iter_mut() {
        let mut group = c.benchmark_group(case.name.clone());
        for (label, path) in [("int8 M", Path::Int8), ("exact M", Path::Exact)] {
            for m in BATCHES {
                let w = case.w.clone();
                group.bench_with_input(BenchmarkId::new(label, m), &m, |b, &m| {
                    b.iter(|| run(&w, case, path, m))
                });
            }
        }
        group.finish();
    }
    c.final_summary();
}

fn main() {
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let only = std::env::var("TANDEM_BENCH_ONLY").unwrap_or_default();
    let mut cases = prepare(&mut rng);
    cases.retain(|c| c.name.contains(only.as_str()));
    if !std::env::args().any(|a| a == "--summary-only") {
        criterion_runs(&mut cases);
    }
    // On a pool worker, as `Gemma3::forward` runs its matmuls: called from outside the
    // pool, every product would also pay a hand-off to the pool and back.
    rayon::scope(|_| summary(&mut cases));
}

/// The table of median times: per precision M = 1, M = 9 and their ratio (the
/// verification cost of a nine-token block in single-row products), hot and cold.
fn summary(cases: &mut [Case]) {
    println!(
        "\n{:<18} {:>5} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
        "weights n x k", "heat", "int8 M=1", "int8 M=9", "M9/M1", "exact M=1", "exact M=9", "M9/M1"
    );
    for case in cases {
        let count = COLD_BYTES / case.w.q.as_bytes().len();
        let copies: Vec<Weights> = (0..count).map(|_| case.w.clone()).collect();
        for (heat, copies) in [("hot", &[][..]), ("cold", &copies[..])] {
            let [[i1, i9], [e1, e9]] = [Path::Int8, Path::Exact]
                .map(|p| BATCHES.map(|m| median_time(case, copies, p, m).as_secs_f64() * 1e6));
            println!(
                "{:<18} {:>5} {:>10.1} {:>10.1} {:>7.2} {:>10.1} {:>10.1} {:>7.2}",
                case.name,
                heat,
                i1,
                i9,
                i9 / i1,
                e1,
                e9,
                e9 / e1
            );
        }
    }
    println!("(median microseconds per call, on a rayon pool worker; cold = weights streamed from memory)");
}
