//! NVML membership: which processes of the driver's lists belong to the slice (and under which
//! PID the container knows them), finding this process's host PID by its charged bytes (kept
//! by `session::host_pid`), and when a dead slot's memory is released.

use std::ffi::c_uint;

use gpuslice_abi::cuda::*;
use gpuslice_abi::nvml::ret::{NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED};
use gpuslice_abi::nvml::*;
use gpuslice_common::region::{DeadSlot, DeviceId, RELEASE_TIMEOUT};

use crate::ground::driver::real;
use crate::memory::bindings::nvml_binding;
use crate::memory::region_budget::device_id;
use crate::memory::released;
use crate::memory::{process, shared, Binding, Shared};
use crate::session::host_pid::{self, ListedProcess};
use gpuslice_policy::slice_process_list;

/// Whether the driver no longer holds the memory of a dead slot's process, so its budget may
/// be given back (the region's two-phase reap; see "Reaping" in `gpuslice_common::region`).
///
/// Evidence ([`released::release_evidence`]):
/// 1. the driver's own word: with the host PID known and the real NVML answering for every
///    device the slot holds bytes on, released = the PID is in none of their process lists
///    (a process that is still tearing down, or whose driver defers the teardown, is listed,
///    and stays charged however long that takes; only a PID seen to name another running
///    process is given up on, after [`released::STILL_LISTED_TIMEOUT`]);
/// 2. the driver cannot be asked (no NVML, or a process that died before its NVML PID was
///    known): released [`RELEASE_TIMEOUT`] after a process of the slice first found it dead
///    (the kernel's word that the process is gone is no evidence: see `released`).
pub(in crate::memory) fn driver_released(shared: &Shared, dead: &DeadSlot) -> bool {
    if dead.bytes() == 0 {
        return true;
    }
    let listed = (dead.host_pid != 0)
        .then(|| nvml_lists(shared, dead))
        .flatten();
    let evidence =
        released::release_evidence(listed, dead.host_pid_reused, dead.dead_for, RELEASE_TIMEOUT);
    match evidence {
        Some(released::Released::ListedTooLong) => {
            crate::log_info!(
                "giving back {} bytes of dead pid {}: NVML still lists host pid {} after {:?}, and that pid names another process now",
                dead.bytes(),
                dead.pid,
                dead.host_pid,
                released::STILL_LISTED_TIMEOUT
            );
            true
        }
        Some(released::Released::TimedOut) => {
            crate::log_info!(
                "giving back {} bytes of dead pid {}: the driver could not be asked whether it released them, and {:?} have passed",
                dead.bytes(),
                dead.pid,
                RELEASE_TIMEOUT
            );
            true
        }
        Some(released::Released::Unlisted) => true,
        None => false,
    }
}

/// Whether NVML lists the dead slot's host PID on a device it holds bytes on; `None` when
/// NVML cannot answer for one of them.
fn nvml_lists(shared: &Shared, dead: &DeadSlot) -> Option<bool> {
    for (index, bytes) in dead.used_bytes.iter().enumerate() {
        if *bytes == 0 {
            continue;
        }
        let uuid = shared.region.device_uuid(DeviceId::from_index(index)?);
        let list = crate::ground::devices::nvml_compute_processes(
            crate::ground::devices::real_nvml_handle(&uuid, None)?,
        )
        .ok()?;
        if list.iter().any(|p| p.pid == dead.host_pid) {
            return Some(true);
        }
    }
    Some(false)
}

/// The real NVML handle of a CUDA device (by UUID: NVML's index order may differ).
pub(super) fn nvml_for_cuda(ordinal: CUdevice) -> Option<nvmlDevice_t> {
    crate::ground::devices::real_nvml_handle(
        &crate::ground::devices::cuda_device_uuid(ordinal),
        None,
    )
}

/// NVML's compute process list of `device` through the real library (v3, else v2).
pub(super) fn nvml_processes(device: nvmlDevice_t) -> Vec<ListedProcess> {
    crate::ground::devices::nvml_compute_processes(device)
        .unwrap_or_default()
        .iter()
        .map(|p| ListedProcess {
            pid: p.pid,
            used: p.usedGpuMemory,
        })
        .collect()
}

