//! What NVML and `fakegpu smi` derive from the shared state: the driver reservation, the
//! PID offset, the utilisation window, driver version strings, PCI identities and the
//! board-level numbers (power, temperature, cores) that the state does not model itself.
//!
//! Both the fake `libnvidia-ml.so.1` and the `fakegpu smi` tool compute their numbers here, so
//! the container view (NVML) and the host admin's view (smi) cannot drift apart, and tests can
//! compute the same expectations without going through the C ABI.

use crate::{DeviceSpec, SharedState};
use std::sync::OnceLock;

/// Device memory NVML reports as "reserved for system use" on every device.
///
/// Real drivers set aside a few hundred MiB per GPU for bookkeeping; nvmlDeviceGetMemoryInfo
/// (v1) counts it in `used`, nvmlDeviceGetMemoryInfo_v2 reports it in `reserved` and excludes
/// it from both `used` and `free`. The state does not model it (cuMemGetInfo does not see it
/// either), so it is a fixed NVML-only number, clamped to the device's size.
pub const RESERVED_MEMORY_BYTES: u64 = 256 << 20;

/// Default utilisation sampling window (nvmlDeviceGetUtilizationRates), in milliseconds.
pub const DEFAULT_UTIL_WINDOW_MS: u64 = 1000;

/// Default `FAKEGPU_DRIVER_VERSION` (CUDA 13.0), shared with the CUDA side's contract.
pub const DEFAULT_CUDA_DRIVER_VERSION: i32 = 13000;

/// `reserved` for a device of `total` bytes.
pub fn reserved_memory(total: u64) -> u64 {
    RESERVED_MEMORY_BYTES.min(total)
}

/// One device's memory as NVML reports it (v2 semantics: `used` excludes `reserved`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryView {
    pub total: u64,
    pub reserved: u64,
    /// Bytes allocated by processes (allocations plus context overhead), from the state.
    pub used: u64,
    pub free: u64,
}

impl MemoryView {
    /// The v1 (`nvmlMemory_t`) triple: reserved counts as used, `free + used == total`.
    pub fn v1(&self) -> (u64, u64, u64) {
        let used = self.used.saturating_add(self.reserved).min(self.total);
        (self.total, self.total - used, used)
    }
}

/// Memory of device `index`, or `None` when it does not exist.
pub fn memory_view(state: &SharedState, index: u32) -> Option<MemoryView> {
    let spec = state.device(index)?;
    Some(memory_view_of(&spec, state.used_memory(index)))
}

/// [`memory_view`] from an already-read spec and usage (used by smi to read usage once).
pub fn memory_view_of(spec: &DeviceSpec, used: u64) -> MemoryView {
    let total = spec.total_memory;
    let reserved = reserved_memory(total);
    // Oversubscription cannot happen in the fake (allocations fail first), but a free that
    // underflows would be a nonsense value for a client, so saturate.
    let free = total.saturating_sub(reserved).saturating_sub(used);
    MemoryView {
        total,
        reserved,
        used,
        free,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// `FAKEGPU_PID_OFFSET` (default 0): added to every PID NVML reports, the way a container in
/// its own PID namespace sees host PIDs from the real driver. Read once per process.
pub fn pid_offset() -> u32 {
    static OFFSET: OnceLock<u32> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var("FAKEGPU_PID_OFFSET")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// The PID NVML reports for a process whose real PID is `pid`.
pub fn nvml_pid(pid: u32) -> u32 {
    pid.wrapping_add(pid_offset())
}

/// The utilisation window in nanoseconds: `FAKEGPU_UTIL_WINDOW_MS` (default 1000 ms, at
/// least 1 ms). Read once per process.
pub fn util_window_ns() -> u64 {
    static WINDOW: OnceLock<u64> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        env_u64("FAKEGPU_UTIL_WINDOW_MS")
            .unwrap_or(DEFAULT_UTIL_WINDOW_MS)
            .max(1)
            .saturating_mul(1_000_000)
    })
}

/// Device utilisation (nvmlDeviceGetUtilizationRates `gpu`, smi's figure), percent: over the
/// last `FAKEGPU_UTIL_WINDOW_MS` (exact mode, rounded) or the last completed sample period,
/// truncated (realistic mode, see [`crate::nvml_sampling`]).
pub fn device_utilization(state: &SharedState, index: u32) -> u32 {
    let sampling = crate::nvml_sampling::sampling();
    if !sampling.realistic {
        return state.utilization_percent(index, util_window_ns()).min(100);
    }
    let (from, to) = sampling.device_window(crate::state::now_ns(), util_window_ns());
    sampling.percent(state.busy_ns(index, None, from, to), to - from)
}

/// `FAKEGPU_DRIVER_VERSION` (default 13000), as nvmlSystemGetCudaDriverVersion reports it.
pub fn cuda_driver_version() -> i32 {
    std::env::var("FAKEGPU_DRIVER_VERSION")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|v: &i32| *v > 0)
        .unwrap_or(DEFAULT_CUDA_DRIVER_VERSION)
}

