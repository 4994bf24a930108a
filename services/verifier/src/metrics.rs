//! The verifier's Prometheus metrics (names and definitions in docs/architecture.md, following
//! vLLM's so dashboards carry over). Labels are bounded: finish reasons, draft positions
//! up to the largest γ and five confidence buckets.

use std::sync::Arc;

use tandem_core::FinishReason;
use tandem_engine::{Outcome, RoundStats, StepObserver, StepReport};
use tandem_telemetry::{Counter, Gauge, Histogram, Registry};

/// Upper edges of the confidence buckets of the per-confidence acceptance counters.
const CONFIDENCE_EDGES: [f32; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];

const REASONS: [FinishReason; 5] = [
    FinishReason::Length,
    FinishReason::Eos,
    FinishReason::Stop,
    FinishReason::Cancelled,
    FinishReason::Error,
];

/// Why a request was refused before it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The admission queue was full.
    QueueFull = 0,
    /// The server was draining.
    Draining = 1,
    /// Its deadline passed while it waited.
    Deadline = 2,
    /// It was malformed or out of range (INVALID_ARGUMENT), or could never fit the KV
    /// budget.
    Invalid = 3,
}

impl Refusal {
    const ALL: [Self; 4] = [
        Self::QueueFull,
        Self::Draining,
        Self::Deadline,
        Self::Invalid,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::Draining => "draining",
            Self::Deadline => "deadline",
            Self::Invalid => "invalid",
        }
    }
}

/// Why the server ended a running generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// Its deadline passed.
    Deadline = 0,
    /// Its client stopped reading for longer than the server waits.
    SlowClient = 1,
}

impl Abort {
    const ALL: [Self; 2] = [Self::Deadline, Self::SlowClient];

    fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::SlowClient => "slow_client",
        }
    }
}

fn reasons(r: &Registry, name: &'static str, help: &'static str, reasons: &[&str]) -> Vec<Counter> {
    reasons
        .iter()
        .map(|why| r.counter(name, help, &[("reason", why.to_string())]))
        .collect()
}

/// Handles of every verifier metric.
pub struct VerifierMetrics {
    drafts: Counter,
    draft_tokens: Counter,
    accepted: Counter,
    accepted_per_pos: Vec<Counter>,
    drafted_per_pos: Vec<Counter>,
    requests: Vec<Counter>,
    generated: Counter,
    prompt_tokens: Counter,
    proposer_failures: Counter,
    shed: Counter,
    whole_rows: Counter,
    /// `[position][bucket]`: tokens reached (all before them accepted) and accepted.
    reached_by_conf: Vec<Vec<Counter>>,
    accepted_by_conf: Vec<Vec<Counter>>,
    cut_blocks: Counter,
    cut_tokens: Counter,
    /// Drafter streams that failed (open, send or receive).
    pub draft_rpc_errors: Counter,
    /// Sessions moved to another drafter after theirs died or stalled.
    pub drafter_failovers: Counter,
    /// Context-row messages sent to drafters.
    pub snapshot_chunks: Counter,
    refused: Vec<Counter>,
    dropped: Vec<Counter>,
    /// Seconds to the first token.
    pub ttft: Histogram,
    /// Seconds between tokens.
    pub itl: Histogram,
    e2e: Histogram,
    verify: Histogram,
    draft_rpc: Histogram,
    acceptance_length: Histogram,
    /// Generations running.
    pub active_sessions: Gauge,
    /// Reserved KV-cache bytes over the budget.
    pub kv_usage: Gauge,
    /// Compatible drafter endpoints connected.
    pub drafters_available: Gauge,
    /// Requests waiting for admission.
    pub queued: Gauge,
    /// Seconds from arrival to admission.
    pub queue_time: Histogram,
    batch_sessions: Histogram,
    batch_rows: Histogram,
    batch_step: Histogram,
    batch_gather: Histogram,
    batch_missed: Counter,
    batch_unbatched: Counter,
}

