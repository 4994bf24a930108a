//! A drafter and a verifier served on loopback inside this process, talking real gRPC: what
//! the benches use to measure speculation through the services.

use std::future::pending;

use anyhow::Result;
use tandem_engine::Engine;
use tokio::net::TcpListener;

use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;
use crate::serve::{self, DrafterOptions, VerifierOptions};

/// Running loopback services.
pub struct Loopback {
    /// The verifier's gRPC address (`http://127.0.0.1:port`).
    pub url: String,
    /// The verifier's engine (the same target, for in-process comparisons).
    pub engine: Engine,
}

/// Starts a drafter serving `drafter` and a verifier with server γ `gamma` (adaptive or
/// not) on the current tokio runtime; returns once both report SERVING.
pub async fn start(
    drafter: &DrafterArgs,
    models: &ModelArgs,
    gamma: usize,
    adaptive: bool,
) -> Result<Loopback> {
    let (service, d_registry) =
        serve::drafter_service(drafter, models, &DrafterOptions::default())?;
    let (d_grpc, d_metrics, d_url) = bind().await?;
    tokio::spawn(tandem_drafter::serve(
        service,
        d_registry,
        d_grpc,
        d_metrics,
        pending(),
    ));
    serve::wait_serving(&d_url).await?;
    let (service, registry) = serve::verifier_service(
        models,
        vec![d_url],
        &VerifierOptions::fixed(gamma, adaptive),
    )
    .await?;
    let engine = service.engine().clone();
    let (v_grpc, v_metrics, url) = bind().await?;
    tokio::spawn(tandem_verifier::serve(
        service,
        registry,
        v_grpc,
        v_metrics,
        pending(),
    ));
    serve::wait_serving(&url).await?;
    Ok(Loopback { url, engine })
}

/// A gRPC and a metrics listener on ports the OS picks, and the gRPC URL.
async fn bind() -> Result<(TcpListener, TcpListener, String)> {
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let metrics = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", grpc.local_addr()?);
    Ok((grpc, metrics, url))
}
