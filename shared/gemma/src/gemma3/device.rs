//! Gemma 3 on candle tensors, for accelerators: candle's CUDA backend (the `cuda` feature)
//! or, for tests and comparisons, its CPU backend.
//!
//! The architecture and the weights are those of [`crate::Gemma3`] (Gemma Team, "Gemma 3
//! Technical Report", 2025; reference: transformers' `Gemma3ForCausalLM`), read through
//! the same loaders and dequantized once to a floating dtype on the device; q/k/v and
//! gate/up are fused into one matrix each so that a layer is a handful of kernel launches.
//! The KV cache ([`DeviceCache`]) is passed in by the caller and rolls back by length.
//!
//! Unlike the CPU kernels this path is not batch invariant: cuBLAS chooses its kernels by
//! shape, so a position's logits in a block forward can differ in the last bits from
//! one-token decoding. Speculation on a device is therefore lossless in distribution, but
//! greedy output can part from plain decoding at near-ties.

use std::path::Path;
use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Device, Tensor};
use candle_nn::ops::softmax_last_dim;
use candle_nn::rotary_emb::rope_thd;

use super::config::GemmaConfig;
use super::device_cache::DeviceCache;
use super::device_frame::{append, gathered, visible, Context, Store};
use super::device_step::StepShared;
use super::forward::block_len;
use super::head::TargetHead;
use super::model::{ForwardOptions, ForwardOutput, LogitsMode, Precision};
use super::names::{LayerTensor, Role};
use crate::error::{GemmaError, Result};
use crate::fused::{add_norm, geglu, qkv_heads, Heads};
use crate::launch::{bind_thread, rms_norm, with_cached_layouts};
use crate::loader::{self, TensorSource};
use crate::ops::Rope;

/// Where and in which dtype [`DeviceGemma3`] runs.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// The candle device (e.g. `Device::new_cuda(0)`).
    pub device: Device,
    /// Weights and activations (`F32`, `BF16` or `F16`); attention softmax and logits are
    /// computed in f32 whatever this is.
    pub dtype: DType,
    /// Runs short blocks of one sequence as fixed-shape steps, captured once as CUDA
    /// graphs on a CUDA device and replayed ([`super::device_step`]); on other devices the
    /// same steps run op by op. Off: every forward launches its kernels one by one.
    pub graphs: bool,
}

impl DeviceOptions {
    /// `dtype` on `device`, with graphs on where the device is a CUDA GPU.
    pub fn new(device: Device, dtype: DType) -> Self {
        let graphs = device.is_cuda();
        Self {
            device,
            dtype,
            graphs,
        }
    }
}

pub(super) struct Layer {
    attn_norm: Tensor,
    /// `[q_dim + 2 kv_dim, hidden]`: q, k and v stacked.
    qkv: Tensor,
    o: Tensor,
    /// The query norm times the attention scale `query_pre_attn_scalar^-0.5` (rotation is
    /// linear, so scaling queries before it scales the scores).
    q_norm: Tensor,
    k_norm: Tensor,
    post_attn_norm: Tensor,
    pre_ffn_norm: Tensor,
    /// `[2 ffn, hidden]`: gate and up stacked.
    gate_up: Tensor,
    down: Tensor,
    post_ffn_norm: Tensor,
    sliding: bool,
}

/// A Gemma 3 text model on a candle device. Immutable and shareable across threads.
pub struct DeviceGemma3 {
    pub(super) cfg: GemmaConfig,
    head: TargetHead,
    pub(super) opts: DeviceOptions,
    pub(super) layers: Vec<Layer>,
    pub(super) final_norm: Tensor,
    lm_head: Tensor,
    pub(super) rope_local: Rope,
    pub(super) rope_global: Rope,
    /// What fixed-shape steps share: rotation tables on the device and caches to reuse
    /// (`None` with graphs off).
    pub(super) steps: Option<StepShared>,
    /// Held for the whole of a forward: forwards from several threads on one CUDA stream
    /// only interleave their launches and synchronisations (measured on the H200: 16
    /// teacher threads together made 108 tok/s, one sequence alone 217-289 tok/s).
    pub(super) turn: Mutex<()>,
}

