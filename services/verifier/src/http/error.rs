//! Errors of the HTTP API in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`, and the one mapping from the generation core's gRPC statuses to HTTP
//! statuses. Request bodies are read through [`Body`], so malformed JSON, wrong types,
//! missing fields and oversized bodies answer in that shape too (never axum's plain text).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Code, Status};

/// A refused or failed HTTP request.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<&'static str>,
    message: String,
}

/// The JSON body of an error.
#[derive(Serialize)]
pub(crate) struct ErrorBody<'a> {
    error: ErrorFields<'a>,
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: None,
            param: None,
            message: message.into(),
        }
    }

    /// A 400 `invalid_request_error` about request field `param`.
    pub(crate) fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::invalid(message)
        }
    }

    /// A 404 `model_not_found` for a model this server does not serve.
    pub(crate) fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: Some("model_not_found"),
            param: Some("model"),
            ..Self::invalid(format!("the model `{model}` does not exist"))
        }
    }

    /// A 404 or 405 for a route this API does not have.
    pub(crate) fn no_route(status: StatusCode, message: String) -> Self {
        Self {
            status,
            code: Some(if status == StatusCode::NOT_FOUND {
                "not_found"
            } else {
                "method_not_allowed"
            }),
            ..Self::invalid(message)
        }
    }

    /// The error's JSON body.
    pub(crate) fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorFields {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        }
    }
}

/// The one mapping of the core's statuses to HTTP.
impl From<Status> for ApiError {
    fn from(status: Status) -> Self {
        let (http, kind, code) = match status.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None)
            }
            Code::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error", None),
            Code::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
            Code::ResourceExhausted => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("rate_limit_exceeded"),
            ),
            Code::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("unavailable"),
            ),
            Code::DeadlineExceeded => (
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                Some("deadline_exceeded"),
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                Some("internal_error"),
            ),
        };
        Self {
            status: http,
            kind,
            code,
            param: None,
            message: status.message().to_string(),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        Self {
            status,
            ..Self::invalid(rejection.body_text())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self.status.is_server_error() {
            true => tracing::warn!("HTTP {}: {}", self.status.as_u16(), self.message),
            false => tracing::debug!("HTTP {}: {}", self.status.as_u16(), self.message),
        }
        (self.status, Json(self.body())).into_response()
    }
}

/// A JSON request body whose rejections are [`ApiError`]s.
pub(crate) struct Body<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(Self(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_status_has_its_http_status() {
        for (status, http) in [
            (Status::invalid_argument("x"), 400),
            (Status::not_found("x"), 404),
            (Status::unauthenticated("x"), 401),
            (Status::resource_exhausted("x"), 429),
            (Status::unavailable("x"), 503),
            (Status::deadline_exceeded("x"), 504),
            (Status::internal("x"), 500),
            (Status::aborted("x"), 500),
        ] {
            let code = status.code();
            let e = ApiError::from(status);
            assert_eq!(e.status.as_u16(), http, "{code:?}");
            let body = serde_json::to_value(e.body()).expect("JSON");
            assert_eq!(body["error"]["message"], "x");
            assert!(body["error"]["type"].is_string());
        }
    }
}
