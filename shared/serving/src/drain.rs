//! Graceful drain. On a shutdown signal a server reports NOT_SERVING, its service refuses
//! new work (each unit of work holds an [`InFlight`] guard from [`Drain::enter`], which
//! fails once draining), and what is in flight may finish within a grace period before the
//! listeners close. Kubernetes wires it with a readiness probe on health, a preStop pause
//! and a termination grace period longer than the server's.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// Work in flight and whether the server drains.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

/// One unit of work (a generation, a drafting session); counted until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Drain>);

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Everything in flight finished.
    Idle,
    /// The grace period ran out with this much still in flight.
    GraceOver(usize),
}

impl Drain {
    /// Nothing in flight, not draining.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Counts one unit of work; `None` once the server drains (refuse the work).
    pub fn enter(self: &Arc<Self>) -> Option<InFlight> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(Arc::clone(self));
        (!self.is_draining()).then_some(guard)
    }

    /// Whether the server drains.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Units of work in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Refuses new work from now on and waits (up to `grace`) for what is in flight.
    pub async fn drain(&self, grace: Duration) -> Drained {
        self.draining.store(true, Ordering::SeqCst);
        let idle = async {
            loop {
                let changed = self.idle.notified();
                if self.in_flight() == 0 {
                    return;
                }
                changed.await;
            }
        };
        match tokio::time::timeout(grace, idle).await {
            Ok(()) => Drained::Idle,
            Err(_) => Drained::GraceOver(self.in_flight()),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn draining_refuses_new_work_and_waits_for_the_rest() {
        let drain = Drain::new();
        let first = drain.enter().expect("open");
        let second = drain.enter().expect("open");
        let waiting = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.drain(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(drain.is_draining());
        assert!(drain.enter().is_none(), "no new work while draining");
        assert_eq!(drain.in_flight(), 2, "a refused entry is not counted");
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "one is still in flight");
        drop(second);
        assert_eq!(waiting.await.expect("joins"), Drained::Idle);
    }

    #[tokio::test]
    async fn the_grace_period_bounds_the_wait() {
        let drain = Drain::new();
        let _stuck = drain.enter().expect("open");
        let ended = drain.drain(Duration::from_millis(30)).await;
        assert_eq!(ended, Drained::GraceOver(1));
    }
}
