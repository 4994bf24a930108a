//! What an engine's adaptive generations learnt about drafting, kept per sampling regime so
//! that the next generation of the same kind starts from it instead of a blind prior (a
//! drafter that does not pay at T = 0.7 is then not tried for the first rounds of every
//! request). Which γ a round drafts never changes the output, so memory shared by
//! generations that used different proposers costs speed at worst, never correctness.

use std::collections::HashMap;
use std::sync::Mutex;

use tandem_core::{GammaPolicy, GammaPolicyConfig, Learnt, SamplingParams};

/// Sampling settings that change how often drafts are accepted (the seed does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Regime {
    temperature: u32,
    top_k: Option<usize>,
    top_p: u32,
}

impl From<&SamplingParams> for Regime {
    fn from(s: &SamplingParams) -> Self {
        Self {
            temperature: s.temperature.to_bits(),
            top_k: s.top_k,
            top_p: s.top_p.to_bits(),
        }
    }
}

/// Learnt drafting figures by sampling regime.
#[derive(Debug, Default)]
pub(crate) struct PolicyMemory(Mutex<HashMap<Regime, Learnt>>);

impl PolicyMemory {
    /// A policy for a generation sampled with `sampling`, from what earlier ones learnt.
    pub(crate) fn policy(
        &self,
        cfg: GammaPolicyConfig,
        sampling: &SamplingParams,
    ) -> Result<GammaPolicy, String> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&Regime::from(sampling)) {
            Some(learnt) => GammaPolicy::with_learnt(cfg, learnt),
            None => GammaPolicy::new(cfg),
        }
    }

    /// Keeps what a finished generation's `policy` learnt.
    pub(crate) fn record(&self, sampling: &SamplingParams, policy: &GammaPolicy) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(Regime::from(sampling))
            .or_default()
            .absorb(policy.learnt());
    }
}
