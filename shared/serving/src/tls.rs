//! TLS of both services through rustls (tonic's `tls-ring`). A server presents a
//! certificate chain and key; given a client CA it requires every client to present a
//! certificate that CA signed (mutual TLS, refused in the handshake otherwise). A client
//! trusts a CA bundle, may present its own identity and may check the server's certificate
//! against another name than the URL's host. Files are read and the PEM checked when the
//! settings are loaded, so a missing file or a bad PEM is one clear error at startup, not
//! a failure at the first connection.

use std::error::Error;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// A TLS or token setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file was read but cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// A certificate chain and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPair {
    /// Certificate chain (leaf first).
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl KeyPair {
    fn identity(&self) -> Result<Identity, SecurityError> {
        Ok(Identity::from_pem(
            read(&self.cert, "TLS certificate")?,
            read(&self.key, "TLS key")?,
        ))
    }
}

/// A server's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// What the server presents.
    pub identity: KeyPair,
    /// CA bundle that signs the certificates clients must present (mutual TLS); `None`:
    /// clients present none.
    pub client_ca: Option<PathBuf>,
}

/// A server's TLS, loaded: for its gRPC listener and for its HTTP listener.
#[derive(Clone)]
pub struct ServerTls {
    /// gRPC's (tonic).
    pub grpc: ServerTlsConfig,
    /// HTTP's (rustls), the same certificate and client CA.
    pub http: std::sync::Arc<tokio_rustls::rustls::ServerConfig>,
}

impl ServerTlsFiles {
    /// Reads and checks the files.
    pub fn load(&self) -> Result<ServerTls, SecurityError> {
        Ok(ServerTls {
            grpc: self.load_grpc()?,
            http: crate::http_tls::config(self)?,
        })
    }

    fn load_grpc(&self) -> Result<ServerTlsConfig, SecurityError> {
        let mut config = ServerTlsConfig::new().identity(self.identity.identity()?);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(certificates(ca, "client CA")?);
        }
        Server::builder().tls_config(config.clone()).map_err(|e| {
            let pair = &self.identity;
            let what = format!("server TLS (key {} of", pair.key.display());
            unusable(&what, &pair.cert, &e)
        })?;
        Ok(config)
    }
}

/// A client's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA bundle the server's certificate must chain to.
    pub ca: PathBuf,
    /// What the client presents to a server that asks (mutual TLS).
    pub identity: Option<KeyPair>,
    /// Name the server's certificate must carry, instead of the URL's host.
    pub domain: Option<String>,
}

impl ClientTlsFiles {
    /// Reads and checks the files.
    pub fn load(&self) -> Result<ClientTls, SecurityError> {
        let mut config = ClientTlsConfig::new().ca_certificate(certificates(&self.ca, "CA")?);
        if let Some(pair) = &self.identity {
            config = config.identity(pair.identity()?);
        }
        Endpoint::from_static("https://localhost")
            .tls_config(config.clone())
            .map_err(|e| unusable("client TLS (CA", &self.ca, &e))?;
        Ok(ClientTls {
            config,
            domain: self.domain.clone(),
        })
    }
}

/// A client's TLS, loaded.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: ClientTlsConfig,
    domain: Option<String>,
}

impl ClientTls {
    /// `endpoint` over TLS; the server's certificate must name the configured domain, else
    /// `host` when given (a DNS name whose addresses are dialled), else the URL's host.
    pub fn apply(&self, endpoint: Endpoint, host: Option<&str>) -> Result<Endpoint, SecurityError> {
        let mut config = self.config.clone();
        if let Some(name) = self.domain.as_deref().or(host) {
            config = config.domain_name(name);
        }
        endpoint
            .tls_config(config)
            .map_err(|e| SecurityError::Invalid(format!("client TLS: {}", chain(&e))))
    }
}

/// `url` as an endpoint, over `tls` when given.
pub fn endpoint(url: &str, tls: Option<&ClientTls>) -> Result<Endpoint, SecurityError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| SecurityError::Invalid(format!("bad URL {url:?}: {e}")))?;
    match tls {
        Some(tls) => tls.apply(endpoint, None),
        None => Ok(endpoint),
    }
}

pub(crate) fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|source| SecurityError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The PEM certificates of the file at `path`; refused unless it holds at least one and
/// nothing unreadable (rustls would silently skip a bad CA and trust nothing).
fn certificates(path: &Path, what: &'static str) -> Result<Certificate, SecurityError> {
    let pem = read(path, what)?;
    let parsed: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match parsed {
        Ok(certs) if !certs.is_empty() => Ok(Certificate::from_pem(pem)),
        Ok(_) => Err(SecurityError::Invalid(format!(
            "{what} {} holds no PEM certificate",
            path.display()
        ))),
        Err(e) => Err(SecurityError::Invalid(format!(
            "{what} {}: bad PEM: {e}",
            path.display()
        ))),
    }
}

fn unusable(what: &str, path: &Path, e: &dyn Error) -> SecurityError {
    SecurityError::Invalid(format!("{what} {}): {}", path.display(), chain(e)))
}

/// An error and its causes, `: ` between them.
fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
