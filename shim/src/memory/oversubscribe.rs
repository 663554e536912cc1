//! Opt-in oversubscription: a device whose limit gives a `virtual` size above its `memory`
//! lets the slice's processes allocate up to the virtual size while the card holds at most
//! the physical share for them. What lies past the physical share is placed in the
//! container's host memory, and the host memory is checked against the container's memory
//! cgroup before it is taken.
//!
//! **Which allocations can go to the host.** A plain `cuMemAlloc_v2` past the physical share
//! is served from managed memory the device reads in place: `cuMemAllocManaged`, advised
//! `SET_PREFERRED_LOCATION` = the host and `SET_ACCESSED_BY` = the device, then prefetched to
//! the host, so every page is populated (and counted by the cgroup) before the call returns,
//! as device memory is, and the driver's policy keeps the pages there: data in its preferred
//! location that the faulting processor can map is not migrated (`cuMemAdvise`). This needs
//! concurrent managed access (Pascal or later on Linux); without it the allocation is refused.
//! Every other path is refused with `CUDA_ERROR_OUT_OF_MEMORY` past the physical share, as
//! without oversubscription, because managed memory cannot stand in for what it returns:
//! * `cuMemAlloc` (32-bit ABI): its addresses must lie in the low 4 GiB;
//! * `cuMemAllocPitch`: the driver chooses the pitch for 2-D texture and copy alignment;
//! * arrays and mipmapped arrays: opaque layouts in device memory;
//! * `cuMemCreate` (VMM): a physical allocation on the location the caller names, mapped and
//!   exported by the caller;
//! * `cuMemAllocAsync` / pools, graph memory: the driver sizes and places them itself;
//! * `cuMemAllocManaged`: the application's own managed memory, which it places itself.
//!
//! A pointer placed on the host answers as managed memory where the driver is asked about it
//! directly: `cuIpcGetMemHandle` refuses it (`CUDA_ERROR_INVALID_VALUE`: legacy IPC exports
//! device memory only) and `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_IS_MANAGED)` says 1.
//! An application's own `cuMemAdvise` / `cuMemPrefetchAsync` on it would let the driver move
//! it onto the card; those calls get the answer a real driver gives for device memory
//! (`CUDA_ERROR_INVALID_VALUE`, [`refuses_range`]).
//!
//! **The two budgets.** The physical share is the device's region entry, as without
//! oversubscription; the host bytes are the device's companion entry
//! (`gpuslice_common::host_memory`, limit `virtual - memory`), charged by the same ledger
//! (the pointer is tracked with the companion as its device, so `cuMemFree` and a context's
//! end refund it there). Past the companion's limit, or past what the cgroup can still hold
//! less its margin, the allocation is refused with `CUDA_ERROR_OUT_OF_MEMORY`.
//!
//! **What the application sees** (every view, the same way): total = the physical view's
//! total + `virtual - memory`; used (NVML) = physical + host bytes; free = the physical
//! view's free + what the host budget and the cgroup can still give.
//!
//! **Cost without oversubscription**: [`enabled`] is one relaxed load, taken by the
//! `cuMemAlloc_v2` handler before the ordinary path; frees take the ordinary path unchanged.
//!
//! Owns `ENABLED`, `HOST_ENTRY`, `MANAGED_ACCESS` and `SAID` (plain statics: a fork child
//! has the same configuration, region and devices) and `PLACING` (per process).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

use gpuslice_abi::cuda::flags::CU_MEM_ATTACH_GLOBAL;
use gpuslice_abi::cuda::result::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::vmm::{CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST};
use gpuslice_abi::cuda::{attr, CUdevice, CUdeviceptr, CUmemLocation, CUresult, CUstream};
use gpuslice_abi::nvml::nvmlDevice_t;
use gpuslice_common::config::SliceConfig;
use gpuslice_common::host_memory::{host_entry_key, CgroupMemory, HOST_MARGIN_BYTES};
use gpuslice_common::region::{DeviceLimits, MAX_DEVICES};
use gpuslice_common::size::format_size;
use gpuslice_common::turn::Turn;

use super::bindings::nvml_binding;
use super::region_budget::device_id;
use super::{Binding, DeviceObject, Process, Shared};
use crate::ground::driver::real;
use crate::session::fork::per_process;
use gpuslice_policy::charge_size;
use gpuslice_policy::{Charged, ObjectKind};
use gpuslice_policy::{MemoryView, NvmlView};

