//! Distils a DSpark drafter (arXiv 2607.05147) from a Gemma target, on the CPU or a GPU.
//!
//! * [`corpus`]: prompts from text files, with a held-out split by file.
//! * [`teacher`]: the target generates each prompt's continuation and records the hidden
//!   taps and next-token distributions the drafter learns from.
//! * [`topk`]: the teacher's kept ids of many rows at once, narrowed on the device.
//! * [`store`]: generated samples kept on disk across runs.
//! * [`batch`]: the draft vocabulary, random anchors, and batch tensors.
//! * [`loss`]: 0.1·CE + 0.9·TV + BCE(confidence → 1 − TV), position-weighted.
//! * [`optim`]: AdamW with exposed moments, warm-up + cosine schedule.
//! * [`trainer`] and [`checkpoint`]: the loop, held-out evaluation, exact resume.

pub mod batch;
pub mod checkpoint;
pub mod corpus;
mod error;
pub mod loss;
pub mod optim;
pub mod store;
pub mod teacher;
pub mod topk;
pub mod trainer;

pub use error::{Result, TrainError};
pub use trainer::{EvalReport, Event, StepReport, TrainConfig, Trainer};
