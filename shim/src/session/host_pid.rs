//! This process's host-PID identity: which NVML process-list entry is this process, the one
//! place both policies learn it, keep it and read it. In a container with its own PID
//! namespace NVML reports HOST PIDs, which the container cannot see in its /proc. Method, in
//! order:
//!
//! 1. the kernel told us (`NSpid` in /proc/self/status lists the outer PID when the host
//!    namespace is visible), or the host-PID broker did (`gpuslice_common::host_pid_broker`:
//!    the node agent's socket, where the kernel translates our PID into the host's
//!    namespace): that PID, recorded at registration ([`registered_as`]); or the
//!    slice knows that NVML lists the processes of our PID namespace under their own PIDs (a
//!    process of the slice saw NVML list it so, [`measured`]; kept in the region): our own
//!    PID, at registration ([`with_known_host_pid`]) or before a context ([`adopt_known`]),
//!    with no measuring;
//! 2. otherwise, diff NVML's process list around this process's FIRST context creation on a
//!    device: the one entry that appeared (and is not already claimed by another slot of the
//!    region) is us ([`find_after_context_creation`]). The memory ledger does it under the
//!    slice's measuring lock, where the entry's `usedGpuMemory` is also the driver's
//!    per-context cost, and records it ([`measured`]); for a device the ledger does not
//!    cover, [`around_context_creation`] does it for a process with a compute share (only
//!    learnt, [`learned`], until the throttle's watcher sees it listed);
//! 3. otherwise (several processes created contexts in the same instant: processes of one
//!    slice take turns under `context_start`'s measuring lock, so these are processes outside
//!    it), the cost is still known when all new entries agree on it
//!    ([`cost_of_simultaneous_contexts`]), and later process-list reads match the one
//!    unclaimed entry whose usage equals what our ledger charged us ([`find_by_usage`]);
//! 4. the throttle's watcher takes the first of these that NVML lists, else our own PID
//!    (right when NVML and we share a PID namespace) ([`discover`]), and records it when the
//!    slot has none ([`offer`]).
//!
//! Kept: in this process's slot of the region (where every process of the slice, and the
//! node agent, read it) and in `HOST_PID`, the copy this process reads without a snapshot.
//! Both are per process: a fork child is another process, with another host PID.
//!
//! Failure mode: when no unique candidate exists the host PID stays unknown; the process is
//! then missing from the slice's process list (never another tenant's process shown in its
//! place), and the compute share is steered by the whole device's utilisation.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::{CUdevice, CUresult};
use gpuslice_common::host_pid_broker;
use gpuslice_common::region::{ProcessIdentity, Region};
use gpuslice_common::MAX_DEVICES;

use super::fork::per_process;

per_process! {
    /// This process's host PID as its slot records it (0 = unknown).
    static HOST_PID: AtomicU32 = AtomicU32::new(0);
}
per_process! {
    /// The host PID a context creation outside the ledger showed (0 = none): a candidate
    /// until NVML lists it ([`discover`]).
    static LEARNED: AtomicU32 = AtomicU32::new(0);
}
per_process! {
    /// A context creation on the device was already looked at (only the first can teach).
    static TRIED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
}
per_process! {
    /// Inode of this process's PID namespace as registered (0 = unknown).
    static PID_NAMESPACE: AtomicU64 = AtomicU64::new(0);
}

/// This process's host PID as its slot records it; 0 = unknown.
#[inline]
pub fn known() -> u32 {
    HOST_PID.load(Ordering::Acquire)
}

/// `identity` with its host PID filled in: where the slice knows NVML lists the processes of
/// its PID namespace under their own PIDs, our own PID; else the host-PID broker's word
/// (`gpuslice_common::host_pid_broker`: the node agent's socket, which the kernel makes tell
/// our PID in the host's namespace), asked once per process and at most
/// [`host_pid_broker::ASK_TIMEOUT`]; else unknown (measured at the first context).
pub(super) fn with_known_host_pid(region: &Region, identity: ProcessIdentity) -> ProcessIdentity {
    if identity.host_pid != 0 {
        return identity;
    }
    if identity.pid_ns != 0 && region.nvml_pid_namespace() == identity.pid_ns {
        return ProcessIdentity {
            host_pid: identity.pid,
            ..identity
        };
    }
    let Some(socket) = host_pid_broker::socket_from_env() else {
        return identity;
    };
    match host_pid_broker::ask(&socket, host_pid_broker::ASK_TIMEOUT) {
        Ok(host_pid) => {
            crate::log_debug!(
                "host PID {host_pid} from the host-PID broker at {}",
                socket.display()
            );
            ProcessIdentity {
                host_pid,
                ..identity
            }
        }
        Err(host_pid_broker::AskError::Absent) => identity,
        Err(why) => {
            crate::log_info!(
                "{}: {why}; this process's host PID is measured at its first context instead",
                socket.display()
            );
            identity
        }
    }
}

