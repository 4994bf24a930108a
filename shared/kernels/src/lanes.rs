//! [`LaneMatrix`]: a quantized weight matrix repacked so that SIMD lanes are
//! output rows, for exact (f32 activation) matmuls.
//!
//! # Arithmetic
//!
//! Every weight is dequantized to the value [`QMatrix::dequantize_row`]
//! gives, with one rounding as there: `w = (c − bias) · scale` for codes
//! `c` with a fixed bias (Q4_0, Q5_0, and the signed byte codes of Q8_0,
//! Q8_K and Q6_K), `w = fma(c, scale, −min)` for Q4_K / Q5_K. Each
//! (activation row, output) pair owns one f32 accumulator fed one element
//! at a time in increasing `k` order: `acc = fma(w[e], x[e], acc)`. Nothing
//! else touches the sum, so the result of a pair depends on that weight row
//! and that activation row only — batch invariant by construction — and
//! every implementation (portable `f32::mul_add`, AVX2, AVX-512) gives the
//! same bits: a SIMD lane carries one pair through exactly these operations.
//!
//! # Layout
//!
//! Output rows are taken sixteen at a time (a *group*; a last partial group
//! is padded with zero weights). For each group and each sub-block of `k`
//! that shares a scale (32 elements; 16 for Q6_K, 256 for Q8_K) a record
//! holds sixteen scales (f16 for Q4_0 / Q5_0 / Q8_0 as in the file, else
//! f32), sixteen f32 offsets (Q4_K, Q5_K only), then the
//! codes element by element, sixteen lanes each: signed bytes for Q8_0, Q8_K
//! and Q6_K, otherwise the low four bits of two consecutive elements per
//! byte (element `2p` low, `2p + 1` high), followed for Q5_0 / Q5_K by each
//! element's fifth bit as a 16-bit lane mask. Records are multiples of 32
//! bytes and start on 32-byte boundaries. A kernel loads a group's sixteen
//! codes of one element in one instruction, converts them, and multiplies
//! them with one broadcast activation per row: the weights are decoded once
//! for all rows of a tile and no horizontal sums exist. Bits per weight:
//! Q4_0 4.5, Q5_0 5.5, Q8_0 8.5 (as in the file), Q4_K 6, Q5_K 7, Q6_K 10,
//! Q8_K 8.1.

use half::f16;
use rayon::prelude::*;

use crate::kquants::decode_superblock;
use crate::matrix::{check_call, check_len};
use crate::q8::decode_block;
use crate::qtype::{QK8_0, QK_K};
use crate::{Isa, KernelError, QMatrix, QType};

/// Output rows per group: the lanes of one 512-bit register.
pub(crate) const LANES: usize = 16;
/// Bytes of a record's scales and of its offsets.
const VEC_BYTES: usize = LANES * 4;
/// Below this many multiply-accumulates a matmul runs on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 17;
/// Groups handed to one rayon task at least.
const TASK_MIN_GROUPS: usize = 3;
/// Records a tile prefetches ahead of the one it reads, per group
/// ([`crate::simd::prefetch_record`]): the screen's and the exact tiles of
/// several activation rows, and the 256-bit exact tile of one row (the
/// 512-bit one-row tile's eight group streams already keep memory busy).
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_RECORDS: usize = 8;
/// Rayon tasks per thread, for load balance.
const TASKS_PER_THREAD: usize = 4;

/// How a type's codes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codes {
    /// One signed byte per element (Q8_0, Q8_K, and Q6_K as `q − 32`).
    Bytes,
    /// Four low bits per element, two elements per byte; with `high_bit`
    /// (Q5_0, Q5_K) each element's fifth bit follows as 16-bit lane masks.
    Nibbles {
        /// Whether a fifth bit per element is stored.
        high_bit: bool,
    },
}

/// How a weight is formed from its code `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offsets {
    /// `w = (c − bias) · scale` (Q4_0: 8, Q5_0: 16, byte codes: 0).
    Bias(i32),
    /// `w = fma(c, scale, offset)`, offsets stored (Q4_K, Q5_K: `−min`).
    Stored,
}

/// Where the parts of a record lie, for one type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format {
    /// Code storage.
    pub(crate) codes: Codes,
    /// Elements per record (sharing one scale and offset per lane).
    pub(crate) sub: usize,
    /// How codes become weights.
    pub(crate) offsets: Offsets,
    /// Scales stored as f16 (Q4_0, Q5_0, Q8_0, whose scales are f16), else f32.
    pub(crate) half_scales: bool,
}

