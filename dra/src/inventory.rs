//! The node's GPUs as the driver publishes and prepares them, read from NVML.

use std::path::Path;

use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    /// `GPU-xxxxxxxx-...` as NVML (and nvidia-smi -L) spell it.
    pub uuid: String,
    /// Product name, e.g. `Tesla V100-PCIE-32GB`.
    pub name: String,
    /// Total memory in bytes (NVML's `total`).
    pub memory_bytes: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Kernel driver version string, e.g. `580.65.06`.
    pub driver_version: String,
    /// CUDA driver API version (major, minor), e.g. (13, 0).
    pub cuda_driver_version: (u32, u32),
    /// Whether the operator offers this GPU's devices oversubscribed (`--oversubscribe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversubscription: Option<crate::model::Oversubscription>,
}

/// Reads every GPU from NVML (`lib`: the libnvidia-ml.so to load; default: the system's).
pub fn from_nvml(lib: Option<&Path>) -> Result<Vec<Gpu>, String> {
    let nvml = match lib {
        Some(lib) => Nvml::builder().lib_path(lib.as_os_str()).init(),
        None => Nvml::init(),
    }
    .map_err(|e| match lib {
        Some(lib) => format!("cannot initialise NVML from {}: {e}", lib.display()),
        None => format!("cannot initialise NVML (libnvidia-ml.so.1): {e}"),
    })?;
    let driver_version = nvml
        .sys_driver_version()
        .map_err(|e| format!("NVML: driver version: {e}"))?;
    let cuda = nvml
        .sys_cuda_driver_version()
        .map_err(|e| format!("NVML: CUDA driver version: {e}"))?;
    let cuda_driver_version = ((cuda / 1000) as u32, ((cuda % 1000) / 10) as u32);
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML: device count: {e}"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let what = |field: &str, e: nvml_wrapper::error::NvmlError| {
            format!("NVML: GPU {index}: {field}: {e}")
        };
        let device = nvml.device_by_index(index).map_err(|e| what("open", e))?;
        let cc = device
            .cuda_compute_capability()
            .map_err(|e| what("compute capability", e))?;
        gpus.push(Gpu {
            index,
            uuid: device.uuid().map_err(|e| what("UUID", e))?,
            name: device.name().map_err(|e| what("name", e))?,
            memory_bytes: device.memory_info().map_err(|e| what("memory", e))?.total,
            compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
            driver_version: driver_version.clone(),
            cuda_driver_version,
            oversubscription: None,
        });
    }
    Ok(gpus)
}
