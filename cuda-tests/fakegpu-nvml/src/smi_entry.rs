//! The public entry points nvidia-smi (535, 550) looks up beyond the ones the NVML clients
//! use: event sets, field values, the board facts of `nvidia-smi -q`.
//!
//! A missing symbol makes nvidia-smi print "Function Not Found" (or, for
//! `nvmlEventSetCreate`, stop with "Internal NVML error"), so each is here with nvml.h's
//! semantics. What the fake models is answered from the state; what it does not model
//! (clocks, ECC, PCIe link, inforom, serials, media engines, thresholds) answers
//! `NVML_ERROR_NOT_SUPPORTED` after the usual init and handle checks, which nvidia-smi prints
//! as "N/A": the answer a real driver gives for a feature a board lacks, never a made-up
//! number. The modelled ones are implementations named by rows of `nvml_api!` in `lib.rs`;
//! the `not_modelled!` list below declares and exports the rest.

use crate::core::{self, guard, out};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// nvmlBrandType_t NVML_BRAND_TESLA (datacenter boards, all presets).
const NVML_BRAND_TESLA: c_uint = 2;
/// nvmlGpuVirtualizationMode_t NVML_GPU_VIRTUALIZATION_MODE_NONE: bare metal.
const NVML_GPU_VIRTUALIZATION_MODE_NONE: c_uint = 0;
/// Field ids of nvml.h the fake can answer (power in milliwatts).
const NVML_FI_DEV_POWER_INSTANT: c_uint = 186;
const NVML_FI_DEV_POWER_DEFAULT_LIMIT: c_uint = 189;
const NVML_FI_DEV_POWER_CURRENT_LIMIT: c_uint = 190;
const NVML_FI_DEV_POWER_REQUESTED_LIMIT: c_uint = 192;
/// nvmlValueType_t NVML_VALUE_TYPE_UNSIGNED_INT.
const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// nvmlFieldValue_t (nvml.h): 40 bytes.
#[repr(C)]
pub struct FieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: i64,
    pub latency_usec: i64,
    pub value_type: c_uint,
    pub nvml_return: nvmlReturn_t,
    pub value: u64,
}

