//! Causal (optionally sliding-window) grouped-query attention over the KV cache, one query
//! row at a time. A row at absolute position `p` reads keys `start..=p` in increasing order
//! whatever block it arrived in, so a block forward computes exactly what one-token decoding
//! computes for the same position.

use rayon::prelude::*;

use tandem_kernels::{dot, exp};

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
    let heads = match (grouped(spec), m) {
        (false, _) => 1,
        (true, 1) if group >= 4 => group / 2,
        (true, 1) => 1,
        (true, _) => group,
    };
    let tasks_per_row = spec.n_heads / heads;
    let task = |(idx, o): (usize, &mut [f32])| {
        let (row, head) = (idx / tasks_per_row, idx % tasks_per_row * heads);
        let qh = &q[row * q_dim + head * hd..][..heads * hd];
        let task = Task::new(qh, k, v, spec, spec.pos0 + row, head);
        #[cfg(target_arch = "x86_64")]
        if heads > 1 {
            return group_attention(task, o);
        }
        head_attention(task, o);
    };
    if work >= PARALLEL_MIN_WORK {
        out.par_chunks_mut(heads * hd).enumerate().for_each(task);
    } else {
        out.chunks_mut(heads * hd).enumerate().for_each(task);
    }
    out
}

/// Where a head's keys or values lie in the cache: key `j` is `data[j * stride + base..]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) stride: usize,
    pub(crate) base: usize,
}

impl<'a> Rows<'a> {
    /// The `len` values of key `j`.
    pub(crate) fn row(&self, j: usize, len: usize) -> &'a [f32] {
        &self.data[j * self.stride + self.base..][..len]
    }

    /// Pointer to key `j`, checking that its `len` values are in bounds.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn at(&self, j: usize, len: usize) -> *const f32 {
        self.row(j, len).as_ptr()
    }
}

/// One attention task: the query values of one head, or of the heads sharing a key head
/// (`head` the first), and the keys and values they read.
#[derive(Debug, Clone, Copy)]
struct Task<'a> {
    q: &'a [f32],
    keys: Rows<'a>,
    values: Rows<'a>,
    /// First key seen (the sliding window's start).
    start: usize,
    /// The query's position, its last key.
    pos: usize,
    spec: AttnSpec,
}

impl<'a> Task<'a> {
    /// The task of query values `q` (heads `head..`) at absolute position `pos`.
    fn new(
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        spec: AttnSpec,
        pos: usize,
        head: usize,
    ) -> Self {
        let hd = spec.head_dim;
        let kv_head = head / (spec.n_heads / spec.n_kv_heads);
        let rows = |data| Rows {
            data,
            stride: spec.n_kv_heads * hd,
            base: kv_head * hd,
        };
        let start = spec.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        Task {
            q,
            keys: rows(k),
            values: rows(v),
            start,
            pos,
            spec,
        }
    }

    /// The keys the query sees.
    fn range(&self) -> std::ops::RangeInclusive<usize> {
        self.start..=self.pos
    }

    /// An empty vector for one head's scores.
    fn score_buffer(&self) -> Vec<f32> {
        Vec::with_capacity(self.pos + 1 - self.start)
    }
}

/// Whether the AVX-512 grouped loops take this shape: heads of 128 or 256 values and 2, 4
/// or 8 query heads per key head.
fn grouped(spec: AttnSpec) -> bool {
    #[cfg(target_arch = "x86_64")]
    return matches!(spec.head_dim, 128 | 256)
        && matches!(spec.n_heads / spec.n_kv_heads, 2 | 4 | 8)
        && crate::attention_avx512::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = spec;
        false
    }
}

