//! [`LaneMatrix`]: a quantized weight matrix repacked so that SIMD lanes are
//! output rows, for exact (f32 activation) matmuls.
//!
//! # Arithmetic
//!
//! Every weight is dequantized exactly as [`QMatrix::dequantize_row`] does,
//! as `w = fma(code, scale, offset)` (one rounding of the exact value
//! `scale · (q − bias) − min`, the same single rounding ggml's dequantizer
//! performs), and each (activation row, output) pair owns one f32
//! accumulator fed one element at a time in increasing `k` order:
//! `acc = fma(w[e], x[e], acc)`. Nothing else touches the sum, so the result
//! of a pair depends on that weight row and that activation row only —
//! batch invariant by construction — and every implementation (portable
//! `f32::mul_add`, AVX2, AVX-512) gives the same bits: a SIMD lane carries
//! one pair through exactly these operations.
//!
//! # Layout
//!
//! Output rows are taken sixteen at a time (a *group*; a last partial group
//! is padded with zero weights). For each group and each sub-block of `k`
//! that shares a scale (32 elements; 16 for Q6_K, 256 for Q8_K) a record
//! holds sixteen f32 scales, sixteen f32 offsets where the type has mins
//! (Q4_K, Q5_K; elsewhere the offset is `scale · −bias`), then the codes element by
//! element, sixteen lanes each: signed bytes for Q8_0 / Q8_K, otherwise the
//! low four bits of two consecutive elements per byte (element `2p` low,
//! `2p + 1` high) followed by each element's higher bits as 16-bit lane
//! masks (none for Q4_0 / Q4_K, one for Q5_0 / Q5_K, two for Q6_K). Records are multiples
//! of 64 bytes and start on 64-byte boundaries. A kernel then loads a
//! group's sixteen codes of one element in one instruction, converts them,
//! and multiplies them with one broadcast activation per row: the weights
//! are decoded once for all rows of a tile and no horizontal sums exist.

use rayon::prelude::*;

use crate::kquants::decode_superblock;
use crate::matrix::check_len;
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
/// Rayon tasks per thread, for load balance.
const TASKS_PER_THREAD: usize = 4;

/// How a type's codes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codes {
    /// One signed byte per element (Q8_0, Q8_K).
    Bytes,
    /// Four low bits per element, two elements per byte, plus this many
    /// higher bits per element as lane masks (Q4_x: 0, Q5_x: 1, Q6_K: 2).
    Nibbles(usize),
}

/// Where the parts of a record lie, for one type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Format {
    /// Code storage.
    pub(crate) codes: Codes,
    /// Elements per record (sharing one scale and offset per lane).
    pub(crate) sub: usize,
    /// The code bias `b` of types without mins, whose offsets are not
    /// stored but computed as `scale · −b` (exact: `b` is 0, 8, 16 or 32);
    /// `None` where the offsets are stored (Q4_K, Q5_K).
    pub(crate) bias: Option<f32>,
}

impl Format {
    /// The format of `qtype`, or `None` for unquantized types.
    fn of(qtype: QType) -> Option<Format> {
        let (codes, sub, bias) = match qtype {
            QType::F32 | QType::F16 => return None,
            QType::Q8_0 => (Codes::Bytes, QK8_0, Some(0.0)),
            QType::Q8_K => (Codes::Bytes, QK_K, Some(0.0)),
            QType::Q4_0 => (Codes::Nibbles(0), 32, Some(8.0)),
            QType::Q5_0 => (Codes::Nibbles(1), 32, Some(16.0)),
            QType::Q4_K => (Codes::Nibbles(0), 32, None),
            QType::Q5_K => (Codes::Nibbles(1), 32, None),
            QType::Q6_K => (Codes::Nibbles(2), 16, Some(32.0)),
        };
        Some(Format { codes, sub, bias })
    }

    /// Byte offset of the codes in a record (after the scales and any
    /// stored offsets).
    pub(crate) fn codes_at(self) -> usize {
        VEC_BYTES * if self.bias.is_some() { 1 } else { 2 }
    }

