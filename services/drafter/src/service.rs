//! The `tandem.v1.Drafter` gRPC service: one bidirectional stream per generation. A session
//! runs on its own blocking thread (drafting is CPU work) and talks to the stream through
//! bounded channels; when the stream ends, for any reason, the session and everything the
//! proposer holds for it are dropped. A session whose verifier sends nothing for the idle
//! timeout is closed; while the server drains, new sessions (and Info) are refused, so
//! verifiers open theirs elsewhere.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pb::draft_request::Msg;
use tandem_core::{ProposeRequest, Proposer, ProposerSession, SnapshotSpec, TargetIdentity};
use tandem_proto::codec::{block_to_pb, rows_from_pb, sampling_from_pb, DEFAULT_MAX_MESSAGE_BYTES};
use tandem_proto::spec::{spec_from_pb, spec_to_pb};
use tandem_proto::v1 as pb;
use tandem_serving::Drain;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::error::DrafterError;
use crate::metrics::DrafterMetrics;

/// Responses buffered per session before the drafter waits for the verifier to read.
const RESPONSE_BUFFER: usize = 4;

/// What a drafter serves.
pub struct DrafterConfig {
    /// The target this drafter's model was made for.
    pub target: TargetIdentity,
    /// Drafter kind for Info ("dspark" or "gemma4-assistant").
    pub kind: String,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// Largest request message accepted (context rows arrive in chunks below it).
    pub max_message_bytes: usize,
    /// A session whose verifier sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Longest wait for open sessions once a shutdown began.
    pub drain_grace: Duration,
}

impl DrafterConfig {
    /// A drafter of `kind` for `target` with the default limits.
    pub fn new(target: TargetIdentity, kind: &str) -> Self {
        Self {
            target,
            kind: kind.to_string(),
            max_sessions: 64,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            idle_timeout: Duration::from_secs(600),
            drain_grace: Duration::from_secs(30),
        }
    }
}

struct Shared {
    proposer: Arc<dyn Proposer>,
    cfg: DrafterConfig,
    metrics: DrafterMetrics,
    active: AtomicUsize,
    next_id: AtomicU64,
    drain: Arc<Drain>,
}

/// The gRPC service over a proposer.
#[derive(Clone)]
pub struct DrafterService {
    shared: Arc<Shared>,
}

