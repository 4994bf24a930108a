//! The tandem verifier service: owns the Gemma target and its KV caches, serves clients
//! over gRPC (`tandem.v1.Generation`), drafts through a pool of remote drafters
//! (`tandem.v1.Drafter`), and exports Prometheus metrics. Generation itself is the
//! engine's (tandem-engine); this crate is admission, transport and telemetry.

mod admission;
mod error;
mod metrics;
mod pool;
mod remote;
mod server;
mod service;

pub use admission::Admission;
pub use error::VerifierError;
pub use metrics::VerifierMetrics;
pub use pool::{DrafterPool, Lookup, PoolConfig, Resolve, Source, SystemResolver};
pub use remote::SessionOptions;
pub use server::{serve, warm_up, ServeError};
pub use service::{GenerationService, VerifierConfig};
