//! Bad input to the services, each refused with the right gRPC status and a clear one-line
//! message, after which the servers go on serving: at the verifier (empty prompt, prompt
//! beyond the context, temperature < 0, top_p outside (0, 1], max_tokens 0 or absurd, token
//! ids outside the vocabulary), at the drafter (a session that was never opened, context
//! rows of the wrong byte length, dtype or shape, a verifier of another target), and a
//! verifier refusing a drafter made for another target.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pb::draft_request::Msg;
use tandem_core::{Proposer, SnapshotRows, TargetIdentity};
use tandem_e2e::*;
use tandem_proto::codec::rows_to_pb;
use tandem_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn sampling(temperature: f32, top_p: f32) -> Option<pb::SamplingParams> {
    Some(pb::SamplingParams {
        temperature: Some(temperature),
        top_p: Some(top_p),
        ..Default::default()
    })
}

async fn refused(url: &str, req: pb::GenerateRequest, code: Code, needle: &str) {
    let err = generate(url, req).await.expect_err("refused");
    assert_eq!(err.code(), code, "{err:?}");
    assert!(
        err.message().contains(needle) && !err.message().contains('\n'),
        "{needle}: {}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_verifier_refuses_bad_requests_and_goes_on() {
    let d = start_drafter().await;
    let v = start_verifier(VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    })
    .await;
    let ok = request("Hello", 4, true);
    let ids = |ids: Vec<u32>| Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids }));
    let cases = [
        (
            pb::GenerateRequest {
                prompt: Some(pb::generate_request::Prompt::Text(String::new())),
                ..ok.clone()
            },
            "prompt is empty",
        ),
        (
            pb::GenerateRequest {
                prompt: None,
                ..ok.clone()
            },
            "prompt is empty",
        ),
        (
            pb::GenerateRequest {
                prompt: ids(vec![2; 40_000]),
                ..ok.clone()
            },
            "context limit",
        ),
        (
            pb::GenerateRequest {
                sampling: sampling(-1.0, 1.0),
                ..ok.clone()
            },
            "temperature",
        ),
        (
            pb::GenerateRequest {
                sampling: sampling(1.0, 0.0),
                ..ok.clone()
            },
            "top_p",
        ),
        (
            pb::GenerateRequest {
                sampling: sampling(1.0, 1.5),
                ..ok.clone()
            },
            "top_p",
        ),
        (
            pb::GenerateRequest {
                max_tokens: Some(0),
                ..ok.clone()
            },
            "max_tokens",
        ),
        (
            pb::GenerateRequest {
                max_tokens: Some(u32::MAX),
                ..ok.clone()
            },
            "context limit",
        ),
        (
            pb::GenerateRequest {
                prompt: ids(vec![2, 900_000]),
                ..ok.clone()
            },
            "outside the vocabulary",
        ),
    ];
    let count = cases.len() as f64;
    for (req, needle) in cases {
        refused(&v.url, req, Code::InvalidArgument, needle).await;
    }
    let m = scrape(v.metrics).await;
    assert_eq!(
        m["tandem_refused_requests_total{reason=\"invalid\"}"],
        count
    );
    let (tokens, _, _) = generate(&v.url, ok).await.expect("still serving");
    assert_eq!(tokens.len(), 4);
}

/// Opens a raw Draft stream; returns the sender and the response stream.
async fn raw_session(
    url: &str,
) -> (
    mpsc::Sender<pb::DraftRequest>,
    tonic::Streaming<pb::DraftResponse>,
) {
    let mut client = pb::drafter_client::DrafterClient::connect(url.to_string())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(8);
    let stream = client
        .draft(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, stream)
}

async fn send(tx: &mpsc::Sender<pb::DraftRequest>, msg: Msg) {
    tx.send(pb::DraftRequest { msg: Some(msg) }).await.unwrap();
}

fn open(target: pb::TargetIdentity) -> Msg {
    Msg::Open(pb::Open {
        target: Some(target),
        sampling: None,
        snapshot: Vec::new(),
    })
}

