//! The allocation seam: what the plain allocation handlers (`hooks::memory`,
//! `hooks::context`) call around the driver. [`allocate`] is the whole shape (reserve, call,
//! commit or release) over [`before_alloc`] and [`after_alloc`]; [`on_free`] gives a freed
//! object's charge back. An allocation's bytes go from here to the ledger
//! ([`super::ledger::Ledger::charge`]), and from the ledger to the region through its budget
//! ([`super::region_budget`]).
//!
//! Which context owns a device pointer (a context's end frees what it owns, and the ledger
//! refunds exactly that) is the driver's answer, asked when it is needed: in a process that
//! sees one device the allocation path needs no context to find the device, so a pointer is
//! charged as [`OWNER_NOT_ASKED`] and [`learn_pointer_owners`] asks the driver for each such
//! pointer still alive just before a context ends (`cuCtxDestroy`, a primary context's reset
//! or the release of its last reference). Guessing "the process's only context" instead would refund live memory
//! of a context the shim never saw made (a green context, a private entry point); asking at
//! each allocation cost a driver call (80 of the pair's instructions).
//!
//! The plain path (reserve, track; untrack, refund: this file, the ledger, the object table
//! and the region's operation) is `#[inline(always)]` down to the region's words, so that
//! `cuMemAlloc_v2` and `cuMemFree_v2` are one function each: the call frames between the
//! layers were a sixth of the instructions a pair added (+729 -> +580 with them gone and the
//! one-device shortcut of `device_of`,
//! `benches/alloc-instructions.sh`), for 67 KB more code in the core.

use gpuslice_abi::cuda::result::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use gpuslice_abi::cuda::{
    CUarray, CUcontext, CUdevice, CUdeviceptr, CUmemGenericAllocationHandle, CUmipmappedArray,
    CUresult,
};

use super::bindings::{cuda_binding, Binding};
use super::driver_sized::graph_reservations;
use super::region_budget::device_id;
use super::{driver_sized, process, shared, Process};
use crate::ground::devices::one_cuda_device;
use gpuslice_abi::cuda::flags::CU_POINTER_ATTRIBUTE_CONTEXT;
use gpuslice_policy::{charge_size, lock};
use gpuslice_policy::{Charged, ObjectKind, OWNER_NOT_ASKED};

/// Where an allocation lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocTarget {
    /// The device of the calling thread's current context.
    CurrentContext,
    /// An explicit device (context creation, `cuMemCreate` location).
    Device(CUdevice),
}

/// An object that holds device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceObject {
    Pointer(CUdeviceptr),
    Handle(CUmemGenericAllocationHandle),
    Array(CUarray),
    MipmappedArray(CUmipmappedArray),
    Context(CUcontext),
    /// A primary context, identified by its device (retain/release/reset are by device).
    PrimaryContext(CUdevice),
}

/// A reservation taken before the driver allocates; consumed by `after_alloc`.
#[derive(Debug)]
#[must_use]
pub struct Reservation {
    /// (device entry, bytes) reserved; `None` = nothing to account (pass-through).
    charge: Option<(u8, u64)>,
    /// The context that will own the object.
    context: u64,
}

impl Reservation {
    const NONE: Reservation = Reservation {
        charge: None,
        context: 0,
    };
}

/// The calling thread's current context (0 = none).
#[inline]
pub fn current_context() -> u64 {
    let Some(get_current) = crate::ground::driver::real::cuCtxGetCurrent() else {
        return 0;
    };
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer for the call.
    if unsafe { get_current(&mut context) } == CUDA_SUCCESS {
        context as u64
    } else {
        0
    }
}

/// Reserve, call the driver, commit or release: the shape every allocation path whose size
/// the caller decides shares. `created` names the object the driver made (read only after
/// success).
#[inline]
pub fn allocate(
    target: AllocTarget,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    created: impl FnOnce() -> DeviceObject,
) -> CUresult {
    let reservation = match before_alloc(target, bytes) {
        Ok(reservation) => reservation,
        Err(code) => return code,
    };
    let result = call();
    let object = if result == CUDA_SUCCESS {
        created()
    } else {
        DeviceObject::Pointer(0)
    };
    after_alloc(reservation, result, object);
    result
}

