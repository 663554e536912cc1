//! The device bindings: which devices the slice limits and under which region entry, resolved
//! by UUID the first time a hook names a device (`Region::bind_devices`), then cached per
//! CUDA ordinal and per NVML handle. A device without a memory limit is pass-through and never
//! charged.
//!
//! Owns the bindings cache ([`DeviceBindings`], in [`Shared`]) and `OVERSIZE_WARNED` (a
//! once-per-device warning; survives fork: a child need not warn again).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use gpuslice_abi::cuda::result::{
    CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::{CUdevice, CUresult};
use gpuslice_abi::nvml::nvmlDevice_t;
use gpuslice_common::region::DeviceLimits;

use super::{oversubscribe, Shared};

/// How a device is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Unlimited,
    Limited(u8),
}

const BINDING_UNKNOWN: u32 = 0;
const BINDING_UNLIMITED: u32 = 1;
const BINDING_BASE: u32 = 2;
/// CUDA device ordinals cached (higher ordinals are resolved on every call).
const CACHED_ORDINALS: usize = 64;
const CACHED_NVML_HANDLES: usize = 64;

fn encode(binding: Binding) -> u32 {
    match binding {
        Binding::Unlimited => BINDING_UNLIMITED,
        Binding::Limited(d) => BINDING_BASE + u32::from(d),
    }
}

fn decode(word: u32) -> Option<Binding> {
    match word {
        BINDING_UNKNOWN => None,
        BINDING_UNLIMITED => Some(Binding::Unlimited),
        d => Some(Binding::Limited((d - BINDING_BASE) as u8)),
    }
}

/// The bindings cache of the process-wide state: one word per CUDA ordinal, and NVML handle
/// addresses with their words.
pub struct DeviceBindings {
    cuda: [AtomicU32; CACHED_ORDINALS],
    nvml_handles: [AtomicUsize; CACHED_NVML_HANDLES],
    nvml: [AtomicU32; CACHED_NVML_HANDLES],
}

impl DeviceBindings {
    pub(super) fn new() -> Self {
        DeviceBindings {
            cuda: std::array::from_fn(|_| AtomicU32::new(BINDING_UNKNOWN)),
            nvml_handles: std::array::from_fn(|_| AtomicUsize::new(0)),
            nvml: std::array::from_fn(|_| AtomicU32::new(BINDING_UNKNOWN)),
        }
    }
}

/// The memory limit and region entry of a CUDA device (resolved once, then cached). `Err` is
/// the code the caller answers instead of calling the driver: `CUDA_ERROR_OUT_OF_MEMORY` when
/// the slice cannot be bound, or the driver's own refusal to name the device.
#[inline]
pub fn cuda_binding(shared: &Shared, ordinal: CUdevice) -> Result<Binding, CUresult> {
    let cell = usize::try_from(ordinal)
        .ok()
        .and_then(|i| shared.bindings.cuda.get(i));
    if let Some(binding) = cell.and_then(|c| decode(c.load(Ordering::Acquire))) {
        return Ok(binding);
    }
    bind_cuda(shared, ordinal)
}

/// First sight of a CUDA device ordinal (or one past the cache): resolve and cache it.
#[cold]
#[inline(never)]
fn bind_cuda(shared: &Shared, ordinal: CUdevice) -> Result<Binding, CUresult> {
    let cell = usize::try_from(ordinal)
        .ok()
        .and_then(|i| shared.bindings.cuda.get(i));
    let uuid = match crate::ground::devices::try_cuda_device_uuid(ordinal) {
        Ok(uuid) => uuid,
        // Before cuInit (or for a device that does not exist) the driver refuses every call
        // naming the device: so do we, binding and caching nothing. Matching the device by
        // index here instead would cache "unlimited" for a UUID-keyed slice, or give an
        // index-keyed one a second budget for the same card.
        Err(
            code @ (CUDA_ERROR_NOT_INITIALIZED
            | CUDA_ERROR_DEINITIALIZED
            | CUDA_ERROR_INVALID_DEVICE),
        ) => return Err(code),
        // A driver without device UUIDs: match by index only.
        Err(_) => String::new(),
    };
    let binding = bind(shared, ordinal.max(0) as u32, &uuid, || {
        card_total_for_warning(ordinal)
    })
    .map_err(|()| CUDA_ERROR_OUT_OF_MEMORY)?;
    if let Some(cell) = cell {
        cell.store(encode(binding), Ordering::Release);
    }
    Ok(binding)
}