/// Most positions one pass through the layers takes: a longer block runs in chunks, so the
/// attention scores of a long prompt stay at most this many rows.
const MAX_CHUNK: usize = 512;

impl DeviceGemma3 {
    /// Loads a `.gguf` file or an HF directory onto `opts.device`, dequantizing every
    /// weight to `opts.dtype`.
    pub fn load(path: &Path, opts: DeviceOptions) -> Result<Self> {
        if !matches!(opts.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(GemmaError::Config(format!(
                "a device model runs in f32, bf16 or f16, not {:?}",
                opts.dtype
            )));
        }
        let (src, cfg) = loader::open(path)?;
        Self::build(cfg, src.as_ref(), opts)
    }

    fn build(cfg: GemmaConfig, src: &dyn TensorSource, opts: DeviceOptions) -> Result<Self> {
        let load = Loader {
            cfg: &cfg,
            src,
            opts: &opts,
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| load.layer(i))
            .collect::<Result<Vec<_>>>()?;
        // The ggml layout: the GPU gets the head dequantized, the CPU embeds from it.
        let head = TargetHead::read(cfg.clone(), src, Precision::Int8)?;
        let shape = (cfg.vocab_size, cfg.hidden_size);
        let lm_head = load.put(head.head().dequantize(), shape)?;
        let hd = cfg.head_dim;
        let factor = cfg.rope_scaling.as_ref().map_or(1.0, |s| s.factor);
        let (rope_local, rope_global) = (
            Rope::new(hd, cfg.rope_local_base_freq, 1.0),
            Rope::new(hd, cfg.rope_theta, factor),
        );
        let steps = opts
            .graphs
            .then(|| StepShared::new(&cfg, [&rope_local, &rope_global], &opts))
            .transpose()?;
        Ok(Self {
            final_norm: load.vector(Role::FinalNorm)?,
            rope_local,
            rope_global,
            steps,
            lm_head,
            head,
            layers,
            cfg,
            opts,
            turn: Mutex::new(()),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &GemmaConfig {
        &self.cfg
    }

    /// The input embedding and output head as CPU matrices (what a drafter scores through).
    pub fn head(&self) -> TargetHead {
        self.head.clone()
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.opts.device
    }

    /// Whether short blocks of one sequence run as fixed-shape steps captured as CUDA
    /// graphs on first use (graphs on, on a CUDA device).
    pub fn captures_steps(&self) -> bool {
        self.steps.is_some() && self.opts.device.is_cuda()
    }

    /// Bytes of keys and values one position of a cache holds (in the model's dtype).
    pub fn kv_bytes_per_position(&self) -> usize {
        2 * self.cfg.num_hidden_layers * self.cfg.kv_dim() * self.opts.dtype.size_in_bytes()
    }

    /// A fresh KV cache for one sequence of at most `max_len` positions (allocated as it
    /// grows).
    pub fn new_cache(&self, max_len: usize) -> DeviceCache {
        self.new_batch_cache(1, max_len)
    }

    /// A fresh KV cache for `batch` sequences advanced together (see [`Self::forward`]).
    /// With graphs on, one sequence of at most [`super::device_step::STEP_POSITIONS`]
    /// positions gets a cache at fixed addresses, reused from a dropped one where there is.
    pub fn new_batch_cache(&self, batch: usize, max_len: usize) -> DeviceCache {
        let cfg = &self.cfg;
        let max_len = max_len.min(cfg.max_position_embeddings);
        if let Some(cache) = self.fixed_cache(batch, max_len) {
            return cache;
        }
        DeviceCache::new(
            batch,
            max_len,
            (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim),
            (self.opts.dtype, self.opts.device.clone()),
        )
    }

    /// Runs `tokens` at positions `pos..pos+m`, appending their keys and values to `cache`
    /// (which must hold exactly `pos` positions). Logits stay on the device (f32), so that a
    /// caller can reduce them there; taps and the last hidden rows come back as f32 CPU
    /// tensors, as [`crate::Gemma3::forward`] returns them (their copy waits for the
    /// whole forward).
    ///
    /// A cache of `b` sequences takes `b` blocks of `m` tokens, sequence-major, all at the
    /// same positions; every output then has its rows sequence-major too (`b` rows of
    /// logits with [`LogitsMode::Last`]).
    pub fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        self.check(tokens, pos, cache, opts)?;
        // The lock guards no data, so a forward that panicked leaves nothing to distrust.
        let _turn = self.turn.lock().unwrap_or_else(PoisonError::into_inner);
        let result = match self.takes_step(tokens.len(), cache) {
            true => self.step_forward(tokens, pos, cache, opts),
            false => self.forward_chunks(tokens, pos, cache, opts),
        };
        if result.is_err() {
            // Back to the `pos` positions the forward started from (never past the end).
            cache.ledger.truncate(pos)?;
        }
        result
    }

    /// Runs the block [`MAX_CHUNK`] positions at a time (each chunk attends to the cache and
    /// to itself), so that a long prompt's scores never need more than `MAX_CHUNK` rows.
    fn forward_chunks(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        let b = cache.batch;
        let m = tokens.len() / b;
        cache.reserve(pos + m)?;
        let chunks = m.div_ceil(MAX_CHUNK);
        let (mut normed, mut taps, mut logits) = (Vec::new(), Vec::new(), Vec::new());
        for c in 0..chunks {
            let span = c * MAX_CHUNK..m.min((c + 1) * MAX_CHUNK);
            let chunk: Vec<u32> = tokens
                .chunks_exact(m)
                .flat_map(|seq| &seq[span.clone()])
                .copied()
                .collect();
            let (n, t) = self.forward_chunk(&chunk, b, span.start + pos, cache, &opts.taps)?;
            let rows = match opts.logits {
                LogitsMode::All | LogitsMode::BoundedAll | LogitsMode::Top(_) => Some(n.clone()),
                LogitsMode::Last | LogitsMode::Bounded if c + 1 == chunks => {
                    let (mc, h) = (span.len(), self.cfg.hidden_size);
                    Some(
                        n.reshape((b, mc, h))?
                            .narrow(1, mc - 1, 1)?
                            .reshape((b, h))?,
                    )
                }
                _ => None,
            };
            if let Some(rows) = rows {
                logits.push(self.logits(&rows)?);
            }
            normed.push(n);
            taps.push(t);
        }
        let host = |parts: &[Tensor]| -> Result<Tensor> {
            let t = sequence_major(parts, b)?.to_dtype(DType::F32)?;
            Ok(t.to_device(&Device::Cpu)?)
        };
        let taps = (0..opts.taps.len())
            .map(|i| host(&taps.iter().map(|t| t[i].clone()).collect::<Vec<_>>()))
            .collect::<Result<Vec<_>>>()?;
        Ok(ForwardOutput {
            top: None,
            bounded: Vec::new(),
            logits: (!logits.is_empty())
                .then(|| sequence_major(&logits, b))
                .transpose()?,
            taps,
            last_hidden: host(&normed)?,
        })
    }

    /// One chunk of `b` sequences at `pos` (`tokens` sequence-major): its final-norm rows
    /// and the requested taps, on the device.
    fn forward_chunk(
        &self,
        tokens: &[u32],
        b: usize,
        pos: usize,
        cache: &mut DeviceCache,
        tap_layers: &[usize],
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let m = tokens.len() / b;
        let mut x = self.embed(tokens, tokens.len())?;
        let ctx = Context::new(self, pos, m, b)?;
        let store = Store::Append(pos);
        let mut taps: Vec<Option<Tensor>> = vec![None; tap_layers.len()];
        with_cached_layouts(&self.opts.device, || -> Result<()> {
            for (i, layer) in self.layers.iter().enumerate() {
                x = self.layer(layer, &x, &ctx, (&cache.k[i], &cache.v[i]), &store)?;
                for (slot, t) in taps.iter_mut().zip(tap_layers) {
                    if *t == i {
                        *slot = Some(x.clone());
                    }
                }
            }
            Ok(())
        })?;
        cache.ledger.commit(m);
        let normed = rms_norm(&x, &self.final_norm, self.cfg.rms_norm_eps as f32)?;
        let taps = taps
            .into_iter()
            .map(|t| t.unwrap_or_else(|| normed.clone()))
            .collect();
        Ok((normed, taps))
    }

    fn check(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &DeviceCache,
        opts: &ForwardOptions,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(GemmaError::Request("empty block".into()));
        }
        let m = block_len(tokens.len(), cache.batch)?;
        cache.ledger.check_append(pos, m)?;
        match opts.taps.iter().find(|t| **t > self.cfg.num_hidden_layers) {
            Some(t) => Err(GemmaError::Request(format!(
                "tap {t} is out of range (the model has {} layers)",
                self.cfg.num_hidden_layers
            ))),
            None => Ok(()),
        }
    }

    /// `[rows, hidden]` input rows on the device: the embeddings of `tokens` (computed on
    /// the host), then zero rows.
    pub(super) fn embed(&self, tokens: &[u32], rows: usize) -> Result<Tensor> {
        let h = self.cfg.hidden_size;
        let mut x = vec![0f32; rows * h];
        for (row, t) in x.chunks_exact_mut(h).zip(tokens) {
            self.head.embed_into(*t, row)?;
        }
        self.upload(x, (rows, h))
    }

    /// `[rows, hidden]` input rows on the device: the embedding of each `(row, token)` of
    /// `placed` at its row, zeros elsewhere.
    pub(super) fn embed_placed(&self, placed: &[(usize, u32)], rows: usize) -> Result<Tensor> {
        let h = self.cfg.hidden_size;
        let mut x = vec![0f32; rows * h];
        for &(row, t) in placed {
            self.head.embed_into(t, &mut x[row * h..(row + 1) * h])?;
        }
        self.upload(x, (rows, h))
    }

    pub(super) fn upload(&self, data: Vec<f32>, shape: (usize, usize)) -> Result<Tensor> {
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?.to_dtype(self.opts.dtype)?;
        Ok(t.to_device(&self.opts.device)?)
    }

    /// `[rows, vocab]` f32 logits of final-norm rows, on the device.
    pub(super) fn logits(&self, normed: &Tensor) -> Result<Tensor> {
        let mut logits = normed.matmul(&self.lm_head.t()?)?.to_dtype(DType::F32)?;
        if let Some(cap) = self.cfg.final_logit_softcapping {
            logits = ((logits / cap)?.tanh()? * cap)?;
        }
        Ok(logits)
    }

    /// One layer over `x`, storing the block's keys and values in `kv` (the layer's cache
    /// keys and values) as `store` says.
    pub(super) fn layer(
        &self,
        l: &Layer,
        x: &Tensor,
        ctx: &Context,
        kv: (&Tensor, &Tensor),
        store: &Store,
    ) -> Result<Tensor> {
        let eps = self.cfg.rms_norm_eps as f32;
        let normed = rms_norm(x, &l.attn_norm, eps)?;
        let (cos, sin) = if l.sliding { &ctx.local } else { &ctx.global };
        let (q, (keys, values)) = match store {
            Store::Scatter { pos, span } => {
                let qkv = normed.matmul(&l.qkv.t()?)?;
                let norms = (&l.q_norm, &l.k_norm);
                let q = qkv_heads(&qkv, norms, (cos, sin), pos, kv, self.heads(), eps)?;
                (q, visible(kv, *span)?)
            }
            Store::Pooled {
                store,
                gather,
                span,
            } => {
                let qkv = normed.matmul(&l.qkv.t()?)?;
                let (norms, h) = ((&l.q_norm, &l.k_norm), self.heads());
                let q = qkv_heads(&qkv, norms, (cos, sin), store, kv, h, eps)?;
                let q = q.reshape((ctx.b, ctx.m, h.q, h.dim))?;
                (q, gathered(kv, gather, (ctx.b, *span))?)
            }
            Store::Append(pos) => {
                let [q, k, v] = self.rotated_qkv(l, &normed, ctx, (cos, sin))?;
                (q, append(kv, &k, &v, *pos)?)
            }
        };
        let mask = if l.sliding {
            &ctx.local_mask
        } else {
            &ctx.global_mask
        };
        let attn = self.attend(&q, &keys, &values, mask)?;
        let norms = (&l.post_attn_norm, Some(&l.pre_ffn_norm));
        let (x, h) = add_norm(x, &attn.matmul(&l.o.t()?)?, norms, eps)?;
        let h = h.ok_or_else(|| GemmaError::Config("add-norm gave no normed rows".into()))?;
        let act = geglu(&h.matmul(&l.gate_up.t()?)?)?;
        let (x, _) = add_norm(
            &x,
            &act.matmul(&l.down.t()?)?,
            (&l.post_ffn_norm, None),
            eps,
        )?;
        Ok(x)
    }

    /// Every layer over the step input `x` with the caches' `(k, v)` per layer, then the
    /// final norm: the final-norm rows into `normed`, and the output of each layer of
    /// `tap_layers` (the model's layer count: the final-norm rows) into its `taps` tensor.
    /// What a fixed-shape or batched step runs.
    pub(super) fn run_layers(
        &self,
        x: &Tensor,
        ctx: &Context,
        (k, v): (&[Tensor], &[Tensor]),
        store: &Store,
        (normed, taps, tap_layers): (&Tensor, &[Tensor], &[usize]),
    ) -> Result<()> {
        let tap = |i: usize, x: &Tensor| -> Result<()> {
            for (out, t) in taps.iter().zip(tap_layers) {
                if *t == i {
                    out.slice_set(x, 0, 0)?;
                }
            }
            Ok(())
        };
        let mut x = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = self.layer(layer, &x, ctx, (&k[i], &v[i]), store)?;
            tap(i, &x)?;
        }
        let last = rms_norm(&x, &self.final_norm, self.cfg.rms_norm_eps as f32)?;
        normed.slice_set(&last, 0, 0)?;
        tap(self.layers.len(), &last)
    }

