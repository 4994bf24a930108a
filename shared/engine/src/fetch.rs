//! Sampled verification that reads each row of logits only when the acceptance rule
//! reaches it (from a device: copies it to the host then). A token-wise rule stops at the
//! first rejection, so a γ = 8 round copies τ of its 9 rows of 262,144 logits (1 MB each)
//! instead of all of them; on an H100 a sampled verify round took 7.2 ms against 1.3 ms
//! greedy, most of it copying and cloning full rows. Sampling at a temperature alone, a
//! row on a device is not copied at all: [`DeviceRows`] reduces it where it is, or for a
//! plain round on a target that draws in its shared steps, the step draws ([`plain_draw`]).

use std::sync::Mutex;

use candle_core::Tensor;
use tandem_core::{
    distribution, DraftBlock, ExpectedKept, LogitControls, Sampler, SparseDist, Verdict,
    Verification,
};

use crate::device_rows::{reduces_on_device, DeviceRows, Draw};
use crate::error::Result;

/// Whether [`accept_fetching`] serves a sampled round under `verification`: a rule that
/// reads rows in order on the calling thread (block verification reads them all, on
/// several threads).
pub(crate) fn fetches(verification: Verification) -> bool {
    verification != Verification::Block
}

/// The draw a plain round (an empty draft) asks of a target that draws in its shared
/// steps, where the round's rule would reduce its row on the device and draw from it: a
/// temperature alone, no logit controls, no log-probabilities (`full`: the round wants
/// every logit as it is), a rule that reads rows in order. The uniform is the rule's
/// (taken from `sampler` token-wise); `first` is the generation's output length.
pub(crate) fn plain_draw(
    verification: Verification,
    controls: &LogitControls,
    sampler: &mut Sampler,
    first: usize,
    full: bool,
) -> Option<Draw> {
    let params = *sampler.params();
    let ruled = !full && !controls.is_active(params.temperature) && fetches(verification);
    if !(ruled && params.temperature_alone()) {
        return None;
    }
    let u = verification.plain_uniform(sampler, first)?;
    Some(Draw {
        temperature: params.temperature,
        u,
    })
}

/// `verification`'s verdict on `draft` against the rows of `logits`,
/// sampled with `sampler`'s parameters; `first` is the generation's output length.
pub(crate) fn accept_fetching(
    verification: Verification,
    logits: &Tensor,
    draft: &DraftBlock,
    sampler: &mut Sampler,
    first: usize,
) -> Result<(Verdict, Option<ExpectedKept>)> {
    let params = *sampler.params();
    if reduces_on_device(logits, &params) {
        if let Some(verdict) = accept_reduced(verification, logits, draft, sampler, first)? {
            return Ok((verdict, None));
        }
    }
    let failed = Mutex::new(None);
    let row = |i: usize| match logits.get(i).and_then(|r| r.to_vec1::<f32>()) {
        Ok(row) => distribution(&row, &params),
        Err(e) => {
            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            SparseDist {
                ids: vec![0],
                probs: vec![1.0],
            }
        }
    };
    let out = verification.accept(&draft.tokens, &draft.dists, row, sampler, first);
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e.into()),
        None => Ok(out),
    }
}

/// `verification`'s verdict on `draft` from [`DeviceRows`] of `logits` at the sampler's
/// temperature; `None` for a rule that does not read rows in order.
fn accept_reduced(
    verification: Verification,
    logits: &Tensor,
    draft: &DraftBlock,
    sampler: &mut Sampler,
    first: usize,
) -> Result<Option<Verdict>> {
    let mut rows = DeviceRows::new(logits, sampler.params().temperature);
    let verdict =
        verification.accept_in_order(&draft.tokens, &draft.dists, &mut rows, sampler, first);
    rows.finish()?;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use tandem_core::SamplingParams;
    use tandem_testkit::Lcg;

    use super::*;

    /// Fetching rows as the rule reaches them, or reducing them where they are, gives the
    /// verdict (and draws) of reading them all first, for every rule that fetches, over
    /// draws that reject early, late and never.
    #[test]
    fn fetched_rows_give_the_eager_verdict() {
        let (vocab, gamma) = (300usize, 4usize);
        let mut lcg = Lcg::new(5);
        let rows: Vec<Vec<f32>> = (0..=gamma)
            .map(|_| (0..vocab).map(|_| lcg.next() * 6.0).collect())
            .collect();
        let logits = Tensor::new(rows.clone(), &Device::Cpu).expect("logits");
        let params = SamplingParams {
            temperature: 0.8,
            seed: 0,
            ..SamplingParams::default()
        };
        let mut accepted = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let params = SamplingParams { seed, ..params };
            let mut draft_sampler = Sampler::new(params).expect("sampler");
            // A drafter whose rows are the target's, shifted by noise: some drafts are
            // rejected, at varying positions.
            let dists: Vec<SparseDist> = rows[..gamma]
                .iter()
                .map(|r| r.iter().map(|x| x + lcg.next() * 3.0).collect::<Vec<f32>>())
                .map(|r| distribution(&r, &params))
                .collect();
            let tokens: Vec<u32> = dists
                .iter()
                .map(|d| d.draw(draft_sampler.uniform()))
                .collect();
            let draft = DraftBlock {
                tokens,
                dists,
                ..DraftBlock::default()
            };
            for rule in [Verification::Token, Verification::Seeded] {
                let mut eager = Sampler::new(params).expect("sampler");
                let want = rule.accept(
                    &draft.tokens,
                    &draft.dists,
                    |i| distribution(&rows[i], &params),
                    &mut eager,
                    7,
                );
                let mut lazy = Sampler::new(params).expect("sampler");
                let got = accept_fetching(rule, &logits, &draft, &mut lazy, 7).expect("fetch");
                assert_eq!(got, want, "seed {seed}, {rule:?}");
                accepted.insert(got.0.accepted);
                let mut reduced = Sampler::new(params).expect("sampler");
                let on_device = accept_reduced(rule, &logits, &draft, &mut reduced, 7);
                assert_eq!(
                    on_device.expect("reduced"),
                    Some(want.0),
                    "seed {seed}, {rule:?}"
                );
                let draws = [lazy.uniform(), reduced.uniform()];
                assert_eq!(draws, [eager.uniform(); 2], "the same draws");
            }
        }
        assert!(
            accepted.len() >= 3,
            "rejections at several positions: {accepted:?}"
        );
    }
}
