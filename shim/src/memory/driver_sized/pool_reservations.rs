//! Pool allocations: charged by the pool's reserved bytes, which only the driver knows, read
//! after each allocation, free, trim and destroy; where each pool lives. The book these readings
//! settle is `gpuslice_policy::PoolBook`.

use std::cell::Cell;
use std::ffi::c_int;

use gpuslice_abi::cuda::pool_attr::RESERVED_MEM_CURRENT;
use gpuslice_abi::cuda::result::{
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::*;

use super::{limited_device, stream_device};
use crate::ground::driver::real;
use crate::memory::{
    charge_or_refuse, current_context, process, AllocTarget, DeviceObject, Process,
};
use gpuslice_policy::{charge_size, lock};
use gpuslice_policy::{cover, Cover, Freed, PoolBook, PoolHome, Settle};
use gpuslice_policy::{Charged, ObjectKind};

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
fn apply(process: &Process, settle: Settle) {
    process.settle(settle, |bytes| {
        crate::log_error!(
            "a memory pool grew by {bytes} bytes past the slice's limit; charged in full"
        )
    });
}

/// Reads one live pool and settles its charge (the book locked by the caller).
fn reread_locked(process: &Process, book: &mut PoolBook, pool: u64, device: u8) -> Settle {
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

/// Allocates from `pool` with the pool's bookkeeping held across the driver call (`call`, which
/// answers the driver's result and the pointer it wrote), so the reading after it is
/// attributed to exactly this allocation. The pool may grow by more than the request (its OS
/// allocations are coarser): when that does not fit in the slice, the allocation is freed
/// with `free` (on its stream), the pool trimmed back, `undone` clears the caller's pointer
/// and the answer is `CUDA_ERROR_OUT_OF_MEMORY`; only if that free fails is the growth
/// charged past the limit.
fn pool_alloc(
    process: &Process,
    device: u8,
    pool: u64,
    bytes: usize,
    call: impl FnOnce() -> (CUresult, Option<CUdeviceptr>),
    free: impl FnOnce(CUdeviceptr) -> CUresult,
    undone: impl FnOnce(),
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
    let (result, pointer) = call();
    let allocated = pointer.filter(|_| result == CUDA_SUCCESS);
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
            let given_back = allocated.is_some_and(|ptr| undo_pool_alloc(pool, before, ptr, free));
            if given_back {
                undone();
                answer = CUDA_ERROR_OUT_OF_MEMORY;
                crate::log_debug!(
                    "refusing a pool allocation of {bytes} bytes: its pool grew {extra} bytes past the reservation and the slice limit is reached"
                );
            }
            // What the pool holds now (still grown if the undo failed), charged as held.
            let now = if given_back {
                pool_reserved(pool)
            } else {
                None
            }
            .unwrap_or(reserved);
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
fn free_async_like(per_thread: bool) -> impl FnOnce(CUstream, CUdeviceptr) -> CUresult {
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
pub(crate) fn learn_pool_home(pool: u64, home: Option<PoolHome>) {
    if let Some(process) = process() {
        lock(&process.ledger.pool_homes).learned(pool, home);
    }
}

/// Where `pool` lives. A pool this process never saw created or named (taken before the shim
/// bound it, say) is looked for among the devices' default and current pools; `None` when it
/// is none of them (an imported pool): its stream's device stands in.
fn pool_home(process: &Process, pool: u64) -> Option<PoolHome> {
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

/// `cuMemAllocAsync[_ptsz]` of `bytes` on `stream` through `call` (the driver's result and the
/// pointer it wrote): charged to the stream's device's current pool, whatever context is
/// current; to the device as a plain allocation when that pool cannot be read.
/// `per_thread`: the `_ptsz` entry point (its undo frees on the per-thread stream).
pub(crate) fn alloc_async(
    bytes: usize,
    stream: CUstream,
    per_thread: bool,
    call: impl FnOnce() -> (CUresult, Option<CUdeviceptr>),
    undone: impl FnOnce(),
) -> CUresult {
    let Some(process) = process() else {
        return call().0;
    };
    let Some(ordinal) = stream_device(stream) else {
        return call().0;
    };
    let Some(device) = limited_device(ordinal) else {
        return call().0;
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out-pointer; an ordinal the driver named for the stream.
    let found = real::cuDeviceGetMemPool().map(|get| unsafe { get(&mut pool, ordinal) });
    if found != Some(CUDA_SUCCESS) || pool.is_null() {
        // No pool to read: charge it like a plain allocation on the stream's device.
        let pointer = Cell::new(None);
        return crate::memory::allocate(
            AllocTarget::Device(ordinal),
            bytes as u64,
            || {
                let (result, written) = call();
                pointer.set(written);
                result
            },
            || DeviceObject::Pointer(pointer.get().unwrap_or(0)),
        );
    }
    lock(&process.ledger.pool_homes).learned(pool as u64, Some(PoolHome::Device(ordinal)));
    let free = free_async_like(per_thread);
    pool_alloc(
        process,
        device,
        pool as u64,
        bytes,
        call,
        |ptr| free(stream, ptr),
        undone,
    )
}

/// `cuMemAllocFromPoolAsync[_ptsz]` of `bytes` from `pool` on `stream` through `call`: charged
/// to the pool's device, which may not be the stream's (nor the current one); a host pool's
/// allocation is not device memory.
pub(crate) fn alloc_from_pool_async(
    pool: u64,
    bytes: usize,
    stream: CUstream,
    per_thread: bool,
    call: impl FnOnce() -> (CUresult, Option<CUdeviceptr>),
    undone: impl FnOnce(),
) -> CUresult {
    let Some(process) = process() else {
        return call().0;
    };
    let ordinal = match pool_home(process, pool) {
        Some(PoolHome::Host) => return call().0,
        Some(PoolHome::Device(ordinal)) => Some(ordinal),
        None => stream_device(stream),
    };
    let Some(device) = ordinal.and_then(limited_device) else {
        return call().0;
    };
    let free = free_async_like(per_thread);
    pool_alloc(
        process,
        device,
        pool,
        bytes,
        call,
        |ptr| free(stream, ptr),
        undone,
    )
}

/// `cuMemPoolDestroy` through `call`: the pool is read one last time before (its handle names
/// nothing after), then refunded at once if nothing is allocated from it, else when the last
/// of its allocations is freed (the driver releases it then). The pool book stays locked from
/// that reading to the destruction being booked, so no allocation of the pool's
/// ([`pool_alloc`] holds the same lock across its driver call) falls between them.
pub(crate) fn destroy(pool: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(process) = process() else {
        return call();
    };
    let mut book = lock(&process.ledger.pools);
    if let Some(device) = book.device_of(pool) {
        reread_locked(process, &mut book, pool, device);
    }
    let result = call();
    if result == CUDA_SUCCESS {
        let settle = book.destroyed(pool);
        drop(book);
        apply(process, settle);
        lock(&process.ledger.pool_homes).forget(pool);
    }
    result
}

/// `cuMemPoolTrimTo` succeeded on `pool`: its charge follows what it reserves now.
pub(crate) fn trimmed(pool: u64) {
    if let Some(process) = process() {
        let mut book = lock(&process.ledger.pools);
        if let Some(device) = book.device_of(pool) {
            reread_locked(process, &mut book, pool, device);
        }
    }
}
