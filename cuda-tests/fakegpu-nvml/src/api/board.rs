//! Modes and board state: compute, persistence and MIG modes, temperature, power, fan, performance state.

use crate::core::{self, guard, out};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::c_uint;

/// # Safety
/// `mode` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetComputeMode(
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
pub(crate) unsafe fn nvmlDeviceGetPersistenceMode(
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
pub(crate) unsafe fn nvmlDeviceGetMigMode(
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
pub(crate) unsafe fn nvmlDeviceGetTemperature(
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
pub(crate) unsafe fn nvmlDeviceGetPowerUsage(
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
pub(crate) unsafe fn nvmlDeviceGetEnforcedPowerLimit(
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
pub(crate) unsafe fn nvmlDeviceGetPowerManagementLimit(
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
pub(crate) unsafe fn nvmlDeviceGetFanSpeed(
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
pub(crate) unsafe fn nvmlDeviceGetPerformanceState(
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
