//! Q4_0, Q5_0 and Q8_0 weights against Q8_0-quantized activations.
//!
//! All three formats unpack a block of 32 weights to signed bytes `w` with an
//! f16 scale `dw`. Per block and activation row the integer dot `Σ w·x` is
//! exact; it is then scaled by `dw * dx` and accumulated in f32:
//!
//! * AVX2 (`q8_x86`): eight exact `i32` lane sums of four products each are
//!   converted to f32 and FMA'd into an 8-lane accumulator
//!   (`acc = fma(dw*dx, lanes, acc)`, as ggml), then summed by a fixed tree.
//! * Scalar: `acc += (dw * dx) * Σ w·x`, one f32 per output.

use half::f16;

use crate::qtype::{QType, QK8_0};
use crate::quantize::Q8_0Acts;

/// Unpacks one Q4_0 / Q5_0 / Q8_0 block into 32 signed weights, returning
/// the block scale.
pub(crate) fn decode_block(qtype: QType, blk: &[u8], w: &mut [i8; QK8_0]) -> f32 {
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
    match qtype {
        QType::Q4_0 => {
            let qs = &blk[2..18];
            for (l, &q) in qs.iter().enumerate() {
                w[l] = (q & 0x0F) as i8 - 8;
                w[l + 16] = (q >> 4) as i8 - 8;
            }
        }
        QType::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let qs = &blk[6..22];
            for (l, &q) in qs.iter().enumerate() {
                let h0 = ((qh >> l) & 1) as u8;
                let h1 = ((qh >> (l + 16)) & 1) as u8;
                w[l] = ((q & 0x0F) | (h0 << 4)) as i8 - 16;
                w[l + 16] = ((q >> 4) | (h1 << 4)) as i8 - 16;
            }
        }
        _ => {
            for (wi, &q) in w.iter_mut().zip(&blk[2..34]) {
                *wi = q as i8;
            }
        }
    }
    d
}

/// Portable path: output rows of `w` (whole rows of `qtype` bytes) against
/// all activation rows; `outs[r][j]` receives row `r` · weight row `j`.
pub(crate) fn rows_scalar(
    qtype: QType,
    w: &[u8],
    k: usize,
    acts: &Q8_0Acts,
    outs: &mut [&mut [f32]],
) {
    let nb = k / QK8_0;
    let bb = qtype.block_bytes();
    let mut wq = vec![0i8; k];
    let mut wd = vec![0f32; nb];
    for (j, wrow) in w.chunks_exact(nb * bb).enumerate() {
        for ((blk, q), d) in wrow
            .chunks_exact(bb)
            .zip(wq.chunks_exact_mut(QK8_0))
            .zip(&mut wd)
        {
            let mut block = [0i8; QK8_0];
            *d = decode_block(qtype, blk, &mut block);
            q.copy_from_slice(&block);
        }
        for (r, out) in outs.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (b, (wb, &dw)) in wq.chunks_exact(QK8_0).zip(&wd).enumerate() {
                let xb = acts.codes(b, r, 1);
                let isum: i32 = wb
                    .iter()
                    .zip(xb)
                    .map(|(&a, &b)| i32::from(a) * i32::from(b))
                    .sum();
                acc += (dw * acts.scales(b, r, 1)[0]) * isum as f32;
            }
            out[j] = acc;
        }
    }
}
