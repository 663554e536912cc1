//! Device enumeration (counts and handles) and identity (name, UUID, index, PCI, compute capability, attributes).

use crate::core::{self, guard, out};
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_int, c_uint};

/// # Safety
/// `count` must be null or a valid `unsigned int*`.
pub(crate) unsafe fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let state = core::initialized()?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(count) }? = core::device_count(state);
        Ok(())
    })
}

/// # Safety
/// `count` must be null or a valid `unsigned int*`.
pub(crate) unsafe fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: same contract as v2; v1 differs only for devices the caller may not access.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// # Safety
/// `device` must be null or a valid `nvmlDevice_t*`.
pub(crate) unsafe fn nvmlDeviceGetHandleByIndex_v2(
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
pub(crate) unsafe fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: same contract as v2.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `uuid` must be null or a NUL-terminated string; `device` null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetHandleByUUID(
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
pub(crate) unsafe fn nvmlDeviceGetHandleByPciBusId_v2(
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
pub(crate) unsafe fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: same contract as v2.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// # Safety
/// `name` must be null or point to `length` writable bytes.
pub(crate) unsafe fn nvmlDeviceGetName(
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
pub(crate) unsafe fn nvmlDeviceGetUUID(
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
pub(crate) unsafe fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(index) }? = dev.index;
        Ok(())
    })
}

/// # Safety
/// `minor` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetMinorNumber(
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
pub(crate) unsafe fn nvmlDeviceGetPciInfo_v3(
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
pub(crate) unsafe fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: v2 and v3 share `nvmlPciInfo_t`; v3 only fixed how busId is formatted.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// # Safety
/// `major` and `minor` must be null or valid pointers.
pub(crate) unsafe fn nvmlDeviceGetCudaComputeCapability(
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
pub(crate) unsafe fn nvmlDeviceGetMultiGpuBoard(
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
pub(crate) unsafe fn nvmlDeviceGetNumGpuCores(
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
pub(crate) unsafe fn nvmlDeviceGetAttributes_v2(
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
pub(crate) unsafe fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attrs: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    // SAFETY: same struct and contract as v2.
    unsafe { nvmlDeviceGetAttributes_v2(device, attrs) }
}
