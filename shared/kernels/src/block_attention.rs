//! Attention of a block of query rows (a block drafter's positions) over keys kept in
//! panels, for many narrow heads: each head's scores over every key of the parts in order,
//! one softmax over all of them, and the weighted sum of the values.
//!
//! Keys of [`PANEL`] consecutive positions form a panel stored dimension-major
//! (`panel[c * PANEL + l]` is value `c` of the panel's key `l`), so a query scores a whole
//! panel with one vector multiply and add per dimension and no horizontal sum; values stay
//! row-major and are summed over register tiles of [`TILE_ROWS`] query rows by
//! [`TILE_COLS`] values. A head's score of one query and key is `scale · Σ_c q_c · k_c`
//! (added in `c` order), its weight the branch-free [`exp`] of the score minus the row's
//! maximum, the weights' sum [`lane_sum`]'s, and each output `Σ_j w_j · v_j` (added in key
//! order) times the reciprocal of that sum: the same `f32` operations in the same order in
//! the portable loops and their AVX2 and AVX-512 compilations, so every form gives the same
//! bits, and a row's result never depends on which other rows, heads or sessions are
//! computed beside it.

use crate::vector::{exp, lane_max, lane_sum};

/// Positions in a panel of keys.
pub const PANEL: usize = 8;
/// Query rows summed together over the values.
pub const TILE_ROWS: usize = 4;
/// Values of a head summed together in one tile.
pub const TILE_COLS: usize = 16;

/// The keys of a growing context, `width` values a position, in panels of [`PANEL`]
/// positions (the last one zero-padded).
#[derive(Debug, Clone, Default)]
pub struct KeyPanels {
    data: Vec<f32>,
    width: usize,
    len: usize,
}

impl KeyPanels {
    /// No keys, `width` values each.
    pub fn new(width: usize) -> Self {
        Self {
            data: Vec::new(),
            width,
            len: 0,
        }
    }

    /// The keys of `rows` (row-major, `width` values each).
    pub fn of_rows(width: usize, rows: &[f32]) -> Self {
        let mut keys = Self::new(width);
        keys.push_rows(rows);
        keys
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values per position.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Appends the keys `rows` (row-major, [`KeyPanels::width`] values each).
    ///
    /// # Panics
    /// When `rows` is not a whole number of rows.
    pub fn push_rows(&mut self, rows: &[f32]) {
        let w = self.width;
        assert!(w > 0 && rows.len().is_multiple_of(w), "partial key row");
        for row in rows.chunks_exact(w) {
            let slot = self.len % PANEL;
            if slot == 0 {
                self.data.resize(self.data.len() + w * PANEL, 0.0);
            }
            let panel = self.data.len() - w * PANEL;
            for (c, x) in row.iter().enumerate() {
                self.data[panel + c * PANEL + slot] = *x;
            }
            self.len += 1;
        }
    }

    /// Values `first..first + count` of panel `p`'s keys: `count * PANEL` values.
    fn panel(&self, p: usize, first: usize, count: usize) -> &[f32] {
        &self.data[(p * self.width + first) * PANEL..][..count * PANEL]
    }
}

/// Keys in panels and their values, row-major `[keys.len(), width]`.
#[derive(Debug, Clone, Copy)]
pub struct KeysValues<'a> {
    /// The keys.
    pub keys: &'a KeyPanels,
    /// One row of values a key.
    pub values: &'a [f32],
}

/// The attention of the rows of `q` over the keys of `parts`, in order, for `heads`
/// heads of `width / heads` values, scores scaled by `scale`.
#[derive(Debug, Clone, Copy)]
pub struct BlockAttention<'a> {
    /// Query rows, row-major, `width` values each.
    pub q: &'a [f32],
    /// The keys every row sees, softmax over all of them.
    pub parts: &'a [KeysValues<'a>],
    /// Heads in a row.
    pub heads: usize,
    /// Multiplier of the raw scores.
    pub scale: f32,
}

