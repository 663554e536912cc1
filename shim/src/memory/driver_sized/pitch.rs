//! Pitched allocations: the driver chooses the pitch, so the upper bound is reserved before
//! the call and settled to the pitch it chose after.

use gpuslice_abi::cuda::result::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use super::current_limited_device;
use crate::ground::driver::real;
use crate::memory::{charge_or_refuse, current_context, process};
use gpuslice_policy::{charge_size, pitch_upper_bound, Settled};
use gpuslice_policy::{Charged, ObjectKind};

/// `cuMemAllocPitch` of `height` rows of `width_bytes` through `call` (the driver's result
/// and the (pointer, pitch) it wrote, `None` where the caller passed NULL for either). The
/// bound is reserved first; past the slice, the answer is OUT_OF_MEMORY with no driver call.
/// When the pitch the driver chose does not fit, the allocation is freed again and `undone`
/// writes what the driver leaves behind on failure.
pub(crate) fn allocate(
    width_bytes: u64,
    height: u64,
    call: impl FnOnce() -> (CUresult, Option<(CUdeviceptr, u64)>),
    undone: impl FnOnce(),
) -> CUresult {
    let (Some(process), Some((_, device))) = (process(), current_limited_device()) else {
        return call().0;
    };
    let bound = charge_size(pitch_upper_bound(width_bytes).saturating_mul(height));
    if let Err(code) = charge_or_refuse(process, device, bound) {
        return code;
    }
    let (result, allocated) = call();
    let Some((allocated, pitch)) = allocated.filter(|_| result == CUDA_SUCCESS) else {
        process.ledger.refund(device, bound);
        return result;
    };
    let actual = charge_size(pitch.saturating_mul(height));
    let settled = process.ledger.settle_or_undo(device, bound, actual, || {
        // SAFETY: `allocated` is the allocation the driver just made, not yet handed out.
        real::cuMemFree_v2().is_some_and(|free| unsafe { free(allocated) } == CUDA_SUCCESS)
    });
    match settled {
        Settled::Charged => {}
        Settled::Undone => {
            undone();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        Settled::PastLimit => crate::log_error!(
            "pitch allocation spent {actual} bytes, past the slice's limit, and could not be freed; charged in full"
        ),
    }
    process.ledger.track(
        ObjectKind::Pointer,
        allocated,
        Charged {
            device,
            bytes: actual,
            pool: 0,
            context: current_context(),
        },
    );
    result
}
