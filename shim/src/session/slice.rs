//! This process's place in the slice: the shared region's mapping and this process's slot in
//! it. One mapping per process image, opened at the first hooked call of an enforcing process
//! (`memory::attach`, from `hooks::lifecycle`'s lazy init) and never unmapped; one slot per process,
//! claimed by [`register`].
//!
//! Owns:
//! * `MAPPING` (survives fork: the child re-registers through the same object, whose
//!   descriptors it inherited);
//! * `SLOT` (per process: a fork child has no slot until it registers again).
//!
//! Region path: the limit file's `region` (or `CUDA_DEVICE_MEMORY_SHARED_CACHE`), else
//! `gpuslice_common::config::DEFAULT_REGION_PATH`: `/tmp` is private to a container under
//! Docker/podman/Kubernetes, so all its processes meet there; users who share a slice across
//! containers must name a region in a shared directory.

use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use gpuslice_common::config::SliceConfig;
use gpuslice_common::region::{DeadSlot, ProcessIdentity, Region, SlotId};

use super::fork::per_process;

/// The region this process image mapped (null until the first attach). Survives fork.
static MAPPING: AtomicPtr<Region> = AtomicPtr::new(std::ptr::null_mut());

/// `SLOT` when this process holds no slot.
const NO_SLOT: u32 = u32::MAX;

per_process! {
    /// This process's slot index in [`MAPPING`]; [`NO_SLOT`] before registration (and in a
    /// fork child until it registers again).
    static SLOT: AtomicU32 = AtomicU32::new(NO_SLOT);
}

/// The region path a configuration means.
pub fn region_path(config: &SliceConfig) -> PathBuf {
    config
        .region_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(gpuslice_common::config::DEFAULT_REGION_PATH))
}

/// The region this process image mapped, registered in or not (`None` before the first
/// attach).
#[inline]
pub fn region() -> Option<&'static Region> {
    // SAFETY: MAPPING holds null or a leaked, never freed Region published with Release.
    unsafe { MAPPING.load(Ordering::Acquire).as_ref() }
}

/// The region this process is registered in, and its slot there.
#[inline]
pub fn registered() -> Option<(&'static Region, SlotId)> {
    let slot = SlotId::from_index(SLOT.load(Ordering::Acquire) as usize)?;
    Some((region()?, slot))
}

/// The mapping of `config`'s region: the one this process image has when the path is the
/// same (a fork child, or a re-initialisation), else a new one, opened or created. `Err` is
/// the one line the shim prints before failing closed.
pub fn open(config: &SliceConfig) -> Result<&'static Region, String> {
    let path = region_path(config);
    if let Some(existing) = region().filter(|r| r.path() == path.as_path()) {
        return Ok(existing);
    }
    let region = Region::open_or_create(&path).map_err(|e| e.to_string())?;
    let leaked: &'static Region = Box::leak(Box::new(region));
    MAPPING.store(leaked as *const Region as *mut Region, Ordering::Release);
    Ok(leaked)
}

/// Registers this process in a slot of `region` (its identity read from /proc). A full
/// region offers its dead slots to `released` (the driver's word on their memory) before
/// refusing. Returns the slot and the identity it was registered under.
pub fn register(
    region: &'static Region,
    released: impl FnMut(&DeadSlot) -> bool,
) -> Result<(SlotId, ProcessIdentity), String> {
    let identity = ProcessIdentity::current().ok_or_else(|| {
        format!(
            "shared region {}: cannot read /proc/self to register this process",
            region.path().display()
        )
    })?;
    let identity = super::host_pid::with_known_host_pid(region, identity);
    let slot = region
        .register_with(&identity, |_| pause_in_registration(), released)
        .map_err(|e| e.to_string())?;
    super::host_pid::registered_as(&identity);
    SLOT.store(slot.index() as u32, Ordering::Release);
    Ok((slot, identity))
}

/// Child side of fork: the parent's slot descriptors are closed at once: held by a child that
/// never calls CUDA again (a data loader worker), they would keep the parent's slot looking
/// alive after the parent died. close(2) and atomics only.
pub(super) fn close_inherited() {
    if let Some(region) = region() {
        region.close_inherited_slot_locks();
    }
}

/// Env variable of the test hook of registration ([`pause_in_registration`]).
pub const PAUSE_IN_REGISTRATION_ENV: &str = "GPUSLICE_TEST_PAUSE_IN_REGISTRATION";
/// Env variable of the test hook after a context's creation ([`pause_after_context`]).
pub const PAUSE_AFTER_CONTEXT_ENV: &str = "GPUSLICE_TEST_PAUSE_AFTER_CONTEXT";

/// Test hook, inert unless [`PAUSE_IN_REGISTRATION_ENV`] names a file: blocks in the middle of
/// registering, with a slot claimed, so a test can SIGKILL or SIGSTOP the process at the worst
/// moment and show the others carry on.
fn pause_in_registration() {
    pause_at(
        PAUSE_IN_REGISTRATION_ENV,
        b"holding the registration lock\n",
    );
}

/// Test hook, inert unless [`PAUSE_AFTER_CONTEXT_ENV`] names a file: blocks right after the
/// driver made a context the slice charged, before its cost is settled and before the
/// process's NVML PID is learnt from it, so a test can kill the process with its context on
/// the card and nothing yet known of it but the charge.
pub fn pause_after_context() {
    pause_at(
        PAUSE_AFTER_CONTEXT_ENV,
        b"a context made, nothing measured\n",
    );
}

/// Creates the file `variable` names, then blocks (at most 60 s). Inert without the variable,
/// and under an anchored limit file (a tenant has no business pausing its own processes there).
fn pause_at(variable: &str, what: &[u8]) {
    if super::mode::anchored() {
        return;
    }
    let Some(marker) = std::env::var_os(variable) else {
        return;
    };
    if std::fs::write(&marker, what).is_ok() {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}
