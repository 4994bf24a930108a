//! What a generation measured: per-round speculation figures and timings.

use serde::Serialize;
use tandem_core::{DraftSource, ExpectedKept};

/// One verification round.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RoundStats {
    /// Tokens drafted and verified (0 for a plain step).
    pub drafted: usize,
    /// Drafted tokens left unverified because their confidences did not pay for it.
    pub cut: usize,
    /// The confidences of the verified tokens, as the proposer sent them.
    pub confidences: Vec<f32>,
    /// Whether those confidences were calibrated.
    pub calibrated: bool,
    /// What drafted the block.
    #[serde(skip)]
    pub source: DraftSource,
    /// What each verification rule keeps of the block in expectation (sampled rounds
    /// verified block-wise, which build every position's target distribution).
    #[serde(skip)]
    pub expected: Option<ExpectedKept>,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Seconds spent drafting (the proposer's extend and propose calls).
    pub draft_s: f64,
    /// Seconds spent in the target's verify forward.
    pub verify_s: f64,
}

/// Speculation figures summed over a generation.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct SpecStats {
    /// Rounds that verified a drafted block.
    pub drafts: u64,
    /// Tokens drafted.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// `accepted_per_position[i]`: rounds whose draft token `i + 1` was accepted.
    pub accepted_per_position: Vec<u64>,
    /// `drafted_per_position[i]`: rounds that drafted a token `i + 1`.
    pub drafted_per_position: Vec<u64>,
    /// Seconds spent drafting.
    pub draft_s: f64,
    /// Seconds spent in verify forwards (plain steps included).
    pub verify_s: f64,
    /// Proposer calls that failed; the generation went on without speculation.
    pub proposer_failures: u64,
    /// 1 when the generation started without speculation because the batch's scheduler
    /// gave a newcomer no draft at its load (`Seat::sheds`).
    pub shed: u64,
    /// Rows whose every logit a sampled round formed because their bounds could not
    /// answer the rule (a draw or an acceptance question left open; `tandem_core::
    /// BoundedRows`): each costs a one-row head product.
    pub whole_rows: u64,
    /// Rounds that reported [`RoundStats::expected`].
    pub expected_rounds: u64,
    /// Draft tokens the token-wise rule keeps of those rounds' blocks in expectation.
    pub expected_token_kept: f64,
    /// Draft tokens block verification keeps of the same blocks in expectation.
    pub expected_block_kept: f64,
}

impl SpecStats {
    /// Adds one round.
    pub fn record(&mut self, r: &RoundStats) {
        self.draft_s += r.draft_s;
        self.verify_s += r.verify_s;
        if r.drafted == 0 {
            return;
        }
        self.drafts += 1;
        if let Some(e) = r.expected {
            self.expected_rounds += 1;
            self.expected_token_kept += e.token;
            self.expected_block_kept += e.block;
        }
        self.draft_tokens += r.drafted as u64;
        self.accepted_tokens += r.accepted as u64;
        if self.drafted_per_position.len() < r.drafted {
            self.drafted_per_position.resize(r.drafted, 0);
            self.accepted_per_position.resize(r.drafted, 0);
        }
        self.drafted_per_position[..r.drafted]
            .iter_mut()
            .for_each(|c| *c += 1);
        self.accepted_per_position[..r.accepted]
            .iter_mut()
            .for_each(|c| *c += 1);
    }

    /// Tokens emitted per drafting round: `1 + accepted / drafts` (vLLM's definition);
    /// `None` before any round drafted.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        (self.drafts > 0).then(|| 1.0 + self.accepted_tokens as f64 / self.drafts as f64)
    }

    /// Acceptance rate of each draft position.
    pub fn acceptance_per_position(&self) -> Vec<f64> {
        self.accepted_per_position
            .iter()
            .zip(&self.drafted_per_position)
            .map(|(a, d)| *a as f64 / (*d).max(1) as f64)
            .collect()
    }
}

/// Wall-clock figures of one generation.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Timing {
    /// Seconds from the start to the first token (prefill included).
    pub ttft_s: f64,
    /// Seconds of the prompt forward.
    pub prefill_s: f64,
    /// Seconds after the first token until the end.
    pub decode_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_length_counts_only_drafting_rounds() {
        let mut s = SpecStats::default();
        assert_eq!(s.mean_acceptance_length(), None);
        let round = |drafted, accepted| RoundStats {
            drafted,
            accepted,
            draft_s: 0.5,
            verify_s: 1.0,
            ..RoundStats::default()
        };
        s.record(&round(4, 4));
        s.record(&round(4, 1));
        s.record(&round(0, 0));
        assert_eq!(s.drafts, 2);
        assert_eq!(s.mean_acceptance_length(), Some(1.0 + 5.0 / 2.0));
        assert_eq!(s.accepted_per_position, vec![2, 1, 1, 1]);
        assert_eq!(s.acceptance_per_position(), vec![1.0, 0.5, 0.5, 0.5]);
        assert_eq!(s.verify_s, 3.0);
    }
}
