//! The CLI's read-only view of a shared region: what `status` shows, decoupled from the
//! region's in-memory layout so the display and its tests do not care how the shim stores
//! it. `read` is the only place that touches `gpuslice_common::region`.

use std::path::Path;

use gpuslice_common::host_memory::host_entry_device;
use gpuslice_common::region::{DeviceSnapshot, Liveness, Region, RegionSnapshot};

use crate::error::{CliError, CliResult};

/// A published utilisation older than this is left out: the throttle's leader publishes
/// every 50 ms while the slice runs, so an older figure describes a slice that has stopped.
pub const UTILIZATION_FRESH_NS: u64 = 2_000_000_000;

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
    /// The slice's measured utilisation in percent, as the compute throttle last published
    /// it; `None` when never measured or older than [`UTILIZATION_FRESH_NS`].
    pub utilization: Option<f64>,
    /// Bytes one CUDA context costs on the device, as a process of the slice measured it.
    pub context_cost: Option<u64>,
    /// An oversubscribed device: what the slice may place in host memory past `limit`
    /// (`virtual - memory`) and what it has placed there; `None` when it does not
    /// oversubscribe.
    pub host: Option<HostView>,
}

/// The host part of an oversubscribed device (its region companion entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostView {
    pub limit: u64,
    pub used: u64,
}

/// One process slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessView {
    pub pid: u32,
    /// PID as the host/NVML sees it, when known.
    pub host_pid: Option<u32>,
    /// Bytes held per device index, on the card.
    pub used: Vec<(usize, u64)>,
    /// Bytes placed in host memory for oversubscribed devices, all devices together.
    pub host_used: u64,
    pub state: ProcessState,
}

/// Whether a slot's owner still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Alive,
    /// The owner died without releasing its slot; it waits to be reaped.
    Stale,
    /// The owner exited and the driver has released its memory (it lists the host PID no
    /// more): nothing of it counts, though its slot waits for a process of the slice to
    /// reap it.
    Exited,
    /// Could not be judged (the file could not be opened to probe its locks).
    Unknown,
}

impl ProcessState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Alive => "alive",
            ProcessState::Stale => "stale",
            ProcessState::Exited => "exited",
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
    let listed = driver_pids();
    let listed = |host_pid: u32| listed.as_ref().map(|pids| pids.contains(&host_pid));
    Ok(from_snapshot(
        &region.snapshot(),
        monotonic_now_ns(),
        &listed,
    ))
}

/// The host PIDs of every compute process the driver (NVML) lists on any device; `None` when
/// NVML cannot answer (then no stale slot is taken for released).
fn driver_pids() -> Option<std::collections::HashSet<u32>> {
    let nvml = crate::smi::open_nvml_quietly()?;
    let count = nvml.device_count().ok()?;
    let mut pids = std::collections::HashSet::new();
    for index in 0..count {
        let device = nvml.device_by_index(index).ok()?;
        for process in device.running_compute_processes().ok()? {
            pids.insert(process.pid);
        }
    }
    Some(pids)
}

