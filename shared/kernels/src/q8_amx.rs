//! AMX-INT8 kernel for Q4_0, Q5_0 and Q8_0 weights against Q8_0 activation
//! rows, bit-identical to the portable kernel [`crate::q8::rows_scalar`].
//!
//! Weight rows go 16 at a time. With two or more activation rows, one
//! `tdpbssd` per block of 32 forms the exact integer dots `Σ w·x` of every
//! (weight row, activation row) pair:
//!
//! * tile A holds the 16 weight rows' codes, loaded straight from the GGUF
//!   rows with the row stride (Q8_0), or from a scratch the block was
//!   unpacked to (Q4_0, Q5_0, and the last weight rows of a matrix);
//! * tile B holds up to 16 activation rows in the tiles' "VNNI" layout (four
//!   consecutive codes of every activation row side by side per 64-byte
//!   row), packed once per call by [`Packed::new`];
//! * tile C receives the `i32` dots, weight rows down, activation rows
//!   across.
//!
//! A single activation row (decoding) would leave 15 of the 16 tile columns
//! idle behind the tiles' latency, so it takes AVX-512 VNNI instead: two
//! weight rows per register, `dpbusd` lane sums, and a transposing
//! reduction to one exact dot per weight row.
//!
//! The f32 steps are the portable kernel's, lane by lane on accumulators of
//! their own: `acc = acc + (dw · dx) · dot`, two products and a sum, each
//! rounded, block after block. Integer dots are exact however they are
//! formed, so every pair computes exactly what `rows_scalar` computes,
//! whatever the number of rows and whichever tile holds them.

use std::arch::x86_64::*;

use crate::amx::{self, Shape};
use crate::avx512::{sum_row_pairs, transpose};
use crate::block_types::block_bytes;
use crate::q8_x86::{Q4_0, Q5_0, Q8_0};
use crate::qtype::{QType, QK8_0};
use crate::quantize::Q8_0Acts;
use crate::simd::{load_i8x32, load_u8x16, load_u8x32, prefetch_l2};
use crate::tile::groups;

/// Rows of one tile: weight rows per A tile, activation rows per B tile.
const TILE: usize = 16;
/// Rows of a B tile: 32 codes, four per row.
const B_ROWS: usize = QK8_0 / 4;
/// Bytes of one packed B tile.
const B_BYTES: usize = B_ROWS * 64;

/// Activation rows quantized to Q8_0 (no offset) and, for two or more rows,
/// packed into B tiles of up to [`TILE`] rows each.
pub(crate) struct Packed {
    acts: Q8_0Acts,
    m: usize,
    /// Groups of activation rows, `(first row, rows)`, at most [`TILE`] each.
    groups: Vec<(usize, usize)>,
    /// B tile of group `g`, block `b`: `tiles[(g * blocks + b) * B_BYTES..]`.
    tiles: Vec<i8>,
}

impl Packed {
    /// Packs `acts` (`m` rows of `k` values, quantized without offset).
    pub(crate) fn new(acts: Q8_0Acts, m: usize, k: usize) -> Self {
        let blocks = k / QK8_0;
        let groups: Vec<_> = match m {
            1 => Vec::new(),
            _ => groups(m, TILE).collect(),
        };
        let mut tiles = vec![0i8; groups.len() * blocks * B_BYTES];
        for (g, &(r0, len)) in groups.iter().enumerate() {
            for b in 0..blocks {
                let tile = &mut tiles[(g * blocks + b) * B_BYTES..][..B_BYTES];
                for (c, codes) in acts.codes(b, r0, len).chunks_exact(QK8_0).enumerate() {
                    for (i, four) in codes.chunks_exact(4).enumerate() {
                        tile[64 * i + 4 * c..][..4].copy_from_slice(four);
                    }
                }
            }
        }
        Packed {
            acts,
            m,
            groups,
            tiles,
        }
    }

    /// The quantized activations.
    pub(crate) fn acts(&self) -> &Q8_0Acts {
        &self.acts
    }
}

/// `outs[r][j - j0]` for every activation row `r` and weight row `j` of `w`
/// (whole rows of `qtype` blocks over `k` inputs).
///
/// # Safety
/// [`amx::available`] must hold.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn rows(
    qtype: QType,
    w: &[u8],
    k: usize,
    acts: &Packed,
    outs: &mut [&mut [f32]],
) {
    // SAFETY: the caller checked `amx::available`.
    unsafe {
        match qtype {
            QType::Q4_0 => rows_of::<Q4_0>(w, k, acts, outs),
            QType::Q5_0 => rows_of::<Q5_0>(w, k, acts, outs),
            _ => rows_of::<Q8_0>(w, k, acts, outs),
        }
    }
}