impl Format {
    /// The format of `qtype`, or `None` for unquantized types.
    fn of(qtype: QType) -> Option<Format> {
        let nibbles = |high_bit| Codes::Nibbles { high_bit };
        let (codes, sub, offsets) = match qtype {
            QType::F32 | QType::F16 => return None,
            QType::Q8_0 => (Codes::Bytes, QK8_0, Offsets::Bias(0)),
            QType::Q8_K => (Codes::Bytes, QK_K, Offsets::Bias(0)),
            QType::Q6_K => (Codes::Bytes, 16, Offsets::Bias(0)),
            QType::Q4_0 => (nibbles(false), 32, Offsets::Bias(8)),
            QType::Q5_0 => (nibbles(true), 32, Offsets::Bias(16)),
            QType::Q4_K => (nibbles(false), 32, Offsets::Stored),
            QType::Q5_K => (nibbles(true), 32, Offsets::Stored),
        };
        Some(Format {
            codes,
            sub,
            offsets,
            half_scales: matches!(qtype, QType::Q4_0 | QType::Q5_0 | QType::Q8_0),
        })
    }

    /// Bytes of one lane's scale.
    pub(crate) fn scale_width(self) -> usize {
        if self.half_scales {
            2
        } else {
            4
        }
    }

    /// Byte offset of the codes in a record (after the scales and any
    /// stored offsets).
    pub(crate) fn codes_at(self) -> usize {
        LANES * self.scale_width()
            + match self.offsets {
                Offsets::Bias(_) => 0,
                Offsets::Stored => VEC_BYTES,
            }
    }

    /// Byte offset of the fifth-bit masks in a record.
    pub(crate) fn masks_at(self) -> usize {
        self.codes_at() + self.sub * LANES / 2
    }

    /// Bytes of one record.
    pub(crate) fn record_bytes(self) -> usize {
        match self.codes {
            Codes::Bytes => self.codes_at() + self.sub * LANES,
            Codes::Nibbles { high_bit } => self.masks_at() + 2 * self.sub * usize::from(high_bit),
        }
    }

    /// Weight of code `c` with a lane's `scale` and `offset`.
    fn weight(self, c: i16, scale: f32, offset: f32) -> f32 {
        match self.offsets {
            Offsets::Bias(b) => f32::from(c - b as i16) * scale,
            Offsets::Stored => f32::from(c).mul_add(scale, offset),
        }
    }
}

/// One cache line of packed bytes (the buffer starts on a 64-byte boundary).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A quantized weight matrix (`n` output rows by `k` inputs) repacked for
/// exact matmuls; see the module docs for the arithmetic and the layout.
#[derive(Clone)]
pub struct LaneMatrix {
    qtype: QType,
    n: usize,
    k: usize,
    format: Format,
    lines: Vec<Line>,
}

impl std::fmt::Debug for LaneMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneMatrix")
            .field("qtype", &self.qtype)
            .field("n", &self.n)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

/// One row's dequantization parameters: per element its code, per
/// sub-block its scale and offset.
struct RowCodes {
    codes: Vec<i16>,
    scales: Vec<f32>,
    offsets: Vec<f32>,
}

/// Codes, scales and offsets of one ggml row of `qtype` such that element
/// `e` dequantizes to `format.weight(codes[e], scales[e / sub],
/// offsets[e / sub])`.
fn row_codes(qtype: QType, format: Format, row: &[u8], k: usize) -> RowCodes {
    let subs = k / format.sub;
    let mut rc = RowCodes {
        codes: Vec::with_capacity(k),
        scales: Vec::with_capacity(subs),
        offsets: Vec::with_capacity(subs),
    };
    let bb = qtype.block_bytes();
    for blk in row.chunks_exact(bb) {
        match qtype {
            QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => {
                let mut w = [0i8; QK8_0];
                let d = decode_block(qtype, blk, &mut w);
                let bias = match format.offsets {
                    Offsets::Bias(b) => b as i16,
                    Offsets::Stored => 0,
                };
                rc.codes.extend(w.iter().map(|&q| i16::from(q) + bias));
                rc.scales.push(d);
                rc.offsets.push(0.0);
            }
            _ => {
                let sb = decode_superblock(qtype, blk);
                match qtype {
                    QType::Q8_K => rc.codes.extend(sb.q.iter().map(|&q| i16::from(q as i8))),
                    QType::Q6_K => rc.codes.extend(sb.q.iter().map(|&q| i16::from(q) - 32)),
                    _ => rc.codes.extend(sb.q.iter().map(|&q| i16::from(q))),
                }
                for s in (0..16).step_by(format.sub / 16) {
                    let scale = sb.d * f32::from(sb.scales[s]);
                    rc.scales.push(scale);
                    rc.offsets.push(-(sb.dmin * f32::from(sb.mins[s])));
                }
            }
        }
    }
    rc
}

