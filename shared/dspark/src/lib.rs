//! DSpark block drafter for tandem (DSpark, arXiv 2607.05147, on the DFlash backbone of
//! arXiv 2602.06036): a small bidirectional transformer that reads hidden-state taps of
//! the target's committed context, drafts a block of γ tokens after an anchor in one
//! parallel pass through the target's own frozen LM head (restricted to a draft
//! vocabulary), refines them sequentially with a low-rank Markov head, and rates each with
//! a confidence head.
//!
//! * [`Dspark`] holds the parameters (candle `Var`s, trainable in place);
//!   [`Dspark::forward_train`] is the batched, differentiable training forward.
//! * [`Drafter`] is a drafter frozen for inference (plain f32 over the batch-invariant
//!   kernels); its [`ContextCache`] keeps a session's projected context so drafting costs
//!   attention over (context + γ), never a re-projection of the context.
//! * [`DeviceDrafter`] runs the same inference forward in candle ops on a device (a GPU
//!   beside a GPU target), its [`DeviceContext`] kept there.
//! * [`BatchedDrafter`] drafts the blocks of sessions that ask at once in one pass
//!   ([`Drafter::draft_many`]), each block what the session would get alone.
//! * [`DsparkProposer`] implements [`tandem_core::Proposer`] over any of them.
//! * [`Dspark::grown`] adds layers and feed-forward width to a trained drafter without
//!   changing what it drafts, so a larger shape trains on from a smaller one's weights.
//! * Checkpoints are safetensors plus a manifest bound to the target's identity.

mod backbone;
mod batch;
mod batched;
mod checkpoint;
mod config;
mod device;
mod device_context;
mod draft;
mod error;
mod frozen;
mod grow;
mod model;
mod params;
mod proposer;
mod router_set;
mod train;

pub use batch::DraftJob;
pub use batched::{BatchedContext, BatchedDrafter, DraftBatching};
pub use checkpoint::{
    attach_calibration, check_manifest, index_shards, load_calibration, SaveOptions, CALIBRATION,
    MANIFEST,
};
pub use config::{DraftVocab, DsparkConfig, TargetDims};
pub use device::DeviceDrafter;
pub use device_context::DeviceContext;
pub use draft::{ContextCache, DraftRequest, Drafter, ScoredBlock};
pub use error::{DsparkError, Result};
pub use grow::Growth;
pub use model::Dspark;
pub use proposer::{BlockDrafter, DsparkProposer};
pub use router_set::{is_set, RouteSpec, RouterManifest, ROUTER_FILE};
pub use train::{TrainBatch, TrainOutput};
