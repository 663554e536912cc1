//! Device and host memory: allocation, copies (1D, 2D, peer), memsets, pointer attributes, host registration, managed memory advice and stream memory operations.

use crate::*;

pub(crate) fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> R<()> {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(dptr, cu().mem_alloc_legacy(bytesize)?)
}

pub(crate) fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> R<()> {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(dptr, cu().mem_alloc(bytesize as u64)?)
}

pub(crate) fn cuMemAllocPitch(
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> R<()> {
    if dptr.is_null() || pitch.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (p, pi) = cu().mem_alloc_pitch_legacy(width, height, elem)?;
    put(dptr, p)?;
    put(pitch, pi)
}

pub(crate) fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> R<()> {
    if dptr.is_null() || pitch.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (p, pi) = cu().mem_alloc_pitch(width as u64, height as u64, elem)?;
    put(dptr, p)?;
    put(pitch, pi as usize)
}

pub(crate) fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> R<()> {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(dptr, cu().mem_alloc_managed(bytesize as u64, flags)?)
}

pub(crate) fn cuMemFree(dptr: c_uint) -> R<()> {
    cu().mem_free(dptr.into())
}

pub(crate) fn cuMemFree_v2(dptr: CUdeviceptr) -> R<()> {
    cu().mem_free(dptr)
}

pub(crate) fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> R<()> {
    if free.is_null() || total.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (f, t) = cu().mem_get_info()?;
    put(free, clamp_u32(f))?;
    put(total, clamp_u32(t))
}

pub(crate) fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> R<()> {
    if free.is_null() || total.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (f, t) = cu().mem_get_info()?;
    put(free, f as usize)?;
    put(total, t as usize)
}

pub(crate) fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> R<()> {
    let (b, s) = cu().mem_address_range(dptr)?;
    put_opt(pbase, b);
    put_opt(psize, s as usize);
    Ok(())
}

pub(crate) fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> R<()> {
    if pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pp, hp(cu().mem_alloc_host(bytesize as u64)?))
}

pub(crate) fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> R<()> {
    if pp.is_null() || flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pp, hp(cu().mem_alloc_host(bytesize as u64)?))
}

pub(crate) fn cuMemFreeHost(p: *mut c_void) -> R<()> {
    cu().mem_free_host(h(p))
}

pub(crate) fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> R<()> {
    memcpy(dst, true, src as u64, false, n, true)
}

pub(crate) fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> R<()> {
    memcpy(dst as u64, false, src, true, n, true)
}

pub(crate) fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> R<()> {
    memcpy(dst, true, src, true, n, true)
}

pub(crate) fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> R<()> {
    memcpy_async(dst, true, src as u64, false, n, s)
}

pub(crate) fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> R<()> {
    memcpy_async(dst as u64, false, src, true, n, s)
}

pub(crate) fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> R<()> {
    cu().memset(dst, v as u32, 1, n as u64)
}

pub(crate) fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> R<()> {
    cu().memset(dst, v, 4, n as u64)
}

pub(crate) fn cuMemsetD8Async(dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) -> R<()> {
    memset_async(dst, v as u32, 1, n, s)
}

pub(crate) fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) -> R<()> {
    memset_async(dst, v, 4, n, s)
}

pub(crate) fn cuStreamWriteValue32(
    s: CUstream,
    addr: CUdeviceptr,
    v: c_uint,
    _flags: c_uint,
) -> R<()> {
    memset_async(addr, v, 4, 1, s)
}

pub(crate) fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> R<()> {
    memcpy(dst, is_dev(dst)?, src, is_dev(src)?, n, true)
}

pub(crate) fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> R<()> {
    memcpy_async(dst, is_dev(dst)?, src, is_dev(src)?, n, s)
}

pub(crate) fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> R<()> {
    memcpy_async(dst, true, src, true, n, s)
}

pub(crate) fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dctx: CUcontext,
    src: CUdeviceptr,
    sctx: CUcontext,
    n: usize,
) -> R<()> {
    cu().ctx_id(h(dctx))?;
    cu().ctx_id(h(sctx))?;
    memcpy(dst, true, src, true, n, true)
}

pub(crate) fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dctx: CUcontext,
    src: CUdeviceptr,
    sctx: CUcontext,
    n: usize,
    s: CUstream,
) -> R<()> {
    cu().ctx_id(h(dctx))?;
    cu().ctx_id(h(sctx))?;
    memcpy_async(dst, true, src, true, n, s)
}

pub(crate) fn cuMemcpy2D_v2(p: *const CUDA_MEMCPY2D) -> R<()> {
    memcpy_2d(get(p)?, None)
}

pub(crate) fn cuMemcpy2DAsync_v2(p: *const CUDA_MEMCPY2D, s: CUstream) -> R<()> {
    memcpy_2d(get(p)?, Some(s))
}

pub(crate) fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, ptr: CUdeviceptr) -> R<()> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let info = cu().pointer_info(ptr)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_pointer_attr(data, attr, ptr, Some(&info))
}

