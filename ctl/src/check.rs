//! `gpuslice check [FILE]`: validates a limit file (or, without FILE, whatever the shim would
//! load: the anchored `/etc/gpuslice/limits.json`, else `GPUSLICE_CONFIG`, else HAMi env, and
//! warns about variables an anchored file makes the shim ignore) and says what the slice is in
//! human terms. Then, unless `--no-probe`, it checks the file against this machine the way
//! the shim will use it, and any of these is an error (exit 3):
//! * a device entry that matches no device NVML lists (the shim would refuse every call);
//!   when NVML cannot be loaded, `check` says that these entries were not checked;
//! * a region the shim could not open or create (see `region_check`).
//!
//! A limit larger than the card is a warning (`write` cannot know the card, so it accepts
//! them; the shim then caps at the card).

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Args;
use gpuslice_common::config::{self, ConfigSource, DeviceSelector, Loaded, SliceConfig};
use gpuslice_common::host_memory::{CgroupMemory, HOST_MARGIN_BYTES};
use gpuslice_common::size::format_size;
use gpuslice_common::text::{shorten, MAX_QUOTED};
use gpuslice_common::visible::{self, SeenDevice};
use serde_json::json;

use crate::error::{CliError, CliResult};
use crate::region_check;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Limit file to check; default: what the shim would load (GPUSLICE_CONFIG, else
    /// /etc/gpuslice/limits.json, else HAMi env).
    pub file: Option<PathBuf>,

    /// Print the result as JSON (`{"valid": true, "source": ..., "config": {...}}`).
    #[arg(long)]
    pub json: bool,

    /// Check the file alone, not against this machine: do not load NVML to compare the
    /// devices and limits with the cards, and do not examine the region path (for a file
    /// meant for another machine or container).
    #[arg(long)]
    pub no_probe: bool,
}

pub fn run(args: &CheckArgs) -> CliResult<()> {
    let checked = load(args.file.as_ref()).and_then(|(config, mut warnings)| {
        if !args.no_probe {
            warnings.extend(machine_checks(&config)?);
        }
        Ok((config, warnings))
    });
    match checked {
        Ok((config, warnings)) => {
            for warning in &warnings {
                eprintln!("gpuslice: warning: {warning}");
            }
            if args.json {
                let file: serde_json::Value =
                    serde_json::from_str(&config::to_json(&config)).unwrap_or(json!(null));
                println!(
                    "{}",
                    json!({"valid": true, "source": source_text(&config.source),
                           "config": file, "warnings": warnings})
                );
            } else {
                println!("{}: valid", source_text(&config.source));
                for line in describe(&config) {
                    println!("{line}");
                }
            }
            Ok(())
        }
        Err(error) => {
            if args.json {
                println!("{}", json!({"valid": false, "error": error.message}));
            }
            Err(error)
        }
    }
}

/// The configuration and the warnings about inputs it ignores.
fn load(file: Option<&PathBuf>) -> CliResult<(SliceConfig, Vec<String>)> {
    if let Some(path) = file {
        let shown = shorten(&path.display().to_string(), MAX_QUOTED).into_owned();
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| {
                f.take(config::MAX_FILE_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
            })
            .map_err(|e| {
                CliError::invalid(format!(
                    "cannot read limit file {shown} ({e}); check the path and its permissions"
                ))
            })?;
        if bytes.len() > config::MAX_FILE_BYTES {
            return Err(CliError::invalid(format!(
                "invalid limit file {shown}: is larger than {} bytes; a limit file has at most 1 MiB",
                config::MAX_FILE_BYTES
            )));
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            CliError::invalid(format!("invalid limit file {shown}: is not UTF-8 text"))
        })?;
        return Ok((config::parse_limit_file(path, &text)?, Vec::new()));
    }
    let get = |name: &str| std::env::var(name).ok();
    let outcome = config::load_anchored(Path::new(config::DEFAULT_CONFIG_PATH), &get);
    match outcome.loaded {
        Loaded::Configured(config) => Ok((config, outcome.warnings)),
        Loaded::Invalid(error) => Err(error.into()),
        Loaded::Unconfigured => Err(CliError::invalid(format!(
            "no slice configured: {} is unset, {} does not exist and no HAMi variable is set; the shim would pass everything through unlimited (write one with `gpuslice write`)",
            config::CONFIG_ENV,
            config::DEFAULT_CONFIG_PATH
        ))),
    }
}

fn source_text(source: &ConfigSource) -> String {
    match source {
        ConfigSource::File(path) => format!("limit file {}", path.display()),
        ConfigSource::Env => "HAMi env".to_string(),
    }
}

