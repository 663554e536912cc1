//! When a DEAD process's memory has really gone back to the card: NVML's process lists say
//! it ([`release_evidence`]); where they cannot, the stated bound. Pure; the reads are
//! `driver_sized::driver_released`'s.
//!
//! The kernel's word (the dead process is gone or a zombie, every descriptor closed) is no
//! evidence: a driver may tear a process's memory down after its descriptors closed (a real
//! one may defer it; the fake does until its reaper runs or its release delay passes), and a
//! budget given back then lets a newcomer take bytes the card still holds.

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
    /// The driver could not be asked (no NVML, or its NVML PID never learnt) for `timeout`
    /// (the region's release timeout) since a process of the slice found it dead.
    TimedOut,
}

/// Pure: whether a process dead for `dead_for` (since a process of the slice first found it
/// dead) has released its memory. `listed` is NVML's answer (`None`: no host PID or no
/// NVML), `reused` whether its host PID now names another running process.
pub fn release_evidence(
    listed: Option<bool>,
    reused: bool,
    dead_for: std::time::Duration,
    timeout: std::time::Duration,
) -> Option<Released> {
    match listed {
        Some(false) => Some(Released::Unlisted),
        // The driver still holds it (a slow teardown): that outranks every timer, however
        // long it takes, unless the entry may be another process's.
        Some(true) => {
            (reused && dead_for >= STILL_LISTED_TIMEOUT).then_some(Released::ListedTooLong)
        }
        None => (dead_for >= timeout).then_some(Released::TimedOut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_decides_when_a_dead_process_released_its_memory() {
        use std::time::Duration;
        let timeout = Duration::from_secs(10);
        let s = Duration::from_secs;
        // NVML still lists it: no timer gives the bytes back, however long the driver takes...
        assert_eq!(release_evidence(Some(true), false, s(30), timeout), None);
        assert_eq!(
            release_evidence(Some(true), false, s(86_400), timeout),
            None
        );
        // ...unless its PID names another running process: the entry may be that one's.
        assert_eq!(release_evidence(Some(true), true, s(30), timeout), None);
        assert_eq!(
            release_evidence(Some(true), true, STILL_LISTED_TIMEOUT, timeout),
            Some(Released::ListedTooLong)
        );
        assert_eq!(
            release_evidence(Some(false), false, s(0), timeout),
            Some(Released::Unlisted)
        );
        // NVML cannot tell: the bound, whatever the kernel says about the process.
        assert_eq!(release_evidence(None, false, s(0), timeout), None);
        assert_eq!(release_evidence(None, false, s(9), timeout), None);
        assert_eq!(
            release_evidence(None, false, s(10), timeout),
            Some(Released::TimedOut)
        );
    }
}
