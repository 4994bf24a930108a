//! Batch-invariant, weight-stationary CPU matmul kernels for GGUF (ggml) weights.
//!
//! A [`QMatrix`] owns the raw ggml bytes of a row-major weight matrix with `n`
//! output rows and `k` inputs, exactly as they are stored in a GGUF file (each
//! output row is `k / block_size` consecutive blocks). [`QMatrix::matmul`]
//! multiplies `m` activation rows by that matrix:
//! `out[i][j] = sum_e x[i][e] * w[j][e]`.
//!
//! # How the product is computed
//!
//! * Activations are quantized per row the way llama.cpp does on x86: to Q8_0
//!   blocks of 32 (f16 scale) for [`QType::Q4_0`], [`QType::Q5_0`] and
//!   [`QType::Q8_0`] weights, and to Q8_K blocks of 256 (f32 scale plus sums
//!   of 16) for the k-quants. F32 and F16 weights use the f32 activations.
//! * Each block pair is reduced exactly in integer arithmetic, then scaled and
//!   accumulated in f32, mirroring ggml's AVX2 `vec_dot` kernels.
//! * Weight-stationary: a weight block is unpacked once into registers and
//!   dotted with up to nine activation rows before moving on (where AVX-512
//!   VNNI exists, a 512-bit register holds two weight rows of a Q4_0 / Q5_0 /
//!   Q8_0 block or two activation rows of a k-quant chunk, each half doing
//!   exactly the 256-bit arithmetic); with only a few activation rows,
//!   several weight rows are processed side by side instead, except that a single row against Q8_0 or k-quant weights reads one
//!   weight row after another (one sequential stream, which some CPUs'
//!   prefetchers serve twice as fast).
//! * Threads (rayon) split the *output rows* only; the `k` reduction of one
//!   output value always runs on a single thread. Small products run on the
//!   calling thread.
//!
//! # Batch invariance
//!
//! For a given activation row and output row, the exact sequence of floating
//! point operations is fixed by `k` and the selected [`Isa`] alone:
//!
//! * activation quantization is per row and reads nothing else;
//! * each output value owns its own accumulator (eight f32 lanes on AVX2, one
//!   scalar on the portable path) fed block by block in increasing `k` order,
//!   always with the same instructions, followed by one fixed horizontal sum;
//! * integer block dots are exact, so how they are formed cannot matter;
//! * the register tiling (how many activation and weight rows are computed
//!   together, which group a row lands in, edge tiles) only changes *which*
//!   pairs are computed side by side, never the arithmetic of any one pair:
//!   every tile shape runs the same per-pair code over independent
//!   accumulators;
//! * the thread split only decides which output rows a thread owns.
//!
//! Hence `matmul` on `m` rows is bit-identical, row by row, to `matmul` on any
//! subset of those rows, including one row at a time, whatever the thread
//! count. This is what makes speculative decoding with a batched verifier
//! lossless. [`Isa::Avx2`] and [`Isa::AvxVnni`] are bit-identical to each
//! other; the portable [`Isa::Scalar`] path is invariant too but sums in a
//! different order, so it agrees with them only to rounding. [`Isa::Amx`]
//! computes the 8-bit Q4_0 / Q5_0 / Q8_0 products with the portable path's
//! arithmetic (one scalar accumulator per output, per block
//! `acc + (dw·dx)·dot`), vectorized across outputs, so for those it is
//! bit-identical to [`Isa::Scalar`]; everything else it runs as
//! [`Isa::AvxVnni`].
//!
//! # Exact products: the lane layout
//!
//! [`LaneMatrix`] repacks a quantized matrix so that SIMD lanes hold output
//! rows and multiplies f32 activations with its weights dequantized exactly
//! (the values of [`QMatrix::dequantize_row`]): one f32 FMA chain per
//! (activation row, output) over `k` in order, batch invariant by
//! construction and the same bits on every implementation (see its module
//! docs). F32 and F16 matrices need no repacking: [`QMatrix::matmul`] runs
//! them on the f32 activations, four 8-lane FMA chains per pair on AVX2
//! (chunk `c` of eight elements into chain `c % 4`, one fixed final sum) and
//! products added in element order on the portable path.
//!
//! # Instruction sets
//!
//! [`Isa::detect`] picks AVX2 (with FMA and F16C, plus AVX-VNNI or AVX-512
//! VNNI when present, plus Intel AMX-INT8 tiles where the CPU has them and
//! Linux grants the process their state) at runtime and otherwise the
//! portable path.
//! [`QMatrix::matmul_with`] forces a particular one, and [`Isa::set_max`]
//! caps what [`Isa::detect`] picks for the whole process (so that machines
//! of different CPUs compute the same bits).

#[cfg(target_arch = "x86_64")]
mod amx;
mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_avx2;
#[cfg(target_arch = "x86_64")]
mod attention_avx512;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod block_attention;
#[cfg(target_arch = "x86_64")]
mod block_types;
mod columns;
mod dequant;
mod error;
mod float;
mod isa;
mod kquants;
#[cfg(target_arch = "x86_64")]
mod kquants_avx2;
#[cfg(target_arch = "x86_64")]
mod kquants_avx512;
mod lane_outputs;
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_x86;
mod matrix;
mod q8;
#[cfg(target_arch = "x86_64")]
mod q8_amx;
#[cfg(target_arch = "x86_64")]
mod q8_avx512;
#[cfg(target_arch = "x86_64")]
mod q8_x86;
mod qtype;
mod quantize;
#[cfg(target_arch = "x86_64")]
mod quantize_avx2;
mod screen;
mod screen_scan;
#[cfg(target_arch = "x86_64")]
mod screen_x86;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod test_data;
mod tile;
mod vector;
#[cfg(all(test, target_arch = "x86_64"))]
mod vnni_encodings_test;

pub use attention::{attention_groups, HeadAttention, KvRows};
pub use block_attention::{BlockAttention, KeyPanels, KeysValues, PANEL};
pub use columns::ColumnMatrix;
pub use error::KernelError;
pub use isa::Isa;
pub use lanes::LaneMatrix;
pub use matrix::QMatrix;
pub use qtype::QType;
pub use screen::{first_max, ArgmaxScreen, TopRow, TopRows, UpperRow};
pub use vector::{
    dot, exp, exp_weights, gelu_tanh_mul, lane_max, lane_sum, rms_norm, rms_norm_rows, softcap,
    softmax_weights,
};
