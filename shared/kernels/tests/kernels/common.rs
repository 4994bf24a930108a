//! Shared test helpers: deterministic random data, random ggml matrices and
//! independent f64 references.

use half::f16;
use tandem_kernels::{Isa, LaneMatrix, QMatrix, QType};

/// SplitMix64: small deterministic generator for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The instruction sets this machine can run.
pub fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Amx]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

/// A random `n × k` matrix of `qtype`: random bytes for the codes (every bit
/// pattern is legal) with finite, moderate scales patched in.
pub fn random_matrix(qtype: QType, n: usize, k: usize, rng: &mut Rng) -> QMatrix {
    let nblocks = n * k / qtype.block_size();
    let bb = qtype.block_bytes();
    let mut bytes = vec![0u8; nblocks * bb];
    for blk in bytes.chunks_exact_mut(bb) {
        for b in blk.iter_mut() {
            *b = rng.next_u64() as u8;
        }
        let mut put_f16 = |at: usize, scale: f32, rng: &mut Rng| {
            blk[at..at + 2].copy_from_slice(&f16::from_f32(rng.unit() * scale).to_le_bytes());
        };
        match qtype {
            QType::F32 => blk.copy_from_slice(&rng.unit().to_le_bytes()),
            QType::F16 => put_f16(0, 1.0, rng),
            QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => put_f16(0, 0.05, rng),
            QType::Q4_K | QType::Q5_K => {
                put_f16(0, 0.01, rng);
                put_f16(2, 0.01, rng);
            }
            QType::Q6_K => put_f16(208, 0.01, rng),
            QType::Q8_K => blk[0..4].copy_from_slice(&(rng.unit() * 0.01).to_le_bytes()),
        }
    }
    match QMatrix::new(qtype, n, k, bytes) {
        Ok(w) => w,
        Err(e) => panic!("random matrix rejected: {e}"),
    }
}

/// Random activations, `m × k`: each row has its own magnitude, some blocks
/// of 32 are all zero and some elements are outliers.
pub fn random_acts(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = vec![0f32; m * k];
    for row in x.chunks_exact_mut(k) {
        let scale = 10f32.powf(2.0 * rng.unit());
        for blk in row.chunks_mut(32) {
            if rng.below(8) == 0 {
                continue;
            }
            for v in blk.iter_mut() {
                *v = scale * rng.unit() * if rng.below(50) == 0 { 20.0 } else { 1.0 };
            }
        }
    }
    x
}

/// Random `k` for `qtype`: 1..=`max_blocks` whole blocks, or for F32/F16 any
/// length up to `max_blocks * 32` (to exercise the tails).
pub fn random_k(qtype: QType, max_blocks: usize, rng: &mut Rng) -> usize {
    match qtype {
        QType::F32 | QType::F16 => 1 + rng.below(max_blocks * 32),
        _ => qtype.block_size() * (1 + rng.below(max_blocks)),
    }
}

/// Runs `w.matmul_with(isa, x, m)` into a fresh buffer.
pub fn matmul(w: &QMatrix, isa: Isa, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.n()];
    if let Err(e) = w.matmul_with(isa, x, m, &mut out) {
        panic!("matmul failed: {e}");
    }
    out
}

/// The exact product: a quantized `w` repacked as a `LaneMatrix`, an
/// unquantized one as it is (its `matmul` is exact), into a fresh buffer.
pub fn exact(w: &QMatrix, isa: Isa, x: &[f32], m: usize) -> Vec<f32> {
    if w.qtype().block_size() == 1 {
        return matmul(w, isa, x, m);
    }
    let lanes = LaneMatrix::pack(w).expect("a quantized matrix packs");
    let mut out = vec![f32::NAN; m * w.n()];
    if let Err(e) = lanes.matmul_with(isa, x, m, &mut out) {
        panic!("lane matmul failed: {e}");
    }
    out
}

/// A product under test: [`matmul`] or [`exact`].
pub type Product = fn(&QMatrix, Isa, &[f32], usize) -> Vec<f32>;

/// Block size of the activation quantization used for `qtype` weights
/// (1 means unquantized).
pub fn act_block(qtype: QType) -> usize {
    match qtype {
        QType::F32 | QType::F16 => 1,
        QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => 32,
        _ => 256,
    }
}

/// Independent re-implementation of the activation quantization the kernels
/// promise (ggml's x86 `quantize_row_q8_0` / `quantize_row_q8_K`), returning
/// the dequantized activations `d * q`.
pub fn quantized_acts(qtype: QType, x: &[f32]) -> Vec<f32> {
    let block = act_block(qtype);
    if block == 1 {
        return x.to_vec();
    }
    let mut out = Vec::with_capacity(x.len());
    for b in x.chunks_exact(block) {
        let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
        if block == 32 {
            let d = f16::from_f32(amax / 127.0).to_f32();
            let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
            out.extend(b.iter().map(|v| (v * id).round_ties_even() * d));
        } else {
            let max = b.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
            if amax == 0.0 {
                out.extend(b.iter().map(|_| 0.0));
                continue;
            }
            let iscale = -127.0 / max;
            let d = 1.0 / iscale;
            out.extend(
                b.iter()
                    .map(|v| (iscale * v).round_ties_even().min(127.0) * d),
            );
        }
    }
    out
}

/// f64 reference `Σ w·x` per (row, output), plus `Σ |w·x|` for tolerances.
pub fn reference(w_deq: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut dot = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let (xr, wr) = (&x[i * k..(i + 1) * k], &w_deq[j * k..(j + 1) * k]);
            for (&a, &b) in xr.iter().zip(wr) {
                dot[i * n + j] += f64::from(a) * f64::from(b);
                mag[i * n + j] += (f64::from(a) * f64::from(b)).abs();
            }
        }
    }
    (dot, mag)
}

/// Bound on the activation-quantization error of `Σ w·x`:
/// `Σ_e |w_e| · c · amax(block of e)`, with `c` the worst relative code
/// error of the activation format (see `matmul.rs`).
pub fn act_error_bound(
    qtype: QType,
    w_deq: &[f32],
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let block = act_block(qtype);
    let c = match block {
        1 => 0.0,
        // Half a code step of amax/127, plus the f16 rounding of the scale
        // (2^-11 relative) applied to codes up to 127.
        32 => (0.5 + 127.0 / 2048.0) / 127.0 * 1.01,
        // Half a code step; the f32 scale rounding is negligible.
        _ => 0.5 / 127.0 * 1.01,
    };
    let mut bound = vec![0f64; m * n];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let wr = &w_deq[j * k..(j + 1) * k];
            let mut b = 0f64;
            for (xb, wb) in xr.chunks(block).zip(wr.chunks(block)) {
                let amax = xb.iter().fold(0f64, |a, v| a.max(f64::from(v.abs())));
                b += wb.iter().map(|v| f64::from(v.abs())).sum::<f64>() * amax * c;
            }
            bound[i * n + j] = b;
        }
    }
    bound
}
