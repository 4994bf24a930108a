//! Where the time of [`crate::DeviceGemma3`]'s fixed-shape steps goes, for benchmarks:
//! wall-clock time per step against the span the device spent between the step's first
//! and last kernel (CUDA events around the graph launch, or around the op-by-op launches).
//! What remains is host work: embedding and uploading the block, the launch calls, and
//! copying results back. Off unless [`profile_steps`] turns it on (it adds two events and
//! a synchronisation to a step).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use candle_core::Device;

/// Fixed-shape steps timed since the last [`take_step_profile`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepProfile {
    /// Steps timed.
    pub steps: u64,
    /// Of which replayed as CUDA graphs.
    pub replays: u64,
    /// Wall-clock seconds of the steps (from the block's embedding to its results on the
    /// host).
    pub wall_s: f64,
    /// Seconds from each step's first kernel start to its last kernel's end on the device.
    pub device_s: f64,
}

impl StepProfile {
    /// Wall-clock seconds spent off the device's span: host work and waiting for it.
    pub fn host_s(&self) -> f64 {
        (self.wall_s - self.device_s).max(0.0)
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static TOTAL: Mutex<StepProfile> = Mutex::new(StepProfile {
    steps: 0,
    replays: 0,
    wall_s: 0.0,
    device_s: 0.0,
});

/// Turns timing of fixed-shape steps on or off (for the whole process).
pub fn profile_steps(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// The steps timed since the last call, and starts afresh.
pub fn take_step_profile() -> StepProfile {
    std::mem::take(&mut *TOTAL.lock().unwrap_or_else(PoisonError::into_inner))
}

/// One step's timing, started where its host work starts (`None` when timing is off or
/// the device has no events).
pub(crate) struct StepClock {
    start: Instant,
    #[cfg(feature = "cuda")]
    events: Vec<candle_core::cuda::cudarc::driver::CudaEvent>,
}

impl StepClock {
    pub(crate) fn start(device: &Device) -> Option<Self> {
        (ON.load(Ordering::Relaxed) && device.is_cuda()).then(|| Self {
            start: Instant::now(),
            #[cfg(feature = "cuda")]
            events: Vec::new(),
        })
    }

    /// Marks the device's work so far (call before the step's kernels and after them).
    pub(crate) fn mark(&mut self, device: &Device) {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(cuda) = device {
            use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
            let stream = cuda.cuda_stream();
            if let Ok(event) = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)) {
                self.events.push(event);
            }
        }
        let _ = device;
    }

    /// Adds the step to the totals, once its results are on the host.
    pub(crate) fn finish(self, replayed: bool) {
        let wall_s = self.start.elapsed().as_secs_f64();
        #[cfg(feature = "cuda")]
        let device_s = match self.events.as_slice() {
            [first, last] => first.elapsed_ms(last).map_or(0.0, |ms| f64::from(ms) / 1e3),
            _ => 0.0,
        };
        #[cfg(not(feature = "cuda"))]
        let device_s = 0.0;
        let mut total = TOTAL.lock().unwrap_or_else(PoisonError::into_inner);
        total.steps += 1;
        total.replays += u64::from(replayed);
        total.wall_s += wall_s;
        total.device_s += device_s;
    }
}
