//! Conversions between the wire types and tandem's core types, including the snapshot
//! codec: context rows travel as little-endian bf16 (default), f16 or f32 bytes with an
//! explicit `[rows, width]` shape, and every decoded message is checked (dtype, shape, byte
//! length, finite values) before it reaches a model.

use half::{bf16, f16};
use tandem_core::{
    DraftBlock, DraftSource, FinishReason, Penalties, SamplingParams, SnapshotRows, SparseDist,
    TargetIdentity, TokenLogprob, Verification,
};

use crate::v1 as pb;

/// A wire message that cannot be turned into a core value. The message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError(msg.into()))
}

/// Sampling parameters with defaults for unset fields (greedy, no top-k, top-p 1, seed 0).
/// Ranges are checked by [`SamplingParams::validate`], not here.
pub fn sampling_from_pb(p: Option<&pb::SamplingParams>) -> SamplingParams {
    let d = SamplingParams::default();
    match p {
        None => d,
        Some(p) => SamplingParams {
            temperature: p.temperature.unwrap_or(d.temperature),
            top_k: p.top_k.map(|k| k as usize),
            top_p: p.top_p.unwrap_or(d.top_p),
            seed: p.seed.unwrap_or(d.seed),
        },
    }
}

/// The wire form of sampling parameters (every field set).
pub fn sampling_to_pb(s: &SamplingParams) -> pb::SamplingParams {
    pb::SamplingParams {
        temperature: Some(s.temperature),
        top_k: s.top_k.map(|k| k.min(u32::MAX as usize) as u32),
        top_p: Some(s.top_p),
        seed: Some(s.seed),
        ..pb::SamplingParams::default()
    }
}

/// The penalties of wire sampling parameters (unset fields: off).
pub fn penalties_from_pb(p: Option<&pb::SamplingParams>) -> Penalties {
    let d = Penalties::default();
    p.map_or(d, |p| Penalties {
        repetition: p.repetition_penalty.unwrap_or(d.repetition),
        presence: p.presence_penalty.unwrap_or(d.presence),
        frequency: p.frequency_penalty.unwrap_or(d.frequency),
    })
}

impl From<&TokenLogprob> for pb::TokenLogprob {
    fn from(t: &TokenLogprob) -> Self {
        Self {
            logprob: t.logprob,
            top_ids: t.top.iter().map(|x| x.0).collect(),
            top_logprobs: t.top.iter().map(|x| x.1).collect(),
        }
    }
}

impl From<&SparseDist> for pb::SparseDist {
    fn from(d: &SparseDist) -> Self {
        Self {
            ids: d.ids.clone(),
            probs: d.probs.clone(),
        }
    }
}

impl From<pb::SparseDist> for SparseDist {
    fn from(d: pb::SparseDist) -> Self {
        Self {
            ids: d.ids,
            probs: d.probs,
        }
    }
}

/// A drafted block on the wire, with the drafter's compute time.
pub fn block_to_pb(b: &DraftBlock, compute_seconds: f64) -> pb::Block {
    pb::Block {
        tokens: b.tokens.clone(),
        confidences: b.confidences.clone(),
        dists: b.dists.iter().map(pb::SparseDist::from).collect(),
        compute_seconds,
        source: match b.source {
            DraftSource::Model => pb::DraftSource::Model,
            DraftSource::Lookup => pb::DraftSource::Lookup,
        } as i32,
        calibrated: b.calibrated,
    }
}

impl From<pb::Block> for DraftBlock {
    fn from(b: pb::Block) -> Self {
        let source = match b.source() {
            pb::DraftSource::Lookup => DraftSource::Lookup,
            pb::DraftSource::Model | pb::DraftSource::Unspecified => DraftSource::Model,
        };
        Self {
            tokens: b.tokens,
            confidences: b.confidences,
            dists: b.dists.into_iter().map(SparseDist::from).collect(),
            source,
            calibrated: b.calibrated,
        }
    }
}

impl From<TargetIdentity> for pb::TargetIdentity {
    fn from(t: TargetIdentity) -> Self {
        Self {
            architecture: t.architecture,
            embedding_hash: t.embedding_hash,
        }
    }
}

impl From<pb::TargetIdentity> for TargetIdentity {
    fn from(t: pb::TargetIdentity) -> Self {
        Self {
            architecture: t.architecture,
            embedding_hash: t.embedding_hash,
        }
    }
}

impl From<Verification> for pb::Verification {
    fn from(v: Verification) -> Self {
        match v {
            Verification::Token => Self::Token,
            Verification::Block => Self::Block,
            Verification::Seeded => Self::Seeded,
        }
    }
}

/// The rule a request asks for, `default` when it leaves it unspecified.
pub fn verification_from_pb(v: pb::Verification, default: Verification) -> Verification {
    match v {
        pb::Verification::Token => Verification::Token,
        pb::Verification::Block => Verification::Block,
        pb::Verification::Seeded => Verification::Seeded,
        pb::Verification::Unspecified => default,
    }
}

