//! The wide panel kernel ([`crate::panel_avx2::Panel::Wide`]): AVX-512F
//! registers holding two activation rows each.
//!
//! The activation rows are interleaved once per matmul, in pairs: for rows
//! `2p` and `2p + 1`, chunk `c` becomes 16 consecutive floats, the row
//! `2p` chunk in lanes 0..8 and the row `2p + 1` chunk in lanes 8..16 (zeros
//! when `m` is odd). A weight chunk is broadcast to both halves, so one
//! 512-bit FMA performs the 8-lane FMA of two (activation row, weight row)
//! pairs, lane for lane what an 8-lane FMA computes: the per-pair
//! arithmetic stays that of `panel_avx2`, at twice the FMA width on CPUs
//! whose 512-bit units keep their rate.

use std::arch::x86_64::*;

use crate::panel_avx2::{segments, Ahead};
use crate::simd::{hsum, load_f32x8};
use crate::tile::{dispatch_group, groups};

/// Weight rows per tile.
pub(crate) const J: usize = 4;
/// Most row pairs per tile (4 × 5 accumulators, 4 weights and one
/// activation register of the 32).
const P: usize = 5;

/// One matmul's activation rows, interleaved in pairs for this kernel
/// (built once per call, shared by the threads).
pub(crate) struct Paired {
    /// One register per chunk (64-byte aligned, so that no load splits a
    /// cache line): pair `p` is `xi[p * k / 8..(p + 1) * k / 8]`.
    xi: Vec<__m512>,
    /// Activation rows.
    m: usize,
    /// Row length.
    k: usize,
}

impl Paired {
    /// The pairing of `x` (`m` rows of `k`) when `matmul_exact` on `isa`
    /// will run the wide panel kernel for `qtype`: a quantized type, AVX-512F
    /// and VL present, and a staged plan.
    pub(crate) fn for_exact(
        isa: crate::Isa,
        qtype: crate::QType,
        x: &[f32],
        m: usize,
        k: usize,
    ) -> Option<Self> {
        use crate::exact_avx2::Plan;
        let wide = isa != crate::Isa::Scalar
            && !matches!(qtype, crate::QType::F32 | crate::QType::F16)
            && wide_available()
            && Plan::choose(m, k, true) == Plan::Staged;
        // SAFETY: AVX-512F and AVX-512VL were detected (`wide_available`).
        wide.then(|| unsafe { Paired::new(x, m, k) })
    }

    /// Interleaves the `m` activation rows of `x` (`k` each, a multiple of
    /// 8) in pairs.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(crate) fn new(x: &[f32], m: usize, k: usize) -> Self {
        let chunks = k / 8;
        let zero = _mm256_setzero_ps();
        let mut xi = Vec::with_capacity(m.div_ceil(2) * chunks);
        for pair in x[..m * k].chunks(2 * k) {
            let (low, high) = pair.split_at(k);
            for c in 0..chunks {
                let l = load_f32x8(&low[8 * c..]);
                let h = if high.is_empty() {
                    zero
                } else {
                    load_f32x8(&high[8 * c..])
                };
                let both = _mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(l)),
                    _mm256_castps_pd(h),
                );
                xi.push(_mm512_castpd_ps(both));
            }
        }
        Paired { xi, m, k }
    }
}

/// Whether this CPU has AVX-512F and AVX-512VL.
pub(crate) fn wide_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// The wide kernel for one thread's share of a matmul, with its scratch.
pub(crate) struct Wide<'a> {
    paired: &'a Paired,
    /// Accumulators of the tiles between segments.
    state: Vec<[__m512; 4]>,
}

impl<'a> Wide<'a> {
    /// The kernel over the activations `paired`.
    pub(crate) fn new(paired: &'a Paired) -> Self {
        Wide {
            paired,
            state: Vec::new(),
        }
    }

