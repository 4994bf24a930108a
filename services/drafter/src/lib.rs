//! The tandem drafter service: drafting sessions over gRPC (`tandem.v1.Drafter`) for any
//! [`tandem_core::Proposer`], with health, reflection and Prometheus metrics. The model
//! behind it (DSpark, an assistant drafter) is chosen by whoever builds the service.

mod error;
mod metrics;
mod server;
mod service;

pub use error::DrafterError;
pub use server::Drafter;
pub use service::{propose_request, DrafterConfig};
pub use tandem_serving::{Listeners, Running, Serve, ServeError};