impl BlockAttention<'_> {
    /// Values in a row (the parts' width).
    fn width(&self) -> usize {
        self.parts.first().map_or(0, |p| p.keys.width())
    }

    /// Head `h` of every query row: `[rows, width / heads]`, row-major.
    ///
    /// # Panics
    /// When the parts' widths differ from the rows', a part's values do not match its
    /// keys, or no key is given.
    pub fn head(&self, h: usize) -> Vec<f32> {
        let w = self.width();
        assert!(w > 0 && self.q.len().is_multiple_of(w) && w.is_multiple_of(self.heads));
        for p in self.parts {
            assert_eq!(p.keys.width(), w, "parts of different widths");
            assert_eq!(p.values.len(), p.keys.len() * w, "values do not match keys");
        }
        assert!(self.parts.iter().any(|p| !p.keys.is_empty()), "no keys");
        #[cfg(target_arch = "x86_64")]
        {
            if crate::attention_avx512::available() {
                // SAFETY: AVX2, AVX-512F and DQ were just detected.
                return unsafe { head_avx512(self, h) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was just detected.
                return unsafe { head_avx2(self, h) };
            }
        }
        head_body(self, h)
    }

    /// Every head of every query row, `[rows, width]` row-major.
    pub fn run(&self) -> Vec<f32> {
        let w = self.width();
        let hd = w / self.heads.max(1);
        let mut out = vec![0f32; self.q.len()];
        for h in 0..self.heads {
            let head = self.head(h);
            for (o, x) in out.chunks_exact_mut(w).zip(head.chunks_exact(hd)) {
                o[h * hd..(h + 1) * hd].copy_from_slice(x);
            }
        }
        out
    }
}

/// [`head_body`] compiled with AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512dq")]
fn head_avx512(t: &BlockAttention<'_>, h: usize) -> Vec<f32> {
    head_body(t, h)
}

/// [`head_body`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn head_avx2(t: &BlockAttention<'_>, h: usize) -> Vec<f32> {
    head_body(t, h)
}

/// One head: scores, weights, weighted sum.
#[inline(always)]
fn head_body(t: &BlockAttention<'_>, h: usize) -> Vec<f32> {
    let w = t.width();
    let hd = w / t.heads;
    let rows = t.q.len() / w;
    let keys: usize = t.parts.iter().map(|p| p.keys.len()).sum();
    let q: Vec<&[f32]> = t.q.chunks_exact(w).map(|r| &r[h * hd..][..hd]).collect();
    let mut scores = vec![0f32; rows * keys];
    let mut at = 0;
    for part in t.parts {
        part_scores(
            &q,
            part.keys,
            (h * hd, hd),
            t.scale,
            (&mut scores, keys, at),
        );
        at += part.keys.len();
    }
    let inv: Vec<f32> = scores.chunks_exact_mut(keys).map(weights).collect();
    let mut out = vec![0f32; rows * hd];
    let mut at = 0;
    for part in t.parts {
        let n = part.keys.len();
        let values = (part.values, w, h * hd);
        weighted_sum(&scores, (keys, at, n), values, &mut out, hd);
        at += n;
    }
    for (row, inv) in out.chunks_exact_mut(hd).zip(inv) {
        row.iter_mut().for_each(|o| *o *= inv);
    }
    out
}

/// Scaled scores of the query heads `q` against the keys of `part` (the head's values
/// `first..first + hd` of each), written from column `at` of each `keys`-wide row of
/// `scores`.
#[inline(always)]
fn part_scores(
    q: &[&[f32]],
    part: &KeyPanels,
    (first, hd): (usize, usize),
    scale: f32,
    (scores, keys, at): (&mut [f32], usize, usize),
) {
    for p in 0..part.len().div_ceil(PANEL) {
        let panel = part.panel(p, first, hd);
        let valid = (part.len() - p * PANEL).min(PANEL);
        for (i, qi) in q.iter().enumerate() {
            let mut acc = [0f32; PANEL];
            for (c, keys_c) in panel.chunks_exact(PANEL).enumerate() {
                let x = qi[c];
                for (a, k) in acc.iter_mut().zip(keys_c) {
                    *a += x * k;
                }
            }
            let row = &mut scores[i * keys + at + p * PANEL..][..valid];
            for (s, a) in row.iter_mut().zip(acc) {
                *s = a * scale;
            }
        }
    }
}

