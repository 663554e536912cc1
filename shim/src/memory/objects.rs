//! The per-process object table: every live object the ledger charged (device pointer, VMM
//! handle, array, mipmapped array, created context, malloc heap) -> the region device entry and the bytes
//! charged for it. Sharded by a hash of the object so 16 threads allocating and freeing at
//! once rarely meet on the same lock; each shard is a small `HashMap` behind a `Mutex` with a
//! multiplicative (Fibonacci) hash instead of SipHash, because keys are driver addresses and
//! handles, not attacker-chosen strings.
//!
//! **Address reuse.** The ledger learns of a free only AFTER the driver has freed (the refund
//! must never precede the physical release). In that window another thread may allocate and
//! get the very same address from the driver, and record it first. So a key holds a FIFO of
//! entries, oldest first: a free takes the OLDEST entry (the one whose free is in flight), a
//! new allocation queues behind it. Replacing the entry instead (and refunding the old one)
//! would let the late free remove the NEW allocation's charge while it lives: physical use
//! past the cap by up to one allocation (seen in the 4 x 16-thread race). Invariant: entries
//! under a key >= live allocations at that address, and a live one is always the newest.
//! It holds only when every object the driver may place at one address shares one key: all
//! device pointers are [`ObjectKind::Pointer`], whichever path made them and whichever path
//! frees them (a late `cuMemFreeAsync` of a pool allocation once found a newer `cuMemAlloc`
//! at its address first, in a namespace of its own, and refunded it while it lived).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// Which namespace an object key lives in (pointers and handles may share numeric values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ObjectKind {
    /// Every device pointer, whichever path made it: cuMemAlloc/Pitch/Managed, and the
    /// stream-ordered and pool allocations (those carry their pool in [`Charged::pool`] and
    /// 0 bytes: the pool is charged). One namespace, because the driver hands an address one
    /// path freed to the next allocation of any path, and any free path (`cuMemFree`,
    /// `cuMemFreeAsync`) may free any of them: a late free must take the entry of the object
    /// it freed, the OLDEST under the address, never a newer object of another path there.
    Pointer,
    Array,
    MipmappedArray,
    /// A context from cuCtxCreate.
    Context,
    /// A context's device-malloc heap past its size when first seen (`cuCtxSetLimit`), keyed
    /// by the context; one entry per context, replaced on each set, drained with the context.
    Heap,
}

/// What one charged object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    /// Region device entry index.
    pub device: u8,
    pub bytes: u64,
    /// For a pointer a memory pool handed out: the pool (0 otherwise).
    pub pool: u64,
    /// The context that owns the object (its destruction frees it); 0 = none/unknown.
    pub context: u64,
}

const SHARDS: usize = 64;

/// Fibonacci hashing of the key; the low 21 bits of device pointers are mostly zero
/// (2 MiB granularity), which the multiplication spreads over the high bits.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The entries under one key, oldest first (almost always exactly one; `later` only holds
/// entries while a free of the same address is in flight, and never allocates otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Queue {
    oldest: Charged,
    later: Vec<Charged>,
}

type Shard = Mutex<HashMapOf>;

/// The table. `insert` and `remove` touch one shard each.
pub struct ObjectTable {
    shards: Box<[Shard]>,
}

