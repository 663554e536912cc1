//! Context handlers: context creation and destruction, primary contexts and the device-malloc
//! heap (`cuCtxSetLimit`), charged through the `memory` policy (a context costs device memory
//! the driver decides).

use std::ffi::{c_int, c_uint, c_void};

use gpuslice_abi::cuda::limit::MALLOC_HEAP_SIZE;
use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::hooks::registry::{real, signature as sig};
use crate::memory::driver_sized::{
    context_gone, create_context, ctx_create_with, current_limited_device, end_primary, heap_limit,
    primary_entry, HEAP_LIMIT,
};
use crate::memory::ledger::{lock, PrimaryContext};
use crate::memory::objects::{Charged, ObjectKind};
use crate::memory::{charge_or_refuse, current_context, process, shared};

pub unsafe fn ctx_create_v2(
    real: sig::cuCtxCreate_v2,
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create_with(dev, pctx, || real(pctx, flags, dev))
}

pub unsafe fn ctx_create_v3(
    real: sig::cuCtxCreate_v3,
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create_with(dev, pctx, || real(pctx, params, num_params, flags, dev))
}

pub unsafe fn ctx_create_v4(
    real: sig::cuCtxCreate_v4,
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create_with(dev, pctx, || real(pctx, params, flags, dev))
}

pub unsafe fn ctx_destroy(real: sig::cuCtxDestroy_v2, ctx: CUcontext) -> CUresult {
    let result = real(ctx);
    if result == CUDA_SUCCESS {
        if let Some(process) = process() {
            context_gone(process, ctx as u64);
        }
    }
    result
}

/// `cuCtxSetLimit`. The device-malloc heap (`CU_LIMIT_MALLOC_HEAP_SIZE`) is device memory from
/// the moment it is set: growth past the current size is reserved on the current context's
/// device before the call (refused with OUT_OF_MEMORY past the slice, refunded if the driver
/// fails), a shrink is refunded after it, down to what this process was charged (the default
/// heap is inside the measured context cost). The charge is an `ObjectKind::Heap` entry owned
/// by the context, so the context's end refunds it. Other limits pass through.
pub unsafe fn ctx_set_limit(real: sig::cuCtxSetLimit, limit: c_int, value: usize) -> CUresult {
    if limit != MALLOC_HEAP_SIZE {
        // The stack and the printf FIFO: the driver sizes them; its word is read at once.
        let result = real(limit, value);
        if result == CUDA_SUCCESS {
            crate::memory::driver_growth::after_limit_change();
        }
        return result;
    }
    let (Some(process), Some((_, device))) = (process(), current_limited_device()) else {
        return real(limit, value);
    };
    let context = current_context();
    if context == 0 {
        return real(limit, value);
    }
    let _serialised = lock(&HEAP_LIMIT);
    // Unreadable: charge the whole heap (over-counts the default, never under-counts).
    let old = heap_limit().unwrap_or_else(|| {
        crate::log_error!("cuCtxGetLimit failed; charging the whole {value}-byte malloc heap");
        0
    });
    let wanted = value as u64;
    let growth = wanted.saturating_sub(old);
    if let Err(code) = charge_or_refuse(process, device, growth) {
        return code;
    }
    let result = real(limit, value);
    if result != CUDA_SUCCESS {
        process.ledger.refund(device, growth);
        return result;
    }
    let held = process
        .ledger
        .objects
        .remove(ObjectKind::Heap, context)
        .map_or(0, |c| c.bytes);
    // Settle with what the driver holds now (it may round the size up).
    let now = heap_limit().unwrap_or(wanted);
    let charged = if now >= old {
        let need = now - old;
        if need < growth {
            process.ledger.refund(device, growth - need);
        } else if need > growth && !process.ledger.charge_held(device, need - growth) {
            crate::log_error!(
                "the driver made the malloc heap {now} bytes, past the slice's limit; charged in full"
            );
        }
        held + need
    } else {
        // A shrink: refunded after the driver gave the memory back, down to what was charged.
        process.ledger.refund(device, growth);
        let back = (old - now).min(held);
        process.ledger.refund(device, back);
        held - back
    };
    if charged > 0 {
        process.ledger.track(
            ObjectKind::Heap,
            context,
            Charged {
                device,
                bytes: charged,
                pool: 0,
                context,
            },
        );
    }
    result
}

pub unsafe fn primary_ctx_retain(
    real: sig::cuDevicePrimaryCtxRetain,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return crate::session::host_pid::around_context_creation(dev, || real(pctx, dev));
    };
    let mut primaries = lock(&process.ledger.primaries);
    let Some(entry) = primary_entry(&mut primaries, dev) else {
        return real(pctx, dev);
    };
    if !entry.retain_creates() {
        let result = real(pctx, dev);
        if result == CUDA_SUCCESS {
            entry.retained(None);
        }
        return result;
    }
    // This retain makes the primary context; undoing it takes it down again through the real
    // driver (not our hooks, whose bookkeeping has no context yet). With no reference before,
    // the release does that. After a reset, older references keep it alive through a release,
    // so it is reset first (it was made just now: nothing else lives in it), then released.
    let references_before = entry.refs;
    let undo = || {
        // SAFETY: plain by-value calls on the device ordinal the retain just succeeded for.
        let ended = references_before == 0
            || real::cuDevicePrimaryCtxReset_v2()
                .is_some_and(|reset| unsafe { reset(dev) } == CUDA_SUCCESS);
        // SAFETY: as above; drops the one reference the retain took.
        let released = real::cuDevicePrimaryCtxRelease_v2()
            .is_some_and(|release| unsafe { release(dev) } == CUDA_SUCCESS);
        let undone = ended && (released || references_before > 0);
        if undone && !pctx.is_null() {
            *pctx = std::ptr::null_mut();
        }
        undone
    };
    let (result, charge) = create_context(process, shared, dev, || real(pctx, dev), undo);
    if result == CUDA_SUCCESS {
        let handle = if pctx.is_null() { 0 } else { *pctx as u64 };
        entry.retained(Some((handle, charge)));
    }
    result
}

pub unsafe fn primary_ctx_release(
    real: sig::cuDevicePrimaryCtxRelease_v2,
    dev: CUdevice,
) -> CUresult {
    end_primary(dev, || real(dev), PrimaryContext::released)
}

pub unsafe fn primary_ctx_reset(real: sig::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> CUresult {
    end_primary(dev, || real(dev), PrimaryContext::reset)
}
