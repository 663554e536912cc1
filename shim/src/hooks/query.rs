//! Query handlers: what the memory queries report (`cuMemGetInfo`, `cuDeviceTotalMem` and
//! their 32-bit forms): the slice's view of the device, computed from the driver's figures
//! (`gpuslice_policy::slice_view`), widened by the host part where the slice oversubscribes
//! the device (`memory::oversubscribe`).

use std::ffi::c_uint;

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::ground::devices;
use crate::hooks::lifecycle;
use crate::hooks::out::Out;
use crate::hooks::registry::{real, signature as sig};
use crate::memory;
use crate::memory::oversubscribe;
use gpuslice_policy::{slice_view, MemoryView};

/// The slice's view of the current context's device given the driver's `physical` figures;
/// `None` when no slice limits that device (no slice at all: no region is attached, which
/// `memory::cuda_slice` sees first). Called after the driver answered the query with
/// success, so a context is current (in a process that sees one device, device 0).
#[inline(always)]
fn current_slice_view(physical: impl FnOnce() -> MemoryView) -> Option<MemoryView> {
    let device = devices::current_context_device()?;
    let mut card = None;
    let (limit, used) = memory::cuda_slice(device, || card.insert(physical()).free)?;
    let view = slice_view(card?, limit, Some(used));
    Some(oversubscribe::cuda_view(device, view))
}

/// The memory limit of `device` in the slice, `None` when unlimited: the one in force in the
/// slice's region (bound once per device), else the configuration's.
fn device_limit(device: CUdevice) -> Option<u64> {
    let config = lifecycle::slice_config()?;
    match memory::cuda_limit(device) {
        Some(limit) => limit,
        None => devices::cuda_memory_limit(config, device),
    }
}

/// A byte count as the 32-bit ABI reports it: clamped, as the driver clamps, never wrapped.
pub fn clamp_u32(bytes: u64) -> c_uint {
    bytes.min(u64::from(c_uint::MAX)) as c_uint
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn mem_get_info(
    real: sig::cuMemGetInfo_v2,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(free, total) };
    if result != CUDA_SUCCESS {
        return result;
    }
    // SAFETY: the caller's out-parameters (the handler contract), written by the driver.
    let (free, total) = unsafe { (Out::new(free), Out::new(total)) };
    let (Some(card_free), Some(card_total)) = (free.read(), total.read()) else {
        return result;
    };
    let physical = || MemoryView {
        total: card_total as u64,
        free: card_free as u64,
    };
    if let Some(view) = current_slice_view(physical) {
        total.write(view.total as usize);
        free.write(view.free as usize);
    }
    result
}

/// The card's (free, total) in full through the real 64-bit `cuMemGetInfo_v2`.
fn physical_mem_info() -> Option<MemoryView> {
    let get = real::cuMemGetInfo_v2()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers for the call.
    (unsafe { get(&mut free, &mut total) } == CUDA_SUCCESS).then_some(MemoryView {
        total: total as u64,
        free: free as u64,
    })
}

/// `cuMemGetInfo` of the 32-bit ABI: the slice, clamped to 32 bits. The slice is computed
/// from the card's full figures (a clamped free minus the slice's use would come out wrong
/// for slices above 4 GiB), the 32-bit ones serving only when the 64-bit call is missing.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn mem_get_info_v1(
    real: sig::cuMemGetInfo,
    free: *mut c_uint,
    total: *mut c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(free, total) };
    if result != CUDA_SUCCESS {
        return result;
    }
    // SAFETY: the caller's out-parameters (the handler contract), written by the driver.
    let (free, total) = unsafe { (Out::new(free), Out::new(total)) };
    let (Some(card_free), Some(card_total)) = (free.read(), total.read()) else {
        return result;
    };
    let physical = || {
        physical_mem_info().unwrap_or(MemoryView {
            total: u64::from(card_total),
            free: u64::from(card_free),
        })
    };
    if let Some(view) = current_slice_view(physical) {
        total.write(clamp_u32(view.total));
        free.write(clamp_u32(view.free));
    }
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn device_total_mem(
    real: sig::cuDeviceTotalMem_v2,
    bytes: *mut usize,
    device: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(bytes, device) };
    if result != CUDA_SUCCESS {
        return result;
    }
    // SAFETY: the caller's out-parameter (the handler contract), written by the driver.
    let bytes = unsafe { Out::new(bytes) };
    let Some(card) = bytes.read() else {
        return result;
    };
    if let Some(limit) = device_limit(device) {
        let excess = oversubscribe::configured_excess(device).unwrap_or(0);
        bytes.write((limit as usize).min(card).saturating_add(excess as usize));
    }
    result
}

/// `cuDeviceTotalMem` of the 32-bit ABI: min(limit, card), clamped to 32 bits (the card's
/// full size from `cuDeviceTotalMem_v2` where the driver has it).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn device_total_mem_v1(
    real: sig::cuDeviceTotalMem,
    bytes: *mut c_uint,
    device: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(bytes, device) };
    if result != CUDA_SUCCESS {
        return result;
    }
    // SAFETY: the caller's out-parameter (the handler contract), written by the driver.
    let bytes = unsafe { Out::new(bytes) };
    let Some(card32) = bytes.read() else {
        return result;
    };
    if let Some(limit) = device_limit(device) {
        let mut full = 0usize;
        let card = real::cuDeviceTotalMem_v2()
            // SAFETY: valid out-pointer for the call.
            .filter(|total| unsafe { total(&mut full, device) } == CUDA_SUCCESS)
            .map_or(u64::from(card32), |_| full as u64);
        let excess = oversubscribe::configured_excess(device).unwrap_or(0);
        bytes.write(clamp_u32(limit.min(card).saturating_add(excess)));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_32_bit_abi_clamps_and_never_wraps() {
        assert_eq!(clamp_u32(0), 0);
        assert_eq!(clamp_u32(1 << 30), 1 << 30);
        assert_eq!(clamp_u32(u64::from(u32::MAX)), u32::MAX);
        assert_eq!(clamp_u32(4 << 30), u32::MAX, "4 GiB does not wrap to 0");
        assert_eq!(clamp_u32(80 << 30), u32::MAX);
    }
}
