//! Admission control: a generation runs only when a concurrency slot is free and its KV
//! cache (at most prompt + max_tokens + γ + 1 positions) fits the budget; others wait in
//! arrival order, at most `max_queued` of them (more are refused with RESOURCE_EXHAUSTED).
//! A request that could never fit is refused at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::VerifierError;
use crate::metrics::{Refusal, VerifierMetrics};

/// Budget granularity: permits are KiB of KV cache.
const KIB: usize = 1024;

/// How much may run and wait.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Generations running at once.
    pub max_concurrent: usize,
    /// KV-cache bytes over all running generations.
    pub kv_bytes: usize,
    /// Requests waiting for admission at once.
    pub max_queued: usize,
}

/// Slots, KV budget and queue shared by all requests.
pub struct Admission {
    slots: Arc<Semaphore>,
    kv: Arc<Semaphore>,
    kv_kib: usize,
    waiting: AtomicUsize,
    max_queued: usize,
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
    /// Admission within `limits`.
    pub fn new(limits: Limits, metrics: Arc<VerifierMetrics>) -> Self {
        let kv_kib = (limits.kv_bytes / KIB).clamp(1, Semaphore::MAX_PERMITS);
        metrics.kv_usage.set(0.0);
        Self {
            slots: Arc::new(Semaphore::new(limits.max_concurrent.max(1))),
            kv: Arc::new(Semaphore::new(kv_kib)),
            kv_kib,
            waiting: AtomicUsize::new(0),
            max_queued: limits.max_queued,
            metrics,
        }
    }

    /// A permit at once when a slot and the budget are free.
    fn try_admit(&self, need: u32) -> Option<Permit> {
        let slot = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        let held = Arc::clone(&self.kv).try_acquire_many_owned(need).ok()?;
        Some(self.permit(slot, held))
    }

    fn permit(&self, slot: OwnedSemaphorePermit, held: OwnedSemaphorePermit) -> Permit {
        let permit = Permit {
            _slot: slot,
            held,
            kv: Arc::clone(&self.kv),
            kv_kib: self.kv_kib,
            metrics: Arc::clone(&self.metrics),
        };
        permit.report();
        permit
    }

    /// Waits until a generation needing `bytes` of KV cache may run.
    pub async fn admit(&self, bytes: usize) -> Result<Permit, VerifierError> {
        let need = bytes.div_ceil(KIB).max(1);
        if need > self.kv_kib {
            self.metrics.refused(Refusal::Invalid);
            return Err(VerifierError::ResourceExhausted(format!(
                "the request needs {} MiB of KV cache, more than the server's budget of {} MiB; lower max_tokens",
                need / KIB,
                self.kv_kib / KIB
            )));
        }
        let need = u32::try_from(need)
            .map_err(|_| VerifierError::ResourceExhausted("request too large".into()))?;
        if let Some(permit) = self.try_admit(need) {
            self.metrics.queue_time.record(0.0);
            return Ok(permit);
        }
        let arrived = std::time::Instant::now();
        let waiting = Queued::enter(self);
        if waiting.ahead >= self.max_queued {
            self.metrics.refused(Refusal::QueueFull);
            return Err(VerifierError::ResourceExhausted(format!(
                "the server is busy: {} requests already wait (the queue's limit); retry later",
                waiting.ahead
            )));
        }
        let slot = Arc::clone(&self.slots).acquire_owned().await;
        let kv = Arc::clone(&self.kv).acquire_many_owned(need).await;
        drop(waiting);
        self.metrics
            .queue_time
            .record(arrived.elapsed().as_secs_f64());
        let closed = || VerifierError::Unavailable("the server is shutting down".into());
        Ok(self.permit(slot.map_err(|_| closed())?, kv.map_err(|_| closed())?))
    }
}

/// Counts a request as queued until admitted or abandoned.
struct Queued<'a> {
    admission: &'a Admission,
    /// Requests that waited before this one.
    ahead: usize,
}

impl<'a> Queued<'a> {
    fn enter(admission: &'a Admission) -> Self {
        admission.metrics.queued.increment(1.0);
        let ahead = admission.waiting.fetch_add(1, Ordering::SeqCst);
        Self { admission, ahead }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.admission.waiting.fetch_sub(1, Ordering::SeqCst);
        self.admission.metrics.queued.decrement(1.0);
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
        let limits = Limits {
            max_concurrent: slots,
            kv_bytes: kib * KIB,
            max_queued: 1,
        };
        (Admission::new(limits, metrics), registry)
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

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_counts_it() {
        let (a, r) = admission(1, 100);
        let running = a.admit(KIB).await.expect("a free slot");
        let mut second = Box::pin(a.admit(KIB));
        let waited = tokio::time::timeout(Duration::from_millis(20), &mut second).await;
        assert!(waited.is_err(), "the second waits in the queue");
        assert_eq!(gauge(&r, "tandem_queued_requests"), 1.0);
        let third = a.admit(KIB).await;
        assert!(
            matches!(&third, Err(VerifierError::ResourceExhausted(m)) if m.contains("busy")),
            "{:?}",
            third.err()
        );
        let refused = r.render();
        assert!(
            refused.contains("tandem_refused_requests_total{reason=\"queue_full\"} 1"),
            "{refused}"
        );
        drop(running);
        let _second = second.await.expect("admitted once the slot is free");
    }
}
