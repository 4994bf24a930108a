//! Helpers of the Gemma 4 tests: the tiny random checkpoints of the transformers goldens,
//! the target's prefill and the assistant's rows drafting from its anchors.

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use tandem_gemma::gemma4::{Donors, DraftRow, Gemma4, Gemma4Cache};
use tandem_gemma::LogitsMode;

/// The folder of the tiny checkpoints and the goldens.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma4")
}

/// The rows of a 2-d f32 tensor.
pub fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().expect("2-d f32")
}

/// Runs `prompt` on a fresh cache: the cache, every position's logits and final hidden state.
pub fn prefill(model: &Gemma4, prompt: &[u32]) -> (Gemma4Cache, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut cache = model.new_cache(64);
    let out = model
        .forward(prompt, 0, &mut cache, LogitsMode::All)
        .expect("forward");
    let logits = rows(out.logits.as_ref().expect("logits"));
    (cache, logits, rows(&out.last_hidden))
}

/// One assistant row per anchor position of `prompt`, from the prompt's hidden states.
pub fn anchor_rows<'a>(
    prompt: &[u32],
    hidden: &'a [Vec<f32>],
    anchors: impl IntoIterator<Item = usize>,
    donors: Donors<'a>,
) -> Vec<DraftRow<'a>> {
    anchors
        .into_iter()
        .map(|anchor| DraftRow {
            token: prompt[anchor],
            hidden: &hidden[anchor],
            position: anchor,
            donors,
        })
        .collect()
}