/// Turns one row's scores into unnormalised softmax weights; returns the reciprocal of
/// their sum.
#[inline(always)]
fn weights(row: &mut [f32]) -> f32 {
    let max = lane_max(row);
    for s in row.iter_mut() {
        *s = exp(*s - max);
    }
    (1.0 / lane_sum(row)) as f32
}

/// Adds to each row of `out` (`hd` values a row) the weighted values of one part: the
/// part's `n` keys are columns `at..at + n` of the `keys`-wide rows of `weights`, its
/// values row `j` at `values[j * stride + first..][..hd]`.
#[inline(always)]
fn weighted_sum(
    weights: &[f32],
    (keys, at, n): (usize, usize, usize),
    (values, stride, first): (&[f32], usize, usize),
    out: &mut [f32],
    hd: usize,
) {
    let rows = out.len() / hd;
    for r0 in (0..rows).step_by(TILE_ROWS) {
        let tile_rows = (rows - r0).min(TILE_ROWS);
        for c0 in (0..hd).step_by(TILE_COLS) {
            let cols = (hd - c0).min(TILE_COLS);
            let mut acc = [[0f32; TILE_COLS]; TILE_ROWS];
            for (r, a) in acc.iter_mut().enumerate().take(tile_rows) {
                a[..cols].copy_from_slice(&out[(r0 + r) * hd + c0..][..cols]);
            }
            if cols == TILE_COLS && tile_rows == TILE_ROWS {
                full_tile(
                    weights,
                    (keys, at + r0 * keys, n),
                    (values, stride, first + c0),
                    &mut acc,
                );
            } else {
                for j in 0..n {
                    let v = &values[j * stride + first + c0..][..cols];
                    for (r, a) in acc.iter_mut().enumerate().take(tile_rows) {
                        let wj = weights[(r0 + r) * keys + at + j];
                        for (o, x) in a.iter_mut().zip(v) {
                            *o += wj * x;
                        }
                    }
                }
            }
            for (r, a) in acc.iter().enumerate().take(tile_rows) {
                out[(r0 + r) * hd + c0..][..cols].copy_from_slice(&a[..cols]);
            }
        }
    }
}

/// [`weighted_sum`]'s loop for a whole tile, with constant bounds so that the tile stays
/// in registers; `base` is the tile's first weight.
#[inline(always)]
fn full_tile(
    weights: &[f32],
    (keys, base, n): (usize, usize, usize),
    (values, stride, first): (&[f32], usize, usize),
    acc: &mut [[f32; TILE_COLS]; TILE_ROWS],
) {
    let mut tile = *acc;
    for j in 0..n {
        let v: &[f32; TILE_COLS] = values[j * stride + first..][..TILE_COLS]
            .try_into()
            .expect("a tile of values");
        for (r, a) in tile.iter_mut().enumerate() {
            let wj = weights[base + r * keys + j];
            for (o, x) in a.iter_mut().zip(v) {
                *o += wj * x;
            }
        }
    }
    *acc = tile;
}

#[cfg(test)]
mod tests {
    use tandem_testkit::bits;

