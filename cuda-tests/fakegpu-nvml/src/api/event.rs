//! Event sets: the injected faults (`FAKEGPU_NVML_FAULTS`, see `faults`) raised as NVML events.

use crate::core::{self, guard, out};
use crate::faults;
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::c_uint;

/// The event types the fake can raise (the injectable faults).
const SUPPORTED_EVENTS: u64 =
    faults::EVENT_SINGLE_BIT_ECC | faults::EVENT_DOUBLE_BIT_ECC | faults::EVENT_XID_CRITICAL;

/// # Safety
/// `set` must be null or a valid `nvmlEventSet_t*`.
pub(crate) unsafe fn nvmlEventSetCreate(set: *mut *mut std::ffi::c_void) -> nvmlReturn_t {
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
pub(crate) unsafe fn nvmlEventSetFree(set: *mut std::ffi::c_void) -> nvmlReturn_t {
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
pub(crate) unsafe fn nvmlDeviceGetSupportedEventTypes(
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
pub(crate) unsafe fn nvmlDeviceRegisterEvents(
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
pub(crate) unsafe fn nvmlEventSetWait_v2(
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
