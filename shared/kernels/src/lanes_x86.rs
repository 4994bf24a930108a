//! AVX-512 and AVX2 tiles of [`LaneMatrix`] products.
//!
//! One generic tile computes `R` activation rows against `NG` groups of
//! sixteen output rows: per element of `k` it converts each group's sixteen
//! codes to f32 weights (`fma(code, scale, offset)`), broadcasts each row's
//! activation and FMAs it into that row's accumulators — the per-lane
//! arithmetic of the portable loop, so both instruction sets give its bits.
//! [`Lanes`] abstracts sixteen f32 lanes: one 512-bit register, or two
//! 256-bit ones with AVX2 only.

use std::arch::x86_64::*;

use crate::lanes::{Codes, Format, LaneMatrix, Offsets, LANES, PREFETCH_RECORDS};
use crate::simd::prefetch_record;
use crate::Isa;

/// Activation rows per tile with AVX-512 (27 accumulators at three groups).
const ROWS_512: usize = 9;
/// Groups per AVX-512 tile.
const GROUPS_512: usize = 3;
/// Activation rows per tile with AVX2 (two registers per group).
const ROWS_256: usize = 6;
/// Groups per tile for a single activation row (decoding): more independent
/// FMA chains and weight streams in flight. Measured on the Q8_0 LM head,
/// one row, two threads: 8 groups 0.75–1.30 (median 0.92) of the time of
/// the chains of `QMatrix::matmul_exact`, 3 groups 1.17–1.20.
const GROUPS_512_ONE_ROW: usize = 8;
/// [`GROUPS_512_ONE_ROW`] with AVX2: eight accumulators (Gemma 3 270M
/// decode on a Zen 4 capped at `avx2`: 19.3 ms, against 22.1 with two).
const GROUPS_256_ONE_ROW: usize = 4;

/// Sixteen f32 lanes and the operations a tile needs. Every method requires
/// the target features of its type.
trait Lanes: Copy {
    /// Whether a tile of one activation row prefetches its records as the
    /// tiles of several rows do ([`PREFETCH_RECORDS`] ahead). Measured on
    /// the Q8_0 LM head, one row, two threads, Zen 5: with the 256-bit
    /// tiles (capped at `avx2`) 7.2–8.2 ms without, 5.5–7.2 with; the
    /// 512-bit tile, reading eight groups side by side, gained nothing
    /// clear (5.0–7.7 ms without, 5.3–6.2 with).
    const ONE_ROW_PREFETCH: bool;
    unsafe fn zero() -> Self;
    /// Sixteen f32 at `p`.
    unsafe fn load(p: *const u8) -> Self;
    /// Sixteen f16 at `p`, as f32.
    unsafe fn load_half(p: *const u8) -> Self;
    /// `*p` in every lane.
    unsafe fn splat(p: *const f32) -> Self;
    /// `a · b`.
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// `a · b + c`, rounded once.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// Sixteen signed bytes at `p`, as f32.
    unsafe fn bytes(p: *const u8) -> Self;
    /// The low (`HIGH` false) or high nibbles of the sixteen bytes at `p`,
    /// with bit 4 set in the lanes of the 16-bit mask at `mask` when
    /// `FIFTH`, minus `BIAS`, as f32.
    unsafe fn nibbles<const HIGH: bool, const FIFTH: bool, const BIAS: i32>(
        p: *const u8,
        mask: *const u8,
    ) -> Self;
    unsafe fn store(self, out: &mut [f32; LANES]);
}

/// One 512-bit register.
#[derive(Clone, Copy)]
struct Z(__m512);