    use super::*;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        crate::test_data::sine(n, seed, 0.37)
    }

    /// A context of `ctx` keys (pushed in pieces of 5) and a block of `rows` keys, with
    /// their values, `width` wide; `keys` holds them all row-major, context first.
    struct Case {
        width: usize,
        keys: Vec<f32>,
        ctx: (KeyPanels, Vec<f32>),
        block: (KeyPanels, Vec<f32>),
        q: Vec<f32>,
    }

    impl Case {
        fn new(width: usize, ctx: usize, rows: usize) -> Self {
            let (k, v) = (data(ctx * width, 1.0), data(ctx * width, 2.0));
            let mut keys = KeyPanels::new(width);
            k.chunks(5 * width).for_each(|c| keys.push_rows(c));
            let bk = data(rows * width, 3.0);
            Self {
                width,
                keys: [k, bk.clone()].concat(),
                ctx: (keys, v),
                block: (KeyPanels::of_rows(width, &bk), data(rows * width, 4.0)),
                q: data(rows * width, 5.0),
            }
        }

        fn parts(&self) -> [KeysValues<'_>; 2] {
            [(&self.ctx), (&self.block)].map(|(keys, values)| KeysValues { keys, values })
        }

        /// Every head of the rows of `q`, in f64 from the row-major keys.
        fn reference(&self, heads: usize, scale: f64) -> Vec<f64> {
            let (w, hd) = (self.width, self.width / heads);
            let v: Vec<f32> = [&self.ctx.1[..], &self.block.1[..]].concat();
            let mut out = vec![0f64; self.q.len()];
            for (qi, oi) in self.q.chunks_exact(w).zip(out.chunks_exact_mut(w)) {
                for h in 0..heads {
                    let cols = h * hd..(h + 1) * hd;
                    let s: Vec<f64> = (self.keys)
                        .chunks_exact(w)
                        .map(|kj| {
                            let d: f64 = cols.clone().map(|c| qi[c] as f64 * kj[c] as f64).sum();
                            d * scale
                        })
                        .collect();
                    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for (ej, vj) in e.iter().zip(v.chunks_exact(w)) {
                        for c in cols.clone() {
                            oi[c] += ej / sum * vj[c] as f64;
                        }
                    }
                }
            }
            out
        }
    }

    /// Scores, softmax and sums agree with an f64 reference, across panel tails, head
    /// widths off the column tile and row counts off the row tile.
    #[test]
    fn block_attention_matches_an_f64_reference() {
        for (width, heads) in [(256, 8), (96, 4), (48, 2)] {
            for (ctx, rows) in [(1, 1), (7, 3), (8, 8), (9, 5), (33, 9)] {
                let case = Case::new(width, ctx, rows);
                let parts = case.parts();
                let got = BlockAttention {
                    q: &case.q,
                    parts: &parts,
                    heads,
                    scale: 0.4,
                }
                .run();
                let want = case.reference(heads, 0.4);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (*g as f64 - w).abs())
                    .fold(0f64, f64::max);
                assert!(worst < 2e-6, "width {width} ctx {ctx} rows {rows}: {worst}");
            }
        }
    }

    /// The dispatched loops give the portable loops' bits, and each row computed alone
    /// gives the bits it has in its block.
    #[test]
    fn every_form_and_every_row_alone_give_the_same_bits() {
        for (width, heads) in [(256, 8), (96, 4)] {
            let case = Case::new(width, 21, 9);
            let parts = case.parts();
            let t = BlockAttention {
                q: &case.q,
                parts: &parts,
                heads,
                scale: 0.25,
            };
            let hd = width / heads;
            for h in 0..heads {
                let fast = t.head(h);
                assert_eq!(
                    bits(&fast),
                    bits(&head_body(&t, h)),
                    "width {width} head {h}"
                );
                for (i, q) in case.q.chunks_exact(width).enumerate() {
                    let alone = BlockAttention { q, ..t }.head(h);
                    assert_eq!(bits(&alone), bits(&fast[i * hd..(i + 1) * hd]), "row {i}");
                }
            }
        }
    }

    #[test]
    fn keys_pushed_in_pieces_equal_keys_pushed_at_once() {
        let rows = data(19 * 16, 6.0);
        let mut pieces = KeyPanels::new(16);
        for c in rows.chunks(3 * 16) {
            pieces.push_rows(c);
        }
        let once = KeyPanels::of_rows(16, &rows);
        assert_eq!((pieces.len(), once.len()), (19, 19));
        assert_eq!(bits(&pieces.data), bits(&once.data));
        assert_eq!(
            once.panel(2, 3, 1),
            &rows[16 * 16 + 3..]
                .iter()
                .step_by(16)
                .take(3)
                .copied()
                .chain([0.0; 5])
                .collect::<Vec<_>>()[..]
        );
    }
}
