//! Drafting by lookup in the context (the n-gram "prompt lookup" of vLLM and SGLang): when
//! the last few committed tokens and the anchor occurred earlier — in the prompt or in the
//! generation — the tokens that followed them then are proposed again. Answers that quote
//! their question, code that repeats its identifiers and the loops small greedy models
//! fall into are drafted exactly this way, whatever the drafter model.
//!
//! Verifiers send the committed token of each snapshot row ([`History::committed`]); the
//! history is then exact, prompt included. A sender that does not is still followed: a
//! session knows what it drafted, so after a round at `position` with anchor `a` and drafts
//! `d`, the next proposal at `position'` means `a, d[..position' − position − 1]` were
//! committed; [`History`] rebuilds the generation that way, and a gap (plain rounds in
//! between, which the session never sees) starts it afresh.

use crate::proposer::{DraftBlock, DraftSource};

/// Shortest repeated run (anchor included) that a lookup trusts. Two tokens rather than
/// three: 1.01–1.07× the tokens per second at 1–4 clients on general prompts, greedy and
/// sampled, and 0.99–1.05× on the evaluation sets alone (2-core EPYC,
/// `docs/performance/2026-12-06-where-scheduled-loses-h100.md`).
pub const MIN_NGRAM: usize = 2;
/// Longest run compared.
pub const MAX_NGRAM: usize = 8;
/// Fewest looked-up tokens worth verifying instead of drafting.
pub const MIN_LOOKUP: usize = 2;
/// Confidence sent with a looked-up token (a prior, not a calibrated estimate).
pub const LOOKUP_CONFIDENCE: f32 = 0.8;

/// The tokens a drafter session has seen committed, and its last proposal.
#[derive(Debug, Clone, Default)]
pub struct History {
    tokens: Vec<u32>,
    /// Whether `tokens` are every committed token from position 0, as sent with the rows
    /// (else rebuilt from the session's own rounds).
    exact: bool,
    last: Option<Round>,
}

#[derive(Debug, Clone)]
struct Round {
    position: usize,
    anchor: u32,
    drafted: Vec<u32>,
}

impl History {
    /// Takes in the `rows` positions from `start` that snapshot rows committed, with their
    /// `tokens` when the sender included them (one per row). Rows without tokens, or out of
    /// order, leave the history to be rebuilt from the session's rounds.
    pub fn committed(&mut self, start: usize, rows: usize, tokens: &[u32]) {
        let follows = start == 0 || (self.exact && start == self.tokens.len());
        match (tokens.len() == rows && rows > 0, follows) {
            (true, true) => {
                self.tokens.truncate(start);
                self.tokens.extend_from_slice(tokens);
                self.exact = true;
            }
            _ if rows == 0 => {}
            _ if self.exact => {
                self.tokens.clear();
                self.exact = false;
            }
            _ => {}
        }
    }

    /// Takes in what the round before a proposal at `position` committed.
    pub fn observe(&mut self, position: usize) {
        let Some(r) = self.last.take() else {
            return;
        };
        if self.exact {
            return;
        }
        let accepted = position.checked_sub(r.position + 1);
        match accepted {
            Some(k) if k <= r.drafted.len() => {
                self.tokens.push(r.anchor);
                self.tokens.extend_from_slice(&r.drafted[..k]);
            }
            _ => self.tokens.clear(),
        }
    }

    /// Records the proposal made at `position` after `anchor`.
    pub fn proposed(&mut self, position: usize, anchor: u32, drafted: &[u32]) {
        self.last = Some(Round {
            position,
            anchor,
            drafted: drafted.to_vec(),
        });
    }

    /// The tokens known to be committed, oldest first (every one from position 0 where the
    /// rows carried them).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The [`proposal`] of `anchor` in the tokens known to be committed.
    pub fn proposal(&self, anchor: u32, max: usize) -> Option<DraftBlock> {
        proposal(&self.tokens, anchor, max)
    }
}

/// The [`continuation`] of `anchor` in `seen`, at most `max` tokens, as a block of point
/// masses (so sampled rounds stay exact) from the lookup; `None` when it is shorter than
/// [`MIN_LOOKUP`].
pub fn proposal(seen: &[u32], anchor: u32, max: usize) -> Option<DraftBlock> {
    let found = continuation(seen, anchor, max);
    (found.len() >= MIN_LOOKUP).then(|| {
        DraftBlock::point_masses(found, LOOKUP_CONFIDENCE).from_source(DraftSource::Lookup)
    })
}

