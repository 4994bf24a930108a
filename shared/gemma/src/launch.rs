//! Host-side costs of many small kernel launches on candle's CUDA backend. A Gemma 3 270M
//! decode step is a few hundred launches of microsecond kernels, so what the host does
//! around each launch sets the speed; two defaults of the stack add to it:
//!
//! * cudarc creates two CUDA events for every allocation when event tracking is on (its
//!   default), although they only matter once a context has several streams, which tandem
//!   never creates;
//! * the device's default memory pool keeps no memory across a synchronisation (release
//!   threshold 0), so every host copy of a result hands the pool back to the driver and
//!   the next forward's allocations map it again.
//!
//! [`prepare_device`] turns both off (measured on the H200: a decode step's forward took
//! 2.8 ms against 3.0 ms without); [`with_cached_layouts`] keeps candle from uploading the
//! dims and strides of a strided view before each kernel that reads one; [`argmax_rows`]
//! spreads the greedy choice over a 262k vocabulary across many blocks; [`rms_norm`] runs
//! each row's norm with a whole block of threads.

use candle_core::{DType, Device, Tensor, D};

use crate::error::Result;

/// Columns per chunk of [`argmax_rows`]' first pass.
const ARGMAX_CHUNK: usize = 1024;

/// Makes `device`'s CUDA context current on the calling thread (a no-op elsewhere). A
/// thread that only receives device tensors from another (a generation whose forwards a
/// batch stepper runs) must call it before dropping them: the driver frees a dropped
/// tensor's memory in the thread's current context, and without one the free fails (the
/// memory leaks, and the error surfaces in a later, unrelated call).
pub fn bind_thread(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        let bound = cuda.cuda_stream().context().bind_to_thread();
        bound.map_err(|e| candle_core::Error::Msg(format!("binding {device:?}: {e}")))?;
    }
    let _ = device;
    Ok(())
}

/// Prepares a CUDA device for launch-bound work (see the module doc); a no-op on other
/// devices. Call it once, before the device allocates.
pub fn prepare_device(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        use crate::error::GemmaError;
        use candle_core::cuda::cudarc::driver::{result, sys};
        let stream = cuda.cuda_stream();
        let ctx = stream.context();
        let failed =
            |e: result::DriverError| GemmaError::Config(format!("preparing {device:?}: {e}"));
        // SAFETY: tandem issues all work of a context on one stream per thread and copies
        // results back synchronously, so no allocation is shared across streams in flight.
        unsafe { ctx.disable_event_tracking() };
        let mut keep = u64::MAX;
        // SAFETY: the device is the context's own; the attribute takes a u64.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device()).map_err(failed)?;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .map_err(failed)?;
        }
    }
    let _ = device;
    Ok(())
}

/// Runs `f` with candle's CUDA upload cache on (a no-op on other devices): an op on a
/// strided view otherwise uploads the view's dims and strides before its kernel, and a
/// block forward has such views in every layer (the rows of fused q/k/v and gate/up
/// outputs). Layouts are cached by value, so the cache stays small (one entry per block
/// shape); `f` must upload no host data, which would be cached too.
pub fn with_cached_layouts<T>(device: &Device, f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        let _cached = cuda.enable_cuda_graph_htod_cache();
        return f();
    }
    let _ = device;
    f()
}

/// The argmax of each row of a `[m, n]` tensor, computed on its device; only the indices
/// come back. candle reduces a row in one thread block, which for a 262,144-wide logits
/// row took 0.23 ms on the H200 (7 % of a decode step); rows whose width is a multiple of
/// 1,024 are reduced in two passes instead: each 1,024-wide chunk's maximum and argmax,
/// then the best chunk. Without exact ties this is the row's argmax; at ties the device
/// picks, as in one pass.
pub fn argmax_rows(t: &Tensor) -> Result<Vec<u32>> {
    let (m, n) = t.dims2()?;
    if n % ARGMAX_CHUNK != 0 || n == ARGMAX_CHUNK {
        return Ok(t.argmax(D::Minus1)?.to_vec1::<u32>()?);
    }
    let chunks = t.reshape((m, n / ARGMAX_CHUNK, ARGMAX_CHUNK))?;
    let best = chunks.max_keepdim(2)?.squeeze(2)?.argmax_keepdim(1)?;
    let within = chunks.argmax_keepdim(2)?.squeeze(2)?.gather(&best, 1)?;
    let both = Tensor::cat(&[best, within], 1)?.to_vec2::<u32>()?;
    Ok(both
        .iter()
        .map(|r| r[0] * ARGMAX_CHUNK as u32 + r[1])
        .collect())
}

