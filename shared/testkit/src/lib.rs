//! The helpers every tandem crate's tests and benches share, in one place: where the real
//! models fetched by `scripts/fetch-models.sh` live (tests never download), a deterministic
//! pseudo-random source, exact and approximate float comparisons, reading a service's
//! `/metrics` page, throwaway TLS certificates, and the lock that keeps timed tests off
//! shared cores.
//!
//! The crate depends on no other tandem crate, so any of them can take it as a
//! dev-dependency without a second copy of itself being compiled. Fixtures of one model
//! crate live in that crate (e.g. `tandem_gemma::testing` behind its `testing` feature).

pub mod metrics;
mod models;
mod numbers;
mod pki;
pub mod timing;

pub use models::{
    existing, models_dir, real_gguf, real_tokenizer, MODELS_DIR_ENV, REAL_GGUF, REAL_TOKENIZER,
};
pub use numbers::{bits, max_abs_diff, Lcg};
pub use pki::{Leaf, Pki};
