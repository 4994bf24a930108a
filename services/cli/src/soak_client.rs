//! The clients of `tandem bench soak`: what one request does for each behaviour (normal
//! generations, cancellations, slow and stalled readers, bad requests, short deadlines) and
//! how its ending is classified; anything the behaviour does not explain is an unexpected
//! error, named by its gRPC code.

use std::time::Duration;

use pb::generation_client::GenerationClient;
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;
use tandem_proto::v1 as pb;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

/// What one soak request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Behaviour {
    /// A greedy speculative generation read to its end; its tokens must equal the plain run.
    Greedy,
    /// A sampled speculative generation read to its end.
    Sampled,
    /// A generation dropped after a few chunks.
    Cancel,
    /// A generation read slowly through a tiny HTTP/2 window; it must still finish.
    SlowReader,
    /// A generation whose reader stops; the server must drop it (ABORTED).
    Stall,
    /// A malformed request; it must be refused with INVALID_ARGUMENT.
    BadRequest,
    /// A generation with a short `grpc-timeout`; it may end with DEADLINE_EXCEEDED.
    Deadline,
}

/// Every behaviour with its weight in the random draw.
pub const BEHAVIOURS: [(Behaviour, u32); 7] = [
    (Behaviour::Greedy, 30),
    (Behaviour::Sampled, 15),
    (Behaviour::Cancel, 15),
    (Behaviour::SlowReader, 7),
    (Behaviour::Stall, 8),
    (Behaviour::BadRequest, 15),
    (Behaviour::Deadline, 10),
];

impl Behaviour {
    /// A behaviour drawn by weight.
    pub fn draw(rng: &mut StdRng) -> Self {
        let total: u32 = BEHAVIOURS.iter().map(|(_, w)| w).sum();
        let mut x = rng.random_range(0..total);
        for (b, w) in BEHAVIOURS {
            if x < w {
                return b;
            }
            x -= w;
        }
        unreachable!("the draw is below the total weight")
    }

    /// Whether the request must end with a finish message (a lost generation otherwise).
    pub fn must_finish(self) -> bool {
        matches!(self, Self::Greedy | Self::Sampled | Self::SlowReader)
    }
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Finished (length or EOS).
    Finished,
    /// Greedy output that differs from the plain run of the same prompt.
    Mismatch,
    /// Dropped by the test after a few chunks.
    Cancelled,
    /// Dropped by the server as a slow client (expected of a stall).
    SlowDropped,
    /// Refused as malformed (expected of a bad request).
    Refused,
    /// Ended by its deadline (expected of a short deadline).
    DeadlineHit,
    /// A stream that ended without a finish message, or with another reason.
    NoFinish,
    /// An error the behaviour does not explain, by its gRPC code's name.
    Unexpected(String),
}

impl Outcome {
    /// Its name in reports.
    pub fn name(&self) -> String {
        match self {
            Self::Finished => "finished".into(),
            Self::Mismatch => "greedy_mismatch".into(),
            Self::Cancelled => "cancelled_by_test".into(),
            Self::SlowDropped => "slow_dropped".into(),
            Self::Refused => "bad_request_refused".into(),
            Self::DeadlineHit => "deadline".into(),
            Self::NoFinish => "no_finish".into(),
            Self::Unexpected(code) => format!("unexpected_{code}").to_lowercase(),
        }
    }
}

/// What every client of one soak shares.
pub struct Clients {
    /// The verifier's gRPC address.
    pub url: String,
    /// The prompts.
    pub prompts: Vec<String>,
    /// Each prompt's plain greedy tokens (`max_tokens` of them, EOS ignored).
    pub plain: Vec<Vec<u32>>,
    /// Tokens per normal generation.
    pub max_tokens: u32,
    /// The target's vocabulary size and context.
    pub vocab: u32,
    /// The longest prompt plus generation the verifier accepts.
    pub max_context: u32,
    /// How long the verifier waits for a reader before dropping it.
    pub slow_client: Duration,
}

