//! [`DsparkProposer`]: the DSpark drafter (arXiv 2607.05147) behind tandem's `Proposer`
//! interface. Each session owns a context cache and a seeded sampler whose stream is
//! derived from the request seed but differs from the verifier's. Unless switched off, a
//! session first looks the anchor up in the context ([`tandem_core::lookup`]: the prompt
//! and the output, when the verifier sends each row's token; the output it drafted
//! otherwise): when the last tokens repeat an earlier run, what followed it is proposed
//! (each token a point mass, so sampled rounds stay exact) and the model is not run. With
//! a calibration ([`Calibration`]), a session calibrates every block's confidences for its
//! sampling regime and its source before sending it.

use std::sync::Arc;

use candle_core::Device;

use tandem_core::batching::StepObserver;
use tandem_core::calibration::{Calibration, Regime};
use tandem_core::lookup::History;
use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession, Sampler, SamplingParams,
    SnapshotRows, SnapshotSpec,
};
use tandem_gemma::TargetHead;

use crate::batched::{BatchedDrafter, DraftBatching};
use crate::device::DeviceDrafter;
use crate::device_context::DeviceContext;
use crate::draft::{ContextCache, DraftRequest, Drafter};
use crate::error::{DsparkError, Result};
use crate::model::Dspark;

/// XORed into the request seed so the drafter's key stream is not the verifier's.
const DRAFT_SEED_MIX: u64 = 0xD5FA_4C0D_E5EE_D001;

/// What a DSpark proposer drafts with: the host [`Drafter`] or a [`DeviceDrafter`], each
/// with its own per-session context.
pub trait BlockDrafter: Send + Sync + 'static {
    /// A session's projected context.
    type Context: Send + 'static;
    /// Floats per snapshot row.
    fn row_width(&self) -> usize;
    /// An empty context.
    fn new_context(&self) -> Self::Context;
    /// Positions `ctx` holds.
    fn context_len(ctx: &Self::Context) -> usize;
    /// Appends the rows of the next committed positions.
    fn extend(&self, ctx: &mut Self::Context, rows: &[f32]) -> Result<()>;
    /// Drafts a block.
    fn draft(
        &self,
        ctx: &mut Self::Context,
        req: &DraftRequest,
        s: &mut Sampler,
    ) -> Result<DraftBlock>;
    /// Has `observer` told of every batched step; false where sessions draft alone.
    fn observe_steps(&self, _observer: Arc<dyn StepObserver>) -> bool {
        false
    }
}

impl BlockDrafter for Drafter {
    type Context = ContextCache;
    fn row_width(&self) -> usize {
        Drafter::row_width(self)
    }
    fn new_context(&self) -> ContextCache {
        self.new_cache()
    }
    fn context_len(ctx: &ContextCache) -> usize {
        ctx.len()
    }
    fn extend(&self, ctx: &mut ContextCache, rows: &[f32]) -> Result<()> {
        Drafter::extend(self, ctx, rows)
    }
    fn draft(
        &self,
        ctx: &mut ContextCache,
        req: &DraftRequest,
        s: &mut Sampler,
    ) -> Result<DraftBlock> {
        Drafter::draft(self, ctx, req, s)
    }
}

impl BlockDrafter for DeviceDrafter {
    type Context = DeviceContext;
    fn row_width(&self) -> usize {
        DeviceDrafter::row_width(self)
    }
    fn new_context(&self) -> DeviceContext {
        DeviceDrafter::new_context(self)
    }
    fn context_len(ctx: &DeviceContext) -> usize {
        ctx.len()
    }
    fn extend(&self, ctx: &mut DeviceContext, rows: &[f32]) -> Result<()> {
        DeviceDrafter::extend(self, ctx, rows)
    }
    fn draft(
        &self,
        ctx: &mut DeviceContext,
        req: &DraftRequest,
        s: &mut Sampler,
    ) -> Result<DraftBlock> {
        DeviceDrafter::draft(self, ctx, req, s)
    }
}

/// A DSpark drafter serving sessions, on the host ([`Drafter`], the default) or on a
/// candle device ([`DeviceDrafter`]).
pub struct DsparkProposer<D: BlockDrafter = Drafter> {
    drafter: Arc<D>,
    max_gamma: usize,
    spec: SnapshotSpec,
    lookup: bool,
    calibration: Option<Arc<Calibration>>,
}

impl DsparkProposer {
    /// A proposer for `model` drafting on the host through `target`'s head (checked to be
    /// the target the model was made for).
    pub fn new(model: Arc<Dspark>, target: &TargetHead) -> Result<Self> {
        Self::with(model.drafter(target)?, &model)
    }
}

impl DsparkProposer<BatchedDrafter> {
    /// A proposer for `model` drafting on the host through `target`'s head, the blocks of
    /// sessions that ask together drafted in one pass ([`BatchedDrafter`]).
    pub fn batched(
        model: Arc<Dspark>,
        target: &TargetHead,
        batching: DraftBatching,
    ) -> Result<Self> {
        Self::with(
            BatchedDrafter::new(model.drafter(target)?, batching)?,
            &model,
        )
    }
}

