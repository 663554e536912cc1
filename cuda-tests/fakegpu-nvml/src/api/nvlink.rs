//! NVLink: the simulated GPUs have none (PyTorch resolves these at start-up).

use crate::core::{self, guard};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_int, c_uint};

/// The simulated GPUs have no NVLink: every link query is NVML_ERROR_NOT_SUPPORTED, as
/// on a PCIe card (after the device handle is checked).
///
/// # Safety
/// `kind` must be null or a valid pointer (it is never written).
pub(crate) unsafe fn nvmlDeviceGetNvLinkRemoteDeviceType(
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
pub(crate) unsafe fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    _link: c_uint,
    _pci: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}
