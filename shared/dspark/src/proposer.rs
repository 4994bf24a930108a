//! [`DsparkProposer`]: the DSpark drafter (arXiv 2607.05147) behind tandem's `Proposer`
//! interface. Each session owns a context cache and a seeded sampler whose stream is
//! derived from the request seed but differs from the verifier's.

use std::sync::Arc;

use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession, Sampler, SamplingParams,
    SnapshotRows, SnapshotSpec,
};
use tandem_gemma::TargetHead;

use crate::draft::{ContextCache, DraftRequest, Drafter};
use crate::error::{DsparkError, Result};
use crate::model::Dspark;

/// XORed into the request seed so the drafter's key stream is not the verifier's.
const DRAFT_SEED_MIX: u64 = 0xD5FA_4C0D_E5EE_D001;

/// A DSpark drafter serving sessions.
pub struct DsparkProposer {
    drafter: Arc<Drafter>,
    max_gamma: usize,
    spec: SnapshotSpec,
}

impl DsparkProposer {
    /// A proposer for `model` drafting through `target`'s head (checked to be the target
    /// the model was made for).
    pub fn new(model: Arc<Dspark>, target: &TargetHead) -> Result<Self> {
        Ok(Self {
            drafter: Arc::new(model.drafter(target)?),
            max_gamma: model.config().gamma,
            spec: SnapshotSpec::taps(&model.config().tap_layers, model.dims().hidden),
        })
    }
}

impl Proposer for DsparkProposer {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.spec.clone()
    }

    fn max_gamma(&self) -> usize {
        self.max_gamma
    }

    fn open(
        &self,
        sampling: &SamplingParams,
    ) -> std::result::Result<Box<dyn ProposerSession>, ProposeError> {
        let params = SamplingParams {
            seed: sampling.seed ^ DRAFT_SEED_MIX,
            ..*sampling
        };
        let sampler = Sampler::new(params).map_err(|e| ProposeError::Invalid(e.to_string()))?;
        Ok(Box::new(DsparkSession {
            cache: self.drafter.new_cache(),
            drafter: Arc::clone(&self.drafter),
            sampler,
        }))
    }
}

/// One generation's drafting state.
struct DsparkSession {
    drafter: Arc<Drafter>,
    cache: ContextCache,
    sampler: Sampler,
}

fn to_propose_error(e: DsparkError) -> ProposeError {
    match e {
        DsparkError::Invalid(m) => ProposeError::Invalid(m),
        other => ProposeError::Unavailable(other.to_string()),
    }
}

impl ProposerSession for DsparkSession {
    fn extend(&mut self, rows: &SnapshotRows) -> std::result::Result<(), ProposeError> {
        let width = self.drafter.row_width();
        if rows.width != width || !rows.data.len().is_multiple_of(width) {
            return Err(ProposeError::Invalid(format!(
                "snapshot rows of width {} ({} floats), expected width {width}",
                rows.width,
                rows.data.len()
            )));
        }
        if rows.start != self.cache.len() {
            return Err(ProposeError::Invalid(format!(
                "rows start at position {}, but {} positions were received",
                rows.start,
                self.cache.len()
            )));
        }
        self.drafter
            .extend(&mut self.cache, &rows.data)
            .map_err(to_propose_error)
    }

    fn propose(&mut self, req: &ProposeRequest) -> std::result::Result<DraftBlock, ProposeError> {
        if req.position != self.cache.len() {
            return Err(ProposeError::Invalid(format!(
                "proposal at position {}, but {} positions were received",
                req.position,
                self.cache.len()
            )));
        }
        let draft = DraftRequest {
            anchor: req.anchor,
            gamma: req.gamma,
        };
        self.drafter
            .draft(&self.cache, &draft, &mut self.sampler)
            .map_err(to_propose_error)
    }
}