impl From<FinishReason> for pb::FinishReason {
    fn from(r: FinishReason) -> Self {
        match r {
            FinishReason::Length => Self::Length,
            FinishReason::Eos => Self::Eos,
            FinishReason::Stop => Self::Stop,
            FinishReason::Cancelled => Self::Cancelled,
            FinishReason::Error => Self::Error,
        }
    }
}

/// Encodes snapshot rows for the wire.
pub fn rows_to_pb(rows: &SnapshotRows, dtype: pb::Dtype) -> pb::ContextRows {
    let data: Vec<u8> = match dtype {
        pb::Dtype::F32 => rows.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        pb::Dtype::F16 => rows
            .data
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        pb::Dtype::Bf16 | pb::Dtype::Unspecified => rows
            .data
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
    };
    let dtype = match dtype {
        pb::Dtype::Unspecified => pb::Dtype::Bf16,
        d => d,
    };
    pb::ContextRows {
        start: rows.start as u64,
        dtype: dtype as i32,
        shape: vec![rows.rows() as u32, rows.width as u32],
        data,
        tokens: rows.tokens.clone(),
    }
}

/// What a drafter accepts in one request message unless configured otherwise, and what a
/// verifier assumes of a drafter whose Info declares no limit (gRPC's default).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The largest request message the drafter of `info` accepts.
pub fn message_limit(info: &pb::DrafterInfo) -> usize {
    match info.max_message_bytes {
        0 => DEFAULT_MAX_MESSAGE_BYTES,
        n => n as usize,
    }
}

/// Most bytes a token takes in a message (a `u32` as a varint).
const TOKEN_BYTES: usize = 5;

/// `msg`'s rows in consecutive messages whose data and tokens stay within `max_data_bytes`
/// (each token counted at its largest, [`TOKEN_BYTES`]; at least one row a message, however
/// wide), for peers that refuse large messages. `msg` must be what [`rows_to_pb`] made.
pub fn chunk_rows(
    msg: &pb::ContextRows,
    max_data_bytes: usize,
) -> impl Iterator<Item = pb::ContextRows> + '_ {
    let rows = msg.shape.first().map_or(0, |r| *r as usize);
    let row_bytes = msg.data.len().checked_div(rows).unwrap_or(0).max(1);
    let token_bytes = if msg.tokens.is_empty() {
        0
    } else {
        TOKEN_BYTES
    };
    let per_chunk = (max_data_bytes / (row_bytes + token_bytes)).max(1);
    msg.data
        .chunks(per_chunk * row_bytes)
        .enumerate()
        .map(move |(i, data)| {
            let (first, n) = (i * per_chunk, data.len() / row_bytes);
            pb::ContextRows {
                start: msg.start + first as u64,
                dtype: msg.dtype,
                shape: vec![n as u32, msg.shape[1]],
                data: data.to_vec(),
                tokens: msg
                    .tokens
                    .get(first..first + n)
                    .map_or_else(Vec::new, <[u32]>::to_vec),
            }
        })
}

