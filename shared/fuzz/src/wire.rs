//! Targets for the gRPC messages a service decodes from a peer: the verifier's
//! `GenerateRequest` (decoded, turned into the engine's request with the server's defaults,
//! planned on the real Gemma 3 270M), the drafter's stream messages (Open, Rows, Propose)
//! and the drafter's answers as the verifier reads them (Info, Block).

use std::sync::OnceLock;

use pb::draft_request::Msg;
use prost::Message;
use tandem_core::{DraftBlock, TargetIdentity};
use tandem_drafter::propose_request;
use tandem_engine::{check_block, Engine, Placement, TargetFiles};
use tandem_proto::codec::{rows_from_pb, sampling_from_pb};
use tandem_proto::spec::{spec_from_info, spec_from_pb};
use tandem_proto::v1 as pb;
use tandem_verifier::{generation_request, RequestDefaults, VerifierSettings, MAX_STOPS};

/// γ the drafter and the verifier agree on here (the shipped DSpark drafter's).
pub const GAMMA: usize = 8;
/// Width of one snapshot row of the shipped drafter: 4 taps of the 640-wide target.
pub const ROW_WIDTH: usize = 4 * 640;
/// The real target's vocabulary.
pub const VOCAB: usize = 262_144;

/// The real Gemma 3 270M engine on the CPU, loaded once (panics, saying to fetch it, when
/// the model files are missing).
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let files = TargetFiles {
            model: tandem_testkit::real_gguf(),
            tokenizer: tandem_testkit::real_tokenizer(),
        };
        Engine::load(&files, &Placement::Cpu(Default::default()))
            .expect("the real Gemma 3 270M loads")
    })
}

/// The verifier's request defaults as it ships.
pub(crate) fn defaults() -> RequestDefaults {
    let s = VerifierSettings::default();
    RequestDefaults {
        gamma: s.gamma,
        adaptive_gamma: s.adaptive_gamma,
        verification: s.verification,
        confidence_cuts: s.confidence_cuts,
        default_max_tokens: s.default_max_tokens,
    }
}

/// A `GenerateRequest` as the verifier handles it before admission: decoded, converted
/// with the server's defaults (prompt tokenized, stop strings bounded) and planned.
pub fn generate_request(data: &[u8]) {
    let Ok(r) = pb::GenerateRequest::decode(data) else {
        return;
    };
    let engine = engine();
    let Ok(req) = generation_request(r, &defaults(), engine.tokenizer()) else {
        return;
    };
    assert!(!req.prompt.is_empty() && req.stop_strings.len() <= MAX_STOPS);
    if let Ok(plan) = engine.plan(req, GAMMA) {
        assert!(plan.gamma() <= GAMMA);
        assert!(plan.request().sampling.validate().is_ok());
    }
}

/// A message of a drafting stream as the drafter handles it: Open's target, snapshot and
/// sampling, Rows decoded at the shipped drafter's width, Propose's γ.
pub fn draft_request(data: &[u8]) {
    let Ok(req) = pb::DraftRequest::decode(data) else {
        return;
    };
    match req.msg {
        Some(Msg::Open(open)) => {
            let _ = open.target.map(TargetIdentity::from);
            if let Ok(spec) = spec_from_pb(&open.snapshot) {
                assert_eq!(spec.parts.len(), open.snapshot.len());
                assert!(spec.row_width() >= spec.parts.len());
            }
            let _ = sampling_from_pb(open.sampling.as_ref()).validate();
        }
        Some(Msg::Rows(rows)) => {
            if let Ok(r) = rows_from_pb(&rows, ROW_WIDTH) {
                assert_eq!(r.width, ROW_WIDTH);
                assert_eq!(r.data.len() % ROW_WIDTH, 0);
                assert!(r.data.iter().all(|x| x.is_finite()));
            }
        }
        Some(Msg::Propose(p)) => {
            if let Ok(r) = propose_request(&p, GAMMA) {
                assert!((1..=GAMMA).contains(&r.gamma));
            }
        }
        Some(Msg::Close(_)) | None => {}
    }
}

/// A drafter's answers as the verifier reads them: Info's snapshot declaration, and a Block
/// through the checks every drafted block passes before a round uses it (greedy and
/// sampled).
pub fn draft_response(data: &[u8]) {
    if let Ok(info) = pb::DrafterInfo::decode(data) {
        if let Ok(spec) = spec_from_info(&info) {
            assert!(!spec.parts.is_empty());
        }
    }
    let Ok(pb::DraftResponse {
        msg: Some(pb::draft_response::Msg::Block(b)),
    }) = pb::DraftResponse::decode(data)
    else {
        return;
    };
    let block = DraftBlock::from(b);
    if check_block(&block, GAMMA, VOCAB, true).is_ok() {
        assert!(block.tokens.len() <= GAMMA);
        assert!(block.confidences.iter().all(|c| (0.0..=1.0).contains(c)));
    }
    if check_block(&block, GAMMA, VOCAB, false).is_ok() {
        let probs = block.dists.iter().flat_map(|q| &q.probs);
        assert!(probs.clone().all(|p| (0.0..=1.0).contains(p)), "{probs:?}");
    }
}
