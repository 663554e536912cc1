//! The configuration's types: a slice, its device limits and policies, and why one was refused.

use std::fmt;
use std::path::PathBuf;

use super::{DEFAULT_REGION_PATH, HAMI_SHARED_CACHE_ENV};
use crate::text::{shorten, MAX_QUOTED};

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
    /// Opt-in oversubscription: the size the slice's processes are told and may allocate, at
    /// least `memory_limit` (which stays the most the card holds for them); what lies past the
    /// physical cap is placed in the container's host memory. `None` = no oversubscription.
    pub virtual_memory: Option<u64>,
}

impl DeviceLimit {
    /// Bytes the slice may place in host memory past its physical cap on this device
    /// (`virtual - memory`); `None` when it does not oversubscribe.
    pub fn host_excess(&self) -> Option<u64> {
        let excess = self.virtual_memory?.checked_sub(self.memory_limit?)?;
        (excess > 0).then_some(excess)
    }
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

/// Which slice gets idle GPU time first under `burst` (the share itself is never changed by
/// it): a low-priority slice yields idle time to busy high-priority ones first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// Takes idle time at once and gives it back last (HAMi `CUDA_TASK_PRIORITY=0`).
    High,
    /// Neither (the default where nothing says otherwise).
    #[default]
    Normal,
    /// Takes idle time only once it has stayed idle, gives it back first
    /// (HAMi `CUDA_TASK_PRIORITY=1`).
    Low,
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
    /// Who gets idle time first under `burst` (`priority`; HAMi `CUDA_TASK_PRIORITY`).
    pub priority: Priority,
    /// Log level from the file or env (`GPUSLICE_LOG`, `LIBCUDA_LOG_LEVEL`).
    pub log_level: Option<LogLevel>,
    /// The most one CUDA context may cost on the slice's cards (`context_overhead`): what a
    /// first context reserves before its cost is measured, and what each context made
    /// alongside others reserves. `None` = the shim's default (512 MiB), or, where no limit
    /// file is anchored, `GPUSLICE_CONTEXT_OVERHEAD`.
    pub context_bound: Option<u64>,
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
    /// One bounded line: the origin and the field are shortened to [`MAX_QUOTED`] bytes, the
    /// problem (which may quote a value from the input) to four times that.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origin = shorten(&self.origin, MAX_QUOTED);
        let problem = shorten(&self.problem, 4 * MAX_QUOTED);
        if self.field.is_empty() {
            write!(f, "invalid configuration {origin}: {problem}")
        } else {
            let field = shorten(&self.field, MAX_QUOTED);
            write!(f, "invalid configuration {origin}: {field}: {problem}")
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

impl ComputePolicy {
    /// The spelling used in the limit file.
    pub fn as_str(self) -> &'static str {
        match self {
            ComputePolicy::Cap => "cap",
            ComputePolicy::Burst => "burst",
            ComputePolicy::Off => "off",
        }
    }

    /// Parses the limit-file spelling (`cap|burst|off`, any case).
    pub fn from_name(name: &str) -> Option<ComputePolicy> {
        match name.trim().to_ascii_lowercase().as_str() {
            "cap" => Some(ComputePolicy::Cap),
            "burst" => Some(ComputePolicy::Burst),
            "off" => Some(ComputePolicy::Off),
            _ => None,
        }
    }
}

impl Priority {
    /// The spelling used in the limit file.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// Parses the limit-file spelling (`high|normal|low`, any case).
    pub fn from_name(name: &str) -> Option<Priority> {
        match name.trim().to_ascii_lowercase().as_str() {
            "high" => Some(Priority::High),
            "normal" => Some(Priority::Normal),
            "low" => Some(Priority::Low),
            _ => None,
        }
    }

    /// HAMi's `CUDA_TASK_PRIORITY`: `0` high, `1` low (HAMi-core's own default is 1).
    pub(crate) fn from_hami(value: &str) -> Option<Priority> {
        match value.trim() {
            "0" => Some(Priority::High),
            "1" => Some(Priority::Low),
            _ => None,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ComputePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }

    /// Parses `off|error|warn|warning|info|debug|trace` (any case).
    pub fn from_name(name: &str) -> Option<LogLevel> {
        match name.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Some(LogLevel::Off),
            "error" => Some(LogLevel::Error),
            "warn" | "warning" => Some(LogLevel::Warn),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            "trace" => Some(LogLevel::Trace),
            _ => None,
        }
    }

    /// HAMi's `LIBCUDA_LOG_LEVEL` numbers (see the module doc), or a level name.
    pub(crate) fn from_hami(value: &str) -> Option<LogLevel> {
        if let Some(level) = LogLevel::from_name(value) {
            return Some(level);
        }
        let number: u32 = value.trim().parse().ok()?;
        Some(match number {
            0 => LogLevel::Error,
            1 | 2 => LogLevel::Warn,
            3 => LogLevel::Info,
            4 => LogLevel::Debug,
            _ => LogLevel::Trace,
        })
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DeviceSelector {
    /// Whether this selector names the device at `index` with `uuid` (UUIDs compare
    /// case-insensitively: drivers print them lower-case, people paste them upper-case).
    pub fn matches(&self, index: u32, uuid: &str) -> bool {
        match self {
            DeviceSelector::Uuid(want) => want.eq_ignore_ascii_case(uuid),
            DeviceSelector::Index(want) => *want == index,
        }
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Uuid(uuid) => write!(f, "uuid {uuid}"),
            DeviceSelector::Index(index) => write!(f, "index {index}"),
        }
    }
}

impl SliceConfig {
    /// The limit that applies to the device at `index` with `uuid`: an entry naming the UUID
    /// wins over one naming the index (indices reorder with `CUDA_VISIBLE_DEVICES`, UUIDs do
    /// not). `None` = this device is not limited.
    pub fn limit_for(&self, index: u32, uuid: &str) -> Option<&DeviceLimit> {
        let by_uuid = self.devices.iter().find(|limit| {
            matches!(&limit.selector, DeviceSelector::Uuid(want) if want.eq_ignore_ascii_case(uuid))
        });
        by_uuid.or_else(|| {
            self.devices
                .iter()
                .find(|limit| limit.selector == DeviceSelector::Index(index))
        })
    }
}

impl ConfigError {
    pub(super) fn new(
        origin: impl Into<String>,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        ConfigError {
            origin: origin.into(),
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl SliceConfig {
    /// The region path this configuration means: its own, else [`DEFAULT_REGION_PATH`].
    pub fn region_or_default(&self) -> PathBuf {
        self.region_path
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_REGION_PATH))
    }

    /// (origin, field) naming where the region path is set, for messages about the region:
    /// the limit file and `region`, or the HAMi variable; "(not set; default ...)" when the
    /// default applies.
    pub fn region_source(&self) -> (String, String) {
        let origin = match &self.source {
            ConfigSource::File(path) => path.display().to_string(),
            ConfigSource::Env => "HAMi env".to_string(),
        };
        let field = match &self.source {
            ConfigSource::File(_) => "region",
            ConfigSource::Env => HAMI_SHARED_CACHE_ENV,
        };
        let field = match self.region_path {
            Some(_) => field.to_string(),
            None => format!("{field} (not set; default {DEFAULT_REGION_PATH})"),
        };
        (origin, field)
    }
}
