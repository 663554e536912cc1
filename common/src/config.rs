//! The limit-file contract: what a slice is (per-device memory cap and compute share, the
//! shared-region path, the compute policy) and where it comes from.
//!
//! Sources, in order: the limit file (`GPUSLICE_CONFIG`, default `/etc/gpuslice/limits.json`);
//! when no file exists, HAMi-compatible env (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, ...). The file
//! wins because a tenant can change env but not a read-only mounted file. A file that exists
//! but is malformed fails closed (`Loaded::Invalid`); nothing at all is `Loaded::Unconfigured`
//! (pure pass-through).
//!
//! INTERFACE PINNED FOR PARALLEL WORK: the types and `load` signature below are used by the
//! shim and the CLI. Implementation is filled in by the config work.

use std::fmt;
use std::path::PathBuf;

/// Default location of the limit file inside a container.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpuslice/limits.json";
/// Env variable that overrides the limit-file path.
pub const CONFIG_ENV: &str = "GPUSLICE_CONFIG";
/// Current schema version written by `gpuslice write`.
pub const SCHEMA_VERSION: u32 = 1;

/// How a limit names a device: by UUID (stable across index reordering), or by index as
/// the fallback HAMi's env uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    Uuid(String),
    Index(u32),
}

/// The limits for one device of the slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimit {
    pub selector: DeviceSelector,
    /// Hard memory cap in bytes; `None` = memory not limited on this device.
    pub memory_limit: Option<u64>,
    /// Compute share in percent (1..=100); `None` or 100 = not throttled.
    pub compute_percent: Option<u32>,
}

/// What the throttle does with the compute share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputePolicy {
    /// Never above the share in steady state (HAMi `force`, and the default).
    #[default]
    Cap,
    /// Work-conserving: may use idle GPU time, gives it back when a neighbour wants it.
    Burst,
    /// No compute throttling at all (HAMi `disable`).
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    Off,
    #[default]
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Where a configuration came from (for messages and `gpuslice check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    File(PathBuf),
    Env,
}

/// A valid slice configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceConfig {
    pub source: ConfigSource,
    pub devices: Vec<DeviceLimit>,
    /// Path of the shared region file (all processes of the slice); `None` = a default
    /// derived by the shim.
    pub region_path: Option<PathBuf>,
    pub policy: ComputePolicy,
    /// Log level from the file or env (`GPUSLICE_LOG`, `LIBCUDA_LOG_LEVEL`).
    pub log_level: Option<LogLevel>,
}

/// Why a configuration was refused. Display is the one line users see:
/// `invalid limit file /etc/gpuslice/limits.json: devices[0].memory: "8XB" is not a size ...`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file path, or the env variable name, that holds the problem.
    pub origin: String,
    /// The field within it (`devices[0].memory`), empty when the whole origin is at fault.
    pub field: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "invalid configuration {}: {}", self.origin, self.problem)
        } else {
            write!(
                f,
                "invalid configuration {}: {}: {}",
                self.origin, self.field, self.problem
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// The outcome of looking for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// No file and no HAMi env: the shim passes everything through.
    Unconfigured,
    Configured(SliceConfig),
    /// Fail closed: CUDA entry points refuse with CUDA_ERROR_NOT_INITIALIZED.
    Invalid(ConfigError),
}
