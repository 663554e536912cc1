//! Which limit applies to which device: by UUID first (stable under `CUDA_VISIBLE_DEVICES`
//! reordering), then by index, through `SliceConfig::limit_for`. The UUID comes from the real
//! `cuDeviceGetUuid_v2` (or `cuDeviceGetUuid`) for CUDA devices and `nvmlDeviceGetUUID` for
//! NVML handles; both spell it `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`. Also the one read
//! of a device's process list through the REAL NVML (the memory ledger's host-PID discovery
//! and process lists, the throttle's measurement), never through our filtering wrappers, and
//! the one initialisation of the real NVML and device-handle lookup those reads use.

use std::ffi::{c_char, c_uint, CStr, CString};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use gpuslice_abi::cuda::result::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS};
use gpuslice_abi::cuda::{CUdevice, CUresult, CUuuid};
use gpuslice_abi::nvml::ret::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_SUCCESS,
};
use gpuslice_abi::nvml::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t, nvmlReturn_t,
    NVML_DEVICE_UUID_V2_BUFFER_SIZE,
};
use gpuslice_common::config::SliceConfig;

use crate::ground::driver::real;

/// `GPU-` + the 16 UUID bytes in the 8-4-4-4-12 grouping, lower-case (nvidia-smi's spelling).
pub fn format_cuda_uuid(uuid: &CUuuid) -> String {
    let mut text = String::with_capacity(40);
    text.push_str("GPU-");
    // By hand: `format!` per byte cost about 800 instructions a byte, on every first context.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in uuid.bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        let byte = *byte as u8;
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    text
}

/// Pure: the memory limit of the device `(index, uuid)` under `config`.
pub fn memory_limit(config: &SliceConfig, index: u32, uuid: &str) -> Option<u64> {
    config.limit_for(index, uuid)?.memory_limit
}

/// How many CUDA devices the process sees: 0 unknown (the driver has not answered yet), 1 one,
/// 2 several. The driver fixes its device list at `cuInit`, so once known it is kept; it
/// survives fork (the child sees the same devices).
static DEVICE_COUNT_KIND: AtomicU8 = AtomicU8::new(0);

/// Whether the process is known to see exactly one CUDA device (then every context is on
/// ordinal 0).
#[inline(always)]
pub fn one_cuda_device() -> bool {
    DEVICE_COUNT_KIND.load(Ordering::Relaxed) == 1
}

/// The device of the calling thread's current context, for a caller that knows one is
/// current (a launch; a query the driver has just answered with success): ordinal 0 without
/// asking the driver when the process sees one device, else the real `cuCtxGetDevice`.
#[inline]
pub fn current_context_device() -> Option<CUdevice> {
    match DEVICE_COUNT_KIND.load(Ordering::Relaxed) {
        1 => Some(0),
        2 => current_cuda_device(),
        _ => count_devices_then_current(),
    }
}

/// First call of [`current_context_device`] (or one before the driver could count).
#[cold]
#[inline(never)]
fn count_devices_then_current() -> Option<CUdevice> {
    if learn_device_count() {
        Some(0)
    } else {
        current_cuda_device()
    }
}

/// Asks the real `cuDeviceGetCount` (once it answers, the answer is kept) whether the process
/// sees exactly one device. Called where the driver is known to be up (a context was just
/// made, or one is current).
#[cold]
pub fn learn_device_count() -> bool {
    match DEVICE_COUNT_KIND.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let mut count = 0i32;
    // SAFETY: `count` is a valid out-pointer for the duration of the call.
    let known =
        real::cuDeviceGetCount().is_some_and(|get| unsafe { get(&mut count) } == CUDA_SUCCESS);
    if known {
        DEVICE_COUNT_KIND.store(if count == 1 { 1 } else { 2 }, Ordering::Relaxed);
    }
    known && count == 1
}

/// Puts the device count in a test's state (0 unknown, 1 one device, 2 several).
#[cfg(test)]
pub fn set_device_count_kind(kind: u8) {
    DEVICE_COUNT_KIND.store(kind, Ordering::Relaxed);
}

/// The device of the calling thread's current context (real `cuCtxGetDevice`).
pub fn current_cuda_device() -> Option<CUdevice> {
    let get_device = real::cuCtxGetDevice()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer for the duration of the call.
    (unsafe { get_device(&mut device) } == CUDA_SUCCESS).then_some(device)
}

/// The UUID string of a CUDA device, empty when the driver cannot say (index matching only).
pub fn cuda_device_uuid(device: CUdevice) -> String {
    try_cuda_device_uuid(device).unwrap_or_default()
}

/// The UUID string of a CUDA device, or the driver's answer when it would not give one
/// (`CUDA_ERROR_NOT_FOUND` when it has no UUID function at all).
pub fn try_cuda_device_uuid(device: CUdevice) -> Result<String, CUresult> {
    let mut uuid = CUuuid::default();
    let get_uuid = real::cuDeviceGetUuid_v2()
        .or_else(real::cuDeviceGetUuid)
        .ok_or(CUDA_ERROR_NOT_FOUND)?;
    // SAFETY: `uuid` is a valid out-pointer for the duration of the call.
    match unsafe { get_uuid(&mut uuid, device) } {
        CUDA_SUCCESS => Ok(format_cuda_uuid(&uuid)),
        code => Err(code),
    }
}

