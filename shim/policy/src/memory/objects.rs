//! The per-process object table: every live object the ledger charged (device pointer, VMM
//! handle, array, mipmapped array, created context) -> the region device entry and the bytes
//! charged for it. Sharded by a hash of the object so 16 threads allocating and freeing at
//! once rarely meet on the same lock; each shard is a small open-addressing table (linear
//! probing, backward-shift deletion, no tombstones) behind a spin lock, with a multiplicative
//! (Fibonacci) hash: keys are driver addresses and handles, not attacker-chosen strings. An
//! insert or remove is a lock, one hash and usually one probe (a generic `HashMap` cost three
//! times the instructions on the allocation path).
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

use std::cell::UnsafeCell;

use gpuslice_common::turn::{Turn, TurnGuard};

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
}

/// What one charged object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    /// Region device entry index.
    pub device: u8,
    pub bytes: u64,
    /// For a pointer a memory pool handed out: the pool (0 otherwise).
    pub pool: u64,
    /// The context that owns the object (its destruction frees it); 0 = none/unknown;
    /// [`OWNER_NOT_ASKED`] for a device pointer whose context the driver is asked for only
    /// when a context of the process is about to end ([`ObjectTable::pointers_not_asked`]).
    pub context: u64,
}

/// [`Charged::context`] of a device pointer charged without asking the driver for the
/// current context: in a process that sees one device, the allocation path does not need the
/// context to find the device, so the question (a driver call on every allocation) waits
/// until an answer is needed, before a context ends, and is asked then of the driver for
/// each pointer still alive (`cuPointerGetAttribute`), never guessed.
pub const OWNER_NOT_ASKED: u64 = u64::MAX;

const SHARDS: usize = 64;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hash of a key: Fibonacci hashing; the low 21 bits of device pointers are mostly zero
/// (2 MiB granularity), which the multiplication spreads over the high bits. The top 6 bits
/// pick the shard, the bits below them the bucket.
#[inline]
fn hash_of(kind: ObjectKind, key: u64) -> u64 {
    (key ^ ((kind as u64) << 59)).wrapping_mul(GOLDEN)
}

#[inline]
fn shard_of(kind: ObjectKind, key: u64) -> usize {
    (hash_of(kind, key) >> 58) as usize % SHARDS
}

/// One bucket: `kind` 0 = empty, else the object's kind + 1.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    kind: u8,
    key: u64,
    charged: Charged,
}

const EMPTY: Bucket = Bucket {
    kind: 0,
    key: 0,
    charged: Charged {
        device: 0,
        bytes: 0,
        pool: 0,
        context: 0,
    },
};

/// One shard: the oldest entry of each key in an open-addressing table, and the entries
/// queued behind one (a reused address whose free is in flight: rare) in arrival order.
#[derive(Default)]
struct Shard {
    buckets: Vec<Bucket>,
    len: usize,
    later: Vec<(ObjectKind, u64, Charged)>,
}

impl Shard {
    #[inline(always)]
    fn home(&self, kind: ObjectKind, key: u64) -> usize {
        // Bits below the shard's: spread within the shard.
        ((hash_of(kind, key) << 6) >> 32) as usize & (self.buckets.len() - 1)
    }

    /// The bucket holding `(kind, key)`, if any.
    #[inline(always)]
    fn find(&self, kind: ObjectKind, key: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let tag = kind as u8 + 1;
        let mut i = self.home(kind, key);
        loop {
            let bucket = &self.buckets[i];
            if bucket.kind == 0 {
                return None;
            }
            if bucket.key == key && bucket.kind == tag {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let capacity = (self.buckets.len() * 2).max(8);
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; capacity]);
        self.len = 0;
        for bucket in old.into_iter().filter(|b| b.kind != 0) {
            self.place(kind_of(bucket.kind), bucket.key, bucket.charged);
        }
    }

