//! Gemma 3 and Gemma 4 text models for tandem: loading (GGUF with quantized weights kept quantized, or
//! the HF safetensors layout), a forward over a block of tokens that returns logits and
//! hidden-state taps, and a caller-owned KV cache that can be rolled back.
//!
//! Gemma 4 and its assistant drafter live in [`gemma4`] (HF safetensors, f32).
//! [`DeviceGemma3`] runs Gemma 3 on candle tensors instead of the CPU kernels, for GPUs.
//!
//! The crate knows nothing of gRPC or sessions; the verifier owns caches and calls
//! [`Gemma3::forward`].

mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_avx2;
#[cfg(target_arch = "x86_64")]
mod attention_avx512;
mod config;
mod convert;
mod device;
mod device_cache;
mod error;
mod forward;
pub mod gemma4;
mod gguf_config;
mod head;
mod kv_cache;
mod launch;
mod linear;
mod loader;
mod model;
mod names;
mod ops;

pub use config::{GemmaConfig, RopeScaling};
pub use convert::{export_hf, hf_config_json};
pub use device::{DeviceGemma3, DeviceOptions};
pub use device_cache::DeviceCache;
pub use error::{GemmaError, Result};
pub use forward::{Gemma3Model, SequenceCache};
pub use head::{RestrictedHead, TargetHead, TargetIdentity};
pub use kv_cache::KvCache;
pub use launch::{argmax_rows, prepare_device, with_cached_layouts};
pub use loader::verify_sha256;
pub use model::{ForwardOptions, ForwardOutput, Gemma3, LoadOptions, LogitsMode, Precision};
pub use tandem_kernels::TopRow;
