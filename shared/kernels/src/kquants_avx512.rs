//! AVX-512 VNNI kernel for Q4_K, Q5_K and Q6_K weights against two or more
//! Q8_K activation rows, bit-identical to [`crate::kquants_avx2`].
//!
//! A 512-bit register holds one 32-element chunk of two activation rows
//! (row `r` in the low half, `r + 1` in the high half; interleaved once per
//! call) and the weight chunk and its group scales are broadcast to both
//! halves (unpacked from broadcast loads), so one `maddubs` and one `dpwssd`
//! form the exact `i32` sums of two (activation row, weight row) pairs, the
//! same lane sums as the 256-bit kernel. The per-super-block f32 steps act
//! lane by lane with the same products (`d·dx`, `−(dmin·dx)`), each pair on
//! accumulator lanes of its own. An odd last row of a group runs the 256-bit
//! arithmetic itself. Q8_K weights (signed codes) stay on the 256-bit kernel.

use std::arch::x86_64::*;

use crate::kquants_avx2::{qtype_of, scale_shuffle, unpack, Q4_K, Q5_K, Q6_K};
use crate::q8_avx512::split_splat;
use crate::qtype::{QType, QK_K};
use crate::quantize::Q8KActs;
use crate::simd::{hsum, load_i16x16, load_i8x32, load_u8x32, prefetch, PREFETCH_AHEAD};
use crate::tile::{dispatch_group, groups, MAX_GROUP};

/// Chunks of 32 codes per super-block.
const CHUNKS: usize = QK_K / 32;

/// Whether [`rows`] handles `qtype` on this CPU (besides AVX2, FMA, F16C,
/// AVX-VNNI).
pub(crate) fn handles(qtype: QType) -> bool {
    matches!(qtype, QType::Q4_K | QType::Q5_K | QType::Q6_K) && crate::q8_avx512::available()
}

/// One group of activation rows, its pairs prepared for the kernel.
struct Group {
    r0: usize,
    len: usize,
    /// Chunk `c` of super-block `b` of pair `p`: `x[(b * pairs + p) * CHUNKS + c]`.
    x: Vec<__m512i>,
    /// Activation scales of pair `p` in super-block `b`, split: `dx[b * pairs + p]`.
    dx: Vec<__m512>,
}

impl Group {
    /// Rows `r0..r0 + len` of `acts` (`blocks` super-blocks each), their
    /// pairs' chunks interleaved and scales split (an odd last row is read
    /// from `acts` directly).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    fn new(acts: &Q8KActs, blocks: usize, r0: usize, len: usize) -> Self {
        let pairs = len / 2;
        let mut x = Vec::with_capacity(blocks * pairs * CHUNKS);
        let mut dx = Vec::with_capacity(blocks * pairs);
        for b in 0..blocks {
            let codes = acts.codes(b, r0, len);
            let scales = acts.scales(b, r0);
            for p in 0..pairs {
                let (low, high) = (&codes[2 * p * QK_K..], &codes[(2 * p + 1) * QK_K..]);
                for c in 0..CHUNKS {
                    let l = _mm512_castsi256_si512(load_i8x32(&low[32 * c..]));
                    x.push(_mm512_inserti64x4::<1>(l, load_i8x32(&high[32 * c..])));
                }
                dx.push(split_splat(&scales[2 * p..]));
            }
        }
        Group { r0, len, x, dx }
    }
}

