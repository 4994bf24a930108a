//! [`Target`] for Gemma 3 on a candle device ([`DeviceGemma3`], e.g. a CUDA GPU): the
//! same snapshot rows and facts as the CPU Gemma 3 target, with the KV cache on the device.

use tandem_core::{SnapshotSpec, SnapshotSupport};
use tandem_gemma::{DeviceCache, DeviceGemma3, LogitsMode, TargetHead, TargetIdentity};

use super::gemma3::{facts, forward_options, interleave, tap_support};
use super::{Target, TargetFacts, TargetSequence, TargetStep};
use crate::error::Result;

impl Target for DeviceGemma3 {
    fn facts(&self) -> TargetFacts {
        facts(self.config())
    }

    fn identity(&self) -> Result<TargetIdentity> {
        Ok(DeviceGemma3::head(self).identity()?)
    }

    fn snapshot_support(&self) -> SnapshotSupport {
        tap_support(self.config())
    }

    fn head(&self) -> Option<TargetHead> {
        Some(DeviceGemma3::head(self))
    }

    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        Box::new(Sequence {
            model: self,
            cache: self.new_cache(max_len),
        })
    }
}

struct Sequence<'m> {
    model: &'m DeviceGemma3,
    cache: DeviceCache,
}

impl TargetSequence for Sequence<'_> {
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
            snapshot: interleave(&out.taps, tokens.len())?,
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