/// Reserve `bytes` (as the device spends them) on `target` before the driver allocates.
/// Past the cap: `Err(CUDA_ERROR_OUT_OF_MEMORY)` with nothing reserved.
#[inline(always)]
pub fn before_alloc(target: AllocTarget, bytes: u64) -> Result<Reservation, CUresult> {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return Ok(Reservation::NONE);
    };
    let (ordinal, context) = match target {
        // One device: every context is on device 0, and which context owns the object is
        // asked only when a context is about to end (`OWNER_NOT_ASKED`); with no context
        // current the driver refuses and the reservation is refunded.
        AllocTarget::CurrentContext if one_cuda_device() => (0, OWNER_NOT_ASKED),
        AllocTarget::CurrentContext => {
            let context = current_context();
            match device_of(process, context) {
                Some(d) => (d, context),
                // No current context: the driver will refuse on its own.
                None => return Ok(Reservation::NONE),
            }
        }
        AllocTarget::Device(d) => (d, current_context()),
    };
    let device = match cuda_binding(shared, ordinal) {
        Ok(Binding::Unlimited) => return Ok(Reservation::NONE),
        Ok(Binding::Limited(device)) => device,
        Err(code) => return Err(code),
    };
    let bytes = charge_size(bytes);
    if let Err(code) = charge_or_refuse(process, device, bytes) {
        return refused_unless_no_context(context, code);
    }
    Ok(Reservation {
        charge: Some((device, bytes)),
        context,
    })
}

/// A refusal of an allocation whose context was not asked: with no context current the driver
/// answers (its own error, as without a slice), else the refusal stands.
#[cold]
#[inline(never)]
fn refused_unless_no_context(context: u64, code: CUresult) -> Result<Reservation, CUresult> {
    if context == OWNER_NOT_ASKED && current_context() == 0 {
        return Ok(Reservation::NONE);
    }
    Err(code)
}

/// Before a context of this process ends (which frees what it owns): asks the driver which
/// context owns each pointer charged without asking ([`OWNER_NOT_ASKED`]), so that the
/// ledger refunds exactly what the ending context held and nothing that lives on. A pointer
/// the driver cannot place (its free is in flight) is owned by none (its free takes it).
/// Each pointer is asked at most once in its life; cold.
#[cold]
#[inline(never)]
pub fn learn_pointer_owners() {
    let Some(process) = process() else { return };
    let objects = &process.ledger.objects;
    let unasked = objects.pointers_not_asked();
    if unasked.is_empty() {
        return;
    }
    let get = crate::ground::driver::real::cuPointerGetAttribute();
    for pointer in unasked {
        let mut context: CUcontext = std::ptr::null_mut();
        let out = (&mut context as *mut CUcontext).cast();
        let answered = get.is_some_and(|get| {
            // SAFETY: `out` is a valid out-pointer of the attribute's type (a CUcontext); the
            // driver validates the pointer.
            let result = unsafe { get(out, CU_POINTER_ATTRIBUTE_CONTEXT, pointer) };
            result == CUDA_SUCCESS
        });
        objects.owner_learned(pointer, if answered { context as u64 } else { 0 });
    }
}

/// The device ordinal of `context` (the calling thread's current one, 0 = none): 0 in a
/// process that sees one device, else remembered per context (`ledger::ContextDevices`),
/// else the driver's `cuCtxGetDevice`.
#[inline]
fn device_of(process: &Process, context: u64) -> Option<CUdevice> {
    if context == 0 {
        return None;
    }
    if one_cuda_device() {
        return Some(0);
    }
    if let Some(ordinal) = process.ledger.contexts.get(context) {
        return Some(ordinal);
    }
    // A context is current: counts the devices once (so the next call takes the branch above).
    let ordinal = crate::ground::devices::current_context_device()?;
    process.ledger.contexts.remember(context, ordinal);
    Some(ordinal)
}

/// The device of the calling thread's current context, `None` without one (what the memory
/// queries report on).
#[inline]
pub fn current_device() -> Option<CUdevice> {
    match process() {
        Some(process) => device_of(process, current_context()),
        None => crate::ground::devices::current_cuda_device(),
    }
}

/// `Ledger::charge`, and before refusing, pools' cached memory the driver has already given
/// back is settled first (it may be what stands in the way).
#[inline(always)]
pub fn charge_or_refuse(process: &Process, device: u8, bytes: u64) -> Result<(), CUresult> {
    if process.ledger.charge(device, bytes).is_ok() {
        return Ok(());
    }
    retry_or_refuse(process, device, bytes)
}

