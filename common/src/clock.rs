//! The one clock of the slice: `CLOCK_MONOTONIC` (system-wide, so the processes of a slice,
//! the shim and the region compare their instants). Owns no state.

/// CLOCK_MONOTONIC in nanoseconds (vDSO, no syscall).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
