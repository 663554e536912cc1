//! Memory handlers: allocation and free paths, pools, VMM, arrays, CUDA graph memory. Each
//! decodes the caller's arguments into values (out-parameters through [`Out`]), makes one
//! call into the `memory` policy (reserve before the driver allocates, settle with what it
//! reports, refund on free), handing it the real call as a closure, and answers in the C ABI.
//!
//! The legacy entry points of the pre-3.2 ABI (`cuMemAlloc`, `cuMemFree`, `cuMemAllocPitch`,
//! `cuArrayCreate`, `cuArray3DCreate`: 32-bit device pointers, sizes and descriptor extents)
//! have `_v1` handlers here that widen what they are given and take the same paths.

use std::ffi::{c_char, c_int, c_uint, c_void};

use gpuslice_abi::cuda::result::{CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use crate::hooks::out::Out;
use crate::hooks::registry::{real, signature as sig};
use crate::memory::arrays::{mipmapped_bytes, owned_array_bytes, ARRAY3D_WITHOUT_MEMORY};
use crate::memory::driver_sized::graph_reservations::{after, instantiated};
use crate::memory::driver_sized::{pitch, pool_reservations, vmm_calls};
use crate::memory::oversubscribe::{self, REFUSED_RANGE};
use crate::memory::{self, AllocTarget, DeviceObject};
use gpuslice_policy::{home_of, PoolHome};

// ---------------------------------------------------------------- plain allocations

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc(
    real: sig::cuMemAlloc_v2,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    if oversubscribe::enabled() {
        // SAFETY: the handler contract, passed on.
        return unsafe { mem_alloc_oversubscribed(real, dptr, bytes) };
    }
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(dptr) };
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes as u64,
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real(dptr, bytes) },
        || DeviceObject::Pointer(out.read_or_default()),
    )
}

/// `cuMemAlloc_v2` in a process that oversubscribes a device (out of line: the ordinary
/// allocation path stays as it is).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[cold]
#[inline(never)]
unsafe fn mem_alloc_oversubscribed(
    real: sig::cuMemAlloc_v2,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(dptr) };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(dptr, bytes) };
    let created = || DeviceObject::Pointer(out.read_or_default());
    if dptr.is_null() {
        // Nothing can be handed back: the driver's own answer (INVALID_VALUE), as ever.
        return memory::allocate(AllocTarget::CurrentContext, bytes as u64, call, created);
    }
    oversubscribe::allocate(bytes as u64, call, created, |pointer| {
        out.write(pointer);
    })
}

/// `cuMemAlloc` of the 32-bit ABI (a device pointer and size of 32 bits, from the low 4 GiB
/// of the address space): charged like `cuMemAlloc_v2`; the pointer is the same address.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc_v1(
    real: sig::cuMemAlloc,
    dptr: *mut c_uint,
    bytes: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(dptr) };
    memory::allocate(
        AllocTarget::CurrentContext,
        u64::from(bytes),
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real(dptr, bytes) },
        || DeviceObject::Pointer(CUdeviceptr::from(out.read_or_default())),
    )
}

/// The 32-bit `cuMemAllocPitch` behind the 64-bit signature, so that one pitch handler
/// (reserve the bound, settle to the pitch the driver chose, undo through `cuMemFree_v2`)
/// serves both ABIs. Extents come from a 32-bit caller and fit.
///
/// # Safety
/// `dptr` and `pitch` are valid for writes (checked non-null by the caller).
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
    // SAFETY: valid out-pointers to locals; by-value extents.
    let result = unsafe {
        real(
            &mut pointer,
            &mut pitch32,
            width_bytes as c_uint,
            height as c_uint,
            element_size,
        )
    };
    if result == CUDA_SUCCESS {
        // SAFETY: this function's contract.
        unsafe {
            Out::new(dptr).write(CUdeviceptr::from(pointer));
            Out::new(pitch).write(pitch32 as usize);
        }
    }
    result
}

/// `cuMemAllocPitch` of the 32-bit ABI: the `cuMemAllocPitch_v2` handler over
/// [`legacy_pitch_as_v2`], its answers narrowed back (they come from 32-bit ones).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc_pitch_v1(
    real: sig::cuMemAllocPitch,
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width_bytes: c_uint,
    height: c_uint,
    element_size: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        // The driver's INVALID_VALUE to return; nothing is allocated.
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real(dptr, pitch, width_bytes, height, element_size) };
    }
    let (mut pointer, mut pitch64): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers to locals, which `legacy_pitch_as_v2` writes.
    let result = unsafe {
        mem_alloc_pitch(
            legacy_pitch_as_v2,
            &mut pointer,
            &mut pitch64,
            width_bytes as usize,
            height as usize,
            element_size,
        )
    };
    if result == CUDA_SUCCESS {
        // SAFETY: the caller's out-parameters (the handler contract).
        unsafe {
            Out::new(dptr).write(pointer as c_uint);
            Out::new(pitch).write(pitch64 as c_uint);
        }
    }
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc_managed(
    real: sig::cuMemAllocManaged,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(dptr) };
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes as u64,
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real(dptr, bytes, flags) },
        || DeviceObject::Pointer(out.read_or_default()),
    )
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_free(real: sig::cuMemFree_v2, dptr: CUdeviceptr) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(dptr) };
    memory::on_free(DeviceObject::Pointer(dptr), result);
    result
}

