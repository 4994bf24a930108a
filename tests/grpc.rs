//! The services end to end over real sockets on 127.0.0.1, with the real Gemma 3 270M and
//! a randomly initialised DSpark drafter: greedy output through verifier + two drafters
//! equals in-process speculative output equals plain output for 8 concurrent sessions;
//! health, metrics and their invariants; a cancelled client frees its session on both sides;
//! the drafter is sent every committed token with its row.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::time::Duration;

use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession, SamplingParams,
    SnapshotRows, SnapshotSpec,
};
use tandem_e2e::*;
use tandem_engine::{GenerationRequest, Update};
use tandem_proto::v1 as pb;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time,",
    "SELECT name FROM users WHERE",
    "The three primary colors are",
    "1, 2, 3, 4,",
    "In 1969, Neil Armstrong",
    "To make a cup of tea, first",
];
const NEW_TOKENS: u32 = 24;

fn local(prompt: &str, gamma: usize) -> Vec<u32> {
    let e = engine();
    let req = GenerationRequest {
        prompt: e.tokenizer().encode(prompt, true).unwrap(),
        max_tokens: NEW_TOKENS as usize,
        ignore_eos: true,
        gamma,
        ..GenerationRequest::default()
    };
    let drafter = random_drafter();
    let proposer: Option<&dyn tandem_core::Proposer> = (gamma > 0).then_some(drafter.as_ref() as _);
    e.generate(&req, proposer, &mut |_: &Update| ControlFlow::Continue(()))
        .unwrap()
        .tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remote_speculation_equals_local_and_plain_with_metrics_that_add_up() {
    let d1 = start_drafter().await;
    let d2 = start_drafter().await;
    let setup = VerifierSetup {
        drafters: vec![d1.url.clone(), d2.url.clone()],
        ..Default::default()
    };
    let v = start_verifier(setup).await;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    for url in [&v.url, &d1.url, &d2.url] {
        assert_eq!(health(url).await, serving);
    }
    let calls: Vec<_> = PROMPTS
        .iter()
        .map(|p| tokio::spawn(generate_owned(v.url.clone(), request(p, NEW_TOKENS, true))))
        .collect();
    let mut remote = Vec::new();
    for c in calls {
        remote.push(c.await.unwrap().expect("generation"));
    }
    let (plain, spec) = tokio::task::spawn_blocking(|| {
        let plain: Vec<_> = PROMPTS.iter().map(|p| local(p, 0)).collect();
        let spec: Vec<_> = PROMPTS.iter().map(|p| local(p, 8)).collect();
        (plain, spec)
    })
    .await
    .unwrap();
    let mut drafts = 0;
    for (i, (ids, _, finished)) in remote.iter().enumerate() {
        assert_eq!(ids, &plain[i], "{:?}: gRPC vs plain", PROMPTS[i]);
        assert_eq!(
            ids, &spec[i],
            "{:?}: gRPC vs in-process speculative",
            PROMPTS[i]
        );
        assert_eq!(finished.reason, pb::FinishReason::Length as i32);
        let s = finished.speculation.clone().unwrap();
        assert!(s.drafts > 0 && s.proposer_failures == 0, "{s:?}");
        drafts += s.drafts;
    }
    let vm = scrape(v.metrics).await;
    let accepted = total(&vm, "tandem_spec_accepted_tokens_total");
    let drafted = total(&vm, "tandem_spec_draft_tokens_total");
    assert!(accepted <= drafted);
    assert_eq!(total(&vm, "tandem_spec_drafts_total"), drafts as f64);
    assert_eq!(
        total(&vm, "tandem_spec_accepted_tokens_per_pos_total"),
        accepted
    );
    assert_eq!(
        total(&vm, "tandem_spec_draft_tokens_per_pos_total"),
        drafted
    );
    assert_eq!(
        vm["tandem_requests_total{finish_reason=\"length\"}"],
        PROMPTS.len() as f64
    );
    assert_eq!(
        vm["tandem_generated_tokens_total"],
        (PROMPTS.len() as u32 * NEW_TOKENS) as f64
    );
    assert_eq!(vm["tandem_active_sessions"], 0.0);
    assert_eq!(vm["tandem_drafters_available"], 2.0);
    assert_eq!(vm["tandem_acceptance_length_count"], drafts as f64);
    assert!(vm["tandem_time_to_first_token_seconds_count"] >= PROMPTS.len() as f64);
    let (m1, m2) = (scrape(d1.metrics).await, scrape(d2.metrics).await);
    let sessions = [
        m1["tandem_drafter_sessions_total"],
        m2["tandem_drafter_sessions_total"],
    ];
    assert!(
        sessions.iter().all(|s| *s >= 3.0),
        "sessions spread over both drafters: {sessions:?}"
    );
    assert_eq!(sessions.iter().sum::<f64>(), PROMPTS.len() as f64);
    // Rounds that found their block in the context asked no drafter.
    let blocks = m1["tandem_drafter_blocks_total"] + m2["tandem_drafter_blocks_total"];
    assert!(
        blocks > 0.0 && blocks <= drafts as f64,
        "{blocks} blocks, {drafts} drafts"
    );
    assert!(m1["tandem_drafter_snapshot_bytes_total"] > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_client_frees_its_session_on_both_sides() {
    let d = start_drafter().await;
    let v = start_verifier(VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    })
    .await;
    let mut client = pb::generation_client::GenerationClient::connect(v.url.clone())
        .await
        .unwrap();
    let mut stream = client
        .generate(request("Once upon a time,", 2000, true))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        stream.message().await.unwrap().expect("a chunk");
    }
    let (vm, dm) = (scrape(v.metrics).await, scrape(d.metrics).await);
    assert_eq!(vm["tandem_active_sessions"], 1.0);
    assert_eq!(dm["tandem_active_sessions"], 1.0);
    drop(stream);
    let mut freed = false;
    for _ in 0..200 {
        let (vm, dm) = (scrape(v.metrics).await, scrape(d.metrics).await);
        if vm["tandem_active_sessions"] == 0.0 && dm["tandem_active_sessions"] == 0.0 {
            assert_eq!(
                vm["tandem_requests_total{finish_reason=\"cancelled\"}"],
                1.0
            );
            assert_eq!(vm["tandem_kv_cache_usage_ratio"], 0.0);
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "sessions still open after the client left");
    let (ids, _, f) = generate(&v.url, request("Hello", 4, true))
        .await
        .expect("serves the next request");
    assert_eq!((ids.len(), f.reason), (4, pb::FinishReason::Length as i32));
}

/// Every session's row tokens, in order.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<Vec<u32>>>>;

/// A drafter's proposer that records the token of every row each session is sent.
struct Recording {
    inner: std::sync::Arc<dyn Proposer>,
    sessions: Seen,
}

struct RecordingSession {
    inner: Box<dyn ProposerSession>,
    sessions: Seen,
    index: usize,
}

impl Proposer for Recording {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.inner.snapshot_spec()
    }
    fn max_gamma(&self) -> usize {
        self.inner.max_gamma()
    }
    fn open(&self, s: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        let mut sessions = self.sessions.lock().unwrap();
        sessions.push(Vec::new());
        Ok(Box::new(RecordingSession {
            inner: self.inner.open(s)?,
            sessions: self.sessions.clone(),
            index: sessions.len() - 1,
        }))
    }
}

impl ProposerSession for RecordingSession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        let mut sessions = self.sessions.lock().unwrap();
        let seen = &mut sessions[self.index];
        assert_eq!(seen.len(), rows.start, "rows in order from position 0");
        assert_eq!(rows.tokens.len(), rows.rows(), "a token with every row");
        seen.extend_from_slice(&rows.tokens);
        drop(sessions);
        self.inner.extend(rows)
    }
    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        self.inner.propose(req)
    }
}

/// Over gRPC the drafter is sent the committed token of every row, the prompt's first:
/// what it was sent is the prompt and then the generation, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drafter_is_sent_every_committed_token() {
    let sessions = Seen::default();
    let recording = Recording {
        inner: random_drafter(),
        sessions: std::sync::Arc::clone(&sessions),
    };
    let d = start_drafter_on("127.0.0.1", std::sync::Arc::new(recording), target()).await;
    let setup = VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    };
    let v = start_verifier(setup).await;
    let prompt = PROMPTS[3];
    let (ids, ..) = generate(&v.url, request(prompt, NEW_TOKENS, true))
        .await
        .unwrap();
    let mut context = engine().tokenizer().encode(prompt, true).unwrap();
    let prompt_len = context.len();
    context.extend(&ids);
    // The drafter's own warm-up session came first.
    let seen = sessions.lock().unwrap().last().cloned().unwrap();
    assert!(seen.len() > prompt_len, "{} tokens seen", seen.len());
    assert_eq!(seen[..], context[..seen.len()]);
}
