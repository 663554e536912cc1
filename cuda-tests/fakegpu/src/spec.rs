//! Device specifications: the presets named by `FAKEGPU_DEVICES`, the `FAKEGPU_CONFIG` JSON
//! form, and the fixed-size record a spec is stored as inside the shared state file.

use serde::Deserialize;

/// What a simulated device is. Fixed when the state file is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// `00000000:3B:00.0`.
    pub pci_bus_id: String,
    pub total_memory: u64,
    pub sm_count: u32,
    pub max_threads_per_sm: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
}

impl DeviceSpec {
    /// The 16 raw bytes of the UUID (what `cuDeviceGetUuid` returns).
    pub fn uuid_bytes(&self) -> [u8; 16] {
        // The first 32 hex digits after the prefix, in pairs; missing ones read as 0.
        let mut digits = [0u8; 32];
        let mut n = 0;
        for digit in self
            .uuid
            .trim_start_matches("GPU-")
            .chars()
            .filter_map(|c| c.to_digit(16))
            .take(32)
        {
            digits[n] = digit as u8;
            n += 1;
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate().take(n / 2) {
            *b = digits[2 * i] << 4 | digits[2 * i + 1];
        }
        out
    }

    /// PCI (domain, bus, device) parsed from `pci_bus_id`.
    pub fn pci_parts(&self) -> (u32, u32, u32) {
        parse_pci(&self.pci_bus_id).unwrap_or((0, 0, 0))
    }
}

/// Parses `dddddddd:bb:dd.f` or `dddd:bb:dd.f` (any case) into (domain, bus, device).
pub fn parse_pci(s: &str) -> Option<(u32, u32, u32)> {
    let mut parts = s.trim().splitn(3, ':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u32::from_str_radix(parts.next()?, 16).ok()?;
    let dev = parts.next()?.split('.').next()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    Some((domain, bus, dev))
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Stable but distinct-looking UUIDs: FNV-1a of the preset name and the index.
fn make_uuid(name: &str, index: usize) -> String {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in name.bytes().chain((index as u64).to_le_bytes()) {
        h ^= b as u128;
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    let x = format!("{h:032x}");
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// Bus numbers of a typical 8-GPU server, so that sorted-by-bus and by-index agree.
const BUSES: [u32; 8] = [0x18, 0x3B, 0x5E, 0x86, 0xAF, 0xD8, 0xDA, 0xDB];

fn pci_for(index: usize) -> String {
    format!("00000000:{:02X}:00.0", BUSES[index % BUSES.len()])
}

/// The spec of a named preset at position `index`, `None` for unknown names.
pub fn preset(name: &str, index: usize) -> Option<DeviceSpec> {
    let (full, total, sms, cc) = match name.trim().to_ascii_lowercase().as_str() {
        "v100" => ("Tesla V100-PCIE-32GB", 32 * GIB, 80, (7, 0)),
        "h200" => ("NVIDIA H200", 143_771 * MIB, 132, (9, 0)),
        "a100" => ("NVIDIA A100-SXM4-80GB", 80 * GIB, 108, (8, 0)),
        "t4" => ("Tesla T4", 15_360 * MIB, 40, (7, 5)),
        _ => return None,
    };
    Some(DeviceSpec {
        name: full.to_string(),
        uuid: make_uuid(full, index),
        pci_bus_id: pci_for(index),
        total_memory: total,
        sm_count: sms,
        max_threads_per_sm: if cc == (7, 5) { 1024 } else { 2048 },
        cc_major: cc.0,
        cc_minor: cc.1,
    })
}

/// `FAKEGPU_DEVICES`: comma list of presets.
pub fn parse_presets(list: &str) -> Result<Vec<DeviceSpec>, String> {
    let names: Vec<&str> = list.split(',').filter(|s| !s.trim().is_empty()).collect();
    if names.is_empty() {
        return Err("FAKEGPU_DEVICES names no device".into());
    }
    names
        .iter()
        .enumerate()
        .map(|(i, n)| preset(n, i).ok_or_else(|| format!("unknown FAKEGPU_DEVICES preset {n:?}")))
        .collect()
}

#[derive(Deserialize)]
struct ConfigDevice {
    #[serde(default)]
    preset: Option<String>,
    name: Option<String>,
    uuid: Option<String>,
    pci_bus_id: Option<String>,
    total_memory: Option<u64>,
    sm_count: Option<u32>,
    max_threads_per_sm: Option<u32>,
    cc_major: Option<u32>,
    cc_minor: Option<u32>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ConfigFile {
    Wrapped { devices: Vec<ConfigDevice> },
    Bare(Vec<ConfigDevice>),
}

/// `FAKEGPU_CONFIG` JSON: `{"devices":[{...}]}` or a bare array. Each device may name a
/// `preset` to start from; every `DeviceSpec` field may be given and overrides it. Without a
/// preset, `name`, `total_memory` and `sm_count` are required.
pub fn parse_config(json: &str) -> Result<Vec<DeviceSpec>, String> {
    let file: ConfigFile =
        serde_json::from_str(json).map_err(|e| format!("FAKEGPU_CONFIG: bad JSON: {e}"))?;
    let devices = match file {
        ConfigFile::Wrapped { devices } | ConfigFile::Bare(devices) => devices,
    };
    if devices.is_empty() {
        return Err("FAKEGPU_CONFIG names no device".into());
    }
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let base = match &d.preset {
                Some(p) => Some(preset(p, i).ok_or_else(|| format!("unknown preset {p:?}"))?),
                None => None,
            };
            let need = |what: &str| format!("FAKEGPU_CONFIG device {i}: missing {what}");
            let name = d
                .name
                .or(base.as_ref().map(|b| b.name.clone()))
                .ok_or_else(|| need("name"))?;
            Ok(DeviceSpec {
                uuid: d.uuid.unwrap_or_else(|| make_uuid(&name, i)),
                pci_bus_id: d.pci_bus_id.unwrap_or_else(|| pci_for(i)),
                total_memory: d
                    .total_memory
                    .or(base.as_ref().map(|b| b.total_memory))
                    .ok_or_else(|| need("total_memory"))?,
                sm_count: d
                    .sm_count
                    .or(base.as_ref().map(|b| b.sm_count))
                    .ok_or_else(|| need("sm_count"))?,
                max_threads_per_sm: d
                    .max_threads_per_sm
                    .or(base.as_ref().map(|b| b.max_threads_per_sm))
                    .unwrap_or(2048),
                cc_major: d
                    .cc_major
                    .or(base.as_ref().map(|b| b.cc_major))
                    .unwrap_or(8),
                cc_minor: d
                    .cc_minor
                    .or(base.as_ref().map(|b| b.cc_minor))
                    .unwrap_or(0),
                name,
            })
        })
        .collect()
}

/// The devices a new state file is created with, from the environment.
pub fn from_env() -> Result<Vec<DeviceSpec>, String> {
    if let Some(path) = std::env::var_os("FAKEGPU_CONFIG").filter(|p| !p.is_empty()) {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("FAKEGPU_CONFIG {}: {e}", path.to_string_lossy()))?;
        return parse_config(&text);
    }
    parse_presets(&std::env::var("FAKEGPU_DEVICES").unwrap_or_else(|_| "v100".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_match_the_contract() {
        let d = parse_presets("v100,h200").unwrap();
        assert_eq!(d[0].name, "Tesla V100-PCIE-32GB");
        assert_eq!(d[0].total_memory, 32 << 30);
        assert_eq!((d[0].sm_count, d[0].cc_major, d[0].cc_minor), (80, 7, 0));
        assert_eq!(d[1].name, "NVIDIA H200");
        assert_eq!(d[1].total_memory, 143_771 << 20);
        assert_eq!((d[1].sm_count, d[1].cc_major), (132, 9));
        assert_ne!(d[0].uuid, d[1].uuid);
        assert_eq!(d[0].uuid.len(), 40);
        assert!(d[0].uuid.starts_with("GPU-"));
        assert_eq!(d[1].pci_bus_id, "00000000:3B:00.0");
        assert!(parse_presets("x200").is_err());
    }

    #[test]
    fn uuid_bytes_round_trip() {
        let d = preset("v100", 0).unwrap();
        let hex: String = d.uuid_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, d.uuid[4..].replace('-', ""));
    }

    #[test]
    fn config_overrides_preset() {
        let d = parse_config(
            r#"{"devices":[{"preset":"h200","total_memory":1073741824},
                           {"name":"Tiny","total_memory":4194304,"sm_count":2}]}"#,
        )
        .unwrap();
        assert_eq!(d[0].name, "NVIDIA H200");
        assert_eq!(d[0].total_memory, 1 << 30);
        assert_eq!(d[1].name, "Tiny");
        assert_eq!(d[1].max_threads_per_sm, 2048);
        assert!(parse_config(r#"[{"name":"x"}]"#).is_err());
        assert_eq!(parse_pci("00000000:3b:00.0"), Some((0, 0x3b, 0)));
    }
}
