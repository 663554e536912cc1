//! FFI handlers for the allocation paths whose real size only the driver knows (pitch, pools,
//! VMM, contexts, the device-malloc heap) and for NVML's process lists. Each is a thin shell: read the arguments,
//! reserve through the ledger, call the real function, settle with what the driver reports.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use gpuslice_abi::cuda::limit::MALLOC_HEAP_SIZE;
use gpuslice_abi::cuda::pool_attr::RESERVED_MEM_CURRENT;
use gpuslice_abi::cuda::result::{
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::*;
use gpuslice_abi::nvml::ret::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS,
};
use gpuslice_abi::nvml::*;
use gpuslice_common::region::{DeadSlot, DeviceId, ExitState, Liveness, RELEASE_TIMEOUT};

use super::context_start::{self, Expected, Refused};
use super::host_pid::{self, ListedProcess};
use super::ledger::{charge_size, lock, pitch_upper_bound, PrimaryContext, Settled};
use super::objects::{Charged, ObjectKind};
use super::pools::{cover, home_of, Cover, Freed, PoolBook, PoolHome, Settle};
use super::{
    charge_or_refuse, cuda_binding, current_context, device_id, nvml_binding, process, shared,
    Binding, Process, Shared,
};
use crate::registry::{real, signature as sig};
use crate::report::{list_fits, slice_process_list, SliceProcess};

/// The limited device entry of the current context's device, `None` = pass-through.
fn current_limited_device() -> Option<(CUdevice, u8)> {
    let shared = shared()?;
    process()?;
    let ordinal = crate::devices::current_cuda_device()?;
    match cuda_binding(shared, ordinal) {
        Ok(Binding::Limited(d)) => Some((ordinal, d)),
        _ => None,
    }
}

// ---------------------------------------------------------------- pitch