/// `CU_DEVICE_CPU`: the host, where the pre-12.2 advice and prefetch API takes a device.
const CU_DEVICE_CPU: CUdevice = -1;
/// `CUmem_advise`.
const ADVISE_SET_PREFERRED_LOCATION: i32 = 3;
const ADVISE_SET_ACCESSED_BY: i32 = 5;
/// `CU_STREAM_NON_BLOCKING`: the populating prefetch waits for no work of the application.
const STREAM_NON_BLOCKING: u32 = 1;

/// Whether this process's configuration oversubscribes any device. Survives fork: the child
/// has the same configuration.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Per physical region entry: its companion entry + 1 (0 = none bound). Survives fork: the
/// entries are the region's, which the child maps too.
static HOST_ENTRY: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(0) }; MAX_DEVICES];
/// Per CUDA ordinal (the first 64): 0 unknown, 1 concurrent managed access, 2 none.
/// Survives fork: a device property.
static MANAGED_ACCESS: [AtomicU8; 64] = [const { AtomicU8::new(0) }; 64];
/// One-time lines already written (bit per line). Survives fork: the child need not repeat
/// them.
static SAID: AtomicU32 = AtomicU32::new(0);

per_process! {
    /// Serialises this process's placements on the host: the cgroup's reading, the
    /// population and the charge are one step, so two threads are never judged against the
    /// same room (the slice's processes are serialised by the region, see
    /// `place_on_host`). A turn, so that a fork child starts with it free.
    static PLACING: Turn = Turn::new();
}

const SAID_NO_MANAGED_ACCESS: u32 = 1;
const SAID_CGROUP: u32 = 2;
const SAID_PLACEMENT_FAILED: u32 = 4;
const SAID_NO_ENTRY: u32 = 8;

fn first_time(bit: u32) -> bool {
    SAID.fetch_or(bit, Ordering::Relaxed) & bit == 0
}

/// Whether any device of this process's slice oversubscribes: one relaxed load, what the
/// allocation handler asks before its ordinary path.
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Called by `memory::attach`: notes whether the configuration oversubscribes anything.
pub(super) fn configure(config: &SliceConfig) {
    if config.devices.iter().any(|d| d.host_excess().is_some()) {
        ENABLED.store(true, Ordering::Relaxed);
    }
}

/// Called by `memory::bind` once the device's own entry is bound: binds its companion entry
/// when the configuration oversubscribes the device. A region with no entry left means no
/// oversubscription on that device (one line says so).
pub(super) fn bind(shared: &Shared, key: &str, entry: u8, excess: Option<u64>) {
    let Some(excess) = excess else { return };
    let binding = shared.region.bind_devices(&[DeviceLimits {
        uuid: host_entry_key(key),
        memory_limit: Some(excess),
        compute_percent: None,
    }]);
    match binding {
        Ok(binding) => {
            for change in &binding.changes {
                crate::log_info!("host limit of {} changed: {change:?}", change.uuid);
            }
            let host = binding.ids[0].index() as u8;
            HOST_ENTRY[entry as usize % MAX_DEVICES].store(host + 1, Ordering::Release);
        }
        Err(e) => {
            if first_time(SAID_NO_ENTRY) {
                crate::log_error!(
                    "{e}; device {key} is not oversubscribed: past its memory limit allocations are refused"
                );
            }
        }
    }
}

/// The companion entry of physical entry `entry`, if bound.
fn host_entry(entry: u8) -> Option<u8> {
    match HOST_ENTRY[entry as usize % MAX_DEVICES].load(Ordering::Acquire) {
        0 => None,
        n => Some(n - 1),
    }
}

/// Whether region entry `entry` is a companion (host bytes) entry.
fn is_host_entry(entry: u8) -> bool {
    HOST_ENTRY
        .iter()
        .any(|h| h.load(Ordering::Acquire) == entry.wrapping_add(1))
}