/// A task of 2, 4 or 8 query heads sharing a key head, into `out`: per head exactly
/// [`head_attention`], with the scores of all heads formed together.
#[cfg(target_arch = "x86_64")]
fn group_attention(t: Task<'_>, out: &mut [f32]) {
    // SAFETY: `attend` groups heads only where `grouped` found AVX2, AVX-512F and DQ.
    unsafe {
        match (t.spec.head_dim, t.q.len() / t.spec.head_dim) {
            (128, 2) => group_attention_avx512::<8, 1>(t, out),
            (128, 4) => group_attention_avx512::<8, 2>(t, out),
            (128, _) => group_attention_avx512::<8, 4>(t, out),
            (_, 2) => group_attention_avx512::<16, 1>(t, out),
            (_, 4) => group_attention_avx512::<16, 2>(t, out),
            _ => group_attention_avx512::<16, 4>(t, out),
        }
    }
}

/// [`group_attention`] for heads of `16 * C` values, `2 * HP` of them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512dq")]
fn group_attention_avx512<const C: usize, const HP: usize>(t: Task<'_>, out: &mut [f32]) {
    use crate::attention_avx512::{group_scores, group_weighted_sum};
    let mut scores: Vec<Vec<f32>> = (0..2 * HP).map(|_| t.score_buffer()).collect();
    group_scores::<C, HP>(t.q, t.keys, t.range(), t.spec.scale, &mut scores);
    let invs: Vec<f32> = scores
        .iter_mut()
        .map(|s| normalize(s, t.spec.softcap))
        .collect();
    match HP {
        1 => group_weighted_sum::<C, 2>(&scores, &invs, t.values, t.range(), out),
        2 => group_weighted_sum::<C, 4>(&scores, &invs, t.values, t.range(), out),
        _ => group_weighted_sum::<C, 8>(&scores, &invs, t.values, t.range(), out),
    }
}

