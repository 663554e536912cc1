//! The fake GPU's NVML, built as `libnvidia-ml.so.1`: every exported `nvml*` symbol is a thin
//! `extern "C"` shell over the plain Rust in [`core`], which reads the simulated GPU's shared
//! state (`FAKEGPU_STATE`) through the `fakegpu` crate.
//!
//! Semantics follow nvml.h: `NVML_ERROR_UNINITIALIZED` before `nvmlInit*` (init is
//! refcounted, as in the real library), `NVML_ERROR_INVALID_ARGUMENT` for null out-pointers
//! and unknown handles, `NVML_ERROR_INSUFFICIENT_SIZE` with the needed count for lists,
//! `NVML_ERROR_NOT_FOUND` for unknown UUIDs/bus ids. Every PID reported is the real PID plus
//! `FAKEGPU_PID_OFFSET` (a container's view of host PIDs). No panic crosses the boundary: a
//! panic becomes `NVML_ERROR_UNKNOWN`.

#![allow(non_snake_case)] // exported names are the NVML ABI

mod core;
mod export_table;
mod faults;
mod smi_entry;

use crate::core::{guard, out};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_int, c_uint};

// ---- init / shutdown / errors / system ----

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(|| core::init(0))
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard(|| core::init(0))
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    guard(|| core::init(flags))
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(core::shutdown)
}

/// Static NUL-terminated text for every code; unknown codes get "Unknown Error" like the
/// real library.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    core::error_string(result).as_ptr()
}

/// # Safety
/// `version` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::initialized()?;
        let text =
            fakegpu::nvml_view::driver_version_string(fakegpu::nvml_view::cuda_driver_version());
        // SAFETY: the caller guarantees `length` writable bytes at `version`.
        unsafe { core::write_str(version, length, text) }
    })
}

/// # Safety
/// `version` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // The real library answers this one without nvmlInit.
    guard(|| {
        let text =
            fakegpu::nvml_view::nvml_version_string(fakegpu::nvml_view::cuda_driver_version());
        // SAFETY: the caller guarantees `length` writable bytes at `version`.
        unsafe { core::write_str(version, length, &text) }
    })
}

/// # Safety
/// `version` must be null or a valid `int*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        core::initialized()?;
        // SAFETY: the caller passes null or a valid int pointer.
        *unsafe { out(version) }? = fakegpu::nvml_view::cuda_driver_version();
        Ok(())
    })
}

/// # Safety
/// `version` must be null or a valid `int*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: same contract as the v1 entry point.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

// ---- device enumeration ----

/// # Safety
/// `count` must be null or a valid `unsigned int*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let state = core::initialized()?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(count) }? = core::device_count(state);
        Ok(())
    })
}

/// # Safety
/// `count` must be null or a valid `unsigned int*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: same contract as v2; v1 differs only for devices the caller may not access.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// # Safety
/// `device` must be null or a valid `nvmlDevice_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let state = core::initialized()?;
        // SAFETY: the caller passes null or a valid pointer.
        let device = unsafe { out(device) }?;
        *device = core::handle_by_index(state, index)?;
        Ok(())
    })
}

/// # Safety
/// `device` must be null or a valid `nvmlDevice_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: same contract as v2.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `uuid` must be null or a NUL-terminated string; `device` null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let state = core::initialized()?;
        // SAFETY: the caller passes null or a NUL-terminated string.
        let uuid = unsafe { core::in_str(uuid) }?;
        // SAFETY: the caller passes null or a valid pointer.
        let device = unsafe { out(device) }?;
        *device = core::handle_by_uuid(state, &uuid)?;
        Ok(())
    })
}

/// # Safety
/// `bus_id` must be null or a NUL-terminated string; `device` null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let state = core::initialized()?;
        // SAFETY: the caller passes null or a NUL-terminated string.
        let bus_id = unsafe { core::in_str(bus_id) }?;
        // SAFETY: the caller passes null or a valid pointer.
        let device = unsafe { out(device) }?;
        *device = core::handle_by_pci_bus_id(state, &bus_id)?;
        Ok(())
    })
}

/// # Safety
/// Same as [`nvmlDeviceGetHandleByPciBusId_v2`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: same contract as v2.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

// ---- device identity ----