impl LaneMatrix {
    /// Repacks a quantized `w`. Fails for F32 / F16 matrices.
    pub fn pack(w: &QMatrix) -> Result<Self, KernelError> {
        let qtype = w.qtype();
        let format = Format::of(qtype).ok_or(KernelError::NotQuantized(qtype))?;
        let (n, k) = (w.n(), w.k());
        let rec = format.record_bytes();
        let group_bytes = k / format.sub * rec;
        let groups = n.div_ceil(LANES);
        // Zeroed in parallel, as the groups are filled: the first touch of each page faults
        // and clears it, a large part of packing the LM head in load profiles.
        let mut lines = Vec::new();
        lines.par_extend(rayon::iter::repeat_n(
            Line([0; 64]),
            (groups * group_bytes).div_ceil(64),
        ));
        let row_bytes = w.as_bytes().len() / n;
        let bytes = &mut lines_as_bytes_mut(&mut lines)[..groups * group_bytes];
        let rows = w.as_bytes().par_chunks(LANES * row_bytes);
        bytes
            .par_chunks_mut(group_bytes)
            .zip(rows)
            .for_each(|(group, rows)| {
                for (lane, row) in rows.chunks_exact(row_bytes).enumerate() {
                    put_row(format, &row_codes(qtype, format, row, k), lane, group);
                }
            });
        Ok(LaneMatrix {
            qtype,
            n,
            k,
            format,
            lines,
        })
    }

    /// Storage type of the matrix this was packed from.
    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Number of output rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of inputs per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held (packed weights, scales and offsets).
    pub fn byte_len(&self) -> usize {
        self.n.div_ceil(LANES) * self.group_bytes()
    }

    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// Bytes of one group's records.
    pub(crate) fn group_bytes(&self) -> usize {
        self.k / self.format.sub * self.format.record_bytes()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &lines_as_bytes(&self.lines)[..self.byte_len()]
    }

    /// Row `row`, dequantized (the same values as
    /// [`QMatrix::dequantize_row`] gives for the packed matrix).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.n {
            return Err(KernelError::RowOutOfRange { row, n: self.n });
        }
        check_len("output", out.len(), Some(self.k))?;
        self.decode_row(row, out);
        Ok(())
    }

    /// Row `row` (`< n`) dequantized into `out` (`k` values).
    pub(crate) fn decode_row(&self, row: usize, out: &mut [f32]) {
        let gb = self.group_bytes();
        decode_lane(
            self.format,
            &self.bytes()[row / LANES * gb..][..gb],
            row % LANES,
            out,
        );
    }

    /// Dequantizes the whole matrix to `n × k` row-major `f32`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (r, row) in out.chunks_exact_mut(self.k).enumerate() {
            self.decode_row(r, row);
        }
        out
    }

    /// A matrix of the given rows, in that order (rows may repeat).
    pub fn select_rows(&self, rows: &[usize]) -> Result<LaneMatrix, KernelError> {
        if let Some(&row) = rows.iter().find(|&&r| r >= self.n) {
            return Err(KernelError::RowOutOfRange { row, n: self.n });
        }
        if rows.is_empty() {
            return Err(KernelError::EmptyMatrix { n: 0, k: self.k });
        }
        let gb = self.group_bytes();
        let mut lines = vec![Line([0; 64]); (rows.len().div_ceil(LANES) * gb).div_ceil(64)];
        let dst = lines_as_bytes_mut(&mut lines);
        for (i, &r) in rows.iter().enumerate() {
            let src = &self.bytes()[r / LANES * gb..][..gb];
            let to = &mut dst[i / LANES * gb..][..gb];
            copy_lane(self.format, (src, r % LANES), (to, i % LANES));
        }
        Ok(LaneMatrix {
            qtype: self.qtype,
            n: rows.len(),
            k: self.k,
            format: self.format,
            lines,
        })
    }

    /// `out = x · Wᵀ` (`x`: `m × k` row-major, `out`: `m × n`), with the
    /// fastest implementation of this CPU; every implementation gives the
    /// same bits (module docs).
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::detect(), x, m, out)
    }

    /// [`LaneMatrix::matmul`] on a chosen implementation: [`Isa::Scalar`]
    /// runs the portable loop, any other the 512-bit tiles where the CPU has
    /// AVX-512 F and BW and the process is not capped at [`Isa::Avx2`]
    /// ([`Isa::set_max`]), else the 256-bit ones. All give the same bits.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        check_call(isa, (x, m, self.k), (out, self.n))?;
        if m == 0 {
            return Ok(());
        }
        self.run(isa, x, m, out);
        Ok(())
    }

    /// Splits the groups between threads and computes `out`.
    fn run(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
        split_groups((m, self.k, self.n), out, |g0, outs| {
            self.groups(isa, x, g0, outs)
        });
    }

    /// Groups `g0..` covering `outs[r]` (output rows `16·g0..`) for every
    /// activation row `r`.
    fn groups(&self, isa: Isa, x: &[f32], g0: usize, outs: &mut [&mut [f32]]) {
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar {
            crate::lanes_x86::groups(crate::lanes_x86::wide(), self, x, g0, outs);
            return;
        }
        debug_assert!(isa == Isa::Scalar || !cfg!(target_arch = "x86_64"));
        let mut w = vec![0f32; self.k];
        let cols = outs.first().map_or(0, |o| o.len());
        for col in 0..cols {
            self.decode_row(g0 * LANES + col, &mut w);
            for (out, x) in outs.iter_mut().zip(x.chunks_exact(self.k)) {
                out[col] = fma_chain(&w, x);
            }
        }
    }
}

