//! Processes on a device: the running lists and per-process utilisation.

use crate::core::{self, guard};
use gpuslice_abi::nvml::*;
use std::ffi::c_uint;

/// The unversioned symbol keeps the v1 ABI (`nvmlProcessInfo_v1_t`), as in the real library.
///
/// # Safety
/// `count` must be null or valid; `infos` null or `*count` writable entries.
pub(crate) unsafe fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        let procs = dev.compute_processes();
        // SAFETY: the caller passes null or valid pointers sized by `*count`.
        unsafe {
            core::fill_list(count, infos, &procs, |p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory,
            })
        }
    })
}

/// # Safety
/// `count` must be null or valid; `infos` null or `*count` writable entries.
pub(crate) unsafe fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        let procs = dev.compute_processes();
        // SAFETY: the caller passes null or valid pointers sized by `*count`.
        unsafe { core::fill_list(count, infos, &procs, core::process_info) }
    })
}

/// # Safety
/// Same as [`nvmlDeviceGetComputeRunningProcesses_v3`] (same struct).
pub(crate) unsafe fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: v2 and v3 share nvmlProcessInfo_t.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos) }
}

/// The fake runs no graphics work: always an empty list.
///
/// # Safety
/// `count` must be null or valid; `infos` null or `*count` writable entries.
pub(crate) unsafe fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or valid pointers sized by `*count`.
        unsafe { core::fill_list(count, infos, &[], core::process_info) }
    })
}

/// # Safety
/// Same as [`nvmlDeviceGetGraphicsRunningProcesses_v3`].
pub(crate) unsafe fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: same struct and contract as v3.
    unsafe { nvmlDeviceGetGraphicsRunningProcesses_v3(device, count, infos) }
}

/// Per-process SM utilisation since `last_seen_us` (wall-clock microseconds, the clock of
/// the returned `timeStamp`s, as the real driver; 0 = the whole sample buffer).
///
/// # Safety
/// `count` must be null or valid; `samples` null or `*count` writable entries.
pub(crate) unsafe fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen_us: u64,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or valid pointers sized by `*count`.
        unsafe { core::process_utilization(&dev, samples, count, last_seen_us) }
    })
}
