//! `gpuslice check [FILE]`: validates a limit file (or, without FILE, whatever the shim would
//! load: `GPUSLICE_CONFIG`, the default path, else HAMi env) and says what the slice is in
//! human terms. When an NVML library can be loaded it also warns about limits larger than the
//! card (`write` cannot know the card, so it accepts them; the shim then caps at the card).

use std::path::PathBuf;

use clap::Args;
use gpuslice_common::config::{self, ConfigSource, DeviceSelector, Loaded, SliceConfig};
use gpuslice_common::size::format_size;
use serde_json::json;

use crate::error::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Limit file to check; default: what the shim would load (GPUSLICE_CONFIG, else
    /// /etc/gpuslice/limits.json, else HAMi env).
    pub file: Option<PathBuf>,

    /// Print the result as JSON (`{"valid": true, "source": ..., "config": {...}}`).
    #[arg(long)]
    pub json: bool,

    /// Do not load NVML to compare the limits with the card.
    #[arg(long)]
    pub no_probe: bool,
}

pub fn run(args: &CheckArgs) -> CliResult<()> {
    match load(args.file.as_ref()) {
        Ok(config) => {
            let warnings = if args.no_probe {
                Vec::new()
            } else {
                card_warnings(&config)
            };
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

fn load(file: Option<&PathBuf>) -> CliResult<SliceConfig> {
    if let Some(path) = file {
        let bytes = std::fs::read(path).map_err(|e| {
            CliError::invalid(format!(
                "cannot read limit file {} ({e}); check the path and its permissions",
                path.display()
            ))
        })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            CliError::invalid(format!(
                "invalid limit file {}: is not UTF-8 text",
                path.display()
            ))
        })?;
        return Ok(config::parse_limit_file(path, &text)?);
    }
    let get = |name: &str| std::env::var(name).ok();
    match config::load(&get) {
        Loaded::Configured(config) => Ok(config),
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
            format!("{device}: memory {memory}, compute {compute}")
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
    if let Some(level) = config.log_level {
        tail.push_str(&format!("; log {level}"));
    }
    lines.push(tail);
    lines
}

/// Limits above what the card has, when NVML tells us what the card has.
fn card_warnings(config: &SliceConfig) -> Vec<String> {
    let Ok(cards) = crate::smi::query_cards() else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    for limit in &config.devices {
        let card = cards
            .iter()
            .find(|card| limit.selector.matches(card.index, &card.uuid));
        match (card, limit.memory_limit) {
            (Some(card), Some(memory)) if memory > card.memory_total => warnings.push(format!(
                "{}: memory limit {} is larger than the card ({}, {}); the slice is then the whole card",
                limit.selector,
                format_size(memory),
                card.name,
                format_size(card.memory_total)
            )),
            (None, _) => warnings.push(format!(
                "{}: no such device on this machine ({} found)",
                limit.selector,
                cards.len()
            )),
            _ => {}
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::parse_limit_file;
    use std::path::Path;

    #[test]
    fn describes_a_slice_in_human_terms() {
        let text = r#"{"version": 1, "region": "/run/a.region", "policy": "burst",
            "devices": [{"index": 0, "memory": "8GiB", "compute": 25},
                        {"uuid": "GPU-abc", "memory": 1073741824}]}"#;
        let config = parse_limit_file(Path::new("x.json"), text).unwrap();
        assert_eq!(
            describe(&config),
            vec![
                "device 0: memory 8 GiB, compute 25%",
                "device GPU-abc: memory 1 GiB, compute not throttled",
                "region /run/a.region; policy burst",
            ]
        );
    }
}
