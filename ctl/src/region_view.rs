//! The CLI's read-only view of a shared region: what `status` shows, decoupled from the
//! region's in-memory layout so the display and its tests do not care how the shim stores
//! it. `read` is the only place that touches `gpuslice_common::region`.

use std::path::Path;

use gpuslice_common::region::{Liveness, Region, RegionSnapshot};

use crate::error::{CliError, CliResult};

/// One device entry of the slice.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceView {
    pub index: usize,
    pub uuid: String,
    /// `None` = no memory cap.
    pub limit: Option<u64>,
    pub used: u64,
    /// Target compute share in percent; `None` = not throttled.
    pub compute_percent: Option<u32>,
    /// Measured utilisation in percent, when the region records it.
    pub utilization: Option<f64>,
}

/// One process slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessView {
    pub pid: u32,
    /// PID as the host/NVML sees it, when known.
    pub host_pid: Option<u32>,
    /// Bytes held per device index.
    pub used: Vec<(usize, u64)>,
    pub state: ProcessState,
}

/// Whether a slot's owner still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Alive,
    /// The owner died without releasing its slot; it waits to be reaped.
    Stale,
    /// Could not be judged (the file could not be opened to probe its locks).
    Unknown,
}

impl ProcessState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Alive => "alive",
            ProcessState::Stale => "stale",
            ProcessState::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

/// Opens the region read-only (no root, no GPU needed) and takes one consistent-enough
/// snapshot. A missing or unreadable file, or one that is not a gpuslice region, is invalid
/// input (exit 3).
pub fn read(path: &Path) -> CliResult<View> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| {
        CliError::invalid(format!(
            "cannot read region {shown} ({e}); check the path (`gpuslice run` prints it) and its permissions"
        ))
    })?;
    if !meta.is_file() {
        return Err(CliError::invalid(format!(
            "region {shown} is not a regular file"
        )));
    }
    std::fs::File::open(path).map_err(|e| {
        CliError::invalid(format!(
            "cannot open region {shown} ({e}); check its permissions"
        ))
    })?;
    snapshot(path)
}

fn snapshot(path: &Path) -> CliResult<View> {
    let region = Region::open_existing(path).map_err(|e| {
        CliError::invalid(format!(
            "{e} (is {} the region `gpuslice run` printed, or the limit file's \"region\"?)",
            path.display()
        ))
    })?;
    Ok(from_snapshot(&region.snapshot()))
}

/// The display view of a region snapshot.
pub fn from_snapshot(snapshot: &RegionSnapshot) -> View {
    let devices = snapshot
        .devices
        .iter()
        .map(|d| DeviceView {
            index: d.id.index(),
            uuid: d.uuid.clone(),
            limit: d.memory_limit,
            used: d.used_bytes,
            compute_percent: d.compute_percent.filter(|p| *p < 100),
            // The region has no measured utilisation yet (the throttle's words will carry it).
            utilization: None,
        })
        .collect();
    let processes = snapshot
        .processes
        .iter()
        .map(|p| ProcessView {
            pid: p.pid,
            host_pid: (p.host_pid != 0).then_some(p.host_pid),
            used: p
                .used_bytes
                .iter()
                .enumerate()
                .filter(|(_, bytes)| **bytes > 0)
                .map(|(index, bytes)| (index, *bytes))
                .collect(),
            state: match p.liveness {
                Liveness::Alive => ProcessState::Alive,
                Liveness::Stale => ProcessState::Stale,
                Liveness::Unknown => ProcessState::Unknown,
            },
        })
        .collect();
    View { devices, processes }
}