/// # Safety
/// `name` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller guarantees `length` writable bytes at `name`.
        unsafe { core::write_str(name, length, &dev.spec.name) }
    })
}

/// # Safety
/// `uuid` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller guarantees `length` writable bytes at `uuid`.
        unsafe { core::write_str(uuid, length, &dev.spec.uuid) }
    })
}

/// # Safety
/// `index` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(index) }? = dev.index;
        Ok(())
    })
}

/// # Safety
/// `minor` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // /dev/nvidiaN: the fake numbers device nodes by index.
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(minor) }? = dev.index;
        Ok(())
    })
}

/// # Safety
/// `pci` must be null or a valid `nvmlPciInfo_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(pci) }? = core::pci_info(&dev);
        Ok(())
    })
}

/// # Safety
/// `pci` must be null or a valid `nvmlPciInfo_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: v2 and v3 share `nvmlPciInfo_t`; v3 only fixed how busId is formatted.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// # Safety
/// `major` and `minor` must be null or valid pointers.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or valid pointers.
        let (major, minor) = unsafe { (out(major)?, out(minor)?) };
        *major = dev.spec.cc_major as c_int;
        *minor = dev.spec.cc_minor as c_int;
        Ok(())
    })
}

/// # Safety
/// `multi` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: nvmlDevice_t,
    multi: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(multi) }? = 0;
        Ok(())
    })
}

/// # Safety
/// `cores` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    cores: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(cores) }? = dev.spec.sm_count * dev.profile.cores_per_sm;
        Ok(())
    })
}

/// # Safety
/// `attrs` must be null or a valid `nvmlDeviceAttributes_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attrs: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(attrs) }? = core::attributes(&dev);
        Ok(())
    })
}

/// # Safety
/// Same as [`nvmlDeviceGetAttributes_v2`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attrs: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    // SAFETY: same struct and contract as v2.
    unsafe { nvmlDeviceGetAttributes_v2(device, attrs) }
}

// ---- modes and board state ----

/// # Safety
/// `mode` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(mode) }? = NVML_COMPUTEMODE_DEFAULT;
        Ok(())
    })
}

/// # Safety
/// `mode` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // Datacenter hosts run the persistence daemon; nvidia-smi shows "On".
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(mode) }? = NVML_FEATURE_ENABLED;
        Ok(())
    })
}

/// # Safety
/// `current` and `pending` must be null or valid pointers.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        if !fakegpu::nvml_view::supports_mig(&dev.spec) {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: the caller passes null or valid pointers.
        let (current, pending) = unsafe { (out(current)?, out(pending)?) };
        *current = NVML_DEVICE_MIG_DISABLE;
        *pending = NVML_DEVICE_MIG_DISABLE;
        Ok(())
    })
}

/// # Safety
/// `temp` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes null or a valid pointer.
        let temp = unsafe { out(temp) }?;
        *temp = fakegpu::nvml_view::temperature_c(dev.utilization());
        Ok(())
    })
}

/// # Safety
/// `power` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        let power = unsafe { out(power) }?;
        *power = fakegpu::nvml_view::power_usage_mw(&dev.profile, dev.utilization());
        Ok(())
    })
}

/// # Safety
/// `limit` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(limit) }? = dev.profile.power_limit_mw;
        Ok(())
    })
}

/// # Safety
/// `limit` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract; the fake never changes the limit, so both report the same.
    unsafe { nvmlDeviceGetEnforcedPowerLimit(device, limit) }
}

/// Passively cooled datacenter boards (both presets) have no fan NVML can read: the real
/// driver answers NOT_SUPPORTED and nvidia-smi prints "N/A".
///
/// # Safety
/// `speed` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    device: nvmlDevice_t,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        if speed.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

/// # Safety
/// `pstate` must be null or a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    pstate: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        let pstate = unsafe { out(pstate) }?;
        // A GPU with contexts on it is clocked up (P0); an empty one idles in P8.
        *pstate = if dev.state.processes(dev.index).is_empty() {
            NVML_PSTATE_8
        } else {
            NVML_PSTATE_0
        };
        Ok(())
    })
}

// ---- memory and utilisation ----

/// # Safety
/// `memory` must be null or a valid `nvmlMemory_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        let memory = unsafe { out(memory) }?;
        let (total, free, used) = dev.memory().v1();
        *memory = nvmlMemory_t { total, free, used };
        Ok(())
    })
}

