//! The verifier's drafters: long-lived HTTP/2 channels to a set of endpoints (fixed
//! `http://host:port` addresses, or `dns:///name:port` names re-resolved periodically, as a
//! headless Kubernetes Service gives one address per pod), over TLS (`https://`, mutual
//! with a client identity) when the pool has client TLS. Each endpoint is checked with
//! Info before use; one made for another target is refused. New sessions go to the least
//! loaded healthy drafter; when theirs dies or stalls they move to another
//! ([`crate::failover`]). Endpoints that disappear keep serving the sessions they already
//! have until those end.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pb::drafter_client::DrafterClient;
use tandem_core::{
    ProposeError, Proposer, ProposerSession, SamplingParams, SnapshotSpec, SnapshotSupport,
};
use tandem_proto::codec::message_limit;
use tandem_proto::spec::spec_from_info;
use tandem_proto::v1 as pb;
use tandem_serving::{ClientTls, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use tokio::runtime::Handle;
use tonic::transport::{Channel, Endpoint};

use crate::error::VerifierError;
use crate::failover::FailoverSession;
use crate::metrics::VerifierMetrics;
use crate::remote::{Link, RemoteSession, SessionOptions};

/// Longest wait for a drafter's Info answer.
const INFO_TIMEOUT: Duration = Duration::from_secs(3);
/// Drafters tried when a session opens or moves, before giving up on speculation for a
/// generation.
const OPEN_ATTEMPTS: usize = 2;

/// Where drafters are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A fixed address.
    Static(String),
    /// A DNS name whose addresses are all drafters on `port`.
    Dns {
        /// Host name.
        host: String,
        /// Port of every address.
        port: u16,
    },
}

impl Source {
    /// Parses `http://host:port`, `https://…`, `host:port` or `dns:///name:port`; with `tls`
    /// a bare address means `https://`, and `http://` is refused (no silent plaintext), as
    /// `https://` is without.
    pub fn parse(s: &str, tls: bool) -> Result<Self, VerifierError> {
        let bad = || VerifierError::InvalidArgument(format!("bad drafter endpoint {s:?}"));
        let scheme = scheme(tls);
        if let Some(rest) = s
            .strip_prefix("dns:///")
            .or_else(|| s.strip_prefix("dns://"))
        {
            let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
            let port = port.parse().map_err(|_| bad())?;
            if host.is_empty() {
                return Err(bad());
            }
            return Ok(Self::Dns {
                host: host.to_string(),
                port,
            });
        }
        if let Some((given, _)) = s.split_once("://") {
            if given != scheme {
                return Err(VerifierError::InvalidArgument(format!(
                    "drafter endpoint {s:?} is {given} but drafter TLS is {}: use {scheme}://",
                    if tls { "set" } else { "not set" }
                )));
            }
            return Ok(Self::Static(s.to_string()));
        }
        if s.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        {
            return Ok(Self::Static(format!("{scheme}://{s}")));
        }
        Err(bad())
    }

    /// The host name the drafters' certificates must carry: a DNS source's name (its
    /// addresses are dialled), else the URL's host.
    fn tls_host(&self) -> Option<&str> {
        match self {
            Self::Static(_) => None,
            Self::Dns { host, .. } => Some(host),
        }
    }

    async fn urls(&self, resolver: &dyn Resolve, tls: bool) -> std::io::Result<Vec<String>> {
        match self {
            Self::Static(u) => Ok(vec![u.clone()]),
            Self::Dns { host, port } => {
                let mut urls: Vec<String> = resolver
                    .resolve(host, *port)
                    .await?
                    .into_iter()
                    .map(|a| format!("{}://{a}", scheme(tls)))
                    .collect();
                urls.sort();
                urls.dedup();
                Ok(urls)
            }
        }
    }
}

fn scheme(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}

/// Future of a name lookup.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Turns a DNS name into addresses.
pub trait Resolve: Send + Sync {
    /// The addresses of `host`, each with `port`.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Lookup<'a>;
}

