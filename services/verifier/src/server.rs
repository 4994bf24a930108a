//! Running the verifier: warm-up, then gRPC (Generation, grpc.health.v1, reflection) on one
//! listener and Prometheus `/metrics` on another, until shutdown.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;

use tandem_engine::{GenerationRequest, Update};
use tandem_proto::v1 as pb;
use tandem_telemetry::{serve_metrics, Registry};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::service::GenerationService;

/// Errors of starting or running the server.
pub type ServeError = Box<dyn std::error::Error + Send + Sync>;

/// Generates two tokens so the first request pays no first-use costs.
pub fn warm_up(service: &GenerationService) -> Result<(), ServeError> {
    let engine = service.engine();
    let req = GenerationRequest {
        prompt: vec![engine.tokenizer().bos_id()],
        max_tokens: 2,
        ignore_eos: true,
        ..GenerationRequest::default()
    };
    engine.generate(&req, None, &mut |_: &Update| ControlFlow::Continue(()))?;
    Ok(())
}

/// Serves `service` on `grpc` and `registry` on `metrics` until `shutdown` resolves; health
/// turns SERVING after the warm-up.
pub async fn serve(
    service: GenerationService,
    registry: Arc<Registry>,
    grpc: TcpListener,
    metrics: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    type Server = pb::generation_server::GenerationServer<GenerationService>;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter.set_not_serving::<Server>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = tokio::spawn(serve_metrics(metrics, registry, wait(stop_rx)));
    let warm = service.clone();
    let warm_reporter = reporter.clone();
    tokio::spawn(async move {
        match tokio::task::spawn_blocking(move || warm_up(&warm)).await {
            Ok(Ok(())) => {
                warm_reporter
                    .set_service_status("", ServingStatus::Serving)
                    .await;
                warm_reporter.set_serving::<Server>().await;
            }
            Ok(Err(e)) => tracing::error!("warm-up failed: {e}"),
            Err(e) => tracing::error!("warm-up failed: {e}"),
        }
    });
    tracing::info!("verifier listening on {}", grpc.local_addr()?);
    let result = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(Server::new(service))
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
