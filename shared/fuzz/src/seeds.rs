//! Seed inputs: small valid examples of what each target decodes, built from the shipped
//! drafter's files, the real model's header and encoded wire messages, so mutations start
//! deep inside each decoder rather than at its first check.

use std::io::{Cursor, Read};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use pb::draft_request::Msg;
use prost::Message;
use tandem_core::{
    DraftBlock, DraftSource, SamplingParams, SnapshotRows, SnapshotSpec, SparseDist,
};
use tandem_proto::codec::{block_to_pb, rows_to_pb, sampling_to_pb};
use tandem_proto::spec::spec_to_pb;
use tandem_proto::v1 as pb;

/// The shipped DSpark drafter's manifest.
pub const SHIPPED_MANIFEST: &str =
    include_str!("../../../drafters/gemma-3-270m-dspark/dspark.json");
const SHIPPED_CALIBRATION: &str =
    include_str!("../../../drafters/gemma-3-270m-dspark/calibration.json");
const SHIPPED_INDEX: &str =
    include_str!("../../../drafters/gemma-3-270m-dspark/model.safetensors.index.json");
const SHIPPED_ROUTER: &str = include_str!("../../../drafters/gemma-3-270m-router/router.json");
/// Bytes of the real GGUF's start kept as a seed (its metadata; the vocabulary is cut).
const REAL_GGUF_PREFIX: u64 = 16 << 10;
const TAPS: [usize; 4] = [5, 11, 17, 18];
const HIDDEN: usize = 640;

fn identity() -> pb::TargetIdentity {
    let m: serde_json::Value = serde_json::from_str(SHIPPED_MANIFEST).unwrap_or_default();
    pb::TargetIdentity {
        architecture: m["target"]["architecture"]
            .as_str()
            .unwrap_or("gemma3")
            .into(),
        embedding_hash: m["target"]["embedding_hash"].as_str().unwrap_or("").into(),
    }
}

fn sampled() -> pb::SamplingParams {
    sampling_to_pb(&SamplingParams {
        temperature: 0.7,
        top_k: Some(40),
        top_p: 0.9,
        seed: 7,
    })
}

/// Requests by text and by ids, greedy and sampled, with stop strings.
pub fn generate_requests() -> Vec<Vec<u8>> {
    let text = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Text(
            "The capital of France is".into(),
        )),
        max_tokens: Some(16),
        stop: vec!["\n".into(), "Paris".into()],
        ..Default::default()
    };
    let ids = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds {
            ids: vec![2, 818, 5279, 529],
        })),
        sampling: Some(sampled()),
        max_gamma: Some(4),
        speculative: Some(true),
        confidence_cuts: Some(false),
        verification: pb::Verification::Block as i32,
        ..Default::default()
    };
    let chat = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Chat(pb::Chat {
            messages: vec![
                pb::ChatMessage {
                    role: "system".into(),
                    content: "Be brief.".into(),
                },
                pb::ChatMessage {
                    role: "user".into(),
                    content: "Name a colour.".into(),
                },
            ],
            add_generation_prompt: Some(true),
        })),
        sampling: Some(pb::SamplingParams {
            min_p: Some(0.05),
            repetition_penalty: Some(1.1),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-0.5),
            ..sampled()
        }),
        max_tokens: Some(12),
        min_tokens: Some(2),
        stop_token_ids: vec![106],
        logprobs: Some(5),
        ..Default::default()
    };
    [text, ids, chat]
        .iter()
        .map(Message::encode_to_vec)
        .collect()
}

/// An Open of the shipped drafter's snapshot, rows in bf16 and f32, a Propose and a Close.
pub fn draft_requests() -> Vec<Vec<u8>> {
    let spec = SnapshotSpec::taps(&TAPS, HIDDEN);
    let open = pb::Open {
        target: Some(identity()),
        sampling: Some(sampled()),
        snapshot: spec_to_pb(&spec),
    };
    let rows = SnapshotRows {
        start: 0,
        width: spec.row_width(),
        data: tandem_testkit::Lcg::new(1).vec(spec.row_width()),
        tokens: vec![2],
    };
    let propose = pb::Propose {
        anchor: 818,
        position: 1,
        gamma: 8,
    };
    [
        Msg::Open(open),
        Msg::Rows(rows_to_pb(&rows, pb::Dtype::Bf16)),
        Msg::Rows(rows_to_pb(&rows, pb::Dtype::F32)),
        Msg::Propose(propose),
        Msg::Close(pb::Close {}),
    ]
    .into_iter()
    .map(|m| pb::DraftRequest { msg: Some(m) }.encode_to_vec())
    .collect()
}

