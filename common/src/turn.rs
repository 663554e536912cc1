//! A process-local turn: the one short lock the shim and the region use where a `Mutex`
//! would cost more than the work it guards (its poisoning and futex bookkeeping) or could not
//! be reset in a fork child. A flag taken by compare-and-swap: a waiter spins a little, then
//! yields the CPU to a holder that was descheduled. Never shared between processes.

use std::sync::atomic::{AtomicBool, Ordering};

/// A free-or-held flag; [`Turn::take`] waits for it, the guard gives it back.
#[derive(Debug, Default)]
pub struct Turn {
    held: AtomicBool,
}

/// Spins before a waiter starts yielding (a holder runs a few dozen instructions).
const SPINS: u32 = 64;

impl Turn {
    /// A free turn.
    pub const fn new() -> Turn {
        Turn {
            held: AtomicBool::new(false),
        }
    }

    /// Waits for the turn and holds it until the guard is dropped.
    #[inline(always)]
    pub fn take(&self) -> TurnGuard<'_> {
        let mut spins = 0u32;
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
            } else {
                // The holder was descheduled mid-turn: let it run.
                std::thread::yield_now();
            }
        }
        TurnGuard(&self.held)
    }

    /// The turn if it is free now, without waiting (tests use it to fail, not hang, on a held
    /// turn).
    #[cfg(test)]
    fn try_take(&self) -> Option<TurnGuard<'_>> {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Lazily: a guard built on failure would give back the holder's turn when dropped.
            .then(|| TurnGuard(&self.held))
    }

    /// Frees the turn whoever holds it: for a fork child, where the holder (a parent's
    /// thread) does not exist.
    pub fn reset(&self) {
        self.held.store(false, Ordering::Relaxed);
    }
}

/// A held [`Turn`], given back when dropped.
#[must_use = "the turn is given back when the guard is dropped"]
pub struct TurnGuard<'a>(&'a AtomicBool);

impl Drop for TurnGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_turn_is_exclusive_among_threads() {
        let turn = Arc::new(Turn::new());
        let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (turn, inside) = (turn.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        let _guard = turn.take();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn a_reset_turn_is_free_again() {
        let turn = Turn::new();
        // A holder that never gives the turn back (a parent's thread, seen from a fork child).
        std::mem::forget(turn.take());
        assert!(turn.try_take().is_none(), "a held turn must not be free");
        turn.reset();
        let guard = turn.try_take().expect("a reset turn must be free");
        drop(guard);
        assert!(turn.try_take().is_some(), "a given-back turn must be free");
    }
}
