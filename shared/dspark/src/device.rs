//! DSpark inference on a candle device (DSpark, arXiv 2607.05147, Alg. 1, on the DFlash
//! backbone of arXiv 2602.06036, Eq. 2–3): the forward of [`crate::Drafter`] in fused
//! candle ops, for a target that runs on a GPU. On the host a γ = 8 block is dominated by
//! products with the 32k-row restricted head and the Markov head's `W2`; measured on the
//! H200 beside the GPU target, drafting took 3.3–4.2 ms a round on its host CPU and
//! 1.1–1.5 ms here launched op by op; replayed as graphs, 0.3–0.4 ms on an H100.
//!
//! A session's projected context stays on the device ([`DeviceContext`]). Appending rows
//! and drafting a block run as fixed-shape steps over it, replayed as CUDA graphs on a
//! CUDA GPU ([`crate::device_context`]). Per block the anchor's input rows go up once; a
//! greedy block runs its whole Markov pass on the device and sends its γ picks back in one
//! copy. A sampled one at a temperature alone runs its Markov pass and draws on the device
//! too, with the host's uniforms ([`sample`]), and sends back its picks and each
//! position's kept ids and probabilities; with top-k or top-p each position's logits row
//! comes back and is drawn from on the host as the host drafter does ([`crate::draft`]).
//! Either way a block is the host drafter's up to float rounding.

mod sample;

use std::collections::hash_map::Entry;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::ops::softmax_last_dim;
use tandem_core::{distribution, DraftBlock, Sampler, SparseDist};
use tandem_gemma::{bind_thread, rms_norm, scatter_rows, with_cached_layouts, TargetHead};

use crate::backbone::softcap;
use crate::batch::{sample_blocks, MarkovRow};
use crate::config::DraftVocab;
use crate::device_context::{
    extend_rows, span_of, BlockIo, BlockStep, DeviceContext, ExtendStep, StoragePool,
    MAX_EXTEND_ROWS,
};
use crate::draft::{block_rows, check_request, whole_rows, DraftRequest};
use crate::error::{DsparkError, Result};
use crate::frozen::BlockHeads;
use crate::model::Dspark;
use crate::params::LayerParams;
pub(crate) use sample::SampledStep;
use sample::{SampleChain, SampledIo};

/// What a masked attention score gets added (finite, so that masks are made by
/// arithmetic; its exponential is exactly zero next to any visible score).
const MASKED: f64 = -1e30;

/// A sampled pass's kept entries, copied back: position `k`'s draft indices and
/// probabilities are `ids[ends[k]..ends[k + 1]]` and `probs[…]`.
struct Kept<'a> {
    ends: &'a [u32],
    ids: &'a [u32],
    probs: &'a [f32],
}

/// One backbone layer's weights on the device, stored `[in, out]`.
struct DeviceLayer {
    attn_norm: Tensor,
    /// `W_q · hd^-½`: the attention scale folded into the queries.
    q: Tensor,
    /// `[W_k | W_v]`.
    kv: Tensor,
    o: Tensor,
    ff_norm: Tensor,
    /// `[W_gate | W_up]`.
    gate_up: Tensor,
    down: Tensor,
}

/// A drafter frozen for inference on a candle device. Made by [`Dspark::device_drafter`].
pub struct DeviceDrafter {
    /// Host copies of what the Markov pass reads per position (block rows, `W1`, the
    /// confidence head).
    host: BlockHeads,
    layers: Vec<DeviceLayer>,
    w_c: Tensor,
    ctx_norm: Tensor,
    out_norm: Tensor,
    out_proj: Tensor,
    /// `[H, Vd]`: the target head restricted to the draft vocabulary, transposed.
    head: Tensor,
    markov_w1: Tensor,
    markov_w2: Tensor,
    target: TargetHead,
    vocab: DraftVocab,
    softcap: Option<f32>,
    gamma: usize,
    heads: usize,
    eps: f32,
    vocab_size: usize,
    row_width: usize,
    device: Device,
    /// Whether fixed-shape steps are captured as CUDA graphs (on a CUDA device).
    graphs: bool,
    pool: Arc<StoragePool>,
    /// What a sampled pass's draws read.
    chain: SampleChain,
}

impl Drop for DeviceDrafter {
    /// The weights are freed in the device's context, whichever thread drops the drafter.
    fn drop(&mut self) {
        let _ = bind_thread(self.head.device());
    }
}