/// CLOCK_MONOTONIC, the clock the shim stamps its measurements with (shared by every
/// container of the host).
fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The display view of a region snapshot taken at `now_ns` (CLOCK_MONOTONIC). `listed` is
/// the driver's word on a host PID (`None`: cannot tell): the bytes of a process that has
/// exited and that the driver lists no more are shown nowhere.
pub fn from_snapshot(
    snapshot: &RegionSnapshot,
    now_ns: u64,
    listed: &dyn Fn(u32) -> Option<bool>,
) -> View {
    let live_bytes = |d: &DeviceSnapshot| {
        d.used_bytes
            .saturating_sub(snapshot.released_bytes(d.id.index(), listed))
    };
    // A device's host bytes are a companion entry of the region: shown with the device.
    let host_entries: Vec<usize> = snapshot
        .devices
        .iter()
        .filter(|d| host_entry_device(&d.uuid).is_some())
        .map(|d| d.id.index())
        .collect();
    let devices = snapshot
        .devices
        .iter()
        .filter(|d| host_entry_device(&d.uuid).is_none())
        .map(|d| DeviceView {
            index: d.id.index(),
            uuid: d.uuid.clone(),
            limit: d.memory_limit,
            used: live_bytes(d),
            compute_percent: d.compute_percent.filter(|p| *p < 100),
            utilization: d
                .measured_utilization
                .filter(|m| now_ns.saturating_sub(m.at_ns) <= UTILIZATION_FRESH_NS)
                .map(|m| f64::from(m.basis_points) / 100.0),
            context_cost: d.context_cost,
            host: snapshot
                .devices
                .iter()
                .find(|h| host_entry_device(&h.uuid) == Some(d.uuid.as_str()))
                .map(|h| HostView {
                    limit: h.memory_limit.unwrap_or(0),
                    used: live_bytes(h),
                }),
        })
        .collect();
    let processes = snapshot
        .processes
        .iter()
        .map(|p| {
            let released = p.exited_and_released(listed);
            ProcessView {
                pid: p.pid,
                host_pid: (p.host_pid != 0).then_some(p.host_pid),
                used: p
                    .used_bytes
                    .iter()
                    .enumerate()
                    .filter(|(index, bytes)| {
                        **bytes > 0 && !released && !host_entries.contains(index)
                    })
                    .map(|(index, bytes)| (index, *bytes))
                    .collect(),
                host_used: if released {
                    0
                } else {
                    host_entries.iter().map(|&i| p.used_bytes[i]).sum()
                },
                state: match p.liveness {
                    _ if released => ProcessState::Exited,
                    Liveness::Alive => ProcessState::Alive,
                    Liveness::Stale => ProcessState::Stale,
                    Liveness::Unknown => ProcessState::Unknown,
                },
            }
        })
        .collect();
    View { devices, processes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::region::{DeviceId, DeviceLimits, MeasuredUtilization, ProcessIdentity};

    #[test]
    fn a_measured_utilisation_is_shown_while_fresh_only() {
        let at_ns = 5_000_000_000;
        let snapshot = RegionSnapshot {
            generation: 1,
            devices: vec![DeviceSnapshot {
                id: DeviceId::from_index(0).unwrap(),
                uuid: "GPU-x".into(),
                memory_limit: None,
                compute_percent: Some(25),
                used_bytes: 0,
                measured_utilization: Some(MeasuredUtilization {
                    basis_points: 2_475,
                    at_ns,
                }),
                context_cost: None,
            }],
            processes: vec![],
        };
        let fresh = from_snapshot(&snapshot, at_ns + UTILIZATION_FRESH_NS, &|_| None);
        assert_eq!(fresh.devices[0].utilization, Some(24.75));
        let stale = from_snapshot(&snapshot, at_ns + UTILIZATION_FRESH_NS + 1, &|_| None);
        assert_eq!(
            stale.devices[0].utilization, None,
            "a stopped slice shows none"
        );
        let never = RegionSnapshot {
            devices: vec![DeviceSnapshot {
                measured_utilization: None,
                ..snapshot.devices[0].clone()
            }],
            ..snapshot
        };
        assert_eq!(
            from_snapshot(&never, at_ns, &|_| None).devices[0].utilization,
            None
        );
    }

    #[test]
    fn a_devices_host_entry_is_shown_with_it_not_as_a_device() {
        let device = |index: usize, uuid: &str, limit: u64, used: u64| DeviceSnapshot {
            id: DeviceId::from_index(index).unwrap(),
            uuid: uuid.into(),
            memory_limit: Some(limit),
            compute_percent: None,
            used_bytes: used,
            measured_utilization: None,
            context_cost: None,
        };
        let snapshot = RegionSnapshot {
            generation: 1,
            devices: vec![
                device(0, "GPU-x", 2 << 30, 1 << 30),
                device(1, "host:GPU-x", 4 << 30, 3 << 30),
            ],
            processes: vec![],
        };
        let view = from_snapshot(&snapshot, 0, &|_| None);
        assert_eq!(view.devices.len(), 1);
        assert_eq!(view.devices[0].uuid, "GPU-x");
        assert_eq!(view.devices[0].used, 1 << 30);
        assert_eq!(
            view.devices[0].host,
            Some(HostView {
                limit: 4 << 30,
                used: 3 << 30
            })
        );
    }

    /// Builds a region with the shim's own API (one device, this process holding 256 MiB) and
    /// reads it back. Runs on a helper thread with a deadline: a region lock that is never
    /// released must fail this test, not hang the suite.
    #[test]
    fn reads_limits_usage_and_live_processes_of_a_real_region() {
        let dir = crate::sandbox::TempDir::new("gpuslice-region-view").unwrap();
        let path = dir.path().join("slice.region");
        let (done, result) = std::sync::mpsc::channel();
        let writer_path = path.clone();
        std::thread::spawn(move || {
            let outcome = (|| -> Result<(Region, DeviceId, View), String> {
                let region = Region::open_or_create(&writer_path).map_err(|e| e.to_string())?;
                let binding = region
                    .bind_devices(&[DeviceLimits {
                        uuid: "GPU-test".into(),
                        memory_limit: Some(1 << 30),
                        compute_percent: Some(25),
                    }])
                    .map_err(|e| e.to_string())?;
                let device: DeviceId = binding.ids[0];
                let identity = ProcessIdentity::current().ok_or("no /proc")?;
                let slot = region.register(&identity).map_err(|e| e.to_string())?;
                region
                    .reserve(slot, device, 256 << 20)
                    .map_err(|e| e.to_string())?;
                let view = read(&writer_path).map_err(|e| e.message)?;
                Ok((region, device, view))
            })();
            let _ = done.send(outcome);
        });
        let (_region, device, view) = result
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the region API did not finish within 10 s (a lock never released?)")
            .expect("building or reading the region failed");
        assert_eq!(view.devices.len(), 1);
        let d = &view.devices[0];
        assert_eq!(
            (d.uuid.as_str(), d.limit, d.used, d.compute_percent),
            ("GPU-test", Some(1 << 30), 256 << 20, Some(25))
        );
        assert_eq!(view.processes.len(), 1);
        let p = &view.processes[0];
        assert_eq!(p.pid, std::process::id());
        assert_eq!(p.used, vec![(device.index(), 256 << 20)]);
        assert_eq!(p.state, ProcessState::Alive);
    }

    #[test]
    fn a_file_that_is_not_a_region_is_invalid_input() {
        let dir = crate::sandbox::TempDir::new("gpuslice-region-bad").unwrap();
        let path = dir.path().join("x.region");
        std::fs::write(&path, b"{}").unwrap();
        let err = read(&path).unwrap_err();
        assert_eq!(err.code, crate::error::EXIT_INVALID);
        assert!(
            err.message.contains("not a gpuslice region"),
            "{}",
            err.message
        );
        let err = read(&dir.path().join("missing")).unwrap_err();
        assert_eq!(err.code, crate::error::EXIT_INVALID);
    }
}
