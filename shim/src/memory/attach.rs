//! Attaching this process to its slice, once per process (and again in a forked child), from
//! `lifecycle`'s lazy init: the session opens (or creates) the region — a region that cannot
//! be opened makes the shim fail closed, like an invalid limit file — and registers this
//! process in a slot; then the process-wide state ([`Shared`]) is built once and this
//! process's ledger ([`Process`]) over the slot.
//!
//! Context cost: the shim cannot know what a context costs on the device before one exists.
//! Before the first context of the process on a device it reserves what a process of the
//! slice already measured there (the region's per-device `context_cost`, the largest figure
//! seen), or, when none has, an upper bound (`GPUSLICE_CONTEXT_OVERHEAD`, default
//! [`DEFAULT_CONTEXT_BOUND`]) up to the slice's room. Right after, it reads its own entry in
//! NVML's process list (see `session::host_pid`), settles the charge to that measured figure
//! (undoing the context when the real cost does not fit) and publishes it; later contexts of
//! the process use it. Processes of the slice take that step one at a time
//! ([`super::context_start`]), so simultaneous starts neither refuse each other nor mistake
//! each other's NVML entries. Where NVML cannot tell, a measured figure stays charged, the
//! bound is charged whole.

use std::sync::atomic::{AtomicU64, Ordering};

use gpuslice_common::config::SliceConfig;

use super::bindings::DeviceBindings;
use super::region_budget::RegionBudget;
use super::{driver_sized, oversubscribe, shared, sweep, Process, Shared, PROCESS, SHARED};
use gpuslice_policy::Ledger;

/// Env variable: upper bound reserved for a context before its real cost is measured.
pub const CONTEXT_BOUND_ENV: &str = "GPUSLICE_CONTEXT_OVERHEAD";
/// Default of [`CONTEXT_BOUND_ENV`]: above what current drivers spend per context
/// (~300-500 MiB) so the first context never under-reserves.
pub const DEFAULT_CONTEXT_BOUND: u64 = 512 << 20;

/// The context bound: the limit file's `context_overhead`, which [`CONTEXT_BOUND_ENV`]
/// overrides only where no limit file is anchored. Under an anchored file the variable is
/// ignored (with a warning): a tenant that set it small would make the slice's contexts
/// under-reserve, i.e. change what is enforced.
fn context_bound(config: &SliceConfig) -> u64 {
    let configured = config.context_bound.unwrap_or(DEFAULT_CONTEXT_BOUND);
    if crate::session::mode::anchored() {
        if let Ok(text) = std::env::var(CONTEXT_BOUND_ENV) {
            if !text.trim().is_empty() {
                crate::log_warn!(
                    "{CONTEXT_BOUND_ENV}={:?} is ignored: the limit file {} exists and nothing in the environment overrides it",
                    gpuslice_common::text::shorten(&text, 64),
                    gpuslice_common::config::DEFAULT_CONFIG_PATH
                );
            }
        }
        return configured;
    }
    match std::env::var(CONTEXT_BOUND_ENV) {
        Ok(text) if !text.trim().is_empty() => {
            match gpuslice_common::size::parse_size(text.trim()) {
                Ok(bytes) if bytes > 0 => bytes,
                _ => {
                    crate::log_error!(
                        "{CONTEXT_BOUND_ENV}={:?} is not a size; using {configured} bytes",
                        gpuslice_common::text::shorten(&text, 64)
                    );
                    configured
                }
            }
        }
        _ => configured,
    }
}

/// Attaches this process to its slice (called by `lifecycle` once per process, and again in a
/// forked child): the session maps the region and registers this process in a slot, then this
/// process's ledger is built over it. `Err` is the one line the shim prints before failing
/// closed.
pub fn attach(config: &SliceConfig) -> Result<(), String> {
    let region = crate::session::slice::open(config)?;
    oversubscribe::configure(config);
    let shared = match shared() {
        Some(existing) if std::ptr::eq(existing.region, region) => existing,
        _ => {
            let fresh: &'static Shared = Box::leak(Box::new(Shared {
                region,
                config: config.clone(),
                bindings: DeviceBindings::new(),
                context_bound: context_bound(config),
                context_cost: std::array::from_fn(|_| AtomicU64::new(0)),
            }));
            SHARED.store(fresh as *const Shared as *mut Shared, Ordering::Release);
            fresh
        }
    };
    // A full region offers its dead slots to the driver's word before refusing.
    let (slot, identity) = crate::session::slice::register(region, |dead| {
        driver_sized::driver_released(shared, dead)
    })?;
    // Slots of processes that exited (or were killed) are not looked at here: a start costs
    // the same whatever the slice's history. Those holding bytes are the sweep's (this
    // process's first view needs one that began after now: `sweep`); those holding nothing
    // are freed when the region is full (`register` above).
    sweep::started();
    let process: &'static Process = Box::leak(Box::new(Process {
        ledger: Ledger::new(RegionBudget { region, slot }),
        slot,
    }));
    PROCESS.store(process as *const Process as *mut Process, Ordering::Release);
    crate::log_debug!(
        "registered pid {} in slot {} of {}",
        identity.pid,
        slot.index(),
        region.path().display()
    );
    Ok(())
}

/// Counts, in the region, that this process of the slice failed closed (for the node agent).
pub fn count_fail_closed() {
    if let Some(shared) = shared() {
        shared.region.count_fail_closed();
    }
}
