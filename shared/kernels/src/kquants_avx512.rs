//! AVX-512 VNNI kernel for Q4_K, Q5_K and Q6_K weights against two or more
//! Q8_K activation rows, bit-identical to [`crate::kquants_avx2`].
//!
//! A 512-bit register holds one 32-element chunk of two activation rows
//! (row `r` in the low half, `r + 1` in the high half, or zeros after an
//! odd last row; interleaved once per call) and the weight chunk and its
//! group scales are broadcast to both halves (unpacked from broadcast
//! loads). Per pair of chunks, two `dpbusd` form the exact four-product
//! `i32` lane sums of each chunk, and one `dpwssd` scales and adds both
//! (see [`group`]): the integer lane sums of the 256-bit kernel's
//! `maddubs` and `madd`, with three multiplying instructions instead of
//! four. The per-super-block f32 steps act lane by lane with the same
//! products (`d·dx`, `−(dmin·dx)`), each pair on accumulator lanes of its
//! own. Q8_K weights (signed codes) stay on the 256-bit kernel.

use std::arch::x86_64::*;

use crate::kquants_avx2::{qtype_of, unpack, Q4_K, Q5_K, Q6_K};
use crate::q8_avx512::split_splat;
use crate::qtype::{QType, QK_K};
use crate::quantize::Q8KActs;
use crate::simd::{hsum, load_i16x16, load_i8x32, load_u8x32, prefetch, PREFETCH_AHEAD};
use crate::tile::{dispatch_group, groups, MAX_GROUP};

/// Chunks of 32 codes per super-block.
const CHUNKS: usize = QK_K / 32;

/// Whether [`rows`] handles `qtype` on this CPU (besides AVX2, FMA, F16C).
pub(crate) fn handles(qtype: QType) -> bool {
    matches!(qtype, QType::Q4_K | QType::Q5_K | QType::Q6_K) && crate::q8_avx512::available()
}

/// Q8_K activation rows prepared for [`rows`]: split into groups of up to
/// [`MAX_GROUP`] rows, each group's pairs interleaved. Built once per
/// product, on the calling thread, and read by every thread's range of
/// weight rows (it was built again for each range: eight times per product
/// with two threads).
pub(crate) struct Pairs {
    acts: Q8KActs,
    groups: Vec<Group>,
}

impl Pairs {
    /// Interleaves `acts` (`m` rows of `k` values, `m` at least two).
    ///
    /// # Safety
    /// [`handles`] must hold for some type (AVX-512 F, BW, VL, VNNI) and
    /// AVX2, FMA, F16C.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(crate) fn new(acts: Q8KActs, m: usize, k: usize) -> Self {
        let groups = groups(m, MAX_GROUP)
            .map(|(r0, len)| Group::new(&acts, k / QK_K, r0, len))
            .collect();
        Pairs { acts, groups }
    }

    /// The activations as quantized.
    pub(crate) fn acts(&self) -> &Q8KActs {
        &self.acts
    }
}

/// One group of activation rows, its pairs prepared for the kernel (an odd
/// last row is paired with a row of zeros whose results are dropped).
struct Group {
    r0: usize,
    len: usize,
    /// Chunk `c` of super-block `b` of pair `p`: `x[(b * pairs + p) * CHUNKS + c]`.
    x: Vec<__m512i>,
    /// Activation scales of pair `p` in super-block `b`, split: `dx[b * pairs + p]`.
    dx: Vec<__m512>,
    /// Group-of-16 code sums of pair `p` in super-block `b`, the low row's
    /// 16 then the high row's: `sums[b * pairs + p]`.
    sums: Vec<__m512i>,
}

impl Group {
    /// Rows `r0..r0 + len` of `acts` (`blocks` super-blocks each), their
    /// pairs' chunks interleaved and their scales and sums split.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    fn new(acts: &Q8KActs, blocks: usize, r0: usize, len: usize) -> Self {
        let pairs = len.div_ceil(2);
        let mut x = Vec::with_capacity(blocks * pairs * CHUNKS);
        let mut dx = Vec::with_capacity(blocks * pairs);
        let mut sums = Vec::with_capacity(blocks * pairs);
        for b in 0..blocks {
            let (codes, bsums) = (acts.codes(b, r0, len), acts.bsums(b, r0, len));
            let scales = &acts.scales(b, r0)[..len];
            for p in 0..pairs {
                let odd = 2 * p + 1 == len;
                let low = &codes[2 * p * QK_K..];
                for c in 0..CHUNKS {
                    let l = _mm512_castsi256_si512(load_i8x32(&low[32 * c..]));
                    let h = match odd {
                        true => _mm256_setzero_si256(),
                        false => load_i8x32(&codes[(2 * p + 1) * QK_K + 32 * c..]),
                    };
                    x.push(_mm512_inserti64x4::<1>(l, h));
                }
                let high_scale = if odd { 0.0 } else { scales[2 * p + 1] };
                dx.push(split_splat(&[scales[2 * p], high_scale]));
                let l = _mm512_castsi256_si512(load_i16x16(&bsums[32 * p..]));
                let h = match odd {
                    true => _mm256_setzero_si256(),
                    false => load_i16x16(&bsums[32 * p + 16..]),
                };
                sums.push(_mm512_inserti64x4::<1>(l, h));
            }
        }
        Group {
            r0,
            len,
            x,
            dx,
            sums,
        }
    }
}

