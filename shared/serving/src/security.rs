//! The operator's security settings of one server ([`Security`]: TLS, mutual with a client
//! CA, and bearer tokens), the tonic server builder they give, and the plaintext probe
//! listener that answers only `grpc.health.v1` for Kubernetes' gRPC probes, which cannot
//! speak TLS.

use std::future::Future;
use std::sync::Arc;

use tandem_telemetry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic_health::pb::health_server::{Health, HealthServer};
use tower::layer::util::{Identity, Stack};

use crate::auth::{Auth, AuthLayer, Tokens};
use crate::{ServeError, ServerTls};

/// How a server is secured; the default is plaintext and open (`tandem up`'s).
#[derive(Clone, Default)]
pub struct Security {
    /// TLS (mutual when it has a client CA); `None`: plaintext.
    pub tls: Option<ServerTls>,
    /// Bearer tokens every call but health checks must carry; `None`: open.
    pub tokens: Option<Arc<Tokens>>,
}

impl Security {
    /// A tonic server builder with this TLS and token check; refusals count in `registry`.
    pub(crate) fn server(
        &self,
        registry: &Registry,
    ) -> Result<Server<Stack<AuthLayer, Identity>>, ServeError> {
        let mut server = Server::builder()
            .http2_keepalive_interval(Some(crate::KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(crate::KEEPALIVE_TIMEOUT));
        if let Some(tls) = &self.tls {
            server = server.tls_config(tls.grpc.clone())?;
        }
        let auth = Auth::new(self.tokens.clone(), registry);
        Ok(server.layer(AuthLayer(auth)))
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        match self.tls {
            Some(_) => "https",
            None => "http",
        }
    }
}

/// Serves only `health`, in plaintext, on `listener` until `stop` resolves.
pub(crate) fn serve_probe<H: Health>(
    listener: TcpListener,
    health: HealthServer<H>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    tokio::spawn(
        Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop),
    )
}
