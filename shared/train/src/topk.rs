//! The most likely ids of many next-token distributions at once, from logits wherever they
//! are. Logits on the CPU (or a vocabulary small enough) are reduced row by row with
//! [`sparse`]. On a GPU, copying every `[rows, vocab]` row to the host costs more than the
//! forward (measured on the H200: 212 ms for 128 rows of Gemma 3's 262,144 logits against
//! 8.9 ms for their forward), so the device narrows each row first: it cuts the row into
//! blocks, keeps the `keep` blocks with the largest maxima (every one of the `keep` largest
//! logits lies in one of them), and sends only those with the row's softmax normaliser.
//! Exact except when blocks tie at the boundary maximum, where a kept id may be swapped for
//! another of the same logit.

use candle_core::{DType, Tensor, D};
use rayon::prelude::*;

use crate::error::{Result, TrainError};
use crate::teacher::SparseTarget;

/// Fewest logits per block; blocks are at most [`MAX_BLOCKS`] per row (a device sort of the
/// block maxima works on at most that many columns).
const MIN_BLOCK: usize = 256;
const MAX_BLOCKS: usize = 1024;

/// The `keep` most likely ids of every row of `logits` (`[rows, vocab]` f32), as [`sparse`]
/// gives them.
pub fn sparse_rows(logits: &Tensor, keep: usize) -> Result<Vec<SparseTarget>> {
    let (rows, vocab) = logits.dims2()?;
    let block = vocab
        .div_ceil(MAX_BLOCKS)
        .next_power_of_two()
        .max(MIN_BLOCK);
    if logits.device().is_cpu() || keep * block >= vocab {
        let all = logits.flatten_all()?.to_vec1::<f32>()?;
        return Ok(all
            .par_chunks(vocab.max(1))
            .map(|row| sparse(row, keep))
            .collect());
    }
    narrowed(logits, keep, block, (rows, vocab))
}

/// The block reduction on the logits' device (see the module docs).
pub fn narrowed(
    logits: &Tensor,
    keep: usize,
    block: usize,
    (rows, vocab): (usize, usize),
) -> Result<Vec<SparseTarget>> {
    let blocks = vocab.div_ceil(block);
    if keep == 0 || keep > blocks {
        return Err(TrainError::Invalid(format!(
            "cannot keep {keep} blocks of {blocks}"
        )));
    }
    let pad = blocks * block - vocab;
    let x = match pad {
        0 => logits.clone(),
        _ => {
            let fill = Tensor::full(f32::NEG_INFINITY, (rows, pad), logits.device())?;
            Tensor::cat(&[logits, &fill], 1)?
        }
    };
    let max = x.max_keepdim(D::Minus1)?;
    let sum = x.broadcast_sub(&max)?.exp()?.sum(D::Minus1)?;
    let x = x.reshape((rows, blocks, block))?;
    let top = x
        .max(D::Minus1)?
        .arg_sort_last_dim(false)?
        .narrow(1, 0, keep)?
        .contiguous()?;
    let index = top
        .unsqueeze(2)?
        .broadcast_as((rows, keep, block))?
        .contiguous()?;
    let values = x.gather(&index, 1)?.to_dtype(DType::F32)?;
    let values = values.flatten_all()?.to_vec1::<f32>()?;
    let top = top.to_vec2::<u32>()?;
    let (max, sum) = (max.flatten_all()?.to_vec1::<f32>()?, sum.to_vec1::<f32>()?);
    Ok(values
        .par_chunks(keep * block)
        .zip(top.par_iter())
        .zip(max.par_iter().zip(sum.par_iter()))
        .map(|((vals, blocks), (m, s))| {
            let ids = |k: usize| (0..block).map(move |j| blocks[k] as usize * block + j);
            let cand: Vec<(u32, f32)> = (0..keep)
                .flat_map(ids)
                .zip(vals.iter().copied())
                .filter(|(id, _)| *id < vocab)
                .map(|(id, v)| (id as u32, v))
                .collect();
            top_of(cand, keep, *m, *s)
        })
        .collect())
}