/// The memory limit of a CUDA device under `config`.
pub fn cuda_memory_limit(config: &SliceConfig, device: CUdevice) -> Option<u64> {
    if config.devices.is_empty() || device < 0 {
        return None;
    }
    memory_limit(config, device as u32, &cuda_device_uuid(device))
}

/// (index, UUID) of an NVML device, through the real `nvmlDeviceGetIndex` and
/// `nvmlDeviceGetUUID`; `u32::MAX` / empty when NVML cannot say.
pub(crate) fn nvml_identity(device: nvmlDevice_t) -> (u32, String) {
    let mut buffer = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    let uuid = match real::nvmlDeviceGetUUID() {
        Some(get_uuid)
            // SAFETY: the buffer is writable for its full length, which is what we pass;
            // NVML rejects a handle it did not give out.
            if unsafe { get_uuid(device, buffer.as_mut_ptr(), buffer.len() as c_uint) }
                == NVML_SUCCESS =>
        {
            buffer[buffer.len() - 1] = 0;
            // SAFETY: NUL-terminated by the driver and, defensively, by the line above.
            unsafe { CStr::from_ptr(buffer.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        }
        _ => String::new(),
    };
    let mut index: c_uint = u32::MAX;
    if let Some(get_index) = real::nvmlDeviceGetIndex() {
        // SAFETY: `index` is a valid out-pointer for the duration of the call.
        unsafe { get_index(device, &mut index) };
    }
    (index, uuid)
}

/// Initialises the real NVML once for the shim's own reads (the memory ledger's host-PID
/// discovery and reaping, the throttle's measurement); false when it is missing or refuses.
/// Never shut down: NVML counts inits, so the application's own init/shutdown pairs stay
/// balanced on top of ours.
pub(crate) fn real_nvml_ready() -> bool {
    const UNKNOWN: u8 = 0;
    const READY: u8 = 1;
    const FAILED: u8 = 2;
    static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
    match STATE.load(Ordering::Acquire) {
        READY => return true,
        FAILED => return false,
        _ => {}
    }
    // SAFETY: nvmlInit_v2 takes no arguments and may be called from any thread.
    let ready = real::nvmlInit_v2().is_some_and(|init| unsafe { init() } == NVML_SUCCESS);
    STATE.store(if ready { READY } else { FAILED }, Ordering::Release);
    ready
}

/// The real NVML's handle of the device with `uuid`, else (when given) of `index`.
pub(crate) fn real_nvml_handle(uuid: &str, index: Option<u32>) -> Option<nvmlDevice_t> {
    if !real_nvml_ready() {
        return None;
    }
    let mut handle: nvmlDevice_t = std::ptr::null_mut();
    if let (false, Some(by_uuid), Ok(c_uuid)) = (
        uuid.is_empty(),
        real::nvmlDeviceGetHandleByUUID(),
        CString::new(uuid),
    ) {
        // SAFETY: NUL-terminated UUID and a valid out-pointer.
        if unsafe { by_uuid(c_uuid.as_ptr(), &mut handle) } == NVML_SUCCESS {
            return Some(handle);
        }
    }
    let by_index = real::nvmlDeviceGetHandleByIndex_v2()?;
    // SAFETY: a valid out-pointer; NVML rejects an index it does not have.
    (unsafe { by_index(index?, &mut handle) } == NVML_SUCCESS).then_some(handle)
}

/// Whether the real NVML has a compute process list to read (its library found, NVML not
/// initialised for it).
pub(crate) fn nvml_lists_processes() -> bool {
    real::nvmlDeviceGetComputeRunningProcesses_v3()
        .or_else(real::nvmlDeviceGetComputeRunningProcesses_v2)
        .is_some()
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` (v2 on older drivers) of the real NVML.
pub(crate) fn nvml_compute_processes(
    device: nvmlDevice_t,
) -> Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t> {
    nvml_compute_processes_expecting(device, 0)
}

/// [`nvml_compute_processes`] with room for `entries` at the first call (the processes the
/// caller knows of), so a long list costs the driver one call, not two.
pub(crate) fn nvml_compute_processes_expecting(
    device: nvmlDevice_t,
    entries: u32,
) -> Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t> {
    let get = real::nvmlDeviceGetComputeRunningProcesses_v3()
        .or_else(real::nvmlDeviceGetComputeRunningProcesses_v2)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    read_process_list(get, device, entries)
}

/// `nvmlDeviceGetProcessUtilization` (`get`: the real one) since `last_seen_us`, growing the
/// buffer as the INSUFFICIENT_SIZE protocol asks. `Err(NVML_ERROR_NOT_FOUND)` is NVML's "no
/// sample newer than `last_seen_us`".
pub(crate) fn read_utilization_samples(
    get: unsafe extern "C" fn(
        nvmlDevice_t,
        *mut nvmlProcessUtilizationSample_t,
        *mut c_uint,
        u64,
    ) -> nvmlReturn_t,
    device: nvmlDevice_t,
    last_seen_us: u64,
) -> Result<Vec<nvmlProcessUtilizationSample_t>, nvmlReturn_t> {
    // SAFETY: `grow_list` passes a buffer of `*count` writable samples; NVML rejects a
    // handle it did not give out.
    grow_list(32, |buffer, count| unsafe {
        get(device, buffer, count, last_seen_us)
    })
}

/// One of NVML's process lists (`get`: any `nvmlDeviceGet*RunningProcesses*` of the real
/// library, whose entries are `T`), with room for at least `expecting` entries at the first
/// call (0: the usual start).
pub(crate) fn read_process_list<T: Copy + Default>(
    get: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    device: nvmlDevice_t,
    expecting: u32,
) -> Result<Vec<T>, nvmlReturn_t> {
    // SAFETY: `grow_list` passes a buffer of `*count` entries of the layout `get` writes;
    // NVML rejects a handle it did not give out.
    grow_list(
        expecting.saturating_add(16).max(64),
        |buffer, count| unsafe { get(device, count, buffer) },
    )
}

/// The most entries one of NVML's lists needed in this process: the next list starts with room
/// for as many, so a long list costs the driver one call, not two. Survives fork (a hint).
static LONGEST_LIST: AtomicU32 = AtomicU32::new(0);

/// NVML's list protocol: `call(buffer, count)` fills up to `*count` entries and answers
/// SUCCESS, or INSUFFICIENT_SIZE with the count it needs; the buffer grows and the call is
/// retried a few times (the list can grow between two calls).
fn grow_list<T: Copy + Default>(
    initial: c_uint,
    mut call: impl FnMut(*mut T, *mut c_uint) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut capacity = initial.max(LONGEST_LIST.load(Ordering::Relaxed).saturating_add(16));
    for _ in 0..4 {
        let mut buffer = vec![T::default(); capacity as usize];
        let mut count = capacity;
        match call(buffer.as_mut_ptr(), &mut count) {
            NVML_SUCCESS => {
                buffer.truncate(count as usize);
                LONGEST_LIST.fetch_max(count, Ordering::Relaxed);
                return Ok(buffer);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => capacity = count.max(capacity) + 16,
            other => return Err(other),
        }
    }
    Err(NVML_ERROR_INSUFFICIENT_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::{ComputePolicy, ConfigSource, DeviceLimit, DeviceSelector};

    fn config(devices: Vec<DeviceLimit>) -> SliceConfig {
        SliceConfig {
            source: ConfigSource::Env,
            devices,
            region_path: None,
            policy: ComputePolicy::Cap,
            priority: Default::default(),
            log_level: None,
            context_bound: None,
        }
    }

    fn limit(selector: DeviceSelector, bytes: u64) -> DeviceLimit {
        DeviceLimit {
            selector,
            memory_limit: Some(bytes),
            compute_percent: None,
            virtual_memory: None,
        }
    }

    #[test]
    fn uuid_is_spelled_like_nvidia_smi() {
        let mut uuid = CUuuid::default();
        for (i, b) in uuid.bytes.iter_mut().enumerate() {
            *b = (0xa0 + i as u8) as c_char;
        }
        assert_eq!(
            format_cuda_uuid(&uuid),
            "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"
        );
        uuid.bytes[0] = 0;
        uuid.bytes[5] = 0x0f;
        uuid.bytes[15] = 0xf0u8 as c_char;
        assert_eq!(
            format_cuda_uuid(&uuid),
            "GPU-00a1a2a3-a40f-a6a7-a8a9-aaabacadaef0"
        );
    }

    #[test]
    fn uuid_wins_over_index_and_index_is_the_fallback() {
        let uuid = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf";
        let cfg = config(vec![
            limit(DeviceSelector::Index(0), 2 << 30),
            limit(DeviceSelector::Uuid(uuid.to_uppercase()), 1 << 30),
        ]);
        assert_eq!(memory_limit(&cfg, 0, uuid), Some(1 << 30));
        assert_eq!(memory_limit(&cfg, 0, "GPU-other"), Some(2 << 30));
        assert_eq!(memory_limit(&cfg, 1, "GPU-other"), None);
        assert_eq!(
            memory_limit(&cfg, 5, uuid),
            Some(1 << 30),
            "UUID follows the card"
        );
    }

    #[test]
    fn a_device_entry_without_memory_is_unlimited() {
        let cfg = config(vec![DeviceLimit {
            selector: DeviceSelector::Index(0),
            memory_limit: None,
            compute_percent: Some(50),
            virtual_memory: None,
        }]);
        assert_eq!(memory_limit(&cfg, 0, ""), None);
    }
}
