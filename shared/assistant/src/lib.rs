//! The Gemma 4 assistant drafter ([`tandem_gemma::gemma4::Gemma4Assistant`]) as a
//! [`tandem_core::Proposer`]. It declares its snapshot: per committed position, the
//! target's last hidden state (the final norm's output) and the keys and values of the
//! target's last non-shared sliding and full layers, the donors its layers attend to. A
//! session mirrors exactly those rows and drafts γ tokens after an anchor by the
//! assistant's recurrence: the anchor at its position, the hidden state of the position
//! before it, every donor position before it (transformers' generation loop).
//!
//! Each drafted token is fed to the next step, as in transformers' loop, and chosen as the
//! request samples: greedy requests draft the greedy token and send point masses; sampled
//! requests draw each token from the distribution the request's temperature, top-k and
//! top-p make of the assistant's logits at that step (the centroid head's logits are
//! transformers' row: candidates scored, every other id at their lowest logit minus 1) and
//! send that exact distribution, so rejection sampling stays lossless. A session's draws
//! come from its own stream, seeded by the request seed XOR [`DRAFT_SEED_MIX`]. Each
//! token's confidence is the assistant's probability of it (greedy: at temperature 1),
//! calibrated when the assistant has a calibration ([`load_calibration`]).

mod calibration;
mod choice;
mod error;
mod proposer;
mod session;

pub use calibration::{load_calibration, save_calibration, CALIBRATION};
pub use error::AssistantError;
pub use proposer::{AssistantOptions, AssistantProposer, DRAFT_SEED_MIX};