/// Tokens a stalled reader asks for: more than the window and the server's buffers hold.
const STALL_TOKENS: u32 = 160;
/// The HTTP/2 windows (bytes) of slow and stalled readers.
const TINY_WINDOW: u32 = 64;

/// Streamed tokens and the finish message (if one came).
type Read = (Vec<u32>, Option<pb::Finished>);

impl Clients {
    /// A greedy (`temperature` None) or sampled request for prompt `p`, EOS ignored.
    pub fn request(&self, p: usize, tokens: u32, speculative: bool) -> pb::GenerateRequest {
        pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Text(self.prompts[p].clone())),
            max_tokens: Some(tokens),
            ignore_eos: true,
            speculative: Some(speculative),
            ..Default::default()
        }
    }

    /// Runs one request of behaviour `b` on `channel`.
    pub async fn run(&self, channel: &Channel, b: Behaviour, rng: &mut StdRng) -> Outcome {
        let p = rng.random_range(0..self.prompts.len());
        let mut client = GenerationClient::new(channel.clone());
        match b {
            Behaviour::Greedy => {
                let ended = read_all(&mut client, self.request(p, self.max_tokens, true)).await;
                match ended {
                    Ok((ids, Some(f))) if finished(&f) && ids != self.plain[p] => Outcome::Mismatch,
                    other => normal(other),
                }
            }
            Behaviour::Sampled => {
                let mut req = self.request(p, self.max_tokens, true);
                req.ignore_eos = false;
                req.sampling = Some(pb::SamplingParams {
                    temperature: Some(0.8),
                    top_p: Some(0.95),
                    seed: Some(rng.random()),
                    ..Default::default()
                });
                normal(read_all(&mut client, req).await)
            }
            Behaviour::Cancel => {
                let chunks = rng.random_range(1..=3);
                self.cancel(&mut client, p, chunks).await
            }
            Behaviour::SlowReader => self.slow(p, rng.random_range(20..=60)).await,
            Behaviour::Stall => self.stall(p).await,
            Behaviour::BadRequest => self.bad(&mut client, rng.random_range(0..5)).await,
            Behaviour::Deadline => {
                let mut req = tonic::Request::new(self.request(p, self.max_tokens, true));
                req.set_timeout(Duration::from_millis(rng.random_range(50..=600)));
                match read_all(&mut client, req).await {
                    Err(s) if deadline(&s) => Outcome::DeadlineHit,
                    other => normal(other),
                }
            }
        }
    }

    /// Reads `chunks` chunks, then drops the stream.
    async fn cancel(
        &self,
        client: &mut GenerationClient<Channel>,
        p: usize,
        chunks: usize,
    ) -> Outcome {
        let mut stream = match client
            .generate(self.request(p, self.max_tokens, true))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(s) => return unexpected(s.code()),
        };
        for _ in 0..chunks {
            match stream.message().await {
                Ok(Some(m)) if m.finished.is_some() => {
                    return normal(Ok((m.token_ids, m.finished)))
                }
                Ok(Some(_)) => {}
                Ok(None) => return Outcome::NoFinish,
                Err(s) => return unexpected(s.code()),
            }
        }
        Outcome::Cancelled
    }

    /// Reads every chunk through a tiny window, `pause_ms` apart (well within the server's
    /// patience).
    async fn slow(&self, p: usize, pause_ms: u64) -> Outcome {
        let mut client = match tiny_window_client(&self.url).await {
            Ok(c) => c,
            Err(s) => return unexpected(s.code()),
        };
        let read = async {
            let mut stream = client
                .generate(self.request(p, self.max_tokens, true))
                .await?
                .into_inner();
            let mut last = None;
            while let Some(m) = stream.message().await? {
                last = m.finished.or(last);
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            }
            Ok((Vec::new(), last))
        };
        normal(read.await)
    }

    /// Reads one chunk, then nothing for [`stall_pause`]; the server must have dropped the
    /// generation (ABORTED) by the time reading resumes, unless it finished first.
    async fn stall(&self, p: usize) -> Outcome {
        let mut client = match tiny_window_client(&self.url).await {
            Ok(c) => c,
            Err(s) => return unexpected(s.code()),
        };
        let read = async {
            let req = self.request(p, STALL_TOKENS, true);
            let mut stream = client.generate(req).await?.into_inner();
            stream.message().await?;
            tokio::time::sleep(stall_pause(self.slow_client)).await;
            drain(&mut stream).await
        };
        match read.await {
            Err(s) if s.code() == Code::Aborted => Outcome::SlowDropped,
            other => normal(other),
        }
    }

    /// Sends malformed request `kind`; INVALID_ARGUMENT is the one right answer.
    async fn bad(&self, client: &mut GenerationClient<Channel>, kind: u32) -> Outcome {
        let mut req = self.request(0, self.max_tokens, true);
        let prompt = |ids: Vec<u32>| pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids });
        match kind {
            0 => req.prompt = Some(pb::generate_request::Prompt::Text(String::new())),
            1 => req.prompt = None,
            2 => req.prompt = Some(prompt(vec![2, self.vocab + 7])),
            3 => req.max_tokens = Some(self.max_context + 1),
            _ => {}
        }
        let mut req = tonic::Request::new(req);
        if kind >= 4 {
            let soon = tonic::metadata::MetadataValue::from_static("soon");
            req.metadata_mut().insert("grpc-timeout", soon);
        }
        match read_all(client, req).await {
            Err(s) if s.code() == Code::InvalidArgument => Outcome::Refused,
            Err(s) => unexpected(s.code()),
            Ok(_) => unexpected(Code::Ok),
        }
    }
}