/// # Safety
/// `memory` must be null or a valid `nvmlMemory_v2_t*` whose `version` is set.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        let memory = unsafe { out(memory) }?;
        if memory.version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let view = dev.memory();
        *memory = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            total: view.total,
            reserved: view.reserved,
            free: view.free,
            used: view.used,
        };
        Ok(())
    })
}

/// # Safety
/// `util` must be null or a valid `nvmlUtilization_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    util: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        let util = unsafe { out(util) }?;
        // `memory` is memory-controller activity, which the fake does not model: 0.
        *util = nvmlUtilization_t {
            gpu: dev.utilization(),
            memory: 0,
        };
        Ok(())
    })
}

// ---- processes ----

/// The unversioned symbol keeps the v1 ABI (`nvmlProcessInfo_v1_t`), as in the real library.
///
/// # Safety
/// `count` must be null or valid; `infos` null or `*count` writable entries.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
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
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
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
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
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
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
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
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
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
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
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

// ---- nvidia-smi's private table ----

/// # Safety
/// `table` must be null or writable; `guid` null or 16 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlInternalGetExportTable(
    table: *mut *const usize,
    guid: *const u8,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { export_table::get_export_table(table, guid) }
}

// ---- events (injected faults: `FAKEGPU_NVML_FAULTS`, see faults.rs) ----

/// The event types the fake can raise (the injectable faults).
const SUPPORTED_EVENTS: u64 =
    faults::EVENT_SINGLE_BIT_ECC | faults::EVENT_DOUBLE_BIT_ECC | faults::EVENT_XID_CRITICAL;

/// # Safety
/// `set` must be null or a valid `nvmlEventSet_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut std::ffi::c_void) -> nvmlReturn_t {
    guard(|| {
        core::initialized()?;
        // SAFETY: the caller passes null or a valid pointer.
        let set = unsafe { out(set) }?;
        *set = Box::into_raw(faults::EventSet::new()) as *mut std::ffi::c_void;
        Ok(())
    })
}

/// # Safety
/// `set` must be null or an event set from `nvmlEventSetCreate`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut std::ffi::c_void) -> nvmlReturn_t {
    guard(|| {
        if set.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: `set` came from Box::into_raw in nvmlEventSetCreate and is freed once.
        drop(unsafe { Box::from_raw(set as *mut faults::EventSet) });
        Ok(())
    })
}

/// # Safety
/// `types` must be null or a valid `unsigned long long*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut u64,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(types) }? = SUPPORTED_EVENTS;
        Ok(())
    })
}

/// # Safety
/// `set` must be null or a live event set from `nvmlEventSetCreate`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: u64,
    set: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        if set.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // nvml.h: registering a type the device does not support is NOT_SUPPORTED.
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: a live set from nvmlEventSetCreate (the caller's contract).
        let set = unsafe { &*(set as *const faults::EventSet) };
        set.register(dev.index, types);
        Ok(())
    })
}

/// # Safety
/// `set` must be null or a live event set; `data` null or a valid `nvmlEventData_t*`.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut std::ffi::c_void,
    data: *mut faults::EventData,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::initialized()?;
        if set.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes null or a valid pointer.
        let data = unsafe { out(data) }?;
        // SAFETY: a live set from nvmlEventSetCreate (the caller's contract).
        let set = unsafe { &*(set as *const faults::EventSet) };
        let (index, kind, code) = set.wait(timeout_ms)?;
        *data = faults::EventData {
            device: core::handle_of(index),
            event_type: kind,
            event_data: code,
            gpu_instance_id: u32::MAX,
            compute_instance_id: u32::MAX,
        };
        Ok(())
    })
}

// ---- NVLink (PyTorch resolves these at start-up) ----

/// The simulated GPUs have no NVLink: every link query is NVML_ERROR_NOT_SUPPORTED, as
/// on a PCIe card (after the device handle is checked).
///
/// # Safety
/// `kind` must be null or a valid pointer (it is never written).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    _link: c_uint,
    _kind: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

/// As [`nvmlDeviceGetNvLinkRemoteDeviceType`].
///
/// # Safety
/// `pci` must be null or a valid pointer (it is never written).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    _link: c_uint,
    _pci: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}
