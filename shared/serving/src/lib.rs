//! What both tandem services do around their gRPC service, in one place: bind a gRPC and a
//! `/metrics` listener, answer `grpc.health.v1` (NOT_SERVING until the warm-up has run, so
//! a readiness probe never sends traffic to a cold server) and server reflection, serve
//! Prometheus text, and drain on a shutdown signal ([`drain`]: NOT_SERVING, new work
//! refused, work in flight finishes within the app's grace period). A warm-up that fails
//! stops the server with its error. Both sides of every connection send HTTP/2 keepalive
//! pings, so a peer that vanishes without closing is noticed. A server may be secured
//! ([`Security`]: TLS, mutual TLS, bearer tokens) and may answer health on a plaintext probe
//! listener too, and may serve an HTTP router beside gRPC ([`Listeners::with_http`], behind
//! the same tokens and drain). [`spawn`] runs one in the background with a handle that stops it on drop,
//! as `tandem up` and the end-to-end tests do, or kills it ([`Running::kill`]: every
//! connection closed at once, no drain), as `tandem bench soak` does to a drafter.

mod auth;
mod drain;
mod http;
mod http_tls;
mod kill;
mod security;
mod tls;

pub use auth::Tokens;
pub use drain::{Drain, Drained, InFlight};
pub use security::Security;
pub use tls::{
    endpoint, ClientTls, ClientTlsFiles, KeyPair, SecurityError, ServerTls, ServerTlsFiles,
};

use kill::Kill;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tandem_proto::v1 as pb;
use tandem_telemetry::{serve_metrics, Registry};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// Period of the HTTP/2 keepalive pings servers and their clients send.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// Longest wait for a keepalive ping's answer before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections may stay open after the drain before the server closes them.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Errors of starting or running a server.
pub type ServeError = Box<dyn std::error::Error + Send + Sync>;

/// Runs once before a server reports SERVING, on a blocking thread.
pub type WarmUp = Box<dyn FnOnce() -> Result<(), ServeError> + Send>;

/// The gRPC and `/metrics` listeners of one server, how its gRPC listener is secured, and
/// its optional plaintext health-only probe listener.
pub struct Listeners {
    /// gRPC.
    pub grpc: TcpListener,
    /// Prometheus `/metrics`.
    pub metrics: TcpListener,
    /// TLS and tokens of the gRPC listener.
    pub security: Security,
    /// Plaintext `grpc.health.v1` only, for probes that cannot speak TLS.
    pub probe: Option<TcpListener>,
    /// The app's HTTP router (when it has one), secured like gRPC.
    pub http: Option<TcpListener>,
}

impl Listeners {
    /// Binds both addresses (port 0 picks a free port).
    pub async fn bind(grpc: SocketAddr, metrics: SocketAddr) -> Result<Self, ServeError> {
        let bind = |addr: SocketAddr, what: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::from(format!("cannot listen on {addr} ({what}): {e}")))
        };
        Ok(Self {
            grpc: bind(grpc, "gRPC").await?,
            metrics: bind(metrics, "metrics").await?,
            security: Security::default(),
            probe: None,
            http: None,
        })
    }

    /// The listeners with gRPC secured as `security` says.
    pub fn with_security(self, security: Security) -> Self {
        Self { security, ..self }
    }

    /// The listeners plus a plaintext health-only listener on `addr`.
    pub async fn with_probe(self, addr: SocketAddr) -> Result<Self, ServeError> {
        let probe = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} (health probe): {e}"))?;
        Ok(Self {
            probe: Some(probe),
            ..self
        })
    }

    /// The listeners plus one on `addr` for the app's HTTP router.
    pub async fn with_http(self, addr: SocketAddr) -> Result<Self, ServeError> {
        let http = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} (HTTP): {e}"))?;
        Ok(Self {
            http: Some(http),
            ..self
        })
    }
}

/// A service ready to serve: its routes, the name health reports it under, its metrics and
/// its warm-up.
pub struct App {
    /// The gRPC service(s) (health and reflection are added).
    pub routes: Routes,
    /// Fully qualified service name, e.g. `tandem.v1.Generation`.
    pub name: &'static str,
    /// What `/metrics` shows.
    pub registry: Arc<Registry>,
    /// Runs before health turns SERVING.
    pub warm_up: WarmUp,
    /// The service's work in flight; drained on shutdown.
    pub drain: Arc<Drain>,
    /// Longest wait for work in flight once a shutdown began.
    pub grace: Duration,
    /// HTTP routes, served when the listeners have an HTTP listener.
    pub http: Option<axum::Router>,
}

