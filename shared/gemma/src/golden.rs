//! The golden fixtures of Gemma 3 against independent implementations
//! (`shared/gemma/tests/fixtures/gemma3_270m_*.json`, made by the scripts in
//! `scripts/golden/`): the format the golden tests and `tandem bench golden` read.

use serde::Deserialize;

/// A fixture: the reference's greedy continuations of some prompts.
#[derive(Debug, Clone, Deserialize)]
pub struct GoldenFixture {
    /// One per prompt.
    pub cases: Vec<GoldenCase>,
}

/// One prompt and what the reference made of it.
#[derive(Debug, Clone, Deserialize)]
pub struct GoldenCase {
    /// A short name for reports.
    pub name: String,
    /// The prompt, BOS included.
    pub prompt_ids: Vec<u32>,
    /// The reference's greedy continuation.
    pub generated_ids: Vec<u32>,
    /// The reference's top-1 minus top-2 logit at each generated step.
    pub step_margins: Vec<f32>,
    /// The reference's largest logits after the prompt, `(id, logit)`.
    pub first_logits_top: Vec<(u32, f32)>,
}

impl GoldenCase {
    /// The largest |ours − reference| over the reference's largest first logits, given our
    /// logits after the prompt (`None` when a reference id lies past them).
    pub fn first_logit_error(&self, logits: &[f32]) -> Option<f32> {
        self.first_logits_top
            .iter()
            .try_fold(0f32, |worst, (id, logit)| {
                Some(worst.max((logits.get(*id as usize)? - logit).abs()))
            })
    }
}
