//! A small HTTP/1.1 client of the verifier's OpenAI-compatible API for `tandem bench http`:
//! one kept-alive connection (as a gRPC channel is), JSON requests, and completions read as
//! server-sent events to `data: [DONE]`.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// One connection to the API.
pub struct HttpClient {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
}

/// What a streamed completion said besides its text.
pub struct Streamed {
    /// `usage.completion_tokens` of the stream's usage chunk.
    pub completion_tokens: u64,
}

impl HttpClient {
    /// Connects to `addr` (no TLS, no token: the loopback bench's verifier).
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::warn!("HTTP connection: {e}");
            }
        });
        Ok(Self { addr, sender })
    }

    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Incoming>> {
        self.sender.ready().await?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.addr.to_string())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        Ok(self.sender.send_request(req).await?)
    }

    /// `GET path`, its body as JSON; an answer other than 200 is an error.
    pub async fn get_json(&mut self, path: &str) -> Result<Value> {
        let res = self.send(Method::GET, path, Bytes::new()).await?;
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// `POST /v1/completions` with `request` (which must ask for a stream with usage),
    /// calling `on_text` with each chunk's text as it arrives.
    pub async fn stream_completion(
        &mut self,
        request: &Value,
        mut on_text: impl FnMut(&str),
    ) -> Result<Streamed> {
        let body = Bytes::from(serde_json::to_vec(request)?);
        let res = self.send(Method::POST, "/v1/completions", body).await?;
        let status = res.status();
        let mut body = res.into_body();
        if status != StatusCode::OK {
            let text = body.collect().await?.to_bytes();
            bail!(
                "/v1/completions: {status}: {}",
                String::from_utf8_lossy(&text)
            );
        }
        let (mut pending, mut usage, mut done) = (String::new(), None, false);
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            pending.push_str(std::str::from_utf8(&data).context("a non-UTF-8 event")?);
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                    let data = data.trim_start();
                    if data == "[DONE]" {
                        done = true;
                        continue;
                    }
                    let chunk: Value = serde_json::from_str(data)?;
                    if let Some(err) = chunk.get("error") {
                        bail!("/v1/completions streamed an error: {err}");
                    }
                    if let Some(text) = chunk["choices"][0]["text"].as_str() {
                        on_text(text);
                    }
                    usage = chunk["usage"]["completion_tokens"].as_u64().or(usage);
                }
            }
        }
        if !done {
            bail!("/v1/completions ended without data: [DONE]");
        }
        Ok(Streamed {
            completion_tokens: usage.context("no usage chunk in the stream")?,
        })
    }
}