    /// Puts a key known to be absent into the table.
    #[inline]
    fn place(&mut self, kind: ObjectKind, key: u64, charged: Charged) {
        if (self.len + 1) * 2 > self.buckets.len() {
            self.grow();
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(kind, key);
        while self.buckets[i].kind != 0 {
            i = (i + 1) & mask;
        }
        self.buckets[i] = Bucket {
            kind: kind as u8 + 1,
            key,
            charged,
        };
        self.len += 1;
    }

    /// One probe run: the key's entry exists (queue behind it) or the first empty bucket
    /// takes it.
    #[inline(always)]
    fn insert(&mut self, kind: ObjectKind, key: u64, charged: Charged) {
        if (self.len + 1) * 2 > self.buckets.len() {
            self.grow();
        }
        let mask = self.buckets.len() - 1;
        let tag = kind as u8 + 1;
        let mut i = self.home(kind, key);
        loop {
            let bucket = &mut self.buckets[i];
            if bucket.kind == 0 {
                *bucket = Bucket {
                    kind: tag,
                    key,
                    charged,
                };
                self.len += 1;
                return;
            }
            if bucket.key == key && bucket.kind == tag {
                self.later.push((kind, key, charged));
                return;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline(always)]
    fn remove(&mut self, kind: ObjectKind, key: u64) -> Option<Charged> {
        let i = self.find(kind, key)?;
        let oldest = self.buckets[i].charged;
        if !self.later.is_empty() {
            if let Some(at) = self
                .later
                .iter()
                .position(|(k, x, _)| *k == kind && *x == key)
            {
                self.buckets[i].charged = self.later.remove(at).2;
                return Some(oldest);
            }
        }
        self.delete(i);
        Some(oldest)
    }

    /// Empties bucket `i`, shifting later members of its probe run back (so every key stays
    /// reachable from its home without tombstones).
    #[inline(always)]
    fn delete(&mut self, mut i: usize) {
        let mask = self.buckets.len() - 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if self.buckets[j].kind == 0 {
                break;
            }
            let next = self.buckets[j];
            let home = self.home(kind_of(next.kind), next.key);
            // `next` may move back to `i` unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.buckets[i] = next;
                i = j;
            }
        }
        self.buckets[i] = EMPTY;
        self.len -= 1;
    }

    /// Every entry, oldest first per key.
    fn entries(&self) -> impl Iterator<Item = (ObjectKind, u64, Charged)> + '_ {
        self.buckets
            .iter()
            .filter(|b| b.kind != 0)
            .map(|b| (kind_of(b.kind), b.key, b.charged))
            .chain(self.later.iter().copied())
    }
}

fn kind_of(tag: u8) -> ObjectKind {
    match tag {
        1 => ObjectKind::Pointer,
        2 => ObjectKind::Array,
        3 => ObjectKind::MipmappedArray,
        _ => ObjectKind::Context,
    }
}

/// A shard behind a spin lock: held for one table operation (tens of instructions; a growth
/// or a context's drain now and then), by this process's threads only, so a `Mutex`'s
/// poisoning and futex bookkeeping (a third of an insert) buy nothing. A waiter that spins
/// long yields the CPU to the holder.
#[derive(Default)]
struct Locked {
    busy: Turn,
    shard: UnsafeCell<Shard>,
}

// SAFETY: `shard` is only reached through `Guard`, which the `busy` turn makes exclusive.
// A panic inside a table operation (only an allocation failure could, which aborts) leaves no
// half-written entry: the guard's drop giving the turn back is always right.
unsafe impl Sync for Locked {}

/// The shard's turn held (`_turn` gives it back when dropped).
struct Guard<'a> {
    locked: &'a Locked,
    _turn: TurnGuard<'a>,
}

impl Locked {
    #[inline(always)]
    fn lock(&self) -> Guard<'_> {
        Guard {
            _turn: self.busy.take(),
            locked: self,
        }
    }
}

impl std::ops::Deref for Guard<'_> {
    type Target = Shard;
    #[inline]
    fn deref(&self) -> &Shard {
        // SAFETY: the guard holds the shard's flag: no other reference exists.
        unsafe { &*self.locked.shard.get() }
    }
}

impl std::ops::DerefMut for Guard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Shard {
        // SAFETY: as for `deref`, and `&mut self` makes this the only use of the guard.
        unsafe { &mut *self.locked.shard.get() }
    }
}

/// The table. `insert` and `remove` touch one shard each.
pub struct ObjectTable {
    /// A fixed array: `shard_of` is below `SHARDS` by construction, so indexing needs no check.
    shards: Box<[Locked; SHARDS]>,
}

impl Default for ObjectTable {
    fn default() -> Self {
        ObjectTable {
            shards: Box::new(std::array::from_fn(|_| Locked::default())),
        }
    }
}

