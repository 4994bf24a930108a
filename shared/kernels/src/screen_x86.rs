//! The AVX-512 kernel of [`crate::ArgmaxScreen`]: 8-bit dots of Q8_0 lane
//! groups with quantized activation rows (VNNI), scaled in f32 exactly as
//! [`crate::screen::score_portable`] scales them.
//!
//! A record holds a group's codes element by element (sixteen lanes per
//! element); one byte permutation (VBMI) turns four elements of sixteen
//! lanes into four consecutive codes per lane, flipped to unsigned (`c +
//! 128`) for `vpdpbusd` against the row's four broadcast 8-bit activations
//! (one broadcast feeds two groups). Each block's integer dot starts from
//! `−128 · Σq`, so it is exact, and its f32 scaling is the portable loop's;
//! the f32 sums live in the tile's output between blocks (the integer dots
//! of nine rows and two groups fill the registers). Each group's records
//! are prefetched a few records ahead of the one being read.

use std::arch::x86_64::*;

use crate::lanes::{LaneMatrix, LANES, PREFETCH_RECORDS};
use crate::qtype::QK8_0;
use crate::screen::QuantRow;
use crate::screen_scan::Collector;
use crate::simd::prefetch_record;

/// Activation rows per tile.
const ROWS: usize = 9;
/// Groups per tile (each broadcast activation feeds this many products);
/// a last odd group runs alone.
const GROUPS: usize = 2;

/// Whether the CPU has the kernel's instructions.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// What a tile reads: `NG` consecutive groups' records and up to [`ROWS`]
/// rows.
struct Job<'a> {
    groups: *const u8,
    group_bytes: usize,
    records: usize,
    record_bytes: usize,
    codes_at: usize,
    rows: &'a [&'a QuantRow],
}

/// Screen scores of groups `g0..` (covering `outs[r]`) for every row.
/// Requires [`available`] (checked by the caller).
pub(crate) fn score(w: &LaneMatrix, rows: &[&QuantRow], g0: usize, outs: &mut [&mut [f32]]) {
    let (gb, format) = (w.group_bytes(), w.format());
    let cols = outs.first().map_or(0, |o| o.len());
    let groups = cols.div_ceil(LANES);
    let mut buf = [[0f32; LANES]; ROWS * GROUPS];
    let mut g = 0;
    while g < groups {
        let ng = if groups - g >= GROUPS { GROUPS } else { 1 };
        for r0 in (0..rows.len()).step_by(ROWS) {
            let tile = &rows[r0..(r0 + ROWS).min(rows.len())];
            let job = Job {
                groups: w.bytes()[(g0 + g) * gb..][..ng * gb].as_ptr(),
                group_bytes: gb,
                records: w.k() / QK8_0,
                record_bytes: format.record_bytes(),
                codes_at: format.codes_at(),
                rows: tile,
            };
            let out = &mut buf[..tile.len() * ng];
            // SAFETY: the caller checked the features; the slice above
            // holds `ng` groups of `records` records, and each row `k`
            // codes and `k / 32` scales and offsets.
            unsafe { pick(tile.len(), ng)(&job, out) };
            for (r, res) in out.chunks_exact(ng).enumerate() {
                let row = &mut outs[r0 + r][g * LANES..];
                for (dst, src) in row.chunks_mut(LANES).zip(res) {
                    dst.copy_from_slice(&src[..dst.len()]);
                }
            }
        }
        g += ng;
    }
}

/// [`Collector::push`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn collect(c: &mut Collector, col0: usize, s: &[f32], norms: &[f32]) {
    c.push(col0, s, norms)
}

