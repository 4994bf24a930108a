//! The *panel* stage of the exact-mode kernel for many activation rows
//! (verification and prefill): a few weight rows already dequantized to f32
//! by `exact_avx2`, dotted with every activation row.
//!
//! The per-pair arithmetic is the one every f32 kernel of this crate uses
//! (see `float`): chunk `c` of eight elements is FMA'd into accumulator
//! `c % 4` in increasing `c`, then `hsum((a0 + a1) + (a2 + a3))`. The four
//! accumulators of a pair are independent chains, so the panel kernels
//! compute them one at a time: pass `i` walks the chunks `c ≡ i (mod 4)` for
//! a tile of weight rows × activation rows with one register per pair, so a
//! tile loads `J + R` vectors for `J · R` FMAs and keeps `J · R` chains in
//! flight. Rows are walked in segments of [`SEGMENT`] elements (the
//! accumulators wait in a state buffer in between), so that a group's
//! activation slices stay in L1 while the panel's slices are swept.
//!
//! Two kernels share this scheme:
//!
//! * [`Panel::Narrow`] (AVX2): 3 × 3 tiles of 8-lane registers;
//! * [`Panel::Wide`] (AVX-512F + VL, `panel_avx512`): two activation rows
//!   per 16-lane register, each half an 8-lane chain of its own, so one
//!   512-bit FMA advances two pairs with exactly the 8-lane arithmetic.
//!
//! Each chain sees the same products in the same order in every tile shape
//! and in both kernels, so neither the shape nor the machine can change a
//! result.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::panel_avx512::{Paired, Wide};
use crate::simd::{hsum, prefetch_l2};
use crate::tile::{dispatch_group, groups};

/// Elements of a row walked before moving to the next tile.
const SEGMENT: usize = 512;

/// Dequantized weights per panel: the panel and a group's activation
/// segments together stay within L1.
const PANEL_FLOATS: usize = 4096;

/// Weight rows per narrow tile.
const J: usize = 3;
/// Activation rows per narrow tile.
const R: usize = 3;

/// The panel kernel of one thread's share of a matmul, with its scratch.
pub(crate) enum Panel<'a> {
    /// AVX2 3 × 3 tiles; `state` holds the accumulators between segments.
    Narrow { state: Vec<[__m256; 4]> },
    /// AVX-512 row-pair tiles (see `panel_avx512`).
    Wide(Wide<'a>),
}

impl<'a> Panel<'a> {
    /// The wide kernel when the activations were paired for it (only done
    /// where AVX-512F and VL exist), the narrow one otherwise.
    pub(crate) fn new(paired: Option<&'a Paired>) -> Self {
        match paired {
            Some(paired) => Panel::Wide(Wide::new(paired)),
            None => Panel::Narrow { state: Vec::new() },
        }
    }

    /// Weight rows per panel for rows of `k` elements: whole tiles, about
    /// [`PANEL_FLOATS`] values.
    pub(crate) fn rows(&self, k: usize) -> usize {
        let tile = match self {
            Panel::Narrow { .. } => J,
            Panel::Wide(_) => crate::panel_avx512::J,
        };
        (PANEL_FLOATS / k).max(1).next_multiple_of(tile)
    }

    /// Consecutive f32 weight rows `panel` (`k` values each, `k` a multiple
    /// of 32) against every activation row of `x` (`outs.len()` rows of
    /// `k`), as outputs `j0..`: `outs[r][j0 + i] = x[r] · panel[i]`.
    /// Meanwhile the bytes `ahead` (the next panel's weights) are
    /// prefetched into L2, a share per tile, so that memory streams while
    /// the FMA units work.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn run(
        &mut self,
        panel: &[f32],
        k: usize,
        x: &[f32],
        j0: usize,
        outs: &mut [&mut [f32]],
        ahead: &[u8],
    ) {
        assert!(k.is_multiple_of(32) && panel.len().is_multiple_of(k) && x.len() >= outs.len() * k);
        match self {
            Panel::Narrow { state } => sweep(panel, k, x, j0, outs, ahead, state),
            // SAFETY: a `Paired` (which `Wide` needs) is only built after
            // AVX-512F and VL were detected.
            Panel::Wide(wide) => unsafe { wide.sweep(panel, k, j0, outs, ahead) },
        }
    }
}

/// The segments of a row of `k` elements (a multiple of 32), as ranges of
/// 8-element chunks, each starting at a multiple of four chunks: about
/// [`SEGMENT`] elements each, of near-equal length.
pub(crate) fn segments(k: usize) -> impl ExactSizeIterator<Item = Range<usize>> + Clone {
    let count = k.div_ceil(SEGMENT);
    let seg = (k / 32).div_ceil(count) * 32;
    (0..count).map(move |s| s * seg / 8..((s + 1) * seg).min(k) / 8)
}

/// Prefetches `ahead` in `tiles` equal shares, one per call.
pub(crate) struct Ahead<'a> {
    bytes: &'a [u8],
    share: usize,
    at: usize,
}

impl<'a> Ahead<'a> {
    pub(crate) fn new(bytes: &'a [u8], tiles: usize) -> Self {
        let share = bytes.len().div_ceil(tiles.max(1)).next_multiple_of(64);
        Ahead {
            bytes,
            share,
            at: 0,
        }
    }

    /// Prefetches the next share.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn next(&mut self) {
        prefetch_l2(self.bytes, self.at, self.share);
        self.at += self.share;
    }
}