/// One query head's attention into `out`. On x86-64 the same arithmetic runs in the
/// AVX-512 loops of `attention_avx512` (heads of 128 or 256 values), the AVX2 loops of
/// `attention_avx2` (a multiple of 64) or the portable loops compiled for AVX2: every lane
/// does the same `f32` multiplications and additions in the same order, so the results are
/// identical.
fn head_attention(t: Task<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(t.spec.head_dim, 128 | 256) && crate::attention_avx512::available() {
        // SAFETY: AVX2, AVX-512F and DQ were just detected.
        return unsafe {
            match t.spec.head_dim {
                128 => head_attention_avx512::<8>(t, out),
                _ => head_attention_avx512::<16>(t, out),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return unsafe { head_attention_avx2(t, out) };
    }
    head_attention_body(t, out);
}

/// [`head_attention_body`] with the AVX2 loops of `attention_avx2` where they take the head
/// width, compiled with AVX2 either way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn head_attention_avx2(t: Task<'_>, out: &mut [f32]) {
    use crate::attention_avx2::{scores, takes, weighted_sum};
    if !takes(t.spec.head_dim) {
        return head_attention_body(t, out);
    }
    let mut s = t.score_buffer();
    scores(t.q, t.keys, t.range(), t.spec.scale, &mut s);
    let inv = normalize(&mut s, t.spec.softcap);
    weighted_sum(&s, inv, t.values, t.range(), out);
}

/// [`head_attention_body`] with the AVX-512 loops, for heads of `16 * C` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512dq")]
fn head_attention_avx512<const C: usize>(t: Task<'_>, out: &mut [f32]) {
    use crate::attention_avx512::{scores, weighted_sum};
    let mut s = t.score_buffer();
    scores::<C>(t.q, t.keys, t.range(), t.spec.scale, &mut s);
    let inv = normalize(&mut s, t.spec.softcap);
    weighted_sum::<C>(&s, inv, t.values, t.range(), out);
}

/// Turns raw scores into unnormalised softmax weights (soft-capped first when `softcap`)
/// and returns the reciprocal of their sum, added in key order. The exponentials are the
/// kernels' branch-free `exp` (within 2 ulp), so the loop vectorizes where libm's `expf`
/// would be a call per score.
#[inline(always)]
fn normalize(scores: &mut [f32], softcap: Option<f32>) -> f32 {
    if let Some(cap) = softcap {
        crate::ops::softcap(scores, cap);
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    1.0 / scores.iter().fold(0f32, |sum, s| sum + s)
}

#[inline(always)]
fn head_attention_body(t: Task<'_>, out: &mut [f32]) {
    let hd = t.spec.head_dim;
    // A plain loop rather than an iterator chain, so that `dot` is compiled inside this
    // function (and with its target features).
    let mut scores = t.score_buffer();
    for j in t.range() {
        scores.push(dot(t.q, t.keys.row(j, hd)) * t.spec.scale);
    }
    let inv = normalize(&mut scores, t.spec.softcap);
    out.fill(0.0);
    for (j, s) in t.range().zip(&scores) {
        let p = s * inv;
        for (o, x) in out.iter_mut().zip(t.values.row(j, hd)) {
            *o += p * x;
        }
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

    /// The dispatched head attention (AVX2, or AVX-512 where present) gives the bits of the
    /// portable loops for the head sizes the AVX-512 loops take, across tile tails, sliding
    /// windows, soft-capping and both head groupings.
    #[test]
    fn simd_heads_equal_the_portable_loops_bitwise() {
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for hd in [128, 256] {
            for (n_heads, n_kv_heads) in [(4, 1), (2, 2)] {
                let kv = 40 * n_kv_heads * hd;
                let (k, v, q) = (data(kv, 1.0), data(kv, 2.0), data(n_heads * hd, 3.0));
                for (window, softcap) in [(None, None), (Some(7), None), (None, Some(5.0))] {
                    let spec = AttnSpec {
                        pos0: 0,
                        n_heads,
                        n_kv_heads,
                        head_dim: hd,
                        scale: 0.3,
                        window,
                        softcap,
                    };
                    for pos in [0, 1, 15, 16, 17, 33, 39] {
                        for head in 0..n_heads {
                            let qh = &q[head * hd..][..hd];
                            let (mut fast, mut plain) = (vec![0f32; hd], vec![f32::NAN; hd]);
                            head_attention(Task::new(qh, &k, &v, spec, pos, head), &mut fast);
                            head_attention_body(Task::new(qh, &k, &v, spec, pos, head), &mut plain);
                            assert_eq!(bits(&fast), bits(&plain), "hd {hd} pos {pos} head {head}");
                        }
                    }
                }
            }
        }
    }

    /// The AVX2 loops give the bits of the portable ones, for the head widths they take
    /// (and fall back to them for others), across tile tails, windows and soft-capping.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_heads_equal_the_portable_loops_bitwise() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for hd in [64, 96, 128, 256] {
            let (k, v, q) = (data(40 * hd, 1.0), data(40 * hd, 2.0), data(2 * hd, 3.0));
            for (window, softcap) in [(None, None), (Some(7), None), (None, Some(5.0))] {
                let spec = AttnSpec {
                    pos0: 0,
                    n_heads: 2,
                    n_kv_heads: 1,
                    head_dim: hd,
                    scale: 0.3,
                    window,
                    softcap,
                };
                for (pos, head) in [0, 1, 7, 8, 9, 17, 39]
                    .into_iter()
                    .flat_map(|p| [(p, 0), (p, 1)])
                {
                    let qh = &q[head * hd..][..hd];
                    let (mut fast, mut plain) = (vec![0f32; hd], vec![f32::NAN; hd]);
                    // SAFETY: AVX2 was just detected.
                    unsafe {
                        head_attention_avx2(Task::new(qh, &k, &v, spec, pos, head), &mut fast)
                    };
                    head_attention_body(Task::new(qh, &k, &v, spec, pos, head), &mut plain);
                    assert_eq!(bits(&fast), bits(&plain), "hd {hd} pos {pos} head {head}");
                }
            }
        }
    }

    /// A forward of one row or a block (heads grouped where AVX-512 runs) gives, row by row
    /// and head by head, the bits of the portable loops.
    #[test]
    fn block_heads_equal_the_portable_loops_bitwise() {
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
                    let mut plain = vec![f32::NAN; hd];
                    head_attention_body(Task::new(qh, &k, &v, spec, pos0 + row, head), &mut plain);
                    assert_eq!(bits(got), bits(&plain), "hd {hd} row {row} head {head}");
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