pub unsafe fn mem_alloc_pitch(
    real: sig::cuMemAllocPitch_v2,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let (Some(process), Some((_, device))) = (process(), current_limited_device()) else {
        return real(dptr, pitch, width_bytes, height, element_size);
    };
    let bound = charge_size(pitch_upper_bound(width_bytes as u64).saturating_mul(height as u64));
    if let Err(code) = charge_or_refuse(process, device, bound) {
        return code;
    }
    let result = real(dptr, pitch, width_bytes, height, element_size);
    if result != CUDA_SUCCESS || dptr.is_null() || pitch.is_null() {
        process.ledger.refund(device, bound);
        return result;
    }
    let actual = charge_size((*pitch as u64).saturating_mul(height as u64));
    let allocated = *dptr;
    let settled = process.ledger.settle_or_undo(device, bound, actual, || {
        // SAFETY: `allocated` is the allocation the driver just made, not yet handed out.
        real::cuMemFree_v2().is_some_and(|free| unsafe { free(allocated) } == CUDA_SUCCESS)
    });
    match settled {
        Settled::Charged => {}
        Settled::Undone => {
            // What the driver leaves behind on failure.
            *dptr = 0;
            *pitch = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        Settled::PastLimit => crate::log_error!(
            "pitch allocation spent {actual} bytes, past the slice's limit, and could not be freed; charged in full"
        ),
    }
    process.ledger.track(
        ObjectKind::Pointer,
        *dptr,
        Charged {
            device,
            bytes: actual,
            pool: 0,
            context: current_context(),
        },
    );
    result
}

// ---------------------------------------------------------------- pools

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

fn apply(process: &Process, settle: Settle) {
    match settle {
        Settle::Unchanged => {}
        Settle::Shrink { device, bytes } => process.ledger.refund(device, bytes),
        Settle::Grow { device, bytes } => {
            // The driver holds it already: charged past the cap if need be, so a later
            // shrink never refunds bytes that were not charged.
            if !process.ledger.charge_held(device, bytes) {
                crate::log_error!(
                    "a memory pool grew by {bytes} bytes past the slice's limit; charged in full"
                );
            }
        }
    }
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
pub(super) fn pool_pointer_freed(process: &Process, pool: u64) {
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
pub(super) fn reread_pools(process: &Process) -> bool {
    reread_all_locked(process, &mut lock(&process.ledger.pools), None)
}

/// For reporting: settle pools only when this process has any (a lock-free check first).
#[inline]
pub(super) fn reread_pools_if_any(process: &Process) {
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
unsafe fn pool_alloc(
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
                ObjectKind::PoolPointer,
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

/// The limited device entry of CUDA device `ordinal`, `None` = pass-through.
fn limited_device(ordinal: CUdevice) -> Option<u8> {
    match cuda_binding(shared()?, ordinal) {
        Ok(Binding::Limited(d)) => Some(d),
        _ => None,
    }
}

/// The device of a context: the current context's device, else `cuCtxGetDevice_v2` (CUDA
/// 13), else the context pushed for an instant (`cuCtxGetDevice` names only the current one).
fn context_device(ctx: CUcontext) -> Option<CUdevice> {
    if ctx.is_null() || ctx as u64 == current_context() {
        return crate::devices::current_cuda_device();
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
    let device = crate::devices::current_cuda_device();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; pops exactly what was pushed above on this thread.
    unsafe { pop(&mut popped) };
    device
}

/// The device `stream` runs on: its context's ("the current mempool of the provided stream's
/// device", cuMemAllocAsync). The NULL, legacy and per-thread streams are the current
/// context's. `None` when the driver cannot say (an invalid stream: the driver refuses it).
fn stream_device(stream: CUstream) -> Option<CUdevice> {
    if stream as usize <= gpuslice_abi::cuda::flags::CU_STREAM_PER_THREAD {
        return crate::devices::current_cuda_device();
    }
    let Some(get_ctx) = real::cuStreamGetCtx() else {
        return crate::devices::current_cuda_device();
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver validates the stream.
    if unsafe { get_ctx(stream, &mut ctx) } != CUDA_SUCCESS {
        return None;
    }
    context_device(ctx)
}

/// Records where `pool` lives (nothing outside a slice).
fn learn_pool_home(pool: u64, home: Option<PoolHome>) {
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

pub unsafe fn mem_alloc_async(
    real: sig::cuMemAllocAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let Some(process) = process() else {
        return real(dptr, bytes, stream);
    };
    // The stream's device's current pool, whatever context is current.
    let Some(ordinal) = stream_device(stream) else {
        return real(dptr, bytes, stream);
    };
    let Some(device) = limited_device(ordinal) else {
        return real(dptr, bytes, stream);
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let found = real::cuDeviceGetMemPool().map(|get| get(&mut pool, ordinal));
    if found != Some(CUDA_SUCCESS) || pool.is_null() {
        // No pool to read: charge it like a plain allocation on the stream's device.
        return super::allocate(
            super::AllocTarget::Device(ordinal),
            bytes as u64,
            || real(dptr, bytes, stream),
            || super::DeviceObject::Pointer(super::read_out(dptr)),
        );
    }
    lock(&process.ledger.pool_homes).learned(pool as u64, Some(PoolHome::Device(ordinal)));
    let per_thread = real::cuMemAllocAsync_ptsz().is_some_and(|p| p as usize == real as usize);
    let free = free_async_like(per_thread);
    pool_alloc(
        process,
        device,
        pool as u64,
        dptr,
        bytes,
        || real(dptr, bytes, stream),
        |ptr| free(stream, ptr),
    )
}

pub unsafe fn mem_alloc_from_pool_async(
    real: sig::cuMemAllocFromPoolAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let Some(process) = process() else {
        return real(dptr, bytes, pool, stream);
    };
    // Charged to the pool's device, which may not be the stream's (nor the current one).
    let ordinal = match pool_home(process, pool as u64) {
        Some(PoolHome::Host) => return real(dptr, bytes, pool, stream),
        Some(PoolHome::Device(ordinal)) => Some(ordinal),
        None => stream_device(stream),
    };
    let Some(device) = ordinal.and_then(limited_device) else {
        return real(dptr, bytes, pool, stream);
    };
    let per_thread =
        real::cuMemAllocFromPoolAsync_ptsz().is_some_and(|p| p as usize == real as usize);
    let free = free_async_like(per_thread);
    pool_alloc(
        process,
        device,
        pool as u64,
        dptr,
        bytes,
        || real(dptr, bytes, pool, stream),
        |ptr| free(stream, ptr),
    )
}

/// cuMemPoolCreate: the pool lives where `props->location` says (a host pool on no GPU).
pub unsafe fn mem_pool_create(
    real: sig::cuMemPoolCreate,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    let result = real(pool, props);
    if result == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
        let location = (*props).location;
        learn_pool_home(*pool as u64, home_of(location.type_, location.id));
    }
    result
}

/// cuDeviceGetDefaultMemPool / cuDeviceGetMemPool: the answer is a pool of `dev`.
pub unsafe fn device_get_mem_pool(
    real: sig::cuDeviceGetMemPool,
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    let result = real(pool, dev);
    if result == CUDA_SUCCESS && !pool.is_null() {
        learn_pool_home(*pool as u64, Some(PoolHome::Device(dev)));
    }
    result
}

/// cuDeviceSetMemPool: the driver accepts only a pool of `dev`.
pub unsafe fn device_set_mem_pool(
    real: sig::cuDeviceSetMemPool,
    dev: CUdevice,
    pool: CUmemoryPool,
) -> CUresult {
    let result = real(dev, pool);
    if result == CUDA_SUCCESS {
        learn_pool_home(pool as u64, Some(PoolHome::Device(dev)));
    }
    result
}

/// cuMemPoolDestroy: the pool is read one last time before (its handle names nothing after);
/// then it is refunded at once if nothing is allocated from it, else when the last of its
/// allocations is freed (the driver releases it then).
pub unsafe fn mem_pool_destroy(real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> CUresult {
    let Some(process) = process() else {
        return real(pool);
    };
    let mut book = lock(&process.ledger.pools);
    if let Some(device) = book.device_of(pool as u64) {
        reread_locked(process, &mut book, pool as u64, device);
    }
    let result = real(pool);
    if result == CUDA_SUCCESS {
        let settle = book.destroyed(pool as u64);
        drop(book);
        apply(process, settle);
        lock(&process.ledger.pool_homes).forget(pool as u64);
    }
    result
}

pub unsafe fn mem_pool_trim_to(
    real: sig::cuMemPoolTrimTo,
    pool: CUmemoryPool,
    keep: usize,
) -> CUresult {
    let result = real(pool, keep);
    if result == CUDA_SUCCESS {
        if let Some(process) = process() {
            let mut book = lock(&process.ledger.pools);
            if let Some(device) = book.device_of(pool as u64) {
                reread_locked(process, &mut book, pool as u64, device);
            }
        }
    }
    result
}

// ---------------------------------------------------------------- VMM

pub unsafe fn mem_map(
    real: sig::cuMemMap,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let result = real(ptr, size, offset, handle, flags);
    if result == CUDA_SUCCESS {
        if let Some(process) = process() {
            lock(&process.ledger.vmm).mapped(ptr, size as u64, handle);
        }
    }
    result
}

/// `cuMemUnmap` / `cuMemAddressFree` through `call`: the VMM book's ticket is taken BEFORE
/// the driver makes the range reusable, so the bookkeeping after it ends exactly the
/// mappings that existed then, never one another thread made in the freed range meanwhile
/// (see `vmm`).
fn unmapping(ptr: CUdeviceptr, size: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(process) = process() else {
        return call();
    };
    let ticket = lock(&process.ledger.vmm).ticket();
    let result = call();
    if result == CUDA_SUCCESS {
        let freed = lock(&process.ledger.vmm).unmapped_range(ptr, size as u64, ticket);
        for (device, bytes) in freed {
            process.ledger.refund(device, bytes);
        }
    }
    result
}

pub unsafe fn mem_unmap(real: sig::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> CUresult {
    unmapping(ptr, size, || real(ptr, size))
}

pub unsafe fn mem_address_free(
    real: sig::cuMemAddressFree,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    unmapping(ptr, size, || real(ptr, size))
}

pub unsafe fn mem_retain_allocation_handle(
    real: sig::cuMemRetainAllocationHandle,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    let result = real(handle, addr);
    if result == CUDA_SUCCESS && !handle.is_null() {
        if let Some(process) = process() {
            lock(&process.ledger.vmm).retained(*handle);
        }
    }
    result
}

// ---------------------------------------------------------------- contexts

/// Creates a context on `ordinal` (the caller holds the primaries lock, which serialises
/// context creation in this process): reserves the context cost, calls the driver, and on
/// the first context of the process on the device measures the real cost and our host PID
/// from NVML, under the slice's measuring lock for the device (`context_start`). When that
/// real cost does not fit in the slice, `undo` gives the new context back to the real driver
/// (true = done) and the answer is `CUDA_ERROR_OUT_OF_MEMORY` with nothing charged. Returns
/// the driver's result and what stays charged.
fn create_context(
    process: &Process,
    shared: &Shared,
    ordinal: CUdevice,
    call: impl FnOnce() -> CUresult,
    undo: impl FnOnce() -> bool,
) -> (CUresult, Option<(u8, u64)>) {
    use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
    let device = match cuda_binding(shared, ordinal) {
        Ok(Binding::Limited(d)) => d,
        Ok(Binding::Unlimited) => {
            return (
                crate::throttle::host_pid::around_context_creation(ordinal, call),
                None,
            )
        }
        Err(code) => return (code, None),
    };
    let cost_cell = &shared.context_cost[device as usize];
    let own_cost = cost_cell.load(Acquire);
    // Measuring needs our NVML entry to hold nothing but the new context; it is needed while
    // our cost or our entry is unknown. Processes of the slice measure one at a time.
    let wants_measure = (own_cost == 0 || process.host_pid.load(Relaxed) == 0)
        && shared.region.slot_used(process.slot, device_id(device)) == 0;
    let nvml = if wants_measure {
        nvml_for_cuda(ordinal)
    } else {
        None
    };
    let _measuring = nvml.and_then(|_| {
        context_start::lock_for_measuring(&shared.region, device, context_start::MEASURING_WAIT)
    });
    // This process's own measurement, else what another process of the slice measured on
    // the device (read under the lock: the previous holder just published it), else the
    // bound. The latter two are still measured and settled below.
    let expected = match (own_cost, shared.region.context_cost(device_id(device))) {
        (own, _) if own > 0 => Expected::Measured(own),
        (_, Some(slice)) => Expected::Measured(slice),
        (_, None) => Expected::Bound(shared.context_bound),
    };
    let Some(reserved) = context_start::reserve(process, shared, device, expected, nvml.is_some())
    else {
        let why = match expected {
            Expected::Measured(cost) => Refused::Measured(cost),
            // Only the slice's room was wanted, and there is none.
            Expected::Bound(_) if nvml.is_some() => Refused::Full,
            // The whole bound was wanted: the cost cannot be measured here.
            Expected::Bound(bound) => Refused::Unmeasured { bound },
        };
        context_start::log_refusal(shared, device, why);
        return (CUDA_ERROR_OUT_OF_MEMORY, None);
    };
    // Another thread of this process may have charged the device meanwhile: our entry would
    // then show more than the context.
    let nvml =
        nvml.filter(|_| shared.region.slot_used(process.slot, device_id(device)) == reserved);
    let before = nvml.map(nvml_processes).unwrap_or_default();
    let result = call();
    if result != CUDA_SUCCESS {
        process.ledger.refund(device, reserved);
        return (result, None);
    }
    let measured = nvml.and_then(|handle| {
        let after = nvml_processes(handle);
        let claimed = claimed_host_pids(shared, process);
        let known_host = process.host_pid.load(Relaxed);
        match host_pid::find_after_context_creation(&before, &after, known_host, &claimed) {
            Some(me) => {
                record_host_pid(shared, process, me.pid);
                host_pid::plausible_context_cost(&me)
            }
            None => host_pid::cost_of_simultaneous_contexts(&before, &after, &claimed)
                .filter(|&cost| cost > 0 && cost <= host_pid::MAX_PLAUSIBLE_CONTEXT_BYTES),
        }
    });
    let (real_cost, why_refused) = match (measured, expected) {
        (Some(cost), _) => {
            let _ = cost_cell.compare_exchange(0, cost, AcqRel, Acquire);
            let cost = cost_cell.load(Acquire);
            shared.region.record_context_cost(device_id(device), cost);
            (cost, Refused::Measured(cost))
        }
        // Unmeasured: a measured figure stays as reserved; the bound is charged whole even
        // where only the slice's room was reserved (the context may cost all of it).
        (None, Expected::Measured(cost)) => {
            if nvml.is_some() {
                crate::log_info!(
                    "could not tell our entry in NVML's process list; keeping the {reserved} bytes reserved for the context"
                );
            }
            (cost.max(reserved), Refused::Measured(cost))
        }
        (None, Expected::Bound(bound)) => {
            if nvml.is_some() {
                crate::log_info!(
                    "could not tell our entry in NVML's process list; charging the context the {bound}-byte bound"
                );
            }
            (bound, Refused::Unmeasured { bound })
        }
    };
    let charged = match process
        .ledger
        .settle_or_undo(device, reserved, real_cost, undo)
    {
        Settled::Charged => real_cost,
        Settled::Undone => {
            context_start::log_refusal(shared, device, why_refused);
            return (CUDA_ERROR_OUT_OF_MEMORY, None);
        }
        Settled::PastLimit => {
            crate::log_error!(
                "a context of {real_cost} bytes does not fit in the slice and could not be destroyed; charged in full, past the limit"
            );
            real_cost
        }
    };
    shared
        .region
        .context_created(process.slot, device_id(device));
    (result, Some((device, charged)))
}

fn record_host_pid(shared: &Shared, process: &Process, pid: u32) {
    if process
        .host_pid
        .swap(pid, std::sync::atomic::Ordering::AcqRel)
        != pid
    {
        shared.region.set_host_pid(process.slot, pid);
    }
}

fn claimed_host_pids(shared: &Shared, process: &Process) -> Vec<u32> {
    shared
        .region
        .snapshot()
        .processes
        .iter()
        .filter(|p| p.slot != process.slot && p.host_pid != 0)
        .map(|p| p.host_pid)
        .collect()
}

/// The driver destroyed context `ctx` (and every object it owned).
pub(super) fn context_gone(process: &Process, ctx: u64) {
    if let Some(charged) = process.ledger.untrack(ObjectKind::Context, ctx) {
        if let Some(shared) = shared() {
            shared
                .region
                .context_destroyed(process.slot, device_id(charged.device));
        }
    }
    process.ledger.context_destroyed(ctx);
    reread_pools(process);
}

unsafe fn ctx_create_with(
    device: CUdevice,
    pctx: *mut CUcontext,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return crate::throttle::host_pid::around_context_creation(device, call);
    };
    let _serialised = lock(&process.ledger.primaries);
    let undo = || {
        if pctx.is_null() {
            return false;
        }
        // SAFETY: the context the driver just created (and pushed), not yet handed out; the
        // real cuCtxDestroy_v2 pops it. On success the out-pointer is cleared as on failure.
        let destroyed = real::cuCtxDestroy_v2()
            .is_some_and(|destroy| unsafe { destroy(*pctx) } == CUDA_SUCCESS);
        if destroyed {
            *pctx = std::ptr::null_mut();
        }
        destroyed
    };
    let (result, charge) = create_context(process, shared, device, call, undo);
    if let (Some((device, bytes)), false) = (charge, pctx.is_null()) {
        process.ledger.track(
            ObjectKind::Context,
            *pctx as u64,
            Charged {
                device,
                bytes,
                pool: 0,
                context: 0,
            },
        );
    }
    result
}

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

// ---------------------------------------------------------------- limits

/// Serialises this process's heap-limit changes: read, reserve, set and record are one step.
static HEAP_LIMIT: Mutex<()> = Mutex::new(());

/// The current context's device-malloc heap size, `None` when the driver does not say.
fn heap_limit() -> Option<u64> {
    let get_limit = real::cuCtxGetLimit()?;
    let mut value: usize = 0;
    // SAFETY: cuCtxGetLimit writes one size_t into `value`.
    let result = unsafe { get_limit(&mut value, MALLOC_HEAP_SIZE) };
    (result == CUDA_SUCCESS).then_some(value as u64)
}

/// `cuCtxSetLimit`. The device-malloc heap (`CU_LIMIT_MALLOC_HEAP_SIZE`) is device memory from
/// the moment it is set: growth past the current size is reserved on the current context's
/// device before the call (refused with OUT_OF_MEMORY past the slice, refunded if the driver
/// fails), a shrink is refunded after it, down to what this process was charged (the default
/// heap is inside the measured context cost). The charge is an `ObjectKind::Heap` entry owned
/// by the context, so the context's end refunds it. Other limits pass through.
pub unsafe fn ctx_set_limit(real: sig::cuCtxSetLimit, limit: c_int, value: usize) -> CUresult {
    if limit != MALLOC_HEAP_SIZE {
        return real(limit, value);
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

fn primary_entry(list: &mut Vec<PrimaryContext>, dev: CUdevice) -> Option<&mut PrimaryContext> {
    let index = usize::try_from(dev).ok()?;
    if list.len() <= index {
        list.resize(index + 1, PrimaryContext::default());
    }
    list.get_mut(index)
}

pub unsafe fn primary_ctx_retain(
    real: sig::cuDevicePrimaryCtxRetain,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return crate::throttle::host_pid::around_context_creation(dev, || real(pctx, dev));
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

/// The primary context of `dev` was torn down: refund it and what it owned.
fn primary_gone(process: &Process, entry: PrimaryContext) {
    if let Some((device, bytes)) = entry.charge {
        process.ledger.refund(device, bytes);
        if let Some(shared) = shared() {
            shared
                .region
                .context_destroyed(process.slot, device_id(device));
        }
    }
    process.ledger.context_destroyed(entry.handle);
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

/// Runs the driver's release or reset of `dev`'s primary context under the primaries lock;
/// when it succeeded and `ends` says which context it ended, books that context and what it
/// owned as gone.
fn end_primary(
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
    ends: impl FnOnce(&mut PrimaryContext) -> Option<PrimaryContext>,
) -> CUresult {
    let Some(process) = process() else {
        return call();
    };
    let mut primaries = lock(&process.ledger.primaries);
    let result = call();
    let gone = if result == CUDA_SUCCESS {
        primary_entry(&mut primaries, dev).and_then(ends)
    } else {
        None
    };
    drop(primaries);
    if let Some(ended) = gone {
        primary_gone(process, ended);
        reread_pools(process);
    }
    result
}

// ---------------------------------------------------------------- NVML

/// Whether the driver no longer holds the memory of a dead slot's process, so its budget may
/// be given back (the region's two-phase reap; see "Reaping" in `gpuslice_common::region`).
///
/// Evidence, strongest first ([`host_pid::release_evidence`]):
/// 1. the driver's own word: with the host PID known and the real NVML answering for every
///    device the slot holds bytes on, released = the PID is in none of their process lists
///    (a process that is still tearing down, or whose driver defers the teardown, is listed;
///    after [`host_pid::STILL_LISTED_TIMEOUT`] a listed PID is taken to be a reused one);
/// 2. /proc, in our PID namespace: released = the owner is gone or a zombie, i.e. the kernel
///    has closed all its descriptors, the driver's included (our slot lock may close first);
/// 3. nothing can tell (another PID namespace and no NVML or host PID; or the owner exec'd and
///    runs on): released after [`RELEASE_TIMEOUT`], so no budget is lost for good.
pub(super) fn driver_released(shared: &Shared, dead: &DeadSlot) -> bool {
    if dead.bytes() == 0 {
        return true;
    }
    let listed = (dead.host_pid != 0)
        .then(|| nvml_lists(shared, dead))
        .flatten();
    let exited = dead.exit == ExitState::Exited;
    match host_pid::release_evidence(listed, exited, dead.dead_for, RELEASE_TIMEOUT) {
        Some(host_pid::Released::ListedTooLong) => {
            crate::log_info!(
                "giving back {} bytes of dead pid {}: NVML still lists host pid {} after {:?} (taken for a reused pid)",
                dead.bytes(),
                dead.pid,
                dead.host_pid,
                host_pid::STILL_LISTED_TIMEOUT
            );
            true
        }
        Some(host_pid::Released::TimedOut) => {
            crate::log_info!(
                "giving back {} bytes of dead pid {}: nothing showed the driver releasing them within {:?}",
                dead.bytes(),
                dead.pid,
                RELEASE_TIMEOUT
            );
            true
        }
        Some(host_pid::Released::Unlisted | host_pid::Released::Exited) => true,
        None => false,
    }
}

/// Whether NVML lists the dead slot's host PID on a device it holds bytes on; `None` when
/// NVML cannot answer for one of them.
fn nvml_lists(shared: &Shared, dead: &DeadSlot) -> Option<bool> {
    for (index, bytes) in dead.used_bytes.iter().enumerate() {
        if *bytes == 0 {
            continue;
        }
        let uuid = shared.region.device_uuid(DeviceId::from_index(index)?);
        let list =
            crate::devices::nvml_compute_processes(crate::devices::real_nvml_handle(&uuid, None)?)
                .ok()?;
        if list.iter().any(|p| p.pid == dead.host_pid) {
            return Some(true);
        }
    }
    Some(false)
}

/// The real NVML handle of a CUDA device (by UUID: NVML's index order may differ).
fn nvml_for_cuda(ordinal: CUdevice) -> Option<nvmlDevice_t> {
    crate::devices::real_nvml_handle(&crate::devices::cuda_device_uuid(ordinal), None)
}

/// NVML's compute process list of `device` through the real library (v3, else v2).
fn nvml_processes(device: nvmlDevice_t) -> Vec<ListedProcess> {
    crate::devices::nvml_compute_processes(device)
        .unwrap_or_default()
        .iter()
        .map(|p| ListedProcess {
            pid: p.pid,
            used: p.usedGpuMemory,
        })
        .collect()
}

/// The processes of the slice: (NVML's PID, the container's PID) of every live slot.
fn slice_members(shared: &Shared) -> Vec<SliceProcess> {
    shared
        .region
        .snapshot()
        .processes
        .iter()
        .filter(|p| p.liveness != Liveness::Stale)
        .map(|p| SliceProcess {
            driver_pid: if p.host_pid != 0 { p.host_pid } else { p.pid },
            container_pid: p.pid,
        })
        .collect()
}

/// The slice's compute process list for `device`, or `None` when the device is not sliced.
/// Also where a process whose host PID is still unknown finds itself, by its charged bytes.
fn slice_list(device: nvmlDevice_t) -> Option<Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>> {
    members_only(device, |shared, entry| {
        let raw = crate::devices::nvml_compute_processes(device)?;
        if let Some(process) = process() {
            if process.host_pid.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                let ours = shared.region.slot_used(process.slot, device_id(entry));
                let listed: Vec<ListedProcess> = raw
                    .iter()
                    .map(|p| ListedProcess {
                        pid: p.pid,
                        used: p.usedGpuMemory,
                    })
                    .collect();
                let claimed = claimed_host_pids(shared, process);
                if let Some(me) = host_pid::find_by_usage(&listed, ours, &claimed) {
                    record_host_pid(shared, process, me.pid);
                }
            }
        }
        Ok(raw)
    })
}

/// `read`'s process list of a sliced `device` with only the slice's processes left, under
/// the PIDs the container knows; `None` when the device is not sliced.
fn members_only(
    device: nvmlDevice_t,
    read: impl FnOnce(&Shared, u8) -> Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>,
) -> Option<Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>> {
    members_only_by(
        device,
        read,
        |p| p.pid,
        |p, pid| nvmlProcessInfo_t { pid, ..p },
    )
}

/// [`members_only`] for any per-PID entry (`pid_of` reads its PID, `with_pid` rewrites it).
fn members_only_by<T: Copy>(
    device: nvmlDevice_t,
    read: impl FnOnce(&Shared, u8) -> Result<Vec<T>, nvmlReturn_t>,
    pid_of: impl Fn(&T) -> u32,
    with_pid: impl Fn(T, u32) -> T,
) -> Option<Result<Vec<T>, nvmlReturn_t>> {
    let shared = shared()?;
    let Ok(Binding::Limited(entry)) = nvml_binding(shared, device) else {
        return None;
    };
    let raw = match read(shared, entry) {
        Ok(raw) => raw,
        Err(code) => return Some(Err(code)),
    };
    let members = slice_members(shared);
    Some(Ok(slice_process_list(&raw, &members, pid_of, with_pid)))
}

/// Copies `list` to the caller's buffer under NVML's count protocol.
unsafe fn answer<S, T>(
    list: Vec<S>,
    count: *mut c_uint,
    infos: *mut T,
    convert: impl Fn(S) -> T,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match list_fits(list.len(), *count, infos.is_null()) {
        Err(needed) => {
            *count = needed;
            NVML_ERROR_INSUFFICIENT_SIZE
        }
        Ok(n) => {
            for (i, entry) in list.into_iter().enumerate().take(n) {
                infos.add(i).write(convert(entry));
            }
            *count = n as c_uint;
            NVML_SUCCESS
        }
    }
}

/// Per-process utilisation samples: only the slice's processes, under the PIDs the container
/// knows; `NVML_ERROR_NOT_FOUND` (the driver's "no sample") when none of them has one. The
/// compute throttle reads the real samples through `real::`, unaffected.
pub unsafe fn process_utilization(
    real: sig::nvmlDeviceGetProcessUtilization,
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    let read = |_: &Shared, _| crate::devices::read_utilization_samples(real, device, last_seen);
    match members_only_by(
        device,
        read,
        |s| s.pid,
        |s, pid| nvmlProcessUtilizationSample_t { pid, ..s },
    ) {
        None => real(device, samples, count, last_seen),
        Some(Err(code)) => code,
        Some(Ok(list)) if list.is_empty() => NVML_ERROR_NOT_FOUND,
        Some(Ok(list)) => answer(list, count, samples, |s| s),
    }
}

/// The real per-process utilisation samples of `device` (all buffered ones:
/// `lastSeenTimeStamp` 0), kept to the slice's processes under the PIDs the container knows,
/// with the newest timestamp among ALL samples (the device's own "now" in NVML's clock, so a
/// slice process's old samples can be told from current ones). `None` when the device has
/// no limit in this slice (memory or compute), whose figures pass through unchanged.
#[allow(clippy::type_complexity)]
pub fn slice_utilization_samples(
    device: nvmlDevice_t,
) -> Option<Result<(Vec<nvmlProcessUtilizationSample_t>, Option<u64>), nvmlReturn_t>> {
    let shared = shared()?;
    let (index, uuid) = crate::devices::nvml_identity(device);
    let limit = shared.config.limit_for(index, &uuid)?;
    if limit.memory_limit.is_none() && limit.compute_percent.is_none() {
        return None;
    }
    let Some(get) = real::nvmlDeviceGetProcessUtilization() else {
        return Some(Err(NVML_ERROR_NOT_SUPPORTED));
    };
    let raw = match crate::devices::read_utilization_samples(get, device, 0) {
        Ok(raw) => raw,
        // No process has a sample: nothing of the slice's either.
        Err(NVML_ERROR_NOT_FOUND) => Vec::new(),
        Err(code) => return Some(Err(code)),
    };
    let newest = raw.iter().map(|s| s.timeStamp).max();
    let members = slice_members(shared);
    let ours = slice_process_list(
        &raw,
        &members,
        |s| s.pid,
        |s, pid| nvmlProcessUtilizationSample_t { pid, ..s },
    );
    Some(Ok((ours, newest)))
}

/// The signature every v2/v3 process list of NVML shares.
type ProcessList =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

/// Graphics and MPS process lists (v2/v3): only the slice's processes, as in the compute
/// lists, so other tenants' PIDs and memory are not disclosed (gpustat, Ray and nvidia-smi
/// merge these lists with the compute one).
pub unsafe fn other_processes(
    real: ProcessList,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    let read = |_: &Shared, _| crate::devices::read_process_list(real, device);
    match members_only(device, read) {
        None => real(device, count, infos),
        Some(Err(code)) => code,
        Some(Ok(list)) => answer(list, count, infos, |p| p),
    }
}

/// The v1 layouts of the graphics and MPS lists, filtered as [`other_processes`].
pub unsafe fn other_processes_v1(
    real: unsafe extern "C" fn(
        nvmlDevice_t,
        *mut c_uint,
        *mut nvmlProcessInfo_v1_t,
    ) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    let read = |_: &Shared, _| {
        let v1 = crate::devices::read_process_list(real, device)?;
        Ok(v1
            .into_iter()
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.usedGpuMemory,
                ..Default::default()
            })
            .collect())
    };
    match members_only(device, read) {
        None => real(device, count, infos),
        Some(Err(code)) => code,
        Some(Ok(list)) => answer(list, count, infos, |p| nvmlProcessInfo_v1_t {
            pid: p.pid,
            usedGpuMemory: p.usedGpuMemory,
        }),
    }
}

pub unsafe fn compute_processes_v1(
    real: sig::nvmlDeviceGetComputeRunningProcesses,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    match slice_list(device) {
        None => real(device, count, infos),
        Some(Err(code)) => code,
        Some(Ok(list)) => answer(list, count, infos, |p| nvmlProcessInfo_v1_t {
            pid: p.pid,
            usedGpuMemory: p.usedGpuMemory,
        }),
    }
}

pub unsafe fn compute_processes_v2(
    real: sig::nvmlDeviceGetComputeRunningProcesses_v2,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    match slice_list(device) {
        None => real(device, count, infos),
        Some(Err(code)) => code,
        Some(Ok(list)) => answer(list, count, infos, |p| p),
    }
}

pub unsafe fn compute_processes_v3(
    real: sig::nvmlDeviceGetComputeRunningProcesses_v3,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    match slice_list(device) {
        None => real(device, count, infos),
        Some(Err(code)) => code,
        Some(Ok(list)) => answer(list, count, infos, |p| p),
    }
}
