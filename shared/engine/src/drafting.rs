//! The engine's side of a proposer session: opening it (when the target can export the
//! snapshot the proposer declares), handing it exactly the rows of newly committed
//! positions, and checking every drafted block before the round trusts it.
//!
//! Committed rows are held back until the proposer next drafts and then sent in one
//! `extend` (the prompt's go at once after the prefill, except in a shared batch, where
//! they wait for the first draft the scheduler allows): rounds that do not draft (an
//! adaptive γ of 0) cost the proposer nothing, and several rounds' rows cost one call.
//!
//! Before asking the proposer, a round looks the anchor up in the committed context, prompt
//! included ([`tandem_core::lookup`]): a continuation found there is verified as the block
//! (point masses, so sampled rounds stay exact) without a proposal. The draft-length policy
//! then models the proposer's own drafts, and a lookup is tried whatever length it would
//! choose — a plain round included. A lookup whose blocks keep being rejected whole sits
//! out twice as many rounds after each miss (up to 32), until one is accepted.
//!
//! An adaptive generation that shares batched steps with others schedules its lookup like
//! a draft: the survival its looked-up tokens have shown so far goes to the batch's
//! scheduler, whose length it verifies (none: the round asks the proposer), with a
//! one-token probe now and then as the policy's plain rounds have. Rows the batch cannot
//! pay for are not spent on lookups, as they are not on drafts. A sampled adaptive
//! generation alone prices its lookups the same way against its own verify cost
//! ([`cut_length`]): a looked-up token is accepted with the target's probability of it, so
//! past the first few they rarely pay for their rows. Greedy lookups alone stay whole
//! (loops a greedy target falls into are continued exactly).

use tandem_core::cut::cut_length;
use tandem_core::lookup::proposal;
use tandem_core::{
    DraftBlock, Drafts, GammaPolicy, GammaPolicyConfig, ProposeError, ProposeRequest, Proposer,
    ProposerSession, SamplingParams, SnapshotRows, SnapshotSpec,
};

use crate::error::{EngineError, Result};
use crate::models::Target;
use crate::schedule::Seat;
use crate::stats::SpecStats;

/// Largest deviation from 1 tolerated in the total of a draft distribution.
const DIST_TOLERANCE: f32 = 1e-3;
/// Most rounds a lookup whose blocks keep being rejected sits out.
const MAX_LOOKUP_BACKOFF: usize = 32;
/// Most looked-up positions whose acceptance is tracked for the batch's scheduler.
const MAX_LOOKUP: usize = 32;

/// An open proposer session and what it consumes.
pub(crate) struct Drafting {
    session: Box<dyn ProposerSession>,
    spec: SnapshotSpec,
    greedy: bool,
    /// Committed rows the session has not seen yet (contiguous positions).
    pending: SnapshotRows,
    /// Every committed token, from position 0, when rounds look the context up.
    context: Option<Vec<u32>>,
    /// Rounds the lookup sits out, and how long the next miss makes it sit out: each
    /// looked-up block rejected whole doubles the wait, one accepted token ends it.
    lookup_skip: usize,
    lookup_backoff: usize,
    /// Acceptance of the looked-up tokens by position, and the lookups the batch's
    /// scheduler turned down (the counts of a draft-length policy, its timings unused).
    lookup_rates: GammaPolicy,
}

impl Drafting {
    /// Opens a session; a proposer that cannot serve, or whose snapshot the target cannot
    /// export, is counted and left out.
    /// Rounds look the context up first when `lookup` is set.
    pub(crate) fn open(
        proposer: &dyn Proposer,
        target: &dyn Target,
        sampling: &SamplingParams,
        lookup: bool,
        stats: &mut SpecStats,
    ) -> Option<Self> {
        let spec = proposer.snapshot_spec();
        let opened = target
            .snapshot_support()
            .check(&spec)
            .map_err(ProposeError::Invalid)
            .and_then(|()| proposer.open(sampling));
        match opened {
            Ok(session) => Some(Self {
                pending: SnapshotRows {
                    start: 0,
                    width: spec.row_width(),
                    ..SnapshotRows::default()
                },
                session,
                spec,
                greedy: sampling.is_greedy(),
                context: lookup.then(Vec::new),
                lookup_skip: 0,
                lookup_backoff: 1,
                lookup_rates: lookup_rates(),
            }),
            Err(e) => {
                tracing::warn!("speculation off for this generation: {e}");
                stats.proposer_failures += 1;
                None
            }
        }
    }

