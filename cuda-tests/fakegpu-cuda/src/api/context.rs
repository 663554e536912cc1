//! Contexts: primary contexts, `cuCtx*` creation, the current-context stack, limits and configs.

use crate::*;

pub(crate) fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> R<()> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pctx, hp(cu().primary_retain(dev)?))
}

pub(crate) fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> R<()> {
    cu().primary_release(dev)
}

pub(crate) fn cuDevicePrimaryCtxReset(dev: CUdevice) -> R<()> {
    cu().primary_reset(dev)
}

pub(crate) fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> R<()> {
    if flags.is_null() || active.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (f, a) = cu().primary_state(dev)?;
    put(flags, f)?;
    put(active, a as c_int)
}

pub(crate) fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> R<()> {
    cu().primary_set_flags(dev, flags)
}

pub(crate) fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> R<()> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pctx, hp(cu().ctx_create(flags, dev)?))
}

pub(crate) fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _num: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> R<()> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pctx, hp(cu().ctx_create(flags, dev)?))
}

pub(crate) fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> R<()> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pctx, hp(cu().ctx_create(flags, dev)?))
}

pub(crate) fn cuCtxDestroy(ctx: CUcontext) -> R<()> {
    cu().ctx_destroy(h(ctx))
}

pub(crate) fn cuCtxPushCurrent_v2(ctx: CUcontext) -> R<()> {
    cu().ctx_push(h(ctx))
}

pub(crate) fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> R<()> {
    let c = cu().ctx_pop()?;
    put_opt(pctx, hp(c));
    Ok(())
}

pub(crate) fn cuCtxSetCurrent(ctx: CUcontext) -> R<()> {
    cu().ctx_set_current(h(ctx))
}

pub(crate) fn cuCtxGetCurrent(pctx: *mut CUcontext) -> R<()> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pctx, hp(cu().ctx_get_current()?))
}

pub(crate) fn cuCtxGetDevice(device: *mut CUdevice) -> R<()> {
    if device.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(device, cu().ctx_device()?)
}

pub(crate) fn cuCtxSynchronize() -> R<()> {
    cu().ctx_synchronize()
}

pub(crate) fn cuCtxSetLimit(limit: c_int, value: usize) -> R<()> {
    cu().ctx_set_limit(limit, value as u64)
}

pub(crate) fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> R<()> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(value, cu().ctx_get_limit(limit)? as usize)
}

pub(crate) fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> R<()> {
    if version.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(version, cu().ctx_api_version(h(ctx))?)
}

pub(crate) fn cuCtxGetFlags(flags: *mut c_uint) -> R<()> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(flags, cu().ctx_flags()?)
}

pub(crate) fn cuCtxGetId(ctx: CUcontext, id: *mut c_ulonglong) -> R<()> {
    if id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(id, cu().ctx_id(h(ctx))?)
}

pub(crate) fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> R<()> {
    cu().current()?;
    // The range stream creation clamps to (see fakegpu::cuda::stream).
    put_opt(least, 0);
    put_opt(greatest, -5);
    Ok(())
}

pub(crate) fn cuCtxGetCacheConfig(cfg: *mut c_int) -> R<()> {
    if cfg.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().current()?;
    put(cfg, 0) // CU_FUNC_CACHE_PREFER_NONE: the fake keeps no preference
}

pub(crate) fn cuCtxSetCacheConfig(cfg: c_int) -> R<()> {
    cu().current()?;
    // A preference the driver may ignore (cuCtxSetCacheConfig docs); valid values only.
    if !(0..=3).contains(&cfg) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

pub(crate) fn cuCtxGetSharedMemConfig(cfg: *mut c_int) -> R<()> {
    if cfg.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().current()?;
    put(cfg, 1) // CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE
}

pub(crate) fn cuCtxSetSharedMemConfig(cfg: c_int) -> R<()> {
    cu().current()?;
    if !(0..=2).contains(&cfg) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

pub(crate) fn cuCtxResetPersistingL2Cache() -> R<()> {
    cu().current().map(|_| ()) // nothing is ever persisted in the fake's L2
}

pub(crate) fn cuCtxEnablePeerAccess(ctx: CUcontext, _flags: c_uint) -> R<()> {
    cu().current()?;
    cu().ctx_id(h(ctx))?;
    Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) // no peer access between simulated GPUs
}

pub(crate) fn cuCtxDisablePeerAccess(ctx: CUcontext) -> R<()> {
    cu().current()?;
    cu().ctx_id(h(ctx))?;
    Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
}
