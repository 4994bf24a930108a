//! `GET /v1/models`, `GET /v1/models/{id}` (the one served model) and vLLM's
//! `POST /tokenize` (`{prompt, add_special_tokens?}` → `{tokens, count, max_model_len}`)
//! and `POST /detokenize` (`{tokens}` → `{prompt}`).

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use tandem_proto::v1 as pb;
use tonic::Status;

use super::error::{ApiError, Body};
use super::Api;

/// One model.
#[derive(Serialize)]
pub(crate) struct Model {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

/// The list of models.
#[derive(Serialize)]
pub(crate) struct Models {
    object: &'static str,
    data: Vec<Model>,
}

impl Api {
    fn model(&self) -> Model {
        Model {
            id: self.model.to_string(),
            object: "model",
            created: self.created,
            owned_by: "tandem",
        }
    }
}

/// `GET /v1/models`.
pub(crate) async fn list(State(api): State<Api>) -> Json<Models> {
    Json(Models {
        object: "list",
        data: vec![api.model()],
    })
}

/// `GET /v1/models/{id}`.
pub(crate) async fn one(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<Model>, ApiError> {
    api.check_model(Some(&id))?;
    Ok(Json(api.model()))
}

/// `POST /tokenize`'s body.
#[derive(Deserialize)]
pub(crate) struct TokenizeRequest {
    model: Option<String>,
    prompt: String,
    add_special_tokens: Option<bool>,
}

/// `POST /tokenize`'s answer.
#[derive(Serialize)]
pub(crate) struct Tokenized {
    tokens: Vec<u32>,
    count: usize,
    max_model_len: u32,
}

/// `POST /tokenize`.
pub(crate) async fn tokenize(
    State(api): State<Api>,
    Body(r): Body<TokenizeRequest>,
) -> Result<Json<Tokenized>, ApiError> {
    api.check_model(r.model.as_deref())?;
    let req = pb::TokenizeRequest {
        text: r.prompt,
        add_special_tokens: r.add_special_tokens,
    };
    let ids = api.core.tokenize(&req).map_err(Status::from)?.ids;
    Ok(Json(Tokenized {
        count: ids.len(),
        tokens: ids,
        max_model_len: api.core.model_info().max_context,
    }))
}

/// `POST /detokenize`'s body.
#[derive(Deserialize)]
pub(crate) struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

/// `POST /detokenize`'s answer.
#[derive(Serialize)]
pub(crate) struct Detokenized {
    prompt: String,
}

/// `POST /detokenize`.
pub(crate) async fn detokenize(
    State(api): State<Api>,
    Body(r): Body<DetokenizeRequest>,
) -> Result<Json<Detokenized>, ApiError> {
    api.check_model(r.model.as_deref())?;
    let req = pb::DetokenizeRequest {
        ids: r.tokens,
        skip_special_tokens: false,
    };
    let text = api.core.detokenize(&req).map_err(Status::from)?.text;
    Ok(Json(Detokenized { prompt: text }))
}