/// The codes of one super-block of type `T` as eight chunks of 32 bytes
/// in element order, each in both halves of a register: the unpacking of
/// [`crate::kquants_avx2::unpack_codes`] on 256-bit broadcast loads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn codes<const T: u8>(blk: &[u8]) -> [__m512i; CHUNKS] {
    let load = |at: usize| _mm512_broadcast_i64x4(load_u8x32(&blk[at..]));
    let nib = _mm512_set1_epi8(0x0F);
    let mut q = [_mm512_setzero_si512(); CHUNKS];
    if T == Q6_K {
        let top = _mm512_set1_epi8(0x30);
        let h = |v: __m512i| _mm512_and_si512(v, top);
        for half in 0..2 {
            let (ql0, ql1, qh) = (load(64 * half), load(64 * half + 32), load(128 + 32 * half));
            let lo = |v: __m512i| _mm512_and_si512(v, nib);
            let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            q[4 * half] = _mm512_or_si512(lo(ql0), h(_mm512_slli_epi16::<4>(qh)));
            q[4 * half + 1] = _mm512_or_si512(lo(ql1), h(_mm512_slli_epi16::<2>(qh)));
            q[4 * half + 2] = _mm512_or_si512(hi(ql0), h(qh));
            q[4 * half + 3] = _mm512_or_si512(hi(ql1), h(_mm512_srli_epi16::<2>(qh)));
        }
        return q;
    }
    let (qs, mut hb) = match T {
        Q5_K => (48, load(16)),
        _ => (16, _mm512_setzero_si512()),
    };
    for j in 0..4 {
        let bits = load(qs + 32 * j);
        let mut lo = _mm512_and_si512(bits, nib);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), nib);
        if T == Q5_K {
            let h0 = _mm512_slli_epi16::<4>(_mm512_and_si512(hb, _mm512_set1_epi8(1)));
            let h1 = _mm512_slli_epi16::<3>(_mm512_and_si512(hb, _mm512_set1_epi8(2)));
            lo = _mm512_or_si512(lo, h0);
            hi = _mm512_or_si512(hi, h1);
            hb = _mm512_srli_epi16::<2>(hb);
        }
        q[2 * j] = lo;
        q[2 * j + 1] = hi;
    }
    q
}

/// `outs[r][j - j0]` for every activation row `r` (at least two) and weight
/// row `j` of `w` (whole rows of `qtype` super-blocks over `k` inputs).
///
/// # Safety
/// [`handles`]`(qtype)` and AVX2, FMA, F16C must hold.
#[target_feature(enable = "avx2,fma,f16c,avxvnni,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn rows(qtype: QType, w: &[u8], k: usize, acts: &Q8KActs, outs: &mut [&mut [f32]]) {
    match qtype {
        QType::Q4_K => rows_of::<Q4_K>(w, k, acts, outs),
        QType::Q5_K => rows_of::<Q5_K>(w, k, acts, outs),
        _ => rows_of::<Q6_K>(w, k, acts, outs),
    }
}

/// [`rows`] for type `T`: activation rows in groups of up to [`MAX_GROUP`],
/// each group visiting a weight row before the next.
#[target_feature(enable = "avx2,fma,f16c,avxvnni,avx512f,avx512bw,avx512vl,avx512vnni")]
fn rows_of<const T: u8>(w: &[u8], k: usize, acts: &Q8KActs, outs: &mut [&mut [f32]]) {
    assert!(
        outs.len() >= 2,
        "the pair kernel needs two or more activation rows"
    );
    let blocks = k / QK_K;
    let rb = blocks * qtype_of::<T>().block_bytes();
    let row_groups: Vec<_> = groups(outs.len(), MAX_GROUP)
        .map(|(r0, len)| Group::new(acts, blocks, r0, len))
        .collect();
    for j in 0..w.len() / rb {
        prefetch(w, j * rb + PREFETCH_AHEAD, rb);
        let wrow = &w[j * rb..(j + 1) * rb];
        for g in &row_groups {
            dispatch_group!(
                g.len,
                R => group::<T, { R / 2 }, { R % 2 }>(wrow, acts, g, j, outs),
                [2, 3, 4, 5, 6, 7, 8, 9]
            );
        }
    }
}