/// Each row's argmax, as [`argmax_rows`] picks it, with the row's maximum: both come back
/// in one copy (indices as f32, exact below 2^24).
pub fn argmax_with_max(t: &Tensor) -> Result<Vec<(u32, f32)>> {
    let (m, n) = t.dims2()?;
    let t = t.to_dtype(DType::F32)?;
    let f32s = |x: &Tensor| x.to_dtype(DType::F32);
    let rows = if n % ARGMAX_CHUNK != 0 || n == ARGMAX_CHUNK {
        let best = f32s(&t.argmax_keepdim(D::Minus1)?)?;
        let zero = best.zeros_like()?;
        Tensor::cat(&[best, zero, t.max_keepdim(D::Minus1)?], 1)?
    } else {
        let chunks = t.reshape((m, n / ARGMAX_CHUNK, ARGMAX_CHUNK))?;
        let maxima = chunks.max_keepdim(2)?.squeeze(2)?;
        let best = maxima.argmax_keepdim(1)?;
        let within = chunks.argmax_keepdim(2)?.squeeze(2)?.gather(&best, 1)?;
        let best = f32s(&best)?.affine(ARGMAX_CHUNK as f64, 0.0)?;
        Tensor::cat(&[best, f32s(&within)?, maxima.max_keepdim(1)?], 1)?
    };
    Ok(rows
        .to_vec2::<f32>()?
        .iter()
        .map(|r| ((r[0] + r[1]) as u32, r[2]))
        .collect())
}

/// RMS norm of the last dimension of `x`, scaled by `alpha`, as `candle_nn::ops::rms_norm`
/// computes it. On a CUDA device each row runs on a block of 1,024 threads: candle gives
/// rows narrower than 1,024 one warp, which walks a 640-wide row in 20 dependent loads and
/// took 14-17 µs a row on an H100 (Nsight Compute; 109 norms a Gemma 3 270M step, three
/// quarters of a graph-replayed decode step). The kernel is candle's own.
pub fn rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && x.dim(D::Minus1)? == alpha.dims1()? {
        return Ok(x.apply_op2_no_bwd(alpha, &wide::WideRmsNorm { eps })?);
    }
    Ok(candle_nn::ops::rms_norm(x, alpha, eps)?)
}

#[cfg(feature = "cuda")]
mod wide {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
    };
    use candle_core::cuda_backend::{kernel_name, kernels, CudaStorage, Map2, WrapErr};
    use candle_core::{backend::BackendStorage, CpuStorage, CudaDevice, Layout, Shape, WithDType};

    /// Threads per row: candle's kernel reduces across 32 warps only when it has them all.
    const BLOCK: u32 = 1024;

    /// [`super::rms_norm`] on CUDA.
    pub(super) struct WideRmsNorm {
        pub(super) eps: f32,
    }

    impl candle_core::CustomOp2 for WideRmsNorm {
        fn name(&self) -> &'static str {
            "wide-rms-norm"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<(CpuStorage, Shape)> {
            candle_core::bail!("wide-rms-norm runs on CUDA only")
        }

        fn cuda_fwd(
            &self,
            s1: &CudaStorage,
            l1: &Layout,
            s2: &CudaStorage,
            l2: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let dev = s1.device();
            let slice = self.map(&s1.slice, l1, &s2.slice, l2, dev)?;
            let out = CudaStorage {
                slice,
                device: dev.clone(),
            };
            Ok((out, l1.shape().clone()))
        }
    }

    impl Map2 for WideRmsNorm {
        fn f<T: DeviceRepr + WithDType + ValidAsZeroBits>(
            &self,
            src: &CudaSlice<T>,
            layout: &Layout,
            alpha: &CudaSlice<T>,
            alpha_layout: &Layout,
            dev: &CudaDevice,
        ) -> candle_core::Result<CudaSlice<T>> {
            let (Some((a, b)), Some((c, d))) = (
                layout.contiguous_offsets(),
                alpha_layout.contiguous_offsets(),
            ) else {
                candle_core::bail!("rms norm of a strided tensor");
            };
            let (src, alpha) = (src.slice(a..b), alpha.slice(c..d));
            let el = layout.shape().elem_count();
            let cols = layout.shape().dims().last().copied().unwrap_or(1);
            let cfg = LaunchConfig {
                grid_dim: ((el / cols) as u32, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            let func = dev.get_or_load_func(&kernel_name::<T>("rmsnorm"), &kernels::REDUCE)?;
            // SAFETY: the kernel writes every element.
            let dst = unsafe { dev.alloc::<T>(el)? };
            let mut builder = func.builder();
            builder.arg(&src);
            builder.arg(&dst);
            builder.arg(&alpha);
            candle_core::builder_arg!(builder, cols as i32, BLOCK as i32, self.eps);
            // SAFETY: the arguments match the kernel's signature (candle-nn's rms norm).
            unsafe { builder.launch(cfg) }.w()?;
            Ok(dst)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two passes pick what one pass picks, in wide rows (the maximum in the first, a
    /// middle and the last chunk) and in rows too narrow or ragged for chunks, and come
    /// back with the row's maximum.
    #[test]
    fn two_pass_argmax_is_the_row_argmax() {
        for n in [4096usize, 1024, 1000, 3000] {
            let mut data: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 7919) % 1009) as f32 * 1e-3)
                .collect();
            for (row, at) in [0usize, n / 2 + 3, n - 1].into_iter().enumerate() {
                data[row * n + at] = 5.0;
            }
            let t = Tensor::from_vec(data, (3, n), &Device::Cpu).expect("tensor");
            assert_eq!(
                argmax_rows(&t).expect("argmax"),
                vec![0, n as u32 / 2 + 3, n as u32 - 1],
                "n {n}"
            );
            let with_max = argmax_with_max(&t).expect("argmax and max");
            assert!(with_max.iter().all(|(_, v)| *v == 5.0), "n {n}");
        }
    }
}