/// The cap refused `bytes`: what the driver may have given back is settled and the charge
/// tried again before the refusal is final. Out of line: the allocation path stays short.
#[cold]
#[inline(never)]
fn retry_or_refuse(process: &Process, device: u8, bytes: u64) -> Result<(), CUresult> {
    // Both re-read (no short circuit): either may have shrunk.
    let shrank = driver_sized::reread_pools(process) | graph_reservations::reread_if_any(process);
    if shrank && process.ledger.charge(device, bytes).is_ok() {
        return Ok(());
    }
    let shared = shared();
    // Room another process's context start holds above its context's cost comes back
    // within moments: refusing meanwhile would fail an allocation that fits.
    if shared.is_some_and(|shared| {
        super::context_start::wait_for_starts_to_settle(process, shared, device, bytes)
    }) {
        return Ok(());
    }
    crate::log_debug!("refusing {bytes} bytes on device entry {device}: slice limit reached");
    if let Some(shared) = shared {
        // Kept in the region, so the node agent's counter survives this process.
        shared.region.count_refusal(device_id(device));
    }
    Err(CUDA_ERROR_OUT_OF_MEMORY)
}

/// Commit (`result == CUDA_SUCCESS`) or release the reservation.
#[inline(always)]
pub fn after_alloc(reservation: Reservation, result: CUresult, object: DeviceObject) {
    let (Some(process), Some((device, bytes))) = (process(), reservation.charge) else {
        return;
    };
    if result != CUDA_SUCCESS {
        process.ledger.refund(device, bytes);
        return;
    }
    let charged = Charged {
        device,
        bytes,
        pool: 0,
        context: reservation.context,
    };
    match object {
        DeviceObject::Pointer(ptr) => process.ledger.track(ObjectKind::Pointer, ptr, charged),
        other => track_other(process, other, charged),
    }
}

/// `after_alloc` for the objects other than device pointers (out of line: the plain
/// allocation path stays short).
#[cold]
#[inline(never)]
fn track_other(process: &Process, object: DeviceObject, mut charged: Charged) {
    // Only a device pointer's owner can be asked later (of the pointer); the others' now.
    if charged.context == OWNER_NOT_ASKED {
        charged.context = current_context();
    }
    let Charged { device, bytes, .. } = charged;
    match object {
        DeviceObject::Pointer(ptr) => process.ledger.track(ObjectKind::Pointer, ptr, charged),
        DeviceObject::Array(a) => process.ledger.track(ObjectKind::Array, a as u64, charged),
        DeviceObject::MipmappedArray(a) => {
            process
                .ledger
                .track(ObjectKind::MipmappedArray, a as u64, charged)
        }
        DeviceObject::Handle(handle) => {
            let stale = lock(&process.ledger.vmm).created(handle, device, bytes);
            if let Some((d, b)) = stale {
                process.ledger.refund(d, b);
            }
        }
        DeviceObject::Context(ctx) => {
            process.ledger.track(
                ObjectKind::Context,
                ctx as u64,
                Charged {
                    context: 0,
                    ..charged
                },
            );
        }
        // Primary contexts are booked by `hooks::context::primary_ctx_retain`.
        DeviceObject::PrimaryContext(_) => process.ledger.refund(device, bytes),
    }
}

/// The driver freed `object` with `result`: give its charge back. Objects the ledger never
/// charged are ignored (the driver's result is returned unchanged by the wrapper either way).
#[inline(always)]
pub fn on_free(object: DeviceObject, result: CUresult) {
    if result != CUDA_SUCCESS {
        return;
    }
    let Some(process) = process() else { return };
    // Whichever free path: the oldest entry under the address is the object freed (see
    // `objects`), a plain or a pool allocation alike.
    if let DeviceObject::Pointer(ptr) = object {
        if let Some(freed) = process.ledger.untrack(ObjectKind::Pointer, ptr) {
            if freed.pool != 0 {
                driver_sized::pool_pointer_freed(process, freed.pool);
            }
        }
        return;
    }
    free_other(process, object);
}

/// `on_free` for the objects other than device pointers (out of line).
#[cold]
#[inline(never)]
fn free_other(process: &Process, object: DeviceObject) {
    let ledger = &process.ledger;
    match object {
        DeviceObject::Pointer(_) => {}
        DeviceObject::Array(a) => {
            ledger.untrack(ObjectKind::Array, a as u64);
        }
        DeviceObject::MipmappedArray(a) => {
            ledger.untrack(ObjectKind::MipmappedArray, a as u64);
        }
        DeviceObject::Handle(handle) => {
            let freed = lock(&ledger.vmm).released(handle);
            if let Some((d, b)) = freed {
                ledger.refund(d, b);
            }
        }
        DeviceObject::Context(ctx) => driver_sized::context_gone(process, ctx as u64),
        DeviceObject::PrimaryContext(_) => {}
    }
}
