//! Fails the slice closed when a limit-file entry names no device of the node (otherwise a
//! one-character typo in a UUID would leave the card unlimited, silently).
//!
//! The configuration is loaded before the driver is up, so the devices are not known then.
//! The decision is taken once, at the first CUDA or NVML call that can list them:
//! * `cuInit` itself, right after the real one succeeded (so the first call already
//!   refuses), else a CUDA call once the real `cuDeviceGetCount` answers: the devices this
//!   process sees (ordinal and `cuDeviceGetUuid`); an entry none of them matches is then
//!   looked up in the real NVML, which lists every device of the container whatever
//!   `CUDA_VISIBLE_DEVICES` hides (so an entry for a hidden card is right, not a typo);
//! * an NVML call (NVML-only processes such as `nvidia-smi` or pynvml): NVML's devices.
//!
//! The HAMi route is held to the same rule: each indexed variable (`CUDA_DEVICE_MEMORY_LIMIT_7`)
//! must name a device of the node (its un-indexed defaults name none in particular).
//!
//! The rule itself is `gpuslice_common::visible`. Before the driver can answer, calls pass
//! (nothing can be allocated before `cuInit`). Once refused, every CUDA and NVML call returns
//! the fail-closed code, and the one line naming the limit file, the entry and the devices
//! that exist is printed once. The verdict moves the process state (`session::state`:
//! enforcing with its devices matched, or failing closed) and survives `fork` (a child sees
//! the same devices). No thread ever waits for another's listing (see [`check`]).

use std::cell::Cell;

use gpuslice_abi::cuda::result::{CUDA_ERROR_NO_DEVICE, CUDA_SUCCESS};
use gpuslice_abi::nvml::nvmlDevice_t;
use gpuslice_abi::nvml::ret::NVML_SUCCESS;
use gpuslice_common::config::{ConfigError, ConfigSource, DeviceSelector, SliceConfig};
use gpuslice_common::visible::{unmatched_entries, unmatched_error, SeenDevice};

use crate::ground::driver::real;
use crate::ground::real::Library;
use crate::session::state::STATE;

/// Devices listed at most (the real count is far lower; this bounds a misbehaving driver).
const MAX_LISTED: u32 = 64;

thread_local! {
    /// This thread is listing the devices: a driver that calls its own exports meanwhile
    /// reaches the gate again, which must not start another listing (const, no destructor:
    /// usable at any point of a thread's life).
    static LISTING: Cell<bool> = const { Cell::new(false) };
}

/// The gate for an enforcing process whose devices are not matched yet: lists them when the
/// driver can, and moves the state (matched: open for good; an entry naming no device: fail
/// closed, said once). Every thread that gets here lists the devices itself (no thread
/// waits on another: a driver holding an internal lock while it calls one of its own exports
/// on a second thread could otherwise deadlock against the lister). They all reach the same
/// answer; the first to publish it prints the refusal.
#[cold]
pub(crate) fn check(config: &SliceConfig, library: Library) -> Result<(), u32> {
    let nothing_to_check = match config.source {
        ConfigSource::File(_) => config.devices.is_empty(),
        ConfigSource::Env => hami_indexed().is_empty(),
    };
    if nothing_to_check {
        STATE.devices_matched();
        return Ok(());
    }
    if LISTING.with(|listing| listing.replace(true)) {
        return Ok(()); // called back by the driver while this thread lists its devices
    }
    let outcome = std::panic::catch_unwind(|| verdict(config, library));
    LISTING.with(|listing| listing.set(false));
    let error = match outcome {
        Ok(None) => return Ok(()), // the driver cannot list its devices yet: nothing to gate
        Ok(Some(None)) => {
            STATE.devices_matched();
            return Ok(());
        }
        Ok(Some(Some(error))) => error,
        Err(_) => ConfigError {
            origin: "gpuslice".into(),
            field: String::new(),
            problem: "internal error while listing the devices".into(),
        },
    };
    if let Some(error) = STATE.devices_refused(error) {
        crate::log_error!("{error}; CUDA and NVML calls are refused until it is fixed");
        crate::memory::count_fail_closed();
    }
    Err(library.fail_closed_code())
}