/// `cuMemAlloc_v2` in an oversubscribing process: the ordinary path while the physical share
/// has room (and whenever the current device does not oversubscribe), else the host.
/// `deliver` writes the pointer placed on the host to the caller.
pub fn allocate(
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    created: impl FnOnce() -> DeviceObject,
    deliver: impl FnOnce(CUdeviceptr),
) -> CUresult {
    let ordinary =
        |call, created| super::allocate(super::AllocTarget::CurrentContext, bytes, call, created);
    let (Some(shared), Some(process)) = (super::shared(), super::process()) else {
        return ordinary(call, created);
    };
    let Some(ordinal) = super::current_device() else {
        return ordinary(call, created);
    };
    let Ok(Binding::Limited(entry)) = super::cuda_binding(shared, ordinal) else {
        return ordinary(call, created);
    };
    let Some(host) = host_entry(entry) else {
        return ordinary(call, created);
    };
    let charge = charge_size(bytes);
    // The physical share first, while it has room: judged on the views' refreshed figures
    // (pools, graph memory and dead processes settled), so a full share does not count a
    // refusal for an allocation that then goes to the host.
    let has_room = super::cuda_slice_settled(ordinal)
        .is_some_and(|(limit, used)| used.saturating_add(charge) <= limit);
    if bytes == 0 || has_room {
        let result = ordinary(call, created);
        if result != CUDA_ERROR_OUT_OF_MEMORY || bytes == 0 {
            return result;
        }
        // Lost a race for the share, or the card itself is full: the host may still serve.
    }
    match place_on_host(shared, process, ordinal, host, bytes, charge) {
        Ok(pointer) => {
            deliver(pointer);
            CUDA_SUCCESS
        }
        Err(code) => {
            shared.region.count_refusal(device_id(entry));
            code
        }
    }
}

