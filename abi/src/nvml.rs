//! NVML types, return codes and constants (nvml.h, r535+ ABI).

use std::ffi::{c_char, c_uint, c_void};

pub type nvmlReturn_t = u32;
pub type nvmlDevice_t = *mut c_void;

pub mod ret {
    use super::nvmlReturn_t;
    pub const NVML_SUCCESS: nvmlReturn_t = 0;
    pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
    pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
    pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
    pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
    pub const NVML_ERROR_ALREADY_INITIALIZED: nvmlReturn_t = 5;
    pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
    pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
    pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
    pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
    pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
    pub const NVML_ERROR_NO_DATA: nvmlReturn_t = 21;
    pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
    pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

    /// `nvmlErrorString` text, `None` for codes this crate does not know.
    pub fn message(code: nvmlReturn_t) -> Option<&'static str> {
        Some(match code {
            NVML_SUCCESS => "Success",
            NVML_ERROR_UNINITIALIZED => "Uninitialized",
            NVML_ERROR_INVALID_ARGUMENT => "Invalid Argument",
            NVML_ERROR_NOT_SUPPORTED => "Not Supported",
            NVML_ERROR_NO_PERMISSION => "Insufficient Permissions",
            NVML_ERROR_ALREADY_INITIALIZED => "Already Initialized",
            NVML_ERROR_NOT_FOUND => "Not Found",
            NVML_ERROR_INSUFFICIENT_SIZE => "Insufficient Size",
            NVML_ERROR_DRIVER_NOT_LOADED => "Driver Not Loaded",
            NVML_ERROR_FUNCTION_NOT_FOUND => "Function Not Found",
            NVML_ERROR_GPU_IS_LOST => "GPU is lost",
            NVML_ERROR_NO_DATA => "No data",
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH => "Argument version mismatch",
            NVML_ERROR_UNKNOWN => "Unknown Error",
            _ => return None,
        })
    }
}

pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;

/// `NVML_STRUCT_VERSION(Memory, 2)`: the version field nvmlDeviceGetMemoryInfo_v2 expects.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// Layout of `nvmlDeviceGetComputeRunningProcesses` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
}

/// Layout of `..._v2` and `..._v3` (`nvmlProcessInfo_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: u64,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

// ---- Added for the fake NVML (fakegpu-nvml) and `fakegpu smi`. ----

pub const NVML_DEVICE_NAME_BUFFER_SIZE: usize = 64;
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 80;
pub const NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE: usize = 80;
/// Size of `nvmlPciInfo_t::busIdLegacy` (`NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`).
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
/// `gpuInstanceId` / `computeInstanceId` of a process on a GPU without MIG
/// (`NVML_VALUE_NOT_AVAILABLE` as an unsigned int).
pub const NVML_VALUE_NOT_AVAILABLE_UINT: c_uint = c_uint::MAX;

/// `nvmlTemperatureSensors_t`.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
/// `nvmlComputeMode_t`.
pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;
/// `nvmlEnableState_t`.
pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_FEATURE_ENABLED: c_uint = 1;
/// `nvmlPstates_t`: P0 is maximum performance, P8 the usual idle state.
pub const NVML_PSTATE_0: c_uint = 0;
pub const NVML_PSTATE_8: c_uint = 8;
pub const NVML_PSTATE_UNKNOWN: c_uint = 32;
/// `nvmlDeviceGetMigMode` current/pending value when MIG is off.
pub const NVML_DEVICE_MIG_DISABLE: c_uint = 0;

/// `nvmlDeviceGetAttributes_v2` (`nvmlDeviceAttributes_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlDeviceAttributes_t {
    pub multiprocessorCount: c_uint,
    pub sharedCopyEngineCount: c_uint,
    pub sharedDecoderCount: c_uint,
    pub sharedEncoderCount: c_uint,
    pub sharedJpegCount: c_uint,
    pub sharedOfaCount: c_uint,
    pub gpuInstanceSliceCount: c_uint,
    pub computeInstanceSliceCount: c_uint,
    pub memorySizeMB: u64,
}
