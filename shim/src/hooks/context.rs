//! Context handlers: context creation and destruction, primary contexts and the limits that
//! cost device memory (`cuCtxSetLimit`), charged through the `memory` policy (a context costs
//! device memory the driver decides; the stack, printf FIFO and heap limits are priced before
//! the call).

use std::ffi::{c_int, c_uint, c_void};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::ground::devices;
use crate::hooks::out::Out;
use crate::hooks::registry::signature as sig;
use crate::memory::driver_sized::placed::set_limit;
use crate::memory::driver_sized::{ctx_create_with, ctx_destroyed, end_primary, retain_primary};
use crate::memory::learn_pointer_owners;
use gpuslice_policy::PrimaryContext;

/// The context creation of `call` (which writes the new context to `pctx`) as the policy takes
/// it: the driver's result with the context, and the clearing of the caller's handle.
///
/// # Safety
/// `pctx` is NULL or valid for reads and writes (the caller's out-parameter).
#[inline]
unsafe fn creating(
    pctx: *mut CUcontext,
    call: impl FnOnce() -> CUresult,
) -> (
    impl FnOnce() -> (CUresult, Option<CUcontext>),
    impl FnOnce(),
) {
    // SAFETY: this function's contract.
    let out = unsafe { Out::new(pctx) };
    (
        move || {
            let result = call();
            if result == CUDA_SUCCESS {
                // The driver is up with a context: the device count is known from now on, so
                // the allocations in it take the one-device path from the first.
                devices::learn_device_count();
            }
            (result, out.read())
        },
        move || {
            out.write(std::ptr::null_mut());
        },
    )
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn ctx_create_v2(
    real: sig::cuCtxCreate_v2,
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let (call, undone) = unsafe { creating(pctx, || real(pctx, flags, dev)) };
    ctx_create_with(dev, call, undone)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn ctx_create_v3(
    real: sig::cuCtxCreate_v3,
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let (call, undone) = unsafe { creating(pctx, || real(pctx, params, num_params, flags, dev)) };
    ctx_create_with(dev, call, undone)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn ctx_create_v4(
    real: sig::cuCtxCreate_v4,
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let (call, undone) = unsafe { creating(pctx, || real(pctx, params, flags, dev)) };
    ctx_create_with(dev, call, undone)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn ctx_destroy(real: sig::cuCtxDestroy_v2, ctx: CUcontext) -> CUresult {
    // Its pointers must be known as its own before the driver frees them with it.
    learn_pointer_owners();
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(ctx) };
    if result == CUDA_SUCCESS {
        ctx_destroyed(ctx as u64);
    }
    result
}

/// `cuCtxSetLimit`: the stack (for every resident thread), the printf FIFO and the
/// device-malloc heap are device memory from the moment they are set, priced by the policy
/// before the call ([`set_limit`]). Other limits pass through.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn ctx_set_limit(
    real: sig::cuCtxSetLimit,
    limit: c_int,
    value: usize,
) -> CUresult {
    // SAFETY: by-value arguments, unchanged.
    set_limit(limit, value as u64, || unsafe { real(limit, value) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn primary_ctx_retain(
    real: sig::cuDevicePrimaryCtxRetain,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let (call, undone) = unsafe { creating(pctx, || real(pctx, dev)) };
    retain_primary(dev, call, undone)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn primary_ctx_release(
    real: sig::cuDevicePrimaryCtxRelease_v2,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    end_primary(dev, || unsafe { real(dev) }, PrimaryContext::released)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn primary_ctx_reset(
    real: sig::cuDevicePrimaryCtxReset_v2,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    end_primary(dev, || unsafe { real(dev) }, PrimaryContext::reset)
}
