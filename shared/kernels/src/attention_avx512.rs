//! AVX-512 forms of the two loops of one query head's attention (`attention.rs`), for heads
//! of `16 * C` values. Every score and every output element gets the same `f32` operations
//! in the same order as the portable loops, so the results are bit-identical:
//!
//! * scores: the 8-lane arithmetic of [`crate::dot`] (lane `i` adds `q[8c + i] ·
//!   key[8c + i]` for increasing `c`, a multiplication then an addition, then the fixed sum
//!   of the lanes), for two keys per register, one in each half, and eight registers at a
//!   time so that eight addition chains overlap instead of one waiting on the last;
//! * weighted sum: each output element starts at zero and adds `p_j · v_j` for increasing
//!   `j`, with the whole output in `C` registers instead of going through memory per key;
//! * grouped forms of both for the query heads that share a key/value head: scores for two
//!   heads per register with each key chunk broadcast to both halves, weighted sums a slice
//!   of the head width per pass, so that each key and value is read once for all the heads.

use std::arch::x86_64::*;
use std::ops::RangeInclusive;

use crate::attention::KvRows;
use crate::attention_avx2::lanes_sum;

/// Key pairs per tile of the scores loop.
const PAIRS: usize = 8;

/// Keys per tile of the grouped scores loop.
const GROUP_KEYS: usize = 8;

/// Whether this CPU runs these loops.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512dq")
}

/// Pushes `dot(q, key_j) * scale` for every key `j` of `keys` onto `scores`.
///
/// # Safety
/// [`available`] must hold.
#[target_feature(enable = "avx2,avx512f,avx512dq")]
pub(crate) fn scores<const C: usize>(
    q: &[f32],
    keys: KvRows<'_>,
    range: RangeInclusive<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
) {
    assert_eq!(q.len(), 16 * C);
    let (mut j, end) = (*range.start(), *range.end() + 1);
    while j + 2 * PAIRS <= end {
        let rows: [*const f32; 2 * PAIRS] = std::array::from_fn(|t| keys.at(j + t, 16 * C));
        let mut acc = [_mm512_setzero_ps(); PAIRS];
        for c in 0..2 * C {
            // SAFETY: `8c + 8 <= 16C`, inside `q` and every key row (checked by `at`).
            unsafe {
                let qc = _mm512_broadcast_f32x8(_mm256_loadu_ps(q.as_ptr().add(8 * c)));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let low = _mm256_loadu_ps(rows[2 * t].add(8 * c));
                    let high = _mm256_loadu_ps(rows[2 * t + 1].add(8 * c));
                    let kc = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(low), high);
                    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(qc, kc));
                }
            }
        }
        for acc in acc {
            scores.push(lanes_sum(_mm512_castps512_ps256(acc)) * scale);
            scores.push(lanes_sum(_mm512_extractf32x8_ps::<1>(acc)) * scale);
        }
        j += 2 * PAIRS;
    }
    for j in j..end {
        let row = keys.at(j, 16 * C);
        let mut acc = _mm256_setzero_ps();
        for c in 0..2 * C {
            // SAFETY: `8c + 8 <= 16C`, inside `q` and the key row (checked by `at`).
            unsafe {
                let prod = _mm256_mul_ps(
                    _mm256_loadu_ps(q.as_ptr().add(8 * c)),
                    _mm256_loadu_ps(row.add(8 * c)),
                );
                acc = _mm256_add_ps(acc, prod);
            }
        }
        scores.push(lanes_sum(acc) * scale);
    }
}

/// [`scores`] for the `2 * HP` query heads `q` (`2 * HP` rows of `16 * C`) that share
/// `keys`: `scores[h]` receives head `h`'s.
///
/// # Safety
/// [`available`] must hold.
#[target_feature(enable = "avx2,avx512f,avx512dq")]
pub(crate) fn group_scores<const C: usize, const HP: usize>(
    q: &[f32],
    keys: KvRows<'_>,
    range: RangeInclusive<usize>,
    scale: f32,
    scores: &mut [Vec<f32>],
) {
    let hd = 16 * C;
    assert!(q.len() == 2 * HP * hd && scores.len() == 2 * HP);
    // Chunk `c` of heads `2p` (low half) and `2p + 1` (high half): `qp[p * 2C + c]`.
    let mut qp = vec![_mm512_setzero_ps(); HP * 2 * C];
    for (i, qp) in qp.iter_mut().enumerate() {
        let (p, c) = (i / (2 * C), i % (2 * C));
        let low = &q[2 * p * hd + 8 * c..][..8];
        let high = &q[(2 * p + 1) * hd + 8 * c..][..8];
        // SAFETY: both slices hold eight floats.
        *qp = unsafe {
            _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm256_loadu_ps(low.as_ptr())),
                _mm256_loadu_ps(high.as_ptr()),
            )
        };
    }
    let (mut j, end) = (*range.start(), *range.end() + 1);
    while j < end {
        let n = (end - j).min(GROUP_KEYS);
        if n == GROUP_KEYS {
            group_tile::<C, HP, GROUP_KEYS>(&qp, keys, j, scale, scores);
        } else {
            for j in j..end {
                group_tile::<C, HP, 1>(&qp, keys, j, scale, scores);
            }
        }
        j += n;
    }
}