/// The display driver version that ships a given CUDA driver API version (as
/// nvmlSystemGetDriverVersion and nvidia-smi print it). Real branches: 580 = CUDA 13.0,
/// 575 = 12.9, 570 = 12.8, 560 = 12.6, 550 = 12.4, 535 = 12.2; older gets 525.
pub fn driver_version_string(cuda: i32) -> &'static str {
    match cuda {
        v if v >= 13000 => "580.95.05",
        v if v >= 12090 => "575.57.08",
        v if v >= 12080 => "570.172.08",
        v if v >= 12060 => "560.35.03",
        v if v >= 12040 => "550.163.01",
        v if v >= 12020 => "535.261.03",
        _ => "525.147.05",
    }
}

/// nvmlSystemGetNVMLVersion: "<cuda major>.<driver version>", e.g. "13.580.95.05".
pub fn nvml_version_string(cuda: i32) -> String {
    format!("{}.{}", cuda / 1000, driver_version_string(cuda))
}

/// A PCI address as (domain, bus, device, function).
pub type PciAddress = (u32, u32, u32, u32);

/// Parses "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F" or "BB:DD.F" (hex, any case), the forms NVML
/// accepts in nvmlDeviceGetHandleByPciBusId.
pub fn parse_pci_bus_id(text: &str) -> Option<PciAddress> {
    let text = text.trim();
    let parts: Vec<&str> = text.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (u32::from_str_radix(d, 16).ok()?, *b, *r),
        [b, r] => (0, *b, *r),
        _ => return None,
    };
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let (dev, func) = match rest.split_once('.') {
        Some((d, f)) => (d, f),
        None => (rest, "0"),
    };
    let dev = u32::from_str_radix(dev, 16).ok()?;
    let func = u32::from_str_radix(func, 16).ok()?;
    (bus <= 0xff && dev <= 0x1f && func <= 7).then_some((domain, bus, dev, func))
}

/// The address of device `spec`; falls back to bus `index + 1` when the state's bus id does
/// not parse (only possible with a hand-written FAKEGPU_CONFIG).
pub fn pci_address(spec: &DeviceSpec, index: u32) -> PciAddress {
    parse_pci_bus_id(&spec.pci_bus_id).unwrap_or((0, (index + 1) & 0xff, 0, 0))
}

/// nvmlPciInfo_t::busId form: "%08X:%02X:%02X.%X".
pub fn bus_id(addr: PciAddress) -> String {
    format!("{:08X}:{:02X}:{:02X}.{:X}", addr.0, addr.1, addr.2, addr.3)
}

/// nvmlPciInfo_t::busIdLegacy form: "%04X:%02X:%02X.%X".
pub fn bus_id_legacy(addr: PciAddress) -> String {
    format!("{:04X}:{:02X}:{:02X}.{:X}", addr.0, addr.1, addr.2, addr.3)
}

/// Board-level facts the state does not model, derived from the device's name and compute
/// capability so that presets look like their real cards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoardProfile {
    /// nvmlPciInfo_t::pciDeviceId: (device id << 16) | vendor 0x10DE.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    /// Enforced power limit, milliwatts.
    pub power_limit_mw: u32,
    /// Power draw when idle, milliwatts.
    pub idle_power_mw: u32,
    /// FP32 cores per SM for this compute capability.
    pub cores_per_sm: u32,
}

