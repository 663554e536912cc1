//! libgpuslice_core.so, the shim proper. The front, `libgpuslice.so` (`front/lib.rs`, built
//! by `build.rs`), is what is injected into every process of a container (LD_PRELOAD or
//! `/etc/ld.so.preload`) and loads this core at the first hooked call; together they sit
//! between CUDA/NVML clients and the real driver and turn one GPU into an enforced slice.
//!
//! Four layers; imports run downward only, and never between siblings of one layer (the
//! `layers` test fails otherwise).
//! 1. the hook layer, what a client reaches: [`hooks`] (the registry, the exported shells,
//!    the dlsym and cuGetProcAddress paths, every handler, the process's lifecycle: its
//!    initialisation, the fail-closed gate and refusal);
//! 2. policy: [`memory`] (the ledger and what each path charges) and [`throttle`] (the
//!    compute share), siblings;
//! 3. [`session`]: this process's slice, which both policies read (the region mapping and
//!    slot, the host PID, the clock, the process state, the fork reset);
//! 4. ground: [`ground`] (the real driver, device binding, logging).
//!
//! Exports are compiled only outside `cfg(test)`: a unit-test binary must never interpose its
//! own `dlsym` or `cu*` symbols.

// `hooks` first: its registry's `hook_table!` is what `ground::driver` expands.
#[macro_use]
pub mod hooks;
pub mod ground;
#[cfg(test)]
mod layers;
pub mod memory;
pub mod session;
pub mod throttle;
