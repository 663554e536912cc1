//! The ledger's pure core: sizes as the device spends them, and charging against a
//! container-wide budget (the shared region in production, a counter in tests) with the
//! reserve-before-allocate discipline:
//!
//! 1. [`Ledger::charge`] reserves atomically (check and add in one step, so two processes
//!    cannot pass the check together); past the cap it reaps dead processes' slots and tries
//!    once more, then refuses with [`OutOfMemory`] having reserved nothing;
//! 2. the driver allocates;
//! 3. on failure the reservation is refunded; on success it is recorded under the object
//!    (the per-process [`ObjectTable`]) and, where the driver decides the real size (pitch,
//!    pools, contexts), [`Ledger::settle`] corrects the upper bound to the real figure; for
//!    pitch and contexts [`Ledger::settle_or_undo`] gives the object back to the driver when
//!    the real figure does not fit.
//!
//! Sizes: every allocation is charged rounded up to [`GRANULARITY`] (2 MiB, what
//! `cuMemGetAllocationGranularity` reports and what the device really maps). Real drivers
//! sub-allocate small sizes out of 2 MiB pages, so for many tiny allocations the ledger
//! over-charges: the safe direction (the cap can only be reached early, never passed).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

// The graph, pool and VMM books and the object table below are pure and import nothing of the
// ledger (graph memory's driver calls, which need the ledger, live above it in the shim's
// `driver_sized::graph_reservations`): the dependency runs one way, ledger -> book, so each book
// is read and tested alone.
use super::graph_book::GraphBook;
use super::objects::{Charged, ObjectKind, ObjectTable};
use super::pool_book::{Freed, PoolBook, PoolHomes, Settle};
use super::vmm_book::VmmBook;

/// The device's allocation granularity: every charge is a multiple of it.
pub const GRANULARITY: u64 = 2 << 20;

/// Bytes the device really spends on an allocation of `bytes`.
#[inline]
pub fn charge_size(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULARITY).saturating_mul(GRANULARITY)
}

/// Row pitch the driver may pick for `width` bytes: at most the next multiple of 512 (the
/// texture pitch alignment of every NVIDIA GPU so far). Only an upper bound for the
/// reservation; the real pitch the driver returns is what is charged.
#[inline]
pub fn pitch_upper_bound(width: u64) -> u64 {
    width.div_ceil(512).saturating_mul(512)
}

/// A reservation would pass the container's cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

/// Where charges go: the container-wide budget.
pub trait Budget {
    /// Adds `bytes` on `device` unless the total would pass the limit.
    fn reserve(&self, device: u8, bytes: u64) -> Result<(), OutOfMemory>;
    /// Gives `bytes` back on `device`.
    fn release(&self, device: u8, bytes: u64);
    /// Adds `bytes` on `device` even past the limit (memory the driver holds regardless).
    fn reserve_past_limit(&self, device: u8, bytes: u64);
    /// Frees the slots of dead processes (their memory is gone with them).
    fn reap_dead(&self);
}

/// How [`Ledger::settle_or_undo`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The object stays, charged its real size.
    Charged,
    /// The real size did not fit: the object was undone and nothing stays reserved; the
    /// caller answers `CUDA_ERROR_OUT_OF_MEMORY`.
    Undone,
    /// The real size did not fit and the undo failed: the object stays, charged its real
    /// size past the limit (the ledger matches what the driver holds; the caller logs it).
    PastLimit,
}

/// Primary-context bookkeeping of one device ordinal, following the driver's rules: a retain
/// of an inactive context makes it (and must be charged); the last release of an active one
/// ends it; a reset ends it but keeps the references ("resetting the primary context does
/// not release it"), so a retain after a reset makes it anew while the old references are
/// still released one by one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryContext {
    pub refs: u32,
    /// Whether the context exists on the device (it holds memory).
    pub active: bool,
    pub handle: u64,
    /// (device entry, bytes) charged for it while active.
    pub charge: Option<(u8, u64)>,
}

impl PrimaryContext {
    /// Whether the next retain makes the context (so it must be reserved and measured).
    pub fn retain_creates(&self) -> bool {
        !self.active
    }

    /// A retain succeeded. `made` = what the driver made when [`Self::retain_creates`]:
    /// its handle and what stays charged for it.
    pub fn retained(&mut self, made: Option<(u64, Option<(u8, u64)>)>) {
        self.refs = self.refs.saturating_add(1);
        if let Some((handle, charge)) = made {
            self.active = true;
            self.handle = handle;
            self.charge = charge;
        }
    }

