//! Assembling the drafter: [`Drafter::new`] takes a proposer and a [`DrafterConfig`] and
//! builds the whole service (metrics, the Drafter handlers); [`Serve::serve`]
//! (tandem-serving) runs it with health, reflection, `/metrics`, a warm-up before SERVING
//! and shutdown. The CLI and the tests assemble drafters only through here.

use std::sync::Arc;

use tandem_core::Proposer;
use tandem_proto::v1 as pb;
use tandem_serving::{App, Drain, Serve};
use tandem_telemetry::Registry;
use tonic::server::NamedService;
use tonic::service::Routes;

use crate::metrics::DrafterMetrics;
use crate::service::{DrafterConfig, DrafterService};

type Server = pb::drafter_server::DrafterServer<DrafterService>;

/// A drafter, assembled and ready to serve.
pub struct Drafter {
    service: DrafterService,
    registry: Arc<Registry>,
    drain: Arc<Drain>,
}

impl Drafter {
    /// A drafter serving `proposer` as `cfg` says.
    pub fn new(proposer: Arc<dyn Proposer>, cfg: DrafterConfig) -> Self {
        let registry = Arc::new(Registry::new());
        let metrics = DrafterMetrics::new(Arc::clone(&registry));
        match proposer.observe_steps(metrics.batches.clone()) {
            true => tracing::info!("blocks of sessions that ask at once are drafted in one pass"),
            false => tracing::info!("each session's blocks are drafted alone"),
        }
        let routes = proposer.observe_routes(metrics.routes.clone());
        if !routes.is_empty() {
            metrics.routes.register(&routes);
            tracing::info!("each session drafts with one of {routes:?}, chosen by its prompt");
        }
        let drain = Drain::new();
        Self {
            service: DrafterService::new(proposer, cfg, metrics, Arc::clone(&drain)),
            registry,
            drain,
        }
    }
}

impl Serve for Drafter {
    fn app(self) -> App {
        let proposer = Arc::clone(self.service.proposer());
        let cfg = self.service.config();
        let grace = cfg.drain_grace;
        let server =
            Server::new(self.service.clone()).max_decoding_message_size(cfg.max_message_bytes);
        App {
            routes: Routes::new(server),
            name: Server::NAME,
            registry: self.registry,
            // A session through every block length, so the first real request pays no
            // first-use costs.
            warm_up: Box::new(move || Ok(proposer.warm_up()?)),
            drain: self.drain,
            grace,
            http: None,
        }
    }
}