/// Entry points for features the fake does not model: after NVML's init and handle checks
/// (UNINITIALIZED, INVALID_ARGUMENT), NOT_SUPPORTED.
macro_rules! not_modelled {
    ($( $(#[$doc:meta])* fn $name:ident(device $(, $arg:ident: $ty:ty)*); )*) => {
        $(
            $(#[$doc])*
            /// Not modelled by the fake: NOT_SUPPORTED for a valid device.
            #[no_mangle]
            pub extern "C" fn $name(device: nvmlDevice_t $(, $arg: $ty)*) -> nvmlReturn_t {
                $( let _ = $arg; )*
                guard(|| {
                    core::device(device)?;
                    Err(NVML_ERROR_NOT_SUPPORTED)
                })
            }
        )*
    };
}

not_modelled! {
    fn nvmlDeviceGetDisplayMode(device, mode: *mut c_uint);
    /// Windows only (WDDM/TCC): NOT_SUPPORTED on Linux, as the real library.
    fn nvmlDeviceGetDriverModel(device, current: *mut c_uint, pending: *mut c_uint);
    fn nvmlDeviceGetSerial(device, serial: *mut c_char, length: c_uint);
    fn nvmlDeviceGetVbiosVersion(device, version: *mut c_char, length: c_uint);
    fn nvmlDeviceGetBoardId(device, id: *mut c_uint);
    fn nvmlDeviceGetBoardPartNumber(device, part: *mut c_char, length: c_uint);
    fn nvmlDeviceGetModuleId(device, id: *mut c_uint);
    fn nvmlDeviceGetInforomImageVersion(device, version: *mut c_char, length: c_uint);
    fn nvmlDeviceGetInforomVersion(device, object: c_uint, version: *mut c_char, length: c_uint);
    fn nvmlDeviceValidateInforom(device);
    fn nvmlDeviceGetLastBBXFlushTime(device, timestamp: *mut c_ulonglong, duration_us: *mut c_ulonglong);
    /// GeForce Titan boards only.
    fn nvmlDeviceGetGpuOperationMode(device, current: *mut c_uint, pending: *mut c_uint);
    fn nvmlDeviceGetGspFirmwareVersion(device, version: *mut c_char);
    fn nvmlDeviceGetGspFirmwareMode(device, enabled: *mut c_uint, default: *mut c_uint);
    fn nvmlDeviceGetHostVgpuMode(device, mode: *mut c_uint);
    fn nvmlDeviceGetGridLicensableFeatures_v4(device, features: *mut c_void);
    fn nvmlDeviceGetAccountingBufferSize(device, size: *mut c_uint);
    fn nvmlDeviceGetCurrPcieLinkGeneration(device, generation: *mut c_uint);
    fn nvmlDeviceGetMaxPcieLinkGeneration(device, generation: *mut c_uint);
    fn nvmlDeviceGetGpuMaxPcieLinkGeneration(device, generation: *mut c_uint);
    fn nvmlDeviceGetCurrPcieLinkWidth(device, width: *mut c_uint);
    fn nvmlDeviceGetMaxPcieLinkWidth(device, width: *mut c_uint);
    fn nvmlDeviceGetPcieSpeed(device, speed: *mut c_uint);
    fn nvmlDeviceGetBridgeChipInfo(device, info: *mut c_void);
    fn nvmlDeviceGetPcieReplayCounter(device, value: *mut c_uint);
    fn nvmlDeviceGetPcieThroughput(device, counter: c_uint, value: *mut c_uint);
    fn nvmlDeviceGetSupportedClocksThrottleReasons(device, reasons: *mut c_ulonglong);
    fn nvmlDeviceGetCurrentClocksThrottleReasons(device, reasons: *mut c_ulonglong);
    fn nvmlDeviceGetBAR1MemoryInfo(device, bar1: *mut c_void);
    /// Confidential computing (Hopper with CC on) only.
    fn nvmlDeviceGetConfComputeProtectedMemoryUsage(device, memory: *mut c_void);
    fn nvmlDeviceGetEncoderUtilization(device, util: *mut c_uint, period_us: *mut c_uint);
    fn nvmlDeviceGetDecoderUtilization(device, util: *mut c_uint, period_us: *mut c_uint);
    fn nvmlDeviceGetJpgUtilization(device, util: *mut c_uint, period_us: *mut c_uint);
    fn nvmlDeviceGetOfaUtilization(device, util: *mut c_uint, period_us: *mut c_uint);
    fn nvmlDeviceGetEccMode(device, current: *mut c_uint, pending: *mut c_uint);
    fn nvmlDeviceGetMemoryErrorCounter(device, error_type: c_uint, counter_type: c_uint, location: c_uint, count: *mut c_ulonglong);
    fn nvmlDeviceGetTotalEccErrors(device, error_type: c_uint, counter_type: c_uint, count: *mut c_ulonglong);
    fn nvmlDeviceGetRetiredPages(device, cause: c_uint, count: *mut c_uint, addresses: *mut c_ulonglong);
    fn nvmlDeviceGetRetiredPagesPendingStatus(device, pending: *mut c_uint);
    /// Ampere and later only.
    fn nvmlDeviceGetRemappedRows(device, corr: *mut c_uint, unc: *mut c_uint, pending: *mut c_uint, failure: *mut c_uint);
    fn nvmlDeviceGetTemperatureThreshold(device, threshold: c_uint, temp: *mut c_uint);
    fn nvmlDeviceGetPowerManagementLimitConstraints(device, min: *mut c_uint, max: *mut c_uint);
    fn nvmlDeviceGetClockInfo(device, clock: c_uint, mhz: *mut c_uint);
    fn nvmlDeviceGetMaxClockInfo(device, clock: c_uint, mhz: *mut c_uint);
    fn nvmlDeviceGetApplicationsClock(device, clock: c_uint, mhz: *mut c_uint);
    fn nvmlDeviceGetDefaultApplicationsClock(device, clock: c_uint, mhz: *mut c_uint);
    fn nvmlDeviceGetClock(device, clock: c_uint, id: c_uint, mhz: *mut c_uint);
    fn nvmlDeviceGetAutoBoostedClocksEnabled(device, enabled: *mut c_uint, default: *mut c_uint);
    /// NVSwitch fabrics (Hopper HGX) only.
    fn nvmlDeviceGetGpuFabricInfo(device, info: *mut c_void);
    fn nvmlDeviceGetGpuFabricInfoV(device, info: *mut c_void);
    /// Grace-Hopper chip-to-chip links only.
    fn nvmlDeviceGetC2cModeInfoV(device, info: *mut c_void);
    fn nvmlDeviceGetVgpuHeterogeneousMode(device, mode: *mut c_void);
    /// Utilisation sample buffers: the fake keeps a busy timeline, not the driver's sample
    /// ring.
    fn nvmlDeviceGetSamples(device, sample_type: c_uint, last_seen: c_ulonglong, value_type: *mut c_uint, count: *mut c_uint, samples: *mut c_void);
}

/// Brand: every preset is a datacenter board (Tesla brand in nvml.h's terms).
///
/// # Safety
/// `brand` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(brand) }? = NVML_BRAND_TESLA;
        Ok(())
    })
}

