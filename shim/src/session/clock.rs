//! The clock every part of the slice reads: `CLOCK_MONOTONIC` (system-wide, so processes of
//! a slice compare their instants, and leaders of different slices tick in step), and an
//! absolute sleep on it. Owns no state; the reading itself is `gpuslice_common::clock`'s, the
//! one the region uses too.

pub use gpuslice_common::clock::now_ns;

/// Sleeps until the absolute CLOCK_MONOTONIC instant `deadline_ns` (restarting on signals).
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        match rc {
            libc::EINTR => continue,
            0 => return,
            _ => {
                // A sandbox that refuses clock_nanosleep (a seccomp profile, an emulating
                // kernel) must not turn every wait into a busy loop: a relative sleep instead.
                let left = deadline_ns.saturating_sub(now_ns());
                std::thread::sleep(std::time::Duration::from_nanos(left));
                return;
            }
        }
    }
}