/// A service this crate can run: it hands over its routes, metrics and warm-up, and gets
/// [`Serve::serve`] and [`Serve::spawn`].
pub trait Serve: Sized {
    /// The service with what it needs served.
    fn app(self) -> App;

    /// Serves on `listeners` until `shutdown` resolves.
    fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = Result<(), ServeError>> + Send {
        serve(self.app(), listeners, shutdown)
    }

    /// Serves on `listeners` in the background until the handle is stopped or dropped.
    fn spawn(self, listeners: Listeners) -> Result<Running, ServeError> {
        spawn(self.app(), listeners)
    }
}

/// Serves `app` on `listeners` until `shutdown` resolves (or its warm-up fails).
pub async fn serve(
    app: App,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_killable(app, listeners, shutdown, Kill::default()).await
}

/// [`serve`], every connection failing once `kill` fires.
async fn serve_killable(
    app: App,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    kill: Kill,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in ["", app.name] {
        reporter
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let mut builder = listeners.security.server(&app.registry)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let ready = http::Ready::default();
    let web = http::start(
        (listeners.http, app.http),
        &listeners.security,
        &app.registry,
        ready.clone(),
        stopped(stop_tx.subscribe()),
    )?;
    let metrics = tokio::spawn(serve_metrics(
        listeners.metrics,
        app.registry,
        stopped(stop_rx),
    ));
    let probe = listeners
        .probe
        .map(|l| security::serve_probe(l, health.clone(), stopped(stop_tx.subscribe())));
    let name = app.name;
    let mut failed_rx = warm(app.warm_up, reporter.clone(), name, ready.clone());
    tracing::info!("{name} listening on {}", listeners.grpc.local_addr()?);
    let mut warm_error = None;
    let (closing, closed) = oneshot::channel::<()>();
    let server = builder
        .add_routes(app.routes.add_service(health).add_service(reflection))
        // Small messages go out at once: with Nagle's algorithm a reply written while the
        // peer's ACK of the last one is delayed waits for it (accepted sockets do not take
        // the builder's `tcp_nodelay`).
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listeners.grpc)
                .with_nodelay(Some(true))
                .map(move |io| io.map(|io| kill.wrap(io))),
            async {
                tokio::select! {
                    () = shutdown => {
                        ready.set(false);
                        drain(&reporter, name, &app.drain, app.grace).await
                    }
                    Ok(e) = &mut failed_rx => {
                        tracing::error!("{name} warm-up failed: {e}");
                        warm_error = Some(e);
                    }
                }
                let _ = closing.send(());
            },
        );
    let result = tokio::select! {
        r = server => r.map_err(ServeError::from),
        () = linger(closed) => {
            tracing::warn!("{name}: connections still open {LINGER:?} after the drain; closing them");
            Ok(())
        }
    };
    let _ = stop_tx.send(true);
    if let Some(web) = web {
        http_stopped(web).await?;
    }
    metrics.await??;
    if let Some(probe) = probe {
        probe.await??;
    }
    if let Some(e) = warm_error {
        return Err(format!("{name} warm-up failed: {e}").into());
    }
    result
}