/// Keys `j..j + T` against the head pairs `qp`, pushed onto `scores`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512dq")]
fn group_tile<const C: usize, const HP: usize, const T: usize>(
    qp: &[__m512],
    keys: KvRows<'_>,
    j: usize,
    scale: f32,
    scores: &mut [Vec<f32>],
) {
    assert_eq!(qp.len(), HP * 2 * C);
    let rows: [*const f32; T] = std::array::from_fn(|t| keys.at(j + t, 16 * C));
    let mut acc = [[_mm512_setzero_ps(); HP]; T];
    for c in 0..2 * C {
        for (row, acc) in rows.iter().zip(acc.iter_mut()) {
            // SAFETY: `8c + 8 <= 16C`, inside the key row (checked by `at`).
            let kc = unsafe { _mm512_broadcast_f32x8(_mm256_loadu_ps(row.add(8 * c))) };
            for (p, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(qp[p * 2 * C + c], kc));
            }
        }
    }
    for acc in acc {
        for (p, acc) in acc.into_iter().enumerate() {
            scores[2 * p].push(lanes_sum(_mm512_castps512_ps256(acc)) * scale);
            scores[2 * p + 1].push(lanes_sum(_mm512_extractf32x8_ps::<1>(acc)) * scale);
        }
    }
}

/// `out = Σ_j (weights[j] · inv) · value_j` over the values `range`, element by element from
/// zero in increasing `j`.
///
/// # Safety
/// [`available`] must hold.
#[target_feature(enable = "avx2,avx512f,avx512dq")]
pub(crate) fn weighted_sum<const C: usize>(
    weights: &[f32],
    inv: f32,
    values: KvRows<'_>,
    range: RangeInclusive<usize>,
    out: &mut [f32],
) {
    assert_eq!(out.len(), 16 * C);
    let mut acc = [_mm512_setzero_ps(); C];
    for (j, w) in range.zip(weights) {
        let p = _mm512_set1_ps(w * inv);
        let row = values.at(j, 16 * C);
        for (c, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `16c + 16 <= 16C`, inside the value row (checked by `at`).
            let x = unsafe { _mm512_loadu_ps(row.add(16 * c)) };
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(p, x));
        }
    }
    for (o, acc) in out.chunks_exact_mut(16).zip(acc) {
        // SAFETY: `o` holds 16 writable floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
    }
}

/// [`weighted_sum`] for the `G` query heads that share `values`: head `h` has `weights[h]`
/// and `invs[h]` and writes `out[h * 16C..][..16C]`. Sixteen registers hold `16 / G` chunks
/// of every head, a slice of the width per pass over the values.
///
/// # Safety
/// [`available`] must hold.
#[target_feature(enable = "avx2,avx512f,avx512dq")]
pub(crate) fn group_weighted_sum<const C: usize, const G: usize>(
    weights: &[Vec<f32>],
    invs: &[f32],
    values: KvRows<'_>,
    range: RangeInclusive<usize>,
    out: &mut [f32],
) {
    let (hd, per) = (16 * C, 16 / G);
    assert!(weights.len() == G && invs.len() == G && out.len() == G * hd);
    let keys = range.end() + 1 - range.start();
    assert!(weights.iter().all(|w| w.len() == keys) && C.is_multiple_of(per));
    // p[h][i]: the weight of key `start + i` for head `h`, `weights * inv` as in `weighted_sum`.
    let p: Vec<Vec<f32>> = weights
        .iter()
        .zip(invs)
        .map(|(w, &inv)| w.iter().map(|w| w * inv).collect())
        .collect();
    for pass in 0..C / per {
        let mut acc = [_mm512_setzero_ps(); 16];
        for (i, j) in range.clone().enumerate() {
            let row = values.at(j, hd);
            for c in 0..per {
                // SAFETY: `16 (pass·per + c) + 16 <= 16C`, inside the value row (`at`).
                let x = unsafe { _mm512_loadu_ps(row.add(16 * (pass * per + c))) };
                for (h, p) in p.iter().enumerate() {
                    let acc = &mut acc[h * per + c];
                    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_set1_ps(p[i]), x));
                }
            }
        }
        for h in 0..G {
            for c in 0..per {
                let o = &mut out[h * hd + 16 * (pass * per + c)..][..16];
                // SAFETY: `o` holds 16 writable floats.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc[h * per + c]) };
            }
        }
    }
}
