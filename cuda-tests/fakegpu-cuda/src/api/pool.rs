//! Stream-ordered allocation and memory pools.

use crate::*;

pub(crate) fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, s: CUstream) -> R<()> {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(dptr, cu().mem_alloc_async(size as u64, None, h(s))?)
}

pub(crate) fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> R<()> {
    cu().mem_free_async(dptr, h(s))
}

pub(crate) fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> R<()> {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        dptr,
        cu().mem_alloc_async(size as u64, Some(h(pool)), h(s))?,
    )
}

pub(crate) fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> R<()> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pool, hp(cu().pool_create(&get(props)?)?))
}

pub(crate) fn cuMemPoolDestroy(pool: CUmemoryPool) -> R<()> {
    cu().pool_destroy(h(pool))
}

pub(crate) fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> R<()> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pool, hp(cu().device_default_pool(dev)?))
}

pub(crate) fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> R<()> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pool, hp(cu().device_get_pool(dev)?))
}

pub(crate) fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> R<()> {
    cu().device_set_pool(dev, h(pool))
}

pub(crate) fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> R<()> {
    // REUSE_* attributes are ints; the others are cuuint64_t.
    let v = if (1..=3).contains(&attr) {
        get(value as *const c_int)? as u64
    } else {
        get(value as *const u64)?
    };
    cu().pool_set_attribute(h(pool), attr, v)
}

pub(crate) fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> R<()> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let v = cu().pool_get_attribute(h(pool), attr)?;
    if (1..=3).contains(&attr) {
        put(value as *mut c_int, v as c_int)
    } else {
        put(value as *mut u64, v)
    }
}

pub(crate) fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> R<()> {
    cu().pool_trim_to(h(pool), keep as u64)
}

pub(crate) fn cuMemGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    loc: *const CUmemLocation,
    ty: c_int,
) -> R<()> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = pool_location(get(loc)?, ty)?;
    put(pool, hp(cu().device_default_pool(dev)?))
}

pub(crate) fn cuMemGetMemPool(
    pool: *mut CUmemoryPool,
    loc: *const CUmemLocation,
    ty: c_int,
) -> R<()> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = pool_location(get(loc)?, ty)?;
    put(pool, hp(cu().device_get_pool(dev)?))
}

pub(crate) fn cuMemSetMemPool(loc: *const CUmemLocation, ty: c_int, pool: CUmemoryPool) -> R<()> {
    let dev = pool_location(get(loc)?, ty)?;
    cu().device_set_pool(dev, h(pool))
}

pub(crate) fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> R<()> {
    cu().pool_get_attribute(h(pool), 1)?;
    for i in 0..count {
        // SAFETY: the caller passes `count` descriptors.
        let d = get(unsafe { desc.add(i) })?;
        // Only the pool's own device exists for it: access to it is always read-write.
        if d.location.type_ != 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        cu().device_spec(d.location.id)?;
        if d.flags != 3 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
    }
    Ok(())
}

pub(crate) fn cuMemPoolGetAccess(
    flags: *mut c_uint,
    pool: CUmemoryPool,
    loc: *const CUmemLocation,
) -> R<()> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().pool_get_attribute(h(pool), 1)?;
    let l = get(loc)?;
    if l.type_ != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().device_spec(l.id)?;
    put(flags, 3) // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
}

/// Device of a `cuMem*MemPool` location: device pools only (CU_MEM_ALLOCATION_TYPE_PINNED).
fn pool_location(loc: CUmemLocation, ty: c_int) -> R<CUdevice> {
    if ty != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if loc.type_ != 1 {
        eprintln!("fakegpu: host memory pools are not simulated: CUDA_ERROR_NOT_SUPPORTED");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(loc.id)
}