impl Lanes for Z {
    const ONE_ROW_PREFETCH: bool = false;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY (all methods): the caller runs with AVX-512 F and BW.
        unsafe { Z(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Z(_mm512_loadu_ps(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_half(p: *const u8) -> Self {
        unsafe { Z(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        unsafe { Z(_mm512_set1_ps(*p)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { Z(_mm512_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        unsafe { Z(_mm512_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> Self {
        unsafe {
            Z(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.cast(),
            ))))
        }
    }
    #[inline(always)]
    unsafe fn nibbles<const HIGH: bool, const FIFTH: bool, const BIAS: i32>(
        p: *const u8,
        mask: *const u8,
    ) -> Self {
        unsafe {
            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
            let mut c = if HIGH {
                _mm512_srli_epi32::<4>(v)
            } else {
                _mm512_and_si512(v, _mm512_set1_epi32(0x0F))
            };
            if FIFTH && BIAS == 16 {
                // `(c | bit << 4) − 16` is `c` where the bit is set, `c − 16` where not.
                let clear = !mask.cast::<u16>().read_unaligned();
                c = _mm512_mask_sub_epi32(c, clear, c, _mm512_set1_epi32(16));
                return Z(_mm512_cvtepi32_ps(c));
            }
            if FIFTH {
                let m = mask.cast::<u16>().read_unaligned();
                c = _mm512_mask_or_epi32(c, m, c, _mm512_set1_epi32(16));
            }
            if BIAS != 0 {
                c = _mm512_sub_epi32(c, _mm512_set1_epi32(BIAS));
            }
            Z(_mm512_cvtepi32_ps(c))
        }
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; LANES]) {
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), self.0) }
    }
}

/// Two 256-bit registers: lanes 0–7 and 8–15.
#[derive(Clone, Copy)]
struct Y(__m256, __m256);

impl Y {
    /// Eight codes of one half (see [`Lanes::nibbles`]).
    #[inline(always)]
    unsafe fn half<const HIGH: bool, const FIFTH: bool, const BIAS: i32>(
        p: *const u8,
        mask: *const u8,
        half: i32,
    ) -> __m256 {
        // SAFETY: the caller runs with AVX2.
        unsafe {
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8 * half as usize).cast()));
            let mut c = if HIGH {
                _mm256_srli_epi32::<4>(v)
            } else {
                _mm256_and_si256(v, _mm256_set1_epi32(0x0F))
            };
            let shift = 8 * half;
            let bits = _mm256_setr_epi32(
                1 << shift,
                2 << shift,
                4 << shift,
                8 << shift,
                16 << shift,
                32 << shift,
                64 << shift,
                128 << shift,
            );
            if FIFTH {
                let m = i32::from(mask.cast::<u16>().read_unaligned());
                let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), bits), bits);
                c = _mm256_or_si256(c, _mm256_and_si256(set, _mm256_set1_epi32(16)));
            }
            if BIAS != 0 {
                c = _mm256_sub_epi32(c, _mm256_set1_epi32(BIAS));
            }
            _mm256_cvtepi32_ps(c)
        }
    }
}

impl Lanes for Y {
    const ONE_ROW_PREFETCH: bool = true;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY (all methods): the caller runs with AVX2, FMA and F16C.
        unsafe { Y(_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Y(_mm256_loadu_ps(p.cast()), _mm256_loadu_ps(p.add(32).cast())) }
    }
    #[inline(always)]
    unsafe fn load_half(p: *const u8) -> Self {
        unsafe {
            let lo = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
            Y(lo, _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())))
        }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        unsafe {
            let a = _mm256_broadcast_ss(&*p);
            Y(a, a)
        }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { Y(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        unsafe {
            Y(
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> Self {
        unsafe {
            let lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
            let hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast()));
            Y(_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi))
        }
    }
    #[inline(always)]
    unsafe fn nibbles<const HIGH: bool, const FIFTH: bool, const BIAS: i32>(
        p: *const u8,
        mask: *const u8,
    ) -> Self {
        unsafe {
            Y(
                Y::half::<HIGH, FIFTH, BIAS>(p, mask, 0),
                Y::half::<HIGH, FIFTH, BIAS>(p, mask, 1),
            )
        }
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; LANES]) {
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), self.0);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), self.1);
        }
    }
}

/// What a tile reads: the packed groups from its first one, the activation
/// rows from its first one.
#[derive(Clone, Copy)]
struct Job {
    groups: *const u8,
    group_bytes: usize,
    format: Format,
    x: *const f32,
    k: usize,
}

/// `acc[r][j] += w[j] · x[r·k]` for each row `r` (one FMA per lane).
///
/// # Safety
/// `V`'s target features; `x` points at `R` rows of stride `k`.
#[inline(always)]
unsafe fn accumulate<V: Lanes, const R: usize, const NG: usize>(
    acc: &mut [[V; NG]; R],
    w: &[V; NG],
    x: *const f32,
    k: usize,
) {
    // SAFETY: forwarded contract.
    unsafe {
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = V::splat(x.add(r * k));
            for j in 0..NG {
                acc[j] = V::fma(w[j], a, acc[j]);
            }
        }
    }
}