/// The system resolver (getaddrinfo: /etc/hosts, DNS, a Kubernetes headless Service).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Lookup<'a> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// One drafter endpoint.
pub struct Member {
    url: String,
    source: usize,
    /// Client over the endpoint's channel (cheap to clone).
    pub client: DrafterClient<Channel>,
    /// Sessions open on it now.
    pub active: AtomicUsize,
    healthy: AtomicBool,
    /// Largest message the drafter accepts.
    pub max_message_bytes: usize,
}

impl Member {
    /// Its endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Leaves it out of new sessions until a refresh finds it answering again.
    pub fn mark_unhealthy(&self) {
        self.healthy.store(false, Ordering::SeqCst);
    }
}

/// What every drafter of the pool must agree on.
#[derive(Debug, Clone)]
struct Agreed {
    spec: SnapshotSpec,
    max_gamma: usize,
}

/// Settings of a [`DrafterPool`].
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Endpoints as given by the operator.
    pub endpoints: Vec<String>,
    /// How sessions talk to drafters.
    pub session: SessionOptions,
    /// What the target can export: a drafter whose declared snapshot does not fit it is
    /// refused.
    pub snapshot: SnapshotSupport,
    /// TLS to the drafters; `None`: plaintext.
    pub tls: Option<ClientTls>,
}

/// The drafters a verifier drafts with; a [`Proposer`] over all of them.
pub struct DrafterPool {
    cfg: PoolConfig,
    sources: Vec<Source>,
    members: Arc<Members>,
    resolver: Box<dyn Resolve>,
}

/// The pool's endpoints and what opening a session on one needs; shared with the sessions,
/// so a session can move to another drafter.
pub(crate) struct Members {
    list: RwLock<Vec<Arc<Member>>>,
    agreed: RwLock<Option<Agreed>>,
    /// The verifier's metrics.
    pub metrics: Arc<VerifierMetrics>,
    handle: Handle,
    turn: AtomicUsize,
    /// How sessions talk to drafters.
    pub session: SessionOptions,
}

impl DrafterPool {
    /// A pool over `cfg.endpoints` (nothing is contacted until [`DrafterPool::refresh`]).
    pub fn new(
        cfg: PoolConfig,
        metrics: Arc<VerifierMetrics>,
        handle: Handle,
    ) -> Result<Self, VerifierError> {
        let sources = cfg
            .endpoints
            .iter()
            .map(|e| Source::parse(e, cfg.tls.is_some()))
            .collect::<Result<_, _>>()?;
        let members = Members {
            list: RwLock::new(Vec::new()),
            agreed: RwLock::new(None),
            metrics,
            handle,
            turn: AtomicUsize::new(0),
            session: cfg.session.clone(),
        };
        Ok(Self {
            cfg,
            sources,
            members: Arc::new(members),
            resolver: Box::new(SystemResolver),
        })
    }

