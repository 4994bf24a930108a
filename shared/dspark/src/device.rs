//! DSpark inference on a candle device (DSpark, arXiv 2607.05147, Alg. 1, on the DFlash
//! backbone of arXiv 2602.06036, Eq. 2–3): the forward of [`crate::Drafter`] in fused
//! candle ops, for a target that runs on a GPU. On the host a γ = 8 block is dominated by
//! products with the 32k-row restricted head and the Markov head's `W2`; measured on the
//! H200 beside the GPU target, drafting took 3.3–4.2 ms a round on its host CPU and
//! 1.1–1.5 ms here.
//!
//! A session's projected context stays on the device ([`DeviceContext`]). Per block the
//! anchor's input rows go up once; a greedy block runs its whole Markov pass on the device
//! and sends its γ picks back in one copy, a sampled one sends each position's logits row
//! back and draws on the host as the host drafter does ([`crate::draft`]), so a block is
//! the same up to float rounding.

use candle_core::{Device, Tensor};
use candle_nn::ops::softmax_last_dim;
use tandem_core::{distribution, DraftBlock, Sampler, SparseDist};
use tandem_gemma::{rms_norm, with_cached_layouts, TargetHead};

use crate::backbone::softcap;
use crate::batch::{sample_blocks, MarkovRow};
use crate::config::DraftVocab;
use crate::draft::{check_request, whole_rows, DraftRequest};
use crate::error::{DsparkError, Result};
use crate::frozen::BlockHeads;
use crate::model::Dspark;
use crate::params::LayerParams;

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
}

/// One session's projected context on the device: each layer's keys and values `[L, d]`.
pub struct DeviceContext {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl DeviceContext {
    /// Number of context positions received.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position was received yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Dspark {
    /// The drafter frozen for inference on `device` through `head`. Fails with
    /// [`DsparkError::TargetMismatch`] when `head` belongs to another target.
    pub fn device_drafter(&self, head: &TargetHead, device: &Device) -> Result<DeviceDrafter> {
        self.check_target(head)?;
        let put =
            |t: &Tensor| -> Result<Tensor> { Ok(t.detach().contiguous()?.to_device(device)?) };
        let p = &self.params;
        let hd = self.cfg.d_draft / self.cfg.n_heads;
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
            head: put(&head.dense_rows(self.vocab.ids())?.t()?)?,
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
        DeviceContext {
            layers: self.layers.iter().map(|_| None).collect(),
            len: 0,
        }
    }

    /// Appends snapshot rows (row-major, [`Self::row_width`] floats each) of the next
    /// committed positions: projects them once into every layer's keys and values.
    pub fn extend(&self, ctx: &mut DeviceContext, rows: &[f32]) -> Result<()> {
        let n = whole_rows(rows, self.row_width, ctx.layers.len() == self.layers.len())?;
        if n == 0 {
            return Ok(());
        }
        let taps = Tensor::from_slice(rows, (n, self.row_width), &self.device)?;
        let d = self.out_norm.dim(0)?;
        with_cached_layouts(&self.device, || -> Result<()> {
            let h = rms_norm(&taps.matmul(&self.w_c)?, &self.ctx_norm, self.eps)?;
            for (l, kv) in self.layers.iter().zip(&mut ctx.layers) {
                let new = rms_norm(&h, &l.attn_norm, self.eps)?.matmul(&l.kv)?;
                let (k, v) = (new.narrow(1, 0, d)?, new.narrow(1, d, d)?);
                *kv = Some(match kv.take() {
                    Some((ck, cv)) => (Tensor::cat(&[&ck, &k], 0)?, Tensor::cat(&[&cv, &v], 0)?),
                    None => (k.contiguous()?, v.contiguous()?),
                });
            }
            Ok(())
        })?;
        ctx.len += n;
        Ok(())
    }

    /// Drafts `req.gamma` tokens after `req.anchor`: greedy or sampled by `sampler`'s
    /// parameters, each token's distribution returned exactly (target ids).
    pub fn draft(
        &self,
        ctx: &DeviceContext,
        req: &DraftRequest,
        sampler: &mut Sampler,
    ) -> Result<DraftBlock> {
        check_request(*req, self.gamma, self.vocab_size)?;
        let block = self.host.block(&self.target.embed(req.anchor)?)?;
        let d = self.out_norm.dim(0)?;
        let block = Tensor::from_vec(block, (self.gamma, d), &self.device)?;
        let (out, base) =
            with_cached_layouts(&self.device, || self.backbone(ctx, block, req.gamma))?;
        let out = out.flatten_all()?.to_vec1::<f32>()?;
        let params = *sampler.params();
        let anchor_row = self.vocab.markov_row(req.anchor);
        let picks = match params.is_greedy() {
            true => Some(with_cached_layouts(&self.device, || {
                self.greedy_chain(&base, anchor_row, req.gamma)
            })?),
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
                        self.markov_logits(&base, k, &self.markov_w1.narrow(0, row, 1)?)
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

    /// The greedy Markov pass on the device: each position's argmax (a draft index, which
    /// is also the Markov row of that token) picks the next position's `W1` row there, so
    /// the `gamma` picks come back in one copy.
    fn greedy_chain(&self, base: &Tensor, anchor_row: usize, gamma: usize) -> Result<Vec<u32>> {
        let mut e1 = self.markov_w1.narrow(0, anchor_row, 1)?;
        let mut picks = Vec::with_capacity(gamma);
        for k in 0..gamma {
            let pick = self.markov_logits(base, k, &e1)?.argmax_keepdim(0)?;
            e1 = self.markov_w1.index_select(&pick, 0)?;
            picks.push(pick);
        }
        Ok(Tensor::cat(&picks, 0)?.to_vec1::<u32>()?)
    }

    /// The backbone over the full configured block `h [γ, d]` (as trained): the final
    /// states `[gamma, d]` and the base logits `[gamma, Vd]` of the first `gamma` positions.
    fn backbone(
        &self,
        ctx: &DeviceContext,
        mut h: Tensor,
        gamma: usize,
    ) -> Result<(Tensor, Tensor)> {
        for (l, kv) in self.layers.iter().zip(&ctx.layers) {
            h = self.layer(l, &h, kv.as_ref())?;
        }
        let out = rms_norm(&h, &self.out_norm, self.eps)?.narrow(0, 0, gamma)?;
        let base = out.matmul(&self.out_proj)?.matmul(&self.head)?;
        Ok((out, softcap(base, self.softcap)?))
    }

    /// Eq. 3 plus the FFN: queries from the block, keys and values from context and block,
    /// the block attending over both.
    fn layer(&self, l: &DeviceLayer, h: &Tensor, ctx: Option<&(Tensor, Tensor)>) -> Result<Tensor> {
        let (g, d) = h.dims2()?;
        let hd = d / self.heads;
        let n = rms_norm(h, &l.attn_norm, self.eps)?;
        let kv = n.matmul(&l.kv)?;
        let (k, v) = (kv.narrow(1, 0, d)?, kv.narrow(1, d, d)?);
        let (k, v) = match ctx {
            Some((ck, cv)) => (Tensor::cat(&[ck, &k], 0)?, Tensor::cat(&[cv, &v], 0)?),
            None => (k, v),
        };
        let by_head = |x: &Tensor| -> Result<Tensor> {
            let rows = x.dim(0)?;
            Ok(x.reshape((rows, self.heads, hd))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let q = by_head(&n.matmul(&l.q)?)?;
        let scores = q.matmul(&by_head(&k)?.t()?)?;
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
