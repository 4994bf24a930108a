//! Fused operations of a Gemma 3 layer on a device: on a CUDA GPU each is one launch of
//! tandem's own kernels (`kernels/step.cu`, compiled to PTX by the build script), computing
//! in f32 and rounding once; elsewhere the same composition of candle's ops, which is what
//! the tests check against the plain forward.
//!
//! A replayed decode step of Gemma 3 270M was about 455 kernels of 2–6 µs each (Nsight
//! Compute, H100), so the kernels' count, not the weights' traffic, set its time: per layer
//! the q and k norms and rotations and the two cache writes were six launches, each residual
//! with its sandwich norms three, the GeGLU two. A block of several rows also split the fused
//! q|k|v product in three so that each part came out contiguous, and candle's scatter wrote
//! the block's keys one row after another (16 µs a call for 16 rows).

use candle_core::{Tensor, D};
use candle_nn::rotary_emb::rope_thd;

use crate::error::Result;
use crate::launch::rms_norm;

/// Head counts and width of the attention.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub(crate) q: usize,
    pub(crate) kv: usize,
    pub(crate) dim: usize,
}

/// Writes row `r` of `src` (`[m, ..]`) to row `pos[r]` of `dst` (`[n, ..]`, rows as wide
/// as `src`'s; `pos` `[m]` u32 on the device): what a fixed-shape step does with a block's
/// keys and values. Both tensors must be contiguous. A position past `dst`'s rows is
/// skipped on a CUDA GPU (one thread per element) and an error elsewhere (candle's
/// `scatter_set`).
pub fn scatter_rows(dst: &Tensor, pos: &Tensor, src: &Tensor) -> Result<()> {
    let m = pos.dims1()?;
    let width = src.elem_count() / m.max(1);
    let n = dst.elem_count() / width.max(1);
    let (dst, src) = (dst.reshape((n, width))?, src.reshape((m, width))?);
    #[cfg(feature = "cuda")]
    if dst.device().is_cuda() {
        return cuda::scatter_rows(&dst, pos, &src);
    }
    let index = pos
        .reshape((m, 1))?
        .broadcast_as((m, width))?
        .contiguous()?;
    Ok(dst.scatter_set(&index, &src, 0)?)
}

/// The query heads `[1, m, heads.q, hd]` of one sequence's fused q|k|v rows `qkv` (`[m,
/// (q + 2 kv) hd]`): q and k heads RMS-normed by `norms` (q's, k's) and rotated by the
/// rows' `(cos, sin)` (`[m, hd / 2]`); the k heads and the v heads go to rows `pos` of the
/// caches `(k, v)` (`[1, positions, kv, hd]`).
pub(crate) fn qkv_heads(
    qkv: &Tensor,
    norms: (&Tensor, &Tensor),
    rot: (&Tensor, &Tensor),
    pos: &Tensor,
    cache: (&Tensor, &Tensor),
    heads: Heads,
    eps: f32,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if qkv.device().is_cuda() {
        return cuda::qkv_heads(qkv, norms, rot, pos, cache, heads, eps);
    }
    let m = qkv.dim(0)?;
    let part = |at: usize, n: usize| -> Result<Tensor> {
        let t = qkv.narrow(1, at * heads.dim, n * heads.dim)?.contiguous()?;
        Ok(t.reshape((1, m, n, heads.dim))?)
    };
    let (cos, sin) = rot;
    let q = rope_thd(&rms_norm(&part(0, heads.q)?, norms.0, eps)?, cos, sin)?;
    let k = rope_thd(
        &rms_norm(&part(heads.q, heads.kv)?, norms.1, eps)?,
        cos,
        sin,
    )?;
    scatter_rows(&cache.0.squeeze(0)?, pos, &k)?;
    scatter_rows(
        &cache.1.squeeze(0)?,
        pos,
        &part(heads.q + heads.kv, heads.kv)?,
    )?;
    Ok(q)
}

