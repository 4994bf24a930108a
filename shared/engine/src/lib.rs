//! Generation on a Gemma 3 or Gemma 4 target ([`Target`]), plain or speculative, in one process: the verifier's
//! round over any [`tandem_core::Proposer`], the request handling every front end shares
//! (sampling, stop conditions, streamed text) and the statistics a generation reports.

mod drafting;
mod engine;
mod error;
mod memory;
mod plan;
mod request;
mod stats;
mod target;

pub use engine::{Engine, Outcome, Sink, Update};
pub use error::{EngineError, Result};
pub use plan::{drafting_gamma, proposer_gamma, Plan};
pub use request::GenerationRequest;
pub use stats::{RoundStats, SpecStats, Timing};
pub use target::{Gemma4Target, Target, TargetFacts, TargetSequence, TargetStep};