impl Dspark {
    /// The drafter frozen for inference on `device` through `head`, its fixed-shape steps
    /// captured as CUDA graphs where `graphs` is on and `device` is a CUDA GPU. Fails with
    /// [`DsparkError::TargetMismatch`] when `head` belongs to another target.
    pub fn device_drafter(
        &self,
        head: &TargetHead,
        device: &Device,
        graphs: bool,
    ) -> Result<DeviceDrafter> {
        self.check_target(head)?;
        let put =
            |t: &Tensor| -> Result<Tensor> { Ok(t.detach().contiguous()?.to_device(device)?) };
        let p = &self.params;
        let hd = self.cfg.d_draft / self.cfg.n_heads;
        let head_t = put(&head.dense_rows(self.vocab.ids())?.t()?)?;
        let layer = |l: &LayerParams| -> Result<DeviceLayer> {
            let cat = |a: &Tensor, b: &Tensor| put(&Tensor::cat(&[a, b], 1)?);
            Ok(DeviceLayer {
                attn_norm: put(l.attn_norm.as_tensor())?,
                q: put(&(l.q.as_tensor() * (hd as f64).powf(-0.5))?)?,
                kv: cat(l.k.as_tensor(), l.v.as_tensor())?,
                o: put(l.o.as_tensor())?,
                ff_norm: put(l.ff_norm.as_tensor())?,
                gate_up: cat(l.gate.as_tensor(), l.up.as_tensor())?,
                down: put(l.down.as_tensor())?,
            })
        };
        Ok(DeviceDrafter {
            host: BlockHeads::of(p)?,
            layers: p.layers.iter().map(layer).collect::<Result<_>>()?,
            w_c: put(p.w_c.as_tensor())?,
            ctx_norm: put(p.ctx_norm.as_tensor())?,
            out_norm: put(p.out_norm.as_tensor())?,
            out_proj: put(p.out_proj.as_tensor())?,
            chain: SampleChain::new(head_t.dim(1)?, device)?,
            head: head_t,
            markov_w1: put(p.markov_w1.as_tensor())?,
            markov_w2: put(p.markov_w2.as_tensor())?,
            target: head.clone(),
            vocab: self.vocab.clone(),
            softcap: self.dims.final_softcap,
            gamma: self.cfg.gamma,
            heads: self.cfg.n_heads,
            eps: self.dims.eps as f32,
            vocab_size: self.dims.vocab,
            row_width: self.row_width(),
            device: device.clone(),
            graphs,
            pool: StoragePool::new(p.layers.len(), self.cfg.d_draft, device),
        })
    }
}

impl DeviceDrafter {
    /// Floats per snapshot row (see [`Dspark::row_width`]).
    pub fn row_width(&self) -> usize {
        self.row_width
    }

    /// An empty context for one session.
    pub fn new_context(&self) -> DeviceContext {
        DeviceContext::new(&self.pool)
    }

    /// Appends snapshot rows (row-major, [`Self::row_width`] floats each) of the next
    /// committed positions: projects them once into every layer's keys and values.
    pub fn extend(&self, ctx: &mut DeviceContext, rows: &[f32]) -> Result<()> {
        self.check_context(ctx)?;
        whole_rows(rows, self.row_width, true)?;
        for chunk in rows.chunks(MAX_EXTEND_ROWS * self.row_width) {
            self.extend_step(ctx, chunk)?;
        }
        Ok(())
    }

    /// Fails unless `ctx` is one of this drafter's contexts.
    fn check_context(&self, ctx: &DeviceContext) -> Result<()> {
        match ctx.is_from(&self.pool) {
            true => Ok(()),
            false => Err(DsparkError::Invalid(
                "the context belongs to another drafter".into(),
            )),
        }
    }