/// `raw`'s entries of the slice's live processes, under the PIDs the container knows (the
/// region's member index: rebuilt only when the membership moved, each member's liveness
/// checked at most once per sweep interval). Costs nothing per process of the slice that
/// the list does not show.
fn keep_members<T: Copy>(
    shared: &Shared,
    raw: Vec<T>,
    pid_of: impl Fn(&T) -> u32,
    with_pid: impl Fn(T, u32) -> T,
) -> Vec<T> {
    shared.region.with_members(|members| {
        slice_process_list(raw, |pid| members.get(pid).map(|m| m.pid), pid_of, with_pid)
    })
}

/// The slice's compute process list for `device`, or `None` when the device is not sliced.
/// Also where a process whose host PID is still unknown finds itself, by its charged bytes.
pub(crate) fn slice_list(
    device: nvmlDevice_t,
) -> Option<Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>> {
    members_only(device, |shared, entry| {
        let raw = crate::ground::devices::nvml_compute_processes(device)?;
        if let Some(process) = process() {
            if host_pid::known() == 0 {
                let ours = shared.region.slot_used(process.slot, device_id(entry));
                let listed: Vec<ListedProcess> = raw
                    .iter()
                    .map(|p| ListedProcess {
                        pid: p.pid,
                        used: p.usedGpuMemory,
                    })
                    .collect();
                let claimed = host_pid::claimed_by_others();
                if let Some(me) = host_pid::find_by_usage(&listed, ours, &claimed) {
                    host_pid::measured(me.pid);
                }
            }
        }
        Ok(raw)
    })
}

/// `read`'s process list of a sliced `device` with only the slice's processes left, under
/// the PIDs the container knows; `None` when the device is not sliced.
pub(crate) fn members_only(
    device: nvmlDevice_t,
    read: impl FnOnce(&Shared, u8) -> Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>,
) -> Option<Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>> {
    members_only_by(
        device,
        read,
        |p| p.pid,
        |p, pid| nvmlProcessInfo_t { pid, ..p },
    )
}

/// [`members_only`] for any per-PID entry (`pid_of` reads its PID, `with_pid` rewrites it).
pub(crate) fn members_only_by<T: Copy>(
    device: nvmlDevice_t,
    read: impl FnOnce(&Shared, u8) -> Result<Vec<T>, nvmlReturn_t>,
    pid_of: impl Fn(&T) -> u32,
    with_pid: impl Fn(T, u32) -> T,
) -> Option<Result<Vec<T>, nvmlReturn_t>> {
    let shared = shared()?;
    let Ok(Binding::Limited(entry)) = nvml_binding(shared, device) else {
        return None;
    };
    let raw = match read(shared, entry) {
        Ok(raw) => raw,
        Err(code) => return Some(Err(code)),
    };
    Some(Ok(keep_members(shared, raw, pid_of, with_pid)))
}

/// The real per-process utilisation samples of `device` (all buffered ones:
/// `lastSeenTimeStamp` 0), kept to the slice's processes under the PIDs the container knows,
/// with the newest timestamp among ALL samples (the device's own "now" in NVML's clock, so a
/// slice process's old samples can be told from current ones). `None` when the device has
/// no limit in this slice (memory or compute), whose figures pass through unchanged.
#[allow(clippy::type_complexity)]
pub(crate) fn slice_utilization_samples(
    device: nvmlDevice_t,
) -> Option<Result<(Vec<nvmlProcessUtilizationSample_t>, Option<u64>), nvmlReturn_t>> {
    let shared = shared()?;
    let (index, uuid) = crate::ground::devices::nvml_identity(device);
    let limit = shared.config.limit_for(index, &uuid)?;
    if limit.memory_limit.is_none() && limit.compute_percent.is_none() {
        return None;
    }
    let Some(get) = real::nvmlDeviceGetProcessUtilization() else {
        return Some(Err(NVML_ERROR_NOT_SUPPORTED));
    };
    let raw = match crate::ground::devices::read_utilization_samples(get, device, 0) {
        Ok(raw) => raw,
        // No process has a sample: nothing of the slice's either.
        Err(NVML_ERROR_NOT_FOUND) => Vec::new(),
        Err(code) => return Some(Err(code)),
    };
    let newest = raw.iter().map(|s| s.timeStamp).max();
    let ours = keep_members(
        shared,
        raw,
        |s| s.pid,
        |s, pid| nvmlProcessUtilizationSample_t { pid, ..s },
    );
    Some(Ok((ours, newest)))
}

/// The signature every v2/v3 process list of NVML shares.
pub(crate) type ProcessList =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;
