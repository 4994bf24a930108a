//! Gemma 4 text (Google DeepMind, Gemma 4, 2026) and its assistant drafter, in f32 on the
//! CPU, checked against transformers 5.24 (`models/gemma4/modeling_gemma4.py`,
//! `models/gemma4_assistant/modeling_gemma4_assistant.py`) by the golden tests in
//! `tests/gemma4.rs` and, for the assistant's per-step distributions, `tests/gemma4_dists.rs`
//! (fixtures made by scripts/golden/gemma4_transformers.py).
//!
//! [`Gemma4`] loads the HF layout and runs a block of tokens against a caller-owned
//! [`Gemma4Cache`], returning logits and the last hidden state; the cache exposes the donor
//! keys and values the [`Gemma4Assistant`] attends to.

mod assistant;
mod block;
mod cache;
mod config;
mod draft_head;
mod model;
mod ple;

pub use assistant::{Draft, DraftRow, Gemma4Assistant};
pub use cache::{DonorKv, Donors, Gemma4Cache};
pub use config::{AssistantConfig, Gemma4Config, LayerSpec, RopeParams};
pub use draft_head::greedy_token;
pub use model::{Gemma4, Gemma4Embedding, Gemma4Output};
