//! Causal (optionally sliding-window) grouped-query attention over the KV cache, one query
//! row at a time. A row at absolute position `p` reads keys `start..=p` in increasing order
//! whatever block it arrived in, so a block forward computes exactly what one-token decoding
//! computes for the same position. The attention of each query row and head is a
//! [`HeadAttention`] of the kernels crate, which runs it in SIMD loops where the CPU has them,
//! with the bits of its portable loops.

use rayon::prelude::*;

use tandem_kernels::{attention_groups, HeadAttention, KvRows};

/// Shape and masking of one attention call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnSpec {
    /// Absolute position of the first query row.
    pub(crate) pos0: usize,
    /// Query heads.
    pub(crate) n_heads: usize,
    /// Key/value heads.
    pub(crate) n_kv_heads: usize,
    /// Width of a head.
    pub(crate) head_dim: usize,
    /// Multiplier of the raw scores.
    pub(crate) scale: f32,
    /// Keys a query sees (itself included) on sliding layers.
    pub(crate) window: Option<usize>,
    /// `tanh` soft-capping of scores.
    pub(crate) softcap: Option<f32>,
}

/// Work below this many multiply-adds runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// `q` is `m × (n_heads*head_dim)`; `k`/`v` hold positions `0..pos0+m` of
/// `n_kv_heads*head_dim` each. Returns `m × (n_heads*head_dim)`.
pub(crate) fn attend(q: &[f32], k: &[f32], v: &[f32], spec: AttnSpec) -> Vec<f32> {
    let hd = spec.head_dim;
    let q_dim = spec.n_heads * hd;
    let m = q.len() / q_dim;
    let mut out = vec![0f32; q.len()];
    let work = m * spec.n_heads * (spec.pos0 + m) * hd;
    // Where the AVX-512 loops run, the query heads of a key head go together (one read of
    // each key and value for all of them); a single row splits them in two tasks, so that
    // both halves run in parallel.
    let group = spec.n_heads / spec.n_kv_heads;
    let heads = match (attention_groups(hd, group), m) {
        (false, _) => 1,
        (true, 1) if group >= 4 => group / 2,
        (true, 1) => 1,
        (true, _) => group,
    };
    let tasks_per_row = spec.n_heads / heads;
    let run = |(idx, o): (usize, &mut [f32])| {
        let (row, head) = (idx / tasks_per_row, idx % tasks_per_row * heads);
        let qh = &q[row * q_dim + head * hd..][..heads * hd];
        task(qh, k, v, spec, spec.pos0 + row, head).run(o);
    };
    if work >= PARALLEL_MIN_WORK {
        out.par_chunks_mut(heads * hd).enumerate().for_each(run);
    } else {
        out.chunks_mut(heads * hd).enumerate().for_each(run);
    }
    out
}

/// The attention of query values `q` (heads `head..`, sharing a key head) at absolute
/// position `pos`: the keys and values of their key head, from the window's start.
fn task<'a>(
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    spec: AttnSpec,
    pos: usize,
    head: usize,
) -> HeadAttention<'a> {
    let hd = spec.head_dim;
    let kv_head = head / (spec.n_heads / spec.n_kv_heads);
    let rows = |data| KvRows {
        data,
        stride: spec.n_kv_heads * hd,
        base: kv_head * hd,
    };
    HeadAttention {
        q,
        keys: rows(k),
        values: rows(v),
        start: spec.window.map_or(0, |w| (pos + 1).saturating_sub(w)),
        pos,
        head_dim: hd,
        scale: spec.scale,
        softcap: spec.softcap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pos0: usize, window: Option<usize>) -> AttnSpec {
        AttnSpec {
            pos0,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            scale: 0.5,
            window,
            softcap: None,
        }
    }

    /// Every combination of the three lists.
    fn product<A: Copy, B: Copy, C: Copy>(a: &[A], b: &[B], c: &[C]) -> Vec<(A, B, C)> {
        let pairs = a.iter().flat_map(|&a| b.iter().map(move |&b| (a, b)));
        pairs
            .flat_map(|(a, b)| c.iter().map(move |&c| (a, b, c)))
            .collect()
    }

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.7).sin()).collect()
    }

    #[test]
    fn block_rows_equal_single_rows_bitwise() {
        let (k, v) = (data(10 * 4, 1.0), data(10 * 4, 2.0));
        let q = data(6 * 8, 3.0);
        for window in [None, Some(3)] {
            let block = attend(&q, &k[..40], &v[..40], spec(4, window));
            for r in 0..6 {
                let one = attend(
                    &q[r * 8..][..8],
                    &k[..(5 + r) * 4],
                    &v[..(5 + r) * 4],
                    spec(4 + r, window),
                );
                assert_eq!(
                    one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    block[r * 8..][..8]
                        .iter()
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// A forward of one row or a block (heads grouped where AVX-512 runs) gives, row by row
    /// and head by head, the bits of that head's attention run alone (which the kernels'
    /// tests hold to the bits of the portable loops).
    #[test]
    fn block_heads_equal_single_heads_bitwise() {
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let shapes = [(4, 1), (4, 2), (8, 1), (2, 2)];
        for (hd, (n_heads, n_kv_heads), m) in product(&[128, 256], &shapes, &[1, 5]) {
            let pos0 = 21;
            let kv = (pos0 + m) * n_kv_heads * hd;
            let (k, v) = (data(kv, 1.0), data(kv, 2.0));
            let q = data(m * n_heads * hd, 3.0);
            for window in [None, Some(9)] {
                let spec = AttnSpec {
                    pos0,
                    n_heads,
                    n_kv_heads,
                    head_dim: hd,
                    scale: 0.3,
                    window,
                    softcap: None,
                };
                let block = attend(&q, &k, &v, spec);
                for (i, (qh, got)) in q.chunks(hd).zip(block.chunks(hd)).enumerate() {
                    let (row, head) = (i / n_heads, i % n_heads);
                    let mut alone = vec![f32::NAN; hd];
                    task(qh, &k, &v, spec, pos0 + row, head).run(&mut alone);
                    assert_eq!(bits(got), bits(&alone), "hd {hd} row {row} head {head}");
                }
            }
        }
    }

    #[test]
    fn single_key_returns_its_value() {
        let k = data(4, 0.0);
        let v = vec![1.0, 2.0, 3.0, 4.0];
        let out = attend(&data(8, 5.0), &k, &v, spec(0, None));
        assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn window_limits_visible_keys() {
        let k = vec![0.0; 3 * 4];
        let v = vec![
            10.0, 10.0, 10.0, 10.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0,
        ];
        let q = vec![0.0; 8];
        let out = attend(&q, &k, &v, spec(2, Some(2)));
        assert!(out.iter().all(|x| (*x - 1.0).abs() < 1e-6), "{out:?}");
    }
}