/// Serves `bytes` (charged `charge`) from host memory for device `ordinal`: the companion
/// entry charged, the cgroup's room checked, managed memory allocated, advised, populated on
/// the host and tracked. Anything that fails leaves nothing behind.
fn place_on_host(
    shared: &Shared,
    process: &Process,
    ordinal: CUdevice,
    host: u8,
    bytes: u64,
    charge: u64,
) -> Result<CUdeviceptr, CUresult> {
    if !concurrent_managed_access(ordinal) {
        if first_time(SAID_NO_MANAGED_ACCESS) {
            crate::log_error!(
                "device {ordinal} has no concurrent managed access (a GPU older than Pascal, or not Linux): allocations past its memory limit cannot be placed in host memory and are refused"
            );
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // One placement at a time in the process, and in the slice (the companion entry's
    // measuring turn, which nothing else takes): the next one reads the cgroup with this
    // one's pages in it.
    let _one_at_a_time = PLACING.take();
    let _one_in_the_slice = super::context_start::lock_for_measuring(
        shared.region,
        host,
        super::context_start::MEASURING_WAIT,
        || true,
    );
    if process.ledger.charge(host, charge).is_err() {
        crate::log_debug!("refusing {bytes} bytes: the slice's virtual size is reached");
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if let Some(cgroup) = CgroupMemory::of_this_process() {
        let placeable = cgroup.placeable().unwrap_or(u64::MAX);
        if charge > placeable {
            process.ledger.refund(host, charge);
            if first_time(SAID_CGROUP) {
                let level = cgroup.tightest();
                crate::log_warn!(
                    "refusing {} in host memory: the memory cgroup {} can hold {} more, less {} kept free for the rest of the pod (raise the pod's memory limit, or lower the slice's virtual size)",
                    format_size(charge),
                    level.map_or(String::new(), |l| l.dir.display().to_string()),
                    format_size(cgroup.room().unwrap_or(0)),
                    format_size(HOST_MARGIN_BYTES)
                );
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    match managed_on_host(ordinal, bytes) {
        Ok(pointer) => {
            let charged = Charged {
                device: host,
                bytes: charge,
                pool: 0,
                context: super::current_context(),
            };
            process.ledger.track(ObjectKind::Pointer, pointer, charged);
            Ok(pointer)
        }
        Err(code) => {
            process.ledger.refund(host, charge);
            if code != CUDA_ERROR_OUT_OF_MEMORY && first_time(SAID_PLACEMENT_FAILED) {
                crate::log_error!(
                    "placing {} in host memory failed with CUresult {code}; refusing with CUDA_ERROR_OUT_OF_MEMORY",
                    format_size(bytes)
                );
            }
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Whether the device can keep managed memory on the host while it runs
/// (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`), asked once per ordinal.
fn concurrent_managed_access(ordinal: CUdevice) -> bool {
    let cell = usize::try_from(ordinal)
        .ok()
        .and_then(|i| MANAGED_ACCESS.get(i));
    if let Some(known) = cell.map(|c| c.load(Ordering::Relaxed)).filter(|&v| v != 0) {
        return known == 1;
    }
    let mut value = 0;
    let asked = real::cuDeviceGetAttribute().is_some_and(|get| {
        // SAFETY: valid out-pointer for the call.
        let result = unsafe { get(&mut value, attr::CONCURRENT_MANAGED_ACCESS, ordinal) };
        result == CUDA_SUCCESS
    });
    let yes = asked && value != 0;
    if let Some(cell) = cell {
        cell.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
    }
    yes
}

/// Managed memory of `bytes` that device `ordinal` reads in place from the host, populated
/// there before it returns; freed again if any step fails.
fn managed_on_host(ordinal: CUdevice, bytes: u64) -> Result<CUdeviceptr, CUresult> {
    let alloc = real::cuMemAllocManaged().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let mut pointer: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; by-value size and flags.
    let result = unsafe { alloc(&mut pointer, bytes as usize, CU_MEM_ATTACH_GLOBAL) };
    if result != CUDA_SUCCESS {
        return Err(result);
    }
    let keep_on_host = advise(pointer, bytes, ADVISE_SET_PREFERRED_LOCATION, None)
        .and_then(|()| advise(pointer, bytes, ADVISE_SET_ACCESSED_BY, Some(ordinal)))
        .and_then(|()| populate_on_host(pointer, bytes));
    if let Err(code) = keep_on_host {
        if let Some(free) = real::cuMemFree_v2() {
            // SAFETY: the pointer this function just allocated, freed once.
            unsafe { free(pointer) };
        }
        return Err(code);
    }
    Ok(pointer)
}

fn location(device: Option<CUdevice>) -> CUmemLocation {
    match device {
        Some(id) => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        },
        None => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    }
}

fn checked(result: CUresult) -> Result<(), CUresult> {
    if result == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(result)
    }
}

/// `cuMemAdvise` with `device` (`None`: the host), through the 12.2+ location ABI where the
/// driver has it.
fn advise(
    pointer: CUdeviceptr,
    bytes: u64,
    advice: i32,
    device: Option<CUdevice>,
) -> Result<(), CUresult> {
    if let Some(advise_v2) = real::cuMemAdvise_v2() {
        // SAFETY: by-value arguments; the range is the allocation just made.
        return checked(unsafe { advise_v2(pointer, bytes as usize, advice, location(device)) });
    }
    let advise_v1 = real::cuMemAdvise().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    // SAFETY: as above.
    checked(unsafe {
        advise_v1(
            pointer,
            bytes as usize,
            advice,
            device.unwrap_or(CU_DEVICE_CPU),
        )
    })
}

/// Prefetches the range to the host on a stream of its own (non-blocking: it waits for none
/// of the application's work) and waits for it: every page is then populated in host memory,
/// where the cgroup counts it.
fn populate_on_host(pointer: CUdeviceptr, bytes: u64) -> Result<(), CUresult> {
    let (Some(create), Some(destroy), Some(sync)) = (
        real::cuStreamCreate(),
        real::cuStreamDestroy_v2(),
        real::cuStreamSynchronize(),
    ) else {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    };
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    checked(unsafe { create(&mut stream, STREAM_NON_BLOCKING) })?;
    let prefetched = if let Some(prefetch_v2) = real::cuMemPrefetchAsync_v2() {
        // SAFETY: by-value arguments; the range is the allocation just made.
        unsafe { prefetch_v2(pointer, bytes as usize, location(None), 0, stream) }
    } else if let Some(prefetch_v1) = real::cuMemPrefetchAsync() {
        // SAFETY: as above.
        unsafe { prefetch_v1(pointer, bytes as usize, CU_DEVICE_CPU, stream) }
    } else {
        CUDA_ERROR_NOT_SUPPORTED
    };
    // SAFETY: the stream created above (synchronised, then destroyed once).
    let synced = unsafe { sync(stream) };
    // SAFETY: as above.
    unsafe { destroy(stream) };
    checked(prefetched).and_then(|()| checked(synced))
}

/// Whether `[pointer, pointer + bytes)` lies in memory this process placed on the host: an
/// application's advice or prefetch there is answered `CUDA_ERROR_INVALID_VALUE`, what the
/// driver answers for the device memory the application was given (the driver would
/// otherwise move the pages onto the card, past the physical share).
pub fn refuses_range(pointer: CUdeviceptr) -> bool {
    if !enabled() {
        return false;
    }
    let (Some(process), Some(range)) = (super::process(), real::cuMemGetAddressRange_v2()) else {
        return false;
    };
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers; the driver checks the address.
    if unsafe { range(&mut base, &mut size, pointer) } != CUDA_SUCCESS {
        return false;
    }
    process
        .ledger
        .objects
        .get(ObjectKind::Pointer, base)
        .is_some_and(|charged| is_host_entry(charged.device))
}

/// The answer for an advice or prefetch over a host-placed range.
pub const REFUSED_RANGE: CUresult = CUDA_ERROR_INVALID_VALUE;

/// The host part of a device's view: the companion entry's limit and use, and what the
/// cgroup can still take (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPart {
    pub limit: u64,
    pub used: u64,
    pub placeable: Option<u64>,
}

impl HostPart {
    /// What may still be placed: the budget's rest, bounded by the cgroup.
    pub fn free(&self) -> u64 {
        self.limit
            .saturating_sub(self.used)
            .min(self.placeable.unwrap_or(u64::MAX))
    }
}

/// `cuMemGetInfo`'s view of an oversubscribed device: the physical view widened by the host
/// part (see the module doc).
pub fn widen(view: MemoryView, host: HostPart) -> MemoryView {
    MemoryView {
        total: view.total.saturating_add(host.limit),
        free: view.free.saturating_add(host.free()),
    }
}

/// NVML's view of an oversubscribed device: total and free as [`widen`], used adds the host
/// bytes, and `reserved` takes up the rest so the parts still add up to the total.
pub fn widen_nvml(view: NvmlView, host: HostPart) -> NvmlView {
    let total = view.total.saturating_add(host.limit);
    let free = view.free.saturating_add(host.free()).min(total);
    let used = view.used.saturating_add(host.used).min(total - free);
    NvmlView {
        total,
        reserved: total - free - used,
        used,
        free,
    }
}

/// The host part of physical entry `entry`, if it oversubscribes.
fn host_part(shared: &Shared, entry: u8) -> Option<HostPart> {
    let host = host_entry(entry)?;
    let usage = shared.region.usage(device_id(host));
    Some(HostPart {
        limit: usage.limit.unwrap_or(0),
        used: usage.used,
        placeable: CgroupMemory::of_this_process().and_then(|c| c.placeable()),
    })
}

/// The CUDA views' figures of `device` (`cuMemGetInfo`): widened when it oversubscribes.
pub fn cuda_view(device: CUdevice, view: MemoryView) -> MemoryView {
    if !enabled() {
        return view;
    }
    let host = super::shared().and_then(|shared| match super::cuda_binding(shared, device) {
        Ok(Binding::Limited(entry)) => host_part(shared, entry),
        _ => None,
    });
    host.map_or(view, |host| widen(view, host))
}

/// NVML's figures of `device`: widened when it oversubscribes.
pub fn nvml_view(device: nvmlDevice_t, view: NvmlView) -> NvmlView {
    if !enabled() {
        return view;
    }
    let host = super::shared().and_then(|shared| match nvml_binding(shared, device) {
        Ok(Binding::Limited(entry)) => host_part(shared, entry),
        _ => None,
    });
    host.map_or(view, |host| widen_nvml(view, host))
}

/// What the configuration adds to `device`'s total past its physical share (`virtual -
/// memory`), for `cuDeviceTotalMem`; `None` when it does not oversubscribe.
pub fn configured_excess(device: CUdevice) -> Option<u64> {
    if !enabled() || device < 0 {
        return None;
    }
    let shared = super::shared()?;
    let uuid = crate::ground::devices::cuda_device_uuid(device);
    shared.config.limit_for(device as u32, &uuid)?.host_excess()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_views_add_the_host_part_and_keep_their_sums() {
        let physical = MemoryView {
            total: 8 * GIB,
            free: 2 * GIB,
        };
        let host = HostPart {
            limit: 16 * GIB,
            used: 4 * GIB,
            placeable: None,
        };
        assert_eq!(
            widen(physical, host),
            MemoryView {
                total: 24 * GIB,
                free: 14 * GIB
            }
        );
        // The cgroup bounds what is free on the host.
        let tight = HostPart {
            placeable: Some(GIB),
            ..host
        };
        assert_eq!(widen(physical, tight).free, 3 * GIB);
        let nvml = NvmlView {
            total: 8 * GIB,
            reserved: 0,
            used: 6 * GIB,
            free: 2 * GIB,
        };
        for host in [host, tight] {
            let view = widen_nvml(nvml, host);
            assert_eq!(view.total, 24 * GIB);
            assert_eq!(view.used, 10 * GIB, "physical and host bytes");
            assert_eq!(view.reserved + view.used + view.free, view.total);
        }
        // A host budget over its limit (a lowered limit) never wraps.
        let over = HostPart {
            limit: GIB,
            used: 3 * GIB,
            placeable: None,
        };
        assert_eq!(over.free(), 0);
        let view = widen_nvml(nvml, over);
        assert_eq!(view.reserved + view.used + view.free, view.total);
    }
}