/// A sampled block with its distributions, a greedy one, and the shipped drafter's Info.
pub fn draft_responses() -> Vec<Vec<u8>> {
    let dist = |t: u32| SparseDist {
        ids: vec![t, t + 1, 3],
        probs: vec![0.5, 0.25, 0.25],
    };
    let sampled = DraftBlock {
        tokens: vec![818, 5279],
        confidences: vec![0.9, 0.4],
        dists: vec![dist(818), dist(5279)],
        source: DraftSource::Model,
        calibrated: true,
    };
    let greedy = DraftBlock {
        tokens: vec![1, 2, 3],
        confidences: vec![0.5; 3],
        source: DraftSource::Lookup,
        ..DraftBlock::default()
    };
    let info = pb::DrafterInfo {
        target: Some(identity()),
        taps: TAPS.iter().map(|t| *t as u32).collect(),
        hidden_size: HIDDEN as u32,
        max_gamma: 8,
        kind: "dspark".into(),
        snapshot: spec_to_pb(&SnapshotSpec::taps(&TAPS, HIDDEN)),
        max_message_bytes: 4 << 20,
    };
    let block = |b: &DraftBlock| pb::DraftResponse {
        msg: Some(pb::draft_response::Msg::Block(block_to_pb(b, 0.001))),
    };
    vec![
        block(&sampled).encode_to_vec(),
        block(&greedy).encode_to_vec(),
        info.encode_to_vec(),
    ]
}

/// A tiny Gemma 3 GGUF (every config key, a small vocabulary, one embedding tensor) and the
/// first KiBs of the real one.
pub fn gguf_headers() -> Vec<Vec<u8>> {
    let mut seeds = vec![tiny_gguf().unwrap_or_default()];
    let real = std::fs::File::open(tandem_testkit::real_gguf());
    if let Ok(f) = real {
        let mut prefix = Vec::new();
        if f.take(REAL_GGUF_PREFIX).read_to_end(&mut prefix).is_ok() {
            seeds.push(prefix);
        }
    }
    seeds
}

