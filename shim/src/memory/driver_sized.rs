//! What the paths whose real size only the driver knows charge (pools, VMM, contexts, the
//! device-malloc heap), and which NVML process entries belong to the slice. Their handlers are
//! in the hook layer (`hooks::memory`, `hooks::context`, `hooks::nvml`): they read the
//! arguments, reserve through the ledger and these functions, call the real function, settle
//! with what the driver reports.

use std::ffi::{c_int, c_uint};
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
use super::ledger::{charge_size, lock, PrimaryContext, Settled};
use super::objects::{Charged, ObjectKind};
use super::pools::{cover, Cover, Freed, PoolBook, PoolHome, Settle};
use super::released;
use super::{
    charge_or_refuse, cuda_binding, current_context, device_id, nvml_binding, process, shared,
    Binding, Process, Shared,
};
use crate::ground::driver::real;
use crate::memory::report::{list_fits, slice_process_list, SliceProcess};
use crate::session::host_pid::{self, ListedProcess};

/// The limited device entry of the current context's device, `None` = pass-through.
pub fn current_limited_device() -> Option<(CUdevice, u8)> {
    let shared = shared()?;
    process()?;
    let ordinal = crate::ground::devices::current_cuda_device()?;
    match cuda_binding(shared, ordinal) {
        Ok(Binding::Limited(d)) => Some((ordinal, d)),
        _ => None,
    }
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

/// The limited device entry of CUDA device `ordinal`, `None` = pass-through.
pub fn limited_device(ordinal: CUdevice) -> Option<u8> {
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

// ---------------------------------------------------------------- VMM

/// `cuMemUnmap` / `cuMemAddressFree` through `call`: the VMM book's ticket is taken BEFORE
/// the driver makes the range reusable, so the bookkeeping after it ends exactly the
/// mappings that existed then, never one another thread made in the freed range meanwhile
/// (see `vmm`).
pub fn unmapping(ptr: CUdeviceptr, size: usize, call: impl FnOnce() -> CUresult) -> CUresult {
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

// ---------------------------------------------------------------- contexts

/// Creates a context on `ordinal` (the caller holds the primaries lock, which serialises
/// context creation in this process): reserves the context cost, calls the driver, and on
/// the first context of the process on the device measures the real cost and our host PID
/// from NVML, under the slice's measuring lock for the device (`context_start`). When that
/// real cost does not fit in the slice, `undo` gives the new context back to the real driver
/// (true = done) and the answer is `CUDA_ERROR_OUT_OF_MEMORY` with nothing charged. Returns
/// the driver's result and what stays charged.
pub fn create_context(
    process: &Process,
    shared: &Shared,
    ordinal: CUdevice,
    call: impl FnOnce() -> CUresult,
    undo: impl FnOnce() -> bool,
) -> (CUresult, Option<(u8, u64)>) {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    let device = match cuda_binding(shared, ordinal) {
        Ok(Binding::Limited(d)) => d,
        Ok(Binding::Unlimited) => return (host_pid::around_context_creation(ordinal, call), None),
        Err(code) => return (code, None),
    };
    let cost_cell = &shared.context_cost[device as usize];
    let own_cost = cost_cell.load(Acquire);
    // Measuring needs our NVML entry to hold nothing but the new context; it is needed while
    // our cost or our entry is unknown. Processes of the slice measure one at a time.
    let wants_measure = (own_cost == 0 || host_pid::known() == 0)
        && shared.region.slot_used(process.slot, device_id(device)) == 0;
    let nvml = if wants_measure {
        nvml_for_cuda(ordinal)
    } else {
        None
    };
    let _measuring = nvml.and_then(|_| {
        context_start::lock_for_measuring(shared.region, device, context_start::MEASURING_WAIT)
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
        let claimed = host_pid::claimed_by_others();
        let known_host = host_pid::known();
        match host_pid::find_after_context_creation(&before, &after, known_host, &claimed) {
            Some(me) => {
                host_pid::measured(me.pid);
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

/// The driver destroyed context `ctx` (and every object it owned).
pub fn context_gone(process: &Process, ctx: u64) {
    if let Some(charged) = process.ledger.untrack(ObjectKind::Context, ctx) {
        if let Some(shared) = shared() {
            shared
                .region
                .context_destroyed(process.slot, device_id(charged.device));
        }
    }
    process.ledger.context_destroyed(ctx);
    reread_pools(process);
    // What the driver held for the context on its own account (modules, local memory) went
    // with it: the surplus charged for it is given back at the next reconciliation.
    super::driver_growth::driver_may_have_changed();
}

pub unsafe fn ctx_create_with(
    device: CUdevice,
    pctx: *mut CUcontext,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return host_pid::around_context_creation(device, call);
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

// ---------------------------------------------------------------- limits

/// Serialises this process's heap-limit changes: read, reserve, set and record are one step.
/// Survives fork (a mutex cannot be reset by atomic stores): held by another thread at the
/// fork, it stays held in the child.
pub static HEAP_LIMIT: Mutex<()> = Mutex::new(());

/// The current context's device-malloc heap size, `None` when the driver does not say.
pub fn heap_limit() -> Option<u64> {
    let get_limit = real::cuCtxGetLimit()?;
    let mut value: usize = 0;
    // SAFETY: cuCtxGetLimit writes one size_t into `value`.
    let result = unsafe { get_limit(&mut value, MALLOC_HEAP_SIZE) };
    (result == CUDA_SUCCESS).then_some(value as u64)
}

pub fn primary_entry(list: &mut Vec<PrimaryContext>, dev: CUdevice) -> Option<&mut PrimaryContext> {
    let index = usize::try_from(dev).ok()?;
    if list.len() <= index {
        list.resize(index + 1, PrimaryContext::default());
    }
    list.get_mut(index)
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

/// Runs the driver's release or reset of `dev`'s primary context under the primaries lock;
/// when it succeeded and `ends` says which context it ended, books that context and what it
/// owned as gone.
pub fn end_primary(
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
/// Evidence, strongest first ([`released::release_evidence`]):
/// 1. the driver's own word: with the host PID known and the real NVML answering for every
///    device the slot holds bytes on, released = the PID is in none of their process lists
///    (a process that is still tearing down, or whose driver defers the teardown, is listed,
///    and stays charged however long that takes; only a PID seen to name another running
///    process is given up on, after [`released::STILL_LISTED_TIMEOUT`]);
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
    let evidence = released::release_evidence(
        listed,
        exited,
        dead.host_pid_reused,
        dead.dead_for,
        RELEASE_TIMEOUT,
    );
    match evidence {
        Some(released::Released::ListedTooLong) => {
            crate::log_info!(
                "giving back {} bytes of dead pid {}: NVML still lists host pid {} after {:?}, and that pid names another process now",
                dead.bytes(),
                dead.pid,
                dead.host_pid,
                released::STILL_LISTED_TIMEOUT
            );
            true
        }
        Some(released::Released::TimedOut) => {
            crate::log_info!(
                "giving back {} bytes of dead pid {}: nothing showed the driver releasing them within {:?}",
                dead.bytes(),
                dead.pid,
                RELEASE_TIMEOUT
            );
            true
        }
        Some(released::Released::Unlisted | released::Released::Exited) => true,
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
        let list = crate::ground::devices::nvml_compute_processes(
            crate::ground::devices::real_nvml_handle(&uuid, None)?,
        )
        .ok()?;
        if list.iter().any(|p| p.pid == dead.host_pid) {
            return Some(true);
        }
    }
    Some(false)
}

/// The real NVML handle of a CUDA device (by UUID: NVML's index order may differ).
fn nvml_for_cuda(ordinal: CUdevice) -> Option<nvmlDevice_t> {
    crate::ground::devices::real_nvml_handle(
        &crate::ground::devices::cuda_device_uuid(ordinal),
        None,
    )
}

/// NVML's compute process list of `device` through the real library (v3, else v2).
fn nvml_processes(device: nvmlDevice_t) -> Vec<ListedProcess> {
    crate::ground::devices::nvml_compute_processes(device)
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
pub fn slice_list(device: nvmlDevice_t) -> Option<Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t>> {
    members_only(device, |shared, entry| {
        let raw = crate::ground::devices::nvml_compute_processes(device)?;
        if let Some(process) = process() {
            if host_pid::known() == 0 {
                let ours = shared.region.slot_used(process.slot, device_id(entry));
                let listed: Vec<ListedProcess> = raw
                    .iter()
                    .map(|p| ListedProcess {
                        pid: p.pid,
                        used: p.usedGpuMemory,
                    })
                    .collect();
                let claimed = host_pid::claimed_by_others();
                if let Some(me) = host_pid::find_by_usage(&listed, ours, &claimed) {
                    host_pid::measured(me.pid);
                }
            }
        }
        Ok(raw)
    })
}

/// `read`'s process list of a sliced `device` with only the slice's processes left, under
/// the PIDs the container knows; `None` when the device is not sliced.
pub fn members_only(
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
pub fn members_only_by<T: Copy>(
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
pub unsafe fn answer<S, T>(
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
    let (index, uuid) = crate::ground::devices::nvml_identity(device);
    let limit = shared.config.limit_for(index, &uuid)?;
    if limit.memory_limit.is_none() && limit.compute_percent.is_none() {
        return None;
    }
    let Some(get) = real::nvmlDeviceGetProcessUtilization() else {
        return Some(Err(NVML_ERROR_NOT_SUPPORTED));
    };
    let raw = match crate::ground::devices::read_utilization_samples(get, device, 0) {
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
pub type ProcessList =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;
