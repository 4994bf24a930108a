//! Several drafters behind one [`Proposer`], one chosen per generation by a
//! [`TokenRouter`] over the tokens of the generation's first rows (its prompt, as the
//! verifier sends it before the first draft; the router reads at most the length it was
//! fitted on, which the verifier's first chunk of rows holds in process and through the
//! services alike). Drafters trained on different text win on different traffic (one on
//! documentation, one on chat and prose); a session opens only the chosen drafter's
//! session, so routing costs one classification a generation. Rows sent without their
//! tokens go to the default route. The choice changes which tokens are drafted, never what
//! is generated.

use std::sync::{Arc, RwLock};

use crate::batching::StepObserver;
use crate::proposer::{DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession};
use crate::router::TokenRouter;
use crate::sampling::SamplingParams;
use crate::snapshot::{SnapshotRows, SnapshotSpec};

/// A drafter to route to, named as the router's class.
pub struct Route {
    /// The router's class for it (a metric label).
    pub name: String,
    /// The drafter.
    pub proposer: Arc<dyn Proposer>,
}

/// Told of every routed session's choice.
pub trait RouteObserver: Send + Sync {
    /// A session was routed to `route`.
    fn routed(&self, route: &str);
}

/// Drafters of the same snapshot rows, one chosen per session (see the module docs).
pub struct Routed {
    shared: Arc<Shared>,
    spec: SnapshotSpec,
    max_gamma: usize,
}

struct Shared {
    routes: Vec<Route>,
    router: TokenRouter,
    default: usize,
    observers: RwLock<Vec<Arc<dyn RouteObserver>>>,
}

impl Routed {
    /// Routes by `router` between `routes` (one per class, in its order, same names);
    /// sessions whose rows carry no tokens go to `routes[default]`. Every route must
    /// consume the same snapshot rows.
    pub fn new(
        routes: Vec<Route>,
        router: TokenRouter,
        default: usize,
    ) -> Result<Self, ProposeError> {
        let invalid = |m: String| ProposeError::Invalid(m);
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        (router.check().and_then(|()| router.check_classes(&names)))
            .map_err(|e| invalid(e.to_string()))?;
        if default >= routes.len() {
            return Err(invalid(format!(
                "default route {default} of {}",
                routes.len()
            )));
        }
        let spec = routes[0].proposer.snapshot_spec();
        if let Some(other) = routes.iter().find(|r| r.proposer.snapshot_spec() != spec) {
            return Err(invalid(format!(
                "drafters {} and {} consume different snapshot rows; routed drafters must \
                 share their taps",
                routes[0].name, other.name
            )));
        }
        let max_gamma = routes
            .iter()
            .map(|r| r.proposer.max_gamma())
            .min()
            .unwrap_or(0);
        Ok(Self {
            shared: Arc::new(Shared {
                routes,
                router,
                default,
                observers: RwLock::new(Vec::new()),
            }),
            spec,
            max_gamma,
        })
    }
}

impl Proposer for Routed {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.spec.clone()
    }

    fn max_gamma(&self) -> usize {
        self.max_gamma
    }

    fn open(&self, sampling: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        Ok(Box::new(RoutedSession {
            shared: self.shared.clone(),
            sampling: *sampling,
            chosen: None,
        }))
    }

    fn observe_steps(&self, observer: Arc<dyn StepObserver>) -> bool {
        // Every route is told, not only until one says it batches.
        let told: Vec<bool> = (self.shared.routes.iter())
            .map(|r| r.proposer.observe_steps(observer.clone()))
            .collect();
        told.contains(&true)
    }

    fn observe_routes(&self, observer: Arc<dyn RouteObserver>) -> Vec<String> {
        let s = &self.shared;
        s.observers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
        s.routes.iter().map(|r| r.name.clone()).collect()
    }

    fn warm_up(&self) -> Result<(), ProposeError> {
        self.shared
            .routes
            .iter()
            .try_for_each(|r| r.proposer.warm_up())
    }
}

/// One generation: the chosen route's session once its first rows arrived.
struct RoutedSession {
    shared: Arc<Shared>,
    sampling: SamplingParams,
    chosen: Option<Box<dyn ProposerSession>>,
}

impl RoutedSession {
    /// The chosen session, choosing by `tokens` (the default route without them).
    fn session(&mut self, tokens: &[u32]) -> Result<&mut Box<dyn ProposerSession>, ProposeError> {
        let session = match self.chosen.take() {
            Some(session) => session,
            None => self.choose(tokens)?,
        };
        Ok(self.chosen.insert(session))
    }

    /// Opens the session of the route `tokens` choose and tells the observers.
    fn choose(&self, tokens: &[u32]) -> Result<Box<dyn ProposerSession>, ProposeError> {
        let s = &self.shared;
        let route = s.router.route(tokens).unwrap_or(s.default);
        let session = s.routes[route].proposer.open(&self.sampling)?;
        let name = &s.routes[route].name;
        for o in s.observers.read().unwrap_or_else(|e| e.into_inner()).iter() {
            o.routed(name);
        }
        Ok(session)
    }
}

impl ProposerSession for RoutedSession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        let tokens: &[u32] = match rows.tokens.len() == rows.rows() {
            true => &rows.tokens,
            false => &[],
        };
        self.session(tokens)?.extend(rows)
    }

    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        self.session(&[])?.propose(req)
    }
}

#[cfg(test)]
#[path = "routed_tests.rs"]
mod tests;
