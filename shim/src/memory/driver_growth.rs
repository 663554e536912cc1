//! Memory the driver takes on this process's account without an allocation call asking for
//! it (module images and their static data, loaded lazily at a kernel's first launch; local
//! memory grown for a kernel's stack; the stack and printf FIFO limits), learnt from the
//! driver's own word: NVML's `usedGpuMemory` of this process, reconciled with what the slice
//! charged this process's slot.
//!
//! Reconciliation, per device entry the process holds memory on: `own` is what the process's
//! calls charged (its slot's bytes, read before and after the NVML list, the larger kept, minus
//! what reconciliation itself charged); the driver's surplus is `usedGpuMemory - own`. That
//! surplus is charged to the slot, past the cap if need be (the driver holds it already), and
//! refunded as it shrinks (a module unloaded, a context ended). Reading the slot on both sides
//! of the NVML read keeps an allocation or a free in flight from passing for the driver's:
//! the ledger charges before the driver allocates and refunds after it frees.
//!
//! When it runs: after a call that may change what the driver holds on the process's own
//! account (a kernel or graph launch: lazy loading and local memory grow there; a module or
//! library load or a global's lookup; a context's end) it is due, and runs before the next
//! charge or memory view of the slice, or from this module's thread at the latest [`PERIOD`]
//! later; right after `cuCtxSetLimit`; and afresh before an allocation is refused. An idle
//! process never asks NVML. So a process's card bytes exceed what its slot is charged by at
//! most what the driver took since the last reconciliation, for at most [`PERIOD`] plus one
//! NVML read ([`BOUND`], what the node agent allows for); and its next allocation after the
//! driver grew is judged with the growth counted: when the growth took the slice over its
//! cap, allocations are refused until the slice is back under it. Not seen: fatbins the CUDA
//! runtime loads through its private driver interface under `CUDA_MODULE_LOADING=EAGER`
//! (lazy loading, the default, places them at a launch, which is seen); they are charged at
//! the process's next launch, charge or view.
//!
//! Needs this process's NVML PID (`session::host_pid`); while unknown nothing is reconciled.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use gpuslice_common::region::{DeviceId, MAX_DEVICES};

use super::{process, shared, Process, Shared};

/// How often the thread reconciles.
pub(crate) const PERIOD: Duration = Duration::from_millis(500);
/// How long a process's card bytes may exceed its charge (PERIOD plus a margin for one NVML
/// read on a loaded machine).
pub(crate) const BOUND: Duration = Duration::from_millis(1500);
const _: () = assert!(
    BOUND.as_millis() > PERIOD.as_millis(),
    "the bound covers a period"
);

crate::session::fork::per_process! {
    /// Bytes reconciliation has charged per device entry (this process's slot's).
    static TAKEN: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
}
crate::session::fork::per_process! {
    /// The "past its cap" line was written for the entry (until the surplus shrinks again).
    static WARNED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
}
crate::session::fork::per_process! {
    /// One reconciliation at a time; a caller that finds one running skips its own (that one
    /// reads the same driver). A flag, not a mutex: a fork child inherits no held lock.
    static BUSY: AtomicBool = AtomicBool::new(false);
}
crate::session::fork::per_process! {
    /// A launch or limit change since the last reconciliation (a fork child starts with one
    /// due: its slot starts empty while the driver may hold memory on its account). Also
    /// stored to (1, one byte) by the x86-64 launch fast path's machine code after the launch
    /// call (`hooks::launch`).
    pub(crate) static DIRTY: OwnLine = OwnLine(AtomicBool::new(false));
    after fork: OwnLine(AtomicBool::new(true));
}

/// A flag alone on its cache line: every launch stores to it.
#[repr(C, align(64))]
pub(crate) struct OwnLine(AtomicBool);

impl std::ops::Deref for OwnLine {
    type Target = AtomicBool;
    fn deref(&self) -> &AtomicBool {
        &self.0
    }
}

impl crate::session::fork::ForkReset for OwnLine {
    fn reset_to(&self, fresh: Self) {
        self.0.reset_to(fresh.0);
    }
}

crate::session::fork::per_process! {
    /// This process's reconciliation thread was started (a fork child has none).
    static STARTED: AtomicBool = AtomicBool::new(false);
}

/// A kernel launch returned (hot path: one relaxed store, no load or branch; the flag has a
/// cache line of its own, so the store disturbs no neighbouring data).
#[inline(always)]
pub fn launched() {
    DIRTY.store(true, Ordering::Relaxed);
}

/// A call after which the driver may hold more or less on this process's account (a
/// launch, a module or library load, a global's lookup, a context's end): the next
/// reconciliation, at the latest [`PERIOD`] from now, reads the driver's word.
#[inline]
pub(crate) fn driver_may_have_changed() {
    if !DIRTY.load(Ordering::Relaxed) {
        DIRTY.store(true, Ordering::Relaxed);
    }
}

/// Before a charge or a view: reconcile if something may have grown since the last time.
#[inline]
pub(crate) fn before_charge(process: &Process) {
    if DIRTY.load(Ordering::Relaxed) {
        reconcile(process);
    } else {
        ensure_started();
    }
}

