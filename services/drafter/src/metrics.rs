//! The drafter's Prometheus metrics (names in docs/architecture.md).

use std::sync::Arc;

use tandem_telemetry::{Counter, Gauge, Histogram, Registry};

use crate::error::DrafterError;

const ERRORS: &str = "tandem_drafter_errors_total";
const ERRORS_HELP: &str = "Drafting sessions ended by an error, by type.";

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
    registry: Arc<Registry>,
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