/// Decodes and checks snapshot rows: the shape must be `[rows, expected_width]`, the bytes
/// exactly `rows × width × dtype size`, every value finite, and tokens none or one per row.
pub fn rows_from_pb(
    msg: &pb::ContextRows,
    expected_width: usize,
) -> Result<SnapshotRows, DecodeError> {
    let dtype = pb::Dtype::try_from(msg.dtype)
        .map_err(|_| DecodeError(format!("unknown dtype {}", msg.dtype)))?;
    let size = match dtype {
        pb::Dtype::Bf16 | pb::Dtype::F16 => 2,
        pb::Dtype::F32 => 4,
        pb::Dtype::Unspecified => return bad("context rows need a dtype"),
    };
    let [rows, width] = msg.shape[..] else {
        return bad(format!(
            "context rows need a [rows, width] shape, got {:?}",
            msg.shape
        ));
    };
    let (rows, width) = (rows as usize, width as usize);
    if width != expected_width {
        return bad(format!(
            "context rows are {width} wide, this drafter needs {expected_width}"
        ));
    }
    let expected = rows * width * size;
    if msg.data.len() != expected {
        return bad(format!(
            "context rows of shape [{rows}, {width}] in {} need {expected} bytes, got {}",
            dtype.as_str_name(),
            msg.data.len()
        ));
    }
    let data: Vec<f32> = match dtype {
        pb::Dtype::F32 => msg
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        pb::Dtype::F16 => msg
            .data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => msg
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    };
    if data.iter().any(|x| !x.is_finite()) {
        return bad("context rows contain a non-finite value");
    }
    if !msg.tokens.is_empty() && msg.tokens.len() != rows {
        return bad(format!(
            "context rows carry {} tokens for {rows} rows",
            msg.tokens.len()
        ));
    }
    Ok(SnapshotRows {
        start: msg.start as usize,
        width,
        data,
        tokens: msg.tokens.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> SnapshotRows {
        SnapshotRows {
            start: 3,
            width: 4,
            data: vec![1.0, -2.5, 0.125, 3.0, 1e-3, 7.0, -0.0, 65504.0],
            tokens: vec![7, 262_143],
        }
    }

    #[test]
    fn a_target_identity_round_trips() {
        let t = TargetIdentity {
            architecture: "gemma3".into(),
            embedding_hash: "ab".repeat(32),
        };
        let wire = pb::TargetIdentity::from(t.clone());
        assert_eq!(
            (wire.architecture.as_str(), wire.embedding_hash.as_str()),
            ("gemma3", t.embedding_hash.as_str())
        );
        assert_eq!(TargetIdentity::from(wire), t);
    }

    #[test]
    fn rows_round_trip_in_every_dtype() {
        for dtype in [pb::Dtype::F32, pb::Dtype::F16, pb::Dtype::Bf16] {
            let msg = rows_to_pb(&rows(), dtype);
            assert_eq!(msg.shape, vec![2, 4]);
            let back = rows_from_pb(&msg, 4).expect("decodes");
            assert_eq!(back.start, 3);
            assert_eq!(back.tokens, [7, 262_143]);
            for (a, b) in back.data.iter().zip(&rows().data) {
                assert!((a - b).abs() <= b.abs() * 4e-3 + 1e-6, "{dtype:?} {a} {b}");
            }
        }
        assert_eq!(
            rows_from_pb(&rows_to_pb(&rows(), pb::Dtype::F32), 4).expect("ok"),
            rows()
        );
    }

    #[test]
    fn malformed_rows_are_refused() {
        let good = rows_to_pb(&rows(), pb::Dtype::Bf16);
        let mut short = good.clone();
        short.data.truncate(5);
        let mut shape = good.clone();
        shape.shape = vec![8];
        let mut dtype = good.clone();
        dtype.dtype = 0;
        let mut unknown = good.clone();
        unknown.dtype = 42;
        let mut nan = rows();
        nan.data[0] = f32::NAN;
        let mut tokens = good.clone();
        tokens.tokens.pop();
        for (m, w, needle) in [
            (short, 4, "need 16 bytes"),
            (shape, 4, "shape"),
            (dtype, 4, "dtype"),
            (unknown, 4, "dtype"),
            (good, 5, "wide"),
            (rows_to_pb(&nan, pb::Dtype::F32), 4, "non-finite"),
            (tokens, 4, "1 tokens for 2 rows"),
        ] {
            let e = rows_from_pb(&m, w).expect_err("refused");
            assert!(e.0.contains(needle), "{e}");
        }
    }

    #[test]
    fn chunks_carry_every_row_in_order_within_the_limit() {
        let rows = SnapshotRows {
            start: 5,
            width: 3,
            data: (0..30).map(|x| x as f32).collect(),
            tokens: (100..110).collect(),
        };
        let msg = rows_to_pb(&rows, pb::Dtype::F32);
        // A row: 12 bytes of data and up to 5 of its token.
        for (limit, expected) in [(1 << 20, 1), (51, 4), (34, 5), (1, 10), (17 * 7, 2)] {
            let chunks: Vec<_> = chunk_rows(&msg, limit).collect();
            assert_eq!(chunks.len(), expected, "limit {limit}");
            let mut next = 5;
            let (mut data, mut tokens) = (Vec::new(), Vec::new());
            for c in &chunks {
                let rows = c.tokens.len();
                assert!(c.data.len() + 5 * rows <= limit.max(17), "limit {limit}");
                let back = rows_from_pb(c, 3).expect("each chunk decodes");
                assert_eq!(back.start, next);
                next += back.rows();
                data.extend(back.data);
                tokens.extend(back.tokens);
            }
            assert_eq!(data, rows.data, "limit {limit}");
            assert_eq!(tokens, rows.tokens, "limit {limit}");
        }
    }

    /// Rows of the widest tokens chunked at a budget: every message's data and tokens, as
    /// encoded, stay within it plus the fixed fields' few bytes.
    #[test]
    fn chunks_of_rows_with_their_tokens_stay_within_the_budget() {
        let rows = SnapshotRows {
            start: 0,
            width: 2,
            data: vec![0.5; 2 * 1000],
            tokens: vec![u32::MAX - 7; 1000],
        };
        let msg = rows_to_pb(&rows, pb::Dtype::F32);
        let budget = 4096;
        for c in chunk_rows(&msg, budget) {
            let bytes = prost::Message::encoded_len(&c);
            assert!(bytes <= budget + 32, "{bytes} bytes");
        }
    }

    #[test]
    fn sampling_defaults_fill_unset_fields() {
        let s = sampling_from_pb(Some(&pb::SamplingParams {
            temperature: Some(0.7),
            ..Default::default()
        }));
        assert_eq!(
            s,
            SamplingParams {
                temperature: 0.7,
                ..Default::default()
            }
        );
        let full = SamplingParams {
            temperature: 0.5,
            top_k: Some(3),
            top_p: 0.9,
            seed: 4,
        };
        assert_eq!(sampling_from_pb(Some(&sampling_to_pb(&full))), full);
        assert_eq!(sampling_from_pb(None), SamplingParams::default());
    }
}