/// One block's weight-side inputs for 16 weight rows: the codes (as a
/// pointer and row stride for tile A) and the scales.
#[derive(Clone, Copy)]
struct WeightBlock {
    codes: *const i8,
    stride: usize,
    dw: [f32; TILE],
}

/// Weight rows `j0..j0 + len` of `w` (`rb` bytes each), block by block.
/// Its methods are not `target_feature` functions so that they can be
/// forced inline (a call would spill the accumulators); they require AVX2,
/// FMA, F16C, AVX-512 (F, BW, VL) and AVX-512 VNNI.
struct WeightRows<'a, const T: u8> {
    w: &'a [u8],
    rb: usize,
    j0: usize,
    len: usize,
    blocks: usize,
    /// Unpacked codes, four blocks (one per slot) of 16 rows of 32, for
    /// types that need unpacking or a partial tile.
    scratch: &'a mut [[i8; TILE * QK8_0]; 4],
}

impl<const T: u8> WeightRows<'_, T> {
    /// Block `b` of row `j0 + n`.
    #[inline(always)]
    fn at(&self, n: usize, b: usize) -> &[u8] {
        let bb = block_bytes::<T>();
        &self.w[(self.j0 + n) * self.rb + b * bb..][..bb]
    }

    /// The scales of block `b` of the rows (zero past the last row), with
    /// a share of the next 16 rows prefetched (they are contiguous, so the
    /// blocks' steps cover them).
    ///
    /// # Safety
    /// The features listed on [`WeightRows`] must be available.
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m512 {
        let share = (TILE * self.rb).div_ceil(self.blocks).next_multiple_of(64);
        let mut bits = [0u16; TILE];
        for (n, h) in bits.iter_mut().enumerate().take(self.len) {
            let blk = self.at(n, b);
            *h = u16::from_le_bytes([blk[0], blk[1]]);
        }
        // SAFETY: the caller guarantees the features; `bits` is 32 bytes.
        unsafe {
            prefetch_l2(self.w, (self.j0 + TILE) * self.rb + b * share, share);
            _mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr().cast()))
        }
    }

    /// The 32 signed codes of block `b` of rows `n` (low half) and `n + 1`
    /// (high half; zeros past the last row).
    ///
    /// # Safety
    /// As [`WeightRows::scales`].
    #[inline(always)]
    unsafe fn pair(&self, n: usize, b: usize) -> __m512i {
        let second = n + 1 < self.len;
        // SAFETY: the caller guarantees the features; every load reads
        // inside one block.
        unsafe {
            if T == Q8_0 {
                let low = _mm512_castsi256_si512(load_u8x32(&self.at(n, b)[2..]));
                return match second {
                    true => _mm512_inserti64x4::<1>(low, load_u8x32(&self.at(n + 1, b)[2..])),
                    false => low,
                };
            }
            let qs = if T == Q5_0 { 6 } else { 2 };
            let low = load_u8x16(&self.at(n, b)[qs..]);
            let high = match second {
                true => load_u8x16(&self.at(n + 1, b)[qs..]),
                false => _mm_setzero_si128(),
            };
            let both = _mm256_set_m128i(high, low);
            let shifted =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(both), _mm256_srli_epi16::<4>(both));
            let nibbles = _mm512_and_si512(
                _mm512_shuffle_i64x2::<0b11_01_10_00>(shifted, shifted),
                _mm512_set1_epi8(0x0F),
            );
            if T == Q4_0 {
                return _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8));
            }
            // `(nibble | bit << 4) - 16` is the nibble where the fifth bit
            // is set and `nibble | 0xF0` (as an i8) where it is clear.
            let qh = |n: usize| {
                let blk = self.at(n, b);
                u64::from(u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]))
            };
            let bits = qh(n) | if second { qh(n + 1) << 32 } else { 0 };
            let clear = _mm512_or_si512(nibbles, _mm512_set1_epi8(-16));
            _mm512_mask_blend_epi8(bits, clear, nibbles)
        }
    }

    /// Block `b` of the rows for tile A, unpacked to scratch `slot` where
    /// needed.
    ///
    /// # Safety
    /// As [`WeightRows::scales`].
    #[inline(always)]
    unsafe fn block(&mut self, b: usize, slot: usize) -> WeightBlock {
        let mut dw = [0f32; TILE];
        // SAFETY: the caller guarantees the features; `dw` holds 16 lanes
        // and the scratch 16 rows of 32 codes.
        unsafe {
            _mm512_storeu_ps(dw.as_mut_ptr(), self.scales(b));
            if T == Q8_0 && self.len == TILE {
                return WeightBlock {
                    codes: self.at(0, b)[2..].as_ptr().cast(),
                    stride: self.rb,
                    dw,
                };
            }
            for n in (0..self.len).step_by(2) {
                let codes = self.pair(n, b);
                let dst = self.scratch[slot][n * QK8_0..].as_mut_ptr();
                match n + 1 < self.len {
                    true => _mm512_storeu_si512(dst.cast(), codes),
                    false => _mm256_storeu_si256(dst.cast(), _mm512_castsi512_si256(codes)),
                }
            }
            WeightBlock {
                codes: self.scratch[slot].as_ptr(),
                stride: QK8_0,
                dw,
            }
        }
    }

    /// The exact dots of block `b` of the 16 rows with the 32 codes `x`
    /// (stored offset by 128, in both halves), one `i32` per row (garbage
    /// past the last row): `dpbusd` lane sums per row pair, then a
    /// transposing reduction of the eight registers ([`sum_row_pairs`]).
    ///
    /// # Safety
    /// As [`WeightRows::scales`].
    #[inline(always)]
    unsafe fn dots(&self, b: usize, x_plus_128: __m512i) -> __m512i {
        // SAFETY: the caller guarantees the features.
        unsafe {
            let zero = _mm512_setzero_si512();
            let minus_128 = _mm512_set1_epi8(-128);
            let mut lanes = [zero; TILE / 2];
            for (p, lanes) in lanes.iter_mut().enumerate() {
                if 2 * p < self.len {
                    let w = self.pair(2 * p, b);
                    let offset = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, minus_128, w));
                    *lanes = _mm512_dpbusd_epi32(offset, x_plus_128, w);
                }
            }
            sum_row_pairs(lanes)
        }
    }
}

