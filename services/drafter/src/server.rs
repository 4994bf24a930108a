//! Running the drafter: warm-up, then gRPC (Drafter, grpc.health.v1, reflection) on one
//! listener and Prometheus `/metrics` on another, until shutdown.

use std::future::Future;
use std::sync::Arc;

use tandem_core::{ProposeRequest, SamplingParams, SnapshotRows};
use tandem_proto::v1 as pb;
use tandem_telemetry::{serve_metrics, Registry};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::service::DrafterService;

/// Errors of starting or running the server.
pub type ServeError = Box<dyn std::error::Error + Send + Sync>;

/// Drafts one block on an all-zero context so the first real request pays no first-use
/// costs; the health status turns SERVING only after it.
pub fn warm_up(service: &DrafterService) -> Result<(), ServeError> {
    let proposer = service.proposer();
    let spec = proposer.snapshot_spec();
    let mut session = proposer.open(&SamplingParams::default())?;
    session.extend(&SnapshotRows {
        start: 0,
        width: spec.row_width(),
        data: vec![0.0; 2 * spec.row_width()],
    })?;
    session.propose(&ProposeRequest {
        anchor: 2,
        position: 2,
        gamma: proposer.max_gamma(),
    })?;
    Ok(())
}

/// Serves `service` on `grpc` and `registry` on `metrics` until `shutdown` resolves.
pub async fn serve(
    service: DrafterService,
    registry: Arc<Registry>,
    grpc: TcpListener,
    metrics: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter
        .set_not_serving::<pb::drafter_server::DrafterServer<DrafterService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = tokio::spawn(serve_metrics(metrics, registry, wait(stop_rx.clone())));
    let warm = service.clone();
    tokio::task::spawn_blocking(move || warm_up(&warm)).await??;
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter
        .set_serving::<pb::drafter_server::DrafterServer<DrafterService>>()
        .await;
    tracing::info!("drafter serving on {}", grpc.local_addr()?);
    let result = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(pb::drafter_server::DrafterServer::new(service))
        // Small messages go out at once: with Nagle's algorithm a reply written while the
        // peer's ACK of the last one is delayed waits for it (accepted sockets do not take
        // the builder's `tcp_nodelay`).
        .serve_with_incoming_shutdown(TcpIncoming::from(grpc).with_nodelay(Some(true)), shutdown)
        .await;
    let _ = stop_tx.send(true);
    metrics_task.await??;
    Ok(result?)
}

async fn wait(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
