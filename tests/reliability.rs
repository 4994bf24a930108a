//! What the services do when things go wrong, over real sockets with the real Gemma 3 270M:
//! a prompt whose context rows exceed gRPC's default message limit reaches the drafter in
//! chunks and speculation still accepts; deadlines end queued and running generations; a
//! full queue refuses at once; a client that stops reading is dropped and its slot freed; a draining verifier finishes
//! what it runs and refuses the rest; an idle drafting session is closed.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tandem_drafter::DrafterConfig;
use tandem_e2e::*;
use tandem_proto::v1 as pb;
use tonic::Code;

/// A token-id request for `ids`.
fn ids_request(ids: Vec<u32>, max_tokens: u32, speculative: bool) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids })),
        ..request("", max_tokens, speculative)
    }
}

/// A prompt of exactly `len` tokens: BOS, then a paragraph of prose repeated.
fn long_prompt(len: usize) -> Vec<u32> {
    let e = engine();
    let tok = e.tokenizer();
    let paragraph = "The river runs through the old town, past the market and the mill, \
        and in spring the water rises until the lower streets smell of mud and reeds. ";
    let piece = tok.encode(paragraph, false).unwrap();
    let mut ids = vec![tok.bos_id()];
    while ids.len() < len {
        ids.extend(&piece);
    }
    ids.truncate(len);
    ids
}

/// Reads `stream` to its end, which must be an error status before any finish message
/// (the generations here cannot finish in time).
async fn error_end(stream: &mut tonic::Streaming<pb::GenerateResponse>) -> tonic::Status {
    loop {
        match stream.message().await {
            Ok(Some(m)) => assert!(m.finished.is_none(), "the generation finished"),
            Ok(None) => panic!("the stream ended without a status"),
            Err(s) => return s,
        }
    }
}

