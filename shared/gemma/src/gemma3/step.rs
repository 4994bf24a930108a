//! The CPU forward of [`Gemma3`] over a ragged batch: the blocks of several sequences, each
//! with its own tokens, positions and KV cache, in one pass over the weights (iteration-level
//! batching as in Orca, Yu et al., OSDI 2022). The projections take all rows together, so a
//! weight read serves every sequence; rotary embedding and attention run per sequence against
//! its own cache. Every row's arithmetic is the row-wise kernels', so each sequence's output
//! equals its own forward bit for bit whatever shares the pass — one sequence's forward is
//! this forward with one segment.

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use tandem_kernels::TopRow;

use super::bounded::BoundedRow;
use super::kv_cache::KvCache;
use super::model::{ForwardOptions, ForwardOutput, Gemma3, Layer, LogitsMode};
use crate::attention::{attend, AttnSpec};
use crate::error::{GemmaError, Result};
use crate::ops::{gelu_tanh_mul, rms_norm, rms_norm_rows, softcap, RopeAngles};

/// One sequence's block in a ragged forward.
pub struct Segment<'a> {
    /// The block's tokens (at least one).
    pub tokens: &'a [u32],
    /// The position of its first token: what `cache` holds.
    pub pos: usize,
    /// The sequence's cache, which the block's keys and values are appended to.
    pub cache: &'a mut KvCache,
    /// What the forward returns for this block.
    pub opts: &'a ForwardOptions,
}

/// A segment's logits, top rows or bounded rows (one of them, or none).
struct HeadOutput {
    logits: Option<Tensor>,
    top: Option<Vec<TopRow>>,
    bounded: Vec<BoundedRow>,
}

/// Where a segment's rows sit in the batch and the rotary angles of its positions.
struct Span {
    start: usize,
    m: usize,
    pos: usize,
    local: RopeAngles,
    global: RopeAngles,
}

