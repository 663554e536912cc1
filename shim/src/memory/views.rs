//! The slice's numbers for the views (`cuMemGetInfo`, NVML's memory queries) and for
//! placement decisions: (limit, container-wide use) of a limited device, read from the region
//! after the pools and graph memory are re-read and the dead are swept as due.

use gpuslice_abi::cuda::CUdevice;
use gpuslice_abi::nvml::nvmlDevice_t;

use super::bindings::{cuda_binding, nvml_binding, Binding};
use super::driver_sized::graph_reservations;
use super::region_budget::device_id;
use super::{driver_sized, process, shared, sweep, Shared};

/// (limit, container-wide use) of a CUDA device in the slice; `None` = not limited.
/// `card_free` reads the card's free bytes (called only for a limited device).
#[inline]
pub fn cuda_slice(device: CUdevice, card_free: impl FnOnce() -> u64) -> Option<(u64, u64)> {
    let shared = shared()?;
    match cuda_binding(shared, device) {
        Ok(Binding::Limited(d)) => usage_of(shared, d, Some((sweep::Source::Cuda, card_free()))),
        _ => None,
    }
}

/// [`cuda_slice`] for a decision rather than a view (no card reading): the pools and graph
/// memory re-read and a due sweep run, so a placement is judged on the figures a view shows.
pub fn cuda_slice_settled(device: CUdevice) -> Option<(u64, u64)> {
    let shared = shared()?;
    match cuda_binding(shared, device) {
        Ok(Binding::Limited(d)) => usage_of(shared, d, None),
        _ => None,
    }
}

/// The memory limit in force for a CUDA device in the slice (`Some(None)`: not limited);
/// `None` when this process has no slice ledger or the device cannot be bound (then the
/// configuration says).
#[inline]
pub fn cuda_limit(device: CUdevice) -> Option<Option<u64>> {
    match cuda_binding(shared()?, device) {
        Ok(Binding::Limited(d)) => Some(shared()?.region.usage(device_id(d)).limit),
        Ok(Binding::Unlimited) => Some(None),
        Err(_) => None,
    }
}

/// (limit, container-wide use) of an NVML device in the slice; `None` = not limited.
/// `card_free`: the card's free bytes as NVML reported them.
#[inline]
pub fn nvml_slice(device: nvmlDevice_t, card_free: u64) -> Option<(u64, u64)> {
    let shared = shared()?;
    match nvml_binding(shared, device) {
        Ok(Binding::Limited(d)) => usage_of(shared, d, Some((sweep::Source::Nvml, card_free))),
        _ => None,
    }
}

/// Inlined into each caller: on the views' path its call frame cost a fifth of what the
/// view adds.
#[inline(always)]
fn usage_of(
    shared: &Shared,
    device: u8,
    card_seen: Option<(sweep::Source, u64)>,
) -> Option<(u64, u64)> {
    if let Some(process) = process() {
        driver_sized::reread_pools_if_any(process);
        graph_reservations::reread_if_any(process);
    }
    match card_seen {
        Some((source, card_free)) => sweep::card_seen(shared, source, device, card_free),
        None => sweep::if_due(shared),
    }
    let usage = shared.region.usage(device_id(device));
    Some((usage.limit.unwrap_or(u64::MAX), usage.used))
}
