//! AVX2 forms of the two loops of one query head's attention (`attention.rs`), for heads of
//! a multiple of 64 values, bit-identical to the portable loops like `attention_avx512`:
//!
//! * scores: the 8-lane arithmetic of [`crate::dot`] for eight keys at a time, one
//!   register each, so that eight addition chains overlap instead of one waiting on the last;
//! * weighted sum: each output element starts at zero and adds `p_j · v_j` for increasing
//!   `j`, 64 values of the output held in eight registers per pass over the values.

use std::arch::x86_64::*;
use std::ops::RangeInclusive;

use crate::attention::KvRows;

/// Keys per tile of the scores loop.
const KEYS: usize = 8;

/// Output values per pass of the weighted sum (eight registers).
const SLICE: usize = 64;

/// Whether these loops take heads of `hd` values on this CPU.
pub(crate) fn takes(hd: usize) -> bool {
    hd.is_multiple_of(SLICE) && is_x86_feature_detected!("avx2")
}

/// Pushes `dot(q, key_j) * scale` for every key `j` of `range` onto `scores`.
///
/// # Safety
/// AVX2 must be available; `q.len()` a multiple of 8.
#[target_feature(enable = "avx2")]
pub(crate) fn scores(
    q: &[f32],
    keys: KvRows<'_>,
    range: RangeInclusive<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
) {
    let hd = q.len();
    assert!(hd.is_multiple_of(8));
    let (mut j, end) = (*range.start(), *range.end() + 1);
    while j + KEYS <= end {
        let rows: [*const f32; KEYS] = std::array::from_fn(|t| keys.at(j + t, hd));
        let mut acc = [_mm256_setzero_ps(); KEYS];
        for c in (0..hd).step_by(8) {
            // SAFETY: `c + 8 <= hd`, inside `q` and every key row (checked by `at`).
            unsafe {
                let qc = _mm256_loadu_ps(q.as_ptr().add(c));
                for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(qc, _mm256_loadu_ps(row.add(c))));
                }
            }
        }
        for acc in acc {
            scores.push(lanes_sum(acc) * scale);
        }
        j += KEYS;
    }
    for j in j..end {
        let row = keys.at(j, hd);
        let mut acc = _mm256_setzero_ps();
        for c in (0..hd).step_by(8) {
            // SAFETY: `c + 8 <= hd`, inside `q` and the key row (checked by `at`).
            unsafe {
                let prod = _mm256_mul_ps(
                    _mm256_loadu_ps(q.as_ptr().add(c)),
                    _mm256_loadu_ps(row.add(c)),
                );
                acc = _mm256_add_ps(acc, prod);
            }
        }
        scores.push(lanes_sum(acc) * scale);
    }
}

/// The final sum of `dot`'s eight lanes: `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn lanes_sum(v: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let u = _mm_add_ps(t, _mm_shuffle_ps::<0b10_11_00_01>(t, t));
    _mm_cvtss_f32(u) + _mm_cvtss_f32(_mm_movehl_ps(u, u))
}

/// `out = Σ_j (weights[j] · inv) · value_j` over the values `range`, element by element from
/// zero in increasing `j`.
///
/// # Safety
/// AVX2 must be available; `out.len()` a multiple of [`SLICE`].
#[target_feature(enable = "avx2")]
pub(crate) fn weighted_sum(
    weights: &[f32],
    inv: f32,
    values: KvRows<'_>,
    range: RangeInclusive<usize>,
    out: &mut [f32],
) {
    let hd = out.len();
    assert!(hd.is_multiple_of(SLICE));
    for (s0, o) in (0..hd).step_by(SLICE).zip(out.chunks_exact_mut(SLICE)) {
        let mut acc = [_mm256_setzero_ps(); SLICE / 8];
        for (j, w) in range.clone().zip(weights) {
            let p = _mm256_set1_ps(w * inv);
            let row = values.at(j, hd);
            for (c, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `s0 + 8c + 8 <= hd`, inside the value row (checked by `at`).
                let x = unsafe { _mm256_loadu_ps(row.add(s0 + 8 * c)) };
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(p, x));
            }
        }
        for (o, acc) in o.chunks_exact_mut(8).zip(acc) {
            // SAFETY: `o` holds 8 writable floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc) };
        }
    }
}
