//! The engine's side of a proposer session: opening it (when the target can export the
//! snapshot the proposer declares), handing it exactly the rows of newly committed
//! positions, and checking every drafted block before the round trusts it.

use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession, SamplingParams,
    SnapshotRows, SnapshotSpec,
};

use crate::error::{EngineError, Result};
use crate::stats::SpecStats;
use crate::target::Target;

/// Largest deviation from 1 tolerated in the total of a draft distribution.
const DIST_TOLERANCE: f32 = 1e-3;

/// An open proposer session and what it consumes.
pub(crate) struct Drafting {
    session: Box<dyn ProposerSession>,
    spec: SnapshotSpec,
    greedy: bool,
}

impl Drafting {
    /// Opens a session; a proposer that cannot serve, or whose snapshot the target cannot
    /// export, is counted and left out.
    pub(crate) fn open(
        proposer: &dyn Proposer,
        target: &dyn Target,
        sampling: &SamplingParams,
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
                session,
                spec,
                greedy: sampling.is_greedy(),
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

    /// Sends the first `rows` rows of `snapshot` (rows of the spec, from one forward) as the
    /// snapshot of positions `pos..pos + rows`. The outer error is the engine's own; the
    /// inner one the proposer's.
    pub(crate) fn extend(
        &mut self,
        snapshot: &[f32],
        pos: usize,
        rows: usize,
    ) -> Result<std::result::Result<(), ProposeError>> {
        let width = self.spec.row_width();
        let data = snapshot.get(..rows * width).ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "the target returned {} snapshot floats, {rows} rows of {width} needed",
                snapshot.len()
            ))
        })?;
        let rows = SnapshotRows {
            start: pos,
            width,
            data: data.to_vec(),
        };
        Ok(self.session.extend(&rows))
    }

    /// Asks for `gamma` tokens after `anchor` at `position` and checks the answer.
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
        let block = self.session.propose(&req)?;
        check_block(&block, gamma, vocab, self.greedy)?;
        Ok(block)
    }
}

/// A block the round can use: at most `gamma` in-vocabulary tokens, and when sampling, one
/// normalised distribution per token that gives the token a positive probability.
fn check_block(
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
        }
    }

    fn point(id: u32) -> SparseDist {
        SparseDist {
            ids: vec![id],
            probs: vec![1.0],
        }
    }

    #[test]
    fn blocks_are_checked() {
        assert!(check_block(&block(&[1, 2], vec![]), 2, 10, true).is_ok());
        assert!(check_block(&block(&[1, 2, 3], vec![]), 2, 10, true).is_err());
        assert!(check_block(&block(&[1, 12], vec![]), 2, 10, true).is_err());
        assert!(check_block(&block(&[1, 2], vec![point(1)]), 2, 10, false).is_err());
        assert!(check_block(&block(&[1, 2], vec![point(1), point(3)]), 2, 10, false).is_err());
        assert!(check_block(&block(&[1, 2], vec![point(1), point(2)]), 2, 10, false).is_ok());
        let half = SparseDist {
            ids: vec![2],
            probs: vec![0.5],
        };
        assert!(check_block(&block(&[2], vec![half]), 2, 10, false).is_err());
    }
}
