//! Sleeping until a 32-bit word of the mapping changes, and waking its sleepers: the futex
//! system call on the shared file mapping (the shared flavour, keyed by the file's page, so a
//! sleeper in any process that maps the region is woken). A sleep always has a timeout: a
//! waker that dies before waking costs a sleeper that timeout, never more.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `seen`, at most `timeout` (returns at once when it differs,
/// early on a signal).
pub(super) fn wait_while(word: &AtomicU32, seen: u32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned 32-bit word of a live mapping, with a valid
    // relative timeout; the kernel only reads both.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &timeout as *const libc::timespec,
        );
    }
}

/// Wakes every sleeper on `word`.
pub(super) fn wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned 32-bit word of a live mapping.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Wakes at most `count` sleepers on `word`.
pub(super) fn wake(word: &AtomicU32, count: i32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned 32-bit word of a live mapping.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, count);
    }
}