    /// The pool with names resolved by `resolver` instead of the system's.
    pub fn with_resolver(mut self, resolver: Box<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Endpoints as configured.
    pub fn endpoints(&self) -> &[String] {
        &self.cfg.endpoints
    }

    /// Resolves every source again, checks new endpoints with Info, drops endpoints that are
    /// gone and retries unhealthy ones. Fails only when a fixed endpoint serves another
    /// target (a configuration error to refuse at startup); unreachable endpoints are left
    /// out until they answer.
    pub async fn refresh(&self) -> Result<(), VerifierError> {
        let mut keep: Vec<Arc<Member>> = Vec::new();
        let current = self.members.all();
        for (i, source) in self.sources.iter().enumerate() {
            let urls = match source
                .urls(self.resolver.as_ref(), self.cfg.tls.is_some())
                .await
            {
                Ok(urls) => urls,
                Err(e) => {
                    tracing::warn!("cannot resolve drafters {source:?}: {e}");
                    keep.extend(current.iter().filter(|m| m.source == i).cloned());
                    continue;
                }
            };
            for url in urls {
                let known = current.iter().find(|m| m.url == url && m.source == i);
                let member = match known {
                    Some(m) if m.healthy.load(Ordering::SeqCst) => Some(Arc::clone(m)),
                    _ => {
                        self.check(&url, i, matches!(source, Source::Static(_)))
                            .await?
                    }
                };
                keep.extend(member);
            }
        }
        let healthy = keep.len();
        *self.members.list.write().unwrap_or_else(|p| p.into_inner()) = keep;
        self.members.metrics.drafters_available.set(healthy as f64);
        Ok(())
    }

    /// Refreshes every `every` until the runtime shuts down.
    pub fn spawn_refresh(self: &Arc<Self>, every: Duration) {
        let pool = Arc::downgrade(self);
        self.members.handle.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = pool.upgrade() else { return };
                if let Err(e) = pool.refresh().await {
                    tracing::error!("drafter refresh: {e}");
                }
            }
        });
    }

    /// Connects to `url` and checks it; `Err` only for a fixed endpoint of another target.
    async fn check(
        &self,
        url: &str,
        source: usize,
        fixed: bool,
    ) -> Result<Option<Arc<Member>>, VerifierError> {
        let bad = |e: &dyn std::fmt::Display| {
            VerifierError::InvalidArgument(format!("bad drafter endpoint {url}: {e}"))
        };
        let mut endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| bad(&e))?;
        if let Some(tls) = &self.cfg.tls {
            let host = self.sources[source].tls_host();
            endpoint = tls.apply(endpoint, host).map_err(|e| bad(&e))?;
        }
        let channel = endpoint
            .connect_timeout(INFO_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_lazy();
        let mut client = DrafterClient::new(channel);
        let info = match tokio::time::timeout(INFO_TIMEOUT, client.info(pb::InfoRequest {})).await {
            Ok(Ok(info)) => info.into_inner(),
            Ok(Err(e)) => {
                tracing::warn!("drafter {url} unavailable: {}", e.message());
                return Ok(None);
            }
            Err(_) => {
                tracing::warn!("drafter {url} did not answer Info in time");
                return Ok(None);
            }
        };
        let max_message_bytes = message_limit(&info);
        match self.compatible(&info) {
            Ok(()) => Ok(Some(Arc::new(Member {
                url: url.to_string(),
                source,
                client: client.max_encoding_message_size(max_message_bytes),
                active: AtomicUsize::new(0),
                healthy: AtomicBool::new(true),
                max_message_bytes,
            }))),
            Err(why) if fixed => Err(VerifierError::InvalidArgument(format!(
                "refusing drafter {url}: {why}"
            ))),
            Err(why) => {
                tracing::error!("refusing drafter {url}: {why}");
                Ok(None)
            }
        }
    }

    /// Whether a drafter fits this verifier's target and the pool's other drafters.
    fn compatible(&self, info: &pb::DrafterInfo) -> Result<(), String> {
        let ours = &self.cfg.session.target;
        if info.target.as_ref() != Some(ours) {
            let theirs = info.target.as_ref().map_or("none".into(), |t| {
                format!("{} {}", t.architecture, t.embedding_hash)
            });
            return Err(format!(
                "it was made for another target ({theirs}; this verifier serves {} {})",
                ours.architecture, ours.embedding_hash
            ));
        }
        let spec = spec_from_info(info).map_err(|e| e.0)?;
        self.cfg
            .snapshot
            .check(&spec)
            .map_err(|why| format!("its snapshot {spec} does not fit the target: {why}"))?;
        let mut agreed = self
            .members
            .agreed
            .write()
            .unwrap_or_else(|p| p.into_inner());
        match agreed.as_ref() {
            Some(a) if a.spec != spec => Err(format!(
                "its snapshot {spec} differs from the pool's {}",
                a.spec
            )),
            Some(_) => Ok(()),
            None => {
                *agreed = Some(Agreed {
                    spec,
                    max_gamma: info.max_gamma as usize,
                });
                Ok(())
            }
        }
    }

    /// Bytes a generation of `positions` positions keeps to move its drafter session: its
    /// context rows as sent.
    pub fn history_bytes(&self, positions: usize) -> usize {
        positions * self.members.row_bytes()
    }
}

impl Members {
    fn all(&self) -> Vec<Arc<Member>> {
        self.list
            .read()
            .map_or_else(|p| p.into_inner().clone(), |m| m.clone())
    }