/// Sends `msgs` after a good Open and expects the stream to end with `code`.
async fn drafter_refuses(url: &str, first: Option<Msg>, msgs: Vec<Msg>, code: Code, needle: &str) {
    let (tx, mut stream) = raw_session(url).await;
    if let Some(m) = first {
        send(&tx, m).await;
        let opened = stream.message().await.expect("opened").expect("a message");
        assert!(matches!(
            opened.msg,
            Some(pb::draft_response::Msg::Opened(_))
        ));
    }
    for m in msgs {
        send(&tx, m).await;
    }
    let err = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended without an error ({needle})"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), code, "{needle}: {err:?}");
    assert!(
        err.message().contains(needle),
        "{needle}: {}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drafter_refuses_bad_streams_and_goes_on() {
    let d = start_drafter().await;
    let spec = random_drafter().snapshot_spec();
    let rows = SnapshotRows {
        start: 0,
        width: spec.row_width(),
        data: vec![0.5; 3 * spec.row_width()],
        tokens: Vec::new(),
    };
    let good = rows_to_pb(&rows, pb::Dtype::Bf16);
    let propose = Msg::Propose(pb::Propose {
        anchor: 2,
        position: 3,
        gamma: 4,
    });
    let mut short = good.clone();
    short.data.truncate(good.data.len() - 2);
    let mut no_dtype = good.clone();
    no_dtype.dtype = 0;
    let mut flat = good.clone();
    flat.shape = vec![good.data.len() as u32 / 2];
    let mut wide = good.clone();
    wide.shape = vec![1, 3 * spec.row_width() as u32];
    let other = pb::TargetIdentity {
        architecture: "gemma3".into(),
        embedding_hash: "0".repeat(64),
    };
    // Over the drafter's 4 MiB message limit: refused with the reason, not a silent close.
    let huge = rows_to_pb(
        &SnapshotRows {
            start: 0,
            width: spec.row_width(),
            data: vec![0.5; ((4 << 20) / (2 * spec.row_width()) + 16) * spec.row_width()],
            tokens: Vec::new(),
        },
        pb::Dtype::Bf16,
    );
    let t = pb::TargetIdentity::from(target());
    drafter_refuses(
        &d.url,
        None,
        vec![propose.clone()],
        Code::FailedPrecondition,
        "unknown session",
    )
    .await;
    drafter_refuses(
        &d.url,
        None,
        vec![open(other)],
        Code::FailedPrecondition,
        "target mismatch",
    )
    .await;
    for (rows, needle) in [
        (short, "bytes"),
        (no_dtype, "dtype"),
        (flat, "shape"),
        (wide, "wide"),
        (huge, "message limit"),
    ] {
        drafter_refuses(
            &d.url,
            Some(open(t.clone())),
            vec![Msg::Rows(rows)],
            Code::InvalidArgument,
            needle,
        )
        .await;
    }
    let beyond = Msg::Propose(pb::Propose {
        anchor: 2,
        position: 3,
        gamma: 99,
    });
    drafter_refuses(
        &d.url,
        Some(open(t.clone())),
        vec![Msg::Rows(good.clone()), beyond],
        Code::InvalidArgument,
        "γ",
    )
    .await;
    let (tx, mut stream) = raw_session(&d.url).await;
    send(&tx, open(t)).await;
    send(&tx, Msg::Rows(good)).await;
    send(&tx, propose).await;
    stream.message().await.unwrap().expect("opened");
    let block = stream.message().await.unwrap().expect("a block");
    match block.msg {
        Some(pb::draft_response::Msg::Block(b)) => assert_eq!(b.tokens.len(), 4),
        other => panic!("expected a block, got {other:?}"),
    }
    let m = scrape(d.metrics).await;
    assert!(total(&m, "tandem_drafter_errors_total") >= 8.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_verifier_refuses_a_drafter_made_for_another_target() {
    let other = TargetIdentity {
        architecture: "gemma3".into(),
        embedding_hash: "f".repeat(64),
    };
    let d = start_drafter_on("127.0.0.1", random_drafter() as Arc<dyn Proposer>, other).await;
    let setup = VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    };
    let err = build_verifier(engine(), setup)
        .await
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("another target") && msg.contains(&d.url),
        "{msg}"
    );
}
