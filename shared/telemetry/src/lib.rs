//! Prometheus metrics for tandem's services: each service owns a [`Registry`] (a
//! metrics-exporter-prometheus recorder that is *not* installed globally, so a drafter and a
//! verifier can share a process, as in `tandem up` and the end-to-end tests) and serves it
//! on its own port with [`serve_metrics`]. Histograms use fixed buckets so that
//! `histogram_quantile` works in recording rules.

use std::future::Future;
use std::sync::Arc;

use axum::routing::get;
pub use metrics::{Counter, Gauge, Histogram};
use metrics::{Key, Label, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

/// Buckets (seconds) of latency histograms: 1 ms to 60 s.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
];

/// Buckets of the per-round acceptance length (tokens emitted per round).
pub const LENGTH_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 12.0, 16.0, 17.0,
];

/// Buckets of per-step batch sizes (sessions or token rows in one batched forward).
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0,
];

const METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One service's metrics.
pub struct Registry {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry: `*_seconds` histograms get [`SECONDS_BUCKETS`], histograms named
    /// `*acceptance_length` get [`LENGTH_BUCKETS`], `*_per_step` ones [`BATCH_BUCKETS`].
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Suffix("acceptance_length".into()),
                    LENGTH_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Suffix("_per_step".into()), BATCH_BUCKETS)
            })
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        Self { recorder, handle }
    }

    /// A counter with `help` text.
    pub fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, String)],
    ) -> Counter {
        self.recorder
            .describe_counter(name.into(), None, SharedString::const_str(help));
        self.recorder
            .register_counter(&key(name, labels), &METADATA)
    }

    /// A gauge with `help` text.
    pub fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, String)],
    ) -> Gauge {
        self.recorder
            .describe_gauge(name.into(), None, SharedString::const_str(help));
        self.recorder.register_gauge(&key(name, labels), &METADATA)
    }

    /// A histogram with `help` text.
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, String)],
    ) -> Histogram {
        self.recorder
            .describe_histogram(name.into(), None, SharedString::const_str(help));
        self.recorder
            .register_histogram(&key(name, labels), &METADATA)
    }

    /// The Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label::new(*k, v.clone()))
        .collect();
    Key::from_parts(name, labels)
}

/// Serves `GET /metrics` from `registry` on `listener` until `shutdown` resolves.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let registry = Arc::clone(&registry);
            async move {
                (
                    [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                    registry.render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn registries_are_independent_and_render_text() {
        let (a, b) = (Registry::new(), Registry::new());
        a.counter("tandem_x_total", "x", &[("position", "1".into())])
            .increment(3);
        b.counter("tandem_x_total", "x", &[]).increment(1);
        a.histogram("tandem_y_seconds", "y", &[]).record(0.02);
        let text = a.render();
        assert!(text.contains("tandem_x_total{position=\"1\"} 3"), "{text}");
        assert!(
            text.contains("tandem_y_seconds_bucket{le=\"0.025\"} 1"),
            "{text}"
        );
        assert!(text.contains("# HELP tandem_x_total x"), "{text}");
        assert!(b.render().contains("tandem_x_total 1"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_endpoint_serves_the_registry() -> std::io::Result<()> {
        let registry = Arc::new(Registry::new());
        registry.gauge("tandem_g", "g", &[]).set(2.0);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(serve_metrics(listener, registry, std::future::pending()));
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("tandem_g 2"), "{body}");
        Ok(())
    }
}
