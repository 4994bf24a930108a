//! A Gemma 4 target with the Gemma 4 assistant drafter through real servers on 127.0.0.1:0,
//! on the tiny random checkpoints of the transformers goldens
//! (`shared/gemma/tests/fixtures/gemma4`: `target_ple` and `assistant_dense`): greedy
//! output over gRPC with speculation == without == in process; a drafter whose declared
//! snapshot does not fit the target (wrong layer, wrong width) is refused at the verifier
//! with a clear message; an Open declaring other rows is refused by the drafter. Prompts
//! are token ids (the tiny vocabulary has no tokenizer of its own; text goes through the
//! Gemma 3 tokenizer, whose ids below 256 it shares).
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use tandem_assistant::{AssistantOptions, AssistantProposer};
use tandem_core::{
    DraftBlock, PartSpec, ProposeError, ProposeRequest, Proposer, ProposerSession, SamplingParams,
    SnapshotPart, SnapshotRows, SnapshotSpec, TargetIdentity,
};
use tandem_e2e::*;
use tandem_engine::{Engine, GenerationRequest, Placement, TargetFiles, Update};
use tandem_proto::spec::spec_to_pb;
use tandem_proto::v1 as pb;
use tandem_testkit::real_tokenizer;

const NEW_TOKENS: u32 = 32;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/gemma/tests/fixtures/gemma4")
}

fn gemma4_engine() -> Engine {
    let files = TargetFiles {
        model: fixtures().join("target_ple"),
        tokenizer: real_tokenizer(),
    };
    let engine = Engine::load(&files, &Placement::Cpu(Default::default())).unwrap();
    assert_eq!(engine.model().identity().unwrap().architecture, "gemma4");
    engine
}

fn target_of(engine: &Engine) -> TargetIdentity {
    engine.model().identity().unwrap()
}

fn assistant() -> Arc<AssistantProposer> {
    let dir = fixtures();
    let opts = AssistantOptions { max_gamma: 8 };
    let p = AssistantProposer::load(&dir.join("assistant_dense"), &dir.join("target_ple"), opts);
    Arc::new(p.unwrap())
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![2, 17, 99, 3],
        vec![2, 200, 201, 202, 5, 6, 7],
        vec![2, 44],
        vec![2, 250, 13, 13, 13, 80, 81, 82, 83, 120],
    ]
}

fn id_request(ids: &[u32], speculative: bool) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds {
            ids: ids.to_vec(),
        })),
        ..request("", NEW_TOKENS, speculative)
    }
}

fn local_plain(engine: &Engine, ids: &[u32]) -> Vec<u32> {
    let req = GenerationRequest {
        prompt: ids.to_vec(),
        max_tokens: NEW_TOKENS as usize,
        ignore_eos: true,
        ..GenerationRequest::default()
    };
    let out = engine.generate(&req, None, &mut |_: &Update| ControlFlow::Continue(()));
    out.unwrap().tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn assistant_speculation_over_grpc_equals_plain() {
    let engine = gemma4_engine();
    let target = target_of(&engine);
    let d = start_drafter_kind("127.0.0.1", assistant(), target.clone(), "gemma4-assistant").await;
    let setup = VerifierSetup {
        drafters: vec![d.url.clone()],
        ..Default::default()
    };
    let v = start_verifier_for(engine.clone(), setup).await;
    let (mut drafted, mut accepted) = (0, 0);
    for ids in prompts() {
        let (spec_ids, _, f) = generate(&v.url, id_request(&ids, true)).await.unwrap();
        let (plain_ids, _, _) = generate(&v.url, id_request(&ids, false)).await.unwrap();
        let e = engine.clone();
        let p = ids.clone();
        let local = tokio::task::spawn_blocking(move || local_plain(&e, &p))
            .await
            .unwrap();
        assert_eq!(spec_ids, plain_ids, "{ids:?}");
        assert_eq!(spec_ids, local, "{ids:?}");
        let s = f.speculation.unwrap();
        assert!(s.drafts > 0, "{ids:?}: no rounds drafted");
        assert_eq!(s.proposer_failures, 0, "{ids:?}");
        drafted += s.draft_tokens;
        accepted += s.accepted_tokens;
    }
    eprintln!("assistant over gRPC: accepted {accepted} of {drafted} drafted tokens");
}

/// Declares a snapshot and drafts nothing (the pool refuses it before any session; the
/// drafter's warm-up still needs one).
struct Declares(SnapshotSpec);

struct Nothing;

impl ProposerSession for Nothing {
    fn extend(&mut self, _: &SnapshotRows) -> Result<(), ProposeError> {
        Ok(())
    }
    fn propose(&mut self, _: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        Ok(DraftBlock::default())
    }
}

impl Proposer for Declares {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.0.clone()
    }
    fn max_gamma(&self) -> usize {
        4
    }
    fn open(&self, _: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        Ok(Box::new(Nothing))
    }
}

fn with_part(i: usize, part: SnapshotPart, width: usize) -> SnapshotSpec {
    let mut spec = assistant().snapshot_spec();
    spec.parts[i] = PartSpec { part, width };
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drafters_whose_snapshot_does_not_fit_are_refused() {
    let engine = gemma4_engine();
    let target = target_of(&engine);
    let cases = [
        // Layer 4 shares layer 3's keys and values: it has none of its own to send.
        (
            with_part(1, SnapshotPart::DonorKey(4), 16),
            "layers [0, 1, 2, 3] only",
        ),
        (
            with_part(4, SnapshotPart::DonorValue(2), 16),
            "value(2)×16: the target's part is 32 wide",
        ),
        (
            with_part(0, SnapshotPart::Tap(3), 64),
            "only the last hidden state",
        ),
        (SnapshotSpec::taps(&[7], 64), "the target has 6 layers"),
    ];
    for (spec, needle) in cases {
        let d =
            start_drafter_kind("127.0.0.1", Arc::new(Declares(spec)), target.clone(), "x").await;
        let setup = VerifierSetup {
            drafters: vec![d.url.clone()],
            ..Default::default()
        };
        let err = build_verifier(engine.clone(), setup).await.err().unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("does not fit the target") && msg.contains(needle),
            "{msg}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_open_declaring_other_rows_is_refused() {
    let engine = gemma4_engine();
    let target = target_of(&engine);
    let d = start_drafter_kind("127.0.0.1", assistant(), target.clone(), "gemma4-assistant").await;
    let mut client = pb::drafter_client::DrafterClient::connect(d.url.clone())
        .await
        .unwrap();
    let info = client.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.kind, "gemma4-assistant");
    assert!(
        info.taps.is_empty(),
        "an old verifier must not mistake the parts for taps"
    );
    assert_eq!(info.snapshot, spec_to_pb(&assistant().snapshot_spec()));
    let open = pb::Open {
        target: Some(target.into()),
        sampling: None,
        snapshot: spec_to_pb(&SnapshotSpec::taps(&[6], 64)),
    };
    let msg = pb::DraftRequest {
        msg: Some(pb::draft_request::Msg::Open(open)),
    };
    let mut stream = client
        .draft(tokio_stream::iter(vec![msg]))
        .await
        .unwrap()
        .into_inner();
    let err = stream.message().await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("this drafter needs [tap(6)×64, key(3)×16"),
        "{}",
        err.message()
    );
}