fn tiny_gguf() -> candle_core::Result<Vec<u8>> {
    let u32s = [
        ("gemma3.embedding_length", 64),
        ("gemma3.attention.key_length", 16),
        ("gemma3.feed_forward_length", 128),
        ("gemma3.block_count", 2),
        ("gemma3.attention.head_count", 4),
        ("gemma3.attention.head_count_kv", 1),
        ("gemma3.attention.sliding_window", 32),
        ("gemma3.context_length", 256),
        ("general.alignment", 32),
        ("tokenizer.ggml.bos_token_id", 2),
    ];
    let mut meta: Vec<(&str, Value)> = u32s.iter().map(|(k, v)| (*k, Value::U32(*v))).collect();
    meta.push(("general.architecture", Value::String("gemma3".into())));
    meta.push(("gemma3.rope.freq_base", Value::F32(1e6)));
    meta.push(("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6)));
    let tokens = (0..16).map(|i| Value::String(format!("t{i}"))).collect();
    meta.push(("tokenizer.ggml.tokens", Value::Array(tokens)));
    let embd = QTensor::quantize(
        &Tensor::zeros((16, 64), DType::F32, &Device::Cpu)?,
        GgmlDType::F32,
    )?;
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut out = Cursor::new(Vec::new());
    gguf_file::write(&mut out, &meta, &[("token_embd.weight", &embd)])?;
    Ok(out.into_inner())
}

/// The HF config.json of the real target's config.
pub fn hf_configs() -> Vec<Vec<u8>> {
    let path = tandem_testkit::real_gguf();
    let cfg = std::fs::File::open(&path)
        .map(std::io::BufReader::new)
        .ok()
        .and_then(|mut f| tandem_gemma::inspect_gguf(&mut f, &path).ok());
    cfg.map(|c| tandem_gemma::hf_config_json(&c).into_bytes())
        .into_iter()
        .collect()
}

/// The shipped manifest, and the same with a draft vocabulary of 64 ids (quicker to mutate).
pub fn dspark_manifests() -> Vec<Vec<u8>> {
    let mut small: serde_json::Value = serde_json::from_str(SHIPPED_MANIFEST).unwrap_or_default();
    if let Some(v) = small["config"]["draft_vocab"].as_array_mut() {
        v.truncate(64);
    }
    if let Some(v) = small["param_names"].as_array_mut() {
        v.truncate(4);
    }
    vec![SHIPPED_MANIFEST.into(), small.to_string().into_bytes()]
}

/// The shipped router, cut to its first 32 ids (quicker to mutate).
pub fn router_manifests() -> Vec<Vec<u8>> {
    let mut small: serde_json::Value = serde_json::from_str(SHIPPED_ROUTER).unwrap_or_default();
    let router = &mut small["router"];
    if let Some(v) = router["ids"].as_array_mut() {
        v.truncate(32);
    }
    if let Some(rows) = router["log_probs"].as_array_mut() {
        (rows.iter_mut().filter_map(|r| r.as_array_mut())).for_each(|r| r.truncate(32));
    }
    small["trained"] = serde_json::Value::Null;
    vec![small.to_string().into_bytes()]
}

/// The shipped calibration.
pub fn calibrations() -> Vec<Vec<u8>> {
    vec![SHIPPED_CALIBRATION.into()]
}

/// The shipped safetensors index.
pub fn safetensors_indexes() -> Vec<Vec<u8>> {
    vec![SHIPPED_INDEX.into()]
}

/// A safetensors file of an f32 matrix and a bf16 vector, built by hand (8-byte header
/// length, JSON header, data).
pub fn safetensors_files() -> Vec<Vec<u8>> {
    let header = r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"__metadata__":{"format":"pt"}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend((0..8u8).flat_map(|i| f32::from(i).to_le_bytes()).take(24));
    out.extend([0x80, 0x3f, 0, 0x40, 0x40, 0x40, 0x80, 0x40]);
    vec![out]
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tandem_core::calibration::Calibration;
    use tandem_engine::check_block;
    use tandem_proto::codec::rows_from_pb;

    use super::*;
    use crate::files::real_dims;
    use crate::wire::{defaults, engine, GAMMA, ROW_WIDTH, VOCAB};

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).expect("utf-8")
    }

    #[test]
    fn the_file_seeds_pass_their_decoders() {
        let gguf = gguf_headers();
        let tiny = tandem_gemma::inspect_gguf(&mut Cursor::new(&gguf[0]), Path::new("t.gguf"))
            .expect("the tiny GGUF reads");
        assert_eq!((tiny.vocab_size, tiny.hidden_size), (16, 64));
        assert_eq!(gguf[1].len() as u64, REAL_GGUF_PREFIX);
        let hf = hf_configs();
        tandem_gemma::GemmaConfig::from_hf_json(text(&hf[0])).expect("config.json");
        for m in dspark_manifests() {
            tandem_dspark::check_manifest(text(&m), real_dims()).expect("manifest");
        }
        Calibration::from_json(text(&calibrations()[0])).expect("calibration");
        let router = tandem_dspark::RouterManifest::parse(text(&router_manifests()[0]));
        assert_eq!(router.expect("router").router.ids.len(), 32);
        let shards = tandem_dspark::index_shards(text(&safetensors_indexes()[0])).expect("index");
        assert_eq!(shards.len(), 3);
        let st = candle_core::safetensors::load_buffer(&safetensors_files()[0], &Device::Cpu);
        assert_eq!(st.expect("safetensors").len(), 2);
    }

    #[test]
    fn the_wire_seeds_pass_their_decoders() {
        let engine = engine();
        for bytes in generate_requests() {
            let r = pb::GenerateRequest::decode(bytes.as_slice()).expect("decodes");
            let req = tandem_verifier::generation_request(r, &defaults(), engine.tokenizer())
                .expect("converts");
            engine.plan(req, GAMMA).expect("plans");
        }
        let rows = draft_requests()
            .iter()
            .filter_map(|b| match pb::DraftRequest::decode(b.as_slice()).ok()?.msg {
                Some(Msg::Rows(r)) => Some(rows_from_pb(&r, ROW_WIDTH).expect("rows")),
                _ => None,
            })
            .count();
        assert_eq!(rows, 2);
        let block = pb::DraftResponse::decode(draft_responses()[0].as_slice()).expect("decodes");
        let Some(pb::draft_response::Msg::Block(b)) = block.msg else {
            panic!("a block")
        };
        check_block(&DraftBlock::from(b), GAMMA, VOCAB, false).expect("a valid sampled block");
    }
}