/// `cuMemFree` of the 32-bit ABI: the same address as the 64-bit pointer it was charged as.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_free_v1(real: sig::cuMemFree, dptr: c_uint) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(dptr) };
    memory::on_free(DeviceObject::Pointer(CUdeviceptr::from(dptr)), result);
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_free_async(
    real: sig::cuMemFreeAsync,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    let result = unsafe { real(dptr, stream) };
    memory::on_free(DeviceObject::Pointer(dptr), result);
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_create(
    real: sig::cuMemCreate,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's properties and out-parameter (the handler contract).
    let (location, out) = unsafe { (prop.as_ref().map(|p| p.location), Out::new(handle)) };
    let target = match location {
        Some(l) if l.type_ == gpuslice_abi::cuda::vmm::CU_MEM_LOCATION_TYPE_DEVICE => {
            AllocTarget::Device(l.id)
        }
        _ => AllocTarget::CurrentContext,
    };
    memory::allocate(
        target,
        size as u64,
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real(handle, size, prop, flags) },
        || DeviceObject::Handle(out.read_or_default()),
    )
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_release(
    real: sig::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(handle) };
    memory::on_free(DeviceObject::Handle(handle), result);
    result
}

/// Charges `bytes` around `create`, which writes the new array to `array`.
fn allocate_array(array: Out<CUarray>, bytes: u64, create: impl FnOnce() -> CUresult) -> CUresult {
    memory::allocate(AllocTarget::CurrentContext, bytes, create, || {
        DeviceObject::Array(array.read().unwrap_or(std::ptr::null_mut()).cast())
    })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn array_create(
    real: sig::cuArrayCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    // SAFETY: the caller's descriptor and out-parameter (the handler contract).
    let (d, out) = unsafe { (desc.as_ref(), Out::new(array)) };
    let bytes = d.map_or(0, |d| {
        owned_array_bytes([d.Width, d.Height, 0], 0, d.Format, d.NumChannels)
    });
    // SAFETY: the caller's arguments, unchanged.
    allocate_array(out, bytes, || unsafe { real(array, desc) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn array_3d_create(
    real: sig::cuArray3DCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    // SAFETY: the caller's descriptor and out-parameter (the handler contract).
    let (d, out) = unsafe { (desc.as_ref(), Out::new(array)) };
    let bytes = d.map_or(0, |d| {
        owned_array_bytes(
            [d.Width, d.Height, d.Depth],
            d.Flags,
            d.Format,
            d.NumChannels,
        )
    });
    // SAFETY: the caller's arguments, unchanged.
    allocate_array(out, bytes, || unsafe { real(array, desc) })
}

/// `cuArrayCreate` of the 32-bit ABI (32-bit extents in the descriptor): charged like v2.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn array_create_v1(
    real: sig::cuArrayCreate,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    // SAFETY: the caller's descriptor and out-parameter (the handler contract).
    let (d, out) = unsafe { (desc.as_ref(), Out::new(array)) };
    let bytes = d.map_or(0, |d| {
        let extents = [d.Width as usize, d.Height as usize, 0];
        owned_array_bytes(extents, 0, d.Format, d.NumChannels)
    });
    // SAFETY: the caller's arguments, unchanged.
    allocate_array(out, bytes, || unsafe { real(array, desc) })
}

/// `cuArray3DCreate` of the 32-bit ABI: charged like v2.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn array_3d_create_v1(
    real: sig::cuArray3DCreate,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    // SAFETY: the caller's descriptor and out-parameter (the handler contract).
    let (d, out) = unsafe { (desc.as_ref(), Out::new(array)) };
    let bytes = d.map_or(0, |d| {
        let extents = [d.Width as usize, d.Height as usize, d.Depth as usize];
        owned_array_bytes(extents, d.Flags, d.Format, d.NumChannels)
    });
    // SAFETY: the caller's arguments, unchanged.
    allocate_array(out, bytes, || unsafe { real(array, desc) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn array_destroy(real: sig::cuArrayDestroy, array: CUarray) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(array) };
    memory::on_free(DeviceObject::Array(array), result);
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mipmapped_array_create(
    real: sig::cuMipmappedArrayCreate,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    // SAFETY: the caller's descriptor and out-parameter (the handler contract).
    let (d, out) = unsafe { (desc.as_ref(), Out::new(array)) };
    let bytes = d.map_or(0, |d| {
        if d.Flags & ARRAY3D_WITHOUT_MEMORY != 0 {
            0
        } else {
            mipmapped_bytes(d, levels)
        }
    });
    memory::allocate(
        AllocTarget::CurrentContext,
        bytes,
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real(array, desc, levels) },
        || DeviceObject::MipmappedArray(out.read().unwrap_or(std::ptr::null_mut()).cast()),
    )
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mipmapped_array_destroy(
    real: sig::cuMipmappedArrayDestroy,
    array: CUmipmappedArray,
) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(array) };
    memory::on_free(DeviceObject::MipmappedArray(array), result);
    result
}

// ---------------------------------------------------------------- managed memory advice

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_advise(
    real: sig::cuMemAdvise,
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    device: CUdevice,
) -> CUresult {
    if oversubscribe::refuses_range(ptr) {
        return REFUSED_RANGE;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(ptr, count, advice, device) }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_advise_v2(
    real: sig::cuMemAdvise_v2,
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    location: CUmemLocation,
) -> CUresult {
    if oversubscribe::refuses_range(ptr) {
        return REFUSED_RANGE;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(ptr, count, advice, location) }
}

/// `cuMemPrefetchAsync[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_prefetch(
    real: sig::cuMemPrefetchAsync,
    ptr: CUdeviceptr,
    count: usize,
    device: CUdevice,
    stream: CUstream,
) -> CUresult {
    if oversubscribe::refuses_range(ptr) {
        return REFUSED_RANGE;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(ptr, count, device, stream) }
}

/// `cuMemPrefetchAsync_v2[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_prefetch_v2(
    real: sig::cuMemPrefetchAsync_v2,
    ptr: CUdeviceptr,
    count: usize,
    location: CUmemLocation,
    flags: c_uint,
    stream: CUstream,
) -> CUresult {
    if oversubscribe::refuses_range(ptr) {
        return REFUSED_RANGE;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(ptr, count, location, flags, stream) }
}

/// `cuMemPrefetchBatchAsync` and `cuMemDiscardAndPrefetchBatchAsync` (and `_ptsz`): refused
/// when any of the ranges is host-placed memory.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn mem_prefetch_batch(
    real: sig::cuMemPrefetchBatchAsync,
    ptrs: *mut CUdeviceptr,
    sizes: *mut usize,
    count: usize,
    locations: *mut CUmemLocation,
    location_indices: *mut usize,
    location_count: usize,
    flags: u64,
    stream: CUstream,
) -> CUresult {
    if oversubscribe::enabled() && !ptrs.is_null() {
        // SAFETY: the caller passes `count` pointers (the driver's contract).
        let pointers = unsafe { std::slice::from_raw_parts(ptrs, count) };
        if pointers.iter().any(|&p| oversubscribe::refuses_range(p)) {
            return REFUSED_RANGE;
        }
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe {
        real(
            ptrs,
            sizes,
            count,
            locations,
            location_indices,
            location_count,
            flags,
            stream,
        )
    }
}

// ---------------------------------------------------------------- pitch, pools, VMM

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc_pitch(
    real: sig::cuMemAllocPitch_v2,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-parameters (the handler contract).
    let (out_ptr, out_pitch) = unsafe { (Out::new(dptr), Out::new(pitch)) };
    let call = || {
        // SAFETY: the caller's arguments, unchanged.
        let result = unsafe { real(dptr, pitch, width_bytes, height, element_size) };
        let allocated = out_ptr.read().zip(out_pitch.read());
        (result, allocated.map(|(ptr, pitch)| (ptr, pitch as u64)))
    };
    let undone = || {
        // What the driver leaves behind on failure.
        out_ptr.write(0);
        out_pitch.write(0);
    };
    pitch::allocate(width_bytes as u64, height as u64, call, undone)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc_async(
    real: sig::cuMemAllocAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(dptr) };
    let per_thread = real::cuMemAllocAsync_ptsz().is_some_and(|p| p as usize == real as usize);
    // SAFETY: the caller's arguments, unchanged.
    let call = || (unsafe { real(dptr, bytes, stream) }, out.read());
    pool_reservations::alloc_async(bytes, stream, per_thread, call, || {
        out.write(0);
    })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_alloc_from_pool_async(
    real: sig::cuMemAllocFromPoolAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(dptr) };
    let per_thread =
        real::cuMemAllocFromPoolAsync_ptsz().is_some_and(|p| p as usize == real as usize);
    // SAFETY: the caller's arguments, unchanged.
    let call = || (unsafe { real(dptr, bytes, pool, stream) }, out.read());
    pool_reservations::alloc_from_pool_async(pool as u64, bytes, stream, per_thread, call, || {
        out.write(0);
    })
}

/// cuMemPoolCreate: the pool lives where `props->location` says (a host pool on no GPU).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_pool_create(
    real: sig::cuMemPoolCreate,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(pool, props) };
    // SAFETY: the caller's out-parameter and properties (the handler contract).
    let (created, props) = unsafe { (Out::new(pool).read(), props.as_ref()) };
    if let (CUDA_SUCCESS, Some(created), Some(props)) = (result, created, props) {
        let location = props.location;
        pool_reservations::learn_pool_home(created as u64, home_of(location.type_, location.id));
    }
    result
}

