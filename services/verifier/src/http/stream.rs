//! Streamed answers as server-sent events, OpenAI's way: one `data:` JSON chunk per piece
//! of a choice (a chat choice opens with the assistant's role), a chunk with each choice's
//! finish reason, a usage chunk (no choices) when `stream_options.include_usage`, then
//! `data: [DONE]`. A stream a server error ends gets `data: {"error": {…}}` and closes
//! without `[DONE]`. The events are written by a task reading the choices; when the client
//! goes away the task ends and the generations with it.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tandem_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::choices::{Choices, Gathered};
use super::error::ApiError;
use super::openai::{finish_reason, Usage};

/// Events buffered between the task and the connection.
const EVENT_BUFFER: usize = 16;

/// How one endpoint writes its answer (as JSON values): one response of its gathered
/// choices, or chunks when streamed.
pub(crate) trait Chunks: Send + 'static {
    /// The whole response of the gathered choices.
    fn response(&self, gathered: Vec<Gathered>) -> serde_json::Value;
    /// The chunk that opens choice `index`, if the endpoint has one.
    fn opening(&mut self, index: u32) -> Option<serde_json::Value>;
    /// The chunk of one piece of choice `index`.
    fn delta(&mut self, index: u32, msg: &pb::GenerateResponse) -> serde_json::Value;
    /// The chunk of choice `index`'s finish.
    fn finish(&mut self, index: u32, reason: &'static str) -> serde_json::Value;
    /// The last chunk, with the usage of every choice.
    fn usage(&mut self, usage: Usage) -> serde_json::Value;
}

/// A JSON value of anything serializable (`null` if it cannot be, which tandem's types
/// never are).
pub(crate) fn json(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// The streamed answer of `choices`.
pub(crate) fn respond(chunks: impl Chunks, choices: Choices, include_usage: bool) -> Response {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    tokio::spawn(pump(chunks, choices, include_usage, Sender(tx)));
    let events = ReceiverStream::new(rx).map(Ok::<Event, Infallible>);
    Sse::new(events).into_response()
}

/// The sending side; false once the client went away.
struct Sender(mpsc::Sender<Event>);

impl Sender {
    async fn json(&self, value: serde_json::Value) -> bool {
        self.0
            .send(Event::default().data(value.to_string()))
            .await
            .is_ok()
    }
}

/// Writes the events of `choices` until they all finished or one failed.
async fn pump(mut chunks: impl Chunks, mut choices: Choices, include_usage: bool, tx: Sender) {
    let mut opened = vec![false; choices.len()];
    let (mut usage, mut done) = (Usage::default(), 0);
    while done < choices.len() {
        let Some((i, item)) = choices.next().await else {
            break;
        };
        let msg = match item {
            Ok(msg) => msg,
            Err(status) => {
                let error = ApiError::from(status);
                tracing::warn!("a streamed answer ended with an error: {error:?}");
                tx.json(json(&error.body())).await;
                return;
            }
        };
        if let Some(first) = opened.get_mut(i as usize).filter(|o| !**o) {
            *first = true;
            if let Some(value) = chunks.opening(i) {
                if !tx.json(value).await {
                    return;
                }
            }
        }
        if (!msg.text.is_empty() || !msg.token_ids.is_empty())
            && !tx.json(chunks.delta(i, &msg)).await
        {
            return;
        }
        if let Some(f) = &msg.finished {
            usage.add(f);
            done += 1;
            if !tx.json(chunks.finish(i, finish_reason(f))).await {
                return;
            }
        }
    }
    if done < choices.len() {
        let error = ApiError::from(tonic::Status::unavailable(
            "a generation ended without a finish",
        ));
        tx.json(json(&error.body())).await;
        return;
    }
    if include_usage && !tx.json(chunks.usage(usage)).await {
        return;
    }
    let _ = tx.0.send(Event::default().data("[DONE]")).await;
}
