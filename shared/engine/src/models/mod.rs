//! The engine's view of a target model: a narrow trait over what the round needs (a
//! forward over a block with a rollback-able cache, returning logits rows and the snapshot
//! rows a [`SnapshotSpec`] asks for; a few facts; the identity drafters are checked
//! against), implemented for Gemma 3 on the CPU kernels ([`tandem_gemma::Gemma3`]) or on a
//! candle device ([`tandem_gemma::DeviceGemma3`]) and Gemma 4 text
//! ([`tandem_gemma::gemma4::Gemma4`]).

/// The [`Target`] methods a batched target takes from the model it batches (its field
/// `model`) and from its stepper (`steps`) and step costs (`costs`): the same for the CPU
/// and the device batch.
macro_rules! batched_target_common {
    () => {
        fn facts(&self) -> TargetFacts {
            Target::facts(self.model.as_ref())
        }

        fn identity(&self) -> Result<TargetIdentity> {
            Target::identity(self.model.as_ref())
        }

        fn snapshot_support(&self) -> SnapshotSupport {
            Target::snapshot_support(self.model.as_ref())
        }

        fn head(&self) -> Option<TargetHead> {
            Target::head(self.model.as_ref())
        }

        fn observe_steps(&self, observer: Arc<dyn StepObserver>) -> bool {
            self.steps.observers.add(observer);
            true
        }

        fn step_costs(&self) -> Option<StepCosts> {
            Some(self.costs.clone())
        }
    };
}

mod batched;
mod batched_sequence;
mod device_batched;
mod gemma3;
mod gemma4;
mod stepper;

pub use batched::BatchedGemma3;
pub use device_batched::BatchedDeviceGemma3;
pub use gemma4::Gemma4Target;
pub use stepper::BatchLimits;
pub use tandem_core::batching::{StepObserver, StepReport};

use std::sync::Arc;

use candle_core::Tensor;
use tandem_core::{SnapshotSpec, SnapshotSupport};
use tandem_core::{StepCosts, TargetIdentity};
use tandem_gemma::{BoundedRow, LogitsMode, TargetHead, TopRow};

use crate::device_rows::draw_last_rows;
pub use crate::device_rows::Draw;
use crate::error::Result;

/// Sizes of a target the engine and the services plan with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetFacts {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Width of a hidden state.
    pub hidden_size: usize,
    /// Longest sequence.
    pub max_context: usize,
    /// KV-cache bytes one position costs.
    pub kv_bytes_per_position: usize,
}

/// What one forward over a block of `m` tokens returns.
#[derive(Debug)]
pub struct TargetStep {
    /// `[rows, vocab]` f32 logits (`rows` = `m`, 1 or 0 by [`LogitsMode`]).
    pub logits: Option<Tensor>,
    /// With [`LogitsMode::Top`], per row the ids that can rank among its `k` largest
    /// logits, with those logits, where the target finds them without all logits.
    pub top: Option<Vec<TopRow>>,
    /// With [`LogitsMode::Bounded`], the last row's logits as bounds, with
    /// [`LogitsMode::BoundedAll`] every row's, where the target gives them (else `logits`
    /// holds those rows).
    pub bounded: Vec<BoundedRow>,
    /// `m` snapshot rows of the requested spec, row-major.
    pub snapshot: Vec<f32>,
    /// From [`TargetSequence::forward_drawn`], the token its draw landed on.
    pub drawn: Option<u32>,
}

/// A target model, shared by all generations.
pub trait Target: Send + Sync {
    /// Its sizes.
    fn facts(&self) -> TargetFacts;
    /// Which target this is (drafters made for another one are refused).
    fn identity(&self) -> Result<TargetIdentity>;
    /// The snapshot parts it can export.
    fn snapshot_support(&self) -> SnapshotSupport;
    /// The Gemma 3 input embedding and output head a DSpark drafter scores through, when
    /// this target has one.
    fn head(&self) -> Option<TargetHead>;
    /// A fresh sequence (an empty KV cache) of at most `max_len` positions.
    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_>;
    /// Whether a block shape costs more the first time it runs (CUDA graphs captured on
    /// first use), so that [`crate::Engine::warm_up`] should run them before traffic.
    fn captures_steps(&self) -> bool {
        false
    }
    /// Whether concurrent generations share forwards ([`BatchedGemma3`]); where they do,
    /// `observer` receives every step's figures from now on.
    fn observe_steps(&self, observer: Arc<dyn StepObserver>) -> bool {
        let _ = observer;
        false
    }
    /// Where generations share steps on a device, runs (and so captures) the shared steps
    /// of blocks of 1 to `rows` tokens with `spec`'s snapshot for every batch size; returns
    /// the step shapes built (0 elsewhere).
    fn warm_batches(&self, spec: &SnapshotSpec, rows: usize) -> Result<usize> {
        let _ = (spec, rows);
        Ok(0)
    }
    /// The measured seconds of a batched step by its rows, where generations share steps.
    fn step_costs(&self) -> Option<StepCosts> {
        None
    }
}

/// One sequence on a target: its KV cache and the forward that extends it.
pub trait TargetSequence: Send {
    /// Runs `tokens` at positions `pos..pos + m` (`pos` must be [`Self::len`]) and returns
    /// the logits `logits` asks for and the rows of `spec` (which must fit the target's
    /// [`Target::snapshot_support`]) for every block position.
    fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep>;
    /// Committed positions.
    fn len(&self) -> usize;
    /// Whether no position is committed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The most positions the sequence may hold.
    fn max_len(&self) -> usize;
    /// Rolls back to the first `len` positions.
    fn truncate(&mut self, len: usize) -> Result<()>;
    /// Says that the generation now waits on its proposer, `expected` seconds by its own
    /// measure (`None`: no measure). A batched target's steps keep waiting for this
    /// sequence where that fits the wait a step gives late forwards (the draft then joins
    /// the next step instead of missing it); otherwise they stop waiting for it until its
    /// next forward.
    fn step_aside(&mut self, expected: Option<f64>) {
        let _ = expected;
    }
    /// Whether [`Self::forward_drawn`] draws in steps shared with other sequences (a
    /// device's batched steps: the step's draws are made together); elsewhere a plain
    /// sampled round does better to run its rule on the row itself.
    fn draws_in_steps(&self) -> bool {
        false
    }
    /// [`Self::forward`] with every row's logits, and the token `draw` lands on in the last
    /// row's distribution at its temperature (as sampled rows reduced on a device are
    /// drawn from), in [`TargetStep::drawn`].
    fn forward_drawn(
        &mut self,
        tokens: &[u32],
        pos: usize,
        draw: Draw,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep> {
        let mut step = self.forward(tokens, pos, LogitsMode::All, spec)?;
        if let Some(logits) = &step.logits {
            step.drawn = draw_last_rows(&[(logits, draw)])?.pop();
        }
        Ok(step)
    }
}
