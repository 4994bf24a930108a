//! A drafting session that outlives its drafter. It keeps every context row it sent (as
//! sent: the wire bytes, from position 0), and when its drafter dies or stalls (the stream
//! breaks, a block does not come in time) it opens a session on another healthy drafter,
//! sends it the whole context again in chunks, and repeats the call that failed. The engine
//! never sees the move; the output cannot change, since drafts never decide what the
//! target commits. Only when no drafter can take the session does the error reach the
//! engine, which then goes on without speculation (counted as a proposer failure).

use std::sync::Arc;

use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, ProposerSession, SamplingParams, SnapshotRows,
};
use tandem_proto::codec::rows_to_pb;
use tandem_proto::v1 as pb;

use crate::pool::Members;
use crate::remote::RemoteSession;

/// Moves one generation's session may make before it gives up on speculation.
const MAX_FAILOVERS: usize = 3;

/// A [`ProposerSession`] over the pool's drafters, moving between them as they fail.
pub(crate) struct FailoverSession {
    members: Arc<Members>,
    sampling: SamplingParams,
    /// Every row sent so far, from position 0, as one message.
    history: pb::ContextRows,
    session: RemoteSession,
    failovers_left: usize,
}

impl FailoverSession {
    /// Opens a session on the least loaded healthy drafter.
    pub(crate) fn open(
        members: Arc<Members>,
        sampling: &SamplingParams,
    ) -> Result<Self, ProposeError> {
        let session = members.open(sampling, &[])?;
        let history = pb::ContextRows {
            start: 0,
            dtype: members.session.dtype as i32,
            shape: vec![0, members.snapshot().row_width() as u32],
            data: Vec::new(),
            tokens: Vec::new(),
        };
        Ok(Self {
            members,
            sampling: *sampling,
            history,
            session,
            failovers_left: MAX_FAILOVERS,
        })
    }

    /// Appends rows about to be sent; they must follow the rows sent before.
    fn record(&mut self, rows: &pb::ContextRows) -> Result<(), ProposeError> {
        let have = self.history.shape[0];
        if rows.start != u64::from(have) {
            return Err(ProposeError::Invalid(format!(
                "context rows from position {} do not follow the {have} sent",
                rows.start
            )));
        }
        self.history.data.extend_from_slice(&rows.data);
        // Tokens are kept while every row sent had one.
        let whole = self.history.tokens.len() == have as usize
            && rows.tokens.len() == rows.shape[0] as usize;
        match whole {
            true => self.history.tokens.extend_from_slice(&rows.tokens),
            false => self.history.tokens.clear(),
        }
        self.history.shape[0] = have + rows.shape[0];
        Ok(())
    }

    /// Moves the session to another drafter after `why` (a lost or stalled drafter) and
    /// sends it every row, trying the next drafter when that one fails too; `Err` when the
    /// session cannot move.
    fn fail_over(&mut self, mut why: ProposeError) -> Result<(), ProposeError> {
        while !matches!(why, ProposeError::Invalid(_)) && self.failovers_left > 0 {
            self.failovers_left -= 1;
            let failed = Arc::clone(self.session.member());
            failed.mark_unhealthy();
            tracing::warn!(
                "drafter {} lost mid-generation ({why}); moving the session",
                failed.url()
            );
            self.session = self
                .members
                .open(&self.sampling, &[failed])
                .inspect_err(|e| {
                    tracing::warn!("no drafter could take the session: {e}");
                })?;
            self.members.metrics.drafter_failovers.increment(1);
            let rows = self.history.shape[0];
            let sent = match rows {
                0 => Ok(()),
                _ => self.session.send_rows(&self.history),
            };
            match sent {
                Ok(()) => {
                    let url = self.session.member().url();
                    tracing::info!("session moved to drafter {url} with {rows} context rows");
                    return Ok(());
                }
                Err(e) => why = e,
            }
        }
        Err(why)
    }
}

impl ProposerSession for FailoverSession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        let msg = rows_to_pb(rows, self.members.session.dtype);
        self.record(&msg)?;
        match self.session.send_rows(&msg) {
            // The new drafter gets every row, these among them.
            Err(e) => self.fail_over(e),
            Ok(()) => Ok(()),
        }
    }

    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        loop {
            match self.session.propose(req) {
                Err(e @ ProposeError::Unavailable(_)) => self.fail_over(e)?,
                done => return done,
            }
        }
    }
}
