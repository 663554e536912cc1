//! The session layer: everything that is "this process's slice", below both policies
//! (`memory`, `throttle`) and above the ground. Each policy reads it; neither reaches into the
//! other for it (checked by `layers`).
//!
//! * [`slice`]: the shared region's mapping and this process's slot in it;
//! * [`host_pid`]: this process's host-PID identity (how NVML names it), one implementation;
//! * [`clock`]: the monotonic clock and the absolute sleep (no state);
//! * [`state`]: THE state of this process (uninitialised, initialising, pass-through, fail
//!   closed, enforcing), drawn there; every "may this call run" is read from it;
//! * [`mode`]: the configuration as loaded ([`mode::Mode`]) and the pure mapping to it;
//! * [`fork`]: the fork reset, by construction: per-process state is declared with
//!   `per_process!`, which registers its reset; the child's handler runs them all.
//!
//! Per process vs. per process image: what a fork child must not inherit (the slot, the host
//! PID, the process state, the policies' ledgers, threads and open captures) is declared with
//! `per_process!` wherever it lives; what it must inherit (the region mapping, whose
//! descriptors the child holds too, the real driver's symbols) is a plain `static` that says
//! so. Initialisation order: `hooks::lifecycle` claims the state and loads the configuration,
//! `memory::attach` has [`slice`] map the region and register the process (the kernel's host
//! PID recorded with the slot), then the outcome is published ([`state`]); the throttle reads
//! the same mapping and slot at its first launch. Nothing here initialises on its own.

pub mod clock;
pub mod fork;
pub mod host_pid;
pub mod mode;
pub mod slice;
pub mod state;