/// Registration recorded `identity` (its host PID: the kernel's or the slice's word, 0 =
/// none) in the new slot.
pub(super) fn registered_as(identity: &ProcessIdentity) {
    HOST_PID.store(identity.host_pid, Ordering::Release);
    PID_NAMESPACE.store(identity.pid_ns, Ordering::Relaxed);
}

/// Our host PID, learnt since registration from the slice's word on our PID namespace (a
/// process of the slice measured it meanwhile); `false` while unknown.
pub fn adopt_known() -> bool {
    if known() != 0 {
        return true;
    }
    let namespace = PID_NAMESPACE.load(Ordering::Relaxed);
    let Some(region) = super::slice::region() else {
        return false;
    };
    if namespace == 0 || region.nvml_pid_namespace() != namespace {
        return false;
    }
    record(std::process::id());
    true
}

/// A measured context creation (or NVML usage matching) showed this process as `pid`: kept,
/// and written to the slot. When that is our own PID, NVML lists our PID namespace's
/// processes under their own PIDs: the slice learns it, and its later processes of this
/// namespace need not measure.
pub fn measured(pid: u32) {
    record(pid);
    if pid == std::process::id() {
        if let Some(region) = super::slice::region() {
            region.learn_nvml_pid_namespace(PID_NAMESPACE.load(Ordering::Relaxed));
        }
    }
}

fn record(pid: u32) {
    if HOST_PID.swap(pid, Ordering::AcqRel) != pid {
        if let Some((region, slot)) = super::slice::registered() {
            region.set_host_pid(slot, pid);
        }
    }
}

/// Records `pid`, which NVML lists, as this process's host PID in its slot (every process
/// of a configured slice has one, compute-only ones too), so the leader matches it whatever
/// the number of processes. A host PID already recorded stays (the memory ledger measured
/// it). `false` = not recorded (no slot, or another one is recorded).
pub fn offer(pid: u32) -> bool {
    let Some((region, slot)) = super::slice::registered() else {
        return false;
    };
    if pid == 0 {
        return false;
    }
    match HOST_PID.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            region.set_host_pid(slot, pid);
            true
        }
        Err(recorded) => recorded == pid,
    }
}

/// The host PID a context creation showed, 0 = none.
pub fn learned() -> u32 {
    LEARNED.load(Ordering::Relaxed)
}

/// Host PIDs the region records for the slice's processes (ours included).
pub fn slice_host_pids() -> Vec<u32> {
    super::slice::region().map_or_else(Vec::new, |region| region.recorded_host_pids(None))
}

/// Host PIDs the region records for the slice's other processes.
pub fn claimed_by_others() -> Vec<u32> {
    let Some((region, me)) = super::slice::registered() else {
        return slice_host_pids();
    };
    region.recorded_host_pids(Some(me))
}

/// Which of NVML's `listed` PIDs is this process (see [`discover_pid`]).
pub fn discover(listed: &[u32]) -> Option<u32> {
    let kernel = ProcessIdentity::current().map_or(0, |i| i.host_pid);
    discover_pid(listed, kernel, known(), learned(), std::process::id())
}

/// Pure: which NVML PID is this process, from the running list on the device, the host PID
/// the kernel told us (0 = none), the one this process's slot records (0 = none), the one a
/// context creation showed ([`learned`], 0 = none) and our own PID (right when NVML and we
/// share a PID namespace).
pub fn discover_pid(
    listed: &[u32],
    kernel: u32,
    region: u32,
    learned: u32,
    me: u32,
) -> Option<u32> {
    [kernel, region, learned, me]
        .into_iter()
        .find(|&pid| pid != 0 && listed.contains(&pid))
}

