//! The driver's truth: every card's memory, utilisation and per-process usage from NVML
//! (`libnvidia-ml.so.1`, loaded at run time through `nvml-wrapper`, so the agent starts and
//! reports on a node without a driver). The agent never loads the shim, so these are the
//! driver's own numbers.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::ffi::OsStr;

/// One card as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    pub index: u32,
    pub uuid: String,
    pub total: u64,
    pub used: u64,
    pub free: u64,
    /// Percent of time a kernel ran over the driver's last sample period.
    pub utilization: Option<u32>,
    /// Compute processes: (host PID, bytes; `None` where the driver cannot say).
    pub processes: Vec<(u32, Option<u64>)>,
}

/// NVML, opened on first use and again after a failure.
#[derive(Default)]
pub struct Driver {
    nvml: Option<Nvml>,
}

impl Driver {
    /// Every card, or why none can be read (no library, driver not loaded, ...).
    pub fn cards(&mut self) -> Result<Vec<Card>, String> {
        if self.nvml.is_none() {
            self.nvml = Some(open()?);
        }
        let nvml = self.nvml.as_ref().expect("opened above");
        let result = read_cards(nvml);
        if result.is_err() {
            // Start afresh next time (a driver reload invalidates the handles).
            self.nvml = None;
        }
        result
    }
}

fn open() -> Result<Nvml, String> {
    let mut errors = Vec::new();
    // Drivers ship libnvidia-ml.so.1; the unversioned name exists only with dev packages.
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        match Nvml::builder().lib_path(OsStr::new(name)).init() {
            Ok(nvml) => return Ok(nvml),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(format!("NVML unavailable ({})", errors.join("; ")))
}

fn read_cards(nvml: &Nvml) -> Result<Vec<Card>, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML cannot count devices: {e}"))?;
    let mut cards = Vec::with_capacity(count as usize);
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML cannot open device {index}: {e}"))?;
        let memory = device
            .memory_info()
            .map_err(|e| format!("NVML cannot read memory of device {index}: {e}"))?;
        let processes = device
            .running_compute_processes()
            .map_err(|e| format!("NVML cannot list processes of device {index}: {e}"))?
            .into_iter()
            .map(|p| {
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                };
                (p.pid, bytes)
            })
            .collect();
        cards.push(Card {
            index,
            uuid: device.uuid().unwrap_or_default(),
            total: memory.total,
            used: memory.used,
            free: memory.free,
            utilization: device.utilization_rates().ok().map(|u| u.gpu),
            processes,
        });
    }
    Ok(cards)
}
