//! Admission control: a generation runs only when a concurrency slot is free and its KV
//! cache (at most prompt + max_tokens + γ + 1 positions) fits the budget; others wait in
//! arrival order. A request that could never fit is refused at once.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::VerifierError;
use crate::metrics::VerifierMetrics;

/// Budget granularity: permits are KiB of KV cache.
const KIB: usize = 1024;

/// Slots and KV budget shared by all requests.
pub struct Admission {
    slots: Arc<Semaphore>,
    kv: Arc<Semaphore>,
    kv_kib: usize,
    metrics: Arc<VerifierMetrics>,
}

/// Held while a generation runs; frees its slot and budget when dropped.
pub struct Permit {
    _slot: OwnedSemaphorePermit,
    held: OwnedSemaphorePermit,
    kv: Arc<Semaphore>,
    kv_kib: usize,
    metrics: Arc<VerifierMetrics>,
}

impl Admission {
    /// At most `max_concurrent` generations and `kv_bytes` of KV cache at once.
    pub fn new(max_concurrent: usize, kv_bytes: usize, metrics: Arc<VerifierMetrics>) -> Self {
        let kv_kib = (kv_bytes / KIB).clamp(1, Semaphore::MAX_PERMITS);
        metrics.kv_usage.set(0.0);
        Self {
            slots: Arc::new(Semaphore::new(max_concurrent.max(1))),
            kv: Arc::new(Semaphore::new(kv_kib)),
            kv_kib,
            metrics,
        }
    }

    /// Waits until a generation needing `bytes` of KV cache may run.
    pub async fn admit(&self, bytes: usize) -> Result<Permit, VerifierError> {
        let need = bytes.div_ceil(KIB).max(1);
        if need > self.kv_kib {
            return Err(VerifierError::ResourceExhausted(format!(
                "the request needs {} MiB of KV cache, more than the server's budget of {} MiB; lower max_tokens",
                need / KIB,
                self.kv_kib / KIB
            )));
        }
        let need = u32::try_from(need)
            .map_err(|_| VerifierError::ResourceExhausted("request too large".into()))?;
        self.metrics.queued.increment(1.0);
        let waiting = Queued(&self.metrics);
        let slot = Arc::clone(&self.slots).acquire_owned().await;
        let kv = Arc::clone(&self.kv).acquire_many_owned(need).await;
        drop(waiting);
        let closed = || VerifierError::Unavailable("the server is shutting down".into());
        let permit = Permit {
            _slot: slot.map_err(|_| closed())?,
            held: kv.map_err(|_| closed())?,
            kv: Arc::clone(&self.kv),
            kv_kib: self.kv_kib,
            metrics: Arc::clone(&self.metrics),
        };
        permit.report();
        Ok(permit)
    }
}

/// Counts a request as queued until admitted or abandoned.
struct Queued<'a>(&'a VerifierMetrics);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.decrement(1.0);
    }
}

impl Permit {
    fn report(&self) {
        let used = self.kv_kib - self.kv.available_permits();
        self.metrics.kv_usage.set(used as f64 / self.kv_kib as f64);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let held = self.held.num_permits();
        let used = self.kv_kib - self.kv.available_permits() - held;
        self.metrics.kv_usage.set(used as f64 / self.kv_kib as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tandem_telemetry::Registry;

    fn admission(slots: usize, kib: usize) -> (Admission, Arc<Registry>) {
        let registry = Arc::new(Registry::new());
        let metrics = Arc::new(VerifierMetrics::new(&registry, 4));
        (Admission::new(slots, kib * KIB, metrics), registry)
    }

    fn gauge(r: &Registry, name: &str) -> f64 {
        let text = r.render();
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default();
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    #[tokio::test]
    async fn requests_wait_for_slots_and_budget_and_oversized_ones_are_refused() {
        let (a, r) = admission(2, 100);
        assert!(matches!(
            a.admit(101 * KIB).await,
            Err(VerifierError::ResourceExhausted(_))
        ));
        let first = a.admit(60 * KIB).await.expect("fits");
        assert_eq!(gauge(&r, "tandem_kv_cache_usage_ratio"), 0.6);
        let second = tokio::time::timeout(Duration::from_millis(50), a.admit(50 * KIB)).await;
        assert!(second.is_err(), "waits while the budget is taken");
        assert_eq!(
            gauge(&r, "tandem_queued_requests"),
            0.0,
            "an abandoned wait is not queued"
        );
        drop(first);
        assert_eq!(gauge(&r, "tandem_kv_cache_usage_ratio"), 0.0);
        let (_b, _c) = (
            a.admit(50 * KIB).await.expect("b"),
            a.admit(50 * KIB).await.expect("c"),
        );
        assert_eq!(gauge(&r, "tandem_kv_cache_usage_ratio"), 1.0);
        let third = tokio::time::timeout(Duration::from_millis(50), a.admit(KIB)).await;
        assert!(third.is_err(), "both slots are taken");
    }
}