impl Gemma3 {
    /// Runs `tokens` at positions `pos..pos+m`, appending their keys and values to `cache`
    /// (which must hold exactly `pos` positions).
    pub fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        let mut one = [Segment {
            tokens,
            pos,
            cache,
            opts,
        }];
        let mut outs = self.forward_ragged(&mut one)?;
        Ok(outs.remove(0))
    }

    /// Fails where [`Self::forward_ragged`] would refuse `seg`: an empty block, a token
    /// outside the vocabulary, a tap past the last layer, a block that does not start at
    /// the cache's end or does not fit it.
    pub fn check_segment(&self, seg: &Segment<'_>) -> Result<()> {
        if seg.tokens.is_empty() {
            return Err(GemmaError::Request("empty block".into()));
        }
        self.check_tokens(seg.tokens)?;
        if let Some(t) = seg
            .opts
            .taps
            .iter()
            .find(|t| **t > self.cfg.num_hidden_layers)
        {
            return Err(GemmaError::Request(format!(
                "tap {t} is out of range (the model has {} layers)",
                self.cfg.num_hidden_layers
            )));
        }
        seg.cache.check_append(seg.pos, seg.tokens.len())
    }

    /// Runs every segment's block in one pass and returns their outputs in order, each
    /// bit for bit what [`Self::forward`] of that segment alone returns. Fails, changing no
    /// cache, if any segment fails [`Self::check_segment`].
    pub fn forward_ragged(&self, segs: &mut [Segment<'_>]) -> Result<Vec<ForwardOutput>> {
        segs.iter().try_for_each(|s| self.check_segment(s))?;
        // Run the whole forward on a pool worker: every matmul then starts on an awake
        // thread instead of waking the pool from outside (measured: ~3 ms of 12 per token).
        rayon::scope(|_| self.run_segments(segs))
    }

    fn run_segments(&self, segs: &mut [Segment<'_>]) -> Result<Vec<ForwardOutput>> {
        let h = self.cfg.hidden_size;
        let mut spans = Vec::with_capacity(segs.len());
        let mut start = 0;
        for s in segs.iter() {
            let m = s.tokens.len();
            spans.push(Span {
                start,
                m,
                pos: s.pos,
                local: self.rope_local.angles(s.pos, m),
                global: self.rope_global.angles(s.pos, m),
            });
            start += m;
        }
        let mut x = vec![0f32; start * h];
        let tokens = segs.iter().flat_map(|s| s.tokens.iter());
        for (row, t) in x.chunks_exact_mut(h).zip(tokens) {
            self.embed_into(*t, row)?;
        }
        let mut saved: Vec<Option<Vec<f32>>> = vec![None; self.cfg.num_hidden_layers];
        for (i, layer) in self.layers.iter().enumerate() {
            if let Err(e) = self.layer_forward(layer, i, &mut x, &spans, segs) {
                segs.iter_mut().for_each(|s| s.cache.discard_uncommitted());
                return Err(e);
            }
            if segs.iter().any(|s| s.opts.taps.contains(&i)) {
                saved[i] = Some(x.clone());
            }
        }
        for (s, span) in segs.iter_mut().zip(&spans) {
            s.cache.commit(span.m);
        }
        let normed = rms_norm(&x, &self.final_norm, self.cfg.rms_norm_eps as f32);
        let heads = self.heads(&normed, segs, &spans)?;
        segs.iter()
            .zip(&spans)
            .zip(heads)
            .map(|((s, span), head)| {
                let rows = |all: &[f32]| all[span.start * h..][..span.m * h].to_vec();
                let tensor = |v: Vec<f32>| Tensor::from_vec(v, (span.m, h), &Device::Cpu);
                let taps = s
                    .opts
                    .taps
                    .iter()
                    .map(|t| {
                        tensor(rows(
                            saved.get(*t).and_then(Option::as_deref).unwrap_or(&normed),
                        ))
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Ok(ForwardOutput {
                    logits: head.logits,
                    top: head.top,
                    bounded: head.bounded,
                    taps,
                    last_hidden: tensor(rows(&normed))?,
                })
            })
            .collect()
    }

    /// Each segment's logits, top rows or bounded row as its [`LogitsMode`] asks: the rows
    /// that need full logits go through the head in one product; the [`LogitsMode::Top`]
    /// rows of the whole step go through the screen, one call per `k`, when the step has
    /// two or more of them (one row is bound by reading the head either way) and the model
    /// has a screen; the bounded rows ([`LogitsMode::Bounded`], [`LogitsMode::BoundedAll`])
    /// through the screen's bounds, one call,
    /// whenever the model has a screen (a row's bounds are its own, so a draw from them is
    /// the same alone or batched). A segment's top rows are the same whether it was
    /// screened alone or with others; a one-row segment screened with others gets top rows
    /// where alone it gets logits (the same largest logits, bit for bit).
    fn heads(
        &self,
        normed: &[f32],
        segs: &[Segment<'_>],
        spans: &[Span],
    ) -> Result<Vec<HeadOutput>> {
        let h = self.cfg.hidden_size;
        let top_rows: usize = segs
            .iter()
            .zip(spans)
            .filter(|(s, _)| matches!(s.opts.logits, LogitsMode::Top(_)))
            .map(|(_, sp)| sp.m)
            .sum();
        let screen = self.screens(top_rows);
        let bounds = self.screen.is_some();
        let last = |span: &Span| span.start + span.m - 1..span.start + span.m;
        let full_rows = |s: &Segment<'_>, span: &Span| match s.opts.logits {
            LogitsMode::All => span.start..span.start + span.m,
            LogitsMode::Last => last(span),
            LogitsMode::Bounded if !bounds => last(span),
            LogitsMode::BoundedAll if !bounds => span.start..span.start + span.m,
            LogitsMode::Top(_) if !screen => span.start..span.start + span.m,
            LogitsMode::Top(_)
            | LogitsMode::Bounded
            | LogitsMode::BoundedAll
            | LogitsMode::None => 0..0,
        };
        let ranges: Vec<_> = segs
            .iter()
            .zip(spans)
            .map(|(s, sp)| full_rows(s, sp))
            .collect();
        let gather = |rs: &mut dyn Iterator<Item = std::ops::Range<usize>>| -> Vec<f32> {
            rs.flat_map(|r| normed[r.start * h..r.end * h].iter().copied())
                .collect()
        };
        let full = gather(&mut ranges.iter().cloned());
        let mut logits = self.logits(&full, full.len() / h)?.into_iter();
        let mut tops = match screen {
            true => self.screened(segs, spans, normed)?,
            false => vec![None; segs.len()],
        };
        let mut bounded = match bounds {
            true => self.bounded(segs, spans, normed)?,
            false => vec![Vec::new(); segs.len()],
        };
        let mut out = Vec::with_capacity(segs.len());
        for (i, r) in ranges.iter().enumerate() {
            let rows = r.len();
            let full = (rows > 0)
                .then(|| {
                    let v: Vec<f32> = logits.by_ref().take(rows * self.cfg.vocab_size).collect();
                    Tensor::from_vec(v, (rows, self.cfg.vocab_size), &Device::Cpu)
                })
                .transpose()?;
            out.push(HeadOutput {
                logits: full,
                top: tops[i].take(),
                bounded: std::mem::take(&mut bounded[i]),
            });
        }
        Ok(out)
    }

    /// The bounded rows of every segment that asks for them (the last position of a
    /// [`LogitsMode::Bounded`] one, every position of a [`LogitsMode::BoundedAll`] one),
    /// all bounded in one call of the screen.
    fn bounded(
        &self,
        segs: &[Segment<'_>],
        spans: &[Span],
        normed: &[f32],
    ) -> Result<Vec<Vec<BoundedRow>>> {
        let h = self.cfg.hidden_size;
        let mut out = vec![Vec::new(); segs.len()];
        let positions = |i: usize| {
            let span = &spans[i];
            match segs[i].opts.logits {
                LogitsMode::Bounded => span.start + span.m - 1..span.start + span.m,
                LogitsMode::BoundedAll => span.start..span.start + span.m,
                _ => 0..0,
            }
        };
        let members: Vec<(usize, usize)> = (0..segs.len())
            .flat_map(|i| positions(i).map(move |r| (i, r)))
            .collect();
        let (Some(screen), Some(w), false) =
            (&self.screen, self.head.head().lanes(), members.is_empty())
        else {
            return Ok(out);
        };
        let row = |r: usize| &normed[r * h..][..h];
        let x: Vec<f32> = members
            .iter()
            .flat_map(|&(_, r)| row(r).iter().copied())
            .collect();
        let rows = screen.upper_rows(w, &x, members.len())?;
        for ((i, r), upper) in members.into_iter().zip(rows) {
            let head = std::sync::Arc::clone(self.head.head());
            out[i].push(BoundedRow::new(upper, head, row(r).to_vec()));
        }
        Ok(out)
    }

    /// The top rows of every [`LogitsMode::Top`] segment, the rows of each `k` screened in
    /// one call.
    fn screened(
        &self,
        segs: &[Segment<'_>],
        spans: &[Span],
        normed: &[f32],
    ) -> Result<Vec<Option<Vec<TopRow>>>> {
        let h = self.cfg.hidden_size;
        let mut out = vec![None; segs.len()];
        let mut ks: Vec<usize> = segs
            .iter()
            .filter_map(|s| match s.opts.logits {
                LogitsMode::Top(k) => Some(k),
                _ => None,
            })
            .collect();
        ks.sort_unstable();
        ks.dedup();
        for k in ks {
            let members: Vec<usize> = (0..segs.len())
                .filter(|&i| segs[i].opts.logits == LogitsMode::Top(k))
                .collect();
            let x: Vec<f32> = members
                .iter()
                .flat_map(|&i| {
                    normed[spans[i].start * h..][..spans[i].m * h]
                        .iter()
                        .copied()
                })
                .collect();
            let mut rows = self.top(&x, x.len() / h, k)?.into_iter();
            for i in members {
                out[i] = Some(rows.by_ref().take(spans[i].m).collect());
            }
        }
        Ok(out)
    }

    /// The final logits of `rows` normed rows, soft-capped as the config says.
    fn logits(&self, normed: &[f32], rows: usize) -> Result<Vec<f32>> {
        if rows == 0 {
            return Ok(Vec::new());
        }
        let mut out = self.head.head().matmul(normed, rows)?;
        if let Some(cap) = self.cfg.final_logit_softcapping {
            softcap(&mut out, cap as f32);
        }
        Ok(out)
    }

    /// Whether a block of `rows` rows gets its top logits through the screen (several rows
    /// and a model with a screen; one row is bound by reading the head either way).
    fn screens(&self, rows: usize) -> bool {
        rows >= 2 && self.screen.is_some() && self.head.head().lanes().is_some()
    }

    /// The logits that can rank among each row's `k` largest, through the screen.
    fn top(&self, normed: &[f32], rows: usize, k: usize) -> Result<Vec<TopRow>> {
        match (&self.screen, self.head.head().lanes()) {
            (Some(screen), Some(w)) => Ok(screen.top_rows(w, normed, rows, k)?.rows),
            _ => Err(GemmaError::Request("the model has no screen".into())),
        }
    }

    fn layer_forward(
        &self,
        l: &Layer,
        idx: usize,
        x: &mut [f32],
        spans: &[Span],
        segs: &mut [Segment<'_>],
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
        let m = x.len() / h;
        let normed = rms_norm(x, &l.attn_norm, eps);
        let mut q = l.q.matmul(&normed, m)?;
        let mut k = l.k.matmul(&normed, m)?;
        let v = l.v.matmul(&normed, m)?;
        rms_norm_rows(&mut q, &l.q_norm, eps);
        rms_norm_rows(&mut k, &l.k_norm, eps);
        let attn = self.attend_segments(l, idx, &mut q, &mut k, &v, spans, segs);
        let mut o = l.o.matmul(&attn, m)?;
        rms_norm_rows(&mut o, &l.post_attn_norm, eps);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

        let normed = rms_norm(x, &l.pre_ffn_norm, eps);
        let mut gate = l.gate.matmul(&normed, m)?;
        let up = l.up.matmul(&normed, m)?;
        gelu_tanh_mul(&mut gate, &up);
        let mut down = l.down.matmul(&gate, m)?;
        rms_norm_rows(&mut down, &l.post_ffn_norm, eps);
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// Rotates each segment's queries and keys for its positions, appends its keys and
    /// values to its cache and attends over that cache; segments run in parallel.
    #[allow(clippy::too_many_arguments)]
    fn attend_segments(
        &self,
        l: &Layer,
        idx: usize,
        q: &mut [f32],
        k: &mut [f32],
        v: &[f32],
        spans: &[Span],
        segs: &mut [Segment<'_>],
    ) -> Vec<f32> {
        let (qd, kd) = (self.cfg.q_dim(), self.cfg.kv_dim());
        let mut attn = vec![0f32; q.len()];
        let outs = split_rows(&mut attn, spans, qd);
        let qs = split_rows(q, spans, qd);
        let ks = split_rows(k, spans, kd);
        segs.par_iter_mut()
            .zip(spans)
            .zip(outs)
            .zip(qs.into_par_iter().zip(ks))
            .for_each(|(((seg, span), out), (qs, ks))| {
                let angles = if l.sliding { &span.local } else { &span.global };
                let rows = qs.chunks_exact_mut(qd).zip(ks.chunks_exact_mut(kd));
                for (r, (qr, kr)) in rows.enumerate() {
                    angles.apply(qr, r);
                    angles.apply(kr, r);
                }
                let kv = seg.cache.layer_mut(idx);
                kv.k.extend_from_slice(ks);
                kv.v.extend_from_slice(&v[span.start * kd..][..span.m * kd]);
                out.copy_from_slice(&attend(qs, &kv.k, &kv.v, self.attn_spec(l, span.pos)));
            });
        attn
    }

    /// The attention of layer `l` for a block starting at absolute position `pos0`.
    fn attn_spec(&self, l: &Layer, pos0: usize) -> AttnSpec {
        let cfg = &self.cfg;
        AttnSpec {
            pos0,
            n_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            scale: (cfg.query_pre_attn_scalar as f32).powf(-0.5),
            window: l.sliding.then_some(cfg.sliding_window),
            softcap: cfg.attn_logit_softcapping.map(|c| c as f32),
        }
    }
}

/// `data`'s rows of width `width` cut into each span's rows, in span order.
fn split_rows<'d>(mut data: &'d mut [f32], spans: &[Span], width: usize) -> Vec<&'d mut [f32]> {
    spans
        .iter()
        .map(|sp| {
            let (head, rest) = std::mem::take(&mut data).split_at_mut(sp.m * width);
            data = rest;
            head
        })
        .collect()
}