    fn agreed(&self) -> Option<Agreed> {
        self.agreed
            .read()
            .map_or_else(|p| p.into_inner().clone(), |a| a.clone())
    }

    /// The snapshot every drafter of the pool consumes.
    pub(crate) fn snapshot(&self) -> SnapshotSpec {
        self.agreed().map_or_else(SnapshotSpec::default, |a| a.spec)
    }

    /// Bytes one context row takes on the wire.
    pub(crate) fn row_bytes(&self) -> usize {
        let size = match self.session.dtype {
            pb::Dtype::F32 => 4,
            _ => 2,
        };
        self.snapshot().row_width() * size
    }

    /// Healthy members outside `avoid`, least loaded first; equally loaded ones in turns.
    fn candidates(&self, avoid: &[Arc<Member>]) -> Vec<Arc<Member>> {
        let mut m: Vec<Arc<Member>> = self
            .all()
            .into_iter()
            .filter(|m| m.healthy.load(Ordering::SeqCst))
            .filter(|m| !avoid.iter().any(|a| Arc::ptr_eq(a, m)))
            .collect();
        if !m.is_empty() {
            let turn = self.turn.fetch_add(1, Ordering::Relaxed) % m.len();
            m.rotate_left(turn);
        }
        m.sort_by_key(|m| m.active.load(Ordering::SeqCst));
        m
    }

    /// Opens a session on the least loaded healthy drafter outside `avoid`, trying the next
    /// one when a drafter cannot open it (and leaving that one out until it answers again).
    pub(crate) fn open(
        &self,
        sampling: &SamplingParams,
        avoid: &[Arc<Member>],
    ) -> Result<RemoteSession, ProposeError> {
        let mut last = ProposeError::Unavailable("no drafter available".into());
        for member in self.candidates(avoid).into_iter().take(OPEN_ATTEMPTS) {
            let link = Link {
                handle: self.handle.clone(),
                metrics: Arc::clone(&self.metrics),
                snapshot: self.snapshot(),
            };
            match RemoteSession::open(Arc::clone(&member), sampling, &self.session, link) {
                Ok(s) => return Ok(s),
                Err(e @ ProposeError::Invalid(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!("drafter {} failed to open a session: {e}", member.url);
                    member.mark_unhealthy();
                    self.metrics.draft_rpc_errors.increment(1);
                    last = e;
                }
            }
        }
        Err(last)
    }
}

impl Proposer for DrafterPool {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.members.snapshot()
    }

    fn max_gamma(&self) -> usize {
        self.members.agreed().map_or(0, |a| a.max_gamma)
    }

    fn open(&self, sampling: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        let session = FailoverSession::open(Arc::clone(&self.members), sampling)?;
        Ok(Box::new(session))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Source::parse("http://a:1", false).ok(),
            Some(Source::Static("http://a:1".into()))
        );
        assert_eq!(
            Source::parse("a:50052", false).ok(),
            Some(Source::Static("http://a:50052".into()))
        );
        assert_eq!(
            Source::parse("dns:///drafters.ns.svc:50052", false).ok(),
            Some(Source::Dns {
                host: "drafters.ns.svc".into(),
                port: 50052
            })
        );
        for bad in ["", "dns:///x", "dns:///:1", "nohost", "a:b", "https://a:1"] {
            assert!(Source::parse(bad, false).is_err(), "{bad}");
        }
    }

    #[test]
    fn with_tls_endpoints_are_https_and_plaintext_is_refused() {
        assert_eq!(
            Source::parse("a:50052", true).ok(),
            Some(Source::Static("https://a:50052".into()))
        );
        assert_eq!(
            Source::parse("https://a:1", true).ok(),
            Some(Source::Static("https://a:1".into()))
        );
        let dns = Source::parse("dns:///d.ns.svc:50052", true).expect("a DNS source");
        assert_eq!(dns.tls_host(), Some("d.ns.svc"));
        let err = Source::parse("http://a:1", true).expect_err("plaintext refused");
        assert!(err.to_string().contains("use https://"), "{err}");
    }
}