/// Reports NOT_SERVING (so readiness probes take the server out of rotation), refuses new
/// work and waits up to `grace` for the work in flight.
async fn drain(reporter: &HealthReporter, name: &'static str, drain: &Drain, grace: Duration) {
    for service in ["", name] {
        reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
    tracing::info!(
        "{name} draining: NOT_SERVING, {} in flight, grace {grace:?}",
        drain.in_flight()
    );
    match drain.drain(grace).await {
        Drained::Idle => tracing::info!("{name} drained"),
        Drained::GraceOver(left) => {
            tracing::warn!("{name}: grace period over with {left} still in flight; stopping")
        }
    }
}

/// Waits for the HTTP server to close its connections, at most [`LINGER`] (then they are
/// closed).
async fn http_stopped(mut web: JoinHandle<std::io::Result<()>>) -> Result<(), ServeError> {
    match tokio::time::timeout(LINGER, &mut web).await {
        Ok(done) => Ok(done??),
        Err(_) => {
            tracing::warn!("HTTP connections still open {LINGER:?} after the drain; closing them");
            web.abort();
            Ok(())
        }
    }
}

/// Resolves [`LINGER`] after the drain ended (never when it did not).
async fn linger(closed: oneshot::Receiver<()>) {
    match closed.await {
        Ok(()) => tokio::time::sleep(LINGER).await,
        Err(_) => std::future::pending().await,
    }
}

/// Runs `warm_up` on a blocking thread, then reports `name` (and the server as a whole)
/// SERVING; the receiver gets the error of a warm-up that fails.
fn warm(
    warm_up: WarmUp,
    reporter: HealthReporter,
    name: &'static str,
    ready: http::Ready,
) -> oneshot::Receiver<String> {
    let (failed, rx) = oneshot::channel();
    tokio::spawn(async move {
        let outcome = match tokio::task::spawn_blocking(warm_up).await {
            Ok(done) => done.map_err(|e| e.to_string()),
            Err(panicked) => Err(panicked.to_string()),
        };
        match outcome {
            Ok(()) => {
                for service in ["", name] {
                    reporter
                        .set_service_status(service, ServingStatus::Serving)
                        .await;
                }
                ready.set(true);
                tracing::info!("{name} warmed up: SERVING");
            }
            Err(e) => drop(failed.send(e)),
        }
    });
    rx
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// A server running in the background; stops when dropped.
pub struct Running {
    /// Its gRPC address.
    pub grpc: SocketAddr,
    /// Its `/metrics` address.
    pub metrics: SocketAddr,
    /// Its HTTP address, when it serves HTTP.
    pub http: Option<SocketAddr>,
    scheme: &'static str,
    stop: watch::Sender<bool>,
    kill: Kill,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

/// Serves `app` on `listeners` in the background until the handle is stopped or dropped.
pub fn spawn(app: App, listeners: Listeners) -> Result<Running, ServeError> {
    let (grpc, metrics) = (
        listeners.grpc.local_addr()?,
        listeners.metrics.local_addr()?,
    );
    let http = listeners
        .http
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()?;
    let scheme = listeners.security.scheme();
    let (stop, rx) = watch::channel(false);
    let kill = Kill::default();
    let task = tokio::spawn(serve_killable(app, listeners, stopped(rx), kill.clone()));
    Ok(Running {
        grpc,
        metrics,
        http,
        scheme,
        stop,
        kill,
        task: Some(task),
    })
}

impl Running {
    /// Its gRPC endpoint, `http://ip:port` (`https://` with TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.grpc)
    }

    /// Asks the server to shut down.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits (up to `limit`) until the server reports SERVING.
    pub async fn wait_serving(&self, limit: Duration) -> Result<(), ServeError> {
        self.wait_serving_over(None, limit).await
    }

    /// Waits (up to `limit`) until the server reports SERVING, connecting over `tls` (a
    /// server with TLS) or in plaintext.
    pub async fn wait_serving_over(
        &self,
        tls: Option<&ClientTls>,
        limit: Duration,
    ) -> Result<(), ServeError> {
        wait_serving_at(endpoint(&self.url(), tls)?, limit).await
    }

    /// Stops the server and waits for it to end.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        self.stop();
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }

    /// Ends the server as if its process died: every connection fails at once (work in
    /// flight is cut off, not drained) and the gRPC listener closes, so its address can be
    /// bound again.
    pub async fn kill(mut self) {
        self.kill.fire();
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The health status of the plaintext server at `url` (its "" service), `None` when it
/// does not answer.
pub async fn health(url: &str) -> Option<WireStatus> {
    health_at(&endpoint(url, None).ok()?).await
}

/// The health status of the server at `endpoint` (its "" service), `None` when it does
/// not answer.
pub async fn health_at(endpoint: &tonic::transport::Endpoint) -> Option<WireStatus> {
    let channel = endpoint.connect_lazy();
    let req = HealthCheckRequest {
        service: String::new(),
    };
    let status = HealthClient::new(channel).check(req).await.ok()?;
    WireStatus::try_from(status.into_inner().status).ok()
}

/// Waits (up to `limit`) until the plaintext server at `url` reports SERVING.
pub async fn wait_serving(url: &str, limit: Duration) -> Result<(), ServeError> {
    wait_serving_at(endpoint(url, None)?, limit).await
}

/// Waits (up to `limit`) until the server at `endpoint` reports SERVING.
pub async fn wait_serving_at(
    endpoint: tonic::transport::Endpoint,
    limit: Duration,
) -> Result<(), ServeError> {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if health_at(&endpoint).await == Some(WireStatus::Serving) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = endpoint.uri();
    Err(format!("{url} did not become ready within {limit:?}").into())
}

#[cfg(test)]
mod tests;
