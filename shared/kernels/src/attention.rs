//! Attention of one query position over keys and values stored row by row (a KV cache):
//! for one query head, or for the 2, 4 or 8 query heads that share a key/value head, the
//! scores `dot(q, key_j) · scale` over keys `start..=pos` in increasing order, optional
//! `tanh` soft-capping, a softmax and the weighted sum of the values.
//!
//! The portable loops fix the arithmetic. On x86-64 the same arithmetic runs in the AVX-512
//! loops of `attention_avx512` (heads of 128 or 256 values, several heads sharing a key head
//! together, one read of each key and value for all of them), the AVX2 loops of
//! `attention_avx2` (a multiple of 64) or the portable loops compiled for AVX2, chosen at
//! runtime by what the CPU has: every lane does the same `f32` multiplications and additions
//! in the same order, so the results are identical whichever runs.

use std::ops::RangeInclusive;

use crate::vector::{dot, exp, softcap};

/// Where a head's keys or values lie in a cache: key `j` is `data[j * stride + base..]`.
#[derive(Debug, Clone, Copy)]
pub struct KvRows<'a> {
    /// Rows of every position (and every key/value head).
    pub data: &'a [f32],
    /// Values from one position to the next.
    pub stride: usize,
    /// Offset of the head within a position.
    pub base: usize,
}

impl<'a> KvRows<'a> {
    /// The `len` values of key `j`.
    pub fn row(&self, j: usize, len: usize) -> &'a [f32] {
        &self.data[j * self.stride + self.base..][..len]
    }

    /// Pointer to key `j`, checking that its `len` values are in bounds.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn at(&self, j: usize, len: usize) -> *const f32 {
        self.row(j, len).as_ptr()
    }
}

/// The attention of the query heads `q` (one head, or several sharing `keys` and `values`,
/// `head_dim` values each) at position `pos`, which see keys `start..=pos`.
#[derive(Debug, Clone, Copy)]
pub struct HeadAttention<'a> {
    /// Query values, head after head.
    pub q: &'a [f32],
    /// The keys the heads read.
    pub keys: KvRows<'a>,
    /// The values the heads read.
    pub values: KvRows<'a>,
    /// First key seen (a sliding window's start).
    pub start: usize,
    /// The query's position, its last key.
    pub pos: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Multiplier of the raw scores.
    pub scale: f32,
    /// `tanh` soft-capping of the scores.
    pub softcap: Option<f32>,
}

impl<'a> HeadAttention<'a> {
    /// Writes each head's attention into its `head_dim` values of `out`: together where
    /// [`attention_groups`] holds for their count, otherwise one head after another.
    pub fn run(&self, out: &mut [f32]) {
        let hd = self.head_dim;
        assert!(self.q.len().is_multiple_of(hd) && out.len() == self.q.len());
        #[cfg(target_arch = "x86_64")]
        if attention_groups(hd, self.q.len() / hd) {
            return group_attention(*self, out);
        }
        for (q, o) in self.q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
            head_attention(HeadAttention { q, ..*self }, o);
        }
    }

    /// The keys the query sees.
    fn range(&self) -> RangeInclusive<usize> {
        self.start..=self.pos
    }

    /// An empty vector for one head's scores.
    fn score_buffer(&self) -> Vec<f32> {
        Vec::with_capacity(self.pos + 1 - self.start)
    }
}

/// Whether [`HeadAttention::run`] computes `heads` query heads sharing a key head together
/// on this CPU: heads of 128 or 256 values, 2, 4 or 8 of them, and AVX-512.
pub fn attention_groups(head_dim: usize, heads: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return matches!(head_dim, 128 | 256)
        && matches!(heads, 2 | 4 | 8)
        && crate::attention_avx512::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (head_dim, heads);
        false
    }
}