fn card_total_for_warning(ordinal: CUdevice) -> Option<u64> {
    let total_mem = crate::ground::driver::real::cuDeviceTotalMem_v2()?;
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer for the call.
    (unsafe { total_mem(&mut bytes, ordinal) } == CUDA_SUCCESS).then_some(bytes as u64)
}

/// Device entries whose oversize limit was already reported by this process (bit = entry).
/// Survives fork: a child need not repeat the warning.
static OVERSIZE_WARNED: AtomicU32 = AtomicU32::new(0);

/// Binds `(index, uuid)` in the region when the configuration limits its memory.
fn bind(
    shared: &Shared,
    index: u32,
    uuid: &str,
    card_total: impl FnOnce() -> Option<u64>,
) -> Result<Binding, ()> {
    let Some(limit) = shared.config.limit_for(index, uuid) else {
        return Ok(Binding::Unlimited);
    };
    let Some(memory_limit) = limit.memory_limit else {
        return Ok(Binding::Unlimited);
    };
    let key = if uuid.is_empty() {
        format!("index-{index}")
    } else {
        uuid.to_string()
    };
    let binding = shared.region.bind_devices(&[DeviceLimits {
        uuid: key.clone(),
        memory_limit: Some(memory_limit),
        compute_percent: limit.compute_percent,
    }]);
    match binding {
        Ok(binding) => {
            for change in &binding.changes {
                crate::log_info!("limits of {} changed: {change:?}", change.uuid);
            }
            let entry = binding.ids[0].index();
            oversubscribe::bind(shared, &key, entry as u8, limit.host_excess());
            if let Some(total) = card_total() {
                // Once per device entry and process (bindings are cached, but two threads
                // may bind the same device at once, and CUDA and NVML bind separately).
                let bit = 1u32 << (entry % 32);
                if memory_limit > total
                    && OVERSIZE_WARNED.fetch_or(bit, Ordering::AcqRel) & bit == 0
                {
                    crate::log_warn!(
                        "memory limit {} of device {key} is larger than the card ({}); the slice is the whole card",
                        gpuslice_common::size::format_size(memory_limit),
                        gpuslice_common::size::format_size(total)
                    );
                }
            }
            Ok(Binding::Limited(entry as u8))
        }
        Err(e) => {
            crate::log_error!("{e}; allocations on device {key} are refused");
            Err(())
        }
    }
}

/// The limit and region entry of an NVML device handle (cached by handle address: NVML's
/// handles are stable for the life of the library).
pub(super) fn nvml_binding(shared: &Shared, device: nvmlDevice_t) -> Result<Binding, ()> {
    let key = device as usize;
    for (i, handle) in shared.bindings.nvml_handles.iter().enumerate() {
        match handle.load(Ordering::Acquire) {
            0 => break,
            k if k == key => {
                if let Some(b) = decode(shared.bindings.nvml[i].load(Ordering::Acquire)) {
                    return Ok(b);
                }
            }
            _ => {}
        }
    }
    let (index, uuid) = crate::ground::devices::nvml_identity(device);
    let binding = bind(shared, index, &uuid, || None)?;
    for (i, handle) in shared.bindings.nvml_handles.iter().enumerate() {
        let claimed = handle.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire);
        if claimed.is_ok() || claimed == Err(key) {
            shared.bindings.nvml[i].store(encode(binding), Ordering::Release);
            break;
        }
    }
    Ok(binding)
}
