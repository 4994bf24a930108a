//! The tandem verifier service: owns the Gemma target and its KV caches, serves clients
//! over gRPC (`tandem.v1.Generation`) and an OpenAI-compatible HTTP API ([`http`]), drafts through a pool of remote drafters
//! (`tandem.v1.Drafter`), and exports Prometheus metrics. Generation itself is the
//! engine's (tandem-engine); this crate is admission, transport and telemetry.

mod admission;
mod client_stream;
mod deadline;
mod error;
mod failover;
mod generations;
mod http;
mod metrics;
mod pool;
mod remote;
mod request;
mod server;
mod service;

pub use error::VerifierError;
pub use pool::{Lookup, Resolve, Source, SystemResolver};
pub use request::{generation_request, RequestDefaults, MAX_STOPS, MAX_STOP_BYTES};
pub use server::{Verifier, VerifierBuilder, VerifierSettings, DEFAULT_SERVED_MODEL_NAME};
pub use tandem_serving::{Listeners, Running, Serve, ServeError};
