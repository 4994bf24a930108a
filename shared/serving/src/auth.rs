//! Bearer-token authentication of a service's clients, over gRPC and HTTP: every call but
//! the health checks (probes carry no token) must send `authorization: Bearer <token>`
//! with one of the operator's tokens, else it ends UNAUTHENTICATED (HTTP 401) before
//! reaching the service. Tokens
//! come from a file (one per line; blank and `#` lines skipped), such as a Kubernetes
//! Secret mounted as a file. Comparison is in constant time over SHA-256 digests, so
//! neither a token's bytes nor its length leak through timing. Each refusal counts in
//! `tandem_auth_failures_total{reason="missing|invalid"}`.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tandem_telemetry::{Counter, Registry};
use tonic::Status;
use tower::{Layer, Service};

use crate::tls::{read, SecurityError};

/// Calls that need no token: the standard health service, for probes.
const OPEN_PREFIX: &str = "/grpc.health.v1.Health/";
/// Shortest period between two refusals logged at warn (the others go to debug).
const WARN_EVERY_SECS: u64 = 10;

/// The tokens a service accepts (only their digests are kept).
pub struct Tokens(Vec<[u8; 32]>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} accepted)", self.0.len())
    }
}

impl Tokens {
    /// The tokens of a token file's text: one a line, trimmed; blank and `#` lines skipped.
    pub fn parse(text: &str) -> Result<Self, SecurityError> {
        let tokens: Vec<[u8; 32]> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|t| Sha256::digest(t.as_bytes()).into())
            .collect();
        if tokens.is_empty() {
            return Err(SecurityError::Invalid("the token file has no token".into()));
        }
        Ok(Self(tokens))
    }

    /// The tokens of the file at `path`.
    pub fn load(path: &Path) -> Result<Self, SecurityError> {
        let bytes = read(path, "token file")?;
        let text = String::from_utf8(bytes).map_err(|_| {
            SecurityError::Invalid(format!("token file {} is not UTF-8", path.display()))
        })?;
        Self::parse(&text).map_err(|e| SecurityError::Invalid(format!("{}: {e}", path.display())))
    }

    /// Whether `presented` is one of the tokens; the time taken does not depend on which
    /// token, if any, it matches.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let mut found = subtle::Choice::from(0);
        for token in &self.0 {
            found |= token.ct_eq(&digest);
        }
        found.into()
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    Invalid,
}

/// The token check of one server (none without tokens), with its failure counters
/// (registered either way, so the series exist at 0 for dashboards and alerts).
#[derive(Clone)]
pub(crate) struct Auth {
    tokens: Option<Arc<Tokens>>,
    missing: Counter,
    invalid: Counter,
    last_warn: Arc<AtomicU64>,
}

impl Auth {
    /// The check of `tokens`, counting into `registry`.
    pub(crate) fn new(tokens: Option<Arc<Tokens>>, registry: &Registry) -> Self {
        let counter = |reason: &str| {
            registry.counter(
                "tandem_auth_failures_total",
                "Calls refused UNAUTHENTICATED, by reason (missing: no bearer token; invalid: a token not accepted or a malformed header)",
                &[("reason", reason.to_string())],
            )
        };
        Self {
            tokens,
            missing: counter("missing"),
            invalid: counter("invalid"),
            last_warn: Arc::new(AtomicU64::new(0)),
        }
    }

