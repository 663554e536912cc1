//! What the paths whose real size only the driver knows charge (pitched allocations, pools,
//! VMM, CUDA graph memory, contexts), what the driver places by itself (`placed`: limits, modules, local memory,
//! priced from `image` and the device's facts), and which NVML process entries belong to the
//! slice.
//! Their handlers (`hooks::memory`, `hooks::context`, `hooks::nvml`) decode the caller's
//! arguments and make one call here, handing over the real call as a closure that answers the
//! driver's result with what it wrote. The locks that order a driver call against the
//! bookkeeping are taken here, never in the hook layer; nothing here reads or writes through
//! a caller's pointer.

mod contexts;
pub(crate) mod graph_reservations;
pub(crate) mod image;
mod nvml;
pub(crate) mod pitch;
pub(crate) mod placed;
pub(crate) mod pool_reservations;
pub(crate) mod vmm_calls;

pub(in crate::memory) use contexts::context_gone;
pub(crate) use contexts::{ctx_create_with, ctx_destroyed, end_primary, retain_primary};
pub(crate) use nvml::*;
pub(in crate::memory) use pool_reservations::{
    pool_pointer_freed, reread_pools, reread_pools_if_any,
};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::ground::driver::real;
use crate::memory::{cuda_binding, current_context, process, shared, Binding};

/// The limited device entry of the current context's device, `None` = pass-through.
pub(crate) fn current_limited_device() -> Option<(CUdevice, u8)> {
    let shared = shared()?;
    process()?;
    let ordinal = crate::ground::devices::current_cuda_device()?;
    match cuda_binding(shared, ordinal) {
        Ok(Binding::Limited(d)) => Some((ordinal, d)),
        _ => None,
    }
}

/// The limited device entry of CUDA device `ordinal`, `None` = pass-through.
pub(crate) fn limited_device(ordinal: CUdevice) -> Option<u8> {
    match cuda_binding(shared()?, ordinal) {
        Ok(Binding::Limited(d)) => Some(d),
        _ => None,
    }
}

/// The device of a context: the current context's device, else `cuCtxGetDevice_v2` (CUDA
/// 13), else the context pushed for an instant (`cuCtxGetDevice` names only the current one).
fn context_device(ctx: CUcontext) -> Option<CUdevice> {
    if ctx.is_null() || ctx as u64 == current_context() {
        return crate::ground::devices::current_cuda_device();
    }
    let mut device: CUdevice = 0;
    if let Some(get) = real::cuCtxGetDevice_v2() {
        // SAFETY: valid out-pointer; the driver validates the handle.
        if unsafe { get(&mut device, ctx) } == CUDA_SUCCESS {
            return Some(device);
        }
    }
    let (push, pop) = (real::cuCtxPushCurrent_v2()?, real::cuCtxPopCurrent_v2()?);
    // SAFETY: the driver validates the handle; on success the push is undone right below.
    if unsafe { push(ctx) } != CUDA_SUCCESS {
        return None;
    }
    let device = crate::ground::devices::current_cuda_device();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; pops exactly what was pushed above on this thread.
    unsafe { pop(&mut popped) };
    device
}

/// The device `stream` runs on: its context's ("the current mempool of the provided stream's
/// device", cuMemAllocAsync). The NULL, legacy and per-thread streams are the current
/// context's. `None` when the driver cannot say (an invalid stream: the driver refuses it).
pub(crate) fn stream_device(stream: CUstream) -> Option<CUdevice> {
    if stream as usize <= gpuslice_abi::cuda::flags::CU_STREAM_PER_THREAD {
        return crate::ground::devices::current_cuda_device();
    }
    let Some(get_ctx) = real::cuStreamGetCtx() else {
        return crate::ground::devices::current_cuda_device();
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver validates the stream.
    if unsafe { get_ctx(stream, &mut ctx) } != CUDA_SUCCESS {
        return None;
    }
    context_device(ctx)
}
