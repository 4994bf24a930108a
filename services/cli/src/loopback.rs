//! A drafter and a verifier served on loopback inside this process, talking real gRPC: what
//! the benches use to measure speculation through the services.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{anyhow, Result};
use tandem_engine::Engine;
use tandem_serving::{Running, Serve};
use tandem_verifier::VerifierSettings;

use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;
use crate::serve::{self, DrafterOptions, READY_WAIT};

/// Running loopback services; both stop when this is dropped, so it must outlive their use.
pub struct Loopback {
    url: String,
    engine: Engine,
    _servers: [Running; 2],
}

impl Loopback {
    /// The verifier's gRPC address (`http://127.0.0.1:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The verifier's engine (the same target, for in-process comparisons).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// Starts a drafter serving `drafter` and a verifier with server γ `gamma` (adaptive or
/// not) on the current tokio runtime; returns once both report SERVING.
pub async fn start(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    gamma: usize,
    adaptive: bool,
) -> Result<Loopback> {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let drain = VerifierSettings::default().drain_grace;
    let drafter = serve::drafter_server(drafter, models, &DrafterOptions::default(), drain)?;
    let d = drafter
        .spawn(serve::listen(any, any).await?)
        .map_err(|e| anyhow!("{e}"))?;
    d.wait_serving(READY_WAIT)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let settings = VerifierSettings {
        gamma,
        adaptive_gamma: adaptive,
        drafters: vec![d.url()],
        ..VerifierSettings::default()
    };
    let verifier = serve::verifier_server(models, settings).await?;
    let engine = verifier.engine().clone();
    let v = verifier
        .spawn(serve::listen(any, any).await?)
        .map_err(|e| anyhow!("{e}"))?;
    v.wait_serving(READY_WAIT)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    Ok(Loopback {
        url: v.url(),
        engine,
        _servers: [d, v],
    })
}
