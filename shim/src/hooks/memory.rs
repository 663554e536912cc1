//! Memory handlers: allocation and free paths, pools, VMM, arrays, CUDA graph memory. Each
//! reads the caller's arguments, goes through the `memory` policy (reserve before the driver
//! allocates, settle with what it reports, refund on free) and answers in the C ABI.
//!
//! The legacy entry points of the pre-3.2 ABI (`cuMemAlloc`, `cuMemFree`, `cuMemAllocPitch`,
//! `cuArrayCreate`, `cuArray3DCreate`: 32-bit device pointers, sizes and descriptor extents)
//! have `_v1` handlers here that widen what they are given and take the same paths.

use std::ffi::{c_char, c_uint, c_void};

use gpuslice_abi::cuda::result::{
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::*;

use crate::hooks::registry::{real, signature as sig};
use crate::memory::arrays::{mipmapped_bytes, owned_array_bytes, ARRAY3D_WITHOUT_MEMORY};
use crate::memory::driver_sized::{
    apply, current_limited_device, free_async_like, learn_pool_home, limited_device, pool_alloc,
    pool_home, reread_locked, stream_device, unmapping,
};
use crate::memory::graphs::{after, instantiated};
use crate::memory::ledger::{charge_size, lock, pitch_upper_bound, Settled};
use crate::memory::objects::{Charged, ObjectKind};
use crate::memory::pools::{home_of, PoolHome};
use crate::memory::{self, charge_or_refuse, current_context, process, AllocTarget, DeviceObject};

// ---------------------------------------------------------------- plain allocations

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
    let result = mem_alloc_pitch(
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

// ---------------------------------------------------------------- pitch, pools, VMM

pub unsafe fn mem_alloc_pitch(
    real: sig::cuMemAllocPitch_v2,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let (Some(process), Some((_, device))) = (process(), current_limited_device()) else {
        return real(dptr, pitch, width_bytes, height, element_size);
    };
    let bound = charge_size(pitch_upper_bound(width_bytes as u64).saturating_mul(height as u64));
    if let Err(code) = charge_or_refuse(process, device, bound) {
        return code;
    }
    let result = real(dptr, pitch, width_bytes, height, element_size);
    if result != CUDA_SUCCESS || dptr.is_null() || pitch.is_null() {
        process.ledger.refund(device, bound);
        return result;
    }
    let actual = charge_size((*pitch as u64).saturating_mul(height as u64));
    let allocated = *dptr;
    let settled = process.ledger.settle_or_undo(device, bound, actual, || {
        // SAFETY: `allocated` is the allocation the driver just made, not yet handed out.
        real::cuMemFree_v2().is_some_and(|free| unsafe { free(allocated) } == CUDA_SUCCESS)
    });
    match settled {
        Settled::Charged => {}
        Settled::Undone => {
            // What the driver leaves behind on failure.
            *dptr = 0;
            *pitch = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        Settled::PastLimit => crate::log_error!(
            "pitch allocation spent {actual} bytes, past the slice's limit, and could not be freed; charged in full"
        ),
    }
    process.ledger.track(
        ObjectKind::Pointer,
        *dptr,
        Charged {
            device,
            bytes: actual,
            pool: 0,
            context: current_context(),
        },
    );
    result
}

pub unsafe fn mem_alloc_async(
    real: sig::cuMemAllocAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let Some(process) = process() else {
        return real(dptr, bytes, stream);
    };
    // The stream's device's current pool, whatever context is current.
    let Some(ordinal) = stream_device(stream) else {
        return real(dptr, bytes, stream);
    };
    let Some(device) = limited_device(ordinal) else {
        return real(dptr, bytes, stream);
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let found = real::cuDeviceGetMemPool().map(|get| get(&mut pool, ordinal));
    if found != Some(CUDA_SUCCESS) || pool.is_null() {
        // No pool to read: charge it like a plain allocation on the stream's device.
        return memory::allocate(
            AllocTarget::Device(ordinal),
            bytes as u64,
            || real(dptr, bytes, stream),
            || DeviceObject::Pointer(memory::read_out(dptr)),
        );
    }
    lock(&process.ledger.pool_homes).learned(pool as u64, Some(PoolHome::Device(ordinal)));
    let per_thread = real::cuMemAllocAsync_ptsz().is_some_and(|p| p as usize == real as usize);
    let free = free_async_like(per_thread);
    pool_alloc(
        process,
        device,
        pool as u64,
        dptr,
        bytes,
        || real(dptr, bytes, stream),
        |ptr| free(stream, ptr),
    )
}

pub unsafe fn mem_alloc_from_pool_async(
    real: sig::cuMemAllocFromPoolAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let Some(process) = process() else {
        return real(dptr, bytes, pool, stream);
    };
    // Charged to the pool's device, which may not be the stream's (nor the current one).
    let ordinal = match pool_home(process, pool as u64) {
        Some(PoolHome::Host) => return real(dptr, bytes, pool, stream),
        Some(PoolHome::Device(ordinal)) => Some(ordinal),
        None => stream_device(stream),
    };
    let Some(device) = ordinal.and_then(limited_device) else {
        return real(dptr, bytes, pool, stream);
    };
    let per_thread =
        real::cuMemAllocFromPoolAsync_ptsz().is_some_and(|p| p as usize == real as usize);
    let free = free_async_like(per_thread);
    pool_alloc(
        process,
        device,
        pool as u64,
        dptr,
        bytes,
        || real(dptr, bytes, pool, stream),
        |ptr| free(stream, ptr),
    )
}

/// cuMemPoolCreate: the pool lives where `props->location` says (a host pool on no GPU).
pub unsafe fn mem_pool_create(
    real: sig::cuMemPoolCreate,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    let result = real(pool, props);
    if result == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
        let location = (*props).location;
        learn_pool_home(*pool as u64, home_of(location.type_, location.id));
    }
    result
}

/// cuDeviceGetDefaultMemPool / cuDeviceGetMemPool: the answer is a pool of `dev`.
pub unsafe fn device_get_mem_pool(
    real: sig::cuDeviceGetMemPool,
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    let result = real(pool, dev);
    if result == CUDA_SUCCESS && !pool.is_null() {
        learn_pool_home(*pool as u64, Some(PoolHome::Device(dev)));
    }
    result
}

/// cuDeviceSetMemPool: the driver accepts only a pool of `dev`.
pub unsafe fn device_set_mem_pool(
    real: sig::cuDeviceSetMemPool,
    dev: CUdevice,
    pool: CUmemoryPool,
) -> CUresult {
    let result = real(dev, pool);
    if result == CUDA_SUCCESS {
        learn_pool_home(pool as u64, Some(PoolHome::Device(dev)));
    }
    result
}

/// cuMemPoolDestroy: the pool is read one last time before (its handle names nothing after);
/// then it is refunded at once if nothing is allocated from it, else when the last of its
/// allocations is freed (the driver releases it then).
pub unsafe fn mem_pool_destroy(real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> CUresult {
    let Some(process) = process() else {
        return real(pool);
    };
    let mut book = lock(&process.ledger.pools);
    if let Some(device) = book.device_of(pool as u64) {
        reread_locked(process, &mut book, pool as u64, device);
    }
    let result = real(pool);
    if result == CUDA_SUCCESS {
        let settle = book.destroyed(pool as u64);
        drop(book);
        apply(process, settle);
        lock(&process.ledger.pool_homes).forget(pool as u64);
    }
    result
}

pub unsafe fn mem_pool_trim_to(
    real: sig::cuMemPoolTrimTo,
    pool: CUmemoryPool,
    keep: usize,
) -> CUresult {
    let result = real(pool, keep);
    if result == CUDA_SUCCESS {
        if let Some(process) = process() {
            let mut book = lock(&process.ledger.pools);
            if let Some(device) = book.device_of(pool as u64) {
                reread_locked(process, &mut book, pool as u64, device);
            }
        }
    }
    result
}

pub unsafe fn mem_map(
    real: sig::cuMemMap,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let result = real(ptr, size, offset, handle, flags);
    if result == CUDA_SUCCESS {
        if let Some(process) = process() {
            lock(&process.ledger.vmm).mapped(ptr, size as u64, handle);
        }
    }
    result
}

pub unsafe fn mem_unmap(real: sig::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> CUresult {
    unmapping(ptr, size, || real(ptr, size))
}

pub unsafe fn mem_address_free(
    real: sig::cuMemAddressFree,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    unmapping(ptr, size, || real(ptr, size))
}

pub unsafe fn mem_retain_allocation_handle(
    real: sig::cuMemRetainAllocationHandle,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    let result = real(handle, addr);
    if result == CUDA_SUCCESS && !handle.is_null() {
        if let Some(process) = process() {
            lock(&process.ledger.vmm).retained(*handle);
        }
    }
    result
}

// ---------------------------------------------------------------- CUDA graph memory

pub unsafe fn instantiate(
    real: sig::cuGraphInstantiate_v2,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    instantiated(real(exec, graph, error_node, log, log_size), exec)
}

pub unsafe fn instantiate_with_flags(
    real: sig::cuGraphInstantiateWithFlags,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    instantiated(real(exec, graph, flags), exec)
}

pub unsafe fn instantiate_with_params(
    real: sig::cuGraphInstantiateWithParams,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut c_void,
) -> CUresult {
    instantiated(real(exec, graph, params), exec)
}

/// `cuGraphUpload[_ptsz]`: the exec's memory is reserved now.
pub unsafe fn upload(real: sig::cuGraphUpload, exec: CUgraphExec, stream: CUstream) -> CUresult {
    let result = real(exec, stream);
    if result == CUDA_SUCCESS {
        after(Some(exec as u64), None);
    }
    result
}

/// `cuGraphExecDestroy`: its memory stays in the graph pool (unused) until a trim; a driver
/// that releases it at once shows it in the reading.
pub unsafe fn exec_destroy(real: sig::cuGraphExecDestroy, exec: CUgraphExec) -> CUresult {
    let result = real(exec);
    if result == CUDA_SUCCESS {
        after(Some(exec as u64), None);
    }
    result
}

/// `cuDeviceGraphMemTrim`: what no live exec uses goes back to the card.
pub unsafe fn trim(real: sig::cuDeviceGraphMemTrim, device: CUdevice) -> CUresult {
    let result = real(device);
    if result == CUDA_SUCCESS {
        after(None, Some(device));
    }
    result
}