/// Gemma's residual with its sandwich norms: `x + rmsnorm(a, w)`, and where `w2` is given,
/// that sum RMS-normed by `w2` (the next sublayer's input).
pub(crate) fn add_norm(
    x: &Tensor,
    a: &Tensor,
    (w, w2): (&Tensor, Option<&Tensor>),
    eps: f32,
) -> Result<(Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return cuda::add_norm(x, a, (w, w2), eps);
    }
    let sum = (x + rms_norm(a, w, eps)?)?;
    let normed = w2.map(|w2| rms_norm(&sum, w2, eps)).transpose()?;
    Ok((sum, normed))
}

/// GeGLU of fused gate|up rows `gu` (`[.., 2 f]`): `gelu_tanh(gate) * up` (`[.., f]`).
pub(crate) fn geglu(gu: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if gu.device().is_cuda() {
        return cuda::geglu(gu);
    }
    let f = gu.dim(D::Minus1)? / 2;
    Ok((gu.narrow(D::Minus1, 0, f)?.gelu()? * gu.narrow(D::Minus1, f, f)?)?)
}

/// Where [`draw_row`] writes one position of a sampled draft: the kept ids (`[N]` u32) and
/// their probabilities (`[N]` f32) from offset `ends[at]` on, the offset past them to
/// `ends[at + 1]` (`ends` u32), and the drawn id to `pick` (`[1]` u32).
pub struct DrawOut<'a> {
    /// Kept ids, ascending, after the earlier positions'.
    pub ids: &'a Tensor,
    /// Their probabilities.
    pub probs: &'a Tensor,
    /// Where each position's entries start.
    pub ends: &'a Tensor,
    /// This position.
    pub at: usize,
    /// The drawn id.
    pub pick: &'a Tensor,
}