    /// Appends at most [`MAX_EXTEND_ROWS`] rows in one extend step.
    fn extend_step(&self, ctx: &mut DeviceContext, rows: &[f32]) -> Result<()> {
        let (w, dev) = (self.row_width, &self.device);
        let (n, start) = (rows.len() / w, ctx.len());
        let r = extend_rows(n);
        let storage = ctx.storage_for(start + n)?;
        let step = match storage.extends.entry(r) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(ExtendStep::new(r, w, dev)?),
        };
        let mut padded = rows.to_vec();
        padded.resize(r * w, 0.0);
        let positions: Vec<u32> = (start..start + r).map(|p| p as u32).collect();
        step.taps
            .slice_set(&Tensor::from_vec(padded, (r, w), dev)?, 0, 0)?;
        step.pos.slice_set(&Tensor::new(positions, dev)?, 0, 0)?;
        let (taps, pos) = (&step.taps, &step.pos);
        let kv = (storage.k.as_slice(), storage.v.as_slice());
        let what = || format!("a drafter extend step of {r} rows");
        let body = || self.extend_body(taps, pos, kv);
        step.replay.run(dev, self.graphs, what, body)?;
        ctx.advance(n);
        Ok(())
    }

    /// Projects the rows `taps` into every layer's keys and values `kv` at `pos`.
    fn extend_body(&self, taps: &Tensor, pos: &Tensor, kv: (&[Tensor], &[Tensor])) -> Result<()> {
        let d = self.out_norm.dim(0)?;
        with_cached_layouts(&self.device, || -> Result<()> {
            let h = rms_norm(&taps.matmul(&self.w_c)?, &self.ctx_norm, self.eps)?;
            for (l, (k, v)) in self.layers.iter().zip(kv.0.iter().zip(kv.1)) {
                let new = rms_norm(&h, &l.attn_norm, self.eps)?.matmul(&l.kv)?;
                scatter_rows(k, pos, &new.narrow(1, 0, d)?.contiguous()?)?;
                scatter_rows(v, pos, &new.narrow(1, d, d)?.contiguous()?)?;
            }
            Ok(())
        })
    }

    /// Drafts `req.gamma` tokens after `req.anchor`: greedy or sampled by `sampler`'s
    /// parameters, each token's distribution returned exactly (target ids).
    pub fn draft(
        &self,
        ctx: &mut DeviceContext,
        req: &DraftRequest,
        sampler: &mut Sampler,
    ) -> Result<DraftBlock> {
        check_request(*req, self.gamma, self.vocab_size)?;
        self.check_context(ctx)?;
        if sampler.params().temperature_alone() {
            return self.draft_sampled(ctx, req, sampler);
        }
        let step = &self.block_step(ctx, req)?.io;
        let d = self.out_norm.dim(0)?;
        let out = step.out.flatten_all()?.to_vec1::<f32>()?;
        let params = *sampler.params();
        let picks = match params.is_greedy() {
            true => Some(step.picks.to_vec1::<u32>()?),
            false => None,
        };
        let blocks = sample_blocks(&self.vocab, &[*req], &mut [sampler], |rows| {
            let MarkovRow { k, prev, .. } = rows[0];
            let row = self.vocab.markov_row(prev);
            let dist = match &picks {
                Some(p) => SparseDist {
                    ids: vec![p[k]],
                    probs: vec![1.0],
                },
                None => {
                    let logits = with_cached_layouts(&self.device, || {
                        self.markov_logits(&step.base, k, &self.markov_w1.narrow(0, row, 1)?)
                    })?;
                    distribution(&logits.to_vec1::<f32>()?, &params)
                }
            };
            Ok(vec![(
                dist,
                self.host.confidence(&out[k * d..(k + 1) * d], row),
            )])
        })?;
        blocks
            .into_iter()
            .next()
            .ok_or_else(|| DsparkError::Invalid("no block was drafted".into()))
    }

    /// [`Self::draft`] at a temperature alone: the block step, then the sampled pass over its
    /// base logits with `sampler`'s next `req.gamma` uniforms; then the picks, the offsets
    /// and the kept entries come back.
    fn draft_sampled(
        &self,
        ctx: &mut DeviceContext,
        req: &DraftRequest,
        sampler: &mut Sampler,
    ) -> Result<DraftBlock> {
        let (dev, g, vd) = (&self.device, self.gamma, self.head.dim(1)?);
        let uniforms: Vec<f32> = (0..g)
            .map(|k| match k < req.gamma {
                true => sampler.uniform() as f32,
                false => 0.0,
            })
            .collect();
        let inv_t = 1.0 / sampler.params().temperature;
        let BlockStep { io, sampled, .. } = self.block_step(ctx, req)?;
        let SampledStep { io: pass, replay } = match sampled {
            Some(s) => s,
            none => none.insert(SampledStep::new(g, vd, dev)?),
        };
        pass.uniforms
            .slice_set(&Tensor::from_vec(uniforms, g, dev)?, 0, 0)?;
        pass.inv_t
            .slice_set(&Tensor::from_vec(vec![inv_t], (1, 1), dev)?, 0, 0)?;
        let (io, pass) = (&*io, &*pass);
        let what = || "a drafter's sampled pass".to_string();
        replay.run(dev, self.graphs, what, || self.sampled_pass(io, pass))?;
        let picks = pass.picks.to_vec1::<u32>()?;
        let ends = pass.ends.to_vec1::<u32>()?;
        let kept = ends[req.gamma] as usize;
        let ids = pass.ids.narrow(0, 0, kept)?.to_vec1::<u32>()?;
        let probs = pass.probs.narrow(0, 0, kept)?.to_vec1::<f32>()?;
        let out = io.out.flatten_all()?.to_vec1::<f32>()?;
        let kept = Kept {
            ends: &ends,
            ids: &ids,
            probs: &probs,
        };
        Ok(self.sampled_block(req, &picks, kept, &out))
    }

    /// The sampled pass's work: each position's distribution at the temperature in `pass`,
    /// drawn from with its uniform, the draw choosing the next position's Markov row (from
    /// the anchor's). What a graph captures.
    fn sampled_pass(&self, io: &BlockIo, pass: &SampledIo) -> Result<()> {
        with_cached_layouts(&self.device, || -> Result<()> {
            let mut e1 = self.markov_w1.index_select(&io.meta.narrow(0, 1, 1)?, 0)?;
            for k in 0..self.gamma {
                let logits = self.markov_logits(&io.base, k, &e1)?;
                self.chain.position(&logits, pass, k)?;
                e1 = self
                    .markov_w1
                    .index_select(&pass.picks.narrow(0, k, 1)?, 0)?;
            }
            Ok(())
        })
    }

    /// The block of a sampled pass: its `picks` (draft indices), each position's `kept` ids
    /// and probabilities and the confidence of its final state in `out`.
    fn sampled_block(
        &self,
        req: &DraftRequest,
        picks: &[u32],
        kept: Kept<'_>,
        out: &[f32],
    ) -> DraftBlock {
        let d = self.out_norm.dims()[0];
        let mut block = DraftBlock::default();
        let mut row = self.vocab.markov_row(req.anchor);
        for (k, span) in kept.ends.windows(2).take(req.gamma).enumerate() {
            let (a, b) = (span[0] as usize, span[1] as usize);
            let ids = kept.ids[a..b].iter();
            block.tokens.push(self.vocab.target_id(picks[k] as usize));
            block
                .confidences
                .push(self.host.confidence(&out[k * d..(k + 1) * d], row));
            block.dists.push(SparseDist {
                ids: ids.map(|i| self.vocab.target_id(*i as usize)).collect(),
                probs: kept.probs[a..b].to_vec(),
            });
            row = picks[k] as usize;
        }
        block
    }

    /// Runs the block step for `req` over `ctx`: the final states, base logits and greedy
    /// picks of its block rows ([`block_rows`]; the step's other rows, which no row sees,
    /// are computed and never read) are in the returned step's outputs.
    fn block_step<'c>(
        &self,
        ctx: &'c mut DeviceContext,
        req: &DraftRequest,
    ) -> Result<&'c mut BlockStep> {
        let dev = &self.device;
        let (g, d, vd) = (self.gamma, self.out_norm.dim(0)?, self.head.dim(1)?);
        let block = self.host.block(&self.target.embed(req.anchor)?)?;
        let meta = [
            ctx.len() as u32,
            self.vocab.markov_row(req.anchor) as u32,
            block_rows(req.gamma, g) as u32,
        ];
        let span = span_of(ctx.len());
        let storage = ctx.storage_for(ctx.len())?;
        let step = match storage.blocks.entry(span) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(BlockStep::new(span, (g, d, vd), dev)?),
        };
        step.io
            .block
            .slice_set(&Tensor::from_vec(block, (g, d), dev)?, 0, 0)?;
        step.io.meta.slice_set(&Tensor::new(&meta, dev)?, 0, 0)?;
        let (io, kv) = (&step.io, (storage.k.as_slice(), storage.v.as_slice()));
        let what = || format!("a drafter block over {span} context positions");
        let body = || self.block_body(io, kv, span);
        step.replay.run(dev, self.graphs, what, body)?;
        Ok(step)
    }

    /// The block step's work over the first `span` positions of the context's keys and
    /// values `kv`: what a graph captures.
    fn block_body(&self, io: &BlockIo, kv: (&[Tensor], &[Tensor]), span: usize) -> Result<()> {
        with_cached_layouts(&self.device, || -> Result<()> {
            let len = io.meta.narrow(0, 0, 1)?.to_dtype(DType::F32)?;
            let rows = io.meta.narrow(0, 2, 1)?.to_dtype(DType::F32)?.neg()?;
            let in_context = io.keys.broadcast_lt(&len)?.to_dtype(DType::F32)?;
            let in_block = io.keys.broadcast_ge(&rows)?.to_dtype(DType::F32)?;
            let mask = (in_context * in_block)?.affine(-MASKED, MASKED)?;
            let mut h = io.block.clone();
            for (l, (k, v)) in self.layers.iter().zip(kv.0.iter().zip(kv.1)) {
                let ctx = (k.narrow(0, 0, span)?, v.narrow(0, 0, span)?);
                h = self.layer(l, &h, ctx, &mask)?;
            }
            let out = rms_norm(&h, &self.out_norm, self.eps)?;
            let base = out.matmul(&self.out_proj)?.matmul(&self.head)?;
            let base = softcap(base, self.softcap)?;
            io.out.slice_set(&out, 0, 0)?;
            io.base.slice_set(&base, 0, 0)?;
            let picks = self.greedy_chain(&base, &io.meta.narrow(0, 1, 1)?)?;
            io.picks.slice_set(&picks, 0, 0)?;
            Ok(())
        })
    }

    /// The greedy Markov pass on the device, from the anchor's Markov row (`[1]` u32): each
    /// position's argmax (a draft index, which is also the Markov row of that token) picks
    /// the next position's `W1` row there. Returns the `[γ]` picks.
    fn greedy_chain(&self, base: &Tensor, anchor_row: &Tensor) -> Result<Tensor> {
        let mut e1 = self.markov_w1.index_select(anchor_row, 0)?;
        let mut picks = Vec::with_capacity(self.gamma);
        for k in 0..self.gamma {
            let pick = self.markov_logits(base, k, &e1)?.argmax_keepdim(0)?;
            e1 = self.markov_w1.index_select(&pick, 0)?;
            picks.push(pick);
        }
        Ok(Tensor::cat(&picks, 0)?)
    }

    /// Eq. 3 plus the FFN: queries from the block `h`, keys and values from the context
    /// `(k, v)` and the block, the block attending over both under the additive `mask`
    /// (`[1, keys]`).
    fn layer(
        &self,
        l: &DeviceLayer,
        h: &Tensor,
        (ck, cv): (Tensor, Tensor),
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (g, d) = h.dims2()?;
        let hd = d / self.heads;
        let n = rms_norm(h, &l.attn_norm, self.eps)?;
        let kv = n.matmul(&l.kv)?;
        let k = Tensor::cat(&[&ck, &kv.narrow(1, 0, d)?], 0)?;
        let v = Tensor::cat(&[&cv, &kv.narrow(1, d, d)?], 0)?;
        let by_head = |x: &Tensor| -> Result<Tensor> {
            let rows = x.dim(0)?;
            Ok(x.reshape((rows, self.heads, hd))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let q = by_head(&n.matmul(&l.q)?)?;
        let scores = q.matmul(&by_head(&k)?.t()?)?.broadcast_add(mask)?;
        let attn = softmax_last_dim(&scores)?.matmul(&by_head(&v)?)?;
        let attn = attn.transpose(0, 1)?.reshape((g, d))?;
        let h = (h + attn.matmul(&l.o)?)?;
        let gu = rms_norm(&h, &l.ff_norm, self.eps)?.matmul(&l.gate_up)?;
        let f = gu.dim(1)? / 2;
        let act = (gu.narrow(1, 0, f)?.gelu()? * gu.narrow(1, f, f)?)?;
        Ok((h + act.matmul(&l.down)?)?)
    }

    /// Position `k`'s draft logits `[Vd]` after a token whose Markov `W1` row is `e1`
    /// (`[1, r]`).
    fn markov_logits(&self, base: &Tensor, k: usize, e1: &Tensor) -> Result<Tensor> {
        let logits = (base.narrow(0, k, 1)? + e1.matmul(&self.markov_w2)?)?;
        Ok(logits.squeeze(0)?)
    }
}
