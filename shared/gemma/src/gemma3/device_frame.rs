//! What the layers of one [`super::DeviceGemma3`] forward share ([`Context`]: rotations and
//! attention masks for the block's positions) and where each layer stores the block's keys
//! and values ([`Store`]): appended at host-known positions by the plain forward, scattered
//! to device-held positions by a fixed-shape step, or scattered to the slots of a pool and
//! gathered back from them by a batched step ([`super::device_batch`]).

use candle_core::{Device, Tensor};

use super::device::DeviceGemma3;
use crate::error::Result;
use crate::ops::Rope;

/// Where a layer puts a block's keys and values in its cache ([`append`], or
/// [`crate::fused::qkv_heads`]), and which cached positions it attends to.
pub(super) enum Store {
    /// At positions `pos..pos + m`, attending to the first `pos + m`.
    Append(usize),
    /// At the positions `pos` holds (`[m]` u32, one sequence), attending to the first
    /// `span` (the mask hides the rest).
    Scatter { pos: Tensor, span: usize },
    /// At the rows `store` holds (`[b * m]` u32) of a pool of slots (`[1, rows, kv_heads,
    /// head_dim]`), each of the `b` sequences then attending to the rows `gather` holds
    /// (`[b * span]` u32: its slot's first `span` positions).
    Pooled {
        store: Tensor,
        gather: Tensor,
        span: usize,
    },
}

/// The keys and values `[b, span, kv_heads, head_dim]` at rows `gather` (`[b * span]` u32)
/// of a pool's `(keys, values)` (`[1, rows, kv_heads, head_dim]`).
pub(super) fn gathered(
    (keys, values): (&Tensor, &Tensor),
    gather: &Tensor,
    (b, span): (usize, usize),
) -> Result<(Tensor, Tensor)> {
    let pick = |t: &Tensor| -> Result<Tensor> {
        let (_, _, heads, hd) = t.dims4()?;
        Ok(t.squeeze(0)?
            .index_select(gather, 0)?
            .reshape((b, span, heads, hd))?)
    };
    Ok((pick(keys)?, pick(values)?))
}

/// Stores a block's keys and values `k`, `v` (`[b, m, kv_heads, head_dim]`) at positions
/// `pos..` of a layer's cache `(keys, values)` and returns the keys and values up to the
/// block's last.
pub(super) fn append(
    (keys, values): (&Tensor, &Tensor),
    k: &Tensor,
    v: &Tensor,
    pos: usize,
) -> Result<(Tensor, Tensor)> {
    keys.slice_set(k, 1, pos)?;
    values.slice_set(v, 1, pos)?;
    visible((keys, values), pos + k.dim(1)?)
}

/// The first `len` positions of a layer's cache `(keys, values)`.
pub(super) fn visible((keys, values): (&Tensor, &Tensor), len: usize) -> Result<(Tensor, Tensor)> {
    Ok((keys.narrow(1, 0, len)?, values.narrow(1, 0, len)?))
}

/// What every layer of one forward shares: rotation tables and attention masks for the
/// block's positions.
pub(super) struct Context {
    pub(super) m: usize,
    /// Sequences.
    pub(super) b: usize,
    pub(super) local: (Tensor, Tensor),
    pub(super) global: (Tensor, Tensor),
    /// Additive masks, rows position-major, broadcast over sequences and key heads: `[m *
    /// heads / kv_heads, keys]` or `[b, 1, m * heads / kv_heads, keys]` (`None`: every key
    /// visible).
    pub(super) local_mask: Option<Tensor>,
    pub(super) global_mask: Option<Tensor>,
}

impl Context {
    /// The rotations and masks of `b` sequences' blocks of `m` positions from `pos`.
    pub(super) fn new(model: &DeviceGemma3, pos: usize, m: usize, b: usize) -> Result<Self> {
        let tables = |rope: &Rope| -> Result<(Tensor, Tensor)> {
            let (cos, sin) = rope.angles(pos, m).into_tables();
            let half = model.cfg.head_dim / 2;
            Ok((model.upload(cos, (m, half))?, model.upload(sin, (m, half))?))
        };
        let group = model.cfg.num_attention_heads / model.cfg.num_key_value_heads;
        let mask = |window: Option<usize>| -> Result<Option<Tensor>> {
            let len = pos + m;
            let visible = |r: usize, j: usize| {
                let p = pos + r;
                j <= p && window.is_none_or(|w| j + w > p)
            };
            if (0..m).all(|r| (0..len).all(|j| visible(r, j))) {
                return Ok(None);
            }
            let rows: Vec<f32> = (0..group * m)
                .flat_map(|i| (0..len).map(move |j| (i / group, j)))
                .map(|(r, j)| {
                    if visible(r, j) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let t = Tensor::from_vec(rows, (group * m, len), &Device::Cpu)?;
            Ok(Some(t.to_device(&model.opts.device)?))
        };
        Ok(Self {
            m,
            b,
            local: tables(&model.rope_local)?,
            global: tables(&model.rope_global)?,
            local_mask: mask(Some(model.cfg.sliding_window))?,
            global_mask: mask(None)?,
        })
    }
}
