//! The Gemma 4 assistant drafter ([`tandem_gemma::gemma4::Gemma4Assistant`]) as a
//! [`tandem_core::Proposer`]. It declares its snapshot: per committed position, the
//! target's last hidden state (the final norm's output) and the keys and values of the
//! target's last non-shared sliding and full layers, the donors its layers attend to. A
//! session mirrors exactly those rows and drafts γ tokens after an anchor by the
//! assistant's recurrence: the anchor at its position, the hidden state of the position
//! before it, every donor position before it (transformers' generation loop).
//!
//! Drafting is greedy: each block carries point masses, also for sampled requests, which
//! keeps rejection sampling exact (a token drawn from a point mass is accepted with
//! probability p(token)) but accepts less than sampling from the assistant would.

mod error;
mod proposer;
mod session;

pub use error::AssistantError;
pub use proposer::{AssistantOptions, AssistantProposer};