impl VerifierMetrics {
    /// Registers the verifier's metrics in `r`, with per-position series up to `max_gamma`.
    pub fn new(r: &Arc<Registry>, max_gamma: usize) -> Self {
        let pos = |name, help| {
            (1..=max_gamma.max(1))
                .map(|p| r.counter(name, help, &[("position", p.to_string())]))
                .collect()
        };
        let by_conf = |name, help| {
            (1..=max_gamma.max(1))
                .map(|p| {
                    let mut lo = 0.0;
                    CONFIDENCE_EDGES
                        .iter()
                        .map(|hi| {
                            let bucket = format!("{lo:.1}-{hi:.1}");
                            lo = *hi;
                            let labels = [("position", p.to_string()), ("confidence", bucket)];
                            r.counter(name, help, &labels)
                        })
                        .collect()
                })
                .collect()
        };
        let secs = |name, help| r.histogram(name, help, &[]);
        Self {
            drafts: r.counter(
                "tandem_spec_drafts_total",
                "Rounds that verified a drafted block.",
                &[],
            ),
            draft_tokens: r.counter(
                "tandem_spec_draft_tokens_total",
                "Draft tokens verified.",
                &[],
            ),
            accepted: r.counter(
                "tandem_spec_accepted_tokens_total",
                "Draft tokens accepted.",
                &[],
            ),
            accepted_per_pos: pos(
                "tandem_spec_accepted_tokens_per_pos_total",
                "Draft tokens accepted, by position in the block (1-based).",
            ),
            drafted_per_pos: pos(
                "tandem_spec_draft_tokens_per_pos_total",
                "Rounds that drafted a token at this position (1-based).",
            ),
            requests: REASONS
                .iter()
                .map(|f| {
                    r.counter(
                        "tandem_requests_total",
                        "Finished requests by finish reason.",
                        &[("finish_reason", f.as_str().to_string())],
                    )
                })
                .collect(),
            generated: r.counter("tandem_generated_tokens_total", "Tokens generated.", &[]),
            prompt_tokens: r.counter(
                "tandem_prompt_tokens_total",
                "Prompt tokens processed.",
                &[],
            ),
            proposer_failures: r.counter(
                "tandem_proposer_failures_total",
                "Generations that lost their drafter and went on without speculation.",
                &[],
            ),
            shed: r.counter(
                "tandem_speculation_shed_total",
                "Generations that decoded plainly because, at the batch's load when they \
                 joined, its draft scheduler gave a newcomer no draft.",
                &[],
            ),
            whole_rows: r.counter(
                "tandem_sampled_whole_rows_total",
                "Sampled rows whose every logit was formed because their bounds left the \
                 rule's question open (CPU targets in exact precision).",
                &[],
            ),
            reached_by_conf: by_conf(
                "tandem_spec_reached_tokens_by_confidence_total",
                "Draft tokens verified with every token before them accepted, by position \
                 and by the confidence the drafter sent.",
            ),
            accepted_by_conf: by_conf(
                "tandem_spec_accepted_tokens_by_confidence_total",
                "Draft tokens accepted, by position and by the confidence the drafter sent.",
            ),
            cut_blocks: r.counter(
                "tandem_spec_confidence_cut_blocks_total",
                "Drafted blocks shortened because their calibrated confidences did not pay \
                 for verifying the rest.",
                &[],
            ),
            cut_tokens: r.counter(
                "tandem_spec_confidence_cut_tokens_total",
                "Drafted tokens left unverified by confidence cuts.",
                &[],
            ),
            draft_rpc_errors: r.counter(
                "tandem_draft_rpc_errors_total",
                "Drafter streams that failed.",
                &[],
            ),
            drafter_failovers: r.counter(
                "tandem_drafter_failovers_total",
                "Drafting sessions moved to another drafter after theirs died or stalled.",
                &[],
            ),
            batch_unbatched: r.counter(
                "tandem_batch_unbatched_generations_total",
                "Generations that ran alone, outside the batch (no free KV slot fitted them).",
                &[],
            ),
            snapshot_chunks: r.counter(
                "tandem_snapshot_chunks_total",
                "Context-row messages sent to drafters (long contexts go in several).",
                &[],
            ),
            refused: reasons(
                r,
                "tandem_refused_requests_total",
                "Requests refused before they ran, by reason.",
                &Refusal::ALL.map(Refusal::as_str),
            ),
            dropped: reasons(
                r,
                "tandem_dropped_requests_total",
                "Running generations the server ended, by reason.",
                &Abort::ALL.map(Abort::as_str),
            ),
            ttft: secs(
                "tandem_time_to_first_token_seconds",
                "Time to the first token, seconds.",
            ),
            itl: secs(
                "tandem_inter_token_latency_seconds",
                "Time between streamed tokens, seconds.",
            ),
            e2e: secs(
                "tandem_e2e_request_latency_seconds",
                "Request latency from admission to the last token, seconds.",
            ),
            verify: secs(
                "tandem_verify_seconds",
                "Target verify forward per round, seconds.",
            ),
            draft_rpc: secs(
                "tandem_draft_rpc_seconds",
                "Drafter round trip per round (send rows + propose), seconds.",
            ),
            acceptance_length: r.histogram(
                "tandem_acceptance_length",
                "Tokens emitted per drafting round (accepted + 1).",
                &[],
            ),
            active_sessions: r.gauge("tandem_active_sessions", "Generations running.", &[]),
            kv_usage: r.gauge(
                "tandem_kv_cache_usage_ratio",
                "KV-cache bytes reserved by running generations over the budget.",
                &[],
            ),
            drafters_available: r.gauge(
                "tandem_drafters_available",
                "Compatible drafter endpoints in use.",
                &[],
            ),
            queued: r.gauge(
                "tandem_queued_requests",
                "Requests waiting for admission.",
                &[],
            ),
            queue_time: secs(
                "tandem_queue_time_seconds",
                "Time from a request's arrival to its admission, seconds.",
            ),
            batch_sessions: r.histogram(
                "tandem_batch_sessions_per_step",
                "Generations whose forwards shared one batched target step.",
                &[],
            ),
            batch_rows: r.histogram(
                "tandem_batch_rows_per_step",
                "Token rows (prompt chunks and verify blocks) of one batched target step; on a GPU \
                 every block padded to the step's block length.",
                &[],
            ),
            batch_step: secs(
                "tandem_batch_step_seconds",
                "Target forward of one batched step, seconds.",
            ),
            batch_gather: secs(
                "tandem_batch_gather_seconds",
                "Wait of one batched target step for running generations after its first \
                 forward, seconds.",
            ),
            batch_missed: r.counter(
                "tandem_batch_missed_sessions_total",
                "Running generations a batched target step started without (still at \
                 work after its wait).",
                &[],
            ),
        }
    }