/// Computes `out` (`m × n`, row-major, `k` inputs per output) in ranges of
/// groups: `f(g0, outs)` fills columns `16·g0..16·g0 + outs[r].len()` of
/// every row `r`. The ranges are split between rayon threads (rows never:
/// each output is computed by one call), or all computed on the calling
/// thread for small products.
pub(crate) fn split_groups(
    (m, k, n): (usize, usize, usize),
    out: &mut [f32],
    f: impl Fn(usize, &mut [&mut [f32]]) + Sync,
) {
    let groups = n.div_ceil(LANES);
    let chunk = task_groups((m, k, n));
    if chunk >= groups {
        let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
        f(0, &mut outs);
        return;
    }
    let mut per_row: Vec<_> = out
        .chunks_exact_mut(n)
        .map(|row| row.chunks_mut(chunk * LANES))
        .collect();
    let tasks: Vec<(usize, Vec<&mut [f32]>)> = (0..groups.div_ceil(chunk))
        .map(|c| {
            let outs = per_row.iter_mut().filter_map(Iterator::next).collect();
            (c * chunk, outs)
        })
        .collect();
    tasks
        .into_par_iter()
        .for_each(|(g0, mut outs)| f(g0, &mut outs));
}

/// Groups per rayon task of an `m × k` by `k × n` product: a few tasks per
/// thread, or all groups (one task on the calling thread) for small products.
pub(crate) fn task_groups((m, k, n): (usize, usize, usize)) -> usize {
    let groups = n.div_ceil(LANES);
    let threads = rayon::current_num_threads();
    let macs = m.saturating_mul(k).saturating_mul(n);
    if threads <= 1 || macs < PARALLEL_MIN_MACS {
        return groups;
    }
    groups
        .div_ceil(threads * TASKS_PER_THREAD)
        .max(TASK_MIN_GROUPS)
}

/// `Σ w_e·x_e` as one FMA chain in element order from zero: the arithmetic
/// of every lane of every kernel.
pub(crate) fn fma_chain(w: &[f32], x: &[f32]) -> f32 {
    w.iter()
        .zip(x)
        .fold(0f32, |acc, (&w, &x)| w.mul_add(x, acc))
}

