//! CUDA driver wrappers: memory queries report the slice, allocation paths go through the
//! `memory` seam, launch paths through the `throttle` seam. (Pitch, pool, VMM-mapping and
//! context wrappers, whose real size only the driver knows, live in `memory::wrappers`.)
//!
//! The legacy entry points of the pre-3.2 ABI (`cuMemAlloc`, `cuMemFree`, `cuMemGetInfo`,
//! `cuDeviceTotalMem`, `cuMemAllocPitch`, `cuArrayCreate`, `cuArray3DCreate`: 32-bit device
//! pointers, sizes and descriptor extents) have `_v1` handlers here that widen what they are
//! given and take the same paths; the deprecated launches (`cuLaunch`, `cuLaunchGrid[Async]`)
//! pass the throttle like every launch.

use std::ffi::{c_int, c_uint, c_void};

use gpuslice_abi::cuda::result::{CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use crate::ground::devices;
use crate::hooks::registry::{real, signature as sig};
use crate::lifecycle;
use crate::memory::report::{slice_view, MemoryView};
use crate::memory::{self, wrappers as mem, AllocTarget, DeviceObject};
use crate::throttle;

/// The slice's view of the current context's device given the driver's `physical` figures;
/// `None` when no slice limits that device.
fn current_slice_view(physical: impl FnOnce() -> MemoryView) -> Option<MemoryView> {
    lifecycle::slice_config()?;
    let device = devices::current_cuda_device()?;
    let (limit, used) = memory::cuda_slice(device)?;
    Some(slice_view(physical(), limit, Some(used)))
}

/// The memory limit of `device` in the slice, `None` when unlimited.
fn device_limit(device: CUdevice) -> Option<u64> {
    lifecycle::slice_config().and_then(|c| devices::cuda_memory_limit(c, device))
}

/// A byte count as the 32-bit ABI reports it: clamped, as the driver clamps, never wrapped.
pub fn clamp_u32(bytes: u64) -> c_uint {
    bytes.min(u64::from(c_uint::MAX)) as c_uint
}

pub unsafe fn mem_get_info(
    real: sig::cuMemGetInfo_v2,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    let result = real(free, total);
    if result != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return result;
    }
    let physical = || MemoryView {
        total: *total as u64,
        free: *free as u64,
    };
    if let Some(view) = current_slice_view(physical) {
        *total = view.total as usize;
        *free = view.free as usize;
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
pub unsafe fn mem_get_info_v1(
    real: sig::cuMemGetInfo,
    free: *mut c_uint,
    total: *mut c_uint,
) -> CUresult {
    let result = real(free, total);
    if result != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return result;
    }
    let physical = || {
        physical_mem_info().unwrap_or(MemoryView {
            total: u64::from(*total),
            free: u64::from(*free),
        })
    };
    if let Some(view) = current_slice_view(physical) {
        *total = clamp_u32(view.total);
        *free = clamp_u32(view.free);
    }
    result
}

pub unsafe fn device_total_mem(
    real: sig::cuDeviceTotalMem_v2,
    bytes: *mut usize,
    device: CUdevice,
) -> CUresult {
    let result = real(bytes, device);
    if result != CUDA_SUCCESS || bytes.is_null() {
        return result;
    }
    if let Some(limit) = device_limit(device) {
        *bytes = (limit as usize).min(*bytes);
    }
    result
}

/// `cuDeviceTotalMem` of the 32-bit ABI: min(limit, card), clamped to 32 bits (the card's
/// full size from `cuDeviceTotalMem_v2` where the driver has it).
pub unsafe fn device_total_mem_v1(
    real: sig::cuDeviceTotalMem,
    bytes: *mut c_uint,
    device: CUdevice,
) -> CUresult {
    let result = real(bytes, device);
    if result != CUDA_SUCCESS || bytes.is_null() {
        return result;
    }
    if let Some(limit) = device_limit(device) {
        let mut full = 0usize;
        let card = real::cuDeviceTotalMem_v2()
            // SAFETY: valid out-pointer for the call.
            .filter(|total| unsafe { total(&mut full, device) } == CUDA_SUCCESS)
            .map_or(u64::from(*bytes), |_| full as u64);
        *bytes = clamp_u32(limit.min(card));
    }
    result
}

pub unsafe fn mem_alloc(
    real: sig::cuMemAlloc_v2,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes as u64,
        || real(dptr, bytes),
        || DeviceObject::Pointer(memory::read_out(dptr)),
    )
}

