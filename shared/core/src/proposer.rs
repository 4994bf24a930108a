//! The narrow interface between the verifier's round and whatever drafts blocks (a DSpark
//! model in process, a remote drafter over gRPC, a test oracle). A session mirrors one
//! generation: the verifier sends it the snapshot rows of every committed position, in order
//! and exactly once, and asks it for a block after an anchor token. Dropping a session closes
//! it and frees what the proposer held for it.

use std::sync::Arc;

use crate::batching::StepObserver;
use crate::routed::RouteObserver;
use crate::sampling::{SamplingParams, SparseDist};
use crate::snapshot::{SnapshotRows, SnapshotSpec};

/// What the verifier asks for: `gamma` tokens following `anchor`, which sits at `position`
/// (the number of committed positions: the anchor itself is not yet committed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProposeRequest {
    /// The last token chosen by the target, not yet run through it.
    pub anchor: u32,
    /// The anchor's position.
    pub position: usize,
    /// Number of tokens to draft (at least 1).
    pub gamma: usize,
}

/// Where a block's tokens come from: the drafter's model, or a lookup in the generation's
/// own output. Calibration and the acceptance metrics keep the two apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DraftSource {
    /// Drafted by the model.
    #[default]
    Model,
    /// Copied from an earlier run of the context, prompt or output ([`crate::lookup`]).
    Lookup,
}

impl DraftSource {
    /// Both sources, in a fixed order.
    pub const ALL: [DraftSource; 2] = [DraftSource::Model, DraftSource::Lookup];

    /// A lower-case name for files, flags and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Lookup => "lookup",
        }
    }
}

/// A drafted block.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DraftBlock {
    /// Target token ids `d1..dγ`.
    pub tokens: Vec<u32>,
    /// The drafter's confidence that each token will be accepted, in [0, 1].
    pub confidences: Vec<f32>,
    /// The distribution each token was drawn from (a point mass when greedy); rejection
    /// sampling needs them exactly.
    pub dists: Vec<SparseDist>,
    /// What drafted the block.
    pub source: DraftSource,
    /// Whether `confidences` went through a fitted calibration ([`crate::calibration`]);
    /// the verifier cuts blocks on calibrated confidences only.
    pub calibrated: bool,
}

impl DraftBlock {
    /// A block of `tokens` each drawn from a point mass (a greedy drafter's block, or one
    /// looked up), every one sent with `confidence`.
    pub fn point_masses(tokens: Vec<u32>, confidence: f32) -> Self {
        Self {
            confidences: vec![confidence; tokens.len()],
            dists: tokens
                .iter()
                .map(|t| SparseDist {
                    ids: vec![*t],
                    probs: vec![1.0],
                })
                .collect(),
            tokens,
            ..Self::default()
        }
    }

    /// The same block, marked as drafted by `source`.
    pub fn from_source(self, source: DraftSource) -> Self {
        Self { source, ..self }
    }

    /// Keeps the first `keep` tokens (with their distributions and confidences) and returns
    /// the confidences of the tokens cut.
    pub fn cut(&mut self, keep: usize) -> Vec<f32> {
        self.tokens.truncate(keep);
        self.dists.truncate(keep);
        self.confidences.split_off(keep.min(self.confidences.len()))
    }
}

/// Why a proposer could not serve a call. Messages are one line, for users.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// The call does not fit the session (wrong row width, positions out of order, γ
    /// above the proposer's maximum, an anchor outside the vocabulary).
    #[error("invalid proposer call: {0}")]
    Invalid(String),
    /// The proposer cannot serve now (a remote drafter is gone, a model failed).
    #[error("proposer unavailable: {0}")]
    Unavailable(String),
}

/// Opens drafting sessions. Shared by all of a verifier's generations.
pub trait Proposer: Send + Sync {
    /// The snapshot rows this proposer consumes.
    fn snapshot_spec(&self) -> SnapshotSpec;
    /// The largest γ one proposal may ask for.
    fn max_gamma(&self) -> usize;
    /// Opens a session for one generation sampled with `sampling`.
    fn open(&self, sampling: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError>;
    /// Has `observer` told of every batched drafting step; false (and nothing happens)
    /// where sessions draft alone.
    fn observe_steps(&self, _observer: Arc<dyn StepObserver>) -> bool {
        false
    }
    /// Has `observer` told of every session's route and returns the routes' names; none
    /// (and nothing happens) where the proposer does not route ([`crate::routed`]).
    fn observe_routes(&self, _observer: Arc<dyn RouteObserver>) -> Vec<String> {
        Vec::new()
    }
    /// Pays what first use costs (a device drafter captures its steps as CUDA graphs)
    /// before traffic does: one greedy session over zero rows appended [`WARM_UP_PREFIX`]
    /// at once, then 1 to γ + 1 at a time, a block drafted after each. Every row carries
    /// [`WARM_UP_TOKEN`], as a verifier sends each row's token; the anchor (token 0) never
    /// occurs among them, so no lookup stands in for the model.
    fn warm_up(&self) -> Result<(), ProposeError> {
        let (width, gamma) = (self.snapshot_spec().row_width(), self.max_gamma());
        if gamma == 0 {
            return Ok(());
        }
        let mut session = self.open(&SamplingParams::default())?;
        let mut start = 0;
        for n in std::iter::once(WARM_UP_PREFIX).chain(1..=gamma + 1) {
            let data = vec![0.0; n * width];
            let tokens = vec![WARM_UP_TOKEN; n];
            session.extend(&SnapshotRows {
                start,
                width,
                data,
                tokens,
            })?;
            start += n;
            let req = ProposeRequest {
                anchor: 0,
                position: start,
                gamma,
            };
            session.propose(&req)?;
        }
        Ok(())
    }
}

/// Rows a [`Proposer::warm_up`] session starts with (a short prompt's).
pub const WARM_UP_PREFIX: usize = 32;
/// The token of every row of a [`Proposer::warm_up`] session (Gemma's `<bos>`).
pub const WARM_UP_TOKEN: u32 = 2;

/// One generation's drafting state. Dropping it closes the session.
pub trait ProposerSession: Send {
    /// Appends the snapshot rows of newly committed positions; `rows.start` must equal the
    /// number of positions already received.
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError>;
    /// Drafts a block. `req.position` must equal the number of positions received.
    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError>;
}