/// A task of 2, 4 or 8 query heads sharing a key head, into `out`: per head exactly
/// [`head_attention`], with the scores of all heads formed together.
#[cfg(target_arch = "x86_64")]
fn group_attention(t: HeadAttention<'_>, out: &mut [f32]) {
    // SAFETY: `run` groups heads only where `attention_groups` found AVX2, AVX-512F and DQ.
    unsafe {
        match (t.head_dim, t.q.len() / t.head_dim) {
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
fn group_attention_avx512<const C: usize, const HP: usize>(t: HeadAttention<'_>, out: &mut [f32]) {
    use crate::attention_avx512::{group_scores, group_weighted_sum};
    let mut scores: Vec<Vec<f32>> = (0..2 * HP).map(|_| t.score_buffer()).collect();
    group_scores::<C, HP>(t.q, t.keys, t.range(), t.scale, &mut scores);
    let invs: Vec<f32> = scores.iter_mut().map(|s| normalize(s, t.softcap)).collect();
    match HP {
        1 => group_weighted_sum::<C, 2>(&scores, &invs, t.values, t.range(), out),
        2 => group_weighted_sum::<C, 4>(&scores, &invs, t.values, t.range(), out),
        _ => group_weighted_sum::<C, 8>(&scores, &invs, t.values, t.range(), out),
    }
}

/// One query head's attention into `out`, in the fastest loops this CPU runs.
fn head_attention(t: HeadAttention<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(t.head_dim, 128 | 256) && crate::attention_avx512::available() {
        // SAFETY: AVX2, AVX-512F and DQ were just detected.
        return unsafe {
            match t.head_dim {
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
fn head_attention_avx2(t: HeadAttention<'_>, out: &mut [f32]) {
    use crate::attention_avx2::{scores, takes, weighted_sum};
    if !takes(t.head_dim) {
        return head_attention_body(t, out);
    }
    let mut s = t.score_buffer();
    scores(t.q, t.keys, t.range(), t.scale, &mut s);
    let inv = normalize(&mut s, t.softcap);
    weighted_sum(&s, inv, t.values, t.range(), out);
}

/// [`head_attention_body`] with the AVX-512 loops, for heads of `16 * C` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512dq")]
fn head_attention_avx512<const C: usize>(t: HeadAttention<'_>, out: &mut [f32]) {
    use crate::attention_avx512::{scores, weighted_sum};
    let mut s = t.score_buffer();
    scores::<C>(t.q, t.keys, t.range(), t.scale, &mut s);
    let inv = normalize(&mut s, t.softcap);
    weighted_sum::<C>(&s, inv, t.values, t.range(), out);
}

/// Turns raw scores into unnormalised softmax weights (soft-capped first when `softcap`)
/// and returns the reciprocal of their sum, added in key order. The exponentials are the
/// branch-free [`exp`] (within 2 ulp), so the loop vectorizes where libm's `expf` would be
/// a call per score.
#[inline(always)]
fn normalize(scores: &mut [f32], cap: Option<f32>) -> f32 {
    if let Some(cap) = cap {
        softcap(scores, cap);
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    1.0 / scores.iter().fold(0f32, |sum, s| sum + s)
}

/// The portable loops of one head, whose arithmetic every SIMD form repeats.
#[inline(always)]
fn head_attention_body(t: HeadAttention<'_>, out: &mut [f32]) {
    let hd = t.head_dim;
    // A plain loop rather than an iterator chain, so that `dot` is compiled inside this
    // function (and with its target features).
    let mut scores = t.score_buffer();
    for j in t.range() {
        scores.push(dot(t.q, t.keys.row(j, hd)) * t.scale);
    }
    let inv = normalize(&mut scores, t.softcap);
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
    use tandem_testkit::bits;

    use super::*;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        crate::test_data::sine(n, seed, 0.7)
    }

    /// Heads, window and soft-capping of a model's attention layer.
    #[derive(Debug, Clone, Copy)]
    struct Shape {
        n_heads: usize,
        n_kv_heads: usize,
        hd: usize,
        window: Option<usize>,
        softcap: Option<f32>,
    }

    impl Shape {
        /// Query heads `head..head + heads` of the row `q` at `pos`, over the keys and values
        /// of their key head in `k` and `v` (consecutive query heads share a key head).
        fn task<'a>(
            self,
            (q, k, v): (&'a [f32], &'a [f32], &'a [f32]),
            pos: usize,
            head: usize,
            heads: usize,
        ) -> HeadAttention<'a> {
            let kv_head = head / (self.n_heads / self.n_kv_heads);
            let rows = |data| KvRows {
                data,
                stride: self.n_kv_heads * self.hd,
                base: kv_head * self.hd,
            };
            HeadAttention {
                q: &q[head * self.hd..][..heads * self.hd],
                keys: rows(k),
                values: rows(v),
                start: self.window.map_or(0, |w| (pos + 1).saturating_sub(w)),
                pos,
                head_dim: self.hd,
                scale: 0.3,
                softcap: self.softcap,
            }
        }

        /// Every head of the row `q` at `pos` in the portable loops, one after another.
        fn portable(self, qkv: (&[f32], &[f32], &[f32]), pos: usize) -> Vec<f32> {
            let mut out = vec![f32::NAN; self.n_heads * self.hd];
            for (head, o) in out.chunks_exact_mut(self.hd).enumerate() {
                head_attention_body(self.task(qkv, pos, head, 1), o);
            }
            out
        }
    }

    /// `n_heads` query heads of `hd` values on `n_kv_heads` key heads, without a window or
    /// soft-capping, with a window of 7 keys, and soft-capped.
    fn variants(n_heads: usize, n_kv_heads: usize, hd: usize) -> impl Iterator<Item = Shape> {
        [(None, None), (Some(7), None), (None, Some(5.0))]
            .into_iter()
            .map(move |(window, softcap)| Shape {
                n_heads,
                n_kv_heads,
                hd,
                window,
                softcap,
            })
    }

    /// Every head of `shape` at each of `positions` (over 40 keys), run alone by `fast`,
    /// gives the bits of the portable loops.
    fn assert_heads_portable(
        shape: Shape,
        positions: &[usize],
        fast: impl Fn(HeadAttention<'_>, &mut [f32]),
    ) {
        let (hd, kv) = (shape.hd, 40 * shape.n_kv_heads * shape.hd);
        let (k, v, q) = (data(kv, 1.0), data(kv, 2.0), data(shape.n_heads * hd, 3.0));
        for &pos in positions {
            let plain = shape.portable((&q, &k, &v), pos);
            for (head, plain) in plain.chunks_exact(hd).enumerate() {
                let mut got = vec![0f32; hd];
                fast(shape.task((&q, &k, &v), pos, head, 1), &mut got);
                assert_eq!(bits(&got), bits(plain), "{shape:?} pos {pos} head {head}");
            }
        }
    }

    /// The dispatched head attention (AVX2, or AVX-512 where present) gives the bits of the
    /// portable loops for the head sizes the AVX-512 loops take, across tile tails, sliding
    /// windows, soft-capping and both head groupings.
    #[test]
    fn simd_heads_equal_the_portable_loops_bitwise() {
        for hd in [128, 256] {
            for (n_heads, n_kv_heads) in [(4, 1), (2, 2)] {
                for shape in variants(n_heads, n_kv_heads, hd) {
                    assert_heads_portable(shape, &[0, 1, 15, 16, 17, 33, 39], head_attention);
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
        for hd in [64, 96, 128, 256] {
            for shape in variants(2, 1, hd) {
                assert_heads_portable(shape, &[0, 1, 7, 8, 9, 17, 39], |task, out| {
                    // SAFETY: AVX2 was just detected.
                    unsafe { head_attention_avx2(task, out) }
                });
            }
        }
    }

    /// The query heads of a key head run together (grouped where AVX-512 runs, all of a
    /// key head's heads or half of them) give, head by head, the bits of the portable loops.
    #[test]
    fn grouped_heads_equal_the_portable_loops_bitwise() {
        let shapes = [(4, 1), (4, 2), (8, 1), (2, 2), (2, 1)];
        for hd in [128, 256] {
            for (n_heads, n_kv_heads) in shapes {
                let kv = 40 * n_kv_heads * hd;
                let (k, v, q) = (data(kv, 1.0), data(kv, 2.0), data(n_heads * hd, 3.0));
                let group = n_heads / n_kv_heads;
                for shape in variants(n_heads, n_kv_heads, hd) {
                    for (pos, heads) in [0, 7, 8, 9, 21, 25, 39]
                        .into_iter()
                        .flat_map(|p| [(p, group), (p, (group / 2).max(1))])
                    {
                        let plain = shape.portable((&q, &k, &v), pos);
                        let mut got = vec![0f32; n_heads * hd];
                        for (head, o) in (0..n_heads)
                            .step_by(heads)
                            .zip(got.chunks_exact_mut(heads * hd))
                        {
                            shape.task((&q, &k, &v), pos, head, heads).run(o);
                        }
                        assert_eq!(
                            bits(&got),
                            bits(&plain),
                            "hd {hd} {n_heads}/{n_kv_heads} pos {pos} by {heads}"
                        );
                    }
                }
            }
        }
    }
}
