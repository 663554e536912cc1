//! Hooks never nest on a thread. A driver whose functions call its own EXPORTED entry points
//! through the dynamic linker (a legacy `cuMemAlloc` built on `cuMemAlloc_v2`, a v1 primary
//! release on `_v2`) reaches our wrapper a second time from inside the first wrapper's driver
//! call: the allocation would be charged twice, a launch billed twice, and a wrapper that
//! holds a ledger lock across its driver call would take it again and deadlock. The inner
//! call goes straight to the driver; the outer wrapper accounts for the whole operation.
//!
//! One thread-local flag, const-initialised and without a destructor, so it is usable at any
//! point of a thread's life (including its TLS teardown); one TLS lookup per hooked call (a
//! cdylib's TLS goes through `__tls_get_addr`, a few ns, so the flag's address is looked up
//! once and kept for the reset).

use std::cell::Cell;

thread_local! {
    static INSIDE_A_HOOK: Cell<bool> = const { Cell::new(false) };
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
    INSIDE_A_HOOK.with(|inside| {
        if inside.replace(true) {
            return nested();
        }
        let _leave = Leave(inside);
        handler()
    })
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