impl DsparkProposer<DeviceDrafter> {
    /// A proposer for `model` drafting on `device` through `target`'s head, its steps
    /// captured as CUDA graphs where `graphs` is on and `device` is a CUDA GPU.
    pub fn on_device(
        model: Arc<Dspark>,
        target: &TargetHead,
        device: &Device,
        graphs: bool,
    ) -> Result<Self> {
        Self::with(model.device_drafter(target, device, graphs)?, &model)
    }
}

impl<D: BlockDrafter> DsparkProposer<D> {
    fn with(drafter: D, model: &Dspark) -> Result<Self> {
        Ok(Self {
            drafter: Arc::new(drafter),
            max_gamma: model.config().gamma,
            spec: SnapshotSpec::taps(&model.config().tap_layers, model.dims().hidden),
            lookup: true,
            calibration: None,
        })
    }

    /// The same proposer with lookup in the generation's output on or off (on by default).
    pub fn with_lookup(self, lookup: bool) -> Self {
        Self { lookup, ..self }
    }

    /// The same proposer calibrating its confidences with `calibration` (none: raw).
    pub fn with_calibration(self, calibration: Option<Calibration>) -> Self {
        Self {
            calibration: calibration.map(Arc::new),
            ..self
        }
    }
}

impl<D: BlockDrafter> Proposer for DsparkProposer<D> {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.spec.clone()
    }

    fn max_gamma(&self) -> usize {
        self.max_gamma
    }

    fn observe_steps(&self, observer: Arc<dyn StepObserver>) -> bool {
        self.drafter.observe_steps(observer)
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
        Ok(Box::new(DsparkSession::<D> {
            cache: self.drafter.new_context(),
            drafter: Arc::clone(&self.drafter),
            sampler,
            history: self.lookup.then(History::default),
            regime: self
                .calibration
                .as_ref()
                .and_then(|c| c.regime(sampling.temperature))
                .cloned(),
        }))
    }
}

/// One generation's drafting state.
struct DsparkSession<D: BlockDrafter> {
    drafter: Arc<D>,
    cache: D::Context,
    sampler: Sampler,
    /// The generation's committed tokens as far as the session can tell (lookup on).
    history: Option<History>,
    /// The calibration of the generation's sampling regime.
    regime: Option<Regime>,
}

fn to_propose_error(e: DsparkError) -> ProposeError {
    match e {
        DsparkError::Invalid(m) => ProposeError::Invalid(m),
        other => ProposeError::Unavailable(other.to_string()),
    }
}

impl<D: BlockDrafter> ProposerSession for DsparkSession<D> {
    fn extend(&mut self, rows: &SnapshotRows) -> std::result::Result<(), ProposeError> {
        let width = self.drafter.row_width();
        if rows.width != width || !rows.data.len().is_multiple_of(width) {
            return Err(ProposeError::Invalid(format!(
                "snapshot rows of width {} ({} floats), expected width {width}",
                rows.width,
                rows.data.len()
            )));
        }
        if rows.start != D::context_len(&self.cache) {
            return Err(ProposeError::Invalid(format!(
                "rows start at position {}, but {} positions were received",
                rows.start,
                D::context_len(&self.cache)
            )));
        }
        let n = rows.data.len() / width;
        if !rows.tokens.is_empty() && rows.tokens.len() != n {
            return Err(ProposeError::Invalid(format!(
                "{} tokens for {n} snapshot rows",
                rows.tokens.len()
            )));
        }
        self.drafter
            .extend(&mut self.cache, &rows.data)
            .map_err(to_propose_error)?;
        if let Some(h) = &mut self.history {
            h.committed(rows.start, n, &rows.tokens);
        }
        Ok(())
    }

    fn propose(&mut self, req: &ProposeRequest) -> std::result::Result<DraftBlock, ProposeError> {
        if req.position != D::context_len(&self.cache) {
            return Err(ProposeError::Invalid(format!(
                "proposal at position {}, but {} positions were received",
                req.position,
                D::context_len(&self.cache)
            )));
        }
        if let Some(h) = &mut self.history {
            h.observe(req.position);
        }
        let looked_up = (self.history.as_ref()).and_then(|h| h.proposal(req.anchor, req.gamma));
        let mut block = match looked_up {
            Some(block) => block,
            None => {
                let draft = DraftRequest {
                    anchor: req.anchor,
                    gamma: req.gamma,
                };
                self.drafter
                    .draft(&mut self.cache, &draft, &mut self.sampler)
                    .map_err(to_propose_error)?
            }
        };
        if let Some(h) = &mut self.history {
            h.proposed(req.position, req.anchor, &block.tokens);
        }
        if let Some(r) = &self.regime {
            block.calibrated = r.apply(block.source, &mut block.confidences);
        }
        Ok(block)
    }
}