/// One position of a sampled draft on a CUDA GPU, in one launch: the proposal of `logits`
/// (`[n]` f32) at one over the temperature `inv_t` — the softmax without the ids below
/// `floor`, renormalised — kept ids ascending, and the id the uniform `u` draws from it
/// (the first whose running sum passes `u` among ids with mass, the last with mass where
/// none does: `tandem_core::SparseDist::draw`'s walk), written to `out`. `inv_t` and `u`
/// are `[1]` f32 on the device, so a captured step reads them at replay; every tensor must
/// be contiguous and `out`'s buffers hold `(at + 1) n` entries (so `ends[at]`, at most
/// `at n`, leaves room for `n`). Elsewhere an error: the
/// caller composes candle's ops.
pub fn draw_row(
    logits: &Tensor,
    (inv_t, u): (&Tensor, &Tensor),
    floor: f32,
    out: DrawOut<'_>,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return cuda::draw_row(logits, (inv_t, u), floor, out);
    }
    let _ = (logits, inv_t, u, floor, out);
    Err(candle_core::Error::Msg("draw_row runs on a CUDA GPU only".into()).into())
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaDevice, CudaStorage, DType, Device, Shape, Storage, Tensor, D};

    use super::Heads;
    use crate::error::Result;

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/step.ptx"));
    /// The name candle loads [`PTX`] under.
    const MODULE: &str = "tandem_step";

    /// A contiguous tensor's device address (its offset included).
    fn addr(t: &Tensor) -> Result<u64> {
        let (storage, layout) = t.storage_and_layout();
        let (Some((start, _)), Storage::Cuda(s)) = (layout.contiguous_offsets(), &*storage) else {
            return fail("a fused op's operand must be a contiguous CUDA tensor".into());
        };
        let stream = s.device().cuda_stream();
        let base = match s.dtype() {
            DType::BF16 => s.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
            DType::F16 => s.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
            DType::F32 => s.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
            DType::U32 => s.as_cuda_slice::<u32>()?.device_ptr(&stream).0,
            other => return fail(format!("a fused op on {other:?}")),
        };
        Ok(base + (start * t.dtype().size_in_bytes()) as u64)
    }

    /// An error of a fused op.
    fn fail<T>(msg: String) -> Result<T> {
        Err(candle_core::Error::Msg(msg).into())
    }

    /// `t`'s CUDA device and the name of kernel `name` for `t`'s dtype there.
    fn kernel(t: &Tensor, name: &str) -> Result<(CudaDevice, String)> {
        let Device::Cuda(dev) = t.device() else {
            return fail(format!("{name} runs on CUDA only"));
        };
        let suffix = match t.dtype() {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            other => return fail(format!("{name} of {other:?}")),
        };
        Ok((dev.clone(), format!("{name}_{suffix}")))
    }

    /// A new tensor of `dtype` and `shape` on `dev`, uninitialised: the caller's kernel
    /// writes every element before anything reads it.
    fn empty(dev: &CudaDevice, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.elem_count();
        // SAFETY: every caller launches a kernel that writes all `n` elements next.
        let storage = unsafe {
            match dtype {
                DType::BF16 => {
                    CudaStorage::wrap_cuda_slice(dev.alloc::<half::bf16>(n)?, dev.clone())
                }
                DType::F16 => CudaStorage::wrap_cuda_slice(dev.alloc::<half::f16>(n)?, dev.clone()),
                DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc::<f32>(n)?, dev.clone()),
                other => return fail(format!("a fused op on {other:?}")),
            }
        };
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            shape,
            BackpropOp::none(),
            false,
        ))
    }

    fn blocks(n: usize, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n.div_ceil(threads as usize).max(1) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn same_dtype(ts: &[&Tensor]) -> Result<()> {
        match ts.windows(2).all(|w| w[0].dtype() == w[1].dtype()) {
            true => Ok(()),
            false => fail("a fused op over mixed dtypes".into()),
        }
    }

    pub(super) fn scatter_rows(dst: &Tensor, pos: &Tensor, src: &Tensor) -> Result<()> {
        same_dtype(&[dst, src])?;
        let (rows, width) = src.dims2()?;
        let (dev, name) = kernel(src, "scatter_rows")?;
        let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        let (p, s, d) = (addr(pos)?, addr(src)?, addr(dst)?);
        let (rows, width, dst_rows) = (rows as u32, width as u32, dst.dim(0)? as u32);
        let mut b = func.builder();
        b.arg(&p)
            .arg(&s)
            .arg(&d)
            .arg(&rows)
            .arg(&width)
            .arg(&dst_rows);
        // SAFETY: the arguments match the kernel; it skips positions past `dst`'s rows.
        unsafe { b.launch(blocks((rows * width) as usize, 256)) }.w()?;
        Ok(())
    }

    pub(super) fn qkv_heads(
        qkv: &Tensor,
        (qw, kw): (&Tensor, &Tensor),
        (cos, sin): (&Tensor, &Tensor),
        pos: &Tensor,
        (k, v): (&Tensor, &Tensor),
        h: Heads,
        eps: f32,
    ) -> Result<Tensor> {
        same_dtype(&[qkv, qw, kw, cos, sin, k, v])?;
        let m = qkv.dim(0)?;
        if qkv.dim(1)? != (h.q + 2 * h.kv) * h.dim || !h.dim.is_multiple_of(64) || h.dim > 2048 {
            return fail(format!("qkv heads: rows of {:?} for {h:?}", qkv.shape()));
        }
        let (dev, name) = kernel(qkv, "qkv_heads")?;
        let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        let q = empty(&dev, qkv.dtype(), (1, m, h.q, h.dim))?;
        let ptrs = [qkv, qw, kw, cos, sin, pos, &q, k, v].map(addr);
        let ptrs: Vec<u64> = ptrs.into_iter().collect::<Result<_>>()?;
        let dims = [h.q, h.kv, h.dim, k.dim(1)?].map(|x| x as u32);
        let mut b = func.builder();
        ptrs.iter().for_each(|p| {
            b.arg(p);
        });
        dims.iter().for_each(|d| {
            b.arg(d);
        });
        b.arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: ((h.q + 2 * h.kv) as u32, m as u32, 1),
            block_dim: ((h.dim / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel (shapes checked above); it skips cache
        // positions past the caches' rows.
        unsafe { b.launch(cfg) }.w()?;
        Ok(q)
    }

    pub(super) fn add_norm(
        x: &Tensor,
        a: &Tensor,
        (w, w2): (&Tensor, Option<&Tensor>),
        eps: f32,
    ) -> Result<(Tensor, Option<Tensor>)> {
        same_dtype(&[x, a, w, w2.unwrap_or(w)])?;
        let cols = x.dim(D::Minus1)?;
        let rows = x.elem_count() / cols;
        if a.dims() != x.dims() || w.dims1()? != cols || w2.is_some_and(|w2| w2.dims() != w.dims())
        {
            return fail(format!("add-norm of {:?} and {:?}", x.shape(), a.shape()));
        }
        let (dev, name) = kernel(x, "add_norm")?;
        let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        let outputs = 1 + usize::from(w2.is_some());
        let out = empty(&dev, x.dtype(), (outputs, rows, cols))?;
        let (px, pa, pw, po) = (addr(x)?, addr(a)?, addr(w)?, addr(&out)?);
        let pw2 = w2.map(addr).transpose()?.unwrap_or(0);
        let (r, c) = (rows as u32, cols as u32);
        let mut b = func.builder();
        b.arg(&px)
            .arg(&pa)
            .arg(&pw)
            .arg(&pw2)
            .arg(&po)
            .arg(&r)
            .arg(&c)
            .arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (r, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel (shapes checked above).
        unsafe { b.launch(cfg) }.w()?;
        let sum = out.get(0)?.reshape(x.shape())?;
        let normed = match w2 {
            Some(_) => Some(out.get(1)?.reshape(x.shape())?),
            None => None,
        };
        Ok((sum, normed))
    }

    pub(super) fn draw_row(
        logits: &Tensor,
        (inv_t, u): (&Tensor, &Tensor),
        floor: f32,
        out: super::DrawOut<'_>,
    ) -> Result<()> {
        let n = logits.elem_count();
        let room = out.ids.elem_count() >= (out.at + 1) * n;
        let sizes_ok = room && out.probs.elem_count() == out.ids.elem_count();
        if logits.dtype() != DType::F32 || !sizes_ok || out.at + 1 >= out.ends.elem_count() {
            return fail(format!(
                "draw_row of {:?} into {:?}",
                logits.shape(),
                out.ids.shape()
            ));
        }
        let (dev, name) = kernel(logits, "draw_row")?;
        let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        let ends = out.ends.narrow(0, out.at, 2)?;
        let ptrs = [logits, inv_t, u, out.ids, out.probs, &ends, out.pick].map(addr);
        let p: Vec<u64> = ptrs.into_iter().collect::<Result<_>>()?;
        let n = n as u32;
        let mut b = func.builder();
        b.arg(&p[0]).arg(&p[1]).arg(&p[2]).arg(&floor);
        b.arg(&p[3]).arg(&p[4]).arg(&p[5]).arg(&p[6]).arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel; the buffers hold `(at + 1) n` entries
        // (checked above) and `ends[at]` is at most `at n`, as `draw_row`'s caller promises.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    pub(super) fn geglu(gu: &Tensor) -> Result<Tensor> {
        let f = gu.dim(D::Minus1)? / 2;
        let rows = gu.elem_count() / (2 * f).max(1);
        let (dev, name) = kernel(gu, "geglu")?;
        let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        let mut dims = gu.dims().to_vec();
        *dims.last_mut().expect("a dimension") = f;
        let out = empty(&dev, gu.dtype(), dims)?;
        let (pg, po, r, fu) = (addr(gu)?, addr(&out)?, rows as u32, f as u32);
        let mut b = func.builder();
        b.arg(&pg).arg(&po).arg(&r).arg(&fu);
        // SAFETY: the arguments match the kernel.
        unsafe { b.launch(blocks(rows * f, 256)) }.w()?;
        Ok(out)
    }
}
