//! Whether every device entry of a limit file names a device of this node. An entry that
//! matches nothing limits nothing: a one-character typo in a UUID would leave the card it
//! meant unlimited. So the shim (once the driver can list the devices) and `gpuslice check`
//! (when NVML can) refuse such a file, naming the entry and the devices that do exist.
//!
//! "The node's devices" are those the process sees (CUDA ordinals under
//! `CUDA_VISIBLE_DEVICES`, or NVML indices) plus, for an entry that matches none of them,
//! any device NVML knows: NVML ignores `CUDA_VISIBLE_DEVICES` and lists every device of the
//! container, so a process that was shown one card of two does not refuse an entry for the
//! other card (that entry is right; it just does not concern this process). An index entry
//! counts as existing when NVML has that index. When NVML cannot answer, an entry that no
//! visible device matches is refused: the shim cannot tell a hidden device from a typo, and
//! failing open is what this rule exists to prevent.
//!
//! Only limit files are checked: HAMi's un-indexed env variables become an entry for each
//! of the first 16 indices (see `config`), which no node has all of.

use crate::config::{ConfigError, ConfigSource, DeviceSelector, SliceConfig};
use crate::text::{shorten, MAX_QUOTED};

/// A device a process sees: its index there and its UUID (empty when the driver has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenDevice {
    pub index: u32,
    pub uuid: String,
}

/// Positions (in `config.devices`) of the entries that name no device: none of `seen`, and
/// `node_has` (NVML's whole-container view; `None` = cannot ask) does not know it either.
/// Always empty for a configuration that is not from a limit file.
pub fn unmatched_entries(
    config: &SliceConfig,
    seen: &[SeenDevice],
    node_has: &dyn Fn(&DeviceSelector) -> Option<bool>,
) -> Vec<usize> {
    if !matches!(config.source, ConfigSource::File(_)) {
        return Vec::new();
    }
    config
        .devices
        .iter()
        .enumerate()
        .filter(|(_, limit)| {
            !seen
                .iter()
                .any(|device| limit.selector.matches(device.index, &device.uuid))
                && node_has(&limit.selector) != Some(true)
        })
        .map(|(position, _)| position)
        .collect()
}

/// The one-line refusal for `unmatched` (non-empty, from [`unmatched_entries`]): the limit
/// file, the first unmatched entry, how many others, and the devices that exist.
/// `nvml_answered`: whether NVML could be asked about devices hidden from this process.
pub fn unmatched_error(
    config: &SliceConfig,
    unmatched: &[usize],
    seen: &[SeenDevice],
    nvml_answered: bool,
) -> ConfigError {
    let origin = match &config.source {
        ConfigSource::File(path) => path.display().to_string(),
        ConfigSource::Env => "HAMi env".to_string(),
    };
    let first = unmatched.first().copied().unwrap_or(0);
    let (field, selector) = match config.devices.get(first).map(|d| &d.selector) {
        Some(selector @ DeviceSelector::Uuid(_)) => (format!("devices[{first}].uuid"), selector),
        Some(selector) => (format!("devices[{first}].index"), selector),
        None => {
            return ConfigError {
                origin,
                field: "devices".into(),
                problem: "names no device of this node".into(),
            }
        }
    };
    let others = match unmatched.len() {
        1 => String::new(),
        n => format!(" (and {} more entries)", n - 1),
    };
    let nvml = if nvml_answered {
        ""
    } else {
        "; NVML, which would also show devices hidden by CUDA_VISIBLE_DEVICES, could not be asked"
    };
    ConfigError {
        origin,
        field,
        problem: format!(
            "{}{others} matches no device of this node (devices here: {}){nvml}; an entry that matches nothing would leave the slice unlimited",
            shorten(&selector.to_string(), 80),
            list_devices(seen)
        ),
    }
}

/// "0 GPU-..., 1 GPU-..." (at most 16, then a count), bounded.
pub fn list_devices(seen: &[SeenDevice]) -> String {
    if seen.is_empty() {
        return "none".into();
    }
    let mut parts: Vec<String> = seen
        .iter()
        .take(16)
        .map(|device| match device.uuid.as_str() {
            "" => format!("{} (no UUID)", device.index),
            uuid => format!("{} {}", device.index, shorten(uuid, 80)),
        })
        .collect();
    if seen.len() > 16 {
        parts.push(format!("{} more", seen.len() - 16));
    }
    shorten(&parts.join(", "), 4 * MAX_QUOTED).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_limit_file;
    use std::path::Path;

    const A: &str = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf";
    const B: &str = "GPU-b0b1b2b3-b4b5-b6b7-b8b9-babbbcbdbebf";

    fn file(devices: &str) -> SliceConfig {
        let text = format!(r#"{{"version": 1, "devices": [{devices}]}}"#);
        parse_limit_file(Path::new("/etc/gpuslice/limits.json"), &text).unwrap()
    }

    fn one_card() -> Vec<SeenDevice> {
        vec![SeenDevice {
            index: 0,
            uuid: A.into(),
        }]
    }

    #[test]
    fn entries_that_match_a_seen_device_pass() {
        let config = file(&format!(
            r#"{{"uuid": "{}", "memory": "1GiB"}}, {{"index": 0}}"#,
            A.to_uppercase()
        ));
        assert!(unmatched_entries(&config, &one_card(), &|_| None).is_empty());
    }

    #[test]
    fn a_typo_or_a_missing_index_is_unmatched_and_the_message_names_what_exists() {
        let typo = A.replace("aeaf", "aeae");
        let config = file(&format!(
            r#"{{"index": 0}}, {{"uuid": "{typo}"}}, {{"index": 3}}"#
        ));
        let unmatched = unmatched_entries(&config, &one_card(), &|_| Some(false));
        assert_eq!(unmatched, vec![1, 2]);
        let error = unmatched_error(&config, &unmatched, &one_card(), true);
        let line = error.to_string();
        assert!(
            line.starts_with("invalid configuration /etc/gpuslice/limits.json: devices[1].uuid: "),
            "{line}"
        );
        assert!(line.contains(&typo), "{line}");
        assert!(line.contains("and 1 more"), "{line}");
        assert!(line.contains(&format!("0 {A}")), "{line}");
        assert!(!line.contains("could not be asked"), "{line}");
    }

    #[test]
    fn a_device_hidden_from_this_process_but_known_to_nvml_is_fine() {
        let config = file(&format!(r#"{{"uuid": "{B}"}}, {{"index": 1}}"#));
        let node_has = |selector: &DeviceSelector| Some(selector.matches(1, B));
        assert!(unmatched_entries(&config, &one_card(), &node_has).is_empty());
        // Without NVML, a device no one can see is refused, and the message says why.
        let unmatched = unmatched_entries(&config, &one_card(), &|_| None);
        assert_eq!(unmatched, vec![0, 1]);
        let line = unmatched_error(&config, &unmatched, &one_card(), false).to_string();
        assert!(line.contains("could not be asked"), "{line}");
    }

    #[test]
    fn hami_env_entries_are_not_checked() {
        let mut config = file(r#"{"index": 7}"#);
        config.source = ConfigSource::Env;
        assert!(unmatched_entries(&config, &one_card(), &|_| Some(false)).is_empty());
    }

    #[test]
    fn the_device_list_is_bounded() {
        let many: Vec<SeenDevice> = (0..100)
            .map(|index| SeenDevice {
                index,
                uuid: B.into(),
            })
            .collect();
        let text = list_devices(&many);
        assert!(text.ends_with("84 more"), "{text}");
        assert!(text.len() <= 4 * MAX_QUOTED);
    }
}