/// `cuMemAlloc` of the 32-bit ABI (a device pointer and size of 32 bits, from the low 4 GiB
/// of the address space): charged like `cuMemAlloc_v2`; the pointer is the same address.
pub unsafe fn mem_alloc_v1(real: sig::cuMemAlloc, dptr: *mut c_uint, bytes: c_uint) -> CUresult {
    memory::allocate(
        AllocTarget::CurrentContext,
        u64::from(bytes),
        || real(dptr, bytes),
        || DeviceObject::Pointer(CUdeviceptr::from(memory::read_out(dptr))),
    )
}

/// The 32-bit `cuMemAllocPitch` behind the 64-bit signature, so that one pitch handler
/// (reserve the bound, settle to the pitch the driver chose, undo through `cuMemFree_v2`)
/// serves both ABIs. Extents come from a 32-bit caller and fit.
unsafe extern "C" fn legacy_pitch_as_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let Some(real) = real::cuMemAllocPitch() else {
        return CUDA_ERROR_NOT_SUPPORTED;
    };
    let (mut pointer, mut pitch32): (c_uint, c_uint) = (0, 0);
    let result = real(
        &mut pointer,
        &mut pitch32,
        width_bytes as c_uint,
        height as c_uint,
        element_size,
    );
    if result == CUDA_SUCCESS {
        *dptr = CUdeviceptr::from(pointer);
        *pitch = pitch32 as usize;
    }
    result
}

/// `cuMemAllocPitch` of the 32-bit ABI: the `cuMemAllocPitch_v2` handler over
/// [`legacy_pitch_as_v2`], its answers narrowed back (they come from 32-bit ones).
pub unsafe fn mem_alloc_pitch_v1(
    real: sig::cuMemAllocPitch,
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width_bytes: c_uint,
    height: c_uint,
    element_size: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        // The driver's INVALID_VALUE to return; nothing is allocated.
        return real(dptr, pitch, width_bytes, height, element_size);
    }
    let (mut pointer, mut pitch64): (CUdeviceptr, usize) = (0, 0);
    let result = mem::mem_alloc_pitch(
        legacy_pitch_as_v2,
        &mut pointer,
        &mut pitch64,
        width_bytes as usize,
        height as usize,
        element_size,
    );
    if result == CUDA_SUCCESS {
        *dptr = pointer as c_uint;
        *pitch = pitch64 as c_uint;
    }
    result
}

pub unsafe fn mem_alloc_managed(
    real: sig::cuMemAllocManaged,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes as u64,
        || real(dptr, bytes, flags),
        || DeviceObject::Pointer(memory::read_out(dptr)),
    )
}

pub unsafe fn mem_free(real: sig::cuMemFree_v2, dptr: CUdeviceptr) -> CUresult {
    let result = real(dptr);
    memory::on_free(DeviceObject::Pointer(dptr), result);
    result
}

/// `cuMemFree` of the 32-bit ABI: the same address as the 64-bit pointer it was charged as.
pub unsafe fn mem_free_v1(real: sig::cuMemFree, dptr: c_uint) -> CUresult {
    let result = real(dptr);
    memory::on_free(DeviceObject::Pointer(CUdeviceptr::from(dptr)), result);
    result
}

pub unsafe fn mem_free_async(
    real: sig::cuMemFreeAsync,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    let result = real(dptr, stream);
    memory::on_free(DeviceObject::Pointer(dptr), result);
    result
}

pub unsafe fn mem_create(
    real: sig::cuMemCreate,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let target = if prop.is_null() || (*prop).location.type_ != vmm::CU_MEM_LOCATION_TYPE_DEVICE {
        AllocTarget::CurrentContext
    } else {
        AllocTarget::Device((*prop).location.id)
    };
    memory::allocate(
        target,
        size as u64,
        || real(handle, size, prop, flags),
        || DeviceObject::Handle(memory::read_out(handle)),
    )
}

pub unsafe fn mem_release(
    real: sig::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let result = real(handle);
    memory::on_free(DeviceObject::Handle(handle), result);
    result
}

