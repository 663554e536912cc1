//! When a DEAD process's memory has really gone back to the card: NVML's process lists say
//! it ([`release_evidence`]), and NVML's word beats the kernel's and any timer. Pure; the
//! reads are `driver_sized::driver_released`'s.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
