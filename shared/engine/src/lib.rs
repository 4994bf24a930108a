//! Generation on a Gemma 3 or Gemma 4 target ([`Target`]), plain or speculative, in one
//! process: the verifier's round over any [`tandem_core::Proposer`], the request handling
//! every front end shares (sampling, stop conditions, streamed text), the plan a request
//! runs with (its γ cap and KV-cache size, shared with admission), batching generations'
//! forwards and scheduling their draft lengths, loading targets, and the
//! statistics a generation reports.

mod device_rows;
mod drafting;
mod engine;
mod error;
mod fetch;
mod load;
mod memory;
mod models;
mod plan;
mod request;
mod schedule;
mod stats;
mod warm;

pub use drafting::check_block;
pub use engine::{Engine, Outcome, Sink, Update};
pub use error::{EngineError, Result};
pub use load::{model_type, Placement, TargetFiles};
pub use models::{
    BatchLimits, BatchedDeviceGemma3, BatchedGemma3, Draw, Gemma4Target, StepObserver, StepReport,
    Target, TargetFacts, TargetSequence, TargetStep,
};
pub use plan::{drafting_gamma, Plan};
pub use request::GenerationRequest;
pub use schedule::{DraftScheduler, Seat};
pub use stats::{RoundStats, SpecStats, Timing};
