//! Q4_K, Q5_K, Q6_K and Q8_K weights against Q8_K-quantized activations:
//! super-block decoding and the portable kernel.
//!
//! Every k-quant super-block of 256 weights is described uniformly per group
//! of 16 elements `g`: codes `q` (unsigned for Q4_K/Q5_K/Q6_K, two's
//! complement for Q8_K), an integer scale `s[g]` and an integer `mins[g]`
//! that multiplies the activation group sum `bsum[g]`:
//!
//! * Q4_K / Q5_K: `w = d·sc·q − dmin·mn`, so `s[g] = sc`, `mins[g] = mn`
//!   (one 6-bit pair per 32) and `w·x` sums to
//!   `dx·(d·Σ s·q·x − dmin·Σ mins·bsum)`;
//! * Q6_K: `w = d·s·(q − 32)`, so `mins[g] = 32·s[g]` and the offset is
//!   folded into the integer sum: `dx·d·(Σ s·q·x − Σ mins·bsum)`;
//! * Q8_K: `w = d·q`, `s[g] = 1`, no mins.
//!
//! The integer sums are exact; the f32 steps per super-block are fixed
//! (see [`rows_scalar`] and the AVX2 kernel in `kquants_avx2`).

use half::f16;

use crate::qtype::{QType, QK_K};
use crate::quantize::Q8KActs;

/// One decoded k-quant super-block in element order.
pub(crate) struct SuperBlock {
    /// Codes; for Q8_K the bytes are two's complement `i8`.
    pub(crate) q: [u8; QK_K],
    /// Integer scale per group of 16 elements.
    pub(crate) scales: [i16; 16],
    /// Multiplier of each activation group sum (see the module docs).
    pub(crate) mins: [i16; 16],
    /// Super-block scale.
    pub(crate) d: f32,
    /// Super-block scale of the mins (Q4_K / Q5_K only, else 0).
    pub(crate) dmin: f32,
}

fn f16_at(s: &[u8]) -> f32 {
    f16::from_le_bytes([s[0], s[1]]).to_f32()
}

/// Unpacks the 12 bytes of Q4_K / Q5_K 6-bit scales and mins into
/// `(scales, mins)` for the 8 sub-blocks of 32 (ggml's `get_scale_min_k4`).
#[inline]
pub(crate) fn unpack_scales_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let sc_lo = w0 & LOW6;
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let mn_lo = w1 & LOW6;
    let mn_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// Decodes one super-block of `qtype` (a k-quant) from `blk`.
pub(crate) fn decode_superblock(qtype: QType, blk: &[u8]) -> SuperBlock {
    let mut sb = SuperBlock {
        q: [0; QK_K],
        scales: [0; 16],
        mins: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
    match qtype {
        QType::Q4_K | QType::Q5_K => {
            sb.d = f16_at(&blk[0..2]);
            sb.dmin = f16_at(&blk[2..4]);
            let (sc, mn) = unpack_scales_k4(&blk[4..16]);
            for g in 0..16 {
                sb.scales[g] = i16::from(sc[g / 2]);
                sb.mins[g] = i16::from(mn[g / 2]);
            }
            let (qh, qs) = if qtype == QType::Q5_K {
                (Some(&blk[16..48]), &blk[48..176])
            } else {
                (None, &blk[16..144])
            };
            for j in 0..4 {
                for l in 0..32 {
                    let byte = qs[32 * j + l];
                    let (h0, h1) = qh.map_or((0, 0), |qh| {
                        ((qh[l] >> (2 * j)) & 1, (qh[l] >> (2 * j + 1)) & 1)
                    });
                    sb.q[64 * j + l] = (byte & 0x0F) | (h0 << 4);
                    sb.q[64 * j + 32 + l] = (byte >> 4) | (h1 << 4);
                }
            }
        }
        QType::Q6_K => {
            let (ql, qh) = (&blk[0..128], &blk[128..192]);
            for (g, &s) in blk[192..208].iter().enumerate() {
                sb.scales[g] = i16::from(s as i8);
                sb.mins[g] = 32 * sb.scales[g];
            }
            sb.d = f16_at(&blk[208..210]);
            for half in 0..2 {
                let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                let q = &mut sb.q[128 * half..];
                for l in 0..32 {
                    q[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                    q[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                    q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
        }
        _ => {
            sb.d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
            sb.q.copy_from_slice(&blk[4..260]);
            sb.scales = [1; 16];
        }
    }
    sb
}

/// Integer part of one super-block pair: `(Σ s·q·x, Σ mins·bsum)`.
fn superblock_sums(qtype: QType, sb: &SuperBlock, x: &[i8], bsums: &[i16]) -> (i32, i32) {
    let signed = qtype == QType::Q8_K;
    let mut sumi = 0i32;
    for ((q, x), &s) in
        sb.q.chunks_exact(16)
            .zip(x.chunks_exact(16))
            .zip(&sb.scales)
    {
        let dot: i32 = q
            .iter()
            .zip(x)
            .map(|(&q, &x)| {
                let q = if signed {
                    i32::from(q as i8)
                } else {
                    i32::from(q)
                };
                q * i32::from(x)
            })
            .sum();
        sumi += i32::from(s) * dot;
    }
    let summ = sb
        .mins
        .iter()
        .zip(bsums)
        .map(|(&m, &b)| i32::from(m) * i32::from(b))
        .sum();
    (sumi, summ)
}

/// Portable path: output rows of `w` (whole rows of `qtype` bytes) against
/// all activation rows; `outs[r][j]` receives row `r` · weight row `j`.
///
/// Per super-block, with `(sumi, summ)` the exact integer sums:
/// Q4_K / Q5_K: `acc += (d·dx)·sumi; acc += −(dmin·dx)·summ`;
/// Q6_K: `acc += (d·dx)·(sumi − summ)`; Q8_K: `acc += (d·dx)·sumi`.
pub(crate) fn rows_scalar(
    qtype: QType,
    w: &[u8],
    k: usize,
    acts: &Q8KActs,
    outs: &mut [&mut [f32]],
) {
    let bb = qtype.block_bytes();
    let nsb = k / QK_K;
    for (j, wrow) in w.chunks_exact(nsb * bb).enumerate() {
        let blocks: Vec<SuperBlock> = wrow
            .chunks_exact(bb)
            .map(|b| decode_superblock(qtype, b))
            .collect();
        for (r, out) in outs.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (b, sb) in blocks.iter().enumerate() {
                let dx = acts.scales(b, r)[0];
                let (sumi, summ) =
                    superblock_sums(qtype, sb, acts.codes(b, r, 1), acts.bsums(b, r, 1));
                match qtype {
                    QType::Q4_K | QType::Q5_K => {
                        acc += (sb.d * dx) * sumi as f32;
                        acc += -(sb.dmin * dx) * summ as f32;
                    }
                    QType::Q6_K => acc += (sb.d * dx) * (sumi - summ) as f32,
                    _ => acc += (sb.d * dx) * sumi as f32,
                }
            }
            out[j] = acc;
        }
    }
}