    /// Byte offset of the higher-bit masks in a record.
    pub(crate) fn planes_at(self) -> usize {
        self.codes_at() + self.sub * LANES / 2
    }

    /// Bytes of one record.
    pub(crate) fn record_bytes(self) -> usize {
        match self.codes {
            Codes::Bytes => self.codes_at() + self.sub * LANES,
            Codes::Nibbles(p) => self.planes_at() + self.sub * p * 2,
        }
    }
}

/// One cache line of packed bytes (keeps records 64-byte aligned).
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
/// `e` dequantizes to `fma(codes[e], scales[e / sub], offsets[e / sub])`.
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
                let bias = match qtype {
                    QType::Q4_0 => 8,
                    QType::Q5_0 => 16,
                    _ => 0,
                };
                rc.codes.extend(w.iter().map(|&q| i16::from(q) + bias));
                rc.scales.push(d);
                rc.offsets.push(-f32::from(bias) * d);
            }
            _ => {
                let sb = decode_superblock(qtype, blk);
                match qtype {
                    QType::Q8_K => rc.codes.extend(sb.q.iter().map(|&q| i16::from(q as i8))),
                    _ => rc.codes.extend(sb.q.iter().map(|&q| i16::from(q))),
                }
                for s in (0..16).step_by(format.sub / 16) {
                    let scale = sb.d * f32::from(sb.scales[s]);
                    rc.scales.push(scale);
                    rc.offsets.push(match qtype {
                        QType::Q6_K => -32.0 * scale,
                        QType::Q8_K => 0.0,
                        _ => -(sb.dmin * f32::from(sb.mins[s])),
                    });
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
        let mut lines = vec![Line([0; 64]); groups * group_bytes / 64];
        let row_bytes = w.as_bytes().len() / n;
        let bytes = lines_as_bytes_mut(&mut lines);
        for (r, row) in w.as_bytes().chunks_exact(row_bytes).enumerate() {
            let rc = row_codes(qtype, format, row, k);
            let group = &mut bytes[r / LANES * group_bytes..][..group_bytes];
            put_row(format, &rc, r % LANES, group);
        }
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
        self.lines.len() * 64
    }

    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// Bytes of one group's records.
    pub(crate) fn group_bytes(&self) -> usize {
        self.k / self.format.sub * self.format.record_bytes()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        lines_as_bytes(&self.lines)
    }

    /// Row `row`, dequantized (the same values as
    /// [`QMatrix::dequantize_row`] gives for the packed matrix).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.n {
            return Err(KernelError::RowOutOfRange { row, n: self.n });
        }
        check_len("output", out.len(), Some(self.k))?;
        let group = &self.bytes()[row / LANES * self.group_bytes()..][..self.group_bytes()];
        decode_lane(self.format, group, row % LANES, out);
        Ok(())
    }

    /// `out = x · Wᵀ` (`x`: `m × k` row-major, `out`: `m × n`), with the
    /// fastest implementation of this CPU; every implementation gives the
    /// same bits (module docs).
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::detect(), x, m, out)
    }

    /// [`LaneMatrix::matmul`] on a chosen implementation: [`Isa::Scalar`]
    /// runs the portable loop, any other the AVX-512 tiles where the CPU has
    /// AVX-512 F, else the AVX2 ones.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        if !isa.is_available() {
            return Err(KernelError::IsaUnavailable(isa));
        }
        check_len("activations", x.len(), m.checked_mul(self.k))?;
        check_len("output", out.len(), m.checked_mul(self.n))?;
        if m == 0 {
            return Ok(());
        }
        self.run(isa, x, m, out);
        Ok(())
    }

    /// Splits the groups between threads and computes `out`.
    fn run(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, groups) = (self.n, self.n.div_ceil(LANES));
        let threads = rayon::current_num_threads();
        let macs = m.saturating_mul(self.k).saturating_mul(n);
        let chunk = groups
            .div_ceil(threads * TASKS_PER_THREAD)
            .max(TASK_MIN_GROUPS);
        if threads <= 1 || macs < PARALLEL_MIN_MACS || chunk >= groups {
            let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
            self.groups(isa, x, 0, &mut outs);
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
            .for_each(|(g0, mut outs)| self.groups(isa, x, g0, &mut outs));
    }

    /// Groups `g0..` covering `outs[r]` (output rows `16·g0..`) for every
    /// activation row `r`.
    fn groups(&self, isa: Isa, x: &[f32], g0: usize, outs: &mut [&mut [f32]]) {
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar {
            crate::lanes_x86::groups(self, x, g0, outs);
            return;
        }
        debug_assert!(isa == Isa::Scalar || !cfg!(target_arch = "x86_64"));
        let gb = self.group_bytes();
        let mut w = vec![0f32; self.k];
        let cols = outs.first().map_or(0, |o| o.len());
        for col in 0..cols {
            let (g, lane) = (g0 + col / LANES, col % LANES);
            decode_lane(self.format, &self.bytes()[g * gb..][..gb], lane, &mut w);
            for (out, x) in outs.iter_mut().zip(x.chunks_exact(self.k)) {
                out[col] = w
                    .iter()
                    .zip(x)
                    .fold(0f32, |acc, (&w, &x)| w.mul_add(x, acc));
            }
        }
    }
}