/// cuDeviceGetDefaultMemPool / cuDeviceGetMemPool: the answer is a pool of `dev`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn device_get_mem_pool(
    real: sig::cuDeviceGetMemPool,
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(pool, dev) };
    // SAFETY: the caller's out-parameter (the handler contract).
    let found = unsafe { Out::new(pool).read() };
    if let (CUDA_SUCCESS, Some(found)) = (result, found) {
        pool_reservations::learn_pool_home(found as u64, Some(PoolHome::Device(dev)));
    }
    result
}

/// cuDeviceSetMemPool: the driver accepts only a pool of `dev`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn device_set_mem_pool(
    real: sig::cuDeviceSetMemPool,
    dev: CUdevice,
    pool: CUmemoryPool,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    let result = unsafe { real(dev, pool) };
    if result == CUDA_SUCCESS {
        pool_reservations::learn_pool_home(pool as u64, Some(PoolHome::Device(dev)));
    }
    result
}

/// cuMemPoolDestroy: refunded at once if nothing is allocated from the pool, else when the
/// last of its allocations is freed (see [`pool_reservations::destroy`]).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_pool_destroy(real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    pool_reservations::destroy(pool as u64, || unsafe { real(pool) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_pool_trim_to(
    real: sig::cuMemPoolTrimTo,
    pool: CUmemoryPool,
    keep: usize,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    let result = unsafe { real(pool, keep) };
    if result == CUDA_SUCCESS {
        pool_reservations::trimmed(pool as u64);
    }
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_map(
    real: sig::cuMemMap,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    let result = unsafe { real(ptr, size, offset, handle, flags) };
    if result == CUDA_SUCCESS {
        vmm_calls::mapped(ptr, size as u64, handle);
    }
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_unmap(real: sig::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    vmm_calls::unmapping(ptr, size, || unsafe { real(ptr, size) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_address_free(
    real: sig::cuMemAddressFree,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    vmm_calls::unmapping(ptr, size, || unsafe { real(ptr, size) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn mem_retain_allocation_handle(
    real: sig::cuMemRetainAllocationHandle,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(handle, addr) };
    // SAFETY: the caller's out-parameter (the handler contract).
    let retained = unsafe { Out::new(handle).read() };
    if let (CUDA_SUCCESS, Some(retained)) = (result, retained) {
        vmm_calls::retained(retained);
    }
    result
}

// ---------------------------------------------------------------- CUDA graph memory

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn instantiate(
    real: sig::cuGraphInstantiate_v2,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged; `exec` is the caller's out-parameter.
    unsafe {
        instantiated(
            real(exec, graph, error_node, log, log_size),
            Out::new(exec).read(),
        )
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn instantiate_with_flags(
    real: sig::cuGraphInstantiateWithFlags,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    // SAFETY: as for `instantiate`.
    unsafe { instantiated(real(exec, graph, flags), Out::new(exec).read()) }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn instantiate_with_params(
    real: sig::cuGraphInstantiateWithParams,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: as for `instantiate`.
    unsafe { instantiated(real(exec, graph, params), Out::new(exec).read()) }
}

/// `cuGraphUpload[_ptsz]`: the exec's memory is reserved now.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn upload(
    real: sig::cuGraphUpload,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    let result = unsafe { real(exec, stream) };
    if result == CUDA_SUCCESS {
        after(Some(exec as u64), None);
    }
    result
}

/// `cuGraphExecDestroy`: its memory stays in the graph pool (unused) until a trim; a driver
/// that releases it at once shows it in the reading.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn exec_destroy(real: sig::cuGraphExecDestroy, exec: CUgraphExec) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(exec) };
    if result == CUDA_SUCCESS {
        after(Some(exec as u64), None);
    }
    result
}

/// `cuDeviceGraphMemTrim`: what no live exec uses goes back to the card.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn trim(real: sig::cuDeviceGraphMemTrim, device: CUdevice) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(device) };
    if result == CUDA_SUCCESS {
        after(None, Some(device));
    }
    result
}