    /// Records one round.
    pub fn round(&self, r: &RoundStats) {
        self.verify.record(r.verify_s);
        if r.cut > 0 {
            self.cut_blocks.increment(1);
            self.cut_tokens.increment(r.cut as u64);
        }
        if r.drafted == 0 {
            return;
        }
        self.draft_rpc.record(r.draft_s);
        self.drafts.increment(1);
        self.draft_tokens.increment(r.drafted as u64);
        self.accepted.increment(r.accepted as u64);
        self.acceptance_length.record((r.accepted + 1) as f64);
        for c in self.drafted_per_pos.iter().take(r.drafted) {
            c.increment(1);
        }
        for c in self.accepted_per_pos.iter().take(r.accepted) {
            c.increment(1);
        }
        let reached = r.confidences.iter().take(r.accepted + 1).enumerate();
        for (k, conf) in reached {
            let b = CONFIDENCE_EDGES
                .iter()
                .position(|hi| conf < hi)
                .unwrap_or(4);
            if let Some(c) = self.reached_by_conf.get(k) {
                c[b].increment(1);
            }
            if let (true, Some(c)) = (k < r.accepted, self.accepted_by_conf.get(k)) {
                c[b].increment(1);
            }
        }
    }

    /// Records a finished request.
    pub fn finished(&self, out: &Outcome, e2e_s: f64) {
        self.request(out.finish);
        self.generated.increment(out.tokens.len() as u64);
        self.prompt_tokens.increment(out.prompt_tokens as u64);
        self.proposer_failures.increment(out.spec.proposer_failures);
        self.shed.increment(out.spec.shed);
        self.whole_rows.increment(out.spec.whole_rows);
        self.e2e.record(e2e_s);
    }

    /// Counts a request refused before it ran.
    pub fn refused(&self, why: Refusal) {
        self.refused[why as usize].increment(1);
    }

    /// Counts a running generation the server ended.
    pub fn dropped(&self, why: Abort) {
        self.dropped[why as usize].increment(1);
    }

    /// Counts a request by finish reason.
    pub fn request(&self, reason: FinishReason) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            self.requests[i].increment(1);
        }
    }
}

/// The HTTP API's request counter, `tandem_http_requests_total{endpoint,status}`: endpoints
/// are the API's few, statuses the few it answers with.
pub struct HttpMetrics {
    registry: Arc<Registry>,
}

const HTTP_REQUESTS: &str = "tandem_http_requests_total";
const HTTP_REQUESTS_HELP: &str =
    "HTTP API requests answered, by endpoint and status code (streams count at their start)";

impl HttpMetrics {
    /// The counter in `registry` (the series of successes exist from the start).
    pub fn new(registry: &Arc<Registry>) -> Self {
        let this = Self {
            registry: Arc::clone(registry),
        };
        for endpoint in ["completions", "chat_completions"] {
            this.counter(endpoint, 200).increment(0);
        }
        this
    }

    /// Counts one answer of `endpoint` with `status`.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        self.counter(endpoint, status).increment(1);
    }

    fn counter(&self, endpoint: &'static str, status: u16) -> Counter {
        let labels = [
            ("endpoint", endpoint.to_string()),
            ("status", status.to_string()),
        ];
        self.registry
            .counter(HTTP_REQUESTS, HTTP_REQUESTS_HELP, &labels)
    }
}

impl StepObserver for VerifierMetrics {
    fn step(&self, r: &StepReport) {
        self.batch_sessions.record(r.sequences as f64);
        self.batch_rows.record(r.rows as f64);
        self.batch_step.record(r.seconds);
        self.batch_gather.record(r.waited);
        self.batch_missed.increment(r.missed as u64);
    }

    fn unbatched(&self) {
        self.batch_unbatched.increment(1);
    }
}
