//! The fake GPU's NVML, built as `libnvidia-ml.so.1`: every exported `nvml*` symbol is a thin
//! `extern "C"` shell over the plain Rust in [`core`], which reads the simulated GPU's shared
//! state (`FAKEGPU_STATE`) through the `fakegpu` crate.
//!
//! The exports are declared once, in the `nvml_api!` table below, one row each: exported
//! name, C signature, and the function that implements it, one module per family under
//! `api/` (`api/device.rs`, `api/memory.rs`, ...) or, for what nvidia-smi alone looks up,
//! in `smi_entry` (whose `not_modelled!` list declares the entry points that answer
//! NOT_SUPPORTED).
//!
//! Semantics follow nvml.h: `NVML_ERROR_UNINITIALIZED` before `nvmlInit*` (init is
//! refcounted, as in the real library), `NVML_ERROR_INVALID_ARGUMENT` for null out-pointers
//! and unknown handles, `NVML_ERROR_INSUFFICIENT_SIZE` with the needed count for lists,
//! `NVML_ERROR_NOT_FOUND` for unknown UUIDs/bus ids. Every PID reported is the real PID plus
//! `FAKEGPU_PID_OFFSET` (a container's view of host PIDs). No panic crosses the boundary: a
//! panic becomes `NVML_ERROR_UNKNOWN`.

#![allow(non_snake_case)] // exported names are the NVML ABI

mod api;
mod core;
mod export_table;
mod faults;
mod smi_entry;

use api::*;
use gpuslice_abi::nvml::*;
use smi_entry::{FbcStats, FieldValue, PciInfoExt};
use std::ffi::{c_char, c_int, c_uint};

/// Every hand-written export, one row each: exported name, C signature, and the function
/// that implements it. The row yields the `#[no_mangle]` shell that calls the function.
macro_rules! nvml_api {
    ($(
        fn $name:ident ($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty => $imp:path;
    )*) => {
        $(
            /// # Safety
            /// As the implementing function says (nvml.h's contract for this entry point).
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the caller's contract is the implementation's.
                unsafe { $imp($($arg),*) }
            }
        )*
    };
}