impl Default for ObjectTable {
    fn default() -> Self {
        ObjectTable {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

fn shard_of(kind: ObjectKind, key: u64) -> usize {
    let h = (key ^ ((kind as u64) << 59)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 58) as usize % SHARDS
}

impl ObjectTable {
    fn shard(&self, kind: ObjectKind, key: u64) -> std::sync::MutexGuard<'_, HashMapOf> {
        // A panic while holding a shard cannot leave a half-written map entry (insert/remove
        // are single operations), so a poisoned shard is still consistent.
        self.shards[shard_of(kind, key)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records an object, behind any entry still under the same key (module doc).
    pub fn insert(&self, kind: ObjectKind, key: u64, charged: Charged) {
        match self.shard(kind, key).entry((kind, key)) {
            Entry::Occupied(mut queue) => queue.get_mut().later.push(charged),
            Entry::Vacant(slot) => {
                slot.insert(Queue {
                    oldest: charged,
                    later: Vec::new(),
                });
            }
        }
    }

    /// Takes the oldest entry under the key.
    pub fn remove(&self, kind: ObjectKind, key: u64) -> Option<Charged> {
        let mut shard = self.shard(kind, key);
        let Entry::Occupied(mut queue) = shard.entry((kind, key)) else {
            return None;
        };
        if queue.get().later.is_empty() {
            return Some(queue.remove().oldest);
        }
        let next = queue.get_mut().later.remove(0);
        Some(std::mem::replace(&mut queue.get_mut().oldest, next))
    }

    /// The oldest entry under the key.
    pub fn get(&self, kind: ObjectKind, key: u64) -> Option<Charged> {
        self.shard(kind, key).get(&(kind, key)).map(|q| q.oldest)
    }

    /// Removes every object owned by `context` (the driver freed them with it).
    pub fn drain_context(&self, context: u64) -> Vec<((ObjectKind, u64), Charged)> {
        let mut drained = Vec::new();
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|key, queue| {
                let mut kept = Vec::new();
                for charged in std::iter::once(queue.oldest).chain(queue.later.drain(..)) {
                    if charged.context == context {
                        drained.push((*key, charged));
                    } else {
                        kept.push(charged);
                    }
                }
                if kept.is_empty() {
                    return false;
                }
                queue.oldest = kept.remove(0);
                queue.later = kept;
                true
            });
        }
        drained
    }

    /// Objects and bytes charged on `device` (diagnostics and tests).
    pub fn total_on(&self, device: u8) -> (usize, u64) {
        self.shards.iter().fold((0, 0), |(n, bytes), shard| {
            let map = shard.lock().unwrap_or_else(|p| p.into_inner());
            map.values()
                .flat_map(|q| std::iter::once(&q.oldest).chain(q.later.iter()))
                .filter(|c| c.device == device)
                .fold((n, bytes), |(n, b), c| (n + 1, b + c.bytes))
        })
    }
}

type HashMapOf = HashMap<(ObjectKind, u64), Queue, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn c(bytes: u64) -> Charged {
        Charged {
            device: 0,
            bytes,
            pool: 0,
            context: 1,
        }
    }

    #[test]
    fn kinds_are_separate_namespaces() {
        let table = ObjectTable::default();
        table.insert(ObjectKind::Pointer, 0x1000, c(1));
        table.insert(ObjectKind::Array, 0x1000, c(2));
        assert_eq!(table.remove(ObjectKind::Pointer, 0x1000), Some(c(1)));
        assert_eq!(table.remove(ObjectKind::Pointer, 0x1000), None);
        assert_eq!(table.get(ObjectKind::Array, 0x1000), Some(c(2)));
    }

    #[test]
    fn a_reused_address_queues_behind_the_free_in_flight() {
        let table = ObjectTable::default();
        // Thread A's 5 is freed by the driver; before A's free reaches the table, thread B
        // gets the same address for 7 and records it.
        table.insert(ObjectKind::Pointer, 0x20_0000, c(5));
        table.insert(ObjectKind::Pointer, 0x20_0000, c(7));
        assert_eq!(table.total_on(0), (2, 12));
        // A's late free takes A's entry; B's live allocation stays charged.
        assert_eq!(table.remove(ObjectKind::Pointer, 0x20_0000), Some(c(5)));
        assert_eq!(table.get(ObjectKind::Pointer, 0x20_0000), Some(c(7)));
        assert_eq!(table.remove(ObjectKind::Pointer, 0x20_0000), Some(c(7)));
        assert_eq!(table.remove(ObjectKind::Pointer, 0x20_0000), None);
    }

    #[test]
    fn a_late_stream_ordered_free_takes_its_own_entry_not_a_plain_allocation_at_its_address() {
        let table = ObjectTable::default();
        let from_pool = Charged { pool: 0x90, ..c(0) };
        // A pool allocation is freed by the driver; before its bookkeeping runs, a plain
        // cuMemAlloc gets the same address and records it.
        table.insert(ObjectKind::Pointer, 0x40_0000, from_pool);
        table.insert(ObjectKind::Pointer, 0x40_0000, c(32));
        assert_eq!(
            table.remove(ObjectKind::Pointer, 0x40_0000),
            Some(from_pool)
        );
        assert_eq!(table.get(ObjectKind::Pointer, 0x40_0000), Some(c(32)));
    }

    #[test]
    fn draining_a_context_keeps_other_entries_of_a_shared_key_in_order() {
        let table = ObjectTable::default();
        let in_ctx = |bytes, context| Charged {
            context,
            ..c(bytes)
        };
        table.insert(ObjectKind::Pointer, 1 << 21, in_ctx(1, 9));
        table.insert(ObjectKind::Pointer, 1 << 21, in_ctx(2, 1));
        table.insert(ObjectKind::Pointer, 1 << 21, in_ctx(3, 9));
        table.insert(ObjectKind::Pointer, 1 << 21, in_ctx(4, 1));
        assert_eq!(table.drain_context(9).len(), 2);
        assert_eq!(
            table.remove(ObjectKind::Pointer, 1 << 21),
            Some(in_ctx(2, 1))
        );
        assert_eq!(
            table.remove(ObjectKind::Pointer, 1 << 21),
            Some(in_ctx(4, 1))
        );
        assert_eq!(table.total_on(0), (0, 0));
    }

    #[test]
    fn sixteen_threads_insert_and_remove_without_losing_entries() {
        let table = ObjectTable::default();
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let table = &table;
                s.spawn(move || {
                    for i in 0..2000u64 {
                        let key = (t << 40) | (i << 21);
                        table.insert(ObjectKind::Pointer, key, c(2));
                        if i % 2 == 0 {
                            assert_eq!(table.remove(ObjectKind::Pointer, key), Some(c(2)));
                        }
                    }
                });
            }
        });
        assert_eq!(table.total_on(0), (16 * 1000, 16 * 1000 * 2));
    }

    #[test]
    fn destroying_a_context_drains_exactly_its_objects() {
        let table = ObjectTable::default();
        table.insert(ObjectKind::Pointer, 1 << 21, c(2));
        table.insert(ObjectKind::Array, 5, Charged { context: 2, ..c(4) });
        let drained = table.drain_context(1);
        assert_eq!(drained, vec![((ObjectKind::Pointer, 1 << 21), c(2))]);
        assert_eq!(table.total_on(0), (1, 4));
    }

    #[test]
    fn aligned_pointers_spread_over_shards() {
        let mut used = [false; SHARDS];
        for i in 0..1024u64 {
            used[shard_of(ObjectKind::Pointer, 0x7f00_0000_0000 + (i << 21))] = true;
        }
        assert!(used.iter().filter(|u| **u).count() > SHARDS / 2);
    }
}
