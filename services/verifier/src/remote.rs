//! One stream to one remote drafter: one `Draft` stream per generation (and per drafter it
//! moves to). Context rows are sent without waiting (the stream keeps them in order), in
//! chunks below the drafter's message limit; each proposal waits for its block, with a
//! timeout. The engine calls it from a blocking thread, so every network step is driven
//! with the runtime handle. Dropping the session closes the stream, which frees the
//! drafter's mirror.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pb::draft_request::Msg;
use tandem_core::{DraftBlock, ProposeError, ProposeRequest, SamplingParams, SnapshotSpec};
use tandem_proto::codec::{chunk_rows, sampling_to_pb};
use tandem_proto::spec::spec_to_pb;
use tandem_proto::v1 as pb;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::metrics::VerifierMetrics;
use crate::pool::Member;

/// Requests buffered towards a drafter before the verifier waits.
const REQUEST_BUFFER: usize = 32;
/// Room left in a message for everything but the rows' bytes.
const MESSAGE_OVERHEAD: usize = 1024;
/// Extra wait for a block per context row sent since the last one: the drafter takes the
/// rows in before it drafts (a long prompt, or a whole context after a move).
const ROW_ALLOWANCE: Duration = Duration::from_micros(200);

/// How a session talks to its drafter.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The verifier's target, sent in Open.
    pub target: pb::TargetIdentity,
    /// Longest wait for the stream to open.
    pub open_timeout: Duration,
    /// Longest wait for one block.
    pub propose_timeout: Duration,
    /// Wire type of context rows.
    pub dtype: pb::Dtype,
    /// Most bytes of rows in one message (less where a drafter accepts less).
    pub chunk_bytes: usize,
}

/// What a session runs on besides its drafter: the runtime, the metrics and the snapshot
/// the pool agreed on (sent in Open, so the drafter can refuse a mismatch).
pub struct Link {
    /// Drives the network steps from the engine's blocking thread.
    pub handle: Handle,
    /// Counts failed calls and sent chunks.
    pub metrics: Arc<VerifierMetrics>,
    /// The snapshot every context row will carry.
    pub snapshot: SnapshotSpec,
}

/// One generation's stream to one drafter.
pub struct RemoteSession {
    member: Arc<Member>,
    tx: mpsc::Sender<pb::DraftRequest>,
    rx: Streaming<pb::DraftResponse>,
    handle: Handle,
    opts: SessionOptions,
    metrics: Arc<VerifierMetrics>,
    /// Rows sent since the last block.
    unanswered_rows: u32,
}

fn to_propose_error(s: &Status) -> ProposeError {
    let msg = format!("drafter: {}", s.message());
    match s.code() {
        Code::InvalidArgument | Code::FailedPrecondition => ProposeError::Invalid(msg),
        _ => ProposeError::Unavailable(msg),
    }
}

fn timed_out(what: &str) -> ProposeError {
    ProposeError::Unavailable(format!("drafter did not {what} in time"))
}

impl RemoteSession {
    /// Opens a stream on `member` and waits for the drafter to accept it. The member counts
    /// the session from the start of the attempt, so concurrent opens spread out.
    pub fn open(
        member: Arc<Member>,
        sampling: &SamplingParams,
        opts: &SessionOptions,
        link: Link,
    ) -> Result<Self, ProposeError> {
        member.active.fetch_add(1, Ordering::SeqCst);
        let opened = Self::connect(&member, sampling, opts, &link);
        match opened {
            Ok((tx, rx)) => Ok(Self {
                member,
                tx,
                rx,
                handle: link.handle,
                opts: opts.clone(),
                metrics: link.metrics,
                unanswered_rows: 0,
            }),
            Err(e) => {
                member.active.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    fn connect(
        member: &Member,
        sampling: &SamplingParams,
        opts: &SessionOptions,
        link: &Link,
    ) -> Result<(mpsc::Sender<pb::DraftRequest>, Streaming<pb::DraftResponse>), ProposeError> {
        let handle = &link.handle;
        let (tx, rx) = mpsc::channel(REQUEST_BUFFER);
        let open = Msg::Open(pb::Open {
            target: Some(opts.target.clone()),
            sampling: Some(sampling_to_pb(sampling)),
            snapshot: spec_to_pb(&link.snapshot),
        });
        tx.try_send(pb::DraftRequest { msg: Some(open) })
            .map_err(|_| ProposeError::Unavailable("request buffer full".into()))?;
        let mut client = member.client.clone();
        let call = client.draft(ReceiverStream::new(rx));
        let mut stream = handle
            .block_on(tokio::time::timeout(opts.open_timeout, call))
            .map_err(|_| timed_out("open a session"))?
            .map_err(|s| to_propose_error(&s))?
            .into_inner();
        let first = handle.block_on(tokio::time::timeout(opts.open_timeout, stream.message()));
        match first.map_err(|_| timed_out("open a session"))? {
            Ok(Some(pb::DraftResponse {
                msg: Some(pb::draft_response::Msg::Opened(_)),
            })) => {}
            Ok(_) => {
                return Err(ProposeError::Unavailable(
                    "drafter closed the session".into(),
                ))
            }
            Err(s) => return Err(to_propose_error(&s)),
        }
        Ok((tx, stream))
    }

    fn send(&self, msg: Msg) -> Result<(), ProposeError> {
        self.handle
            .block_on(self.tx.send(pb::DraftRequest { msg: Some(msg) }))
            .map_err(|_| ProposeError::Unavailable("drafter stream closed".into()))
    }

    fn count<T>(&self, r: Result<T, ProposeError>) -> Result<T, ProposeError> {
        if r.is_err() {
            self.metrics.draft_rpc_errors.increment(1);
        }
        r
    }

    /// The drafter it talks to.
    pub fn member(&self) -> &Arc<Member> {
        &self.member
    }

    /// Sends encoded context rows, in as many messages as the drafter's limit needs.
    pub fn send_rows(&mut self, rows: &pb::ContextRows) -> Result<(), ProposeError> {
        let count = rows.shape.first().copied().unwrap_or(0);
        self.unanswered_rows = self.unanswered_rows.saturating_add(count);
        let limit = self
            .member
            .max_message_bytes
            .saturating_sub(MESSAGE_OVERHEAD);
        let sent = chunk_rows(rows, self.opts.chunk_bytes.min(limit)).try_for_each(|chunk| {
            self.metrics.snapshot_chunks.increment(1);
            self.send(Msg::Rows(chunk))
        });
        self.count(sent)
    }

    /// Asks for a block and waits for it.
    pub fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        let block = self.round_trip(req);
        self.count(block)
    }

    fn round_trip(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        self.send(Msg::Propose(pb::Propose {
            anchor: req.anchor,
            position: req.position as u64,
            gamma: req.gamma as u32,
        }))?;
        let wait = self.opts.propose_timeout + ROW_ALLOWANCE * self.unanswered_rows;
        let next = self
            .handle
            .block_on(tokio::time::timeout(wait, self.rx.message()))
            .map_err(|_| timed_out("answer"))?;
        self.unanswered_rows = 0;
        match next {
            Ok(Some(pb::DraftResponse {
                msg: Some(pb::draft_response::Msg::Block(b)),
            })) => Ok(b.into()),
            Ok(_) => Err(ProposeError::Unavailable(
                "drafter ended the session".into(),
            )),
            Err(s) => Err(to_propose_error(&s)),
        }
    }
}

impl Drop for RemoteSession {
    fn drop(&mut self) {
        self.member.active.fetch_sub(1, Ordering::SeqCst);
    }
}
