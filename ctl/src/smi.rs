//! `gpuslice smi`: an nvidia-smi-style table from NVML (through `nvml-wrapper`). Under the
//! shim NVML answers for the slice (memory rewritten, processes filtered), so this is what
//! a user inside a container types; without the shim it shows the whole card. `--json` is
//! the same data for scripts (the demo and the tests read it).

use std::ffi::OsStr;

use clap::Args;
use gpuslice_common::size::format_size_approx;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde_json::json;

use crate::error::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct SmiArgs {
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// What NVML says about one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total: u64,
    pub memory_used: u64,
    pub memory_free: u64,
    /// Percent of time a kernel ran over NVML's last sample window; `None` if unsupported.
    pub gpu_util: Option<u32>,
    pub processes: Vec<CardProcess>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardProcess {
    pub pid: u32,
    pub used_memory: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub driver_version: Option<String>,
    pub cuda_version: Option<i32>,
    pub cards: Vec<Card>,
}

pub fn run(args: &SmiArgs) -> CliResult<()> {
    let report = query()?;
    if args.json {
        println!("{}", to_json(&report));
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// The devices only (for `check`'s and `run`'s comparisons with the card).
pub fn query_cards() -> CliResult<Vec<Card>> {
    query().map(|report| report.cards)
}

/// NVML for a tool that can do without it (`status` asking whether the driver still lists a
/// process): `None` instead of an error.
pub fn open_nvml_quietly() -> Option<Nvml> {
    open_nvml().ok()
}

fn open_nvml() -> CliResult<Nvml> {
    // Drivers ship libnvidia-ml.so.1; the unversioned name exists only with dev packages.
    let mut last = None;
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        match Nvml::builder().lib_path(OsStr::new(name)).init() {
            Ok(nvml) => return Ok(nvml),
            // Keep the first error that is more than "no such file": a driver that has only
            // libnvidia-ml.so.1 must not have its answer replaced by the missing dev symlink's.
            Err(e) => {
                if !matches!(last, Some(ref kept) if !matches!(kept, NvmlError::LibloadingError(_)))
                {
                    last = Some(e);
                }
            }
        }
    }
    Err(match last {
        Some(NvmlError::LibloadingError(_)) | None => CliError::runtime(
            "no NVML library (libnvidia-ml.so.1) could be loaded: no NVIDIA driver here; in a container, start it with the NVIDIA runtime/CDI, or try the simulated GPU: `gpuslice run --fake-gpu -- gpuslice smi`",
        ),
        Some(NvmlError::DriverNotLoaded) => CliError::runtime(
            "NVML is installed but the NVIDIA driver is not loaded; load the kernel module (nvidia-smi says more)",
        ),
        // What the shim answers every NVML call of a process whose slice configuration is
        // invalid (fail closed); nvml-wrapper's own text for it ("not first initialized with
        // Nvml::init()") reads like a bug in this tool.
        Some(NvmlError::Uninitialized) => CliError::runtime(
            "NVML refused to initialise (NVML_ERROR_UNINITIALIZED): gpuslice refuses every CUDA and NVML call of this process because its slice configuration is invalid; the `[gpuslice]` line above names the file and the field, and `gpuslice check` explains it",
        ),
        Some(e) => CliError::runtime(format!("NVML initialisation failed: {e}")),
    })
}

pub fn query() -> CliResult<Report> {
    let nvml = open_nvml()?;
    let count = nvml
        .device_count()
        .map_err(|e| CliError::runtime(format!("NVML cannot count devices: {e}")))?;
    let mut cards = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| CliError::runtime(format!("NVML cannot open device {index}: {e}")))?;
        let memory = device.memory_info().map_err(|e| {
            CliError::runtime(format!("NVML cannot read memory of device {index}: {e}"))
        })?;
        let processes = device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| CardProcess {
                pid: p.pid,
                used_memory: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        cards.push(Card {
            index,
            name: device.name().unwrap_or_else(|_| {
                // Brand is a cheap fallback some drivers answer when name fails.
                match device.brand() {
                    Ok(Brand::Tesla) => "Tesla".into(),
                    _ => "NVIDIA GPU".into(),
                }
            }),
            uuid: device.uuid().unwrap_or_default(),
            memory_total: memory.total,
            memory_used: memory.used,
            memory_free: memory.free,
            gpu_util: device.utilization_rates().ok().map(|u| u.gpu),
            processes,
        });
    }
    Ok(Report {
        driver_version: nvml.sys_driver_version().ok(),
        cuda_version: nvml.sys_cuda_driver_version().ok(),
        cards,
    })
}

pub fn to_json(report: &Report) -> serde_json::Value {
    json!({
        "driver_version": report.driver_version,
        "cuda_version": report.cuda_version.map(cuda_version_text),
        "devices": report.cards.iter().map(|card| json!({
            "index": card.index,
            "name": card.name,
            "uuid": card.uuid,
            "memory": {"total": card.memory_total, "used": card.memory_used, "free": card.memory_free},
            "utilization_gpu": card.gpu_util,
            "processes": card.processes.iter().map(|p| json!({
                "pid": p.pid, "used_memory": p.used_memory
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

/// The nvidia-smi-like table.
pub fn table(report: &Report) -> String {
    const WIDTH: usize = 79;
    let rule = |c: char| format!("+{}+\n", c.to_string().repeat(WIDTH - 2));
    let row = |text: String| format!("| {text:<width$} |\n", width = WIDTH - 4);
    let mut out = String::new();
    out.push_str(&rule('-'));
    out.push_str(&row(format!(
        "gpuslice smi      Driver Version: {:<14} CUDA Version: {}",
        report.driver_version.as_deref().unwrap_or("?"),
        report.cuda_version.map_or("?".into(), cuda_version_text)
    )));
    out.push_str(&rule('='));
    out.push_str(&row(format!(
        "{:<3} {:<28} {:>22} {:>8}",
        "GPU", "Name", "Memory-Usage", "GPU-Util"
    )));
    out.push_str(&rule('-'));
    for card in &report.cards {
        let usage = format!(
            "{}MiB / {}MiB",
            mib(card.memory_used),
            mib(card.memory_total)
        );
        let util = card.gpu_util.map_or("N/A".into(), |u| format!("{u}%"));
        let name: String = card.name.chars().take(28).collect();
        out.push_str(&row(format!(
            "{:<3} {:<28} {:>22} {:>8}",
            card.index, name, usage, util
        )));
        out.push_str(&row(format!(
            "    {}  free {}",
            card.uuid,
            format_size_approx(card.memory_free)
        )));
    }
    if report.cards.is_empty() {
        out.push_str(&row("No devices found.".into()));
    }
    out.push_str(&rule('-'));
    out.push_str(&row(format!(
        "{:<3} {:>10} {:>20}",
        "GPU", "PID", "GPU Memory Usage"
    )));
    let mut any = false;
    for card in &report.cards {
        for process in &card.processes {
            any = true;
            let used = process
                .used_memory
                .map_or("N/A".into(), |b| format!("{}MiB", mib(b)));
            out.push_str(&row(format!(
                "{:<3} {:>10} {:>20}",
                card.index, process.pid, used
            )));
        }
    }
    if !any {
        out.push_str(&row("No running processes found".into()));
    }
    out.push_str(&rule('-'));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_memory_in_mib_and_processes() {
        let report = Report {
            driver_version: Some("580.65".into()),
            cuda_version: Some(13000),
            cards: vec![Card {
                index: 0,
                name: "Tesla V100-PCIE-32GB".into(),
                uuid: "GPU-1234".into(),
                memory_total: 8 << 30,
                memory_used: 512 << 20,
                memory_free: (8 << 30) - (512 << 20),
                gpu_util: Some(25),
                processes: vec![CardProcess {
                    pid: 42,
                    used_memory: Some(512 << 20),
                }],
            }],
        };
        let text = table(&report);
        assert!(text.contains("512MiB / 8192MiB"), "{text}");
        assert!(text.contains("CUDA Version: 13.0"), "{text}");
        assert!(text.contains("25%"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() == 79), "{text}");
        let json = to_json(&report);
        assert_eq!(json["devices"][0]["memory"]["total"], 8u64 << 30);
        assert_eq!(json["devices"][0]["processes"][0]["pid"], 42);
    }
}