/// How long a stalled reader reads nothing: long enough for a generation slowed by the load
/// to fill the window and the server's buffers, then for the server's patience to run out.
fn stall_pause(patience: Duration) -> Duration {
    patience * 3 + Duration::from_secs(6)
}

/// A client on its own connection whose HTTP/2 windows are tiny, so the server can send
/// only a few chunks ahead of what it reads.
async fn tiny_window_client(url: &str) -> Result<GenerationClient<Channel>, Status> {
    let channel = Endpoint::from_shared(url.to_string())
        .map_err(|e| Status::internal(e.to_string()))?
        .initial_stream_window_size(TINY_WINDOW)
        .initial_connection_window_size(TINY_WINDOW)
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(GenerationClient::new(channel))
}

/// Sends `req` and reads its stream to the end.
async fn read_all(
    client: &mut GenerationClient<Channel>,
    req: impl tonic::IntoRequest<pb::GenerateRequest>,
) -> Result<Read, Status> {
    let mut stream = client.generate(req).await?.into_inner();
    drain(&mut stream).await
}

/// The rest of `stream`: its tokens and finish message.
async fn drain(stream: &mut Streaming<pb::GenerateResponse>) -> Result<Read, Status> {
    let (mut ids, mut last) = (Vec::new(), None);
    while let Some(m) = stream.message().await? {
        ids.extend(m.token_ids);
        last = m.finished.or(last);
    }
    Ok((ids, last))
}

/// Whether `f` ended a generation normally (its length or EOS).
fn finished(f: &pb::Finished) -> bool {
    let reason = pb::FinishReason::try_from(f.reason);
    matches!(reason, Ok(pb::FinishReason::Length | pb::FinishReason::Eos))
}

/// Whether `s` is the end of a request by its deadline: the server's DEADLINE_EXCEEDED, or
/// the client's own timer (tonic reports it as CANCELLED, "Timeout expired").
fn deadline(s: &Status) -> bool {
    s.code() == Code::DeadlineExceeded
        || (s.code() == Code::Cancelled && s.message().contains("Timeout expired"))
}

/// How a request that should have finished ended.
fn normal(ended: Result<Read, Status>) -> Outcome {
    match ended {
        Ok((_, Some(f))) if finished(&f) => Outcome::Finished,
        Ok(_) => Outcome::NoFinish,
        Err(s) => unexpected(s.code()),
    }
}

/// An error the behaviour does not explain.
fn unexpected(code: Code) -> Outcome {
    Outcome::Unexpected(format!("{code:?}"))
}