/// Polls `node`'s metrics until `done` holds (up to 20 s).
async fn until(node: &Node, done: impl Fn(&std::collections::BTreeMap<String, f64>) -> bool) {
    for _ in 0..400 {
        if done(&scrape(node.metrics).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "metrics never reached the expected state: {:?}",
        scrape(node.metrics).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_near_the_context_limit_reaches_the_drafter_in_chunks() {
    let cfg = DrafterConfig {
        max_message_bytes: 1 << 20,
        ..DrafterConfig::new(target(), "dspark")
    };
    let d = start_drafter_with("127.0.0.1", shipped_drafter(), cfg, Secure::default()).await;
    let v = start_verifier(VerifierSetup {
        drafters: vec![d.url.clone()],
        max_context: Some(2048),
        ..Default::default()
    })
    .await;
    let prompt = long_prompt(1960);
    let (plain, _, _) = generate(&v.url, ids_request(prompt.clone(), 64, false))
        .await
        .unwrap();
    let (ids, _, finished) = generate(&v.url, ids_request(prompt, 64, true))
        .await
        .unwrap();
    assert_eq!(ids, plain, "speculative output equals plain");
    let s = finished.speculation.unwrap();
    assert_eq!(s.proposer_failures, 0, "{s:?}");
    assert!(
        s.drafts > 0 && s.accepted_tokens > 0,
        "speculation accepts: {s:?}"
    );
    let rows_bytes = 1960.0 * 5120.0;
    assert!(
        rows_bytes > 4.0 * 1024.0 * 1024.0,
        "beyond gRPC's default limit"
    );
    let (vm, dm) = (scrape(v.metrics).await, scrape(d.metrics).await);
    assert!(vm["tandem_snapshot_chunks_total"] >= 10.0, "{vm:?}");
    assert!(dm["tandem_drafter_snapshot_bytes_total"] >= rows_bytes);
    let too_long = generate(&v.url, ids_request(long_prompt(2000), 64, true)).await;
    assert_eq!(
        too_long.unwrap_err().code(),
        Code::InvalidArgument,
        "beyond --max-context"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlines_end_queued_and_running_generations() {
    let v = start_verifier(VerifierSetup {
        max_concurrent: 1,
        ..Default::default()
    })
    .await;
    let mut client = pb::generation_client::GenerationClient::connect(v.url.clone())
        .await
        .unwrap();
    let mut running = tonic::Request::new(request("Once upon a time,", 3000, false));
    running.set_timeout(Duration::from_millis(1500));
    let mut stream = client.generate(running).await.unwrap().into_inner();
    stream.message().await.unwrap().expect("a first chunk");
    let mut queued = tonic::Request::new(request("Hello", 4, false));
    queued.set_timeout(Duration::from_millis(200));
    let refused = client.clone().generate(queued).await.unwrap_err();
    // The server answers a little before the deadline; on a loaded machine the client's
    // own timer (tonic's, CANCELLED "Timeout expired") may still see it first.
    let client_timer = refused.code() == Code::Cancelled && refused.message() == "Timeout expired";
    assert!(
        refused.code() == Code::DeadlineExceeded || client_timer,
        "{refused:?}"
    );
    until(&v, |m| {
        m["tandem_refused_requests_total{reason=\"deadline\"}"] == 1.0
    })
    .await;
    let end = error_end(&mut stream).await;
    assert_eq!(end.code(), Code::DeadlineExceeded, "{end:?}");
    until(&v, |m| {
        m["tandem_active_sessions"] == 0.0 && m["tandem_kv_cache_usage_ratio"] == 0.0
    })
    .await;
    let m = scrape(v.metrics).await;
    assert_eq!(m["tandem_refused_requests_total{reason=\"deadline\"}"], 1.0);
    assert_eq!(m["tandem_dropped_requests_total{reason=\"deadline\"}"], 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_refuses_at_once_and_serves_again_once_it_drains() {
    let v = start_verifier(VerifierSetup {
        max_concurrent: 1,
        max_queued: Some(1),
        ..Default::default()
    })
    .await;
    let mut client = pb::generation_client::GenerationClient::connect(v.url.clone())
        .await
        .unwrap();
    let mut running = client
        .generate(request("Once upon a time,", 3000, false))
        .await
        .unwrap()
        .into_inner();
    running.message().await.unwrap().expect("a first chunk");
    let waiting = tokio::spawn(generate_owned(v.url.clone(), request("Hello", 4, false)));
    until(&v, |m| m["tandem_queued_requests"] == 1.0).await;
    let refused = client.generate(request("Hi", 4, false)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("busy"), "{refused:?}");
    drop(running);
    let (ids, _, _) = waiting.await.unwrap().expect("the queued request runs");
    assert_eq!(ids.len(), 4);
    let m = scrape(v.metrics).await;
    assert_eq!(
        m["tandem_refused_requests_total{reason=\"queue_full\"}"],
        1.0
    );
    assert_eq!(m["tandem_queued_requests"], 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_stops_reading_is_dropped_and_frees_its_slot() {
    let v = start_verifier(VerifierSetup {
        slow_client: Some(Duration::from_secs(1)),
        ..Default::default()
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(v.url.clone())
        .unwrap()
        .initial_stream_window_size(Some(64))
        .initial_connection_window_size(Some(64))
        .connect()
        .await
        .unwrap();
    let mut client = pb::generation_client::GenerationClient::new(channel);
    let mut stream = client
        .generate(request("Once upon a time,", 3000, false))
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().expect("a first chunk");
    until(&v, |m| {
        m["tandem_dropped_requests_total{reason=\"slow_client\"}"] == 1.0
    })
    .await;
    until(&v, |m| {
        m["tandem_active_sessions"] == 0.0 && m["tandem_kv_cache_usage_ratio"] == 0.0
    })
    .await;
    let end = error_end(&mut stream).await;
    assert_eq!(end.code(), Code::Aborted, "{end:?}");
    let (ids, _, _) = generate(&v.url, request("Hello", 4, false)).await.unwrap();
    assert_eq!(ids.len(), 4, "the next client is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_verifier_finishes_what_it_runs_and_refuses_the_rest() {
    let v = start_verifier(VerifierSetup::default()).await;
    let mut client = pb::generation_client::GenerationClient::connect(v.url.clone())
        .await
        .unwrap();
    let mut stream = client
        .generate(request("Once upon a time,", 160, false))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first chunk");
    v.stop();
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    for _ in 0..200 {
        if health(&v.url).await == not_serving {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(health(&v.url).await, not_serving, "draining");
    let refused = client
        .generate(request("Hello", 4, false))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let m = scrape(v.metrics).await;
    assert_eq!(m["tandem_refused_requests_total{reason=\"draining\"}"], 1.0);
    let mut tokens = first.token_ids.len();
    let finished = loop {
        let m = stream
            .message()
            .await
            .expect("the running generation goes on")
            .expect("a message");
        tokens += m.token_ids.len();
        if let Some(f) = m.finished {
            break f;
        }
    };
    assert_eq!(finished.reason, pb::FinishReason::Length as i32);
    assert_eq!(tokens, 160, "every token arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_drafting_session_is_closed() {
    let cfg = DrafterConfig {
        idle_timeout: Duration::from_millis(500),
        ..DrafterConfig::new(target(), "dspark")
    };
    let d = start_drafter_with("127.0.0.1", random_drafter(), cfg, Secure::default()).await;
    let mut client = pb::drafter_client::DrafterClient::connect(d.url.clone())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let open = pb::Open {
        target: Some(target().into()),
        ..Default::default()
    };
    tx.send(pb::DraftRequest {
        msg: Some(pb::draft_request::Msg::Open(open)),
    })
    .await
    .unwrap();
    let mut stream = client
        .draft(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let opened = stream.message().await.unwrap().expect("Opened");
    assert!(matches!(
        opened.msg,
        Some(pb::draft_response::Msg::Opened(_))
    ));
    let closed = stream.message().await.expect_err("closed for idling");
    assert_eq!(closed.code(), Code::DeadlineExceeded, "{closed:?}");
    until(&d, |m| m["tandem_active_sessions"] == 0.0).await;
    let m = scrape(d.metrics).await;
    assert_eq!(m["tandem_drafter_errors_total{error_type=\"idle\"}"], 1.0);
    drop(tx);
}
