//! [`Dspark`]: a DSpark drafter (arXiv 2607.05147) with the DFlash KV-injection backbone
//! (arXiv 2602.06036), bound to one target by its [`TargetIdentity`]. The model is
//! immutable apart from its `Var`s, which a trainer updates in place.

use std::collections::HashMap;

use candle_core::{Device, Var};
use tandem_gemma::{TargetHead, TargetIdentity};

use crate::backbone::Shape;
use crate::config::{DraftVocab, DsparkConfig, TargetDims};
use crate::error::{DsparkError, Result};
use crate::params::Params;

/// A DSpark drafter.
pub struct Dspark {
    pub(crate) cfg: DsparkConfig,
    pub(crate) dims: TargetDims,
    pub(crate) target: TargetIdentity,
    pub(crate) vocab: DraftVocab,
    pub(crate) params: Params,
}

impl Dspark {
    /// A freshly initialised drafter for `head`'s target, reproducible from `seed`.
    pub fn init(cfg: DsparkConfig, head: &TargetHead, seed: u64) -> Result<Self> {
        let dims = TargetDims::of(head);
        cfg.validate(&dims)?;
        let vocab = DraftVocab::new(cfg.draft_vocab.as_deref(), dims.vocab)?;
        let params = Params::init(&cfg, &dims, vocab.len(), seed)?;
        Ok(Self {
            target: head.identity()?,
            cfg,
            dims,
            vocab,
            params,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DsparkConfig {
        &self.cfg
    }

    /// The target dimensions the drafter was built for.
    pub fn dims(&self) -> &TargetDims {
        &self.dims
    }

    /// The identity of the target the drafter was built for.
    pub fn target_identity(&self) -> &TargetIdentity {
        &self.target
    }

    /// The draft vocabulary.
    pub fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    /// Floats per snapshot row: one target hidden vector per tapped layer.
    pub fn row_width(&self) -> usize {
        self.cfg.tap_layers.len() * self.dims.hidden
    }

    /// The same drafter with its parameters copied to `device`, as fresh `Var`s (training
    /// the copy leaves this one unchanged).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        let tensors = self
            .vars()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().detach().to_device(device)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(Self {
            cfg: self.cfg.clone(),
            dims: self.dims,
            target: self.target.clone(),
            vocab: self.vocab.clone(),
            params: Params::from_tensors(&self.cfg, &self.dims, self.vocab.len(), tensors)?,
        })
    }

    /// Every trainable parameter with its name, in canonical order. The `Var`s share
    /// storage with the model: an optimizer stepping them updates the drafter.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.params.named()
    }

    pub(crate) fn check_target(&self, head: &TargetHead) -> Result<()> {
        let found = head.identity()?;
        if found != self.target {
            return Err(DsparkError::TargetMismatch {
                expected: self.target.clone(),
                found,
            });
        }
        Ok(())
    }

    pub(crate) fn shape(&self) -> Shape {
        Shape {
            heads: self.cfg.n_heads,
            eps: self.dims.eps,
        }
    }
}