/// Up to `max` tokens that followed the latest earlier occurrence in `seen` of the longest
/// run that ends `seen ++ [anchor]` (between [`MIN_NGRAM`] and [`MAX_NGRAM`] tokens long);
/// empty when there is none.
pub fn continuation(seen: &[u32], anchor: u32, max: usize) -> Vec<u32> {
    let mut s = Vec::with_capacity(seen.len() + 1);
    s.extend_from_slice(seen);
    s.push(anchor);
    let len = s.len();
    for n in (MIN_NGRAM..=MAX_NGRAM.min(len - 1)).rev() {
        let suffix = &s[len - n..];
        // Latest start `j` of an earlier occurrence: it must end before the suffix does.
        let found = (0..len - n).rev().find(|&j| &s[j..j + n] == suffix);
        if let Some(j) = found {
            return s[j + n..len.min(j + n + max)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_loop_is_continued_from_its_last_occurrence() {
        let seen = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 7, 1, 2, 3];
        assert_eq!(continuation(&seen, 4, 8), vec![5, 7, 1, 2, 3, 4]);
        assert_eq!(continuation(&seen, 4, 2), vec![5, 7]);
        assert!(continuation(&seen, 8, 8).is_empty(), "no run ends in 8");
        assert!(continuation(&[5, 6], 7, 8).is_empty(), "too short");
        // A two-token run is enough; one token alone is not trusted.
        assert_eq!(continuation(&[3, 1, 9, 9, 3], 1, 8), vec![9, 9, 3, 1]);
        assert!(continuation(&[3, 1, 9, 9, 4], 1, 8).is_empty());
    }

    #[test]
    fn history_follows_accepted_prefixes_and_forgets_gaps() {
        let mut h = History::default();
        h.observe(10);
        h.proposed(10, 7, &[8, 9, 4]);
        h.observe(12); // 7, 8 committed; 9 rejected
        assert_eq!(h.tokens(), &[7, 8]);
        h.proposed(12, 5, &[1, 2]);
        h.observe(15); // all accepted: 5, 1, 2
        assert_eq!(h.tokens(), &[7, 8, 5, 1, 2]);
        h.proposed(15, 3, &[4]);
        h.observe(25); // plain rounds in between: what they committed is unknown
        assert!(h.tokens().is_empty());
    }

    #[test]
    fn tokens_sent_with_rows_make_the_history_exact_prompt_included() {
        let mut h = History::default();
        h.committed(0, 4, &[5, 6, 7, 8]);
        h.observe(4);
        h.proposed(4, 9, &[5, 6, 1]);
        h.committed(4, 3, &[9, 5, 6]); // the anchor and two drafts committed
        h.observe(7);
        assert_eq!(h.tokens(), &[5, 6, 7, 8, 9, 5, 6]);
        // The prompt's run 5, 6, 7 is found with the anchor 7; what followed it is proposed.
        let block = h.proposal(7, 3).expect("a run of the prompt");
        assert_eq!(block.tokens, [8, 9, 5]);
        assert_eq!(block.source, DraftSource::Lookup);
        assert!(block
            .dists
            .iter()
            .zip(&block.tokens)
            .all(|(q, t)| q.ids == [*t]));
        assert!(
            h.proposal(7, 1).is_none(),
            "one token is not worth a lookup"
        );
        // Rows without tokens end exactness: the history is rebuilt from rounds again.
        h.committed(7, 1, &[]);
        assert!(h.tokens().is_empty());
        h.proposed(8, 1, &[2]);
        h.observe(10);
        assert_eq!(h.tokens(), &[1, 2]);
        // A gap in exact rows does too; rows from position 0 start it afresh.
        h.committed(0, 2, &[3, 4]);
        h.committed(5, 1, &[6]);
        assert!(h.tokens().is_empty());
        h.committed(0, 1, &[3]);
        assert_eq!(h.tokens(), &[3]);
    }

    proptest! {
        /// A proposal is what followed an earlier copy of the last [`MIN_NGRAM`] tokens
        /// (anchor included), and a sequence that repeats itself always gets one.
        #[test]
        fn proposals_are_what_followed_the_same_tokens(
            period in proptest::collection::vec(0u32..4, 1..6),
            noise in proptest::collection::vec(0u32..4, 0..30),
            reps in 0usize..5,
        ) {
            let mut seq = noise.clone();
            seq.extend(period.iter().copied().cycle().take(period.len() * reps));
            prop_assume!(!seq.is_empty());
            let (seen, anchor) = (&seq[..seq.len() - 1], seq[seq.len() - 1]);
            let out = continuation(seen, anchor, 8);
            let len = seq.len();
            if !out.is_empty() {
                let tail = &seq[len - MIN_NGRAM..];
                let followed = (0..len - MIN_NGRAM).any(|j| {
                    &seq[j..j + MIN_NGRAM] == tail && seq[j + MIN_NGRAM..].starts_with(&out)
                });
                prop_assert!(followed, "{:?} did not follow {:?}", out, tail);
            }
            if reps * period.len() >= MIN_NGRAM + period.len() {
                prop_assert!(!out.is_empty());
            }
        }
    }
}