    /// A release succeeded: the context it ended (to refund), if it was the last reference
    /// of an active context.
    pub fn released(&mut self) -> Option<PrimaryContext> {
        self.refs = self.refs.saturating_sub(1);
        if self.refs == 0 {
            self.end()
        } else {
            None
        }
    }

    /// A reset succeeded: the context it ended, if active. The references stay.
    pub fn reset(&mut self) -> Option<PrimaryContext> {
        self.end()
    }

    fn end(&mut self) -> Option<PrimaryContext> {
        if !self.active {
            return None;
        }
        let ended = *self;
        self.active = false;
        self.charge = None;
        Some(ended)
    }
}

/// Which device each of the process's recent contexts is on, so that an allocation in the
/// current context asks the driver for the context only (`cuCtxGetCurrent`), not also for its
/// device: a context's device never changes, and every teardown of a context the shim sees
/// ([`Ledger::context_destroyed`]) forgets it before its handle can be reused. Direct-mapped,
/// a few entries; a miss asks the driver and remembers.
pub struct ContextDevices {
    entries: [ContextEntry; CONTEXT_ENTRIES],
}

const CONTEXT_ENTRIES: usize = 16;

#[derive(Default)]
struct ContextEntry {
    /// 0 = empty (no context has handle 0).
    context: AtomicU64,
    ordinal: AtomicI32,
}

impl Default for ContextDevices {
    fn default() -> Self {
        ContextDevices {
            entries: std::array::from_fn(|_| ContextEntry::default()),
        }
    }
}

