//! Gemma 3 and Gemma 4 text models for tandem: loading (GGUF with quantized weights kept quantized, or
//! the HF safetensors layout), a forward over a block of tokens that returns logits and
//! hidden-state taps, and a caller-owned KV cache that can be rolled back.
//!
//! Each family has its folder: Gemma 3 in `gemma3/` (its items re-exported here) and Gemma 4
//! with its assistant drafter in [`gemma4`] (HF safetensors, f32). The root keeps what both
//! share: attention, row operations, tensor loaders, device helpers and errors.
//! [`DeviceGemma3`] runs Gemma 3 on candle tensors instead of the CPU kernels, for GPUs.
//!
//! The crate knows nothing of gRPC or sessions; the verifier owns caches and calls
//! [`Gemma3::forward`].

mod attention;
mod error;
mod fused;
mod gemma3;
pub mod gemma4;
mod gguf;
mod golden;
mod graph;
mod launch;
mod ledger;
mod loader;
mod ops;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{GemmaError, Result};
pub use fused::{draw_row, scatter_rows, DrawOut};
pub use gemma3::{
    export_hf, hf_config_json, padded_rows, profile_steps, take_step_profile, BoundedRow,
    DeviceBatch, DeviceCache, DeviceGemma3, DeviceOptions, DeviceSlots, ForwardOptions,
    ForwardOutput, Gemma3, Gemma3Model, GemmaConfig, KvCache, LoadOptions, LogitsMode, Precision,
    RestrictedHead, RopeScaling, Segment, SequenceCache, SlotCache, SlotSegment, StepProfile,
    TargetHead, Weight, BLOCK_BUCKETS, MAX_BATCH, MAX_STEP_ROWS, SHARED_BLOCK, STEP_POSITIONS,
};
pub use gguf::inspect_gguf;
pub use golden::{GoldenCase, GoldenFixture};
pub use graph::{Replayed, Spares};
pub use launch::{argmax_rows, bind_thread, prepare_device, rms_norm, with_cached_layouts};
pub use loader::verify_sha256;
pub use tandem_kernels::TopRow;