/// nvmlDeviceArchitecture_t from the compute capability (nvml.h: Kepler 2 ... Hopper 9,
/// Blackwell 10).
///
/// # Safety
/// `arch` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        let value = match (dev.spec.cc_major, dev.spec.cc_minor) {
            (7, 0) | (7, 2) => 5, // Volta
            (7, _) => 6,          // Turing
            (8, 9) => 8,          // Ada
            (8, _) => 7,          // Ampere
            (9, _) => 9,          // Hopper
            (m, _) if m >= 10 => 10,
            _ => return Err(NVML_ERROR_NOT_SUPPORTED),
        };
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(arch) }? = value;
        Ok(())
    })
}

/// No display is attached to a simulated board.
///
/// # Safety
/// `active` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetDisplayActive(
    device: nvmlDevice_t,
    active: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(active) }? = NVML_FEATURE_DISABLED;
        Ok(())
    })
}

/// The fake keeps no per-process accounting: the mode is disabled.
///
/// # Safety
/// `mode` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetAccountingMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(mode) }? = NVML_FEATURE_DISABLED;
        Ok(())
    })
}

/// A simulated board is bare metal: no vGPU, no passthrough.
///
/// # Safety
/// `mode` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetVirtualizationMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(mode) }? = NVML_GPU_VIRTUALIZATION_MODE_NONE;
        Ok(())
    })
}

/// MIG-capable parts (A100, H100/H200) have at most 7 GPU instances; others NOT_SUPPORTED.
///
/// # Safety
/// `count` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        if !fakegpu::nvml_view::supports_mig(&dev.spec) {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(count) }? = 7;
        Ok(())
    })
}

/// Every handle the fake gives out is a whole GPU (MIG is never enabled).
///
/// # Safety
/// `is_mig` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(is_mig) }? = 0;
        Ok(())
    })
}

/// The default power limit: the fake never changes the limit, so it is the enforced one.
///
/// # Safety
/// `limit` must be null or a valid pointer.
pub(crate) unsafe fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(limit) }? = dev.profile.power_limit_mw;
        Ok(())
    })
}

/// No encoder sessions ever run on the fake: 0 sessions, 0 fps, 0 latency.
///
/// # Safety
/// Pointers must be null or valid.
pub(crate) unsafe fn nvmlDeviceGetEncoderStats(
    device: nvmlDevice_t,
    sessions: *mut c_uint,
    fps: *mut c_uint,
    latency_us: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or valid pointers.
        let (s, f, l) = unsafe { (out(sessions)?, out(fps)?, out(latency_us)?) };
        (*s, *f, *l) = (0, 0, 0);
        Ok(())
    })
}

/// nvmlFBCStats_t: sessionsCount, averageFPS, averageLatency; no frame-buffer capture on
/// the fake.
#[repr(C)]
pub struct FbcStats {
    sessions: c_uint,
    fps: c_uint,
    latency_us: c_uint,
}

/// # Safety
/// `stats` must be null or a valid `nvmlFBCStats_t*`.
pub(crate) unsafe fn nvmlDeviceGetFBCStats(
    device: nvmlDevice_t,
    stats: *mut FbcStats,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        *unsafe { out(stats) }? = FbcStats {
            sessions: 0,
            fps: 0,
            latency_us: 0,
        };
        Ok(())
    })
}

