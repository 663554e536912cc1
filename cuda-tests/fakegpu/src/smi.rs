//! `fakegpu smi`: the host administrator's view of the simulated GPU, what the real
//! `nvidia-smi` on the host shows. Unlike NVML inside a container it is never sliced and
//! never translated: real PIDs, physical memory, whole-device utilisation.
//!
//! JSON schema (`fakegpu smi --json`), one object:
//! ```text
//! {"devices": [{"index": u32, "name": str, "uuid": str,
//!               "memory_total": bytes, "memory_used": bytes, "utilization_gpu": percent,
//!               "processes": [{"pid": real pid, "used_memory": bytes}]}]}
//! ```
//! `memory_used` is memory allocated by processes (allocations + context overhead), i.e.
//! nvmlDeviceGetMemoryInfo_v2's `used`: the driver reservation
//! ([`crate::nvml_view::RESERVED_MEMORY_BYTES`]) is not in it. `utilization_gpu` is over the
//! NVML sampling window (`FAKEGPU_UTIL_WINDOW_MS`, default 1000 ms). Processes are sorted by
//! PID; dead processes are reaped before reading.

use fakegpu::nvml_view;
use fakegpu::SharedState;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiProcess {
    pub pid: u32,
    pub used_memory: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total: u64,
    pub memory_used: u64,
    pub utilization_gpu: u32,
    pub processes: Vec<SmiProcess>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiReport {
    pub devices: Vec<SmiDevice>,
}

/// Reads one consistent-enough snapshot (each device's numbers are read back to back; the
/// state is live, so two devices are not read at the same instant).
pub fn snapshot(state: &SharedState) -> SmiReport {
    // The driver frees a dead process's memory when it learns of the death (after the
    // release delay, if any); here the observer reaps.
    state.reap_dead_processes();
    let devices = (0..state.device_count())
        .filter_map(|index| {
            let spec = state.device(index)?;
            let mut processes: Vec<SmiProcess> = state
                .processes(index)
                .into_iter()
                .map(|p| SmiProcess {
                    pid: p.pid,
                    used_memory: p.used_memory,
                })
                .collect();
            processes.sort_by_key(|p| p.pid);
            Some(SmiDevice {
                index,
                memory_total: spec.total_memory,
                memory_used: state.used_memory(index),
                utilization_gpu: nvml_view::device_utilization(state, index),
                name: spec.name,
                uuid: spec.uuid,
                processes,
            })
        })
        .collect();
    SmiReport { devices }
}

pub fn to_json(report: &SmiReport) -> String {
    serde_json::to_string_pretty(report).expect("plain structs always serialise")
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

/// The process name the host sees, from /proc (the fake keeps only PIDs).
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// nvidia-smi's default table, reduced to what the fake models.
pub fn render_table(report: &SmiReport) -> String {
    let cuda = nvml_view::cuda_driver_version();
    let rule = format!("+{}+", "-".repeat(88));
    let mut out = String::new();
    out.push_str(&rule);
    out.push('\n');
    out.push_str(&format!(
        "| {:<86} |\n",
        format!(
            "FAKEGPU-SMI (simulated)   Driver Version: {}   CUDA Version: {}.{}",
            nvml_view::driver_version_string(cuda),
            cuda / 1000,
            (cuda % 1000) / 10
        )
    ));
    out.push_str(&format!(
        "|{}+{}+{}|\n",
        "-".repeat(41),
        "-".repeat(24),
        "-".repeat(21)
    ));
    out.push_str(&format!(
        "| {:<39} | {:>22} | {:>19} |\n",
        "GPU  Name", "Memory-Usage", "GPU-Util"
    ));
    out.push_str(&format!(
        "|{}+{}+{}|\n",
        "=".repeat(41),
        "=".repeat(24),
        "=".repeat(21)
    ));
    for d in &report.devices {
        let name: String = d.name.chars().take(34).collect();
        out.push_str(&format!(
            "| {:>3}  {:<34} | {:>22} | {:>18}% |\n",
            d.index,
            name,
            format!("{}MiB / {}MiB", mib(d.memory_used), mib(d.memory_total)),
            d.utilization_gpu
        ));
        out.push_str(&format!("| {:<86} |\n", format!("     {}", d.uuid)));
        out.push_str(&rule);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    out.push_str(&format!("| {:<86} |\n", "Processes:"));
    out.push_str(&format!(
        "| {:>4} {:>10}  {:<50} {:>18} |\n",
        "GPU", "PID", "Process name", "GPU Memory Usage"
    ));
    out.push_str(&format!("|{}|\n", "=".repeat(88)));
    let mut any = false;
    for d in &report.devices {
        for p in &d.processes {
            any = true;
            let name: String = process_name(p.pid).chars().take(50).collect();
            out.push_str(&format!(
                "| {:>4} {:>10}  {:<50} {:>18} |\n",
                d.index,
                p.pid,
                name,
                format!("{}MiB", mib(p.used_memory))
            ));
        }
    }
    if !any {
        out.push_str(&format!("| {:<86} |\n", " No running processes found"));
    }
    out.push_str(&rule);
    out.push('\n');
    out
}
