//! A service's optional HTTP API (the verifier's OpenAI-compatible one) beside its gRPC
//! listener, with the same TLS ([`crate::http_tls`]): the app's router plus `GET /health` (200 once warmed up, 503 before and while
//! draining), behind the same bearer tokens as gRPC (a refusal is a 401 in OpenAI's error
//! shape, counted in `tandem_auth_failures_total`; `/health` stays open for probes).
//! During a drain the router keeps answering (the service refuses new work with 503 and
//! running requests finish); it stops with the gRPC server, closing connections still
//! open [`crate::LINGER`] later.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{from_fn, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::{Listener, ListenerExt};
use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use tandem_telemetry::Registry;

use crate::auth::Auth;
use crate::http_tls::TlsListener;
use crate::{Security, ServeError};

/// The path that needs no token: probes carry none.
const HEALTH: &str = "/health";

/// Whether the server reports SERVING (warmed up and not draining).
#[derive(Clone, Default)]
pub(crate) struct Ready(Arc<AtomicBool>);

impl Ready {
    /// Records whether the server serves.
    pub(crate) fn set(&self, serving: bool) {
        self.0.store(serving, Ordering::SeqCst);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// An error body in OpenAI's shape.
pub(crate) fn error_body(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "error": { "message": message, "type": kind, "param": null, "code": code }
    });
    (status, axum::Json(body)).into_response()
}

/// Serves the app's HTTP router on its listener, secured as `security` says, until `stop`
/// resolves; nothing without a listener; refused for an app without a router.
pub(crate) fn start(
    (listener, router): (Option<TcpListener>, Option<Router>),
    security: &Security,
    registry: &Registry,
    ready: Ready,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Option<JoinHandle<std::io::Result<()>>>, ServeError> {
    let (listener, router) = match (listener, router) {
        (Some(listener), Some(router)) => (listener, router),
        (Some(_), None) => return Err("this service has no HTTP API".into()),
        (None, _) => return Ok(None),
    };
    let app = routes(router, Auth::new(security.tokens.clone(), registry), ready);
    let task = match &security.tls {
        Some(tls) => {
            let listener = TlsListener::new(listener, Arc::clone(&tls.http));
            tokio::spawn(serve(listener, app, stop))
        }
        None => {
            let listener = listener.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY on an HTTP connection: {e}");
                }
            });
            tokio::spawn(serve(listener, app, stop))
        }
    };
    Ok(Some(task))
}

async fn serve<L>(
    listener: L,
    app: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: std::fmt::Debug,
{
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// `router` plus `/health`, behind the token check.
fn routes(router: Router, auth: Auth, ready: Ready) -> Router {
    let health = move || {
        let serving = ready.get();
        async move {
            match serving {
                true => StatusCode::OK.into_response(),
                false => error_body(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "service_unavailable",
                    "not_serving",
                    "the server is warming up or draining",
                ),
            }
        }
    };
    router
        .route(HEALTH, get(health))
        .layer(from_fn(move |req: Request, next: Next| {
            let auth = auth.clone();
            async move { authorize(&auth, req, next).await }
        }))
}

/// Runs `req` when it carries an accepted token (or needs none), else answers 401.
async fn authorize(auth: &Auth, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == HEALTH {
        return next.run(req).await;
    }
    match auth.authorize(req.headers(), path) {
        Ok(()) => next.run(req).await,
        Err(status) => error_body(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            status.message(),
        ),
    }
}
