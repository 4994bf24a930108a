//! [`Target`] for Gemma 4 text: snapshot rows are the last hidden state (the final norm's
//! output, what the assistant drafter consumes) and the keys and values of any layer that
//! computes its own, read from the cache right after the forward appended them.

use std::sync::Arc;

use tandem_core::TargetIdentity;
use tandem_core::{SnapshotPart, SnapshotSpec, SnapshotSupport};
use tandem_gemma::gemma4::{Gemma4, Gemma4Cache};
use tandem_gemma::{LogitsMode, TargetHead};

use super::{Target, TargetFacts, TargetSequence, TargetStep};
use crate::error::{EngineError, Result};

/// A Gemma 4 target with its identity computed once (hashing the embedding is not free).
pub struct Gemma4Target {
    model: Arc<Gemma4>,
    identity: TargetIdentity,
}

impl Gemma4Target {
    /// Wraps a loaded model.
    pub fn new(model: Arc<Gemma4>) -> Result<Self> {
        let identity = model.embedding().identity()?;
        Ok(Self { model, identity })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Gemma4> {
        &self.model
    }
}

impl Target for Gemma4Target {
    fn facts(&self) -> TargetFacts {
        let cfg = self.model.config();
        TargetFacts {
            vocab_size: cfg.vocab_size,
            num_layers: cfg.num_layers(),
            hidden_size: cfg.hidden_size,
            max_context: cfg.max_position_embeddings,
            kv_bytes_per_position: cfg.kv_bytes_per_position(),
        }
    }

    fn identity(&self) -> Result<TargetIdentity> {
        Ok(self.identity.clone())
    }

    fn snapshot_support(&self) -> SnapshotSupport {
        let cfg = self.model.config();
        SnapshotSupport {
            layers: cfg.num_layers(),
            hidden: cfg.hidden_size,
            inner_taps: false,
            donors: (0..cfg.first_shared_layer())
                .map(|l| (l, cfg.layers[l].kv_dim()))
                .collect(),
        }
    }

    fn head(&self) -> Option<TargetHead> {
        None
    }

    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        Box::new(Sequence {
            model: &self.model,
            cache: self.model.new_cache(max_len),
        })
    }
}

struct Sequence<'m> {
    model: &'m Gemma4,
    cache: Gemma4Cache,
}

impl TargetSequence for Sequence<'_> {
    fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep> {
        let out = self.model.forward(tokens, pos, &mut self.cache, logits)?;
        let hidden = match spec.parts.is_empty() {
            true => Vec::new(),
            false => out.last_hidden.flatten_all()?.to_vec1::<f32>()?,
        };
        let mut snapshot = Vec::with_capacity(tokens.len() * spec.row_width());
        for r in 0..tokens.len() {
            for p in &spec.parts {
                snapshot.extend_from_slice(self.part(p.part, &hidden, pos + r, r)?);
            }
        }
        Ok(TargetStep {
            logits: out.logits,
            top: None,
            bounded: Vec::new(),
            snapshot,
            drawn: None,
        })
    }

    fn len(&self) -> usize {
        self.cache.len()
    }

    fn max_len(&self) -> usize {
        self.cache.max_len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        Ok(self.cache.truncate(len)?)
    }
}

impl Sequence<'_> {
    /// Part `part` of absolute position `pos`, block row `row`.
    fn part<'a>(
        &'a self,
        part: SnapshotPart,
        hidden: &'a [f32],
        pos: usize,
        row: usize,
    ) -> Result<&'a [f32]> {
        let cfg = self.model.config();
        let unavailable =
            || EngineError::InvalidRequest(format!("a Gemma 4 target cannot export {part}"));
        match part {
            SnapshotPart::Tap(l) if l == cfg.num_layers() => {
                let h = cfg.hidden_size;
                Ok(&hidden[row * h..(row + 1) * h])
            }
            SnapshotPart::Tap(_) => Err(unavailable()),
            SnapshotPart::DonorKey(l) | SnapshotPart::DonorValue(l) => {
                let kv = self.cache.layer_kv(l).ok_or_else(unavailable)?;
                let w = kv.kv_heads * kv.head_dim;
                let rows = match part {
                    SnapshotPart::DonorKey(_) => kv.k,
                    _ => kv.v,
                };
                Ok(&rows[pos * w..(pos + 1) * w])
            }
        }
    }
}