/// [`rows`] for block type `T`: 16 weight rows at a time, against one
/// activation row or each group of up to 16.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_of<const T: u8>(w: &[u8], k: usize, acts: &Packed, outs: &mut [&mut [f32]]) {
    let blocks = k / QK8_0;
    let rb = blocks * block_bytes::<T>();
    let n = w.len() / rb;
    let mut scratch = [[0i8; TILE * QK8_0]; 4];
    let c = Shape {
        rows: TILE as u8,
        bytes: 64,
    };
    let a = Shape {
        rows: TILE as u8,
        bytes: QK8_0 as u16,
    };
    let b = Shape {
        rows: B_ROWS as u8,
        bytes: 64,
    };
    // SAFETY: the caller checked `amx::available`.
    let tiles = (acts.m > 1).then(|| unsafe { amx::Tiles::new(&[c, c, a, a, b, b]) });
    for j0 in (0..n).step_by(TILE) {
        let mut weights = WeightRows::<T> {
            w,
            rb,
            j0,
            len: (n - j0).min(TILE),
            blocks,
            scratch: &mut scratch,
        };
        match &tiles {
            None => single(&weights, acts, outs),
            Some(tiles) => {
                for (g, &(r0, len)) in acts.groups.iter().enumerate() {
                    let packed = &acts.tiles[g * blocks * B_BYTES..][..blocks * B_BYTES];
                    group(tiles, &mut weights, acts, (r0, len), packed, outs);
                }
            }
        }
    }
}

/// One activation row against the weight rows, without tiles: the exact
/// block dots of 16 weight rows from `dpbusd` (see [`WeightRows::dots`]),
/// scaled and added in one register, lane by lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn single<const T: u8>(weights: &WeightRows<'_, T>, acts: &Packed, outs: &mut [&mut [f32]]) {
    let mut acc = _mm512_setzero_ps();
    let flip = _mm512_set1_epi8(-128);
    for b in 0..weights.blocks {
        let x = load_i8x32(acts.acts.codes(b, 0, 1));
        let x_plus_128 = _mm512_xor_si512(_mm512_broadcast_i64x4(x), flip);
        let dx = _mm512_set1_ps(acts.acts.scales(b, 0, 1)[0]);
        // SAFETY: this function has the features `WeightRows` needs.
        let (dw, dots) = unsafe { (weights.scales(b), weights.dots(b, x_plus_128)) };
        let scaled = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(dots));
        acc = _mm512_add_ps(acc, scaled);
    }
    let mut sums = [0f32; TILE];
    // SAFETY: `sums` holds 16 lanes.
    unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), acc) };
    outs[0][weights.j0..weights.j0 + weights.len].copy_from_slice(&sums[..weights.len]);
}

