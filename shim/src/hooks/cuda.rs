//! CUDA driver wrappers: memory queries report the slice, allocation paths go through the
//! `memory` seam, launch paths through the `throttle` seam. (Pitch, pool, VMM-mapping and
//! context wrappers, whose real size only the driver knows, live in `memory::wrappers`.)

use std::ffi::{c_uint, c_void};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::devices;
use crate::memory::{self, AllocTarget, DeviceObject};
use crate::registry::signature as sig;
use crate::report::{slice_view, MemoryView};
use crate::state;
use crate::throttle;

pub unsafe fn mem_get_info(
    real: sig::cuMemGetInfo_v2,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    let result = real(free, total);
    if result != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return result;
    }
    if state::slice_config().is_none() {
        return result;
    }
    let Some(device) = devices::current_cuda_device() else {
        return result;
    };
    if let Some((limit, used)) = memory::cuda_slice(device) {
        let physical = MemoryView {
            total: *total as u64,
            free: *free as u64,
        };
        let view = slice_view(physical, limit, Some(used));
        *total = view.total as usize;
        *free = view.free as usize;
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
    if let Some(limit) = state::slice_config().and_then(|c| devices::cuda_memory_limit(c, device)) {
        *bytes = (limit as usize).min(*bytes);
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

pub unsafe fn array_create(
    real: sig::cuArrayCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        array_bytes(d.Width, d.Height, 0, d.Format, d.NumChannels)
    });
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes,
        || real(array, desc),
        || DeviceObject::Array(memory::read_out(array as *const CUarray).cast()),
    )
}

pub unsafe fn array_3d_create(
    real: sig::cuArray3DCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let bytes = desc.as_ref().map_or(0, |d| {
        if d.Flags & ARRAY3D_WITHOUT_MEMORY != 0 {
            0
        } else {
            array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels)
        }
    });
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes,
        || real(array, desc),
        || DeviceObject::Array(memory::read_out(array as *const CUarray).cast()),
    )
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

pub unsafe fn graph_launch(
    real: sig::cuGraphLaunch,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    throttle::before_launch();
    real(exec, stream)
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
}