/// Writes row `rc` into lane `lane` of a group's records.
fn put_row(format: Format, rc: &RowCodes, lane: usize, group: &mut [u8]) {
    let rec = format.record_bytes();
    let lane_bit = 1u16 << lane;
    for (s, record) in group.chunks_exact_mut(rec).enumerate() {
        if format.half_scales {
            let at = 2 * lane;
            record[at..at + 2].copy_from_slice(&f16::from_f32(rc.scales[s]).to_le_bytes());
        } else {
            let at = 4 * lane;
            record[at..at + 4].copy_from_slice(&rc.scales[s].to_le_bytes());
        }
        if format.offsets == Offsets::Stored {
            let at = LANES * format.scale_width() + 4 * lane;
            record[at..at + 4].copy_from_slice(&rc.offsets[s].to_le_bytes());
        }
        let codes = &rc.codes[s * format.sub..][..format.sub];
        for (e, &c) in codes.iter().enumerate() {
            match format.codes {
                Codes::Bytes => record[format.codes_at() + e * LANES + lane] = c as i8 as u8,
                Codes::Nibbles { high_bit } => {
                    let nib = (c as u8 & 0x0F) << (4 * (e % 2));
                    record[format.codes_at() + e / 2 * LANES + lane] |= nib;
                    if high_bit && (c >> 4) & 1 == 1 {
                        let at = format.masks_at() + 2 * e;
                        let mask = u16::from_le_bytes([record[at], record[at + 1]]) | lane_bit;
                        record[at..at + 2].copy_from_slice(&mask.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// Copies lane `from.1` of the group `from.0` into lane `to.1` of `to.0`
/// (scales, offsets, codes and fifth bits of every record).
fn copy_lane(format: Format, from: (&[u8], usize), to: (&mut [u8], usize)) {
    let ((src, sl), (dst, dl)) = (from, to);
    let rec = format.record_bytes();
    for (s, d) in src.chunks_exact(rec).zip(dst.chunks_exact_mut(rec)) {
        let w = format.scale_width();
        d[w * dl..w * (dl + 1)].copy_from_slice(&s[w * sl..w * (sl + 1)]);
        if format.offsets == Offsets::Stored {
            let at = LANES * w;
            d[at + 4 * dl..at + 4 * (dl + 1)].copy_from_slice(&s[at + 4 * sl..at + 4 * (sl + 1)]);
        }
        let code_bytes = match format.codes {
            Codes::Bytes => format.sub,
            Codes::Nibbles { .. } => format.sub / 2,
        };
        for c in 0..code_bytes {
            d[format.codes_at() + c * LANES + dl] = s[format.codes_at() + c * LANES + sl];
        }
        if format.codes == (Codes::Nibbles { high_bit: true }) {
            for e in 0..format.sub {
                let at = format.masks_at() + 2 * e;
                let bit = (u16::from_le_bytes([s[at], s[at + 1]]) >> sl) & 1;
                let mask = u16::from_le_bytes([d[at], d[at + 1]]) & !(1 << dl) | bit << dl;
                d[at..at + 2].copy_from_slice(&mask.to_le_bytes());
            }
        }
    }
}

/// The code of element `e` of lane `lane` in a record.
fn code_at(format: Format, record: &[u8], e: usize, lane: usize) -> i16 {
    match format.codes {
        Codes::Bytes => i16::from(record[format.codes_at() + e * LANES + lane] as i8),
        Codes::Nibbles { high_bit } => {
            let byte = record[format.codes_at() + e / 2 * LANES + lane];
            let mut c = i16::from((byte >> (4 * (e % 2))) & 0x0F);
            if high_bit {
                let at = format.masks_at() + 2 * e;
                let mask = u16::from_le_bytes([record[at], record[at + 1]]);
                c |= (((mask >> lane) & 1) << 4) as i16;
            }
            c
        }
    }
}

/// Dequantizes lane `lane` of a group's records into `out` (`k` values).
fn decode_lane(format: Format, group: &[u8], lane: usize, out: &mut [f32]) {
    let rec = format.record_bytes();
    let f32_at = |r: &[u8], at: usize| f32::from_le_bytes([r[at], r[at + 1], r[at + 2], r[at + 3]]);
    for (record, out) in group
        .chunks_exact(rec)
        .zip(out.chunks_exact_mut(format.sub))
    {
        let scale = match format.half_scales {
            true => f16::from_le_bytes([record[2 * lane], record[2 * lane + 1]]).to_f32(),
            false => f32_at(record, 4 * lane),
        };
        let offset = match format.offsets {
            Offsets::Bias(_) => 0.0,
            Offsets::Stored => f32_at(record, LANES * 4 + 4 * lane),
        };
        for (e, o) in out.iter_mut().enumerate() {
            *o = format.weight(code_at(format, record, e, lane), scale, offset);
        }
    }
}

fn lines_as_bytes(lines: &[Line]) -> &[u8] {
    // SAFETY: `Line` is `repr(C)` over `[u8; 64]`: the lines are
    // `64 * len` initialised bytes laid out contiguously.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<u8>(), lines.len() * 64) }
}

fn lines_as_bytes_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: as in `lines_as_bytes`, and the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) }
}
