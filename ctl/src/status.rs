//! `gpuslice status`: a live view of one slice's shared region: per device the limit, used,
//! free, compute share and measured utilisation; per process its pid (and host pid), memory
//! and whether it is alive or a stale slot. Read-only, so it needs neither root nor a GPU.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpuslice_common::config::{self, Loaded};
use gpuslice_common::size::format_size_approx;
use serde_json::json;

use crate::error::{CliError, CliResult};
use crate::region_view::{self, ProcessState, View};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The region file (`gpuslice run` prints it).
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pub region: Option<PathBuf>,

    /// Take the region path from this limit file. Default (neither flag): the limit file or
    /// HAMi env the shim would load.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print JSON (with --watch: one JSON object per line).
    #[arg(long)]
    pub json: bool,

    /// Refresh every SECS seconds (default 1) until interrupted.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1",
          value_parser = parse_interval)]
    pub watch: Option<f64>,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(secs) if (0.05..=3600.0).contains(&secs) => Ok(secs),
        _ => Err(format!(
            "{text:?} is not an interval; give seconds between 0.05 and 3600"
        )),
    }
}

pub fn run(args: &StatusArgs) -> CliResult<()> {
    let path = region_path(args)?;
    let Some(interval) = args.watch else {
        let view = region_view::read(&path)?;
        print_view(&path, &view, args.json);
        return Ok(());
    };
    let clear = !args.json && std::io::stdout().is_terminal();
    loop {
        let view = region_view::read(&path)?;
        if clear {
            print!("\x1b[H\x1b[2J");
        }
        print_view(&path, &view, args.json);
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs_f64(interval));
    }
}

fn region_path(args: &StatusArgs) -> CliResult<PathBuf> {
    resolve_region_path(args.region.as_ref(), args.config.as_ref())
}

/// The region a command means: `--region`, else the one `--config` names, else the one the
/// shim would use here (limit file or HAMi env).
pub fn resolve_region_path(
    region: Option<&PathBuf>,
    config_file: Option<&PathBuf>,
) -> CliResult<PathBuf> {
    if let Some(path) = region {
        return Ok(path.clone());
    }
    let config = if let Some(file) = config_file {
        let text = std::fs::read_to_string(file).map_err(|e| {
            CliError::invalid(format!(
                "cannot read limit file {} ({e}); check the path",
                file.display()
            ))
        })?;
        config::parse_limit_file(file, &text)?
    } else {
        let get = |name: &str| std::env::var(name).ok();
        match config::load(&get) {
            Loaded::Configured(config) => config,
            Loaded::Invalid(error) => return Err(error.into()),
            Loaded::Unconfigured => {
                return Err(CliError::usage(
                    "no slice configured here; pass --region PATH (printed by `gpuslice run`) or --config FILE",
                ))
            }
        }
    };
    config.region_path.ok_or_else(|| {
        CliError::invalid(
            "the configuration names no region (the shim derives a default); pass --region PATH",
        )
    })
}

fn print_view(path: &std::path::Path, view: &View, as_json: bool) {
    if as_json {
        println!("{}", to_json(path, view));
    } else {
        print!("{}", render(path, view));
    }
}

pub fn to_json(path: &std::path::Path, view: &View) -> serde_json::Value {
    json!({
        "region": path.display().to_string(),
        "devices": view.devices.iter().map(|d| json!({
            "index": d.index,
            "uuid": d.uuid,
            "limit": d.limit,
            "used": d.used,
            "free": d.limit.map(|limit| limit.saturating_sub(d.used)),
            "compute_percent": d.compute_percent,
            "utilization": d.utilization,
            "context_cost": d.context_cost,
            "virtual": d.host.zip(d.limit).map(|(h, limit)| limit.saturating_add(h.limit)),
            "host_limit": d.host.map(|h| h.limit),
            "host_used": d.host.map(|h| h.used),
            "host_free": d.host.map(|h| h.limit.saturating_sub(h.used)),
        })).collect::<Vec<_>>(),
        "processes": view.processes.iter().map(|p| json!({
            "pid": p.pid,
            "host_pid": p.host_pid,
            "used": p.used.iter().map(|(dev, bytes)| json!({"device": dev, "bytes": bytes})).collect::<Vec<_>>(),
            "used_total": p.used.iter().map(|(_, b)| *b).sum::<u64>(),
            "host_used": p.host_used,
            "alive": p.state == ProcessState::Alive,
            "state": p.state.as_str(),
        })).collect::<Vec<_>>(),
    })
}

