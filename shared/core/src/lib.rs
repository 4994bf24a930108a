//! The pure core of tandem: sampling, the acceptance rules of speculative decoding, the
//! adaptive draft length, the batch's draft scheduler, how batching threads form their
//! steps and the proposer interface the round drafts through. No tensors, no I/O: plain
//! slices in, plain values out, deterministic given a seed.

pub mod ab;
pub mod acceptance;
pub mod batching;
pub mod block;
pub mod bounded;
pub mod bounded_rows;
pub mod calibration;
pub mod controls;
pub mod cut;
pub mod gamma;
pub mod identity;
pub mod logprobs;
pub mod lookup;
pub mod proposer;
pub mod routed;
pub mod router;
pub mod rows;
pub mod sampling;
pub mod schedule;
pub mod snapshot;
pub mod stopping;

pub use ab::{AbError, ArmSummary, Comparison, Interval, PromptRun};
pub use acceptance::{
    accept_greedy, accept_sampled, accept_sampled_rows, accept_seeded, accept_seeded_rows,
    keyed_uniform, Verdict, Verification,
};
pub use batching::{StepObserver, StepReport};
pub use block::{accept_block, BlockPlan, ExpectedKept};
pub use bounded::{draw_bounded, Proposal};
pub use bounded_rows::{BoundedLogits, BoundedRows};
pub use controls::{min_p_mask, ControlError, History, LogitControls, Penalties};
pub use gamma::{GammaPolicy, GammaPolicyConfig, Learnt, Observed, CARRIED_ROUNDS};
pub use identity::TargetIdentity;
pub use logprobs::{token_logprob, TokenLogprob, MAX_TOP_LOGPROBS};
pub use proposer::{
    DraftBlock, DraftSource, ProposeError, ProposeRequest, Proposer, ProposerSession,
};
pub use routed::{Route, RouteObserver, Routed};
pub use router::{FitConfig, RouterError, TokenRouter};
pub use rows::{BuiltRows, TargetRows};
pub use sampling::{
    argmax, distribution, distribution_of, Sampler, SamplingError, SamplingParams, SparseDist,
};
pub use schedule::{allocate, survivals, BatchPlan, Drafts, Standing, StepCosts, Unscheduled};
pub use snapshot::{PartSpec, SnapshotPart, SnapshotRows, SnapshotSpec, SnapshotSupport};
pub use stopping::{Chunk, FinishReason, Output, StopConfig};
