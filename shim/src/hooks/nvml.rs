//! NVML wrappers: memory info reports the slice (what nvidia-smi and pynvml show): total =
//! limit, used = the container's usage from the region, free = the clamped remainder. The
//! process lists (filtered to the slice, PIDs translated) are in `memory::wrappers`.

use gpuslice_abi::nvml::ret::NVML_SUCCESS;
use gpuslice_abi::nvml::*;

use crate::memory;
use crate::registry::signature as sig;
use crate::report::{nvml_slice_view, NvmlView};
use crate::state;

/// The slice's view of `device` given the driver's physical one; `None` when the device
/// is not limited (or no slice is configured), so the driver's answer stands.
fn slice_view_of(device: nvmlDevice_t, physical: NvmlView) -> Option<NvmlView> {
    state::slice_config()?;
    let (limit, used) = memory::nvml_slice(device)?;
    Some(nvml_slice_view(physical, limit, Some(used)))
}

pub unsafe fn device_get_memory_info(
    real: sig::nvmlDeviceGetMemoryInfo,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let result = real(device, memory);
    if result != NVML_SUCCESS || memory.is_null() {
        return result;
    }
    let m = &mut *memory;
    // v1 has no reserved field: its `used` includes what v2 calls reserved.
    let physical = NvmlView {
        total: m.total,
        reserved: 0,
        used: m.used,
        free: m.free,
    };
    if let Some(view) = slice_view_of(device, physical) {
        m.total = view.total;
        m.used = view.used + view.reserved;
        m.free = view.free;
    }
    result
}

pub unsafe fn device_get_memory_info_v2(
    real: sig::nvmlDeviceGetMemoryInfo_v2,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let result = real(device, memory);
    if result != NVML_SUCCESS || memory.is_null() {
        return result;
    }
    let m = &mut *memory;
    let physical = NvmlView {
        total: m.total,
        reserved: m.reserved,
        used: m.used,
        free: m.free,
    };
    if let Some(view) = slice_view_of(device, physical) {
        m.total = view.total;
        m.reserved = view.reserved;
        m.used = view.used;
        m.free = view.free;
    }
    result
}