impl DrafterService {
    /// A service drafting with `proposer`.
    pub fn new(
        proposer: Arc<dyn Proposer>,
        cfg: DrafterConfig,
        metrics: DrafterMetrics,
        drain: Arc<Drain>,
    ) -> Self {
        let shared = Shared {
            proposer,
            cfg,
            metrics,
            active: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            drain,
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// The proposer, for warm-up.
    pub fn proposer(&self) -> &Arc<dyn Proposer> {
        &self.shared.proposer
    }

    /// The configuration.
    pub fn config(&self) -> &DrafterConfig {
        &self.shared.cfg
    }

    /// Refuses new work while the server drains.
    fn refuse_draining(&self) -> Result<(), Status> {
        match self.shared.drain.is_draining() {
            true => Err(Status::unavailable("the drafter is draining; use another")),
            false => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl pb::drafter_server::Drafter for DrafterService {
    type DraftStream = ReceiverStream<Result<pb::DraftResponse, Status>>;

    async fn draft(
        &self,
        request: Request<Streaming<pb::DraftRequest>>,
    ) -> Result<Response<Self::DraftStream>, Status> {
        let in_flight = self
            .shared
            .drain
            .enter()
            .ok_or_else(|| Status::unavailable("the drafter is draining; use another"))?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        let shared = Arc::clone(&self.shared);
        let handle = Handle::current();
        tokio::task::spawn_blocking(move || {
            let _in_flight = in_flight;
            let mut link = Link {
                inbound,
                tx,
                handle,
                idle: shared.cfg.idle_timeout,
            };
            if let Err(e) = run_session(&shared, &mut link) {
                shared.metrics.error(e.error_type());
                tracing::debug!("drafting session ended: {e}");
                let _ = link.tx.blocking_send(Err(Status::from(e)));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn info(&self, _: Request<pb::InfoRequest>) -> Result<Response<pb::DrafterInfo>, Status> {
        self.refuse_draining()?;
        let spec = self.shared.proposer.snapshot_spec();
        let hidden = spec.parts.first().map_or(0, |p| p.width);
        // Verifiers that predate snapshot parts read taps and hidden_size: fill them only
        // when they say everything (every part a tap of one width).
        let taps = spec.tap_layers();
        let legacy = taps.len() == spec.parts.len() && spec.parts.iter().all(|p| p.width == hidden);
        Ok(Response::new(pb::DrafterInfo {
            target: Some(self.shared.cfg.target.clone().into()),
            taps: match legacy {
                true => taps.iter().map(|t| *t as u32).collect(),
                false => Vec::new(),
            },
            hidden_size: hidden as u32,
            max_gamma: self.shared.proposer.max_gamma() as u32,
            kind: self.shared.cfg.kind.clone(),
            snapshot: spec_to_pb(&spec),
            max_message_bytes: u32::try_from(self.shared.cfg.max_message_bytes).unwrap_or(u32::MAX),
        }))
    }
}

/// The session's two channels, the runtime that drives the inbound one and how long it
/// waits for a message.
struct Link {
    inbound: Streaming<pb::DraftRequest>,
    tx: mpsc::Sender<Result<pb::DraftResponse, Status>>,
    handle: Handle,
    idle: Duration,
}

impl Link {
    /// The next message; `None` when the verifier closed or dropped the stream, an error
    /// when it sent nothing for the idle timeout or a message over the size limit (which
    /// tonic refuses to decode: the verifier is told why instead of seeing the stream end).
    fn next(&mut self) -> Result<Option<Msg>, DrafterError> {
        let next = tokio::time::timeout(self.idle, self.inbound.message());
        match self.handle.block_on(next) {
            Ok(Ok(Some(m))) => Ok(Some(m.msg.unwrap_or(Msg::Close(pb::Close {})))),
            Ok(Err(status)) if status.code() == Code::OutOfRange => Err(DrafterError::Invalid(
                format!("over the drafter's message limit: {}", status.message()),
            )),
            Ok(Ok(None) | Err(_)) => Ok(None),
            Err(_) => Err(DrafterError::Idle(self.idle)),
        }
    }

    /// Sends a response; false when the verifier is gone.
    fn send(&self, msg: pb::draft_response::Msg) -> bool {
        let resp = pb::DraftResponse { msg: Some(msg) };
        self.tx.blocking_send(Ok(resp)).is_ok()
    }
}

/// Counts a session as open for as long as it lives.
struct Active<'a>(&'a Shared);

impl<'a> Active<'a> {
    fn enter(shared: &'a Shared) -> Result<Self, DrafterError> {
        let open = shared.active.fetch_add(1, Ordering::SeqCst);
        let guard = Active(shared);
        if open >= shared.cfg.max_sessions {
            return Err(DrafterError::Busy(open));
        }
        shared.metrics.active_sessions.increment(1.0);
        shared.metrics.sessions.increment(1);
        Ok(guard)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let before = self.0.active.fetch_sub(1, Ordering::SeqCst);
        if before <= self.0.cfg.max_sessions {
            self.0.metrics.active_sessions.decrement(1.0);
        }
    }
}

fn run_session(shared: &Shared, link: &mut Link) -> Result<(), DrafterError> {
    let open = match link.next()? {
        None | Some(Msg::Close(_)) => return Ok(()),
        Some(Msg::Open(open)) => open,
        Some(_) => return Err(DrafterError::UnknownSession),
    };
    let spec = check_open(shared, &open)?;
    let sampling = sampling_from_pb(open.sampling.as_ref());
    sampling
        .validate()
        .map_err(|e| DrafterError::Invalid(e.to_string()))?;
    let _active = Active::enter(shared)?;
    let mut session = shared.proposer.open(&sampling)?;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let opened = pb::Opened {
        session_id: format!("s{id}"),
    };
    if !link.send(pb::draft_response::Msg::Opened(opened)) {
        return Ok(());
    }
    let width = spec.row_width();
    while let Some(msg) = link.next()? {
        match msg {
            Msg::Rows(rows) => {
                shared
                    .metrics
                    .snapshot_bytes
                    .increment(rows.data.len() as u64);
                session.extend(&rows_from_pb(&rows, width)?)?;
            }
            Msg::Propose(p) => {
                let block = propose(shared, session.as_mut(), &p)?;
                if !link.send(pb::draft_response::Msg::Block(block)) {
                    return Ok(());
                }
            }
            Msg::Close(_) => return Ok(()),
            Msg::Open(_) => {
                return Err(DrafterError::Invalid("the session is already open".into()))
            }
        }
    }
    Ok(())
}

/// The session's snapshot, once Open names this drafter's target and, when it declares the
/// rows it will send, exactly this drafter's snapshot.
fn check_open(shared: &Shared, open: &pb::Open) -> Result<SnapshotSpec, DrafterError> {
    let ours = &shared.cfg.target;
    let theirs = open.target.clone().map(TargetIdentity::from);
    if theirs.as_ref() != Some(ours) {
        return Err(DrafterError::TargetMismatch {
            ours: describe(Some(ours)),
            theirs: describe(theirs.as_ref()),
        });
    }
    let spec = shared.proposer.snapshot_spec();
    if !open.snapshot.is_empty() {
        let theirs = spec_from_pb(&open.snapshot)?;
        if theirs != spec {
            return Err(DrafterError::Invalid(format!(
                "the verifier would send snapshot rows of {theirs}, this drafter needs {spec}"
            )));
        }
    }
    Ok(spec)
}

fn propose(
    shared: &Shared,
    session: &mut dyn ProposerSession,
    p: &pb::Propose,
) -> Result<pb::Block, DrafterError> {
    let req = propose_request(p, shared.proposer.max_gamma())?;
    let t0 = Instant::now();
    let block = session.propose(&req)?;
    let secs = t0.elapsed().as_secs_f64();
    let m = &shared.metrics;
    m.blocks.increment(1);
    m.draft_tokens.increment(block.tokens.len() as u64);
    m.draft_seconds.record(secs);
    Ok(block_to_pb(&block, secs))
}

/// The proposal a Propose message asks for, once its γ is in `1..=max_gamma`.
pub fn propose_request(p: &pb::Propose, max_gamma: usize) -> Result<ProposeRequest, DrafterError> {
    let gamma = p.gamma as usize;
    if gamma == 0 || gamma > max_gamma {
        return Err(DrafterError::Invalid(format!(
            "γ must be in 1..={max_gamma}, got {gamma}"
        )));
    }
    Ok(ProposeRequest {
        anchor: p.anchor,
        position: p.position as usize,
        gamma,
    })
}

fn describe(t: Option<&TargetIdentity>) -> String {
    t.map_or_else(
        || "no target".to_string(),
        |t| {
            let hash = t.embedding_hash.get(..16).unwrap_or(&t.embedding_hash);
            format!("{} (embedding {hash}…)", t.architecture)
        },
    )
}