/// The `keep` most likely ids of `softmax(logits)`, descending, ties to the lower id.
pub fn sparse(logits: &[f32], keep: usize) -> SparseTarget {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|l| f64::from((l - max).exp())).sum();
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    keep_top(&mut idx, keep, |i| (*i, logits[*i as usize]));
    let probs = idx
        .iter()
        .map(|i| (f64::from((logits[*i as usize] - max).exp()) / sum) as f32)
        .collect();
    SparseTarget { ids: idx, probs }
}

/// The `keep` largest of `cand` by logit (ties to the lower id), with probabilities under
/// the row's maximum `max` and normaliser `sum`.
fn top_of(mut cand: Vec<(u32, f32)>, keep: usize, max: f32, sum: f32) -> SparseTarget {
    keep_top(&mut cand, keep, |c| *c);
    SparseTarget {
        ids: cand.iter().map(|c| c.0).collect(),
        probs: cand.iter().map(|c| (c.1 - max).exp() / sum).collect(),
    }
}

/// Leaves in `v` its `keep` largest items by the logit of `key` (ties to the lower id),
/// descending, in a fresh allocation: a truncated vector would keep a vocabulary-sized
/// buffer (1 MiB per position of a 262k vocabulary) alive in every stored sample.
fn keep_top<T: Clone>(v: &mut Vec<T>, keep: usize, key: impl Fn(&T) -> (u32, f32)) {
    let order = |a: &T, b: &T| {
        let ((ia, la), (ib, lb)) = (key(a), key(b));
        lb.total_cmp(&la).then(ia.cmp(&ib))
    };
    let keep = keep.min(v.len());
    if keep < v.len() {
        v.select_nth_unstable_by(keep, order);
    }
    let mut kept = v[..keep].to_vec();
    kept.sort_by(order);
    *v = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The block reduction keeps what the full sort keeps, on rows whose largest logits
    /// crowd into a few blocks, spread out, or sit in the padded last block.
    #[test]
    fn narrowed_rows_equal_the_full_reduction() {
        let (rows, vocab, keep) = (4, 5000, 16);
        let mut x = 7u64;
        let mut next = || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut logits: Vec<f32> = (0..rows * vocab).map(|_| next() * 10.0).collect();
        for j in 0..40 {
            logits[j * 3] += 30.0 + j as f32;
            logits[vocab + j * 131] += 30.0;
            logits[3 * vocab - 1 - j] += 25.0;
        }
        let t = Tensor::from_vec(logits.clone(), (rows, vocab), &Device::Cpu).expect("t");
        let got = narrowed(&t, keep, 64, (rows, vocab)).expect("narrowed");
        for (r, g) in got.iter().enumerate() {
            let want = sparse(&logits[r * vocab..(r + 1) * vocab], keep);
            assert_eq!(g.ids, want.ids, "row {r}");
            for (a, b) in g.probs.iter().zip(&want.probs) {
                assert!((a - b).abs() <= 1e-6 * b.max(1e-3), "row {r}: {a} vs {b}");
            }
        }
        assert!(narrowed(&t, 100, 64, (rows, vocab)).is_err());
    }

    #[test]
    fn sparse_keeps_the_most_likely_ids_in_order_and_nothing_more() {
        let logits: Vec<f32> = (0..10_000)
            .map(|i| ((i * 7919) % 10_007) as f32 / 1e3)
            .collect();
        let s = sparse(&logits, 4);
        let mut order: Vec<u32> = (0..10_000).collect();
        order.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        assert_eq!(s.ids, order[..4]);
        assert!(s.probs.windows(2).all(|w| w[0] >= w[1]));
        // Samples are kept for the whole run: each must hold its kept ids only.
        assert!(s.ids.capacity() <= 4 && s.probs.capacity() <= 4);
    }
}