/// Bytes per texel charged for a format this build does not know (packed, block-compressed,
/// NV12, future formats): no CUDA array format spends more than 16 bytes (4 x 32-bit
/// channels) per texel. The driver cannot be asked afterwards: cuArrayGetMemoryRequirements
/// answers only for arrays created with CUDA_ARRAY3D_DEFERRED_MAPPING.
pub const UNKNOWN_FORMAT_TEXEL_BYTES: u64 = 16;

/// `CUDA_ARRAY3D_SPARSE` and `CUDA_ARRAY3D_DEFERRED_MAPPING`: such arrays own no memory; it is
/// mapped into them later from `cuMemCreate` handles, which are charged themselves.
const ARRAY3D_WITHOUT_MEMORY: c_uint = 0x40 | 0x80;

/// Bytes of a `width x height x depth` array of `channels` elements of `format`; an unknown
/// format is charged the upper bound [`UNKNOWN_FORMAT_TEXEL_BYTES`] per texel.
pub fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
) -> u64 {
    let element = match array_format_bytes(format) {
        Some(bytes) => bytes as u64 * u64::from(channels),
        None => UNKNOWN_FORMAT_TEXEL_BYTES,
    };
    [width, height, depth].iter().fold(element, |acc, &extent| {
        acc.saturating_mul(extent.max(1) as u64)
    })
}

/// Bytes of a mipmapped array: every level halves each extent (never below 1).
pub fn mipmapped_bytes(desc: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> u64 {
    let (mut w, mut h, mut d) = (desc.Width, desc.Height, desc.Depth);
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.saturating_add(array_bytes(w, h, d, desc.Format, desc.NumChannels));
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        d = if d == 0 { 0 } else { (d / 2).max(1) };
    }
    total
}

/// Bytes an array of this descriptor owns: none for a sparse or deferred-mapping 3-D array
/// (`flags`; 0 for a 2-D descriptor), else [`array_bytes`].
fn owned_array_bytes(extents: [usize; 3], flags: c_uint, format: c_uint, channels: c_uint) -> u64 {
    if flags & ARRAY3D_WITHOUT_MEMORY != 0 {
        return 0;
    }
    let [width, height, depth] = extents;
    array_bytes(width, height, depth, format, channels)
}

/// Charges `bytes` around `create`, which writes the new array to `array`.
unsafe fn allocate_array(
    array: *mut CUarray,
    bytes: u64,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    memory::allocate(AllocTarget::CurrentContext, bytes, create, || {
        DeviceObject::Array(memory::read_out(array as *const CUarray).cast())
    })
}

pub unsafe fn array_create(
    real: sig::cuArrayCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        owned_array_bytes([d.Width, d.Height, 0], 0, d.Format, d.NumChannels)
    });
    allocate_array(array, bytes, || real(array, desc))
}

pub unsafe fn array_3d_create(
    real: sig::cuArray3DCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        owned_array_bytes(
            [d.Width, d.Height, d.Depth],
            d.Flags,
            d.Format,
            d.NumChannels,
        )
    });
    allocate_array(array, bytes, || real(array, desc))
}

/// `cuArrayCreate` of the 32-bit ABI (32-bit extents in the descriptor): charged like v2.
pub unsafe fn array_create_v1(
    real: sig::cuArrayCreate,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        let extents = [d.Width as usize, d.Height as usize, 0];
        owned_array_bytes(extents, 0, d.Format, d.NumChannels)
    });
    allocate_array(array, bytes, || real(array, desc))
}

/// `cuArray3DCreate` of the 32-bit ABI: charged like v2.
pub unsafe fn array_3d_create_v1(
    real: sig::cuArray3DCreate,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        let extents = [d.Width as usize, d.Height as usize, d.Depth as usize];
        owned_array_bytes(extents, d.Flags, d.Format, d.NumChannels)
    });
    allocate_array(array, bytes, || real(array, desc))
}

pub unsafe fn array_destroy(real: sig::cuArrayDestroy, array: CUarray) -> CUresult {
    let result = real(array);
    memory::on_free(DeviceObject::Array(array), result);
    result
}