/// Issues the tile work of one prepared block in `SLOT` 0 or 1 (tiles
/// C, A, B = `tmm{SLOT}`, `tmm{2 + SLOT}`, `tmm{4 + SLOT}`): two slots let
/// two blocks' tile work overlap.
///
/// # Safety
/// Tiles configured as in [`rows_of`]; `blk` must address 16 readable
/// rows of 32 codes and `x` the 8 rows of 64 bytes of a packed B tile.
#[inline(always)]
unsafe fn issue<const SLOT: u8>(tiles: &amx::Tiles, blk: &WeightBlock, x: *const i8) {
    // SAFETY: forwarded from the caller.
    unsafe {
        amx::zero::<SLOT>(tiles);
        match SLOT {
            0 => {
                amx::load::<2>(tiles, blk.codes, blk.stride);
                amx::load::<4>(tiles, x, 64);
                amx::dot::<0, 2, 4>(tiles);
            }
            _ => {
                amx::load::<3>(tiles, blk.codes, blk.stride);
                amx::load::<5>(tiles, x, 64);
                amx::dot::<1, 3, 5>(tiles);
            }
        }
    }
}

/// Activation rows `r0..r0 + len` (B tiles `packed`, one per block) against
/// the weight rows: tile C is 16 rows of dots, one register per weight row.
/// Blocks go two at a time, and the next two are unpacked (into the other
/// half of the scratch) while the tiles work, so a tile load never waits
/// for the stores that filled its scratch.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const T: u8>(
    tiles: &amx::Tiles,
    weights: &mut WeightRows<'_, T>,
    acts: &Packed,
    (r0, len): (usize, usize),
    packed: &[i8],
    outs: &mut [&mut [f32]],
) {
    let blocks = weights.blocks;
    let x = |b: usize| packed[b * B_BYTES..].as_ptr();
    let mut dots = [[0i32; TILE * TILE]; 2];
    let mut acc = [_mm512_setzero_ps(); TILE];
    let lanes: __mmask16 = (1u32 << len).wrapping_sub(1) as u16;
    // SAFETY (all blocks below): this function has the features
    // `WeightRows` needs, tiles are configured by `rows_of`, and each
    // block's codes stay in `w` or its own scratch slot until used.
    let mut next = unsafe { prepare(weights, 0) };
    for b in (0..blocks).step_by(2) {
        let current = next;
        // SAFETY: see above; tile C writes 16 rows of 64 bytes into `dots`.
        unsafe {
            issue::<0>(tiles, &current.0, x(b));
            if let Some(second) = &current.1 {
                issue::<1>(tiles, second, x(b + 1));
            }
            if b + 2 < blocks {
                next = prepare(weights, b + 2);
            }
            amx::store::<0>(tiles, dots[0].as_mut_ptr(), 64);
            if current.1.is_some() {
                amx::store::<1>(tiles, dots[1].as_mut_ptr(), 64);
            }
        }
        let blks = [Some(&current.0), current.1.as_ref()];
        for (i, blk) in blks.into_iter().enumerate() {
            let Some(blk) = blk else { break };
            let dx = acts.acts.scales(b + i, r0, len);
            // SAFETY: the mask reads `len` scales; each row of `dots` holds 16.
            let dx = unsafe { _mm512_maskz_loadu_ps(lanes, dx.as_ptr()) };
            for (n, acc) in acc.iter_mut().enumerate() {
                let dot = unsafe { _mm512_loadu_si512(dots[i][n * TILE..].as_ptr().cast()) };
                let scale = _mm512_mul_ps(_mm512_set1_ps(blk.dw[n]), dx);
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(dot)));
            }
        }
    }
    // SAFETY: this function has the features.
    let rows = unsafe { transpose(acc) };
    let (j0, wlen) = (weights.j0, weights.len);
    let keep: __mmask16 = (1u32 << wlen).wrapping_sub(1) as u16;
    for (c, row) in rows.iter().enumerate().take(len) {
        let out = &mut outs[r0 + c][j0..j0 + wlen];
        // SAFETY: the mask writes the `wlen` values of `out`.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), keep, *row) };
    }
}

/// Blocks `b` and `b + 1` (if any) prepared for tile A, in scratch slots
/// alternating between the halves of the scratch every two blocks.
///
/// # Safety
/// As [`WeightRows::scales`].
#[inline(always)]
unsafe fn prepare<const T: u8>(
    weights: &mut WeightRows<'_, T>,
    b: usize,
) -> (WeightBlock, Option<WeightBlock>) {
    let slot = b % 4;
    // SAFETY: forwarded from the caller.
    unsafe {
        let first = weights.block(b, slot);
        let second = match b + 1 < weights.blocks {
            true => Some(weights.block(b + 1, slot + 1)),
            false => None,
        };
        (first, second)
    }
}
