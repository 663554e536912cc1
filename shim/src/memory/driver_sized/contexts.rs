//! Contexts: what creating one costs (measured from NVML on the first of the process on a
//! device), and what ending one, or a primary context, gives back.

use std::cell::Cell;

use gpuslice_abi::cuda::result::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use super::nvml::{nvml_for_cuda, nvml_processes};
use super::pools::reread_pools;
use crate::ground::driver::real;
use crate::memory::context_start::{self, Expected, Refused};
use crate::memory::ledger::{lock, PrimaryContext, Settled};
use crate::memory::objects::{Charged, ObjectKind};
use crate::memory::{cuda_binding, device_id, process, shared, Binding, Process, Shared};
use crate::session::host_pid;

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
pub(in crate::memory) fn context_gone(process: &Process, ctx: u64) {
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

/// `cuCtxCreate*` on `device` through `call` (the driver's result and the context it wrote):
/// charged as [`create_context`] says, under the primaries lock (which serialises context
/// creation in this process). A context the slice cannot hold is destroyed again and
/// `undone` clears the caller's handle.
pub(crate) fn ctx_create_with(
    device: CUdevice,
    call: impl FnOnce() -> (CUresult, Option<CUcontext>),
    undone: impl FnOnce(),
) -> CUresult {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return host_pid::around_context_creation(device, || call().0);
    };
    let _serialised = lock(&process.ledger.primaries);
    let created = Cell::new(None);
    let call = || {
        let (result, context) = call();
        created.set(context);
        result
    };
    let undo = || {
        let Some(context) = created.get() else {
            return false;
        };
        // SAFETY: the context the driver just created (and pushed), not yet handed out; the
        // real cuCtxDestroy_v2 pops it. On success the caller's handle is cleared as on
        // failure.
        let destroyed = real::cuCtxDestroy_v2()
            .is_some_and(|destroy| unsafe { destroy(context) } == CUDA_SUCCESS);
        if destroyed {
            undone();
        }
        destroyed
    };
    let (result, charge) = create_context(process, shared, device, call, undo);
    if let (Some((device, bytes)), Some(context)) = (charge, created.get()) {
        process.ledger.track(
            ObjectKind::Context,
            context as u64,
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

/// `cuCtxDestroy_v2` of `ctx` succeeded.
pub(crate) fn ctx_destroyed(ctx: u64) {
    if let Some(process) = process() {
        context_gone(process, ctx);
    }
}

/// `cuDevicePrimaryCtxRetain` of `dev` through `call` (the driver's result and the context it
/// wrote), under the primaries lock. The retain that makes the primary context is charged as
/// [`create_context`] says; when the slice cannot hold it, it is taken down again through
/// the real driver (not our hooks, whose bookkeeping has no context yet) and `undone` clears
/// the caller's handle. Later retains only count references.
pub(crate) fn retain_primary(
    dev: CUdevice,
    call: impl FnOnce() -> (CUresult, Option<CUcontext>),
    undone: impl FnOnce(),
) -> CUresult {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return host_pid::around_context_creation(dev, || call().0);
    };
    let mut primaries = lock(&process.ledger.primaries);
    let Some(entry) = primary_entry(&mut primaries, dev) else {
        return call().0;
    };
    if !entry.retain_creates() {
        let (result, _) = call();
        if result == CUDA_SUCCESS {
            entry.retained(None);
        }
        return result;
    }
    // With no reference before, the release takes the new context down. After a reset, older
    // references keep it alive through a release, so it is reset first (it was made just now:
    // nothing else lives in it), then released.
    let references_before = entry.refs;
    let undo = || {
        // SAFETY: plain by-value calls on the device ordinal the retain just succeeded for.
        let ended = references_before == 0
            || real::cuDevicePrimaryCtxReset_v2()
                .is_some_and(|reset| unsafe { reset(dev) } == CUDA_SUCCESS);
        // SAFETY: as above; drops the one reference the retain took.
        let released = real::cuDevicePrimaryCtxRelease_v2()
            .is_some_and(|release| unsafe { release(dev) } == CUDA_SUCCESS);
        let done = ended && (released || references_before > 0);
        if done {
            undone();
        }
        done
    };
    let created = Cell::new(None);
    let call = || {
        let (result, context) = call();
        created.set(context);
        result
    };
    let (result, charge) = create_context(process, shared, dev, call, undo);
    if result == CUDA_SUCCESS {
        let handle = created.get().map_or(0, |c| c as u64);
        entry.retained(Some((handle, charge)));
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
pub(crate) fn end_primary(
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