/// Weight row `j` against the rows of `g`: `P` pairs in 512-bit registers,
/// then `S` (0 or 1) single row in a 256-bit one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const T: u8, const P: usize, const S: usize>(
    wrow: &[u8],
    acts: &Q8KActs,
    g: &Group,
    j: usize,
    outs: &mut [&mut [f32]],
) {
    let bb = qtype_of::<T>().block_bytes();
    let r_last = g.r0 + 2 * P;
    let mut acc = [_mm512_setzero_ps(); P];
    let mut last = [_mm256_setzero_ps(); S];
    for s in 0..wrow.len() / bb {
        let u = unpack::<T>(&wrow[s * bb..(s + 1) * bb]);
        let halves = [
            _mm256_permute2x128_si256::<0x00>(u.scales, u.scales),
            _mm256_permute2x128_si256::<0x11>(u.scales, u.scales),
        ];
        let xs = &g.x[s * P * CHUNKS..(s + 1) * P * CHUNKS];
        let xl = acts.codes(s, r_last, S);
        let mut sumi = [_mm512_setzero_si512(); P];
        let mut sumi_last = [_mm256_setzero_si256(); S];
        let halves_z = halves.map(|h| _mm512_broadcast_i64x4(h));
        for (c, &wz) in codes::<T>(&wrow[s * bb..(s + 1) * bb]).iter().enumerate() {
            let svz = _mm512_shuffle_epi8(
                halves_z[c / 4],
                _mm512_broadcast_i64x4(scale_shuffle(c % 4)),
            );
            let (wq, sv) = (_mm512_castsi512_si256(wz), _mm512_castsi512_si256(svz));
            for (p, sumi) in sumi.iter_mut().enumerate() {
                let pairs = _mm512_maddubs_epi16(wz, xs[p * CHUNKS + c]);
                *sumi = _mm512_dpwssd_epi32(*sumi, pairs, svz);
            }
            for sumi in sumi_last.iter_mut() {
                let pairs = _mm256_maddubs_epi16(wq, load_i8x32(&xl[32 * c..]));
                *sumi = _mm256_dpwssd_avx_epi32(*sumi, pairs, sv);
            }
        }
        let sums = acts.bsums(s, g.r0, 2 * P + S);
        let dx = &g.dx[s * P..(s + 1) * P];
        let (d, dmin) = (_mm512_set1_ps(u.d), _mm512_set1_ps(u.dmin));
        let neg = _mm512_set1_epi32(i32::MIN);
        let mins = _mm512_broadcast_i64x4(u.mins);
        for p in 0..P {
            let main = _mm512_mul_ps(d, dx[p]);
            // SAFETY: `sums` holds 16 `i16` per row of the group, so the 32
            // of rows `2p` and `2p + 1` are in bounds; `loadu` has no
            // alignment requirement.
            let bsums = unsafe { _mm512_loadu_si512(sums[32 * p..][..32].as_ptr().cast()) };
            let summ = _mm512_madd_epi16(mins, bsums);
            if T == Q6_K {
                let total = _mm512_sub_epi32(sumi[p], summ);
                acc[p] = _mm512_fmadd_ps(main, _mm512_cvtepi32_ps(total), acc[p]);
            } else {
                acc[p] = _mm512_fmadd_ps(main, _mm512_cvtepi32_ps(sumi[p]), acc[p]);
                let min = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(_mm512_mul_ps(dmin, dx[p])),
                    neg,
                ));
                acc[p] = _mm512_fmadd_ps(min, _mm512_cvtepi32_ps(summ), acc[p]);
            }
        }
        for (last, &sumi) in last.iter_mut().zip(&sumi_last) {
            let dx = acts.scales(s, r_last)[0];
            let main = _mm256_set1_ps(u.d * dx);
            let summ = _mm256_madd_epi16(u.mins, load_i16x16(&sums[32 * P..]));
            if T == Q6_K {
                let total = _mm256_sub_epi32(sumi, summ);
                *last = _mm256_fmadd_ps(main, _mm256_cvtepi32_ps(total), *last);
            } else {
                *last = _mm256_fmadd_ps(main, _mm256_cvtepi32_ps(sumi), *last);
                let min = _mm256_set1_ps(-(u.dmin * dx));
                *last = _mm256_fmadd_ps(min, _mm256_cvtepi32_ps(summ), *last);
            }
        }
    }
    for (p, a) in acc.iter().enumerate() {
        outs[g.r0 + 2 * p][j] = hsum(_mm512_castps512_ps256(*a));
        let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a));
        outs[g.r0 + 2 * p + 1][j] = hsum(_mm256_castpd_ps(high));
    }
    for l in last {
        outs[r_last][j] = hsum(l);
    }
}