/// [`Panel::run`] with 3 × 3 tiles: activation groups outside, then
/// segments, then tiles.
#[target_feature(enable = "avx2,fma,f16c")]
fn sweep(
    panel: &[f32],
    k: usize,
    x: &[f32],
    j0: usize,
    outs: &mut [&mut [f32]],
    ahead: &[u8],
    state: &mut Vec<[__m256; 4]>,
) {
    let rows = panel.len() / k;
    let segs = segments(k);
    let mut ahead = Ahead::new(
        ahead,
        outs.len().div_ceil(R) * rows.div_ceil(J) * segs.len(),
    );
    for (r0, len) in groups(outs.len(), R) {
        let xs = &x[r0 * k..(r0 + len) * k];
        state.clear();
        state.resize(rows * len, [_mm256_setzero_ps(); 4]);
        for chunks in segs.clone() {
            for i in (0..rows).step_by(J) {
                let jn = (rows - i).min(J);
                let w = &panel[i * k..(i + jn) * k];
                let st = &mut state[i * len..(i + jn) * len];
                ahead.next();
                dispatch_group!(jn, JN => {
                    dispatch_group!(len, RN => tile::<JN, RN>(w, xs, k, chunks.clone(), st), [1, 2, 3])
                }, [1, 2, 3]);
            }
        }
        for (i, st) in state.chunks_exact(len).enumerate() {
            for (r, &[a0, a1, a2, a3]) in st.iter().enumerate() {
                let sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
                outs[r0 + r][j0 + i] = hsum(sum);
            }
        }
    }
}

/// Chunks `chunks` (eight elements each, starting at a multiple of four)
/// of weight rows `w` (`JN` rows of `k`) against activation rows `x` (`RN`
/// rows of `k`), continuing the accumulators `state[jj * RN + r]`.
#[inline]
#[allow(
    clippy::needless_range_loop,
    reason = "tiles index accumulators by (row, row)"
)]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<const JN: usize, const RN: usize>(
    w: &[f32],
    x: &[f32],
    k: usize,
    chunks: Range<usize>,
    state: &mut [[__m256; 4]],
) {
    assert!(w.len() == JN * k && x.len() == RN * k && state.len() == JN * RN);
    assert!(chunks.start.is_multiple_of(4) && chunks.end <= k / 8);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    for i in 0..4 {
        let mut acc: [[__m256; RN]; JN] =
            std::array::from_fn(|jj| std::array::from_fn(|r| state[jj * RN + r][i]));
        for c in (chunks.start + i..chunks.end).step_by(4) {
            // SAFETY: `c < k / 8`, so elements `8c..8c + 8` of every row lie
            // inside `w` (JN rows of k) and `x` (RN rows of k), as asserted.
            unsafe {
                let mut wv = [_mm256_setzero_ps(); JN];
                for (jj, wv) in wv.iter_mut().enumerate() {
                    *wv = _mm256_loadu_ps(wp.add(jj * k + 8 * c));
                }
                for r in 0..RN {
                    let xv = _mm256_loadu_ps(xp.add(r * k + 8 * c));
                    for jj in 0..JN {
                        acc[jj][r] = _mm256_fmadd_ps(wv[jj], xv, acc[jj][r]);
                    }
                }
            }
        }
        for jj in 0..JN {
            for r in 0..RN {
                state[jj * RN + r][i] = acc[jj][r];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Panel;
    use crate::panel_avx512::{wide_available, Paired};
    use crate::{Isa, QType};

    /// `panel · x` by `kernel`, as `m` output rows.
    fn run(kernel: &mut Panel<'_>, panel: &[f32], k: usize, x: &[f32], m: usize) -> Vec<Vec<f32>> {
        let rows = panel.len() / k;
        let mut out = vec![vec![f32::NAN; rows]; m];
        let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
        let ahead = [0u8; 100];
        // SAFETY: the callers checked that AVX2, FMA and F16C are present.
        unsafe { kernel.run(panel, k, x, 0, &mut outs, &ahead) };
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Both panel kernels give, bit for bit, what the F32 row kernel
        /// gives for the same rows (the per-pair arithmetic of every f32
        /// path), across tile remainders, odd row counts and segments.
        #[test]
        fn panels_match_the_f32_row_kernel(
            chunks32 in 1usize..40,
            rows in 1usize..9,
            m in 1usize..14,
            seed in any::<u64>(),
        ) {
            // Nothing to compare without it (rejecting every case would fail the test).
            if !Isa::Avx2.is_available() {
                return Ok(());
            }
            let k = 32 * chunks32;
            let mut state = seed | 1;
            let mut unit = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            };
            let panel: Vec<f32> = (0..rows * k).map(|_| unit()).collect();
            let x: Vec<f32> = (0..m * k).map(|_| unit()).collect();
            let bytes: Vec<u8> = panel.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut want = vec![vec![0f32; rows]; m];
            let mut outs: Vec<&mut [f32]> = want.iter_mut().map(|o| o.as_mut_slice()).collect();
            // SAFETY: AVX2, FMA and F16C were detected above.
            unsafe { crate::float::rows_avx2(QType::F32, &bytes, k, &x, &mut outs) };
            let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|f| f.to_bits()).collect::<Vec<_>>();
            let narrow = run(&mut Panel::new(None), &panel, k, &x, m);
            prop_assert_eq!(bits(&narrow), bits(&want));
            if wide_available() {
                // SAFETY: AVX-512F and VL were detected.
                let paired = unsafe { Paired::new(&x, m, k) };
                let wide = run(&mut Panel::new(Some(&paired)), &panel, k, &x, m);
                prop_assert_eq!(bits(&wide), bits(&want));
            }
        }
    }
}
