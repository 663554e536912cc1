//! Pool allocations: charged by the pool's reserved bytes, which only the driver knows, read
//! after each allocation, free, trim and destroy; where each pool lives.

use std::ffi::c_int;

use gpuslice_abi::cuda::pool_attr::RESERVED_MEM_CURRENT;
use gpuslice_abi::cuda::result::{
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::*;

use crate::ground::driver::real;
use crate::memory::ledger::{charge_size, lock};
use crate::memory::objects::{Charged, ObjectKind};
use crate::memory::pools::{cover, Cover, Freed, PoolBook, PoolHome, Settle};
use crate::memory::{charge_or_refuse, current_context, process, Process};

/// Reads a pool's reserved bytes; `None` when the driver does not answer for the handle.
fn pool_reserved(pool: u64) -> Option<u64> {
    let get_attribute = real::cuMemPoolGetAttribute()?;
    let mut value: u64 = 0;
    // SAFETY: RESERVED_MEM_CURRENT writes one cuuint64_t into `value`.
    let result = unsafe {
        get_attribute(
            pool as CUmemoryPool,
            RESERVED_MEM_CURRENT,
            (&mut value as *mut u64).cast(),
        )
    };
    (result == CUDA_SUCCESS).then_some(value)
}

/// Settles a pool's charge with what its re-read said ([`Process::settle`]).
pub fn apply(process: &Process, settle: Settle) {
    process.settle(settle, |bytes| {
        crate::log_error!(
            "a memory pool grew by {bytes} bytes past the slice's limit; charged in full"
        )
    });
}

/// Reads one live pool and settles its charge (the book locked by the caller).
pub fn reread_locked(process: &Process, book: &mut PoolBook, pool: u64, device: u8) -> Settle {
    let settle = match pool_reserved(pool) {
        Some(reserved) => book.settle(pool, device, reserved),
        None => book.unreadable(pool),
    };
    apply(process, settle);
    settle
}

/// Re-reads every live pool but `skip` (the book locked by the caller); true if any charge
/// went down.
fn reread_all_locked(process: &Process, book: &mut PoolBook, skip: Option<u64>) -> bool {
    let mut shrank = false;
    for (pool, device) in book.known() {
        if Some(pool) != skip {
            shrank |= matches!(
                reread_locked(process, book, pool, device),
                Settle::Shrink { .. }
            );
        }
    }
    shrank
}

/// One allocation from `pool` was freed: re-read the pool, or, for a pool destroyed with
/// allocations outstanding, release it with the last of them.
pub(in crate::memory) fn pool_pointer_freed(process: &Process, pool: u64) {
    let mut book = lock(&process.ledger.pools);
    match book.freed(pool) {
        Freed::Reread { device } => {
            reread_locked(process, &mut book, pool, device);
        }
        Freed::Settled(settle) => apply(process, settle),
        Freed::Unknown => {}
    }
}

/// Re-reads every live pool; true if any charge went down.
pub(in crate::memory) fn reread_pools(process: &Process) -> bool {
    reread_all_locked(process, &mut lock(&process.ledger.pools), None)
}

/// For reporting: settle pools only when this process has any (a lock-free check first).
#[inline]
pub(in crate::memory) fn reread_pools_if_any(process: &Process) {
    if process
        .ledger
        .objects_have_pools
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        reread_pools(process);
    }
}

/// Charges `bytes` more for a pool allocation whose pool grew past its reservation; before
/// refusing, the other pools' released memory is settled (it may be what stands in the way).
fn charge_growth(
    process: &Process,
    book: &mut PoolBook,
    pool: u64,
    device: u8,
    bytes: u64,
) -> bool {
    process.ledger.charge(device, bytes).is_ok()
        || (reread_all_locked(process, book, Some(pool))
            && process.ledger.charge(device, bytes).is_ok())
}

/// Gives a pool allocation the slice cannot hold back to the driver: frees `ptr` on the
/// allocation's stream (`free`), then trims the pool to what it reserved before. True when
/// the free succeeded (the caller's pointer is gone).
fn undo_pool_alloc(
    pool: u64,
    keep: u64,
    ptr: CUdeviceptr,
    free: impl FnOnce(CUdeviceptr) -> CUresult,
) -> bool {
    if free(ptr) != CUDA_SUCCESS {
        return false;
    }
    if let Some(trim) = real::cuMemPoolTrimTo() {
        // SAFETY: a live pool the driver just allocated from; by-value arguments.
        let trimmed = unsafe { trim(pool as CUmemoryPool, keep as usize) };
        if trimmed != CUDA_SUCCESS {
            crate::log_debug!("cuMemPoolTrimTo after an undone pool allocation: {trimmed}");
        }
    }
    true
}

