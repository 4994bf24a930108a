//! [`Target`] for Gemma 3, on the CPU kernels or a candle device: snapshot rows are
//! hidden-state taps of any layer (DSpark's snapshot), interleaved per row in the spec's
//! order.

use candle_core::Tensor;
use tandem_core::TargetIdentity;
use tandem_core::{SnapshotPart, SnapshotSpec, SnapshotSupport};
use tandem_gemma::{
    DeviceGemma3, ForwardOptions, Gemma3, Gemma3Model, GemmaConfig, LogitsMode, SequenceCache,
    TargetHead,
};

use super::{Target, TargetFacts, TargetSequence, TargetStep};
use crate::error::{EngineError, Result};

/// `impl Target` for a [`Gemma3Model`]: the CPU kernels ([`Gemma3`]) or a candle device
/// ([`DeviceGemma3`], e.g. a CUDA GPU), alike but for where the weights and cache live.
macro_rules! gemma3_target {
    ($model:ty) => {
        impl Target for $model {
            fn facts(&self) -> TargetFacts {
                facts(Gemma3Model::config(self), self.kv_bytes_per_position())
            }

            fn identity(&self) -> Result<TargetIdentity> {
                Ok(Gemma3Model::head(self).identity()?)
            }

            fn snapshot_support(&self) -> SnapshotSupport {
                tap_support(Gemma3Model::config(self))
            }

            fn head(&self) -> Option<TargetHead> {
                Some(Gemma3Model::head(self))
            }

            fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
                Box::new(Sequence {
                    model: self,
                    cache: Gemma3Model::new_cache(self, max_len),
                })
            }

            fn captures_steps(&self) -> bool {
                Gemma3Model::captures_steps(self)
            }
        }
    };
}

gemma3_target!(Gemma3);
gemma3_target!(DeviceGemma3);

struct Sequence<'m, M: Gemma3Model> {
    model: &'m M,
    cache: M::Cache,
}

impl<M: Gemma3Model> TargetSequence for Sequence<'_, M> {
    fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep> {
        let opts = forward_options(logits, spec)?;
        let out = self.model.forward(tokens, pos, &mut self.cache, &opts)?;
        Ok(TargetStep {
            logits: out.logits,
            top: out.top,
            bounded: out.bounded,
            snapshot: interleave(&out.taps, tokens.len())?,
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

/// The forward options that produce `logits` and the taps of `spec` (a Gemma 3 snapshot
/// holds only taps).
pub(super) fn forward_options(logits: LogitsMode, spec: &SnapshotSpec) -> Result<ForwardOptions> {
    let taps = spec
        .parts
        .iter()
        .map(|p| match p.part {
            SnapshotPart::Tap(l) => Ok(l),
            other => Err(EngineError::InvalidRequest(format!(
                "a Gemma 3 target cannot export {other}"
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ForwardOptions { logits, taps })
}

/// The snapshot support of a Gemma 3 of `cfg`: taps of any layer.
fn tap_support(cfg: &GemmaConfig) -> SnapshotSupport {
    SnapshotSupport {
        layers: cfg.num_hidden_layers,
        hidden: cfg.hidden_size,
        inner_taps: true,
        donors: Vec::new(),
    }
}

/// The facts of a Gemma 3 of `cfg` whose cache holds `kv_bytes` per position.
fn facts(cfg: &GemmaConfig, kv_bytes: usize) -> TargetFacts {
    TargetFacts {
        vocab_size: cfg.vocab_size,
        num_layers: cfg.num_hidden_layers,
        hidden_size: cfg.hidden_size,
        max_context: cfg.max_position_embeddings,
        kv_bytes_per_position: kv_bytes,
    }
}

/// Interleaves `[rows, width]` taps into rows: row `r` is `[tap0[r]; tap1[r]; …]`.
pub(super) fn interleave(taps: &[Tensor], rows: usize) -> Result<Vec<f32>> {
    let taps: Vec<Vec<f32>> = taps
        .iter()
        .map(|t| t.flatten_all()?.to_vec1::<f32>())
        .collect::<candle_core::Result<_>>()?;
    let mut data = Vec::with_capacity(taps.iter().map(Vec::len).sum());
    for r in 0..rows {
        for tap in &taps {
            let w = tap.len() / rows;
            data.extend_from_slice(&tap[r * w..(r + 1) * w]);
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_interleave_taps() -> Result<()> {
        let dev = &candle_core::Device::Cpu;
        let a = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], (3, 2), dev)?;
        let b = Tensor::from_vec(vec![10f32, 20., 30., 40., 50., 60.], (3, 2), dev)?;
        let rows = interleave(&[a, b], 3)?;
        assert_eq!(
            rows,
            vec![1., 2., 10., 20., 3., 4., 30., 40., 5., 6., 50., 60.]
        );
        Ok(())
    }
}