pub fn board_profile(spec: &DeviceSpec) -> BoardProfile {
    let (pci_device_id, pci_subsystem_id, power_limit_mw) = if spec.name.contains("V100") {
        (0x1DB6_10DE, 0x124A_10DE, 250_000)
    } else if spec.name.contains("H200") {
        (0x2335_10DE, 0x18BE_10DE, 700_000)
    } else if spec.name.contains("A100") {
        (0x20B2_10DE, 0x1463_10DE, 400_000)
    } else if spec.name.contains("T4") {
        (0x1EB8_10DE, 0x12A2_10DE, 70_000)
    } else {
        (0x0000_10DE, 0x0000_10DE, 300_000)
    };
    let cores_per_sm = match (spec.cc_major, spec.cc_minor) {
        (7, _) => 64,
        (8, 0) => 64,
        (8, _) => 128,
        (9, _) => 128,
        (m, _) if m >= 10 => 128,
        _ => 128,
    };
    BoardProfile {
        pci_device_id,
        pci_subsystem_id,
        power_limit_mw,
        idle_power_mw: power_limit_mw / 10,
        cores_per_sm,
    }
}

/// Power draw at `util` percent: linear from idle to the limit.
pub fn power_usage_mw(profile: &BoardProfile, util: u32) -> u32 {
    let util = u64::from(util.min(100));
    let span = u64::from(profile.power_limit_mw - profile.idle_power_mw);
    profile.idle_power_mw + (span * util / 100) as u32
}

/// GPU temperature at `util` percent: 30 C idle, 70 C flat out.
pub fn temperature_c(util: u32) -> u32 {
    30 + util.min(100) * 40 / 100
}

/// Whether the device has MIG (compute capability 8.0 and 9.x+ datacenter parts; the
/// presets' V100 does not, the H200 does).
pub fn supports_mig(spec: &DeviceSpec) -> bool {
    (spec.cc_major == 8 && spec.cc_minor == 0) || spec.cc_major >= 9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v100() -> DeviceSpec {
        DeviceSpec {
            name: "Tesla V100-PCIE-32GB".into(),
            uuid: "GPU-x".into(),
            pci_bus_id: "00000000:3B:00.0".into(),
            total_memory: 32 << 30,
            sm_count: 80,
            max_threads_per_sm: 2048,
            cc_major: 7,
            cc_minor: 0,
        }
    }

    #[test]
    fn pci_bus_ids_parse_in_every_nvml_form() {
        assert_eq!(parse_pci_bus_id("00000000:3B:00.0"), Some((0, 0x3b, 0, 0)));
        assert_eq!(parse_pci_bus_id("0000:3b:00.0"), Some((0, 0x3b, 0, 0)));
        assert_eq!(parse_pci_bus_id("3B:00.0"), Some((0, 0x3b, 0, 0)));
        assert_eq!(parse_pci_bus_id("0001:3B:1f.7"), Some((1, 0x3b, 0x1f, 7)));
        assert_eq!(parse_pci_bus_id("nope"), None);
        assert_eq!(parse_pci_bus_id("0000:3B:20.0"), None);
        let addr = (0, 0x3b, 0, 0);
        assert_eq!(bus_id(addr), "00000000:3B:00.0");
        assert_eq!(bus_id_legacy(addr), "0000:3B:00.0");
    }

    #[test]
    fn memory_views_follow_nvml_v1_and_v2_rules() {
        let view = memory_view_of(&v100(), 1 << 30);
        assert_eq!(view.reserved, RESERVED_MEMORY_BYTES);
        assert_eq!(view.free + view.reserved + view.used, view.total);
        let (total, free, used) = view.v1();
        assert_eq!(used, (1 << 30) + RESERVED_MEMORY_BYTES);
        assert_eq!(free + used, total);
    }

    #[test]
    fn board_numbers_move_with_utilisation() {
        let p = board_profile(&v100());
        assert_eq!(p.pci_device_id & 0xffff, 0x10de);
        assert_eq!(power_usage_mw(&p, 0), 25_000);
        assert_eq!(power_usage_mw(&p, 100), 250_000);
        assert_eq!(temperature_c(0), 30);
        assert_eq!(temperature_c(100), 70);
        assert!(!supports_mig(&v100()));
        assert_eq!(driver_version_string(13000), "580.95.05");
        assert_eq!(nvml_version_string(12080), "12.570.172.08");
    }
}
