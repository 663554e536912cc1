//! Virtual memory management: physical handles, reserved ranges, mappings and access.

use crate::*;

pub(crate) fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> R<()> {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(handle, cu().mem_create(size as u64, &get(prop)?, flags)?)
}

pub(crate) fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> R<()> {
    cu().mem_release(handle)
}

pub(crate) fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    align: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> R<()> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        ptr,
        cu().mem_address_reserve(size as u64, align as u64, addr, flags)?,
    )
}

pub(crate) fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> R<()> {
    cu().mem_address_free(ptr, size as u64)
}

pub(crate) fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> R<()> {
    cu().mem_map(ptr, size as u64, offset as u64, handle, flags)
}

pub(crate) fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> R<()> {
    cu().mem_unmap(ptr, size as u64)
}

pub(crate) fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> R<()> {
    if desc.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes `count` descriptors at `desc` (checked non-null).
    let d = unsafe { std::slice::from_raw_parts(desc, count) };
    cu().mem_set_access(ptr, size as u64, d)
}

pub(crate) fn cuMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_int,
) -> R<()> {
    if g.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(g, cu().mem_granularity(&get(prop)?, option)? as usize)
}

pub(crate) fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> R<()> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(prop, cu().mem_allocation_prop(handle)?)
}

pub(crate) fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> R<()> {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(handle, cu().mem_retain_handle(addr as u64)?)
}