/// `out[r * NG + j]` = activation row `r` against the sixteen output rows of
/// group `j`. `BYTES`: signed byte codes, else nibbles with a fifth bit when
/// `FIFTH`; `STORED`: `w = fma(c, scale, offset)`, else
/// `w = (c − BIAS) · scale` (the code decoders subtract `BIAS`).
///
/// # Safety
/// `V`'s target features; `job.groups` holds `NG` groups and `job.x` `R`
/// rows of `k`; `out` has `R * NG` entries.
#[inline(always)]
unsafe fn tile<
    V: Lanes,
    const R: usize,
    const NG: usize,
    const BYTES: bool,
    const FIFTH: bool,
    const BIAS: i32,
    const STORED: bool,
    const HALF: bool,
>(
    job: Job,
    out: &mut [[f32; LANES]],
) {
    // SAFETY: per the contract every pointer below stays inside the groups
    // (`k / sub` records each) and the rows (`k` values each). No closures:
    // one would be compiled without the target features and call every
    // intrinsic out of line.
    unsafe {
        let (f, rec_bytes) = (job.format, job.format.record_bytes());
        let (codes_at, masks_at) = (f.codes_at(), f.masks_at());
        let mut acc = [[V::zero(); NG]; R];
        let mut rec = [job.groups; NG];
        let (mut scale, mut offset) = ([V::zero(); NG], [V::zero(); NG]);
        let (mut lo, mut hi) = ([V::zero(); NG], [V::zero(); NG]);
        for s in 0..job.k / f.sub {
            for j in 0..NG {
                rec[j] = job.groups.add(j * job.group_bytes + s * rec_bytes);
                scale[j] = if HALF {
                    V::load_half(rec[j])
                } else {
                    V::load(rec[j])
                };
                if STORED {
                    offset[j] = V::load(rec[j].add(64));
                }
                if R > 1 || V::ONE_ROW_PREFETCH {
                    prefetch_record(rec[j], PREFETCH_RECORDS, rec_bytes);
                }
            }
            let x = job.x.add(s * f.sub);
            if BYTES {
                for e in 0..f.sub {
                    for j in 0..NG {
                        let c = V::bytes(rec[j].add(codes_at + e * LANES));
                        lo[j] = V::mul(c, scale[j]);
                    }
                    accumulate(&mut acc, &lo, x.add(e), job.k);
                }
                continue;
            }
            for p in 0..f.sub / 2 {
                for j in 0..NG {
                    let codes = rec[j].add(codes_at + p * LANES);
                    let mask = rec[j].add(masks_at + 4 * p);
                    let c = V::nibbles::<false, FIFTH, BIAS>(codes, mask);
                    lo[j] = if STORED {
                        V::fma(c, scale[j], offset[j])
                    } else {
                        V::mul(c, scale[j])
                    };
                }
                accumulate(&mut acc, &lo, x.add(2 * p), job.k);
                for j in 0..NG {
                    let codes = rec[j].add(codes_at + p * LANES);
                    let mask = rec[j].add(masks_at + 4 * p + 2);
                    let c = V::nibbles::<true, FIFTH, BIAS>(codes, mask);
                    hi[j] = if STORED {
                        V::fma(c, scale[j], offset[j])
                    } else {
                        V::mul(c, scale[j])
                    };
                }
                accumulate(&mut acc, &hi, x.add(2 * p + 1), job.k);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for j in 0..NG {
                acc[j].store(&mut out[r * NG + j]);
            }
        }
    }
}

type TileFn = unsafe fn(Job, &mut [[f32; LANES]]);

/// Instantiates a tile entry point with the given target features.
macro_rules! entry {
    ($name:ident, $v:ty, $features:literal) => {
        /// # Safety
        /// The named features; see [`tile`].
        #[target_feature(enable = $features)]
        unsafe fn $name<
            const R: usize,
            const NG: usize,
            const BYTES: bool,
            const FIFTH: bool,
            const BIAS: i32,
            const STORED: bool,
            const HALF: bool,
        >(
            job: Job,
            out: &mut [[f32; LANES]],
        ) {
            // SAFETY: forwarded contract; the features are enabled here.
            unsafe { tile::<$v, R, NG, BYTES, FIFTH, BIAS, STORED, HALF>(job, out) }
        }
    };
}

entry!(tile512, Z, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");
entry!(tile256, Y, "avx2,fma,f16c");

/// The tile of `rows` rows and `NG` groups for a format.
macro_rules! pick {
    ($f:ident, $ng:literal, $format:expr, $rows:expr, $($r:literal)+) => {{
        use Codes::{Bytes, Nibbles};
        use Offsets::{Bias, Stored};
        match ($format.codes, $format.offsets, $format.half_scales, $rows) {
            $((Bytes, _, true, $r) => $f::<$r, $ng, true, false, 0, false, true> as TileFn,
              (Bytes, _, false, $r) => $f::<$r, $ng, true, false, 0, false, false>,
              (Nibbles { high_bit: false }, Bias(8), true, $r) => {
                  $f::<$r, $ng, false, false, 8, false, true>
              }
              (Nibbles { high_bit: true }, Bias(16), true, $r) => {
                  $f::<$r, $ng, false, true, 16, false, true>
              }
              (Nibbles { high_bit: false }, Stored, false, $r) => {
                  $f::<$r, $ng, false, false, 0, true, false>
              }
              (Nibbles { high_bit: true }, Stored, false, $r) => {
                  $f::<$r, $ng, false, true, 0, true, false>
              })+
            _ => unreachable!("a packed format and 1..=9 rows"),
        }
    }};
}

/// The tile function for `rows` rows (at most the ISA's tile height) and
/// `ng` groups: the ISA's width, 1 or (AVX-512) 2, or for one row any count
/// up to its one-row width.
fn tile_fn(wide: bool, format: Format, rows: usize, ng: usize) -> TileFn {
    match (wide, ng) {
        (true, 1) => pick!(tile512, 1, format, rows, 1 2 3 4 5 6 7 8 9),
        (true, 2) => pick!(tile512, 2, format, rows, 1 2 3 4 5 6 7 8 9),
        (true, GROUPS_512) => pick!(tile512, 3, format, rows, 1 2 3 4 5 6 7 8 9),
        (true, 4) => pick!(tile512, 4, format, rows, 1),
        (true, 5) => pick!(tile512, 5, format, rows, 1),
        (true, 6) => pick!(tile512, 6, format, rows, 1),
        (true, 7) => pick!(tile512, 7, format, rows, 1),
        (true, GROUPS_512_ONE_ROW) => pick!(tile512, 8, format, rows, 1),
        (false, 1) => pick!(tile256, 1, format, rows, 1 2 3 4 5 6),
        (false, 2) => pick!(tile256, 2, format, rows, 1),
        (false, 3) => pick!(tile256, 3, format, rows, 1),
        (false, GROUPS_256_ONE_ROW) => pick!(tile256, 4, format, rows, 1),
        _ => unreachable!("{ng} groups exceed the tile"),
    }
}

/// Whether the 512-bit tiles run: the CPU has AVX-512 F and BW, and the
/// process is not capped at [`Isa::Avx2`] or below ([`Isa::set_max`]), so
/// that a cap at `avx2` also runs these products as an AVX2-only CPU would
/// (the bits are the same either way).
pub(crate) fn wide() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && Isa::max().is_none_or(|cap| cap > Isa::Avx2)
}

/// Groups per tile for `m` activation rows with the 512-bit (`wide`) or the
/// 256-bit tiles.
fn tile_groups(wide: bool, m: usize) -> usize {
    match (wide, m == 1) {
        (true, false) => GROUPS_512,
        (true, true) => GROUPS_512_ONE_ROW,
        (false, false) => 1,
        (false, true) => GROUPS_256_ONE_ROW,
    }
}

/// Columns `16·g0..16·g0 + outs[r].len()` of every activation row `r`,
/// with the 512-bit tiles when `wide`, else the 256-bit ones. Requires AVX2,
/// FMA and F16C (checked by the caller through [`Isa`]) and, when `wide`,
/// AVX-512 F and BW ([`wide`]).
pub(crate) fn groups(wide: bool, w: &LaneMatrix, x: &[f32], g0: usize, outs: &mut [&mut [f32]]) {
    let rows_max = match (wide, outs.len() == 1) {
        (_, true) => 1,
        (true, false) => ROWS_512,
        (false, false) => ROWS_256,
    };
    let width = tile_groups(wide, outs.len());
    let (k, gb, format) = (w.k(), w.group_bytes(), w.format());
    let cols = outs.first().map_or(0, |o| o.len());
    let groups = cols.div_ceil(LANES);
    let mut buf = vec![[0f32; LANES]; rows_max * width];
    let mut g = 0;
    while g < groups {
        // What is left of a task runs in as few tiles as the widths allow:
        // single-group tiles of one or two rows leave one or two FMA chains
        // in flight (Q4_K 640 × 2048 in tasks of five groups ran
        // latency-bound, two rows slower than three).
        let ng = match groups - g {
            left if left >= width => width,
            left if outs.len() == 1 || left == 2 => left,
            _ => 1,
        };
        for r0 in (0..outs.len()).step_by(rows_max) {
            let rows = rows_max.min(outs.len() - r0);
            let job = Job {
                groups: w.bytes()[(g0 + g) * gb..][..ng * gb].as_ptr(),
                group_bytes: gb,
                format,
                x: x[r0 * k..(r0 + rows) * k].as_ptr(),
                k,
            };
            let out = &mut buf[..rows * ng];
            // SAFETY: the caller checked AVX2 and FMA, and AVX-512 F and BW
            // when `wide`; the slices above bound `ng` groups and `rows` rows,
            // and `out` has `rows * ng` entries.
            unsafe { tile_fn(wide, format, rows, ng)(job, out) };
            for (r, res) in out.chunks_exact(ng).enumerate() {
                let row = &mut outs[r0 + r][g * LANES..];
                for (dst, src) in row.chunks_mut(LANES).zip(res) {
                    dst.copy_from_slice(&src[..dst.len()]);
                }
            }
        }
        g += ng;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{QMatrix, QType};

    /// The AVX2 tiles, which this CPU would not pick when it has AVX-512,
    /// and the AVX-512 tiles where it has them, against the portable loop,
    /// bit for bit, on every quantized type: 1..=13 rows over 5 groups and
    /// a partial one, and over 4 and a partial one (full and partial tiles,
    /// two groups left after a three-group tile), and one row over 1..=9
    /// groups (one-row tiles of every width up to 8 and the rest).
    #[test]
    fn the_tiles_give_the_portable_bits() {
        if !Isa::Avx2.is_available() {
            return;
        }
        let k = 256;
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw");
        let shapes = [(88, 13), (75, 13)]
            .into_iter()
            .chain((1..=9).map(|g| (16 * g - 5, 1)));
        for qtype in QType::ALL.into_iter().filter(|q| q.block_size() > 1) {
            for (n, rows) in shapes.clone() {
                let len = qtype.row_bytes(k).expect("whole blocks") * n;
                let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                for blk in bytes.chunks_exact_mut(qtype.block_bytes()) {
                    match qtype {
                        QType::Q6_K => blk[208..210].copy_from_slice(&[0x00, 0x20]),
                        QType::Q8_K => blk[0..4].copy_from_slice(&0.01f32.to_le_bytes()),
                        QType::Q4_K | QType::Q5_K => blk[0..4].copy_from_slice(&[0, 0x20, 0, 0x1c]),
                        _ => blk[0..2].copy_from_slice(&[0x00, 0x20]),
                    }
                }
                let w = QMatrix::new(qtype, n, k, bytes).expect("valid bytes");
                let w = LaneMatrix::pack(&w).expect("quantized");
                for m in 1..=rows {
                    let x: Vec<f32> = (0..m * k)
                        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let mut want = vec![0f32; m * n];
                    w.matmul_with(Isa::Scalar, &x, m, &mut want)
                        .expect("portable");
                    for wide in [false, true].into_iter().filter(|&wide| !wide || avx512) {
                        let mut got = vec![f32::NAN; m * n];
                        let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(n).collect();
                        groups(wide, &w, &x, 0, &mut outs);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "{qtype:?} n={n} m={m} wide={wide}");
                    }
                }
            }
        }
    }
}