impl ContextDevices {
    #[inline]
    fn entry(&self, context: u64) -> &ContextEntry {
        let index = (context.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize;
        &self.entries[index % CONTEXT_ENTRIES]
    }

    /// The device ordinal of `context`, if remembered.
    #[inline]
    pub fn get(&self, context: u64) -> Option<i32> {
        let entry = self.entry(context);
        if context == 0 || entry.context.load(Ordering::SeqCst) != context {
            return None;
        }
        let ordinal = entry.ordinal.load(Ordering::SeqCst);
        // Still the same context after reading the ordinal: no writer was replacing it.
        (entry.context.load(Ordering::SeqCst) == context).then_some(ordinal)
    }

    pub fn remember(&self, context: u64, ordinal: i32) {
        if context == 0 {
            return;
        }
        let entry = self.entry(context);
        entry.context.store(0, Ordering::SeqCst);
        entry.ordinal.store(ordinal, Ordering::SeqCst);
        entry.context.store(context, Ordering::SeqCst);
    }

    pub fn forget(&self, context: u64) {
        let entry = self.entry(context);
        let _ = entry
            .context
            .compare_exchange(context, 0, Ordering::SeqCst, Ordering::Relaxed);
    }
}

/// What the driver placed by itself in a context (its stack, FIFO, heap, modules, local
/// memory), as the shim prices it before the call that places it: the ledger keeps the book
/// (`P` of [`Ledger`]) and refunds a context's part when the context ends.
pub trait PlacedCharges: Default {
    /// A context ended: the driver freed everything it placed there. What was charged for it
    /// (device entry, bytes), which the ledger refunds.
    fn context_gone(&mut self, context: u64) -> Option<(u8, u64)>;
}

/// One process's ledger: charges go to the budget `B`; `P` is the book of what the driver
/// placed by itself.
pub struct Ledger<B, P> {
    pub budget: B,
    pub objects: ObjectTable,
    /// The device of each recent context (see [`ContextDevices`]).
    pub contexts: ContextDevices,
    pub vmm: Mutex<VmmBook>,
    /// Also serialises pool allocations with their reading (see `pool_book`).
    pub pools: Mutex<PoolBook>,
    /// Which device each pool this process learned of lives on (see `pool_book::PoolHomes`).
    pub pool_homes: Mutex<PoolHomes>,
    /// Primary contexts by device ordinal; also serialises context creation.
    pub primaries: Mutex<Vec<PrimaryContext>>,
    /// The devices' CUDA graph memory pools (see `graph_book`).
    pub graphs: Mutex<GraphBook>,
    /// Set once this process allocated from a pool (reporting then re-reads pools).
    pub objects_have_pools: AtomicBool,
    /// What the driver places by itself, as priced (the shim's `driver_sized::placed`); also
    /// serialises those prices with their driver calls.
    pub placed: Mutex<P>,
}

/// Locks a mutex whose data stays consistent even if a holder panicked (each critical section
/// is a handful of single-step updates).
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl<B: Budget, P: PlacedCharges> Ledger<B, P> {
    pub fn new(budget: B) -> Self {
        Ledger {
            budget,
            objects: ObjectTable::default(),
            contexts: ContextDevices::default(),
            vmm: Mutex::default(),
            pools: Mutex::default(),
            pool_homes: Mutex::default(),
            primaries: Mutex::new(Vec::new()),
            graphs: Mutex::default(),
            objects_have_pools: AtomicBool::new(false),
            placed: Mutex::default(),
        }
    }

    /// Reserves `bytes` on `device`; past the cap, reaps dead processes and tries once more.
    #[inline(always)]
    pub fn charge(&self, device: u8, bytes: u64) -> Result<(), OutOfMemory> {
        if bytes == 0 || self.budget.reserve(device, bytes).is_ok() {
            return Ok(());
        }
        self.charge_after_reap(device, bytes)
    }

    #[cold]
    #[inline(never)]
    fn charge_after_reap(&self, device: u8, bytes: u64) -> Result<(), OutOfMemory> {
        self.budget.reap_dead();
        self.budget.reserve(device, bytes)
    }

    #[inline(always)]
    pub fn refund(&self, device: u8, bytes: u64) {
        if bytes > 0 {
            self.budget.release(device, bytes);
        }
    }

    /// Corrects a reservation of `reserved` bytes to the `actual` bytes the driver spent. The
    /// allocation already exists, so a correction upward that the cap refuses is still
    /// recorded as far as possible and reported as `Err` (the caller logs it).
    pub fn settle(&self, device: u8, reserved: u64, actual: u64) -> Result<(), OutOfMemory> {
        if actual < reserved {
            self.refund(device, reserved - actual);
            Ok(())
        } else if actual > reserved {
            self.charge(device, actual - reserved)
        } else {
            Ok(())
        }
    }

    /// Settles an object created under a reservation of `reserved` bytes that really costs
    /// `actual`. When the cap refuses the difference, `undo` gives the object back to the
    /// driver (true = done) and the reservation is refunded; if the undo fails, the excess is
    /// charged past the limit. The reservation is held until the undo is over, so no one else
    /// can take its room in the meantime.
    pub fn settle_or_undo(
        &self,
        device: u8,
        reserved: u64,
        actual: u64,
        undo: impl FnOnce() -> bool,
    ) -> Settled {
        if self.settle(device, reserved, actual).is_ok() {
            return Settled::Charged;
        }
        if undo() {
            self.refund(device, reserved);
            Settled::Undone
        } else {
            self.budget
                .reserve_past_limit(device, actual.saturating_sub(reserved));
            Settled::PastLimit
        }
    }

    /// Records a charged object. An entry still under the same key is kept: its free is in
    /// flight and will take it (see `objects`, "Address reuse").
    #[inline(always)]
    pub fn track(&self, kind: ObjectKind, key: u64, charged: Charged) {
        self.objects.insert(kind, key, charged);
    }

    /// The driver freed an object: refund what it was charged. Unknown objects (never
    /// charged, e.g. IPC imports or allocations on unlimited devices) change nothing.
    #[inline(always)]
    pub fn untrack(&self, kind: ObjectKind, key: u64) -> Option<Charged> {
        let charged = self.objects.remove(kind, key)?;
        self.refund(charged.device, charged.bytes);
        Some(charged)
    }

    /// Charges `bytes` the driver already holds on `device`: within the cap when they fit,
    /// else past it, so the ledger matches the card and a later refund never gives back bytes
    /// that were not charged. False when it went past the cap (the caller logs it).
    pub fn charge_held(&self, device: u8, bytes: u64) -> bool {
        if self.charge(device, bytes).is_ok() {
            return true;
        }
        self.budget.reserve_past_limit(device, bytes);
        false
    }

    /// A context was destroyed: the driver freed every object it owned. A pool destroyed
    /// with allocations outstanding is released with the last of them (see `pool_book`); live
    /// pools are re-read by the caller.
    pub fn context_destroyed(&self, context: u64) {
        if context == 0 {
            return;
        }
        self.contexts.forget(context);
        let placed = lock(&self.placed).context_gone(context);
        if let Some((device, bytes)) = placed {
            self.refund(device, bytes);
        }
        for ((kind, _), charged) in self.objects.drain_context(context) {
            self.refund(charged.device, charged.bytes);
            if kind == ObjectKind::Pointer && charged.pool != 0 {
                let freed = lock(&self.pools).freed(charged.pool);
                if let Freed::Settled(Settle::Shrink { device, bytes }) = freed {
                    self.refund(device, bytes);
                }
            }
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// What the driver placed, per context: (device entry, bytes charged).
    #[derive(Default)]
    pub struct Priced(pub std::collections::HashMap<u64, (u8, u64)>);

    impl PlacedCharges for Priced {
        fn context_gone(&mut self, context: u64) -> Option<(u8, u64)> {
            self.0.remove(&context)
        }
    }

    type TestLedger = Ledger<CounterBudget, Priced>;

    /// A budget of `limit` bytes on every device, with a count of reaps.
    pub struct CounterBudget {
        pub limit: u64,
        pub used: [AtomicU64; 4],
        pub reaps: AtomicUsize,
        /// Bytes a reap frees (a dead process's share).
        pub freed_by_reap: AtomicU64,
    }

    impl CounterBudget {
        pub fn new(limit: u64) -> Self {
            CounterBudget {
                limit,
                used: Default::default(),
                reaps: AtomicUsize::new(0),
                freed_by_reap: AtomicU64::new(0),
            }
        }
        pub fn used(&self, d: u8) -> u64 {
            self.used[d as usize].load(Ordering::SeqCst)
        }
    }

    impl Budget for CounterBudget {
        fn reserve(&self, device: u8, bytes: u64) -> Result<(), OutOfMemory> {
            self.used[device as usize]
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    u.checked_add(bytes).filter(|n| *n <= self.limit)
                })
                .map(|_| ())
                .map_err(|_| OutOfMemory)
        }
        fn release(&self, device: u8, bytes: u64) {
            self.used[device as usize].fetch_sub(bytes, Ordering::SeqCst);
        }
        fn reserve_past_limit(&self, device: u8, bytes: u64) {
            self.used[device as usize].fetch_add(bytes, Ordering::SeqCst);
        }
        fn reap_dead(&self) {
            self.reaps.fetch_add(1, Ordering::SeqCst);
            let freed = self.freed_by_reap.swap(0, Ordering::SeqCst);
            self.used[0].fetch_sub(freed, Ordering::SeqCst);
        }
    }

    const MIB: u64 = 1 << 20;

    fn obj(bytes: u64, context: u64) -> Charged {
        Charged {
            device: 0,
            bytes,
            pool: 0,
            context,
        }
    }

    #[test]
    fn sizes_round_to_the_granularity_and_pitch_to_512() {
        assert_eq!(charge_size(0), 0);
        assert_eq!(charge_size(1), 2 * MIB);
        assert_eq!(charge_size(2 * MIB), 2 * MIB);
        assert_eq!(charge_size(2 * MIB + 1), 4 * MIB);
        assert_eq!(charge_size(u64::MAX), u64::MAX, "saturates: always refused");
        assert_eq!(pitch_upper_bound(1000), 1024);
        assert_eq!(pitch_upper_bound(1024), 1024);
    }

    #[test]
    fn past_the_cap_reaps_once_then_refuses_with_nothing_reserved() {
        let ledger = TestLedger::new(CounterBudget::new(10 * MIB));
        ledger.charge(0, 8 * MIB).unwrap();
        assert_eq!(ledger.charge(0, 4 * MIB), Err(OutOfMemory));
        assert_eq!(ledger.budget.reaps.load(Ordering::SeqCst), 1);
        assert_eq!(ledger.budget.used(0), 8 * MIB);
        // A dead process held 4 MiB of it: the reap makes room and the retry succeeds.
        ledger.budget.freed_by_reap.store(4 * MIB, Ordering::SeqCst);
        ledger.charge(0, 4 * MIB).unwrap();
        assert_eq!(ledger.budget.used(0), 8 * MIB);
    }

    #[test]
    fn settle_corrects_an_upper_bound_both_ways() {
        let ledger = TestLedger::new(CounterBudget::new(10 * MIB));
        ledger.charge(0, 6 * MIB).unwrap();
        ledger.settle(0, 6 * MIB, 4 * MIB).unwrap();
        assert_eq!(ledger.budget.used(0), 4 * MIB);
        ledger.settle(0, 4 * MIB, 8 * MIB).unwrap();
        assert_eq!(ledger.budget.used(0), 8 * MIB);
        assert_eq!(ledger.settle(0, 8 * MIB, 12 * MIB), Err(OutOfMemory));
    }

    #[test]
    fn a_real_size_past_the_cap_is_undone_or_else_charged_past_the_limit() {
        let ledger = TestLedger::new(CounterBudget::new(10 * MIB));
        // Fits: charged the real size, the object is not touched.
        ledger.charge(0, 4 * MIB).unwrap();
        let settled = ledger.settle_or_undo(0, 4 * MIB, 6 * MIB, || panic!("no undo"));
        assert_eq!(settled, Settled::Charged);
        assert_eq!(ledger.budget.used(0), 6 * MIB);
        // Smaller than the bound: the difference goes back.
        ledger.charge(0, 4 * MIB).unwrap();
        let settled = ledger.settle_or_undo(0, 4 * MIB, 2 * MIB, || panic!("no undo"));
        assert_eq!(settled, Settled::Charged);
        assert_eq!(ledger.budget.used(0), 8 * MIB);
        // Past the cap: undone, with the reservation held until the undo is over, then
        // refunded; the cap's reap was tried first.
        ledger.charge(0, 2 * MIB).unwrap();
        let reaps = ledger.budget.reaps.load(Ordering::SeqCst);
        let settled = ledger.settle_or_undo(0, 2 * MIB, 4 * MIB, || {
            assert_eq!(
                ledger.budget.used(0),
                10 * MIB,
                "still reserved during the undo"
            );
            true
        });
        assert_eq!(settled, Settled::Undone);
        assert_eq!(ledger.budget.reaps.load(Ordering::SeqCst), reaps + 1);
        assert_eq!(ledger.budget.used(0), 8 * MIB, "nothing stays reserved");
        // The undo fails: the ledger matches what the driver holds, past the cap, and the
        // next reservation is refused.
        ledger.charge(0, 2 * MIB).unwrap();
        let settled = ledger.settle_or_undo(0, 2 * MIB, 6 * MIB, || false);
        assert_eq!(settled, Settled::PastLimit);
        assert_eq!(ledger.budget.used(0), 14 * MIB);
        assert_eq!(ledger.charge(0, 2 * MIB), Err(OutOfMemory));
    }

    #[test]
    fn frees_refund_known_objects_and_ignore_unknown_ones() {
        let ledger = TestLedger::new(CounterBudget::new(100 * MIB));
        ledger.charge(0, 4 * MIB).unwrap();
        ledger.track(ObjectKind::Pointer, 0x20_0000, obj(4 * MIB, 1));
        assert_eq!(ledger.untrack(ObjectKind::Pointer, 0xdead), None);
        assert_eq!(ledger.budget.used(0), 4 * MIB);
        assert!(ledger.untrack(ObjectKind::Pointer, 0x20_0000).is_some());
        assert_eq!(ledger.budget.used(0), 0);
    }

    #[test]
    fn primary_contexts_follow_the_drivers_retain_release_and_reset_rules() {
        let charge = Some((0u8, 300 * MIB));
        let mut p = PrimaryContext::default();
        assert!(p.retain_creates());
        p.retained(Some((0xc0, charge)));
        assert!(!p.retain_creates());
        p.retained(None);
        assert_eq!(p.released(), None, "one reference left");
        let ended = p.released().expect("the last release ends it");
        assert_eq!((ended.handle, ended.charge), (0xc0, charge));
        assert!(p.retain_creates());
        assert_eq!(p.released(), None, "a stray release ends nothing");

        // Retain, reset, retain, release: the driver's context is alive again with one
        // reference, so it must stay charged.
        p.retained(Some((0xc0, charge)));
        assert_eq!(p.reset().map(|e| e.charge), Some(charge));
        assert_eq!(p.reset(), None, "already ended");
        assert!(p.retain_creates(), "a retain after a reset makes it anew");
        p.retained(Some((0xc0, charge)));
        assert_eq!(p.released(), None, "the reference from before the reset");
        assert_eq!(p.charge, charge);
        assert!(p.released().is_some(), "the last one ends it");

        // Reset, then the old reference released: nothing more to end.
        p.retained(Some((0xc0, charge)));
        assert!(p.reset().is_some());
        assert_eq!(p.released(), None);
        assert_eq!((p.refs, p.active, p.charge), (0, false, None));
    }

    #[test]
    fn destroying_a_context_refunds_what_it_owned() {
        let ledger = TestLedger::new(CounterBudget::new(100 * MIB));
        for (key, ctx) in [(1u64, 7u64), (2, 7), (3, 8)] {
            ledger.charge(0, 2 * MIB).unwrap();
            ledger.track(ObjectKind::Pointer, key << 21, obj(2 * MIB, ctx));
        }
        ledger.context_destroyed(7);
        assert_eq!(ledger.budget.used(0), 2 * MIB);
    }

    #[test]
    fn a_destroyed_context_is_forgotten_before_its_handle_can_name_another_device() {
        let ledger = TestLedger::new(CounterBudget::new(100 * MIB));
        assert_eq!(ledger.contexts.get(0xc0), None);
        ledger.contexts.remember(0xc0, 1);
        ledger.contexts.remember(0xd0, 2);
        assert_eq!(ledger.contexts.get(0xc0), Some(1));
        assert_eq!(ledger.contexts.get(0xd0), Some(2));
        ledger.context_destroyed(0xc0);
        assert_eq!(ledger.contexts.get(0xc0), None, "asked afresh");
        assert_eq!(ledger.contexts.get(0xd0), Some(2));
        ledger.contexts.remember(0, 3);
        assert_eq!(
            ledger.contexts.get(0),
            None,
            "no context is never remembered"
        );
    }

    #[test]
    fn destroying_a_context_refunds_what_the_driver_placed_in_it() {
        let ledger = TestLedger::new(CounterBudget::new(100 * MIB));
        // Priced for context 7 (its heap, stack, modules: `driver_sized::placed`).
        ledger.charge(0, 30 * MIB).unwrap();
        lock(&ledger.placed).0.insert(7, (0, 30 * MIB));
        ledger.charge(0, 2 * MIB).unwrap();
        ledger.track(ObjectKind::Pointer, 7, obj(2 * MIB, 8));
        ledger.context_destroyed(7);
        assert_eq!(ledger.budget.used(0), 2 * MIB);
        ledger.context_destroyed(7);
        assert_eq!(ledger.budget.used(0), 2 * MIB, "refunded once");
    }

    #[test]
    fn destroying_a_context_releases_a_destroyed_pool_with_its_last_allocation() {
        let ledger = TestLedger::new(CounterBudget::new(100 * MIB));
        let pool = |context| Charged {
            device: 0,
            bytes: 0,
            pool: 0x90,
            context,
        };
        ledger.charge(0, 64 * MIB).unwrap();
        {
            let mut book = lock(&ledger.pools);
            book.settle(0x90, 0, 64 * MIB);
            book.allocated(0x90, 0);
            book.allocated(0x90, 0);
            assert_eq!(book.destroyed(0x90), Settle::Unchanged);
        }
        ledger.track(ObjectKind::Pointer, 1 << 21, pool(7));
        ledger.track(ObjectKind::Pointer, 2 << 21, pool(8));
        ledger.context_destroyed(7);
        assert_eq!(
            ledger.budget.used(0),
            64 * MIB,
            "one allocation still holds it"
        );
        ledger.context_destroyed(8);
        assert_eq!(ledger.budget.used(0), 0);
    }

    #[test]
    fn memory_the_driver_holds_is_charged_past_the_cap_if_need_be() {
        let ledger = TestLedger::new(CounterBudget::new(10 * MIB));
        assert!(ledger.charge_held(0, 8 * MIB));
        assert!(!ledger.charge_held(0, 4 * MIB));
        assert_eq!(ledger.budget.used(0), 12 * MIB);
        ledger.refund(0, 12 * MIB);
        assert_eq!(ledger.budget.used(0), 0, "refunds match what was charged");
    }

    #[test]
    fn sixteen_threads_never_pass_the_cap_and_lose_nothing() {
        let ledger = TestLedger::new(CounterBudget::new(64 * MIB));
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let ledger = &ledger;
                s.spawn(move || {
                    for i in 0..500u64 {
                        let key = (t << 40) | (i << 21);
                        if ledger.charge(0, 6 * MIB).is_ok() {
                            assert!(ledger.budget.used(0) <= 64 * MIB);
                            ledger.track(ObjectKind::Pointer, key, obj(6 * MIB, 1));
                            ledger.untrack(ObjectKind::Pointer, key).unwrap();
                        }
                    }
                });
            }
        });
        assert_eq!(ledger.budget.used(0), 0);
    }
}