    /// [`crate::panel_avx2::Panel::run`]: pair groups outside, then
    /// segments, then tiles of up to `J` weight rows × `P` pairs.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(crate) fn sweep(
        &mut self,
        panel: &[f32],
        k: usize,
        j0: usize,
        outs: &mut [&mut [f32]],
        ahead: &[u8],
    ) {
        let (paired, m) = (self.paired, self.paired.m);
        assert!(k == paired.k && outs.len() == m && panel.len().is_multiple_of(k));
        let rows = panel.len() / k;
        let pairs = m.div_ceil(2);
        let segs = segments(k);
        let mut ahead = Ahead::new(ahead, pairs.div_ceil(P) * rows.div_ceil(J) * segs.len());
        for (p0, len) in groups(pairs, P) {
            let xs = &paired.xi[p0 * k / 8..(p0 + len) * k / 8];
            let state = &mut self.state;
            state.clear();
            state.resize(rows * len, [_mm512_setzero_ps(); 4]);
            for chunks in segs.clone() {
                for i in (0..rows).step_by(J) {
                    let jn = (rows - i).min(J);
                    let w = &panel[i * k..(i + jn) * k];
                    let st = &mut state[i * len..(i + jn) * len];
                    ahead.next();
                    dispatch_group!(jn, JN => {
                        dispatch_group!(
                            len,
                            PN => tile::<JN, PN>(w, xs, k, chunks.clone(), st),
                            [1, 2, 3, 4, 5]
                        )
                    }, [1, 2, 3, 4]);
                }
            }
            for (i, st) in state.chunks_exact(len).enumerate() {
                for (p, &[a0, a1, a2, a3]) in st.iter().enumerate() {
                    let sum = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
                    let r = 2 * (p0 + p);
                    outs[r][j0 + i] = hsum(_mm512_castps512_ps256(sum));
                    if r + 1 < m {
                        let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sum));
                        outs[r + 1][j0 + i] = hsum(_mm256_castpd_ps(high));
                    }
                }
            }
        }
    }
}

/// Chunks `chunks` (eight elements each, starting at a multiple of four)
/// of weight rows `w` (`JN` rows of `k`) against the pairs `x` (`PN` pairs
/// of `k / 8` registers), continuing the accumulators
/// `state[jj * PN + p]`.
#[inline]
#[allow(
    clippy::needless_range_loop,
    reason = "tiles index accumulators by (row, pair)"
)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
fn tile<const JN: usize, const PN: usize>(
    w: &[f32],
    x: &[__m512],
    k: usize,
    chunks: std::ops::Range<usize>,
    state: &mut [[__m512; 4]],
) {
    assert!(w.len() == JN * k && x.len() == PN * k / 8 && state.len() == JN * PN);
    assert!(chunks.start.is_multiple_of(4) && chunks.end <= k / 8);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    for i in 0..4 {
        let mut acc: [[__m512; PN]; JN] =
            std::array::from_fn(|jj| std::array::from_fn(|p| state[jj * PN + p][i]));
        for c in (chunks.start + i..chunks.end).step_by(4) {
            // SAFETY: `c < k / 8`, so elements `8c..8c + 8` of every weight
            // row lie inside `w` (JN rows of k) and register `c` of every
            // pair inside `x` (PN pairs of k / 8), as asserted.
            unsafe {
                let mut wv = [_mm512_setzero_ps(); JN];
                for (jj, wv) in wv.iter_mut().enumerate() {
                    let chunk = _mm256_loadu_pd(wp.add(jj * k + 8 * c).cast());
                    *wv = _mm512_castpd_ps(_mm512_broadcast_f64x4(chunk));
                }
                for p in 0..PN {
                    let xv = *xp.add(p * k / 8 + c);
                    for jj in 0..JN {
                        acc[jj][p] = _mm512_fmadd_ps(wv[jj], xv, acc[jj][p]);
                    }
                }
            }
        }
        for jj in 0..JN {
            for p in 0..PN {
                state[jj * PN + p][i] = acc[jj][p];
            }
        }
    }
}
