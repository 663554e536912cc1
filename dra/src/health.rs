//! Device health from NVML: a GPU gone from NVML (`NVML_ERROR_GPU_IS_LOST`, or its UUID no
//! longer found), a critical Xid error or a double-bit ECC error (NVML events) makes the GPU
//! unhealthy. The publisher then taints its devices ([`crate::publish::TAINT_KEY`],
//! NoSchedule: `DRADeviceTaints`, beta in 1.36) so the scheduler places no new claim there,
//! and the plugin streams it to the kubelet's resource-health API
//! ([`crate::plugin::HealthService`]).
//!
//! Event errors stay until the plugin restarts (an Xid means "reset the GPU", which an
//! operator does, restarting the node's plugins with it); a lost GPU that NVML finds again
//! is healthy again. Xids that report an application's own fault (13, 31, 43, 45, 68, 109:
//! a bad kernel, an MMU fault of one process, a context reset) leave the card healthy, as
//! NVIDIA's device plugin does by default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};
use tokio::sync::watch;

use crate::inventory::Gpu;

/// GPU index -> why it is unhealthy (a label value: `gpu-lost`, `xid-79`, `ecc-double-bit`).
pub type Unhealthy = BTreeMap<u32, String>;

/// Xids of an application's own fault: not the card's.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Watches the GPUs through one NVML.
pub struct Monitor<'n> {
    nvml: &'n Nvml,
    gpus: Vec<Gpu>,
    sets: Vec<EventSet<'n>>,
    sticky: Unhealthy,
}

impl<'n> Monitor<'n> {
    /// Registers for Xid and ECC events on every GPU that supports them (one event set per
    /// GPU: a failed registration releases its set).
    pub fn new(nvml: &'n Nvml, gpus: &[Gpu]) -> Monitor<'n> {
        let mut sets = Vec::new();
        for gpu in gpus {
            let registered = nvml.create_event_set().ok().and_then(|set| {
                nvml.device_by_uuid(gpu.uuid.as_str())
                    .ok()?
                    .register_events(
                        EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR,
                        set,
                    )
                    .ok()
            });
            match registered {
                Some(set) => sets.push(set),
                None => eprintln!(
                    "gpuslice-dra: GPU {} ({}): NVML gives no Xid/ECC events; only its \
                     presence is watched",
                    gpu.index, gpu.uuid
                ),
            }
        }
        Monitor {
            nvml,
            gpus: gpus.to_vec(),
            sets,
            sticky: Unhealthy::new(),
        }
    }

    /// The GPUs unhealthy now: the events since the last poll, and each GPU looked up again.
    pub fn poll(&mut self) -> Unhealthy {
        for set in &self.sets {
            while let Ok(event) = set.wait(0) {
                let Ok(uuid) = event.device.uuid() else {
                    continue;
                };
                let Some(gpu) = self.gpus.iter().find(|g| g.uuid == uuid) else {
                    continue;
                };
                let reason = if event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    match event.event_data {
                        Some(XidError::Value(code)) if APPLICATION_XIDS.contains(&code) => None,
                        Some(XidError::Value(code)) => Some(format!("xid-{code}")),
                        _ => Some("xid-unknown".to_string()),
                    }
                } else if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    Some("ecc-double-bit".to_string())
                } else {
                    None
                };
                if let Some(reason) = reason {
                    eprintln!(
                        "gpuslice-dra: GPU {} ({}) is unhealthy: {reason}",
                        gpu.index, gpu.uuid
                    );
                    self.sticky.entry(gpu.index).or_insert(reason);
                }
            }
        }
        let mut now = self.sticky.clone();
        for gpu in &self.gpus {
            let found = self
                .nvml
                .device_by_uuid(gpu.uuid.as_str())
                .and_then(|d| d.memory_info().map(|_| ()));
            if let Err(NvmlError::GpuLost | NvmlError::NotFound) = found {
                now.entry(gpu.index)
                    .or_insert_with(|| "gpu-lost".to_string());
            }
        }
        now
    }
}

/// Watches the GPUs on a thread of its own (NVML's handles are not `Send`), every `period`;
/// the receiver always holds the latest [`Unhealthy`] (changes only are sent).
pub fn spawn(
    lib: Option<&Path>,
    gpus: Vec<Gpu>,
    period: Duration,
) -> Result<watch::Receiver<Unhealthy>, String> {
    let lib: Option<PathBuf> = lib.map(Path::to_path_buf);
    let (tx, rx) = watch::channel(Unhealthy::new());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gpuslice-health".into())
        .spawn(move || {
            let nvml = match &lib {
                Some(lib) => Nvml::builder().lib_path(lib.as_os_str()).init(),
                None => Nvml::init(),
            };
            let nvml = match nvml {
                Ok(nvml) => {
                    let _ = ready_tx.send(Ok(()));
                    nvml
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("health: cannot initialise NVML: {e}")));
                    return;
                }
            };
            let mut monitor = Monitor::new(&nvml, &gpus);
            loop {
                let now = monitor.poll();
                tx.send_if_modified(|current| {
                    let changed = *current != now;
                    *current = now;
                    changed
                });
                if tx.is_closed() {
                    return;
                }
                std::thread::sleep(period);
            }
        })
        .map_err(|e| format!("cannot start the health thread: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the health thread ended at start".to_string())??;
    Ok(rx)
}