    fn heads(&self) -> Heads {
        Heads {
            q: self.cfg.num_attention_heads,
            kv: self.cfg.num_key_value_heads,
            dim: self.cfg.head_dim,
        }
    }

    /// The normed and rotated queries and keys `[b, m, heads, hd]` and the values of
    /// normed rows `x`, for the plain forward.
    fn rotated_qkv(
        &self,
        l: &Layer,
        x: &Tensor,
        ctx: &Context,
        (cos, sin): (&Tensor, &Tensor),
    ) -> Result<[Tensor; 3]> {
        let eps = self.cfg.rms_norm_eps as f32;
        let h = self.heads();
        let [q, k, v] = self.qkv(l, x)?;
        let q = q.reshape((ctx.b, ctx.m, h.q, h.dim))?;
        let k = k.reshape((ctx.b, ctx.m, h.kv, h.dim))?;
        Ok([
            rope_thd(&rms_norm(&q, &l.q_norm, eps)?, cos, sin)?,
            rope_thd(&rms_norm(&k, &l.k_norm, eps)?, cos, sin)?,
            v.reshape((ctx.b, ctx.m, h.kv, h.dim))?,
        ])
    }

    /// The query, key and value rows of normed rows `x`. One row takes one product with
    /// the fused matrix (its column slices are contiguous); several take one product per
    /// row slice of it, so that no output needs a copy before its reshape.
    fn qkv(&self, l: &Layer, x: &Tensor) -> Result<[Tensor; 3]> {
        let (q_dim, kv_dim) = (self.cfg.q_dim(), self.cfg.kv_dim());
        let fused = match x.dim(0)? {
            1 => Some(x.matmul(&l.qkv.t()?)?),
            _ => None,
        };
        let part = |at: usize, n: usize| -> Result<Tensor> {
            Ok(match &fused {
                Some(qkv) => qkv.narrow(1, at, n)?,
                None => x.matmul(&l.qkv.narrow(0, at, n)?.t()?)?,
            })
        };
        Ok([
            part(0, q_dim)?,
            part(q_dim, kv_dim)?,
            part(q_dim + kv_dim, kv_dim)?,
        ])
    }