/// After `cuCtxSetLimit` (the stack, the printf FIFO: sized by the driver).
pub(crate) fn after_limit_change() {
    if let Some(process) = process() {
        reconcile(process);
    }
}

/// Before an allocation is refused: when some surplus is charged, reconcile afresh, since it
/// may have been read while growth the shim charges only after the driver call (a pool's)
/// was not yet in the slot, and so counted twice. True when that gave bytes back.
pub(crate) fn recheck_before_refusing(process: &Process) -> bool {
    let charged = || TAKEN.iter().map(|t| t.load(Ordering::Relaxed)).sum::<u64>();
    let before = charged();
    if before == 0 {
        return false;
    }
    reconcile(process);
    charged() < before
}

/// The surplus to charge for one device entry: NVML's bytes for us minus what our calls
/// charged. `slot_before`/`slot_after`: the slot's bytes read around the NVML read.
pub(crate) fn surplus(nvml_used: u64, slot_before: u64, slot_after: u64, taken: u64) -> u64 {
    let own = slot_before.max(slot_after).saturating_sub(taken);
    nvml_used.saturating_sub(own)
}

/// One reconciliation of every device entry this process holds memory on.
pub(crate) fn reconcile(process: &Process) {
    ensure_started();
    if BUSY.swap(true, Ordering::Acquire) {
        return;
    }
    DIRTY.store(false, Ordering::Relaxed);
    if let (Some(shared), host_pid) = (shared(), crate::session::host_pid::known()) {
        if host_pid != 0 {
            reconcile_devices(shared, process, host_pid);
        }
    }
    BUSY.store(false, Ordering::Release);
}

fn reconcile_devices(shared: &Shared, process: &Process, host_pid: u32) {
    for index in 0..MAX_DEVICES {
        let Some(id) = DeviceId::from_index(index) else {
            continue;
        };
        let have = TAKEN[index].load(Ordering::Relaxed);
        let before = shared.region.slot_used(process.slot, id);
        if before == 0 && have == 0 {
            continue;
        }
        let Some(nvml_used) = nvml_used(shared, id, host_pid) else {
            continue;
        };
        let after = shared.region.slot_used(process.slot, id);
        let want = surplus(nvml_used, before, after, have);
        let device = index as u8;
        if want > have {
            let fits = process.ledger.charge_held(device, want - have);
            if !fits && !WARNED[index].swap(true, Ordering::Relaxed) {
                crate::log_warn!(
                    "the driver holds {want} bytes on this process's account that no allocation asked for (modules, local memory, limits); the slice is past its cap on device entry {device}: allocations are refused until it is back under"
                );
            }
        } else if want < have {
            process.ledger.refund(device, have - want);
            WARNED[index].store(false, Ordering::Relaxed);
        }
        if want != have {
            crate::log_debug!(
                "driver's own memory on device entry {device}: {want} bytes (was {have})"
            );
        }
        TAKEN[index].store(want, Ordering::Relaxed);
    }
}

/// NVML's `usedGpuMemory` for `host_pid` on the slice's device `id`.
fn nvml_used(shared: &Shared, id: DeviceId, host_pid: u32) -> Option<u64> {
    let uuid = shared.region.device_uuid(id);
    let handle = crate::ground::devices::real_nvml_handle(&uuid, None)?;
    let list = crate::ground::devices::nvml_compute_processes(handle).ok()?;
    list.iter()
        .find(|p| p.pid == host_pid)
        .map(|p| p.usedGpuMemory)
        .filter(|&b| b != u64::MAX)
}

/// Starts the thread once per process.
fn ensure_started() {
    if STARTED.load(Ordering::Relaxed) || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("gpuslice-growth".into())
        .stack_size(256 << 10)
        .spawn(|| loop {
            std::thread::sleep(PERIOD);
            // Only after a call that may have changed what the driver holds: an idle process
            // never asks NVML (a thousand processes asking twice a second each would load the
            // driver). A forked child's copy of this loop does not exist (threads do not
            // survive fork); its own starts at its first charge.
            if !DIRTY.load(Ordering::Relaxed) {
                continue;
            }
            if let Some(process) = process() {
                reconcile(process);
            }
        });
    if let Err(error) = spawned {
        crate::log_error!(
            "cannot start the driver-memory reconciliation ({error}): memory the driver takes on its own is charged only at allocations"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_surplus_is_what_the_driver_holds_beyond_what_calls_charged() {
        // 300 MiB context + 100 MiB allocations charged; the driver holds 460: 60 surplus.
        assert_eq!(surplus(460, 400, 400, 0), 60);
        // Already charged 60: unchanged.
        assert_eq!(surplus(460, 460, 460, 60), 60);
        // An allocation in flight (charged between the two slot reads, the driver already
        // counting it): the later read covers it, no surplus invented.
        assert_eq!(surplus(500, 400, 440, 0), 60);
        // A free in flight (the driver freed before its NVML read, the slot refunds after):
        // the earlier read covers it.
        assert_eq!(surplus(360, 400, 360, 0), 0);
        // The driver gave its own memory back: the surplus shrinks to 0.
        assert_eq!(surplus(400, 460, 460, 60), 0);
    }
}
