//! Where a throttled process's host PID comes from and where it is kept when the memory
//! ledger does neither (a compute-only slice: no memory limit, so no context measurement
//! that would learn it and write it into the process's region slot).
//!
//! * **Learning it.** NVML names processes by host PID; in a container with its own PID
//!   namespace `getpid()` is another number and `NSpid` lists no outer PID. As the memory
//!   ledger does (`memory/host_pid.rs`), the process diffs NVML's running list around its
//!   FIRST context creation on a device: the one entry that appeared, claimed by no other
//!   process of the slice, is this process ([`around_context_creation`]). Several unclaimed
//!   entries appearing at once (contexts created in the same instant) teach nothing, and the
//!   process stays unresolved (steered on the whole device, towards the cap).
//! * **Keeping it.** The slice's PIDs are what the leader matches NVML's per-process samples
//!   against. The few shared throttle words hold 14; the region's process slots hold
//!   `MAX_PROCESSES` (1024), and every process of a configured slice has one (a
//!   compute-only process too: its slot holds no bytes). Only the memory ledger used to
//!   write the slot's host PID, at a measured context creation, which a compute-only slice
//!   never makes; the throttle now writes the one it found when the slot has none
//!   ([`record`]), so a slice of any size the region admits is matched whole.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::{CUdevice, CUresult};
use gpuslice_common::region::ProcessIdentity;
use gpuslice_common::MAX_DEVICES;

/// The host PID this process learned from a context creation (0 = none).
static LEARNED: AtomicU32 = AtomicU32::new(0);
/// A context creation on the device was already looked at (only the first can teach).
static TRIED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// The host PID a context creation showed, 0 = none.
pub fn learned() -> u32 {
    LEARNED.load(Ordering::Relaxed)
}

/// Pure: the one PID in `after` that is in neither `before` nor `claimed`.
pub fn appeared(before: &[u32], after: &[u32], claimed: &[u32]) -> Option<u32> {
    let mut new = after
        .iter()
        .copied()
        .filter(|p| *p != 0 && !before.contains(p) && !claimed.contains(p));
    let first = new.next()?;
    new.next().is_none().then_some(first)
}

/// Runs `call` (a context creation on `ordinal`), diffing NVML's running list around it when
/// this process has a compute share and does not know its host PID yet. Called by the
/// context-creation hooks for processes the memory ledger does not cover.
pub fn around_context_creation(ordinal: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let wanted = usize::try_from(ordinal)
        .ok()
        .filter(|&i| i < MAX_DEVICES)
        .is_some_and(|i| {
            LEARNED.load(Ordering::Relaxed) == 0
                && crate::session::mode::slice_config().is_some_and(super::config_throttles)
                && !TRIED[i].swap(true, Ordering::AcqRel)
        })
        && ProcessIdentity::current().is_none_or(|i| i.host_pid == 0);
    if !wanted {
        return call();
    }
    let uuid = crate::ground::devices::cuda_device_uuid(ordinal);
    let handle = super::measure::device_handle(&uuid, ordinal as u32);
    let before = handle.and_then(super::measure::running_pids);
    let result = call();
    if result == CUDA_SUCCESS {
        let after = handle.and_then(super::measure::running_pids);
        if let (Some(before), Some(after)) = (before, after) {
            match appeared(&before, &after, &super::region_host_pids()) {
                Some(pid) => {
                    LEARNED.store(pid, Ordering::Relaxed);
                    crate::log_debug!(
                        "device {ordinal}: the context creation showed this process as NVML PID {pid}"
                    );
                }
                None => crate::log_debug!(
                    "device {ordinal}: the context creation did not single this process out in NVML's list"
                ),
            }
        }
    }
    result
}

/// Records `pid` as this process's host PID in its slot of the slice's region (every
/// process of a configured slice has one, compute-only ones too), so the leader matches it
/// whatever the number of processes. A host PID the memory ledger already recorded stays
/// (it measured it). `false` = not recorded (no slot, or the ledger recorded another).
pub fn record(pid: u32) -> bool {
    let Some((region, slot)) = crate::memory::region() else {
        return false;
    };
    if pid == 0 {
        return false;
    }
    match super::region_host_pid() {
        0 => {
            region.set_host_pid(slot, pid);
            true
        }
        recorded => recorded == pid,
    }
}

/// Child side of fork: the slot and the learned PID were the parent's. Atomic stores only.
pub fn after_fork_in_child() {
    LEARNED.store(0, Ordering::Relaxed);
    for tried in &TRIED {
        tried.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_single_unclaimed_newcomer_is_taken() {
        assert_eq!(appeared(&[10, 11], &[10, 11, 12], &[]), Some(12));
        assert_eq!(appeared(&[10], &[10, 12, 13], &[]), None, "two at once");
        assert_eq!(appeared(&[10], &[10, 12, 13], &[13]), Some(12));
        assert_eq!(appeared(&[10], &[10], &[]), None, "nothing appeared");
        assert_eq!(appeared(&[10], &[10, 12], &[12]), None, "another's");
        assert_eq!(appeared(&[], &[0], &[]), None);
    }
}
