//! Drafters and a verifier served on loopback inside this process, talking real gRPC: what
//! the benches use to measure speculation through the services, and what `tandem bench
//! soak` loads (two drafters, one of them killed and started again on its address). The
//! verifier serves its OpenAI-compatible HTTP API too (`tandem bench http`).

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{anyhow, Context, Result};
use tandem_engine::{BatchLimits, Engine};
use tandem_serving::{Running, Serve};
use tandem_verifier::VerifierSettings;

use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;
use crate::serve::{self, DrafterOptions, READY_WAIT};

/// Running loopback services; all stop when this is dropped, so it must outlive their use.
pub struct Loopback {
    url: String,
    http: SocketAddr,
    engine: Engine,
    verifier: Running,
    drafters: Vec<Option<Running>>,
    drafter_addrs: Vec<SocketAddr>,
}

impl Loopback {
    /// The verifier's gRPC address (`http://127.0.0.1:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The verifier's HTTP API address.
    pub fn http(&self) -> SocketAddr {
        self.http
    }

    /// The verifier's engine (the same target, for in-process comparisons).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The verifier's `/metrics` address.
    pub fn verifier_metrics(&self) -> SocketAddr {
        self.verifier.metrics
    }

    /// The `/metrics` addresses of the drafters running now.
    pub fn drafter_metrics(&self) -> Vec<SocketAddr> {
        self.drafters.iter().flatten().map(|d| d.metrics).collect()
    }

    /// Kills drafter `i` as if its process died (no drain; its connections fail at once).
    pub async fn kill_drafter(&mut self, i: usize) -> Result<()> {
        let running = self.drafters[i]
            .take()
            .with_context(|| format!("drafter {i} is not running"))?;
        running.kill().await;
        Ok(())
    }

    /// Starts drafter `i` again on the address it had; returns once it reports SERVING.
    pub async fn restart_drafter(
        &mut self,
        i: usize,
        drafter: &DrafterArgs,
        models: &ModelArgs,
    ) -> Result<()> {
        let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        self.drafters[i] = Some(start_drafter(drafter, models, self.drafter_addrs[i], any).await?);
        Ok(())
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
    let settings = VerifierSettings {
        gamma,
        adaptive_gamma: adaptive,
        ..VerifierSettings::default()
    };
    start_with(drafter, models, 1, settings).await
}

/// Starts `drafters` drafters serving `drafter` and a verifier with `settings` drafting
/// through them (its `drafters` are set here), batching as the servers do by default;
/// returns once all report SERVING.
pub async fn start_with(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    drafters: usize,
    settings: VerifierSettings,
) -> Result<Loopback> {
    start_batched(
        drafter,
        models,
        drafters,
        settings,
        Some(BatchLimits::default()),
    )
    .await
}

/// [`start_with`], the verifier's generations batched as `batching` says.
pub async fn start_batched(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    drafters: usize,
    settings: VerifierSettings,
    batching: Option<BatchLimits>,
) -> Result<Loopback> {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut running = Vec::with_capacity(drafters);
    for _ in 0..drafters {
        running.push(start_drafter(drafter, models, any, any).await?);
    }
    let settings = VerifierSettings {
        drafters: running.iter().map(Running::url).collect(),
        ..settings
    };
    let verifier = serve::verifier_server(models, settings, batching).await?;
    let engine = verifier.engine().clone();
    let listeners = serve::listen(any, any)
        .await?
        .with_http(any)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let v = verifier.spawn(listeners).map_err(|e| anyhow!("{e}"))?;
    v.wait_serving(READY_WAIT)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    Ok(Loopback {
        url: v.url(),
        http: v.http.context("the verifier serves no HTTP")?,
        engine,
        verifier: v,
        drafter_addrs: running.iter().map(|d| d.grpc).collect(),
        drafters: running.into_iter().map(Some).collect(),
    })
}

/// A drafter serving `drafter` on `grpc` and `metrics`, once it reports SERVING.
pub(crate) async fn start_drafter(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    grpc: SocketAddr,
    metrics: SocketAddr,
) -> Result<Running> {
    let drain = VerifierSettings::default().drain_grace;
    let server = serve::drafter_server(drafter, models, &DrafterOptions::from_env()?, drain)?;
    let running = server
        .spawn(serve::listen(grpc, metrics).await?)
        .map_err(|e| anyhow!("{e}"))?;
    running
        .wait_serving(READY_WAIT)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    Ok(running)
}