/// `None`: the driver cannot list its devices yet. `Some(None)`: every entry names a
/// device. `Some(Some(error))`: the refusal.
fn verdict(config: &SliceConfig, library: Library) -> Option<Option<ConfigError>> {
    let (seen, from_nvml) = match library {
        Library::Cuda => (cuda_devices()?, false),
        Library::Nvml => (nvml_devices()?, true),
    };
    if config.source == ConfigSource::Env {
        return Some(env_verdict(&seen, from_nvml));
    }
    let unmatched = unmatched_entries(config, &seen, &|_| None);
    if unmatched.is_empty() {
        return Some(None);
    }
    // A CUDA process may be shown only some of the container's devices: ask NVML.
    let nvml = if from_nvml { None } else { nvml_devices() };
    let unmatched = match &nvml {
        Some(node) => unmatched_entries(config, &seen, &|selector: &DeviceSelector| {
            Some(
                node.iter().any(|d| selector.matches(d.index, &d.uuid))
                    // MIG devices are not in NVML's index list; NVML finds them by UUID.
                    || matches!(selector, DeviceSelector::Uuid(uuid)
                        if crate::ground::devices::real_nvml_handle(uuid, None).is_some()),
            )
        }),
        None => unmatched,
    };
    if unmatched.is_empty() {
        return Some(None);
    }
    Some(Some(unmatched_error(
        config,
        &unmatched,
        &seen,
        from_nvml || nvml.is_some(),
    )))
}

/// The HAMi route's indexed variables (name, device index) of this process's environment.
fn hami_indexed() -> Vec<(String, u32)> {
    gpuslice_common::config::hami_indexed_variables(&|name| std::env::var(name).ok())
}

/// The HAMi route: each indexed variable must name a device this process sees, or one NVML
/// lists (hidden by `CUDA_VISIBLE_DEVICES`), like a limit-file entry.
fn env_verdict(seen: &[SeenDevice], from_nvml: bool) -> Option<ConfigError> {
    let named = hami_indexed();
    let unseen: Vec<&(String, u32)> = named
        .iter()
        .filter(|(_, index)| !seen.iter().any(|d| d.index == *index))
        .collect();
    if unseen.is_empty() {
        return None;
    }
    let node = if from_nvml { None } else { nvml_devices() };
    let (name, index) = unseen
        .into_iter()
        .find(|(_, index)| !node.iter().flatten().any(|d| d.index == *index))?;
    let nvml = if from_nvml || node.is_some() {
        ""
    } else {
        "; NVML, which would also show devices hidden by CUDA_VISIBLE_DEVICES, could not be asked"
    };
    Some(ConfigError {
        origin: name.clone(),
        field: String::new(),
        problem: format!(
            "names device index {index}, which matches no device of this node (devices here: {}){nvml}; a limit for a device that does not exist would leave the device it meant unlimited",
            gpuslice_common::visible::list_devices(seen)
        ),
    })
}

/// The CUDA devices of this process (ordinal, UUID), or `None` before the driver is up.
fn cuda_devices() -> Option<Vec<SeenDevice>> {
    let get_count = real::cuDeviceGetCount()?;
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer for the call.
    match unsafe { get_count(&mut count) } {
        CUDA_SUCCESS => {}
        CUDA_ERROR_NO_DEVICE => count = 0,
        _ => return None,
    }
    Some(
        (0..(count.max(0) as u32).min(MAX_LISTED))
            .map(|index| SeenDevice {
                index,
                uuid: crate::ground::devices::try_cuda_device_uuid(index as i32)
                    .unwrap_or_default(),
            })
            .collect(),
    )
}

/// Every device NVML lists (index, UUID), or `None` when the real NVML cannot be used.
fn nvml_devices() -> Option<Vec<SeenDevice>> {
    if !crate::ground::devices::real_nvml_ready() {
        return None;
    }
    let by_index = real::nvmlDeviceGetHandleByIndex_v2()?;
    let mut devices = Vec::new();
    for index in 0..MAX_LISTED {
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; NVML rejects an index it does not have.
        if unsafe { by_index(index, &mut handle) } != NVML_SUCCESS {
            break;
        }
        let (_, uuid) = crate::ground::devices::nvml_identity(handle);
        devices.push(SeenDevice { index, uuid });
    }
    Some(devices)
}
