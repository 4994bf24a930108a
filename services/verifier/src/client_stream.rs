//! The stream of one generation to its client: chunks go through a bounded channel, each
//! send waits at most the server's patience (a client that stops reading is dropped, and
//! its slot and KV cache are freed), the request's deadline is checked at every chunk, and
//! one slot is reserved from the start for the last message, so the finish (or why the
//! server ended the generation) always gets through without blocking.

use std::time::{Duration, Instant};

use tandem_proto::v1 as pb;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{self, OwnedPermit};
use tonic::Status;

use crate::metrics::Abort;

/// What the client's stream carries.
pub(crate) type Item = Result<pb::GenerateResponse, Status>;

/// The sending side of one generation's stream.
pub(crate) struct ClientStream {
    tx: mpsc::Sender<Item>,
    last: OwnedPermit<Item>,
    handle: Handle,
    deadline: Option<Instant>,
    patience: Duration,
    aborted: Option<Abort>,
}

impl ClientStream {
    /// The stream over `tx` (its last slot reserved now), ending at `deadline` and dropping
    /// a client that reads nothing for `patience`.
    pub(crate) async fn open(
        tx: mpsc::Sender<Item>,
        deadline: Option<Instant>,
        patience: Duration,
    ) -> Result<Self, Status> {
        let last = tx
            .clone()
            .reserve_owned()
            .await
            .map_err(|_| Status::cancelled("the client went away"))?;
        Ok(Self {
            tx,
            last,
            handle: Handle::current(),
            deadline,
            patience,
            aborted: None,
        })
    }

    /// Sends a chunk; false when the generation must stop: the client went away, the
    /// deadline passed, or the client stopped reading.
    pub(crate) fn send(&mut self, msg: pb::GenerateResponse) -> bool {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.aborted = Some(Abort::Deadline);
            return false;
        }
        let sent = tokio::time::timeout(self.patience, self.tx.send(Ok(msg)));
        match self.handle.block_on(sent) {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                self.aborted = Some(Abort::SlowClient);
                false
            }
        }
    }

    /// Why the server ended the generation, when it did.
    pub(crate) fn aborted(&self) -> Option<Abort> {
        self.aborted
    }

    /// The status a generation the server ended closes with.
    pub(crate) fn abort_status(&self, why: Abort) -> Status {
        match why {
            Abort::Deadline => Status::deadline_exceeded("the request's deadline passed"),
            Abort::SlowClient => Status::aborted(format!(
                "the client read nothing for {:?}; the server ended the generation",
                self.patience
            )),
        }
    }

    /// Sends the last message into the reserved slot.
    pub(crate) fn finish(self, last: Item) {
        self.last.send(last);
    }
}