impl ObjectTable {
    #[inline(always)]
    fn shard(&self, kind: ObjectKind, key: u64) -> Guard<'_> {
        self.shards[shard_of(kind, key)].lock()
    }

    /// Records an object, behind any entry still under the same key (module doc).
    #[inline(always)]
    pub fn insert(&self, kind: ObjectKind, key: u64, charged: Charged) {
        self.shard(kind, key).insert(kind, key, charged);
    }

    /// Takes the oldest entry under the key.
    #[inline(always)]
    pub fn remove(&self, kind: ObjectKind, key: u64) -> Option<Charged> {
        self.shard(kind, key).remove(kind, key)
    }

    /// The oldest entry under the key.
    pub fn get(&self, kind: ObjectKind, key: u64) -> Option<Charged> {
        let shard = self.shard(kind, key);
        shard.find(kind, key).map(|i| shard.buckets[i].charged)
    }

    /// Removes every object owned by `context` (the driver freed them with it).
    pub fn drain_context(&self, context: u64) -> Vec<((ObjectKind, u64), Charged)> {
        let mut drained = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            if !shard.entries().any(|(_, _, c)| c.context == context) {
                continue;
            }
            // Rebuilt in the old order (oldest first per key), without the context's.
            let kept: Vec<_> = shard.entries().collect();
            *shard = Shard::default();
            for (kind, key, charged) in kept {
                if charged.context == context {
                    drained.push(((kind, key), charged));
                } else {
                    shard.insert(kind, key, charged);
                }
            }
        }
        drained
    }

    /// The device pointers charged with [`OWNER_NOT_ASKED`] (each address once).
    pub fn pointers_not_asked(&self) -> Vec<u64> {
        let mut keys = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            keys.extend(
                shard
                    .entries()
                    .filter(|&(kind, _, c)| {
                        kind == ObjectKind::Pointer && c.context == OWNER_NOT_ASKED
                    })
                    .map(|(_, key, _)| key),
            );
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The driver named `context` as the owner of the pointer `key` (0: it could not say, as
    /// for a pointer whose free is in flight): every entry under the key still unasked takes
    /// it. (Two entries under one address are a free in flight and an allocation that reused
    /// the address; the driver answers for the live one, and the older entry leaves with its
    /// free.)
    pub fn owner_learned(&self, key: u64, context: u64) {
        let mut shard = self.shard(ObjectKind::Pointer, key);
        if let Some(i) = shard.find(ObjectKind::Pointer, key) {
            let charged = &mut shard.buckets[i].charged;
            if charged.context == OWNER_NOT_ASKED {
                charged.context = context;
            }
        }
        for (kind, at, charged) in shard.later.iter_mut() {
            if *kind == ObjectKind::Pointer && *at == key && charged.context == OWNER_NOT_ASKED {
                charged.context = context;
            }
        }
    }

    /// Objects and bytes charged on `device` (diagnostics and tests).
    pub fn total_on(&self, device: u8) -> (usize, u64) {
        self.shards.iter().fold((0, 0), |(n, bytes), shard| {
            let shard = shard.lock();
            shard
                .entries()
                .filter(|(_, _, c)| c.device == device)
                .fold((n, bytes), |(n, b), (_, _, c)| (n + 1, b + c.bytes))
        })
    }
}

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
    fn unasked_owners_are_learned_once_and_drained_by_their_context() {
        let table = ObjectTable::default();
        let unasked = |bytes| Charged {
            context: OWNER_NOT_ASKED,
            ..c(bytes)
        };
        table.insert(ObjectKind::Pointer, 0x1000, unasked(1));
        table.insert(ObjectKind::Pointer, 0x2000, unasked(2));
        // A reused address: the free in flight and the new allocation, both unasked.
        table.insert(ObjectKind::Pointer, 0x2000, unasked(3));
        table.insert(ObjectKind::Pointer, 0x3000, c(4));
        table.insert(ObjectKind::Array, 0x4000, unasked(5));
        assert_eq!(
            table.pointers_not_asked(),
            vec![0x1000, 0x2000],
            "device pointers only, each address once, the asked one left out"
        );
        table.owner_learned(0x1000, 7);
        table.owner_learned(0x2000, 8);
        assert!(table.pointers_not_asked().is_empty());
        // Learned once: a later answer does not move an owner.
        table.owner_learned(0x1000, 9);
        let drained = |context| {
            let mut keys: Vec<_> = table
                .drain_context(context)
                .into_iter()
                .map(|((_, key), charged)| (key, charged.bytes))
                .collect();
            keys.sort_unstable();
            keys
        };
        assert_eq!(drained(9), vec![]);
        assert_eq!(drained(7), vec![(0x1000, 1)]);
        assert_eq!(drained(8), vec![(0x2000, 2), (0x2000, 3)]);
        assert_eq!(table.get(ObjectKind::Pointer, 0x3000), Some(c(4)));
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
    fn many_objects_in_one_table_survive_growth_and_out_of_order_removal() {
        let table = ObjectTable::default();
        let key = |i: u64| 0x7f00_0000_0000 + (i << 21);
        for i in 0..5000u64 {
            table.insert(ObjectKind::Pointer, key(i), c(i));
        }
        // Removed in a scattered order, so probe runs are shifted back many times.
        for i in (0..5000u64).filter(|i| i % 3 == 0) {
            assert_eq!(table.remove(ObjectKind::Pointer, key(i)), Some(c(i)));
        }
        for i in 0..5000u64 {
            let expected = (i % 3 != 0).then(|| c(i));
            assert_eq!(table.get(ObjectKind::Pointer, key(i)), expected, "{i}");
        }
        let left: u64 = (0..5000u64).filter(|i| i % 3 != 0).sum();
        assert_eq!(table.total_on(0), (3333, left));
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
