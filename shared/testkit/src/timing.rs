//! One lock per test binary for tests whose assertions rest on measured timings. Cargo
//! runs a binary's tests on parallel threads, and on a 2-core machine a neighbour's
//! forwards share the cores with the timed ones: a plain step timed while a neighbour ran
//! and a verify timed while it slept make verification look free to an adaptive policy,
//! which then keeps drafting with a useless drafter. A timed test holds [`timed`] (no
//! other guarded test runs meanwhile); the other heavy tests of the binary hold [`shared`]
//! (they still run alongside one another).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static CORES: RwLock<()> = RwLock::new(());

/// Held by a test that times its work: waits until no guarded test runs, and keeps them
/// all out until dropped.
pub fn timed() -> RwLockWriteGuard<'static, ()> {
    CORES
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held by a heavy test that times nothing: runs alongside others like it, never alongside
/// a [`timed`] one.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    CORES
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_timed_test_runs_alone_and_shared_ones_together() {
        let running = Arc::new(AtomicUsize::new(0));
        let most_beside_timed = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let (running, most) = (running.clone(), most_beside_timed.clone());
                std::thread::spawn(move || {
                    if i % 3 == 0 {
                        let _g = timed();
                        running.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        most.fetch_max(running.load(Ordering::SeqCst) - 1, Ordering::SeqCst);
                        running.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        let _g = shared();
                        running.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().expect("thread"));
        assert_eq!(most_beside_timed.load(Ordering::SeqCst), 0);
    }
}