/// Per-field answers (nvml.h: the call succeeds and each entry carries its own
/// `nvmlReturn`). Power readings and limits come from the board profile; every other field
/// is NOT_SUPPORTED.
///
/// # Safety
/// `values` must be null or valid for `count` entries.
pub(crate) unsafe fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut FieldValue,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        if values.is_null() || count < 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller vouches for `count` entries at `values`.
        let values = unsafe { std::slice::from_raw_parts_mut(values, count as usize) };
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        for v in values {
            let answer = match v.field_id {
                NVML_FI_DEV_POWER_INSTANT => Some(fakegpu::nvml_view::power_usage_mw(
                    &dev.profile,
                    dev.utilization(),
                )),
                NVML_FI_DEV_POWER_DEFAULT_LIMIT
                | NVML_FI_DEV_POWER_CURRENT_LIMIT
                | NVML_FI_DEV_POWER_REQUESTED_LIMIT => Some(dev.profile.power_limit_mw),
                _ => None,
            };
            v.timestamp = now_us;
            v.latency_usec = 0;
            match answer {
                Some(mw) => {
                    v.value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
                    v.nvml_return = NVML_SUCCESS;
                    v.value = u64::from(mw);
                }
                None => {
                    v.nvml_return = NVML_ERROR_NOT_SUPPORTED;
                    v.value = 0;
                }
            }
        }
        Ok(())
    })
}

/// No MPS server runs on the fake: always an empty list (the list protocol of the other
/// process lists).
///
/// # Safety
/// `count` must be null or valid; `infos` null or `*count` writable entries.
pub(crate) unsafe fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        core::device(device)?;
        // SAFETY: the caller passes null or valid pointers sized by `*count`.
        unsafe { core::fill_list(count, infos, &[], core::process_info) }
    })
}

/// The name of the process NVML reports as `pid` (process lists carry PIDs with
/// `FAKEGPU_PID_OFFSET` added; the name is that of the card-namespace PID underneath).
/// NOT_FOUND for a PID with no process behind it.
///
/// # Safety
/// `name` must be null or valid for `length` bytes.
pub(crate) unsafe fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        core::initialized()?;
        let card_pid = pid.wrapping_sub(fakegpu::nvml_view::pid_offset());
        let text = core::process_name(card_pid);
        if text.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        if length == 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // nvml.h: `length` is "the maximum allowed length of the string returned".
        let text: String = text.chars().take(length as usize - 1).collect();
        // SAFETY: the caller guarantees `length` writable bytes at `name`.
        unsafe { core::write_str(name, length, &text) }
    })
}

/// nvmlPciInfoExt_v1_t (nvml.h, 550+): 64 bytes, `version` set by the caller.
#[repr(C)]
pub struct PciInfoExt {
    pub version: c_uint,
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_subsystem_id: c_uint,
    pub base_class: c_uint,
    pub sub_class: c_uint,
    pub bus_id: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}

/// NVML_STRUCT_VERSION(PciInfoExt, 1).
pub const NVML_PCI_INFO_EXT_V1: c_uint = std::mem::size_of::<PciInfoExt>() as c_uint | (1 << 24);

/// The same address and ids as nvmlDeviceGetPciInfo_v3, plus the class code: NVIDIA's
/// compute boards enumerate as a 3D controller (class 0x03, subclass 0x02).
///
/// # Safety
/// `info` must be null or a valid pointer whose `version` is set.
pub(crate) unsafe fn nvmlDeviceGetPciInfoExt(
    device: nvmlDevice_t,
    info: *mut PciInfoExt,
) -> nvmlReturn_t {
    guard(|| {
        let dev = core::device(device)?;
        // SAFETY: the caller passes null or a valid pointer.
        let info = unsafe { out(info) }?;
        if info.version != NVML_PCI_INFO_EXT_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let pci = core::pci_info(&dev);
        *info = PciInfoExt {
            version: NVML_PCI_INFO_EXT_V1,
            domain: pci.domain,
            bus: pci.bus,
            device: pci.device,
            pci_device_id: pci.pciDeviceId,
            pci_subsystem_id: pci.pciSubSystemId,
            base_class: 0x03,
            sub_class: 0x02,
            bus_id: pci.busId,
        };
        Ok(())
    })
}