pub(crate) fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> R<()> {
    if n == 0 || attrs.is_null() || data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Unknown pointers are not an error here: their attributes read as zero/null.
    let info = cu().pointer_info(ptr)?;
    for i in 0..n as usize {
        // SAFETY: the caller passes `n` attributes and `n` out-pointers.
        let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
        if d.is_null() {
            continue;
        }
        write_pointer_attr(d, a, ptr, info.as_ref())?;
    }
    Ok(())
}

pub(crate) fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> R<()> {
    if flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().host_register(p as u64, size as u64)
}

pub(crate) fn cuMemHostUnregister(p: *mut c_void) -> R<()> {
    cu().host_unregister(p as u64)
}

pub(crate) fn cuMemHostGetDevicePointer_v2(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> R<()> {
    if dptr.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match cu().pointer_info(p as u64)? {
        // Unified addressing: the host address is the device address.
        Some(i) if i.memory_type == CU_MEMORYTYPE_HOST => put(dptr, p as CUdeviceptr),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub(crate) fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> R<()> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match cu().pointer_info(p as u64)? {
        Some(i) if i.memory_type == CU_MEMORYTYPE_HOST => put(flags, 0),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub(crate) fn cuMemPrefetchAsync(ptr: CUdeviceptr, n: usize, dev: CUdevice, s: CUstream) -> R<()> {
    prefetch_or_advise(ptr, n, dev, Some(s), 0)
}

pub(crate) fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    n: usize,
    loc: CUmemLocation,
    _flags: c_uint,
    s: CUstream,
) -> R<()> {
    prefetch_or_advise(ptr, n, location_device(loc)?, Some(s), 0)
}

pub(crate) fn cuMemAdvise(ptr: CUdeviceptr, n: usize, advice: c_int, dev: CUdevice) -> R<()> {
    if !(1..=6).contains(&advice) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    prefetch_or_advise(ptr, n, dev, None, advice)
}

pub(crate) fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    n: usize,
    advice: c_int,
    loc: CUmemLocation,
) -> R<()> {
    if !(1..=6).contains(&advice) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    prefetch_or_advise(ptr, n, location_device(loc)?, None, advice)
}

pub(crate) fn cuMemRangeGetAttribute(
    data: *mut c_void,
    size: usize,
    attribute: c_int,
    ptr: CUdeviceptr,
    n: usize,
) -> R<()> {
    range_attribute(data, size, attribute, ptr, n)
}

pub(crate) fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    sizes: *mut usize,
    attributes: *mut c_int,
    count: usize,
    ptr: CUdeviceptr,
    n: usize,
) -> R<()> {
    if data.is_null() || sizes.is_null() || attributes.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..count {
        // SAFETY: the caller passes `count` of each.
        let (d, size, attribute) = unsafe { (*data.add(i), *sizes.add(i), *attributes.add(i)) };
        range_attribute(d, size, attribute, ptr, n)?;
    }
    Ok(())
}

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_MEMCPY2D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcMemoryType: c_uint,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: *mut c_void,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: c_uint,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: *mut c_void,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}

/// Whether an address is device memory of this process (unified addressing).
fn is_dev(p: CUdeviceptr) -> R<bool> {
    Ok(cu()
        .pointer_info(p)?
        .is_some_and(|i| i.memory_type == CU_MEMORYTYPE_DEVICE))
}

