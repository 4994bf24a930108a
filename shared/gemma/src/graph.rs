//! Fixed-shape work replayed as CUDA graphs. A graph replays a captured sequence of
//! kernel launches in one call, with the shapes and addresses it was captured with, so the
//! work it replays keeps its inputs and outputs in tensors it owns and copies data in and
//! out around each replay. [`Replayed`] runs such work op by op the first time (which also
//! fills candle's layout cache, see [`crate::with_cached_layouts`]), captures it then where
//! asked and the device is a CUDA GPU, and replays the graph after. A capture that fails
//! leaves the work op by op, with a warning. The target's fixed-shape steps and the device
//! drafter's both use it, and keep the storage their graphs are bound to in [`Spares`] for
//! the next sequence.

use std::fmt::Display;
use std::sync::{Mutex, PoisonError};

use candle_core::Device;

use crate::error::{GemmaError, Result};

/// Work that is replayed as a CUDA graph once captured.
#[derive(Default)]
pub struct Replayed {
    graph: Option<Graph>,
    /// Whether capture was tried (once, after the first run).
    tried: bool,
}

impl Replayed {
    /// Runs `body`: replays its graph where one was captured; otherwise runs it op by op
    /// and, after its first run, captures it where `capture` is on and `device` is a CUDA
    /// GPU (`what` names the work in the warning of a failed capture). Returns whether the
    /// graph was replayed. `body` must upload no host data and must launch the same kernels
    /// on the same tensors every time.
    pub fn run<E: From<GemmaError> + Display>(
        &mut self,
        device: &Device,
        capture: bool,
        what: impl FnOnce() -> String,
        body: impl Fn() -> std::result::Result<(), E>,
    ) -> std::result::Result<bool, E> {
        if let Some(graph) = &self.graph {
            graph.launch()?;
            return Ok(true);
        }
        body()?;
        if capture && !self.tried {
            self.tried = true;
            self.graph = Graph::capture(device, what, body);
        }
        Ok(false)
    }
}

/// A captured sequence of kernel launches.
#[cfg(feature = "cuda")]
struct Graph(candle_core::cuda::cudarc::driver::CudaGraph);

// SAFETY: a graph is launched only through the `&mut` of the work that owns it, so no two
// threads touch it at once (CUDA asks that graph objects be used from one thread at a
// time, not from one thread only).
#[cfg(feature = "cuda")]
unsafe impl Send for Graph {}

#[cfg(feature = "cuda")]
impl Graph {
    /// `body`'s launches on `device`'s per-thread stream, captured (`None` on other
    /// devices, or where capture fails, with a warning).
    fn capture<E: Display>(
        device: &Device,
        what: impl FnOnce() -> String,
        body: impl Fn() -> std::result::Result<(), E>,
    ) -> Option<Self> {
        use candle_core::cuda::cudarc::driver::sys;
        let Device::Cuda(cuda) = device else {
            return None;
        };
        let stream = cuda.cuda_stream();
        let captured = (|| -> std::result::Result<_, String> {
            let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            stream.begin_capture(mode).map_err(|e| e.to_string())?;
            let ran = body();
            let flags = sys::CUgraphInstantiate_flags(0);
            let graph = stream.end_capture(flags).map_err(|e| e.to_string())?;
            ran.map_err(|e| e.to_string())?;
            let graph = graph.ok_or("the capture recorded nothing")?;
            graph.upload().map_err(|e| e.to_string())?;
            Ok(graph)
        })();
        match captured {
            Ok(graph) => Some(Self(graph)),
            Err(error) => {
                tracing::warn!(work = what(), %error,
                    "fixed-shape work could not be captured as a CUDA graph; it runs op by op");
                None
            }
        }
    }

    fn launch(&self) -> Result<()> {
        let launched = self.0.launch();
        Ok(
            launched
                .map_err(|e| candle_core::Error::Msg(format!("launching a CUDA graph: {e}")))?,
        )
    }
}

/// A captured sequence of kernel launches (none without CUDA).
#[cfg(not(feature = "cuda"))]
enum Graph {}

#[cfg(not(feature = "cuda"))]
impl Graph {
    fn capture<E>(
        _: &Device,
        _: impl FnOnce() -> String,
        _: impl Fn() -> std::result::Result<(), E>,
    ) -> Option<Self> {
        None
    }

    fn launch(&self) -> Result<()> {
        match *self {}
    }
}

/// Storage whose user is done (with the graphs bound to its addresses), kept for the next
/// user: at most `max` items, the rest freed, so a burst of sequences does not keep its
/// device memory for good.
pub struct Spares<T> {
    max: usize,
    items: Mutex<Vec<T>>,
}

impl<T> Spares<T> {
    /// An empty pool keeping at most `max` items.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            items: Mutex::new(Vec::new()),
        }
    }

    /// A kept item, if any.
    pub fn take(&self) -> Option<T> {
        self.items().pop()
    }

    /// Keeps `item` for the next user, or frees it when `max` are kept.
    pub fn give(&self, item: T) {
        let mut items = self.items();
        if items.len() < self.max {
            items.push(item);
        }
    }

    /// Items kept now.
    pub fn len(&self) -> usize {
        self.items().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn items(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Given items come back last in, first out, and at most `max` are kept.
    #[test]
    fn spares_keep_at_most_their_limit() {
        let spares = Spares::new(3);
        (0..5).for_each(|i| spares.give(i));
        assert_eq!(spares.len(), 3);
        assert_eq!(spares.take(), Some(2));
        assert_eq!(spares.len(), 2);
    }
}