pub unsafe fn mipmapped_array_create(
    real: sig::cuMipmappedArrayCreate,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        if d.Flags & ARRAY3D_WITHOUT_MEMORY != 0 {
            0
        } else {
            mipmapped_bytes(d, levels)
        }
    });
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes,
        || real(array, desc, levels),
        || DeviceObject::MipmappedArray(memory::read_out(array as *const CUmipmappedArray).cast()),
    )
}

pub unsafe fn mipmapped_array_destroy(
    real: sig::cuMipmappedArrayDestroy,
    array: CUmipmappedArray,
) -> CUresult {
    let result = real(array);
    memory::on_free(DeviceObject::MipmappedArray(array), result);
    result
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel(
    real: sig::cuLaunchKernel,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    throttle::before_launch();
    real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
}

pub unsafe fn launch_kernel_ex(
    real: sig::cuLaunchKernelEx,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // A NULL config is the driver's INVALID_VALUE to return; it enqueues nothing to gate.
    if !config.is_null() {
        throttle::before_launch();
    }
    real(config, f, params, extra)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative_kernel(
    real: sig::cuLaunchCooperativeKernel,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    throttle::before_launch();
    real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported): one launch per
/// entry, each billed on its stream's device. A list the driver will refuse (null, empty,
/// more entries than devices can exist) is passed through ungated.
pub unsafe fn launch_cooperative_kernel_multi_device(
    real: sig::cuLaunchCooperativeKernelMultiDevice,
    list: *mut CUDA_LAUNCH_PARAMS,
    n: c_uint,
    flags: c_uint,
) -> CUresult {
    if !list.is_null() && (1..=gpuslice_common::MAX_DEVICES as c_uint).contains(&n) {
        for i in 0..n as usize {
            // SAFETY: the caller passes `n` valid entries (the CUDA API's contract).
            let stream = unsafe { (*list.add(i)).hStream };
            throttle::before_launch_on_stream(stream);
        }
    }
    real(list, n, flags)
}

pub unsafe fn graph_launch(
    real: sig::cuGraphLaunch,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    throttle::before_launch();
    let result = real(exec, stream);
    if result == CUDA_SUCCESS {
        // The first launch of an exec reserves its graph memory (one relaxed load otherwise).
        memory::graphs::launched(exec);
    }
    result
}

/// `cuLaunch` (deprecated): a 1x1 grid of the function's block shape, on the legacy stream.
pub unsafe fn launch(real: sig::cuLaunch, f: CUfunction) -> CUresult {
    throttle::before_launch();
    real(f)
}

/// `cuLaunchGrid` (deprecated).
pub unsafe fn launch_grid(
    real: sig::cuLaunchGrid,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
) -> CUresult {
    throttle::before_launch();
    real(f, grid_width, grid_height)
}

/// `cuLaunchGridAsync` (deprecated).
pub unsafe fn launch_grid_async(
    real: sig::cuLaunchGridAsync,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    stream: CUstream,
) -> CUresult {
    throttle::before_launch();
    real(f, grid_width, grid_height, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_follow_format_channels_and_extents() {
        // 1024 x 768 float4: 16 bytes per element.
        assert_eq!(array_bytes(1024, 768, 0, 0x20, 4), 1024 * 768 * 16);
        // 1-D array: height 0 counts as 1.
        assert_eq!(array_bytes(100, 0, 0, 0x01, 1), 100);
        assert_eq!(
            array_bytes(100, 10, 10, 0xff, 1),
            100 * 10 * 10 * UNKNOWN_FORMAT_TEXEL_BYTES,
            "unknown format: the per-texel upper bound"
        );
    }

    #[test]
    fn mipmaps_sum_their_levels() {
        let desc = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 8,
            Height: 8,
            Depth: 0,
            Format: 0x01,
            NumChannels: 1,
            Flags: 0,
        };
        assert_eq!(mipmapped_bytes(&desc, 4), 64 + 16 + 4 + 1);
    }

    #[test]
    fn the_32_bit_abi_clamps_and_never_wraps() {
        assert_eq!(clamp_u32(0), 0);
        assert_eq!(clamp_u32(1 << 30), 1 << 30);
        assert_eq!(clamp_u32(u64::from(u32::MAX)), u32::MAX);
        assert_eq!(clamp_u32(4 << 30), u32::MAX, "4 GiB does not wrap to 0");
        assert_eq!(clamp_u32(80 << 30), u32::MAX);
    }
}