/// The human table. Free never wraps: a slice over its limit shows 0 free.
pub fn render(path: &std::path::Path, view: &View) -> String {
    let mut out = format!("region {}\n", path.display());
    out.push_str(&format!(
        "{:<4} {:<42} {:>10} {:>10} {:>10} {:>6} {:>6}\n",
        "DEV", "UUID", "LIMIT", "USED", "FREE", "SHARE", "UTIL"
    ));
    for d in &view.devices {
        let (limit, free) = match d.limit {
            Some(limit) => (
                format_size_approx(limit),
                format_size_approx(limit.saturating_sub(d.used)),
            ),
            None => ("none".to_string(), "-".to_string()),
        };
        out.push_str(&format!(
            "{:<4} {:<42} {:>10} {:>10} {:>10} {:>6} {:>6}\n",
            d.index,
            if d.uuid.is_empty() { "-" } else { &d.uuid },
            limit,
            format_size_approx(d.used),
            free,
            d.compute_percent.map_or("-".into(), |p| format!("{p}%")),
            d.utilization.map_or("-".into(), |u| format!("{u:.0}%")),
        ));
        if let Some(host) = d.host {
            out.push_str(&format!(
                "{:<4} {:<42} {:>10} {:>10} {:>10}\n",
                "",
                "in host memory (oversubscribed)",
                format_size_approx(host.limit),
                format_size_approx(host.used),
                format_size_approx(host.limit.saturating_sub(host.used)),
            ));
        }
    }
    if view.devices.is_empty() {
        out.push_str("(no device has registered yet)\n");
    }
    out.push_str(&format!(
        "{:<8} {:<9} {:>10} {:<6}\n",
        "PID", "HOST-PID", "MEMORY", "STATE"
    ));
    for p in &view.processes {
        let total: u64 = p.used.iter().map(|(_, b)| *b).sum();
        out.push_str(&format!(
            "{:<8} {:<9} {:>10} {:<6}\n",
            p.pid,
            p.host_pid.map_or("-".into(), |h| h.to_string()),
            format_size_approx(total),
            p.state.as_str()
        ));
    }
    if view.processes.is_empty() {
        out.push_str("(no processes)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region_view::{DeviceView, HostView, ProcessState, ProcessView};
    use std::path::Path;

    fn view() -> View {
        View {
            devices: vec![DeviceView {
                index: 0,
                uuid: "GPU-1".into(),
                limit: Some(1 << 30),
                used: 3 << 30,
                compute_percent: Some(25),
                utilization: Some(24.6),
                context_cost: Some(300 << 20),
                host: Some(HostView {
                    limit: 2 << 30,
                    used: 1 << 30,
                }),
            }],
            processes: vec![ProcessView {
                pid: 7,
                host_pid: Some(1007),
                used: vec![(0, 512 << 20)],
                host_used: 1 << 30,
                state: ProcessState::Stale,
            }],
        }
    }

    #[test]
    fn free_never_wraps_and_processes_show_state() {
        let text = render(Path::new("/r"), &view());
        assert!(text.contains("GPU-1"), "{text}");
        assert!(text.contains(" 0 B "), "free must clamp at 0: {text}");
        assert!(text.contains("25%") && text.contains("25%"), "{text}");
        assert!(text.contains("1007") && text.contains("stale"), "{text}");
        let json = to_json(Path::new("/r"), &view());
        assert_eq!(json["devices"][0]["free"], 0);
        assert_eq!(json["devices"][0]["context_cost"], 300u64 << 20);
        assert_eq!(json["processes"][0]["used_total"], 512u64 << 20);
        // The oversubscribed part, apart from the card's.
        assert!(text.contains("in host memory"), "{text}");
        assert_eq!(json["devices"][0]["virtual"], 3u64 << 30);
        assert_eq!(json["devices"][0]["host_used"], 1u64 << 30);
        assert_eq!(json["devices"][0]["host_free"], 1u64 << 30);
        assert_eq!(json["processes"][0]["host_used"], 1u64 << 30);
    }

    #[test]
    fn interval_is_bounded() {
        assert_eq!(parse_interval("2"), Ok(2.0));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("-1").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
