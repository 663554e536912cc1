//! Init, shutdown, error strings, the system-wide versions and nvidia-smi's private table.

use crate::core::{self, guard, out};
use crate::export_table;
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_int, c_uint};

pub(crate) unsafe fn nvmlInit_v2() -> nvmlReturn_t {
    guard(|| core::init(0))
}

pub(crate) unsafe fn nvmlInit() -> nvmlReturn_t {
    guard(|| core::init(0))
}

pub(crate) unsafe fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    guard(|| core::init(flags))
}

pub(crate) unsafe fn nvmlShutdown() -> nvmlReturn_t {
    guard(core::shutdown)
}

/// Static NUL-terminated text for every code; unknown codes get "Unknown Error" like the
/// real library.
pub(crate) unsafe fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    core::error_string(result).as_ptr()
}

/// # Safety
/// `version` must be null or point to `length` writable bytes.
pub(crate) unsafe fn nvmlSystemGetDriverVersion(
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
pub(crate) unsafe fn nvmlSystemGetNVMLVersion(
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
pub(crate) unsafe fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        core::initialized()?;
        // SAFETY: the caller passes null or a valid int pointer.
        *unsafe { out(version) }? = fakegpu::nvml_view::cuda_driver_version();
        Ok(())
    })
}

/// # Safety
/// `version` must be null or a valid `int*`.
pub(crate) unsafe fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: same contract as the v1 entry point.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

/// # Safety
/// `table` must be null or writable; `guid` null or 16 readable bytes.
pub(crate) unsafe fn nvmlInternalGetExportTable(
    table: *mut *const usize,
    guid: *const u8,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { export_table::get_export_table(table, guid) }
}