    fn check<B>(&self, req: &http::Request<B>) -> Result<(), Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(());
        };
        if req.uri().path().starts_with(OPEN_PREFIX) {
            return Ok(());
        }
        self.authorize_with(tokens, req.headers(), req.uri().path())
    }

    /// Whether a call to `path` with `headers` carries an accepted token (always, without
    /// tokens); a refusal is counted and logged.
    pub(crate) fn authorize(&self, headers: &http::HeaderMap, path: &str) -> Result<(), Status> {
        match &self.tokens {
            Some(tokens) => self.authorize_with(tokens, headers, path),
            None => Ok(()),
        }
    }

    fn authorize_with(
        &self,
        tokens: &Tokens,
        headers: &http::HeaderMap,
        path: &str,
    ) -> Result<(), Status> {
        let refusal = match headers.get(http::header::AUTHORIZATION) {
            None => Refusal::Missing,
            Some(value) => match bearer(value.as_bytes()) {
                Some(token) if tokens.accepts(token) => return Ok(()),
                _ => Refusal::Invalid,
            },
        };
        Err(self.refuse(refusal, path))
    }

    fn refuse(&self, refusal: Refusal, path: &str) -> Status {
        let (counter, message) = match refusal {
            Refusal::Missing => (
                &self.missing,
                "missing bearer token: send `authorization: Bearer <token>` (gRPC metadata or HTTP header)",
            ),
            Refusal::Invalid => (&self.invalid, "invalid bearer token"),
        };
        counter.increment(1);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_warn.load(Ordering::Relaxed);
        let first_in_a_while = now >= last + WARN_EVERY_SECS
            && self
                .last_warn
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if first_in_a_while {
            tracing::warn!("refused {path}: {refusal:?} token (further refusals within {WARN_EVERY_SECS}s at debug; see tandem_auth_failures_total)");
        } else {
            tracing::debug!("refused {path}: {refusal:?} token");
        }
        Status::unauthenticated(message)
    }
}

/// The token of an `authorization` value `Bearer <token>` (scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token)
}

/// Applies an [`Auth`] to a server's routes.
#[derive(Clone)]
pub(crate) struct AuthLayer(pub(crate) Auth);

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            auth: self.0.clone(),
            inner,
        }
    }
}

/// A service behind the token check.
#[derive(Clone)]
pub(crate) struct AuthService<S> {
    auth: Auth,
    inner: S,
}

type Pending<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for AuthService<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pending<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match self.auth.check(&req) {
            Ok(()) => Box::pin(self.inner.call(req)),
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_skip_blank_and_comment_lines_and_trim() {
        let tokens = Tokens::parse("# clients\n\n  alpha  \n#beta\r\ngamma\r\n").expect("tokens");
        assert_eq!(tokens.0.len(), 2);
        assert!(tokens.accepts(b"alpha") && tokens.accepts(b"gamma"));
        for wrong in [&b"beta"[..], b"#beta", b"alph", b"alphaa", b" alpha", b""] {
            assert!(!tokens.accepts(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn a_token_file_without_tokens_is_refused() {
        for text in ["", "\n\n", "# only a comment\n"] {
            assert!(Tokens::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn tokens_do_not_show_in_debug_output() {
        let tokens = Tokens::parse("s3cret").expect("tokens");
        assert_eq!(format!("{tokens:?}"), "Tokens(1 accepted)");
    }

    #[test]
    fn only_bearer_values_carry_a_token() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer abc"), Some(&b"abc"[..]));
        for bad in [&b"Basic abc"[..], b"Bearer ", b"Bearer", b"abc", b""] {
            assert_eq!(bearer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn health_is_open_and_everything_else_needs_a_token() {
        let registry = Registry::new();
        let auth = Auth::new(
            Some(Arc::new(Tokens::parse("t0k").expect("tokens"))),
            &registry,
        );
        let call = |path: &str, header: Option<&str>| {
            let mut req = http::Request::builder().uri(path);
            if let Some(h) = header {
                req = req.header("authorization", h);
            }
            auth.check(&req.body(()).expect("a request"))
        };
        assert!(call("/grpc.health.v1.Health/Check", None).is_ok());
        assert!(call("/tandem.v1.Generation/Generate", Some("Bearer t0k")).is_ok());
        for header in [None, Some("Bearer nope"), Some("t0k")] {
            let status = call("/tandem.v1.Generation/Generate", header).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{header:?}");
        }
        let text = registry.render();
        assert!(
            text.contains(r#"tandem_auth_failures_total{reason="missing"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tandem_auth_failures_total{reason="invalid"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn without_tokens_everything_is_open_and_the_counters_exist() {
        let registry = Registry::new();
        let auth = Auth::new(None, &registry);
        let req = http::Request::builder().uri("/tandem.v1.Generation/Generate");
        assert!(auth.check(&req.body(()).expect("a request")).is_ok());
        let text = registry.render();
        assert!(
            text.contains(r#"tandem_auth_failures_total{reason="missing"} 0"#),
            "{text}"
        );
    }
}