type TileFn = unsafe fn(&Job<'_>, &mut [[f32; LANES]]);

/// The tile of `rows` (1..=[`ROWS`]) rows and `ng` (1 or [`GROUPS`]) groups.
fn pick(rows: usize, ng: usize) -> TileFn {
    match (rows, ng) {
        (1, 1) => tile::<1, 1>,
        (2, 1) => tile::<2, 1>,
        (3, 1) => tile::<3, 1>,
        (4, 1) => tile::<4, 1>,
        (5, 1) => tile::<5, 1>,
        (6, 1) => tile::<6, 1>,
        (7, 1) => tile::<7, 1>,
        (8, 1) => tile::<8, 1>,
        (_, 1) => tile::<9, 1>,
        (1, _) => tile::<1, 2>,
        (2, _) => tile::<2, 2>,
        (3, _) => tile::<3, 2>,
        (4, _) => tile::<4, 2>,
        (5, _) => tile::<5, 2>,
        (6, _) => tile::<6, 2>,
        (7, _) => tile::<7, 2>,
        (8, _) => tile::<8, 2>,
        _ => tile::<9, 2>,
    }
}

/// `out[r * NG + j]` = the sixteen screen scores of group `j` against row
/// `r`.
///
/// # Safety
/// AVX-512 F, BW, VNNI, VBMI and F16C; `job` as built by [`score`] with `NG`
/// groups and `R` rows; `out` has `R * NG` entries.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,f16c")]
unsafe fn tile<const R: usize, const NG: usize>(job: &Job<'_>, out: &mut [[f32; LANES]]) {
    // Byte `4l + t` of a permuted quad is element `t` of lane `l`.
    let mut idx = [0u8; 64];
    for (i, v) in idx.iter_mut().enumerate() {
        *v = ((i % 4) * LANES + i / 4) as u8;
    }
    // SAFETY: per the contract, every read below stays inside the groups'
    // records and the rows' codes, scales and offsets. Plain loops only:
    // closures would be compiled without the target features.
    unsafe {
        let idx = _mm512_loadu_si512(idx.as_ptr().cast());
        let flip = _mm512_set1_epi8(-128);
        for o in out.iter_mut() {
            *o = [0.0; LANES];
        }
        let (mut q, mut dx, mut bias) = (
            [std::ptr::null(); R],
            [std::ptr::null(); R],
            [std::ptr::null(); R],
        );
        for r in 0..R {
            q[r] = job.rows[r].q.as_ptr();
            dx[r] = job.rows[r].dx.as_ptr();
            bias[r] = job.rows[r].bias.as_ptr();
        }
        for b in 0..job.records {
            let mut rec = [job.groups; NG];
            let mut dw = [_mm512_setzero_ps(); NG];
            for j in 0..NG {
                rec[j] = job.groups.add(j * job.group_bytes + b * job.record_bytes);
                dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(rec[j].cast()));
                prefetch_record(rec[j], PREFETCH_RECORDS, job.record_bytes);
            }
            let mut dots = [[_mm512_setzero_si512(); NG]; R];
            for r in 0..R {
                dots[r] = [_mm512_set1_epi32(-*bias[r].add(b)); NG];
            }
            // The trip count is hidden from the compiler: knowing it, LLVM
            // unrolls this loop fully and, for tiles of 5–8 rows, hoists all
            // eight permuted code vectors and spills them to the stack (on a
            // Zen 5 those screens took 1.3–1.7× longer than nine rows').
            for t in 0..std::hint::black_box(QK8_0 / 4) {
                let mut codes = [_mm512_setzero_si512(); NG];
                for j in 0..NG {
                    let raw = _mm512_loadu_si512(rec[j].add(job.codes_at + 4 * LANES * t).cast());
                    codes[j] = _mm512_xor_si512(_mm512_permutexvar_epi8(idx, raw), flip);
                }
                for r in 0..R {
                    let x = q[r].add(b * QK8_0 + 4 * t).cast::<i32>().read_unaligned();
                    let x = _mm512_set1_epi32(x);
                    for j in 0..NG {
                        dots[r][j] = _mm512_dpbusd_epi32(dots[r][j], codes[j], x);
                    }
                }
            }
            for r in 0..R {
                let d = _mm512_set1_ps(*dx[r].add(b));
                for j in 0..NG {
                    let dd = _mm512_mul_ps(dw[j], d);
                    let o = out[r * NG + j].as_mut_ptr();
                    let acc =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r][j]), dd, _mm512_loadu_ps(o));
                    _mm512_storeu_ps(o, acc);
                }
            }
        }
    }
}
