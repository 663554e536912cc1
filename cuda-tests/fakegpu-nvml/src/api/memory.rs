//! Memory and utilisation: what the card holds and how busy it is.

use crate::core::{self, guard, out};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;

/// # Safety
/// `memory` must be null or a valid `nvmlMemory_t*`.
pub(crate) unsafe fn nvmlDeviceGetMemoryInfo(
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
pub(crate) unsafe fn nvmlDeviceGetMemoryInfo_v2(
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
pub(crate) unsafe fn nvmlDeviceGetUtilizationRates(
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
