//! [`Dspark`]: a DSpark drafter (arXiv 2607.05147) with the DFlash KV-injection backbone
//! (arXiv 2602.06036), bound to one target by its [`TargetIdentity`]. The model is
//! immutable apart from its `Var`s, which a trainer updates in place.

use std::collections::HashMap;

use candle_core::{Device, Tensor, Var};
use tandem_core::TargetIdentity;
use tandem_gemma::TargetHead;

use crate::backbone::Shape;
use crate::config::{DraftVocab, DsparkConfig, TargetDims};
use crate::error::{DsparkError, Result};
use crate::params::{normal_values, Params};

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
        let tensors = self.tensors_on(device)?;
        Ok(Self {
            cfg: self.cfg.clone(),
            dims: self.dims,
            target: self.target.clone(),
            vocab: self.vocab.clone(),
            params: Params::from_tensors(&self.cfg, &self.dims, self.vocab.len(), tensors)?,
        })
    }

    /// The same drafter over the draft vocabulary `ids`: the Markov head keeps the rows of
    /// `W1` and columns of `W2` of ids in both vocabularies (and `W1`'s row for tokens
    /// outside it), those of new ids start as [`Dspark::init`] starts them (normal rows of
    /// `W1` drawn from `seed`, zero columns of `W2`); every other parameter is copied.
    pub fn with_draft_vocab(&self, ids: Vec<u32>, seed: u64) -> Result<Self> {
        let cfg = DsparkConfig {
            draft_vocab: Some(ids),
            ..self.cfg.clone()
        };
        cfg.validate(&self.dims)?;
        let vocab = DraftVocab::new(cfg.draft_vocab.as_deref(), self.dims.vocab)?;
        let (r, vd_old) = (cfg.markov_rank, self.vocab.len());
        let w1_old = self.params.markov_w1.as_tensor().to_device(&Device::Cpu)?;
        let w1_old = w1_old.flatten_all()?.to_vec1::<f32>()?;
        let w2_old = self.params.markov_w2.as_tensor().to_device(&Device::Cpu)?;
        let w2_old = w2_old.to_vec2::<f32>()?;
        let fresh = normal_values(vocab.len() * r, seed)?;
        let (mut w1, mut w2) = (
            Vec::with_capacity((vocab.len() + 1) * r),
            vec![Vec::new(); r],
        );
        for (i, &id) in vocab.ids().iter().enumerate() {
            let old = self.vocab.draft_index(id);
            match old {
                Some(j) => w1.extend_from_slice(&w1_old[j * r..(j + 1) * r]),
                None => w1.extend_from_slice(&fresh[i * r..(i + 1) * r]),
            }
            for (k, col) in w2.iter_mut().enumerate() {
                col.push(old.map_or(0.0, |j| w2_old[k][j]));
            }
        }
        w1.extend_from_slice(&w1_old[vd_old * r..(vd_old + 1) * r]);
        let mut tensors = self.tensors_on(&Device::Cpu)?;
        let vd = vocab.len();
        tensors.insert(
            "markov.w1".into(),
            Tensor::from_vec(w1, (vd + 1, r), &Device::Cpu)?,
        );
        let w2: Vec<f32> = w2.concat();
        tensors.insert(
            "markov.w2".into(),
            Tensor::from_vec(w2, (r, vd), &Device::Cpu)?,
        );
        Ok(Self {
            params: Params::from_tensors(&cfg, &self.dims, vd, tensors)?,
            cfg,
            dims: self.dims,
            target: self.target.clone(),
            vocab,
        })
    }

    /// Every trainable parameter with its name, in canonical order. The `Var`s share
    /// storage with the model: an optimizer stepping them updates the drafter.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.params.named()
    }

    /// A detached copy of every parameter on `device`, by name (what a reshaped drafter
    /// is assembled from).
    pub(crate) fn tensors_on(&self, device: &Device) -> Result<HashMap<String, Tensor>> {
        self.vars()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().detach().to_device(device)?)))
            .collect()
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
