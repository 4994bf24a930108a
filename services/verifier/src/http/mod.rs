//! The verifier's OpenAI-compatible HTTP API, a second front end over the generation core
//! ([`crate::generations`]): `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /v1/models/{id}`, and vLLM's `POST /tokenize` and
//! `POST /detokenize` (tandem-serving adds `GET /health`, bearer tokens and the drain).
//! Requests are admitted and counted like gRPC ones; every answer is counted in
//! `tandem_http_requests_total{endpoint,status}`. Errors are in OpenAI's shape
//! ([`error`]). An optional `x-request-timeout-ms` header is the request's deadline (504
//! when it passes). Bodies above [`MAX_BODY`] are refused (413).

mod chat;
mod choices;
mod completions;
mod error;
mod models;
mod openai;
mod params;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::deadline::answer_within;
use crate::generations::Generations;
use crate::metrics::HttpMetrics;
use error::ApiError;
use params::{Common, Shape};
use stream::Chunks;

/// Largest request body, in bytes.
pub const MAX_BODY: usize = 4 << 20;
/// The header that carries a request's timeout, in milliseconds.
const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Api {
    core: Arc<Generations>,
    model: Arc<str>,
    created: u64,
    metrics: Arc<HttpMetrics>,
}

/// The router of the API over `core`, serving the model as `model`.
pub(crate) fn router(core: Arc<Generations>, model: &str, metrics: Arc<HttpMetrics>) -> Router {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let api = Api {
        core,
        model: model.into(),
        created,
        metrics,
    };
    Router::new()
        .route("/v1/completions", post(completions::handle))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::one))
        .route("/tokenize", post(models::tokenize))
        .route("/detokenize", post(models::detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(from_fn_with_state(api.clone(), count))
        .with_state(api)
}

impl Api {
    /// Refuses a request naming a model this server does not serve (none named: this one).
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != &*self.model => Err(ApiError::model_not_found(m)),
            _ => Ok(()),
        }
    }

    /// What a response is labelled with: a fresh id with `prefix`, the time, the model.
    fn label(&self, prefix: &str) -> Label {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Label {
            id: format!("{prefix}-{:x}{:08x}", now.as_secs(), now.subsec_nanos()),
            created: now.as_secs(),
            model: Arc::clone(&self.model),
        }
    }
}

/// A response's id, creation time and model.
pub(crate) struct Label {
    id: String,
    created: u64,
    model: Arc<str>,
}

/// The deadline the request's timeout header sets (answered a little before it).
fn deadline(headers: &HeaderMap) -> Result<Option<Instant>, ApiError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let ms: u64 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ApiError::invalid(format!("{TIMEOUT_HEADER} must be whole milliseconds")))?;
    Ok(Some(
        Instant::now() + answer_within(Duration::from_millis(ms)),
    ))
}

/// Starts the choices a completions or chat request asks for (`shape` and `common`) and
/// answers them with the writer `make` builds (given the number of choices and whether
/// log-probabilities were asked): streamed as server-sent events, or gathered into one
/// response.
async fn answer<W: Chunks>(
    api: &Api,
    headers: &HeaderMap,
    (shape, common): (Shape, Common),
    make: impl FnOnce(usize, bool) -> W,
) -> Result<Response, ApiError> {
    let logprobs = shape.logprobs.is_some();
    let requests = common.requests(api, shape)?;
    let choices = choices::start(&api.core, requests, deadline(headers)?).await?;
    let writer = make(choices.len(), logprobs);
    if common.stream() {
        return Ok(stream::respond(writer, choices, common.include_usage()));
    }
    let gathered = choices.gather().await?;
    Ok(Json(writer.response(gathered)).into_response())
}

/// Counts every answer by endpoint and status.
async fn count(State(api): State<Api>, req: Request, next: Next) -> Response {
    let endpoint = endpoint(req.uri().path());
    let response = next.run(req).await;
    api.metrics.request(endpoint, response.status().as_u16());
    response
}

/// The bounded `endpoint` label of a path.
fn endpoint(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "completions",
        "/v1/chat/completions" => "chat_completions",
        "/tokenize" => "tokenize",
        "/detokenize" => "detokenize",
        p if p == "/v1/models" || p.starts_with("/v1/models/") => "models",
        _ => "other",
    }
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::no_route(StatusCode::NOT_FOUND, format!("no route {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    let message = format!("{method} is not allowed on {}", uri.path());
    ApiError::no_route(StatusCode::METHOD_NOT_ALLOWED, message)
}
