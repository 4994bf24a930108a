//! Drafter hyper-parameters (DSpark, arXiv 2607.05147, §3; the DFlash backbone of arXiv
//! 2602.06036), the target dimensions they are checked against, and the draft vocabulary:
//! the target token ids the drafter scores, mapped both ways.

use serde::{Deserialize, Serialize};
use tandem_gemma::TargetHead;

use crate::error::{DsparkError, Result};

/// Hyper-parameters of a DSpark drafter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsparkConfig {
    /// Block length: the anchor plus `gamma - 1` mask positions; at least 2.
    pub gamma: usize,
    /// Width of the draft backbone.
    pub d_draft: usize,
    /// Number of backbone layers.
    pub n_layers: usize,
    /// Attention heads per layer (must divide `d_draft`).
    pub n_heads: usize,
    /// Rank of the Markov head `W1 · W2`.
    pub markov_rank: usize,
    /// FFN width as a multiple of `d_draft`.
    pub ff_mult: usize,
    /// Tapped target layers: `i` below the target's layer count is the output of layer
    /// `i`, the layer count itself means the output of the final norm.
    pub tap_layers: Vec<usize>,
    /// Target token ids the drafter scores, in draft-index order; `None` = the full
    /// target vocabulary.
    #[serde(default)]
    pub draft_vocab: Option<Vec<u32>>,
}

/// What the drafter needs to know of its target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TargetDims {
    /// Target hidden size.
    pub hidden: usize,
    /// Target vocabulary size.
    pub vocab: usize,
    /// Number of target decoder layers.
    pub layers: usize,
    /// RMSNorm epsilon (the target's).
    pub eps: f64,
    /// The target's final logit soft-capping, when it has one.
    pub final_softcap: Option<f32>,
}

impl TargetDims {
    /// The dimensions of `head`'s target.
    pub fn of(head: &TargetHead) -> Self {
        Self {
            hidden: head.hidden(),
            vocab: head.vocab(),
            layers: head.config().num_hidden_layers,
            eps: head.eps(),
            final_softcap: head.final_softcap(),
        }
    }
}

impl DsparkConfig {
    /// A small drafter for `dims` (γ 8, width 256, 2 layers, Markov rank 64, taps at a third,
    /// two thirds and the end of the target plus its final norm, the first 32,768 ids as
    /// draft vocabulary): cheap to run untrained, for tests and demos.
    pub fn small(dims: &TargetDims) -> Self {
        let l = dims.layers;
        let mut taps = vec![l / 3, 2 * l / 3, l.saturating_sub(1), l];
        taps.dedup();
        Self {
            gamma: 8,
            d_draft: 256,
            n_layers: 2,
            n_heads: 8,
            markov_rank: 64,
            ff_mult: 2,
            tap_layers: taps,
            draft_vocab: Some((0..dims.vocab.min(32_768) as u32).collect()),
        }
    }

    /// Checks the config against itself and the target.
    pub fn validate(&self, dims: &TargetDims) -> Result<()> {
        let err = |m: String| Err(DsparkError::Config(m));
        let sizes = [
            ("d_draft", self.d_draft),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("markov_rank", self.markov_rank),
            ("ff_mult", self.ff_mult),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return err(format!("{name} must be at least 1"));
        }
        if self.gamma < 2 {
            return err(format!("gamma must be at least 2, got {}", self.gamma));
        }
        if !self.d_draft.is_multiple_of(self.n_heads) {
            return err(format!(
                "d_draft {} is not divisible by n_heads {}",
                self.d_draft, self.n_heads
            ));
        }
        if self.tap_layers.is_empty() {
            return err("tap_layers is empty".into());
        }
        if let Some(t) = self.tap_layers.iter().find(|t| **t > dims.layers) {
            return err(format!(
                "tap layer {t} is out of range (the target has {} layers; {} = final norm)",
                dims.layers, dims.layers
            ));
        }
        DraftVocab::new(self.draft_vocab.as_deref(), dims.vocab).map(|_| ())
    }
}

/// The draft vocabulary: draft index `i` scores target id `ids[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftVocab {
    ids: Vec<u32>,
    index: Vec<u32>,
}

impl DraftVocab {
    /// The vocabulary `ids` (or the full `target_vocab` when `None`). Fails on an empty
    /// list, ids outside the target vocabulary and duplicates.
    pub fn new(ids: Option<&[u32]>, target_vocab: usize) -> Result<Self> {
        let ids: Vec<u32> = match ids {
            Some(ids) => ids.to_vec(),
            None => (0..target_vocab as u32).collect(),
        };
        if ids.is_empty() {
            return Err(DsparkError::Config("the draft vocabulary is empty".into()));
        }
        let mut index = vec![u32::MAX; target_vocab];
        for (i, id) in ids.iter().enumerate() {
            let slot = index.get_mut(*id as usize).ok_or_else(|| {
                DsparkError::Config(format!(
                    "draft vocabulary id {id} is outside the target vocabulary of {target_vocab}"
                ))
            })?;
            if *slot != u32::MAX {
                return Err(DsparkError::Config(format!(
                    "draft vocabulary id {id} appears twice"
                )));
            }
            *slot = i as u32;
        }
        Ok(Self { ids, index })
    }

    /// Number of draft tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Always false: a draft vocabulary has at least one id.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Target ids in draft-index order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The target id of draft index `i` (`i < len()`).
    pub fn target_id(&self, i: usize) -> u32 {
        self.ids[i]
    }

    /// The draft index of target id `t`, if the drafter scores it.
    pub fn draft_index(&self, t: u32) -> Option<usize> {
        match self.index.get(t as usize) {
            Some(&i) if i != u32::MAX => Some(i as usize),
            _ => None,
        }
    }

    /// The Markov-head row of a previous token `t`: its draft index, or `len()` (the
    /// "outside the draft vocabulary" row).
    pub fn markov_row(&self, t: u32) -> usize {
        self.draft_index(t).unwrap_or(self.len())
    }
}
