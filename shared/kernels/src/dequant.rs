//! Dequantization of whole rows to `f32`, following ggml's
//! `dequantize_row_*` formulas.

use crate::kquants::decode_superblock;
use crate::q8::decode_block;
use crate::qtype::{QType, QK8_0, QK_K};

/// Dequantizes one row (`row` holds whole blocks of `qtype`) into `out`
/// (`out.len()` elements).
pub(crate) fn dequantize_row(qtype: QType, row: &[u8], out: &mut [f32]) {
    let bb = qtype.block_bytes();
    match qtype {
        QType::F32 | QType::F16 => crate::float::decode_row(qtype, row, out),
        QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => {
            for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK8_0)) {
                let mut w = [0i8; QK8_0];
                let d = decode_block(qtype, blk, &mut w);
                for (o, &q) in o.iter_mut().zip(&w) {
                    *o = f32::from(q) * d;
                }
            }
        }
        QType::Q4_K | QType::Q5_K | QType::Q6_K | QType::Q8_K => {
            for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
                let sb = decode_superblock(qtype, blk);
                let groups = o.chunks_exact_mut(16).zip(sb.q.chunks_exact(16));
                for ((o, q), (&s, &m)) in groups.zip(sb.scales.iter().zip(&sb.mins)) {
                    let (scale, min) = (sb.d * f32::from(s), sb.dmin * f32::from(m));
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = match qtype {
                            QType::Q6_K => scale * f32::from(i16::from(q) - 32),
                            QType::Q8_K => sb.d * f32::from(q as i8),
                            _ => scale * f32::from(q) - min,
                        };
                    }
                }
            }
        }
    }
}
