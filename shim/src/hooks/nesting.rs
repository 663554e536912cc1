//! Hooks never nest on a thread. A driver whose functions call its own EXPORTED entry points
//! through the dynamic linker (a legacy `cuMemAlloc` built on `cuMemAlloc_v2`, a v1 primary
//! release on `_v2`) reaches our wrapper a second time from inside the first wrapper's driver
//! call: the allocation would be charged twice, a launch billed twice, and a wrapper that
//! holds a ledger lock across its driver call would take it again and deadlock. The inner
//! call goes straight to the driver; the outer wrapper accounts for the whole operation.
//!
//! One per-thread flag, usable at any point of a thread's life (including its TLS teardown):
//! - with a front attached (every process the shim is preloaded into), a byte of the front's
//!   static TLS at an offset from the thread pointer the front hands over at attach, before
//!   any handler runs: one load and no call (this library is dlopened, so a thread-local of
//!   its own goes through `__tls_get_addr`: 16 instructions a hooked call, about a sixth of
//!   what a hooked `cuMemGetInfo` added);
//! - without one (this library's unit tests, or the core loaded on its own), a const-initialised
//!   thread-local without a destructor.
//!
//! Owns `FRONT_FLAG_OFFSET` (set once at attach; survives fork: the child has the same front
//! at the same offset).

use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

thread_local! {
    static INSIDE_A_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// The offset of the front's per-thread flag from the thread pointer; 0 = no front (the
/// thread-local above serves). Survives fork (the child has the front at the same offset).
static FRONT_FLAG_OFFSET: AtomicIsize = AtomicIsize::new(0);

/// Called by the front's attach, before any handler can run: the flag lives in the front's
/// static TLS from now on. (Two attaches pass the same offset.)
pub(crate) fn use_front_flag(offset: isize) {
    if offset != 0 {
        FRONT_FLAG_OFFSET.store(offset, Ordering::Relaxed);
    }
}

/// The calling thread's thread pointer (the TLS ABI's: `%fs:0` on x86_64, `tpidr_el0` on
/// aarch64).
#[inline(always)]
fn thread_pointer() -> *mut u8 {
    let pointer: *mut u8;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the TCB's self-pointer, which the x86_64 TLS ABI keeps at %fs:0 in every
    // thread; no other state is touched.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) pointer,
            options(nostack, readonly, preserves_flags, pure));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads the thread pointer register; no memory or other state is touched.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) pointer,
            options(nomem, nostack, preserves_flags, pure));
    }
    pointer
}

/// This thread's flag.
#[inline(always)]
fn flag() -> *const Cell<bool> {
    let offset = FRONT_FLAG_OFFSET.load(Ordering::Relaxed);
    if offset != 0 {
        // The front's byte: zeroed for every new thread, only ever 0 or 1 (a `bool`).
        thread_pointer().wrapping_offset(offset) as *const Cell<bool>
    } else {
        INSIDE_A_HOOK.with(|inside| inside as *const Cell<bool>)
    }
}

/// Clears the flag when the outermost handler returns or unwinds.
struct Leave<'a>(&'a Cell<bool>);

impl Drop for Leave<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Runs `handler` when this thread is in no hook yet, else `nested` (the driver directly).
#[inline]
pub(crate) fn outermost<R>(handler: impl FnOnce() -> R, nested: impl FnOnce() -> R) -> R {
    // SAFETY: `flag` points at this thread's flag (the front's static-TLS byte, or the
    // thread-local), valid for as long as the thread runs and reached by no other thread.
    let inside = unsafe { &*flag() };
    if inside.replace(true) {
        return nested();
    }
    let _leave = Leave(inside);
    handler()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_outermost_hook_runs_its_handler() {
        let ran = outermost(
            || {
                let inner = outermost(|| "handler", || "driver");
                let deeper = outermost(|| "handler", || outermost(|| "handler", || "driver"));
                (inner, deeper)
            },
            || ("driver", "driver"),
        );
        assert_eq!(ran, ("driver", "driver"), "nested calls go to the driver");
        assert_eq!(
            outermost(|| "handler", || "driver"),
            "handler",
            "left again"
        );
    }

    #[test]
    fn a_panicking_handler_leaves_the_thread_usable() {
        let result = std::panic::catch_unwind(|| outermost(|| panic!("handler bug"), || ()));
        assert!(result.is_err());
        assert_eq!(outermost(|| "handler", || "driver"), "handler");
    }

    #[test]
    fn threads_are_independent() {
        outermost(
            || {
                let other = std::thread::spawn(|| outermost(|| "handler", || "driver"));
                assert_eq!(other.join().unwrap(), "handler");
            },
            || unreachable!(),
        );
    }
}
