//! A raw HTTP/1.1 client for the HTTP API tests, in plaintext or over TLS: one request per
//! connection (`Connection: close`), the answer read to its end, chunked bodies decoded, server-sent
//! events split into their `data:` payloads. Raw so that tests can send what well-behaved
//! clients never do (malformed JSON, oversized bodies).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

/// An answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|event| {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                (!data.is_empty()).then(|| data.join("\n"))
            })
            .collect()
    }
}

/// Sends `method path` with `headers` and `body` to `addr` and reads the whole answer.
pub async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    exchange(stream, &message(addr, method, path, headers, body)).await
}

/// [`raw`] over TLS, trusting the CA of PEM file `ca` (the server must be `localhost`).
pub async fn raw_tls(
    addr: SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    exchange(tls, &message(addr, method, path, headers, b"")).await
}

/// The crypto of the servers' TLS (tonic's `tls-ring`).
#[allow(deprecated)]
fn ring() -> tokio_rustls::rustls::crypto::CryptoProvider {
    tokio_rustls::rustls::crypto::ring::default_provider()
}

fn message(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Writes `out` while the answer is read (a server refusing a large body answers before
/// reading all of it) and parses the answer.
async fn exchange<S>(stream: S, out: &[u8]) -> Reply
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let out = out.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&out).await;
        wr
    });
    let mut raw = Vec::new();
    let _ = rd.read_to_end(&mut raw).await;
    drop(writer.await);
    parse(&raw)
}

/// POSTs `body` as JSON.
pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    let headers = [("content-type", "application/json")];
    raw(addr, "POST", path, &headers, body.to_string().as_bytes()).await
}

/// GETs `path`.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    raw(addr, "GET", path, &[], b"").await
}

fn parse(raw: &[u8]) -> Reply {
    let end = find(raw, b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = &raw[end + 4..];
    let body = match chunked {
        true => dechunk(body),
        false => body.to_vec(),
    };
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("a UTF-8 body"),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The payload of a chunked body.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line) = find(body, b"\r\n") {
        let size = String::from_utf8_lossy(&body[..line]);
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16);
        let rest = &body[line + 2..];
        match size {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&rest[..n.min(rest.len())]);
                body = rest.get(n + 2..).unwrap_or(&[]);
            }
        }
    }
    out
}