/// Writes row `rc` into lane `lane` of a group's records.
fn put_row(format: Format, rc: &RowCodes, lane: usize, group: &mut [u8]) {
    let rec = format.record_bytes();
    let lane_bit = 1u16 << lane;
    for (s, record) in group.chunks_exact_mut(rec).enumerate() {
        let at = 4 * lane;
        record[at..at + 4].copy_from_slice(&rc.scales[s].to_le_bytes());
        if format.bias.is_none() {
            let at = VEC_BYTES + 4 * lane;
            record[at..at + 4].copy_from_slice(&rc.offsets[s].to_le_bytes());
        }
        let codes = &rc.codes[s * format.sub..][..format.sub];
        for (e, &c) in codes.iter().enumerate() {
            match format.codes {
                Codes::Bytes => record[format.codes_at() + e * LANES + lane] = c as i8 as u8,
                Codes::Nibbles(planes) => {
                    let nib = (c as u8 & 0x0F) << (4 * (e % 2));
                    record[format.codes_at() + e / 2 * LANES + lane] |= nib;
                    for p in 0..planes {
                        if (c >> (4 + p)) & 1 == 1 {
                            let at = format.planes_at() + (e * planes + p) * 2;
                            let mask = u16::from_le_bytes([record[at], record[at + 1]]) | lane_bit;
                            record[at..at + 2].copy_from_slice(&mask.to_le_bytes());
                        }
                    }
                }
            }
        }
    }
}

/// The code of element `e` of lane `lane` in a record.
fn code_at(format: Format, record: &[u8], e: usize, lane: usize) -> f32 {
    match format.codes {
        Codes::Bytes => f32::from(record[format.codes_at() + e * LANES + lane] as i8),
        Codes::Nibbles(planes) => {
            let byte = record[format.codes_at() + e / 2 * LANES + lane];
            let mut c = u16::from((byte >> (4 * (e % 2))) & 0x0F);
            for p in 0..planes {
                let at = format.planes_at() + (e * planes + p) * 2;
                let mask = u16::from_le_bytes([record[at], record[at + 1]]);
                c |= ((mask >> lane) & 1) << (4 + p);
            }
            f32::from(c)
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
        let scale = f32_at(record, 4 * lane);
        let offset = match format.bias {
            Some(b) => scale * -b,
            None => f32_at(record, VEC_BYTES + 4 * lane),
        };
        for (e, o) in out.iter_mut().enumerate() {
            *o = code_at(format, record, e, lane).mul_add(scale, offset);
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
