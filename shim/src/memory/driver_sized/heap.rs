//! The device-malloc heap (`CU_LIMIT_MALLOC_HEAP_SIZE`): device memory from the moment it is set.

use gpuslice_abi::cuda::limit::MALLOC_HEAP_SIZE;
use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::CUresult;
use gpuslice_common::turn::Turn;

use super::current_limited_device;
use crate::ground::driver::real;
use crate::memory::objects::{Charged, ObjectKind};
use crate::memory::{charge_or_refuse, current_context, process};

crate::session::fork::per_process! {
    /// Serialises this process's heap-limit changes: read, reserve, set and record are one
    /// step. A turn, not a mutex, so that a fork child starts with it free: a parent's thread
    /// holding it at the fork does not exist in the child.
    static HEAP_LIMIT: Turn = Turn::new();
}

/// The current context's device-malloc heap size, `None` when the driver does not say.
fn heap_limit() -> Option<u64> {
    let get_limit = real::cuCtxGetLimit()?;
    let mut value: usize = 0;
    // SAFETY: cuCtxGetLimit writes one size_t into `value`.
    let result = unsafe { get_limit(&mut value, MALLOC_HEAP_SIZE) };
    (result == CUDA_SUCCESS).then_some(value as u64)
}

/// `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, value)` through `call`. Growth past the current
/// size is reserved on the current context's device before the call (refused with
/// OUT_OF_MEMORY past the slice, refunded if the driver fails), a shrink is refunded after it,
/// down to what this process was charged (the default heap is inside the measured context
/// cost). The charge is an `ObjectKind::Heap` entry owned by the context, so the context's end
/// refunds it.
pub(crate) fn set_heap_limit(value: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let (Some(process), Some((_, device))) = (process(), current_limited_device()) else {
        return call();
    };
    let context = current_context();
    if context == 0 {
        return call();
    }
    let _serialised = HEAP_LIMIT.take();
    // Unreadable: charge the whole heap (over-counts the default, never under-counts).
    let old = heap_limit().unwrap_or_else(|| {
        crate::log_error!("cuCtxGetLimit failed; charging the whole {value}-byte malloc heap");
        0
    });
    let growth = value.saturating_sub(old);
    if let Err(code) = charge_or_refuse(process, device, growth) {
        return code;
    }
    let result = call();
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
    let now = heap_limit().unwrap_or(value);
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
