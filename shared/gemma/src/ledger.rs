//! [`Ledger`]: the position bookkeeping every KV cache keeps, whatever holds its keys and
//! values (the CPU caches of Gemma 3 and Gemma 4, the device cache). It counts the
//! committed positions against the most the cache may hold and enforces the two rules of
//! a caller-owned cache: a block is appended exactly at the end and within the capacity,
//! and a rollback never goes past the end. [`LayerKv`] is the storage of one layer in both
//! CPU caches.

use crate::error::{GemmaError, Result};

/// Keys and values of one layer, f32 `[position, kv_heads * head_dim]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerKv {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
}

/// Committed positions of one cache (or of a batch advanced together) and its capacity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ledger {
    len: usize,
    max_len: usize,
}

impl Ledger {
    /// No committed position, at most `max_len`.
    pub(crate) fn new(max_len: usize) -> Self {
        Self { len: 0, max_len }
    }

    /// Committed positions.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The most positions the cache may hold.
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    /// Fails unless a block of `n` positions may be appended at `pos`: the end of the
    /// committed positions, with room for all `n`.
    pub(crate) fn check_append(&self, pos: usize, n: usize) -> Result<()> {
        if pos != self.len {
            return Err(GemmaError::Request(format!(
                "block starts at position {pos} but the cache holds {} positions",
                self.len
            )));
        }
        if pos + n > self.max_len {
            return Err(GemmaError::ContextFull {
                needed: pos + n,
                capacity: self.max_len,
            });
        }
        Ok(())
    }

    /// Marks `n` more positions as committed, once their keys and values are stored.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Rolls back to the first `len` positions; `len` may not exceed the committed length.
    pub(crate) fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(GemmaError::Request(format!(
                "cannot truncate a cache of {} positions to {len}",
                self.len
            )));
        }
        self.len = len;
        Ok(())
    }
}

/// The public `len`, `is_empty` and `max_len` of a cache type whose `ledger` field is a
/// [`Ledger`], the same on every cache.
macro_rules! ledger_accessors {
    () => {
        /// Committed positions.
        pub fn len(&self) -> usize {
            self.ledger.len()
        }

        /// Whether no position is committed.
        pub fn is_empty(&self) -> bool {
            self.ledger.len() == 0
        }

        /// The most positions this cache may hold.
        pub fn max_len(&self) -> usize {
            self.ledger.max_len()
        }
    };
}
pub(crate) use ledger_accessors;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_only_at_the_end() {
        let mut l = Ledger::new(10);
        assert!(l.check_append(0, 4).is_ok());
        l.commit(4);
        assert_eq!(l.len(), 4);
        assert!(matches!(l.check_append(3, 1), Err(GemmaError::Request(_))));
        assert!(matches!(l.check_append(5, 1), Err(GemmaError::Request(_))));
        assert!(l.check_append(4, 1).is_ok());
    }

    #[test]
    fn appends_only_within_capacity() {
        let mut l = Ledger::new(10);
        l.commit(8);
        assert!(l.check_append(8, 2).is_ok());
        assert!(matches!(
            l.check_append(8, 3),
            Err(GemmaError::ContextFull {
                needed: 11,
                capacity: 10
            })
        ));
        assert_eq!(l.max_len(), 10);
    }

    #[test]
    fn rolls_back_but_never_forward() {
        let mut l = Ledger::new(10);
        l.commit(6);
        assert!(matches!(l.truncate(7), Err(GemmaError::Request(_))));
        assert_eq!(l.len(), 6);
        assert!(l.truncate(6).is_ok());
        assert!(l.truncate(2).is_ok());
        assert_eq!(l.len(), 2);
        assert!(l.check_append(2, 8).is_ok());
        assert!(l.truncate(0).is_ok());
        assert_eq!(l.len(), 0);
    }
}
