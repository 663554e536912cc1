//! Which NVML process-list entry is this process? In a container with its own PID namespace
//! NVML reports HOST PIDs, which the container cannot see in its /proc. Method, in order:
//!
//! 1. the kernel told us (`NSpid` in /proc/self/status lists the outer PID when the host
//!    namespace is visible): that PID;
//! 2. otherwise, diff NVML's process list around this process's FIRST context creation on a
//!    device: the one entry that appeared (and is not already claimed by another slot of the
//!    region) is us; its `usedGpuMemory` at that moment is also the driver's per-context cost;
//! 3. otherwise (several processes created contexts in the same instant: processes of one
//!    slice take turns under `context_start`'s measuring lock, so these are processes outside
//!    it), the cost is still known when all new entries agree on it
//!    ([`cost_of_simultaneous_contexts`]), and later process-list reads match the one
//!    unclaimed entry whose usage equals what our ledger charged us.
//!
//! Failure mode: when no unique candidate exists the host PID stays unknown; the process is
//! then missing from the slice's process list (never another tenant's process shown in its
//! place). A context whose cost could not be told keeps what was reserved for it when that
//! was a measured cost, else is charged the configured bound (or undone when that does not
//! fit: see `driver_sized::create_context`).
//!
//! The same lists say when a DEAD process's memory has really gone back to the card
//! ([`release_evidence`]): NVML's word beats the kernel's and any timer.

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

/// How long NVML may go on listing a dead process's host PID, once that PID is seen to name
/// another running process, before its bytes go back to the slice: a PID the host reused for
/// another GPU process must not hold them for that process's life. While the PID names no
/// other process, a listed PID is the driver still holding the memory: no timer applies.
pub const STILL_LISTED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a dead process's bytes may go back to the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// NVML lists its host PID on none of the devices it held bytes on.
    Unlisted,
    /// NVML kept listing it for [`STILL_LISTED_TIMEOUT`] while the PID named another process.
    ListedTooLong,
    /// NVML could not tell; the kernel says every descriptor is closed.
    Exited,
    /// Nothing could tell within `timeout` (the region's release timeout).
    TimedOut,
}

/// Pure: whether a process dead for `dead_for` has released its memory. `listed` is NVML's
/// answer (`None`: no host PID or no NVML), `exited` the kernel's, `reused` whether its host
/// PID now names another running process.
pub fn release_evidence(
    listed: Option<bool>,
    exited: bool,
    reused: bool,
    dead_for: std::time::Duration,
    timeout: std::time::Duration,
) -> Option<Released> {
    match listed {
        Some(false) => Some(Released::Unlisted),
        // The driver still holds it (a slow teardown): that outranks the kernel and every
        // timer, however long it takes, unless the entry may be another process's.
        Some(true) => {
            (reused && dead_for >= STILL_LISTED_TIMEOUT).then_some(Released::ListedTooLong)
        }
        None if exited => Some(Released::Exited),
        None => (dead_for >= timeout).then_some(Released::TimedOut),
    }
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
    fn nvml_decides_when_a_dead_process_released_its_memory() {
        use std::time::Duration;
        let timeout = Duration::from_secs(10);
        let s = Duration::from_secs;
        // NVML still lists it: neither the kernel nor any timer gives the bytes back, however
        // long the driver takes...
        assert_eq!(
            release_evidence(Some(true), true, false, s(30), timeout),
            None
        );
        assert_eq!(
            release_evidence(Some(true), true, false, s(86_400), timeout),
            None
        );
        // ...unless its PID names another running process: the entry may be that one's.
        assert_eq!(
            release_evidence(Some(true), true, true, s(30), timeout),
            None
        );
        assert_eq!(
            release_evidence(Some(true), true, true, STILL_LISTED_TIMEOUT, timeout),
            Some(Released::ListedTooLong)
        );
        assert_eq!(
            release_evidence(Some(false), false, false, s(0), timeout),
            Some(Released::Unlisted)
        );
        // NVML cannot tell: the kernel, else the timer.
        assert_eq!(
            release_evidence(None, true, false, s(0), timeout),
            Some(Released::Exited)
        );
        assert_eq!(release_evidence(None, false, false, s(9), timeout), None);
        assert_eq!(
            release_evidence(None, false, false, s(10), timeout),
            Some(Released::TimedOut)
        );
    }

    #[test]
    fn implausible_context_costs_are_rejected() {
        assert_eq!(plausible_context_cost(&p(1, 0)), None);
        assert_eq!(plausible_context_cost(&p(1, 300 * MIB)), Some(300 * MIB));
        assert_eq!(plausible_context_cost(&p(1, 9 << 30)), None);
    }
}
