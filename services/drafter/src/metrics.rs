//! The drafter's Prometheus metrics (names in docs/architecture.md).

use std::sync::Arc;

use tandem_core::batching::{StepObserver, StepReport};
use tandem_core::RouteObserver;
use tandem_telemetry::{Counter, Gauge, Histogram, Registry};

use crate::error::DrafterError;

const ERRORS: &str = "tandem_drafter_errors_total";
const ERRORS_HELP: &str = "Drafting sessions ended by an error, by type.";
const ROUTED: &str = "tandem_drafter_routed_sessions_total";
const ROUTED_HELP: &str = "Sessions of a routed drafter set, by the route their prompt chose.";

/// Handles of every drafter metric.
pub struct DrafterMetrics {
    /// Blocks drafted.
    pub blocks: Counter,
    /// Tokens drafted.
    pub draft_tokens: Counter,
    /// Compute time per block.
    pub draft_seconds: Histogram,
    /// Sessions open now.
    pub active_sessions: Gauge,
    /// Sessions opened.
    pub sessions: Counter,
    /// Snapshot payload bytes received.
    pub snapshot_bytes: Counter,
    /// What each batched drafting step drafted.
    pub batches: Arc<BatchMetrics>,
    /// Which drafter each session of a routed set drafts with.
    pub routes: Arc<RouteMetrics>,
    registry: Arc<Registry>,
}

/// Sessions per route of a routed drafter set (none where the drafter does not route).
pub struct RouteMetrics(Arc<Registry>);

impl RouteMetrics {
    /// Registers every one of `routes` at 0.
    pub fn register(&self, routes: &[String]) {
        for r in routes {
            self.0
                .counter(ROUTED, ROUTED_HELP, &[("route", r.clone())])
                .increment(0);
        }
    }
}

impl RouteObserver for RouteMetrics {
    fn routed(&self, route: &str) {
        self.0
            .counter(ROUTED, ROUTED_HELP, &[("route", route.to_string())])
            .increment(1);
        tracing::debug!(route, "session routed");
    }
}

/// Sessions, draft tokens and seconds of each batched drafting step (a proposer that
/// drafts sessions alone records none).
pub struct BatchMetrics {
    sessions: Histogram,
    rows: Histogram,
    seconds: Histogram,
    gather: Histogram,
    missed: Counter,
}

impl StepObserver for BatchMetrics {
    fn step(&self, r: &StepReport) {
        self.sessions.record(r.sequences as f64);
        self.rows.record(r.rows as f64);
        self.seconds.record(r.seconds);
        self.gather.record(r.waited);
        self.missed.increment(r.missed as u64);
    }
}

impl DrafterMetrics {
    /// Registers the drafter's metrics in `registry` (error counters of every type at 0).
    pub fn new(registry: Arc<Registry>) -> Self {
        let r = &registry;
        for t in DrafterError::TYPES {
            r.counter(ERRORS, ERRORS_HELP, &[("error_type", t.to_string())])
                .increment(0);
        }
        Self {
            blocks: r.counter("tandem_drafter_blocks_total", "Blocks drafted.", &[]),
            draft_tokens: r.counter("tandem_drafter_draft_tokens_total", "Tokens drafted.", &[]),
            draft_seconds: r.histogram(
                "tandem_draft_seconds",
                "Drafter compute time per block, seconds.",
                &[],
            ),
            active_sessions: r.gauge("tandem_active_sessions", "Drafting sessions open now.", &[]),
            sessions: r.counter(
                "tandem_drafter_sessions_total",
                "Drafting sessions opened.",
                &[],
            ),
            snapshot_bytes: r.counter(
                "tandem_drafter_snapshot_bytes_total",
                "Snapshot (context row) payload bytes received.",
                &[],
            ),
            batches: Arc::new(BatchMetrics {
                sessions: r.histogram(
                    "tandem_drafter_batch_sessions_per_step",
                    "Sessions whose blocks one batched drafting step drafted.",
                    &[],
                ),
                rows: r.histogram(
                    "tandem_drafter_batch_rows_per_step",
                    "Draft tokens of one batched drafting step.",
                    &[],
                ),
                seconds: r.histogram(
                    "tandem_drafter_batch_step_seconds",
                    "Wall time of one batched drafting step, seconds.",
                    &[],
                ),
                gather: r.histogram(
                    "tandem_drafter_batch_gather_seconds",
                    "Wait of one batched drafting step for open sessions after its first \
                     block, seconds.",
                    &[],
                ),
                missed: r.counter(
                    "tandem_drafter_batch_missed_sessions_total",
                    "Open sessions a batched drafting step started without.",
                    &[],
                ),
            }),
            routes: Arc::new(RouteMetrics(Arc::clone(r))),
            registry,
        }
    }

    /// Counts a failed session by error type.
    pub fn error(&self, error_type: &'static str) {
        self.registry
            .counter(
                ERRORS,
                ERRORS_HELP,
                &[("error_type", error_type.to_string())],
            )
            .increment(1);
    }
}