nvml_api! {
    // ---- init / shutdown / errors / system ----
    fn nvmlInit_v2() -> nvmlReturn_t => system::nvmlInit_v2;
    fn nvmlInit() -> nvmlReturn_t => system::nvmlInit;
    fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t => system::nvmlInitWithFlags;
    fn nvmlShutdown() -> nvmlReturn_t => system::nvmlShutdown;
    fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char => system::nvmlErrorString;
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t => system::nvmlSystemGetDriverVersion;
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t => system::nvmlSystemGetNVMLVersion;
    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t => system::nvmlSystemGetCudaDriverVersion;
    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t => system::nvmlSystemGetCudaDriverVersion_v2;

    // ---- device enumeration ----
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t => device::nvmlDeviceGetCount_v2;
    fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t => device::nvmlDeviceGetCount;
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t => device::nvmlDeviceGetHandleByIndex_v2;
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t => device::nvmlDeviceGetHandleByIndex;
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t => device::nvmlDeviceGetHandleByUUID;
    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t => device::nvmlDeviceGetHandleByPciBusId_v2;
    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t => device::nvmlDeviceGetHandleByPciBusId;

    // ---- device identity ----
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t => device::nvmlDeviceGetName;
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t => device::nvmlDeviceGetUUID;
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t => device::nvmlDeviceGetIndex;
    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t => device::nvmlDeviceGetMinorNumber;
    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t => device::nvmlDeviceGetPciInfo_v3;
    fn nvmlDeviceGetPciInfo_v2(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t => device::nvmlDeviceGetPciInfo_v2;
    fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) -> nvmlReturn_t => device::nvmlDeviceGetCudaComputeCapability;
    fn nvmlDeviceGetMultiGpuBoard(device: nvmlDevice_t, multi: *mut c_uint) -> nvmlReturn_t => device::nvmlDeviceGetMultiGpuBoard;
    fn nvmlDeviceGetNumGpuCores(device: nvmlDevice_t, cores: *mut c_uint) -> nvmlReturn_t => device::nvmlDeviceGetNumGpuCores;
    fn nvmlDeviceGetAttributes_v2(device: nvmlDevice_t, attrs: *mut nvmlDeviceAttributes_t) -> nvmlReturn_t => device::nvmlDeviceGetAttributes_v2;
    fn nvmlDeviceGetAttributes(device: nvmlDevice_t, attrs: *mut nvmlDeviceAttributes_t) -> nvmlReturn_t => device::nvmlDeviceGetAttributes;

    // ---- modes and board state ----
    fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetComputeMode;
    fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetPersistenceMode;
    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetMigMode;
    fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensor: c_uint, temp: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetTemperature;
    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetPowerUsage;
    fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetEnforcedPowerLimit;
    fn nvmlDeviceGetPowerManagementLimit(device: nvmlDevice_t, limit: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetPowerManagementLimit;
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetFanSpeed;
    fn nvmlDeviceGetPerformanceState(device: nvmlDevice_t, pstate: *mut c_uint) -> nvmlReturn_t => board::nvmlDeviceGetPerformanceState;

    // ---- memory and utilisation ----
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t => memory::nvmlDeviceGetMemoryInfo;
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t => memory::nvmlDeviceGetMemoryInfo_v2;
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, util: *mut nvmlUtilization_t) -> nvmlReturn_t => memory::nvmlDeviceGetUtilizationRates;

    // ---- processes ----
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t => process::nvmlDeviceGetComputeRunningProcesses;
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => process::nvmlDeviceGetComputeRunningProcesses_v3;
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => process::nvmlDeviceGetComputeRunningProcesses_v2;
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => process::nvmlDeviceGetGraphicsRunningProcesses_v3;
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => process::nvmlDeviceGetGraphicsRunningProcesses_v2;
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, last_seen_us: u64) -> nvmlReturn_t => process::nvmlDeviceGetProcessUtilization;

    // ---- nvidia-smi's private table ----
    fn nvmlInternalGetExportTable(table: *mut *const usize, guid: *const u8) -> nvmlReturn_t => system::nvmlInternalGetExportTable;

    // ---- events (injected faults: `FAKEGPU_NVML_FAULTS`, see faults.rs) ----
    fn nvmlEventSetCreate(set: *mut *mut std::ffi::c_void) -> nvmlReturn_t => event::nvmlEventSetCreate;
    fn nvmlEventSetFree(set: *mut std::ffi::c_void) -> nvmlReturn_t => event::nvmlEventSetFree;
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, types: *mut u64) -> nvmlReturn_t => event::nvmlDeviceGetSupportedEventTypes;
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, types: u64, set: *mut std::ffi::c_void) -> nvmlReturn_t => event::nvmlDeviceRegisterEvents;
    fn nvmlEventSetWait_v2(set: *mut std::ffi::c_void, data: *mut faults::EventData, timeout_ms: c_uint) -> nvmlReturn_t => event::nvmlEventSetWait_v2;

    // ---- NVLink (PyTorch resolves these at start-up) ----
    fn nvmlDeviceGetNvLinkRemoteDeviceType(device: nvmlDevice_t, _link: c_uint, _kind: *mut c_int) -> nvmlReturn_t => nvlink::nvmlDeviceGetNvLinkRemoteDeviceType;
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: nvmlDevice_t, _link: c_uint, _pci: *mut std::ffi::c_void) -> nvmlReturn_t => nvlink::nvmlDeviceGetNvLinkRemotePciInfo_v2;

    // ---- what nvidia-smi alone looks up (the not-modelled rest: `smi_entry::not_modelled!`) ----
    fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetBrand;
    fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetArchitecture;
    fn nvmlDeviceGetDisplayActive(device: nvmlDevice_t, active: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetDisplayActive;
    fn nvmlDeviceGetAccountingMode(device: nvmlDevice_t, mode: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetAccountingMode;
    fn nvmlDeviceGetVirtualizationMode(device: nvmlDevice_t, mode: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetVirtualizationMode;
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetMaxMigDeviceCount;
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceIsMigDeviceHandle;
    fn nvmlDeviceGetPowerManagementDefaultLimit(device: nvmlDevice_t, limit: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetPowerManagementDefaultLimit;
    fn nvmlDeviceGetEncoderStats(device: nvmlDevice_t, sessions: *mut c_uint, fps: *mut c_uint, latency_us: *mut c_uint) -> nvmlReturn_t => smi_entry::nvmlDeviceGetEncoderStats;
    fn nvmlDeviceGetFBCStats(device: nvmlDevice_t, stats: *mut FbcStats) -> nvmlReturn_t => smi_entry::nvmlDeviceGetFBCStats;
    fn nvmlDeviceGetFieldValues(device: nvmlDevice_t, count: c_int, values: *mut FieldValue) -> nvmlReturn_t => smi_entry::nvmlDeviceGetFieldValues;
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => smi_entry::nvmlDeviceGetMPSComputeRunningProcesses_v3;
    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) -> nvmlReturn_t => smi_entry::nvmlSystemGetProcessName;
    fn nvmlDeviceGetPciInfoExt(device: nvmlDevice_t, info: *mut PciInfoExt) -> nvmlReturn_t => smi_entry::nvmlDeviceGetPciInfoExt;
}
