//! The slots of a [`super::DeviceBatch`]'s KV pool: which are free, and the cache a
//! sequence holds one through ([`SlotCache`]: its slot and its committed positions; the
//! keys and values stay in the pool). A dropped cache frees its slot for the next sequence.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Result;
use crate::ledger::{ledger_accessors, Ledger};

/// The free slots of one pool, shared by the sequences that take them.
pub struct DeviceSlots {
    free: Mutex<Vec<usize>>,
    positions: usize,
}

impl DeviceSlots {
    /// `count` free slots of `positions` positions each.
    pub(super) fn new(count: usize, positions: usize) -> Self {
        Self {
            free: Mutex::new((0..count).rev().collect()),
            positions,
        }
    }

    /// A cache of at most `max_len` positions in a free slot; `None` where every slot is
    /// held or `max_len` is longer than a slot.
    pub fn take(self: &Arc<Self>, max_len: usize) -> Option<SlotCache> {
        if max_len > self.positions {
            return None;
        }
        let slot = self.free().pop()?;
        Some(SlotCache {
            slot,
            ledger: Ledger::new(max_len),
            slots: self.clone(),
        })
    }

    /// Positions a slot holds: the longest sequence [`Self::take`] gives a slot to.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Slots no sequence holds now.
    pub fn available(&self) -> usize {
        self.free().len()
    }

    fn free(&self) -> MutexGuard<'_, Vec<usize>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One sequence's KV cache in a pool's slot: its keys and values live in the pool, at
/// the slot's rows; the cache counts its committed positions.
pub struct SlotCache {
    pub(super) slot: usize,
    pub(super) ledger: Ledger,
    slots: Arc<DeviceSlots>,
}

impl SlotCache {
    ledger_accessors!();

    /// Rolls back to the first `len` positions.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.ledger.truncate(len)
    }

    /// Whether its slot belongs to `slots`.
    pub(super) fn is_of(&self, slots: &Arc<DeviceSlots>) -> bool {
        Arc::ptr_eq(&self.slots, slots)
    }
}

impl Drop for SlotCache {
    fn drop(&mut self) {
        self.slots.free().push(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots go to one sequence at a time, come back when its cache is dropped, and a
    /// sequence longer than a slot gets none.
    #[test]
    fn slots_are_held_once_and_freed_on_drop() {
        let slots = Arc::new(DeviceSlots::new(2, 100));
        assert!(slots.take(101).is_none());
        let a = slots.take(100).expect("a slot");
        let b = slots.take(10).expect("another slot");
        assert_ne!(a.slot, b.slot);
        assert!(slots.take(10).is_none(), "both slots are held");
        assert_eq!(slots.available(), 0);
        let freed = a.slot;
        drop(a);
        assert_eq!(slots.available(), 1);
        let c = slots.take(50).expect("the freed slot");
        assert_eq!((c.slot, c.len(), c.max_len()), (freed, 0, 50));
        assert!(c.is_of(&slots) && !c.is_of(&Arc::new(DeviceSlots::new(1, 1))));
    }
}
