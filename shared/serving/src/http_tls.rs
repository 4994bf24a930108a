//! TLS of the HTTP listener: the same certificate, key and client CA as the gRPC
//! listener's, through rustls (ring, as tonic's), ALPN `http/1.1`. Handshakes run
//! concurrently, each within [`HANDSHAKE_TIMEOUT`], so a client that stalls its handshake
//! holds up no other; a failed handshake is logged at debug and the connection dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::tls::{read, SecurityError};
use crate::ServerTlsFiles;

/// Longest TLS handshake of an HTTP client.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The rustls configuration of `files`.
pub(crate) fn config(files: &ServerTlsFiles) -> Result<Arc<ServerConfig>, SecurityError> {
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        SecurityError::Invalid(format!("HTTP TLS: {what}: {e}"))
    };
    let pair = &files.identity;
    let certs = CertificateDer::pem_slice_iter(&read(&pair.cert, "TLS certificate")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(&pair.cert.display().to_string(), &e))?;
    let key = PrivateKeyDer::from_pem_slice(&read(&pair.key, "TLS key")?)
        .map_err(|e| invalid(&pair.key.display().to_string(), &e))?;
    let provider = Arc::new(ring());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("protocol versions", &e))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&read(ca, "client CA")?) {
                let cert = cert.map_err(|e| invalid(&ca.display().to_string(), &e))?;
                roots
                    .add(cert)
                    .map_err(|e| invalid(&ca.display().to_string(), &e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid("client CA", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid("certificate and key", &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// ring, the provider tonic's `tls-ring` gives the gRPC listener (rustls deprecates it for
/// lacking post-quantum key exchange; both listeners offer the same).
#[allow(deprecated)]
fn ring() -> CryptoProvider {
    tokio_rustls::rustls::crypto::ring::default_provider()
}

/// A listener whose connections have passed the TLS handshake.
pub(crate) struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    /// TLS as `config` says over `tcp`.
    pub(crate) fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> Self {
        Self {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshakes: JoinSet::new(),
        }
    }

    /// Starts the handshake of a connection just accepted.
    fn handshake(&mut self, tcp: TcpStream, addr: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        let acceptor = self.acceptor.clone();
        self.handshakes.spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => Some((tls, addr)),
                Ok(Err(e)) => {
                    tracing::debug!("HTTP TLS handshake with {addr} failed: {e}");
                    None
                }
                Err(_) => {
                    tracing::debug!("HTTP TLS handshake with {addr} timed out");
                    None
                }
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((tcp, addr)) => self.handshake(tcp, addr),
                    Err(e) => {
                        tracing::debug!("HTTP accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return conn;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}