/// Runs `call` (a context creation on `ordinal` the memory ledger does not measure), diffing
/// NVML's running list around it when this process has a compute share and does not know
/// its host PID yet.
pub fn around_context_creation(ordinal: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let wanted = usize::try_from(ordinal)
        .ok()
        .filter(|&i| i < MAX_DEVICES)
        .is_some_and(|i| {
            LEARNED.load(Ordering::Relaxed) == 0
                && super::state::slice_config().is_some_and(super::mode::config_throttles)
                && !TRIED[i].swap(true, Ordering::AcqRel)
        })
        && ProcessIdentity::current().is_none_or(|i| i.host_pid == 0);
    if !wanted {
        return call();
    }
    let uuid = crate::ground::devices::cuda_device_uuid(ordinal);
    let handle = crate::ground::devices::real_nvml_handle(&uuid, Some(ordinal as u32));
    let running = |handle| {
        crate::ground::devices::nvml_compute_processes(handle)
            .ok()
            .map(|list| list.iter().map(|p| p.pid).collect::<Vec<_>>())
    };
    let before = handle.and_then(running);
    let result = call();
    if result == CUDA_SUCCESS {
        let after = handle.and_then(running);
        if let (Some(before), Some(after)) = (before, after) {
            match appeared(&before, &after, &slice_host_pids()) {
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

/// Pure: the one PID in `after` that is in neither `before` nor `claimed`.
pub fn appeared(before: &[u32], after: &[u32], claimed: &[u32]) -> Option<u32> {
    let mut new = after
        .iter()
        .copied()
        .filter(|p| *p != 0 && !before.contains(p) && !claimed.contains(p));
    let first = new.next()?;
    new.next().is_none().then_some(first)
}

/// One entry of NVML's process list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedProcess {
    pub pid: u32,
    pub used: u64,
}

/// Largest per-context cost believed (a bigger reading means something else was counted).
pub const MAX_PLAUSIBLE_CONTEXT_BYTES: u64 = 8 << 30;

/// Step 1/2: our entry after the first context creation, from the lists before and after.
pub fn find_after_context_creation(
    before: &[ListedProcess],
    after: &[ListedProcess],
    known_host_pid: u32,
    claimed_by_others: &[u32],
) -> Option<ListedProcess> {
    if known_host_pid != 0 {
        return after.iter().copied().find(|e| e.pid == known_host_pid);
    }
    let mut appeared = after
        .iter()
        .copied()
        .filter(|e| !before.iter().any(|b| b.pid == e.pid) && !claimed_by_others.contains(&e.pid));
    let first = appeared.next()?;
    appeared.next().is_none().then_some(first)
}

/// When step 2 is ambiguous (processes outside the slice, or a starter that gave up waiting
/// for the measuring lock, created contexts in the same instant): the cost is still known if
/// every unclaimed entry that appeared shows the same bytes, since ours is one of them and
/// holds nothing but its new context. The host PID stays unknown (step 3 finds it later).
pub fn cost_of_simultaneous_contexts(
    before: &[ListedProcess],
    after: &[ListedProcess],
    claimed_by_others: &[u32],
) -> Option<u64> {
    let mut appeared = after
        .iter()
        .filter(|e| !before.iter().any(|b| b.pid == e.pid) && !claimed_by_others.contains(&e.pid))
        .map(|e| e.used);
    let first = appeared.next()?;
    appeared.all(|used| used == first).then_some(first)
}

/// Step 3: the one unclaimed entry using exactly `expected_used` bytes.
pub fn find_by_usage(
    list: &[ListedProcess],
    expected_used: u64,
    claimed_by_others: &[u32],
) -> Option<ListedProcess> {
    let mut matching = list
        .iter()
        .copied()
        .filter(|e| e.used == expected_used && !claimed_by_others.contains(&e.pid));
    let first = matching.next()?;
    matching.next().is_none().then_some(first)
}

/// The per-context cost an entry shows right after the first context, if plausible.
pub fn plausible_context_cost(entry: &ListedProcess) -> Option<u64> {
    (entry.used > 0 && entry.used <= MAX_PLAUSIBLE_CONTEXT_BYTES).then_some(entry.used)
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    fn p(pid: u32, used: u64) -> ListedProcess {
        ListedProcess { pid, used }
    }

    #[test]
    fn only_a_single_unclaimed_newcomer_is_taken() {
        assert_eq!(appeared(&[10, 11], &[10, 11, 12], &[]), Some(12));
        assert_eq!(appeared(&[10], &[10, 12, 13], &[]), None, "two at once");
        assert_eq!(appeared(&[10], &[10, 12, 13], &[13]), Some(12));
        assert_eq!(appeared(&[10], &[10], &[]), None, "nothing appeared");
        assert_eq!(appeared(&[10], &[10, 12], &[12]), None, "another's");
        assert_eq!(appeared(&[], &[0], &[]), None);
    }

    #[test]
    fn discovery_prefers_the_kernel_then_the_region_then_a_context_creation_then_our_own_pid() {
        assert_eq!(discover_pid(&[1, 900, 5], 900, 0, 0, 5), Some(900));
        assert_eq!(discover_pid(&[1, 1005, 5], 0, 1005, 0, 5), Some(1005));
        assert_eq!(discover_pid(&[1, 1007, 5], 0, 0, 1007, 5), Some(1007));
        assert_eq!(discover_pid(&[1, 5], 0, 0, 0, 5), Some(5));
        assert_eq!(
            discover_pid(&[1, 1005], 0, 0, 0, 5),
            None,
            "offset PIDs, nothing known"
        );
        assert_eq!(
            discover_pid(&[1, 1005], 900, 0, 1007, 5),
            None,
            "not listed: not trusted"
        );
    }

    #[test]
    fn a_known_host_pid_wins() {
        let after = [p(100, MIB), p(200, 300 * MIB)];
        assert_eq!(
            find_after_context_creation(&[], &after, 200, &[]),
            Some(p(200, 300 * MIB))
        );
    }

    #[test]
    fn the_single_new_entry_is_us() {
        let before = [p(100, MIB)];
        let after = [p(100, 5 * MIB), p(100_042, 300 * MIB)];
        assert_eq!(
            find_after_context_creation(&before, &after, 0, &[]),
            Some(p(100_042, 300 * MIB))
        );
    }

    #[test]
    fn two_new_entries_are_ambiguous_unless_one_is_claimed() {
        let after = [p(1, 300 * MIB), p(2, 300 * MIB)];
        assert_eq!(find_after_context_creation(&[], &after, 0, &[]), None);
        assert_eq!(
            find_after_context_creation(&[], &after, 0, &[1]),
            Some(p(2, 300 * MIB))
        );
    }

    #[test]
    fn simultaneous_new_entries_still_tell_the_cost_when_they_agree() {
        let before = [p(100, MIB)];
        let same = [p(100, 9 * MIB), p(1, 300 * MIB), p(2, 300 * MIB)];
        assert_eq!(
            cost_of_simultaneous_contexts(&before, &same, &[]),
            Some(300 * MIB)
        );
        // One of them already allocated past its context: which one is us is unknowable.
        let differ = [p(1, 300 * MIB), p(2, 364 * MIB)];
        assert_eq!(cost_of_simultaneous_contexts(&before, &differ, &[]), None);
        assert_eq!(
            cost_of_simultaneous_contexts(&before, &differ, &[2]),
            Some(300 * MIB)
        );
        assert_eq!(cost_of_simultaneous_contexts(&before, &before, &[]), None);
    }

    #[test]
    fn usage_matching_needs_a_unique_unclaimed_entry() {
        let list = [p(1, 302 * MIB), p(2, 300 * MIB), p(3, 300 * MIB)];
        assert_eq!(find_by_usage(&list, 302 * MIB, &[]), Some(p(1, 302 * MIB)));
        assert_eq!(find_by_usage(&list, 300 * MIB, &[]), None);
        assert_eq!(find_by_usage(&list, 300 * MIB, &[3]), Some(p(2, 300 * MIB)));
    }

    #[test]
    fn implausible_context_costs_are_rejected() {
        assert_eq!(plausible_context_cost(&p(1, 0)), None);
        assert_eq!(plausible_context_cost(&p(1, 300 * MIB)), Some(300 * MIB));
        assert_eq!(plausible_context_cost(&p(1, 9 << 30)), None);
    }
}
