//! Contexts: what creating one costs (measured from NVML on the first of the process on a
//! device), and what ending one, or a primary context, gives back.

use std::cell::Cell;

use gpuslice_abi::cuda::result::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use super::nvml::{nvml_for_cuda, nvml_processes};
use super::pool_reservations::reread_pools;
use crate::ground::driver::real;
use crate::memory::context_start::{self, Expected, MeasuredReservation, Refused};
use crate::memory::region_budget::device_id;
use crate::memory::{cuda_binding, process, shared, Binding, Process, Shared};
use crate::session::host_pid;
use gpuslice_policy::{lock, PrimaryContext, Settled};
use gpuslice_policy::{Charged, ObjectKind};

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
    // The first context of the process on the device is measured from our NVML entry, which
    // must hold nothing but the new context. While the cost on the card or our entry is
    // unknown, the entry is found by diffing NVML's list around the creation under the
    // slice's turn (the reservation may be the bound); a waiter stops waiting once the holder
    // published what it needed. Otherwise our entry comes from a listing the slice reads
    // once for every process waiting for one, which only its reader opens NVML for.
    let wants_measure =
        own_cost == 0 && shared.region.slot_used(process.slot, device_id(device)) == 0;
    let unknown = || {
        (own_cost == 0 && shared.region.context_cost(device_id(device)).is_none())
            || !host_pid::adopt_known()
    };
    // NVML is opened for the device only by the process that will measure: a storm's waiters
    // mostly find the figures published and never need it. Without a process list nothing
    // can be measured, and the turn would only serialise the starts.
    let measure_first =
        wants_measure && unknown() && crate::ground::devices::nvml_lists_processes();
    let mut turn_given_up = false;
    let (mut held_turn, mut nvml) = if measure_first {
        match context_start::lock_for_measuring(
            shared.region,
            device,
            context_start::MEASURING_WAIT,
            unknown,
        ) {
            // A device NVML cannot name is not measured: the turn goes back at once.
            context_start::Turn::Held(turn) => match nvml_for_cuda(ordinal) {
                Some(handle) => (Some(turn), Some(handle)),
                None => (None, None),
            },
            // Measured all the same, unserialised.
            context_start::Turn::GaveUp => {
                turn_given_up = true;
                (None, nvml_for_cuda(ordinal))
            }
            context_start::Turn::NotNeeded => (None, None),
        }
    } else {
        (None, None)
    };
    let by_listing = wants_measure && !unknown() && crate::ground::devices::nvml_lists_processes();
    if by_listing {
        nvml = None;
    }
    // This process's own measurement, else what another process of the slice measured on
    // the device (read under the lock: the previous holder just published it), else the
    // bound. The latter two are still measured and settled below.
    let expected = match (own_cost, shared.region.context_cost(device_id(device))) {
        (own, _) if own > 0 => Expected::Measured(own),
        (_, Some(slice)) => Expected::Measured(slice),
        (_, None) => Expected::Bound(shared.context_bound),
    };
    // A first context reserved at a figure another process measured, and measured right
    // after its creation, may cost more than that figure: made alongside other starts at the
    // bound, or in the slice's turn at the figure (`context_start::reserve_measured_cost`).
    // Under the turn already, or where the turn could not be had, the figure is reserved.
    let mut _starting = None;
    let reservation = match expected {
        Expected::Measured(cost)
            if own_cost == 0
                && wants_measure
                && (nvml.is_some() || by_listing)
                && held_turn.is_none()
                && !turn_given_up =>
        {
            match context_start::reserve_measured_cost(process, shared, device, cost) {
                MeasuredReservation::Alongside(bytes, mark) => {
                    _starting = Some(mark);
                    Some(bytes)
                }
                MeasuredReservation::InTurn(bytes, turn) => {
                    held_turn = turn;
                    Some(bytes)
                }
                MeasuredReservation::Refused => None,
            }
        }
        _ => context_start::reserve(process, shared, device, expected, nvml.is_some()),
    };
    let Some(reserved) = reservation else {
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
    let alone = shared.region.slot_used(process.slot, device_id(device)) == reserved;
    let nvml = nvml.filter(|_| alone);
    let by_listing = by_listing && alone;
    let before = nvml.map(nvml_processes).unwrap_or_default();
    let result = call();
    if result != CUDA_SUCCESS {
        process.ledger.refund(device, reserved);
        return (result, None);
    }
    // A listing of the device that begins after this ticket shows the new context.
    let ticket = by_listing.then(|| shared.region.listing_ticket(device_id(device)));
    crate::session::slice::pause_after_context();
    let measured = if let Some(ticket) = ticket {
        // Our entry by our NVML PID (`gpuslice_common::region`, `listing`).
        shared
            .region
            .listed_bytes(process.slot, &ticket, context_start::MEASURING_WAIT, || {
                let handle = nvml_for_cuda(ordinal)?;
                // Room for the slice's processes at once: the driver builds the list once.
                let list = crate::ground::devices::nvml_compute_processes_expecting(
                    handle,
                    shared.region.slot_high_water(),
                )
                .ok()?;
                Some(list.iter().map(|p| (p.pid, p.usedGpuMemory)).collect())
            })
            .and_then(|used| {
                host_pid::plausible_context_cost(&host_pid::ListedProcess {
                    pid: host_pid::known(),
                    used,
                })
            })
    } else {
        nvml.and_then(|handle| measure_by_diff(handle, &before))
    };
    let measuring = nvml.is_some() || by_listing;
    let (real_cost, why_refused) = match (measured, expected) {
        (Some(cost), _) => {
            let _ = cost_cell.compare_exchange(0, cost, AcqRel, Acquire);
            let cost = cost_cell.load(Acquire);
            (cost, Refused::Measured(cost))
        }
        // Unmeasured: a measured figure stays as reserved; the bound is charged whole even
        // where only the slice's room was reserved (the context may cost all of it).
        (None, Expected::Measured(cost)) => {
            if measuring {
                crate::log_info!(
                    "could not tell our entry in NVML's process list; keeping the {reserved} bytes reserved for the context"
                );
            }
            (cost.max(reserved), Refused::Measured(cost))
        }
        (None, Expected::Bound(bound)) => {
            if measuring {
                crate::log_info!(
                    "could not tell our entry in NVML's process list; charging the context the {bound}-byte bound"
                );
            }
            (bound, Refused::Unmeasured { bound })
        }
    };
    let settled = process
        .ledger
        .settle_or_undo(device, reserved, real_cost, undo);
    // Published once settled: a process waiting for the slice's figure must not reserve it
    // while our provisional reservation (up to the bound) still stands.
    if measured.is_some() {
        shared
            .region
            .record_context_cost(device_id(device), real_cost);
    }
    // The next holder of the turn reserves what was just published.
    drop(held_turn);
    let charged = match settled {
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

/// What the new context costs and which entry is ours, by diffing NVML's list of `device`
/// after the creation against `before` (entries other slots of the slice claim left out):
/// the one entry that appeared is ours; when several appeared at once, the cost only, if
/// they all agree.
fn measure_by_diff(
    device: gpuslice_abi::nvml::nvmlDevice_t,
    before: &[host_pid::ListedProcess],
) -> Option<u64> {
    let after = nvml_processes(device);
    let claimed = host_pid::claimed_by_others();
    match host_pid::find_after_context_creation(before, &after, 0, &claimed) {
        Some(me) => {
            host_pid::measured(me.pid);
            host_pid::plausible_context_cost(&me)
        }
        None => host_pid::cost_of_simultaneous_contexts(before, &after, &claimed)
            .filter(|&cost| cost > 0 && cost <= host_pid::MAX_PLAUSIBLE_CONTEXT_BYTES),
    }
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
    ends: impl Fn(&mut PrimaryContext) -> Option<PrimaryContext>,
) -> CUresult {
    let Some(process) = process() else {
        return call();
    };
    let mut primaries = lock(&process.ledger.primaries);
    // A call that ends the context (a reset; the release of the last reference) frees the
    // pointers it owns: they must be known as its own first. A release that only drops a
    // reference (some libraries pair retains and releases often) asks nothing.
    let would_end = primary_entry(&mut primaries, dev).is_none_or(|entry| {
        let mut after = *entry;
        ends(&mut after).is_some()
    });
    if would_end {
        crate::memory::learn_pointer_owners();
    }
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
