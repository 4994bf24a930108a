//! Gemma 3 text (Gemma Team, "Gemma 3 Technical Report", 2025; reference: transformers'
//! `Gemma3ForCausalLM`): its configuration and tensor names, GGUF and HF loading and the
//! export between them, and two forwards over caller-owned KV caches — [`Gemma3`] on the
//! batch-invariant CPU kernels ([`KvCache`]) and [`DeviceGemma3`] on candle tensors
//! ([`DeviceCache`]) — with [`Gemma3Model`] as one interface over both. [`TargetHead`] is
//! the embedding and LM head a drafter shares with the target.

mod bounded;
mod config;
mod convert;
mod device;
mod device_batch;
mod device_cache;
mod device_frame;
mod device_slots;
mod device_step;
mod forward;
pub(crate) mod gguf_config;
mod head;
mod kv_cache;
mod linear;
mod model;
pub(crate) mod names;
mod step;
mod step_clock;
mod weights;

pub use bounded::BoundedRow;
pub use config::{GemmaConfig, RopeScaling};
pub use convert::{export_hf, hf_config_json};
pub use device::{DeviceGemma3, DeviceOptions};
pub use device_batch::{
    padded_rows, DeviceBatch, SlotSegment, BLOCK_BUCKETS, MAX_BATCH, SHARED_BLOCK,
};
pub use device_cache::DeviceCache;
pub use device_slots::{DeviceSlots, SlotCache};
pub use device_step::{MAX_STEP_ROWS, STEP_POSITIONS};
pub use forward::{Gemma3Model, SequenceCache};
pub use head::{RestrictedHead, TargetHead};
pub use kv_cache::KvCache;
pub use model::{ForwardOptions, ForwardOutput, Gemma3, LoadOptions, LogitsMode, Precision};
pub use step::Segment;
pub use step_clock::{profile_steps, take_step_profile, StepProfile};
pub use weights::Weight;