/// The slice in human terms, one line per device, then region and policy.
pub fn describe(config: &SliceConfig) -> Vec<String> {
    let mut lines: Vec<String> = config
        .devices
        .iter()
        .map(|limit| {
            let device = match &limit.selector {
                DeviceSelector::Index(index) => format!("device {index}"),
                DeviceSelector::Uuid(uuid) => format!("device {uuid}"),
            };
            let memory = limit
                .memory_limit
                .map_or("not limited".to_string(), format_size);
            let compute = match limit.compute_percent {
                Some(percent) if percent < 100 => format!("{percent}%"),
                _ => "not throttled".to_string(),
            };
            let mut line = format!("{device}: memory {memory}, compute {compute}");
            if let (Some(size), Some(excess)) = (limit.virtual_memory, limit.host_excess()) {
                line.push_str(&format!(
                    ", virtual {} (oversubscribed: up to {} in the container's host memory, within its memory cgroup)",
                    format_size(size),
                    format_size(excess)
                ));
            }
            line
        })
        .collect();
    if lines.is_empty() {
        lines.push("no device limits (every device passes through)".to_string());
    }
    let region = config
        .region_path
        .as_ref()
        .map_or("default (derived by the shim)".to_string(), |p| {
            p.display().to_string()
        });
    let mut tail = format!("region {region}; policy {}", config.policy);
    if config.priority != gpuslice_common::config::Priority::Normal {
        tail.push_str(&format!("; priority {}", config.priority));
    }
    if let Some(level) = config.log_level {
        tail.push_str(&format!("; log {level}"));
    }
    if let Some(bound) = config.context_bound {
        tail.push_str(&format!(
            "; a context bounded at {}",
            gpuslice_common::size::format_size(bound)
        ));
    }
    lines.push(tail);
    lines
}

/// The file against this machine: `Err` for an entry that names no device NVML lists, or a
/// region the shim could not use; the warnings otherwise (limits above the card, devices
/// that could not be listed).
fn machine_checks(config: &SliceConfig) -> CliResult<Vec<String>> {
    region_check::check(config)?;
    let cards = match crate::smi::query_cards() {
        Ok(cards) => cards,
        Err(_) if config.devices.is_empty() => return Ok(Vec::new()),
        Err(e) => {
            return Ok(vec![format!(
                "cannot list this machine's devices, so device entries were not compared with them ({}); the shim refuses an entry that matches no device at the first CUDA call",
                shorten(&e.message, MAX_QUOTED)
            )])
        }
    };
    let seen: Vec<SeenDevice> = cards
        .iter()
        .map(|card| SeenDevice {
            index: card.index,
            uuid: card.uuid.clone(),
        })
        .collect();
    let unmatched = visible::unmatched_entries(config, &seen, &|_| None);
    if !unmatched.is_empty() {
        return Err(visible::unmatched_error(config, &unmatched, &seen, true).into());
    }
    let mut warnings = host_memory_warnings(config);
    for limit in &config.devices {
        let card = cards
            .iter()
            .find(|card| limit.selector.matches(card.index, &card.uuid));
        if let (Some(card), Some(memory)) = (card, limit.memory_limit) {
            if memory > card.memory_total {
                warnings.push(format!(
                    "{}: memory limit {} is larger than the card ({}, {}); the slice is then the whole card",
                    limit.selector,
                    format_size(memory),
                    card.name,
                    format_size(card.memory_total)
                ));
            }
        }
    }
    Ok(warnings)
}

/// An oversubscribing slice whose host part the memory cgroup of this process (the
/// container's, when `check` runs in it) cannot hold: the shim would refuse past what it can.
fn host_memory_warnings(config: &SliceConfig) -> Vec<String> {
    let excess: u64 = config
        .devices
        .iter()
        .filter_map(|d| d.host_excess())
        .fold(0, u64::saturating_add);
    let placeable = CgroupMemory::of_this_process().and_then(|c| c.placeable());
    match placeable {
        Some(room) if excess > room => vec![format!(
            "the slice may place {} in host memory (virtual sizes past memory), but this process's memory cgroup can take {} more ({} kept free for the rest of the pod): allocations past that are refused with CUDA_ERROR_OUT_OF_MEMORY",
            format_size(excess),
            format_size(room),
            format_size(HOST_MARGIN_BYTES)
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::parse_limit_file;
    use std::path::Path;

    #[test]
    fn describes_a_slice_in_human_terms() {
        let text = r#"{"version": 1, "region": "/run/a.region", "policy": "burst",
            "devices": [{"index": 0, "memory": "8GiB", "compute": 25, "virtual": "24GiB"},
                        {"uuid": "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", "memory": 1073741824}]}"#;
        let config = parse_limit_file(Path::new("x.json"), text).unwrap();
        assert_eq!(
            describe(&config),
            vec![
                "device 0: memory 8 GiB, compute 25%, virtual 24 GiB (oversubscribed: up to 16 GiB in the container's host memory, within its memory cgroup)",
                "device GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf: memory 1 GiB, compute not throttled",
                "region /run/a.region; policy burst",
            ]
        );
        let bounded = parse_limit_file(
            Path::new("x.json"),
            r#"{"version": 1, "region": "/run/a.region", "context_overhead": "768MiB", "devices": []}"#,
        )
        .unwrap();
        assert_eq!(
            describe(&bounded).last().unwrap(),
            "region /run/a.region; policy cap; a context bounded at 768 MiB"
        );
    }
}