/// Allocates from `pool` with the pool's bookkeeping held across the driver call, so the
/// reading after it is attributed to exactly this allocation. The pool may grow by more than
/// the request (its OS allocations are coarser): when that does not fit in the slice, the
/// allocation is freed with `free` (on its stream), the pool trimmed back, and the answer is
/// `CUDA_ERROR_OUT_OF_MEMORY`; only if that free fails is the growth charged past the limit.
pub unsafe fn pool_alloc(
    process: &Process,
    device: u8,
    pool: u64,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    call: impl FnOnce() -> CUresult,
    free: impl FnOnce(CUdeviceptr) -> CUresult,
) -> CUresult {
    let bound = charge_size(bytes as u64);
    if let Err(code) = charge_or_refuse(process, device, bound) {
        return code;
    }
    process
        .ledger
        .objects_have_pools
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut book = lock(&process.ledger.pools);
    let result = call();
    let allocated = (result == CUDA_SUCCESS && !dptr.is_null()).then(|| *dptr);
    // A destroyed pool's handle is not read (the driver refused the allocation anyway).
    let reading = if allocated.is_some() || !book.is_destroyed(pool) {
        pool_reserved(pool)
    } else {
        None
    };
    let before = book.charged(pool);
    // An unreadable pool that served an allocation: the bound stands for its growth.
    let reading = reading.or(allocated.map(|_| before.saturating_add(bound)));
    let Some(reserved) = reading else {
        process.ledger.refund(device, bound);
        return result;
    };
    let mut answer = result;
    match cover(bound, book.change(pool, device, reserved)) {
        Cover::Refund(unused) => {
            process.ledger.refund(device, unused);
            book.record(pool, device, reserved);
        }
        Cover::Short(extra) if charge_growth(process, &mut book, pool, device, extra) => {
            book.record(pool, device, reserved);
        }
        Cover::Short(extra) => {
            let undone = allocated.is_some_and(|ptr| undo_pool_alloc(pool, before, ptr, free));
            if undone {
                *dptr = 0;
                answer = CUDA_ERROR_OUT_OF_MEMORY;
                crate::log_debug!(
                    "refusing a pool allocation of {bytes} bytes: its pool grew {extra} bytes past the reservation and the slice limit is reached"
                );
            }
            // What the pool holds now (still grown if the undo failed), charged as held.
            let now = if undone { pool_reserved(pool) } else { None }.unwrap_or(reserved);
            match cover(bound, book.change(pool, device, now)) {
                Cover::Refund(unused) => process.ledger.refund(device, unused),
                Cover::Short(extra) => {
                    if !process.ledger.charge_held(device, extra) {
                        crate::log_error!(
                            "a memory pool grew by {extra} bytes past the slice's limit and could not be given back; charged in full"
                        );
                    }
                }
            }
            book.record(pool, device, now);
        }
    }
    if answer == CUDA_SUCCESS {
        if let Some(ptr) = allocated {
            book.allocated(pool, device);
            drop(book);
            process.ledger.track(
                ObjectKind::Pointer,
                ptr,
                Charged {
                    device,
                    bytes: 0,
                    pool,
                    context: current_context(),
                },
            );
        }
    }
    answer
}

/// The real stream-ordered free matching an allocation entry point: the `_ptsz` one for a
/// `_ptsz` allocation (where the NULL stream is the per-thread stream), else the legacy one.
pub fn free_async_like(per_thread: bool) -> impl FnOnce(CUstream, CUdeviceptr) -> CUresult {
    move |stream, ptr| {
        let free = if per_thread {
            real::cuMemFreeAsync_ptsz()
        } else {
            real::cuMemFreeAsync()
        };
        // SAFETY: the allocation the driver just made on `stream`, not yet handed out.
        free.map_or(CUDA_ERROR_NOT_SUPPORTED, |free| unsafe {
            free(ptr, stream)
        })
    }
}

/// Records where `pool` lives (nothing outside a slice).
pub fn learn_pool_home(pool: u64, home: Option<PoolHome>) {
    if let Some(process) = process() {
        lock(&process.ledger.pool_homes).learned(pool, home);
    }
}

/// Where `pool` lives. A pool this process never saw created or named (taken before the shim
/// bound it, say) is looked for among the devices' default and current pools; `None` when it
/// is none of them (an imported pool): its stream's device stands in.
pub fn pool_home(process: &Process, pool: u64) -> Option<PoolHome> {
    if let Some(home) = lock(&process.ledger.pool_homes).home(pool) {
        return Some(home);
    }
    let mut count: c_int = 0;
    let counted = real::cuDeviceGetCount().map(|get| {
        // SAFETY: valid out-pointer.
        unsafe { get(&mut count) }
    });
    if counted != Some(CUDA_SUCCESS) {
        return None;
    }
    let getters = [
        real::cuDeviceGetDefaultMemPool(),
        real::cuDeviceGetMemPool(),
    ];
    let mut homes = lock(&process.ledger.pool_homes);
    for ordinal in 0..count {
        for get in getters.iter().flatten() {
            let mut found: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: valid out-pointer; an ordinal below the driver's count.
            if unsafe { get(&mut found, ordinal) } == CUDA_SUCCESS && !found.is_null() {
                homes.learned(found as u64, Some(PoolHome::Device(ordinal)));
            }
        }
    }
    homes.home(pool)
}