    /// Grouped-query attention of `q` (`[b, m, heads, hd]`, already scaled) over
    /// `keys`/`values` (`[b, len, kv_heads, hd]`); returns `[b * m, heads * hd]`.
    ///
    /// The rows of one key head are its query heads at every position, position-major, so
    /// that with one key head (Gemma 3 270M) no operand is copied.
    fn attend(
        &self,
        q: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        mask: &Option<Tensor>,
    ) -> Result<Tensor> {
        let (b, m, nh, hd) = q.dims4()?;
        let nkv = keys.dim(2)?;
        let g = nh / nkv;
        let by_head = |t: &Tensor| t.transpose(1, 2)?.contiguous();
        let q = by_head(&q.reshape((b, m, nkv, g * hd))?)?.reshape((b, nkv, m * g, hd))?;
        let mut scores = q.matmul(&by_head(keys)?.t()?)?.to_dtype(DType::F32)?;
        if let Some(cap) = self.cfg.attn_logit_softcapping {
            scores = ((scores / cap)?.tanh()? * cap)?;
        }
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let p = softmax_last_dim(&scores)?.to_dtype(self.opts.dtype)?;
        let out = p.matmul(&by_head(values)?)?.reshape((b, nkv, m, g * hd))?;
        Ok(out.transpose(1, 2)?.reshape((b * m, nh * hd))?)
    }
}