    /// The snapshot the proposer consumes.
    pub(crate) fn spec(&self) -> &SnapshotSpec {
        &self.spec
    }

    /// Queues the first rows of `snapshot` (rows of the spec, from one forward) as the
    /// snapshot of the committed `tokens` at positions `pos..pos + tokens.len()`, which must
    /// follow the rows queued before; the tokens go with them.
    pub(crate) fn extend(&mut self, snapshot: &[f32], pos: usize, tokens: &[u32]) -> Result<()> {
        let (width, rows) = (self.spec.row_width(), tokens.len());
        let data = snapshot.get(..rows * width).ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "the target returned {} snapshot floats, {rows} rows of {width} needed",
                snapshot.len()
            ))
        })?;
        let pending = &mut self.pending;
        if pending.data.is_empty() {
            pending.start = pos;
        } else if pending.start + pending.rows() != pos {
            return Err(EngineError::InvalidRequest(format!(
                "snapshot rows from position {pos} do not follow the {} queued from {}",
                pending.rows(),
                pending.start
            )));
        }
        pending.data.extend_from_slice(data);
        pending.tokens.extend_from_slice(tokens);
        if let Some(c) = &mut self.context {
            c.extend_from_slice(tokens);
        }
        Ok(())
    }

    /// The continuation of `anchor` found in the committed context, at most `max` tokens,
    /// as a block of point masses, sized for an adaptive generation (`adaptive`): as the
    /// batch's scheduler gives it beside others, priced against the verify cost alone
    /// when sampled; `None` when lookup is off, sits this round out, finds fewer than two,
    /// or gets none.
    pub(crate) fn look_up(
        &mut self,
        anchor: u32,
        max: usize,
        adaptive: Option<Adaptive<'_, '_>>,
    ) -> Option<DraftBlock> {
        let context = self.context.as_ref()?;
        if self.lookup_skip > 0 {
            self.lookup_skip -= 1;
            return None;
        }
        let mut block = proposal(context, anchor, max)?;
        if let Some(keep) = adaptive.and_then(|a| self.sized(a, block.tokens.len())) {
            if keep == 0 {
                self.lookup_rates.record(0, 0, 0.0, 0.0);
                return None;
            }
            block.cut(keep);
        }
        Some(block)
    }

    /// How many of `found` looked-up tokens to verify: the batch scheduler's length beside
    /// others, the priced one for a sampled generation alone; `None`: all of them. A
    /// lookup that drafts nothing probes with one token now and then — beside others only
    /// where what the probe could show might make its lookups pay.
    fn sized(&self, a: Adaptive<'_, '_>, found: usize) -> Option<usize> {
        let rates = &self.lookup_rates;
        let Some(seat) = a.seat else {
            return self.sized_alone(a, found);
        };
        let drafts = |mut survival: Vec<f64>| {
            survival.truncate(found);
            Drafts {
                survival,
                draft_s: 0.0,
                row_s: a.row_s,
            }
        };
        match seat.schedule(drafts(rates.survival())) {
            Some((0, sessions)) if rates.probe_due(sessions) => {
                Some(seat.would_draft(&drafts(rates.hopeful_survival())).into())
            }
            Some((length, _)) => Some(length),
            None => self.sized_alone(a, found),
        }
    }

    /// [`Self::sized`] for a generation alone: all of a greedy one's, a sampled one's
    /// priced against its verify cost (a one-token probe now and then where none pays).
    fn sized_alone(&self, a: Adaptive<'_, '_>, found: usize) -> Option<usize> {
        if self.greedy {
            return None;
        }
        let rates: Vec<f32> = (self.lookup_rates.acceptances())
            .take(found)
            .map(|p| p as f32)
            .collect();
        Some(match cut_length(&rates, 1.0, a.verify_slope) {
            0 if self.lookup_rates.probe_due(1) => 1,
            length => length,
        })
    }

    /// Takes in how many tokens of a looked-up block of `verified` were accepted.
    pub(crate) fn looked_up(&mut self, verified: usize, accepted: usize) {
        self.lookup_rates.record(verified, accepted, 0.0, 0.0);
        match accepted {
            0 => {
                self.lookup_skip = self.lookup_backoff;
                self.lookup_backoff = (2 * self.lookup_backoff).min(MAX_LOOKUP_BACKOFF);
            }
            _ => self.lookup_backoff = 1,
        }
    }

    /// Sends the queued rows to the session now.
    pub(crate) fn flush(&mut self) -> std::result::Result<(), ProposeError> {
        if self.pending.data.is_empty() {
            return Ok(());
        }
        let rows = SnapshotRows {
            start: self.pending.start,
            width: self.pending.width,
            data: std::mem::take(&mut self.pending.data),
            tokens: std::mem::take(&mut self.pending.tokens),
        };
        self.session.extend(&rows)
    }

    /// Asks for `gamma` tokens after `anchor` at `position` (after sending the queued
    /// rows) and checks the answer.
    pub(crate) fn propose(
        &mut self,
        anchor: u32,
        position: usize,
        gamma: usize,
        vocab: usize,
    ) -> std::result::Result<DraftBlock, ProposeError> {
        let req = ProposeRequest {
            anchor,
            position,
            gamma,
        };
        self.flush()?;
        let block = self.session.propose(&req)?;
        check_block(&block, gamma, vocab, self.greedy)?;
        Ok(block)
    }
}