/// A 2D copy, row by row; arrays are not simulated as copy endpoints.
fn memcpy_2d(p: CUDA_MEMCPY2D, stream: Option<CUstream>) -> R<()> {
    if let Some(s) = stream {
        cu().stream_info(h(s))?;
    }
    let side = |ty: c_uint, host: u64, dev: u64| -> R<(u64, bool)> {
        match ty {
            1 => Ok((host, false)),
            2 => Ok((dev, true)),
            4 => Ok((dev, is_dev(dev)?)),
            3 => {
                eprintln!("fakegpu: cuMemcpy2D with a CUDA array is not simulated: CUDA_ERROR_NOT_SUPPORTED");
                Err(CUDA_ERROR_NOT_SUPPORTED)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    let (src, sdev) = side(p.srcMemoryType, p.srcHost as u64, p.srcDevice)?;
    let (dst, ddev) = side(p.dstMemoryType, p.dstHost as u64, p.dstDevice)?;
    if p.WidthInBytes > p.srcPitch.max(p.WidthInBytes)
        || (p.Height > 1 && (p.WidthInBytes > p.srcPitch || p.WidthInBytes > p.dstPitch))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for row in 0..p.Height {
        let s = src + ((p.srcY + row) * p.srcPitch + p.srcXInBytes) as u64;
        let d = dst + ((p.dstY + row) * p.dstPitch + p.dstXInBytes) as u64;
        memcpy(d, ddev, s, sdev, p.WidthInBytes, stream.is_none())?;
    }
    Ok(())
}

fn write_pointer_attr(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
    info: Option<&fakegpu::cuda::runtime_support::PointerInfo>,
) -> R<()> {
    let dev = info.is_some_and(|i| i.memory_type == CU_MEMORYTYPE_DEVICE);
    match attr {
        1 => put(data as *mut CUcontext, hp(info.map_or(0, |i| i.ctx))),
        2 => put(data as *mut c_uint, info.map_or(0, |i| i.memory_type)),
        // Unified addressing: one address for host and device.
        3 => put(
            data as *mut CUdeviceptr,
            if info.is_some() { ptr } else { 0 },
        ),
        4 => match info {
            Some(i) if i.memory_type == CU_MEMORYTYPE_HOST || i.managed => {
                put(data as *mut u64, ptr)
            }
            Some(_) => Err(CUDA_ERROR_INVALID_VALUE),
            None => put(data as *mut u64, 0),
        },
        6 | 10 | 15 => put(data as *mut c_int, 0), // SYNC_MEMOPS, IS_LEGACY_CUDA_IPC_CAPABLE, RDMA
        7 => put(data as *mut u64, info.map_or(0, |i| i.buffer_id)),
        8 => put(data as *mut c_int, info.is_some_and(|i| i.managed) as c_int),
        9 => put(data as *mut c_int, info.map_or(-2, |i| i.dev as c_int)),
        11 => put(data as *mut CUdeviceptr, info.map_or(0, |i| i.base)),
        12 => put(data as *mut usize, info.map_or(0, |i| i.size as usize)),
        13 => put(data as *mut c_int, info.is_some() as c_int),
        14 => put(data as *mut u64, 0), // ALLOWED_HANDLE_TYPES: none
        16 => put(data as *mut c_int, if info.is_some() { 3 } else { 0 }), // ACCESS_FLAGS: read-write
        17 => put(
            data as *mut CUmemoryPool,
            hp(info.and_then(|i| i.pool).unwrap_or(0)),
        ),
        18 => put(data as *mut usize, info.map_or(0, |i| i.size as usize)),
        19 => put(data as *mut CUdeviceptr, info.map_or(0, |i| i.base)),
        20 => put(data as *mut u64, info.map_or(0, |i| i.buffer_id)),
        _ => {
            let _ = dev;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

fn location_device(loc: CUmemLocation) -> R<CUdevice> {
    match loc.type_ {
        1 => Ok(loc.id),            // CU_MEM_LOCATION_TYPE_DEVICE
        2..=4 => Ok(CU_DEVICE_CPU), // HOST, HOST_NUMA, HOST_NUMA_CURRENT
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

const CU_DEVICE_CPU: CUdevice = -1;

/// A prefetch or advice over a managed range. With residency (`FAKEGPU_MANAGED_MEMORY=
/// on-demand`) the fake's `managed` model takes it; without, managed memory lives on its
/// device and a valid request (over any device range) has nothing to move.
fn prefetch_or_advise(
    ptr: CUdeviceptr,
    n: usize,
    dev: CUdevice,
    s: Option<CUstream>,
    advice: c_int,
) -> R<()> {
    if cu().managed_on_demand() {
        return match s {
            Some(s) => cu().mem_prefetch(ptr, n as u64, dev, h(s)),
            None => cu().mem_advise(ptr, n as u64, advice, dev),
        };
    }
    if let Some(s) = s {
        cu().stream_info(h(s))?;
    }
    if dev != CU_DEVICE_CPU {
        cu().device_spec(dev)?;
    }
    match cu().pointer_info(ptr)? {
        Some(i) if i.memory_type == CU_MEMORYTYPE_DEVICE && ptr + n as u64 <= i.base + i.size => {
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemRangeGetAttribute`: 4-byte values (`size / 4` of them for the accessed-by list),
/// answered by the fake's managed memory model.
fn range_attribute(data: *mut c_void, size: usize, attribute: c_int, ptr: u64, n: usize) -> R<()> {
    if data.is_null() || size == 0 || !size.is_multiple_of(4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let values = cu().mem_range_attribute(ptr, n as u64, attribute, size / 4)?;
    for (i, value) in values.into_iter().enumerate() {
        // SAFETY: the caller's buffer holds `size` bytes, `size / 4` values.
        unsafe { (data as *mut c_int).add(i).write_unaligned(value) };
    }
    Ok(())
}

fn memcpy(dst: u64, dst_dev: bool, src: u64, src_dev: bool, n: usize, sync: bool) -> R<()> {
    cu().memcpy(dst, dst_dev, src, src_dev, n as u64, sync)
}

fn memcpy_async(
    dst: u64,
    dst_dev: bool,
    src: u64,
    src_dev: bool,
    n: usize,
    stream: CUstream,
) -> R<()> {
    cu().stream_info(h(stream))?;
    memcpy(dst, dst_dev, src, src_dev, n, false)
}

fn memset_async(dst: CUdeviceptr, v: u32, elem: u64, n: usize, stream: CUstream) -> R<()> {
    cu().stream_info(h(stream))?;
    cu().memset(dst, v, elem, n as u64)
}