impl Drop for DeviceGemma3 {
    /// The weights are freed in the device's context, whichever thread drops the model
    /// ([`crate::bind_thread`]).
    fn drop(&mut self) {
        let _ = bind_thread(&self.opts.device);
    }
}

/// Joins per-chunk outputs of `b` sequences (each `[b * m_c, x]`, sequence-major) into one
/// `[b * m, x]` tensor, sequence-major.
fn sequence_major(parts: &[Tensor], b: usize) -> Result<Tensor> {
    if b == 1 {
        return Ok(Tensor::cat(parts, 0)?);
    }
    let per_seq = parts
        .iter()
        .map(|p| {
            let (rows, x) = p.dims2()?;
            p.reshape((b, rows / b, x))
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    let joined = Tensor::cat(&per_seq, 1)?;
    let (_, m, x) = joined.dims3()?;
    Ok(joined.reshape((b * m, x))?)
}

/// Moves a model's tensors from its source onto the device, dequantized to its dtype.
struct Loader<'a> {
    cfg: &'a GemmaConfig,
    src: &'a dyn TensorSource,
    opts: &'a DeviceOptions,
}

impl Loader<'_> {
    fn put(&self, data: Vec<f32>, shape: (usize, usize)) -> Result<Tensor> {
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?.to_dtype(self.opts.dtype)?;
        Ok(t.to_device(&self.opts.device)?)
    }

    /// The matrices of `roles` stacked by rows (they share their number of columns).
    fn matrix(&self, roles: &[Role]) -> Result<Tensor> {
        let (mut data, mut rows, mut cols) = (Vec::new(), 0, 0);
        for role in roles {
            let shape = role.shape(self.cfg);
            let (n, k) = (shape[0], shape[1]);
            data.extend(self.src.matrix(*role, n, k)?.dequantize());
            (rows, cols) = (rows + n, k);
        }
        self.put(data, (rows, cols))
    }

    fn vector(&self, role: Role) -> Result<Tensor> {
        let len = role.shape(self.cfg)[0];
        Ok(self
            .put(self.src.vector(role, len)?, (1, len))?
            .squeeze(0)?)
    }

    fn layer(&self, i: usize) -> Result<Layer> {
        use LayerTensor::*;
        let at = |t| Role::Layer(i, t);
        let scale = self.cfg.query_pre_attn_scalar.powf(-0.5);
        Ok(Layer {
            attn_norm: self.vector(at(AttnNorm))?,
            qkv: self.matrix(&[at(Q), at(K), at(V)])?,
            o: self.matrix(&[at(O)])?,
            q_norm: (self.vector(at(QNorm))? * scale)?,
            k_norm: self.vector(at(KNorm))?,
            post_attn_norm: self.vector(at(PostAttnNorm))?,
            pre_ffn_norm: self.vector(at(PreFfnNorm))?,
            gate_up: self.matrix(&[at(Gate), at(Up)])?,
            down: self.matrix(&[at(Down)])?,
            post_ffn_norm: self.vector(at(PostFfnNorm))?,
            sliding: self.cfg.is_sliding(i),
        })
    }
}