/// What sizes an adaptive generation's lookups: its seat in the batch (if the target
/// batches) and what each verified token adds to a round, in one-token forwards.
#[derive(Clone, Copy)]
pub(crate) struct Adaptive<'a, 's> {
    pub(crate) seat: Option<&'a Seat<'s>>,
    pub(crate) verify_slope: f64,
    /// The generation's own work per verified row, in seconds.
    pub(crate) row_s: f64,
}

/// The counts a generation keeps of its looked-up tokens.
fn lookup_rates() -> GammaPolicy {
    GammaPolicy::new(GammaPolicyConfig::new(MAX_LOOKUP))
        .expect("the default configuration is valid")
}

/// A block the round can use: at most `gamma` in-vocabulary tokens, and when sampling, one
/// normalised distribution per token (every probability in `[0, 1]`) that gives the token a
/// positive probability. Every block a proposer returns passes here before a round uses it.
pub fn check_block(
    block: &DraftBlock,
    gamma: usize,
    vocab: usize,
    greedy: bool,
) -> std::result::Result<(), ProposeError> {
    let bad = |msg: String| Err(ProposeError::Invalid(format!("drafted block: {msg}")));
    if block.tokens.len() > gamma {
        return bad(format!("{} tokens for γ = {gamma}", block.tokens.len()));
    }
    if let Some(t) = block.tokens.iter().find(|t| **t as usize >= vocab) {
        return bad(format!("token {t} outside the vocabulary of {vocab}"));
    }
    if block.confidences.len() != block.tokens.len() {
        return bad(format!(
            "{} confidences for {} tokens",
            block.confidences.len(),
            block.tokens.len()
        ));
    }
    if let Some(c) = block.confidences.iter().find(|c| !(0.0..=1.0).contains(*c)) {
        return bad(format!("confidence {c} is outside [0, 1]"));
    }
    if greedy {
        return Ok(());
    }
    if block.dists.len() != block.tokens.len() {
        return bad(format!(
            "{} distributions for {} tokens",
            block.dists.len(),
            block.tokens.len()
        ));
    }
    for (i, (t, q)) in block.tokens.iter().zip(&block.dists).enumerate() {
        if let Some(p) = q.probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
            return bad(format!(
                "distribution {i} has probability {p} outside [0, 1]"
            ));
        }
        let total: f32 = q.probs.iter().sum();
        if q.ids.len() != q.probs.len() || (total - 1.0).abs() > DIST_TOLERANCE {
            return bad(format!(
                "distribution {i} is not normalised (total {total})"
            ));
        }
        if q.prob(*t) <= 0.0 {
            return bad(format!(
                "token {i} has probability 0 under its distribution"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::SparseDist;

    fn block(tokens: &[u32], dists: Vec<SparseDist>) -> DraftBlock {
        DraftBlock {
            tokens: tokens.to_vec(),
            confidences: vec![0.5; tokens.len()],
            dists,
            ..DraftBlock::default()
        }
    }

    fn point(id: u32) -> SparseDist {
        SparseDist {
            ids: vec![id],
            probs: vec![1.0],
        }
    }

    /// What one extend carried: its start, rows and tokens.
    type Extend = (usize, usize, Vec<u32>);

    /// Records every extend; drafts `gamma` copies of the anchor.
    struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<Extend>>>);

    impl ProposerSession for Recorder {
        fn extend(&mut self, rows: &SnapshotRows) -> std::result::Result<(), ProposeError> {
            let mut seen = self
                .0
                .lock()
                .map_err(|_| ProposeError::Invalid("lock".into()))?;
            seen.push((rows.start, rows.rows(), rows.tokens.clone()));
            Ok(())
        }

        fn propose(
            &mut self,
            req: &ProposeRequest,
        ) -> std::result::Result<DraftBlock, ProposeError> {
            Ok(block(&vec![req.anchor; req.gamma], vec![]))
        }
    }

    /// A session on a [`Recorder`] of what `seen` gets, rounds looking the context up.
    fn recording(seen: &std::sync::Arc<std::sync::Mutex<Vec<Extend>>>) -> Drafting {
        let spec = SnapshotSpec::taps(&[0], 2);
        Drafting {
            session: Box::new(Recorder(std::sync::Arc::clone(seen))),
            pending: SnapshotRows {
                start: 0,
                width: spec.row_width(),
                ..SnapshotRows::default()
            },
            spec,
            greedy: true,
            context: Some(Vec::new()),
            lookup_skip: 0,
            lookup_backoff: 1,
            lookup_rates: lookup_rates(),
        }
    }

    /// An adaptive generation's sizing at `seat`, verify rows at 0.3 forwards each.
    fn beside<'a, 's>(seat: &'a crate::Seat<'s>) -> Adaptive<'a, 's> {
        Adaptive {
            seat: Some(seat),
            verify_slope: 0.3,
            row_s: 0.0,
        }
    }

    #[test]
    fn committed_rows_reach_the_session_in_one_call_before_a_draft() -> Result<()> {
        let seen = std::sync::Arc::default();
        let mut d = recording(&seen);
        d.extend(&[0.0; 10], 0, &[10, 11, 12, 13, 14])?;
        d.extend(&[0.0; 6], 5, &[15])?;
        d.extend(&[0.0; 4], 6, &[16, 17])?;
        assert!(d.extend(&[0.0; 2], 9, &[19]).is_err(), "a gap is refused");
        assert!(
            d.extend(&[0.0; 2], 8, &[18, 19]).is_err(),
            "too few floats are refused"
        );
        assert!(
            seen.lock().map_or(true, |s| s.is_empty()),
            "nothing sent before a draft"
        );
        let drafted = d
            .propose(7, 8, 2, 10)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        assert_eq!(drafted.tokens, vec![7, 7]);
        d.extend(&[0.0; 2], 8, &[7])?;
        d.propose(7, 9, 1, 10)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        d.propose(7, 9, 1, 10)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen, vec![(0, 8, (10..18).collect()), (8, 1, vec![7])]);
        // The committed context is 10..=17, 7: the anchor 12 completes no earlier run of
        // three, 13 after 11, 12 does.
        assert!(d.look_up(12, 4, None).is_none());
        d.extend(&[0.0; 4], 9, &[11, 12])?;
        let found = d.look_up(13, 3, None).expect("a run of the context");
        assert_eq!(found.tokens, [14, 15, 16]);
        assert_eq!(found.source, tandem_core::DraftSource::Lookup);
        assert!(found
            .dists
            .iter()
            .zip(&found.tokens)
            .all(|(q, t)| q.ids == [*t]));
        Ok(())
    }

    /// Beside others in a batch, a lookup gets the length the scheduler gives its survival:
    /// longer as it is accepted, none once it keeps missing (the round
    /// asks the proposer) except a one-token probe now and then; alone it is not asked.
    #[test]
    fn a_lookup_in_a_shared_batch_is_scheduled() -> Result<()> {
        let costs = crate::schedule::tests::costs();
        let scheduler = crate::DraftScheduler::new(costs);
        let (seat, _other) = (scheduler.seat(), scheduler.seat());
        let mut d = recording(&std::sync::Arc::default());
        let run = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        d.extend(&[0.0; 22], 0, &run)?;
        let mut lengths = Vec::new();
        for _ in 0..20 {
            let block = d
                .look_up(3, 6, Some(beside(&seat)))
                .expect("a lookup that pays is kept");
            assert!([4, 5, 6, 7, 8, 9].starts_with(&block.tokens));
            d.looked_up(block.tokens.len(), block.tokens.len());
            lengths.push(block.tokens.len());
        }
        assert!(lengths.windows(2).all(|w| w[0] <= w[1]), "{lengths:?}");
        assert_eq!(lengths.last(), Some(&6), "{lengths:?}");
        let mut d = recording(&std::sync::Arc::default());
        d.extend(&[0.0; 22], 0, &run)?;
        let mut lengths = Vec::new();
        for _ in 0..80 {
            let n = d
                .look_up(3, 6, Some(beside(&seat)))
                .map_or(0, |b| b.tokens.len());
            d.lookup_skip = 0;
            if n > 0 {
                d.looked_up(n, 0);
            }
            lengths.push(n);
        }
        let probes = lengths.iter().skip(10).filter(|n| **n > 0).count();
        assert!(lengths.iter().skip(10).all(|n| *n <= 1), "{lengths:?}");
        assert!((1..=8).contains(&probes), "{lengths:?}");
        drop(_other);
        assert_eq!(
            d.look_up(3, 6, Some(beside(&seat))).map(|b| b.tokens.len()),
            Some(6)
        );
        Ok(())
    }

    /// A sampled adaptive generation alone prices its lookups against its verify cost:
    /// a lookup that keeps missing shrinks to one-token probes; a greedy one stays whole.
    #[test]
    fn a_sampled_lookup_alone_is_priced() -> Result<()> {
        let alone = Adaptive {
            seat: None,
            verify_slope: 0.3,
            row_s: 0.0,
        };
        let run = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        let mut d = Drafting {
            greedy: false,
            ..recording(&std::sync::Arc::default())
        };
        d.extend(&[0.0; 22], 0, &run)?;
        let mut lengths = Vec::new();
        for _ in 0..60 {
            let n = d.look_up(3, 6, Some(alone)).map_or(0, |b| b.tokens.len());
            d.lookup_skip = 0;
            if n > 0 {
                d.looked_up(n, n.min(1));
            }
            lengths.push(n);
        }
        assert!(
            lengths[0] < 6,
            "the prior pays for a short lookup: {lengths:?}"
        );
        assert!(lengths.iter().skip(10).all(|n| *n <= 2), "{lengths:?}");
        let mut greedy = recording(&std::sync::Arc::default());
        greedy.extend(&[0.0; 22], 0, &run)?;
        let whole = greedy.look_up(3, 6, Some(alone)).map(|b| b.tokens.len());
        assert_eq!(whole, Some(6));
        Ok(())
    }

    #[test]
    fn blocks_are_checked() {
        assert!(check_block(&block(&[1, 2], vec![]), 2, 10, true).is_ok());
        assert!(check_block(&block(&[1, 2, 3], vec![]), 2, 10, true).is_err());
        assert!(check_block(&block(&[1, 12], vec![]), 2, 10, true).is_err());
        let doubtful = |c: f32| DraftBlock {
            confidences: vec![c],
            ..block(&[1], vec![])
        };
        assert!(check_block(&doubtful(1.5), 2, 10, true).is_err());
        assert!(check_block(&doubtful(f32::NAN), 2, 10, true).is_err());
        let unsure = DraftBlock {
            confidences: vec![],
            ..block(&[1], vec![])
        };
        assert!(check_block(&unsure, 2, 10, true).is_err());
        assert!(check_block(&block(&[1, 2], vec![point(1)]), 2, 10, false).is_err());
        assert!(check_block(&block(&[1, 2], vec![point(1), point(3)]), 2, 10, false).is_err());
        assert!(check_block(&block(&[1, 2], vec![point(1), point(2)]), 2, 10, false).is_ok());
        let half = SparseDist {
            ids: vec![2],
            probs: vec![0.5],
        };
        assert!(check_block(&block(&[2], vec![half]), 2, 10, false).is_err());
    }

    #[test]
    fn distributions_of_non_probabilities_are_refused() {
        // NaN totals compare false against the tolerance, and 2 + (-1) totals 1: both
        // passed the normalisation check before each probability was checked.
        for probs in [vec![f32::NAN], vec![2.0, -1.0]] {
            let q = SparseDist {
                ids: (1..=probs.len() as u32).collect(),
                probs,
            };
            let e = check_block(&block(&[1], vec![q]), 2, 10, false).expect_err("refused");
            assert!(e.to_string().contains("outside [0, 1]"), "{e}");
        }
    }
}