/// `dpwssd` scale pairs for the chunk pair `(c, c + 1)` (`c` even) of a
/// half of the scales: in each `i32` lane the scale of chunk `c` in the
/// low `i16` and that of chunk `c + 1` in the high one, groups `2c` and
/// `2c + 2` in the low 128 bits (elements 0..16 of the chunks) and
/// `2c + 1` and `2c + 3` in the high 128 (elements 16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_shuffle(c: usize) -> __m256i {
    let pick = |g: usize| {
        let at = 2 * g as u8;
        i32::from_le_bytes([at, at + 1, at + 4, at + 5])
    };
    _mm256_set_m128i(_mm_set1_epi32(pick(2 * c + 1)), _mm_set1_epi32(pick(2 * c)))
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

/// `outs[r][j - j0]` for every activation row `r` of `pairs` and weight
/// row `j` of `w` (whole rows of `qtype` super-blocks over `k` inputs).
///
/// # Safety
/// [`handles`]`(qtype)` and AVX2, FMA, F16C must hold.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn rows(qtype: QType, w: &[u8], k: usize, pairs: &Pairs, outs: &mut [&mut [f32]]) {
    match qtype {
        QType::Q4_K => rows_of::<Q4_K>(w, k, pairs, outs),
        QType::Q5_K => rows_of::<Q5_K>(w, k, pairs, outs),
        _ => rows_of::<Q6_K>(w, k, pairs, outs),
    }
}

/// [`rows`] for type `T`: each group of activation rows visits a weight
/// row before the next.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn rows_of<const T: u8>(w: &[u8], k: usize, pairs: &Pairs, outs: &mut [&mut [f32]]) {
    let rows: usize = pairs.groups.iter().map(|g| g.len).sum();
    assert_eq!(outs.len(), rows, "one output row per activation row");
    let rb = k / QK_K * qtype_of::<T>().block_bytes();
    for j in 0..w.len() / rb {
        prefetch(w, j * rb + PREFETCH_AHEAD, rb);
        let wrow = &w[j * rb..(j + 1) * rb];
        for g in &pairs.groups {
            dispatch_group!(
                g.len.div_ceil(2),
                P => group::<T, P>(wrow, g, j, outs),
                [1, 2, 3, 4, 5]
            );
        }
    }
}

/// Weight row `j` against the `P` row pairs of `g`. Per pair of chunks
/// `(c, c + 1)`, `dpbusd` forms the exact `i32` lane sums `t` of each
/// chunk: four products of a code below 64 and an activation in
/// `-128..=127`, so `|t| <= 32256` fits an `i16`. A blend puts `t_c` in the
/// low `i16` of every lane and `t_{c+1}` in the high one, and one `dpwssd`
/// against the scale pairs (see [`pair_shuffle`]) adds
/// `s_c·t_c + s_{c+1}·t_{c+1}`: the lane sums of the 256-bit kernel.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const T: u8, const P: usize>(wrow: &[u8], g: &Group, j: usize, outs: &mut [&mut [f32]]) {
    let bb = qtype_of::<T>().block_bytes();
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); P];
    for s in 0..wrow.len() / bb {
        let blk = &wrow[s * bb..(s + 1) * bb];
        let u = unpack::<T>(blk);
        let halves = [
            _mm512_broadcast_i64x4(_mm256_permute2x128_si256::<0x00>(u.scales, u.scales)),
            _mm512_broadcast_i64x4(_mm256_permute2x128_si256::<0x11>(u.scales, u.scales)),
        ];
        let xs = &g.x[s * P * CHUNKS..(s + 1) * P * CHUNKS];
        let q = codes::<T>(blk);
        let mut sumi = [_mm512_setzero_si512(); P];
        for c in (0..CHUNKS).step_by(2) {
            let sv =
                _mm512_shuffle_epi8(halves[c / 4], _mm512_broadcast_i64x4(pair_shuffle(c % 4)));
            for (p, sumi) in sumi.iter_mut().enumerate() {
                let next = _mm512_dpbusd_epi32(zero, q[c + 1], xs[p * CHUNKS + c + 1]);
                let this = _mm512_dpbusd_epi32(zero, q[c], xs[p * CHUNKS + c]);
                let t = _mm512_mask_blend_epi16(0xAAAA_AAAA, this, _mm512_slli_epi32::<16>(next));
                *sumi = _mm512_dpwssd_epi32(*sumi, t, sv);
            }
        }
        let (dx, sums) = (&g.dx[s * P..(s + 1) * P], &g.sums[s * P..(s + 1) * P]);
        let (d, dmin) = (_mm512_set1_ps(u.d), _mm512_set1_ps(u.dmin));
        let neg = _mm512_set1_epi32(i32::MIN);
        let mins = _mm512_broadcast_i64x4(u.mins);
        for p in 0..P {
            let main = _mm512_mul_ps(d, dx[p]);
            let summ = _mm512_madd_epi16(mins, sums[p]);
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
    }
    for (p, a) in acc.iter().enumerate() {
        let r = g.r0 + 2 * p;
        outs[r][j] = hsum(_mm512_castps512_ps256(*a));
        if r + 1 < g.r0 + g.len {
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a));
            outs[r + 1][j] = hsum(_mm256_castpd_ps(high));
        }
    }
}
