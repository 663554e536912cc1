//! The limit-file contract: what a slice is (per-device memory cap and compute share, the
//! shared-region path, the compute policy) and where it comes from.
//!
//! Sources, in order:
//! 1. the **anchored** limit file [`DEFAULT_CONFIG_PATH`] (`/etc/gpuslice/limits.json`, compiled
//!    in). When it exists, it is the whole configuration: nothing in the environment can select
//!    another file (`GPUSLICE_CONFIG` is ignored) or change what is enforced (the HAMi
//!    variables are ignored); each ignored variable that is set becomes a warning
//!    ([`LoadOutcome::warnings`]). A tenant can set any variable but cannot replace a
//!    read-only mounted file, so only this rule makes the operator's file win.
//! 2. where no anchored file exists (a developer's machine, `gpuslice run`): the file named by
//!    `GPUSLICE_CONFIG`;
//! 3. else HAMi-compatible env (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, ...).
//!
//! A file that exists but is malformed fails closed (`Loaded::Invalid`); nothing at all is
//! `Loaded::Unconfigured` (pure pass-through). A limit file larger than [`MAX_FILE_BYTES`] or
//! with more than [`MAX_DEVICE_ENTRIES`] device entries is malformed; parsing is linear in
//! the file's size.
//!
//! The types below are shared by the shim and the CLI (and a limit file written by one
//! version is read by another): add items, never rename or remove them.
//!
//! ## Limit file (schema version 1)
//! ```json
//! {"version": 1,
//!  "region": "/var/run/gpuslice/slice-a.region",
//!  "policy": "cap",
//!  "priority": "normal",
//!  "log": "error",
//!  "devices": [
//!     {"uuid": "GPU-8a5d...", "memory": "8GiB", "compute": 25},
//!     {"index": 1, "memory": 17179869184}
//!  ]}
//! ```
//! `version` and `devices` are required (`devices` may be empty); `region` must be an
//! absolute path (a relative one would differ per process working directory and split the
//! slice); `policy` is `cap|burst|off` (default `cap`); `priority` is `high|normal|low` (default
//! `normal`: who gets idle time first under `burst`); `log` is `off|error|warn|info|debug|trace`.
//! Each device names exactly one of `uuid` or `index` (0..=15), and may give `memory` (size
//! string or integer bytes, not 0) and `compute` (1..=100). A `uuid` is spelled as
//! `nvidia-smi -L` prints it: `GPU-` and 32 hex digits grouped 8-4-4-4-12, or a MIG device's
//! `MIG-<same grouping>` / `MIG-GPU-<uuid>/<gi>/<ci>` (any case); anything else is a syntax
//! error, so a truncated or prefix-less UUID cannot be accepted. `region` is at most
//! `PATH_MAX - 1` bytes with no component over `NAME_MAX` (255) bytes. Unknown fields,
//! duplicate keys and duplicate selectors are errors: a typo must never quietly mean
//! "unlimited". An entry that is well formed but names no device of the node is refused by
//! the shim and by `gpuslice check` once they know the devices (see [`crate::visible`]).
//!
//! ## HAMi env (fallback when no file exists)
//! * `CUDA_DEVICE_MEMORY_LIMIT` is the default for every device; HAMi's un-indexed limit is
//!   turned into one `Index` entry for each of the first [`MAX_DEVICES`] (16) indices, because
//!   the pinned types have no wildcard selector. `CUDA_DEVICE_MEMORY_LIMIT_<i>` overrides index
//!   `i`. Values use the size grammar of [`crate::size`] ("3000m", "8g", bytes); `0` means
//!   unlimited, as in HAMi.
//! * `CUDA_DEVICE_SM_LIMIT[_<i>]`: percent, same default/override rule; `0` and `100` mean not
//!   throttled (HAMi's meaning), above 100 is an error.
//! * `CUDA_DEVICE_MEMORY_SHARED_CACHE`: the region path (absolute).
//! * `GPU_CORE_UTILIZATION_POLICY`: `default` and `force` -> `Cap` (HAMi's default already caps),
//!   `disable` -> `Off`.
//! * `CUDA_TASK_PRIORITY`: `0` -> `High`, `1` -> `Low` (unset: `Normal`). It orders who gets
//!   idle time under `burst`, which only a limit file selects: with HAMi's policies it is
//!   accepted and has no effect.
//! * `LIBCUDA_LOG_LEVEL`: HAMi's 0..4 -> `0` Error, `1`/`2` Warn, `3` Info, `4` Debug, `5+` Trace
//!   (HAMi has no "off": it always prints errors); level names are accepted too.
//!
//! A variable set to the empty string counts as unset (Kubernetes manifests often render
//! missing values that way). A set variable with a bad value is `Loaded::Invalid` naming the
//! variable, never ignored.
//!
//! ## Log level precedence
//! `GPUSLICE_LOG` (names only) over the file's `log` over `LIBCUDA_LOG_LEVEL`. The log level
//! is the one input a tenant keeps under an anchored file: it changes what is printed, never
//! what is enforced.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::size::{format_size, parse_size};
use crate::text::{shorten, MAX_QUOTED};
pub use crate::MAX_DEVICES;

/// The anchored limit file: its location is compiled in, so no input of the tenant's can move
/// it. When it exists it wins over every environment variable (see the module doc).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpuslice/limits.json";
/// Env variable naming the limit file where no anchored file exists.
pub const CONFIG_ENV: &str = "GPUSLICE_CONFIG";
/// Largest limit file read: far above any real one (a few hundred bytes per device), small
/// enough that every process's first CUDA call parses it in well under a millisecond.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Most device entries in one limit file: a node has at most a few dozen GPUs and MIG
/// devices, and an entry naming no device of the node is refused anyway.
pub const MAX_DEVICE_ENTRIES: usize = 128;
/// Longest region path (Linux `PATH_MAX` less its NUL) and longest component (`NAME_MAX`).
pub const MAX_REGION_PATH: usize = 4095;
pub const MAX_REGION_NAME: usize = 255;
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

/// Env variable that overrides the log level (names only: off|error|warn|info|debug|trace).
pub const LOG_ENV: &str = "GPUSLICE_LOG";
/// HAMi: default memory limit for every device (`_<i>` suffix: one device index).
pub const HAMI_MEMORY_LIMIT_ENV: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// HAMi: default compute share in percent (`_<i>` suffix: one device index).
pub const HAMI_SM_LIMIT_ENV: &str = "CUDA_DEVICE_SM_LIMIT";
/// HAMi: shared-region path.
pub const HAMI_SHARED_CACHE_ENV: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi: compute policy (`default|force|disable`).
pub const HAMI_POLICY_ENV: &str = "GPU_CORE_UTILIZATION_POLICY";
/// HAMi: task priority (`0` high, `1` low).
pub const HAMI_PRIORITY_ENV: &str = "CUDA_TASK_PRIORITY";
/// HAMi: log level 0..4.
pub const HAMI_LOG_LEVEL_ENV: &str = "LIBCUDA_LOG_LEVEL";
/// Longest UUID the region header can store (it keeps a NUL-terminated `[u8; 64]`).
pub const MAX_UUID_LEN: usize = 63;

const TOP_LEVEL_FIELDS: [&str; 6] = ["version", "region", "policy", "priority", "log", "devices"];
const DEVICE_FIELDS: [&str; 4] = ["uuid", "index", "memory", "compute"];

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
    pub fn from_hami(value: &str) -> Option<Priority> {
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
    pub fn from_hami(value: &str) -> Option<LogLevel> {
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
    fn new(
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

/// Parses a limit file's text. `path_for_messages` only labels errors and becomes
/// `ConfigSource::File`; nothing is read from it.
pub fn parse_limit_file(path_for_messages: &Path, text: &str) -> Result<SliceConfig, ConfigError> {
    let origin = path_for_messages.display().to_string();
    let fail = |field: &str, problem: String| ConfigError::new(origin.clone(), field, problem);
    if text.len() > MAX_FILE_BYTES {
        return Err(fail("", too_large(text.len() as u64)));
    }

    let value = serde_json::from_str::<strict_json::StrictValue>(text)
        .map_err(|e| {
            let hint = if text.trim().is_empty() {
                " (the file is empty)"
            } else {
                ""
            };
            fail("", format!("not valid JSON{hint}: {e}"))
        })?
        .0;
    let Value::Object(top) = value else {
        return Err(fail(
            "",
            format!(
                "the top level must be a JSON object like {{\"version\": {SCHEMA_VERSION}, \"devices\": [...]}}, found {}",
                json_kind(&value)
            ),
        ));
    };

    // Version first: a newer file may carry fields this reader has never heard of, and the
    // useful message then is about the version, not the field.
    match top.get("version") {
        None => {
            return Err(fail(
                "version",
                format!(
                    "missing; this gpuslice reads limit files with \"version\": {SCHEMA_VERSION}"
                ),
            ))
        }
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {}
        Some(other) => {
            return Err(fail(
                "version",
                format!(
                    "unsupported version {other}; this gpuslice reads version {SCHEMA_VERSION}"
                ),
            ))
        }
    }
    reject_unknown_fields(&top, &TOP_LEVEL_FIELDS, "").map_err(|(f, p)| fail(&f, p))?;

    let region_path = match top.get("region") {
        None => None,
        Some(value) => Some(parse_region_path(value).map_err(|p| fail("region", p))?),
    };
    let policy = match top.get("policy") {
        None => ComputePolicy::default(),
        Some(Value::String(name)) => ComputePolicy::from_name(name).ok_or_else(|| {
            fail(
                "policy",
                format!("{name:?} is not a policy; use \"cap\", \"burst\" or \"off\""),
            )
        })?,
        Some(other) => {
            return Err(fail(
                "policy",
                format!(
                    "expected a string (\"cap\", \"burst\" or \"off\"), found {}",
                    json_kind(other)
                ),
            ))
        }
    };
    let priority = match top.get("priority") {
        None => Priority::default(),
        Some(Value::String(name)) => Priority::from_name(name).ok_or_else(|| {
            fail(
                "priority",
                format!("{name:?} is not a priority; use \"high\", \"normal\" or \"low\""),
            )
        })?,
        Some(other) => {
            return Err(fail(
                "priority",
                format!(
                    "expected a string (\"high\", \"normal\" or \"low\"), found {}",
                    json_kind(other)
                ),
            ))
        }
    };
    let log_level = match top.get("log") {
        None => None,
        Some(Value::String(name)) => Some(LogLevel::from_name(name).ok_or_else(|| {
            fail(
                "log",
                format!("{name:?} is not a log level; use off, error, warn, info, debug or trace"),
            )
        })?),
        Some(other) => {
            return Err(fail(
                "log",
                format!(
                    "expected a string such as \"error\", found {}",
                    json_kind(other)
                ),
            ))
        }
    };
    let devices = match top.get("devices") {
        None => {
            return Err(fail(
                "devices",
                "missing; list the limited devices, or [] for none".to_string(),
            ))
        }
        Some(Value::Array(entries)) if entries.len() > MAX_DEVICE_ENTRIES => {
            return Err(fail(
                "devices",
                format!(
                    "{} entries; at most {MAX_DEVICE_ENTRIES} are supported (list only the devices of this node)",
                    entries.len()
                ),
            ))
        }
        Some(Value::Array(entries)) => parse_devices(entries).map_err(|(f, p)| fail(&f, p))?,
        Some(other) => {
            return Err(fail(
                "devices",
                format!(
                    "expected a list [...] of devices, found {}",
                    json_kind(other)
                ),
            ))
        }
    };

    Ok(SliceConfig {
        source: ConfigSource::File(path_for_messages.to_path_buf()),
        devices,
        region_path,
        policy,
        priority,
        log_level,
    })
}

/// A field-located problem: (`devices[0].memory`, sentence).
type FieldProblem = (String, String);

fn reject_unknown_fields(
    object: &Map<String, Value>,
    known: &[&str],
    prefix: &str,
) -> Result<(), FieldProblem> {
    // Sorted so the message does not depend on map order.
    let mut unknown: Vec<&String> = object
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(name) => Err((
            format!("{prefix}{name}"),
            format!(
                "unknown field {name:?} (known fields: {}); a misspelt limit must not silently mean unlimited",
                known.join(", ")
            ),
        )),
    }
}

fn parse_region_path(value: &Value) -> Result<PathBuf, String> {
    match value {
        Value::String(path) => check_region_path(path),
        other => Err(format!(
            "expected a path string, found {}",
            json_kind(other)
        )),
    }
}

fn check_region_path(path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err("is empty; omit it to let the shim choose, or give an absolute path".into());
    }
    let quoted = || shorten(path, MAX_QUOTED).into_owned();
    if !path.starts_with('/') {
        return Err(format!(
            "{:?} is relative; it must be absolute so every process of the slice opens the same file",
            quoted()
        ));
    }
    if path.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if path.len() > MAX_REGION_PATH {
        return Err(format!(
            "{:?} is {} bytes; Linux paths have at most {MAX_REGION_PATH}",
            quoted(),
            path.len()
        ));
    }
    if let Some(name) = path.split('/').find(|name| name.len() > MAX_REGION_NAME) {
        return Err(format!(
            "{:?}: the name {:?} is {} bytes; file systems allow at most {MAX_REGION_NAME}",
            quoted(),
            shorten(name, 64),
            name.len()
        ));
    }
    Ok(PathBuf::from(path))
}

fn too_large(bytes: u64) -> String {
    format!(
        "is {bytes} bytes; a limit file has at most {MAX_FILE_BYTES} bytes (1 MiB): list only the devices of this node"
    )
}

fn parse_devices(entries: &[Value]) -> Result<Vec<DeviceLimit>, FieldProblem> {
    let mut devices: Vec<DeviceLimit> = Vec::with_capacity(entries.len());
    // Selector -> position of its entry: one hash lookup per entry keeps parsing linear.
    let mut seen: HashMap<SelectorKey, usize> = HashMap::with_capacity(entries.len());
    for (position, entry) in entries.iter().enumerate() {
        let prefix = format!("devices[{position}]");
        let limit = parse_device(entry, &prefix)?;
        if let Some(first) = seen.insert(selector_key(&limit.selector), position) {
            return Err((
                prefix,
                format!(
                    "{} is already limited by devices[{first}]; give each device once",
                    limit.selector
                ),
            ));
        }
        devices.push(limit);
    }
    Ok(devices)
}

/// A selector as equality sees it: UUIDs compare case-insensitively.
#[derive(Hash, PartialEq, Eq)]
enum SelectorKey {
    Uuid(String),
    Index(u32),
}

fn selector_key(selector: &DeviceSelector) -> SelectorKey {
    match selector {
        DeviceSelector::Uuid(uuid) => SelectorKey::Uuid(uuid.to_ascii_lowercase()),
        DeviceSelector::Index(index) => SelectorKey::Index(*index),
    }
}

#[cfg(test)]
fn same_selector(a: &DeviceSelector, b: &DeviceSelector) -> bool {
    selector_key(a) == selector_key(b)
}

fn parse_device(entry: &Value, prefix: &str) -> Result<DeviceLimit, FieldProblem> {
    let at = |field: &str| format!("{prefix}.{field}");
    let Value::Object(fields) = entry else {
        return Err((
            prefix.to_string(),
            format!(
                "expected an object like {{\"uuid\": \"GPU-...\", \"memory\": \"8GiB\"}}, found {}",
                json_kind(entry)
            ),
        ));
    };
    reject_unknown_fields(fields, &DEVICE_FIELDS, &format!("{prefix}."))?;

    let selector = match (fields.get("uuid"), fields.get("index")) {
        (Some(_), Some(_)) => {
            return Err((
                prefix.to_string(),
                "gives both \"uuid\" and \"index\"; name the device by one of them".into(),
            ))
        }
        (None, None) => {
            return Err((
                prefix.to_string(),
                "names no device; add \"uuid\": \"GPU-...\" (preferred) or \"index\": N".into(),
            ))
        }
        (Some(uuid), None) => DeviceSelector::Uuid(parse_uuid(uuid).map_err(|p| (at("uuid"), p))?),
        (None, Some(index)) => {
            DeviceSelector::Index(parse_index(index).map_err(|p| (at("index"), p))?)
        }
    };
    let memory_limit = match fields.get("memory") {
        None => None,
        Some(value) => Some(parse_memory(value).map_err(|p| (at("memory"), p))?),
    };
    let compute_percent = match fields.get("compute") {
        None => None,
        Some(value) => Some(parse_compute(value).map_err(|p| (at("compute"), p))?),
    };
    Ok(DeviceLimit {
        selector,
        memory_limit,
        compute_percent,
    })
}

fn parse_uuid(value: &Value) -> Result<String, String> {
    let Value::String(uuid) = value else {
        return Err(format!(
            "expected a string like \"GPU-8a5d...\", found {}",
            json_kind(value)
        ));
    };
    check_uuid(uuid)
}

/// A device UUID as `nvidia-smi -L` spells it (see the module doc), trimmed; `Err` says what
/// is wrong with it. Shared with the CLI's `--device` parsing.
pub fn check_uuid(uuid: &str) -> Result<String, String> {
    let uuid = uuid.trim();
    if uuid.is_empty() {
        return Err("is empty".into());
    }
    let quoted = shorten(uuid, 80);
    if uuid.len() > MAX_UUID_LEN {
        return Err(format!(
            "{quoted:?} is {} bytes; at most {MAX_UUID_LEN} are supported",
            uuid.len()
        ));
    }
    let upper = uuid.to_ascii_uppercase();
    let well_formed = if let Some(rest) = upper.strip_prefix("GPU-") {
        is_grouped_hex(rest)
    } else if let Some(rest) = upper.strip_prefix("MIG-GPU-") {
        // Pre-R470 MIG spelling: MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>.
        let mut parts = rest.split('/');
        parts.next().is_some_and(is_grouped_hex)
            && parts.next().is_some_and(is_decimal)
            && parts.next().is_some_and(is_decimal)
            && parts.next().is_none()
    } else if let Some(rest) = upper.strip_prefix("MIG-") {
        is_grouped_hex(rest)
    } else if is_grouped_hex(&upper) {
        return Err(format!(
            "{quoted:?} lacks the \"GPU-\" prefix; write \"GPU-{uuid}\" as nvidia-smi -L prints it"
        ));
    } else {
        false
    };
    if !well_formed {
        return Err(format!(
            "{quoted:?} is not a GPU UUID; expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (32 hex digits, or a MIG-... UUID) as nvidia-smi -L prints it"
        ));
    }
    Ok(uuid.to_string())
}

/// 32 hex digits grouped 8-4-4-4-12 by dashes.
fn is_grouped_hex(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.len() <= 4 && text.bytes().all(|b| b.is_ascii_digit())
}

fn parse_index(value: &Value) -> Result<u32, String> {
    match value.as_u64() {
        Some(index) if index < MAX_DEVICES as u64 => Ok(index as u32),
        Some(index) => Err(format!(
            "{index} is out of range; gpuslice handles device indices 0..={}",
            MAX_DEVICES - 1
        )),
        None => Err(format!(
            "expected a device index 0..={}, found {value}",
            MAX_DEVICES - 1
        )),
    }
}

fn parse_memory(value: &Value) -> Result<u64, String> {
    let bytes = match value {
        Value::String(text) => parse_size(text).map_err(|e| e.to_string())?,
        Value::Number(n) => match n.as_u64() {
            Some(bytes) => bytes,
            None if n.as_i64().is_some() => return Err(format!("{n} is negative")),
            None => {
                return Err(format!(
                    "{n} is not a whole number of bytes up to {}; write a size such as \"1.5GiB\"",
                    u64::MAX
                ))
            }
        },
        Value::Null => {
            return Err("null is not a size; omit memory to leave it unlimited".into());
        }
        other => {
            return Err(format!(
                "expected a size such as \"8GiB\" or a number of bytes, found {}",
                json_kind(other)
            ))
        }
    };
    if bytes == 0 {
        return Err("0 would refuse every allocation; omit memory to leave it unlimited".into());
    }
    Ok(bytes)
}

fn parse_compute(value: &Value) -> Result<u32, String> {
    match value.as_u64() {
        Some(percent @ 1..=100) => Ok(percent as u32),
        Some(0) => Err(
            "0 would never let a kernel run; use 1..=100, or omit compute for no throttling".into(),
        ),
        _ => Err(format!("expected a percentage 1..=100, found {value}")),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The canonical limit file for `config` (pretty JSON, schema version 1). It parses back to the
/// same limits for every configuration `parse_limit_file` accepts; `source` is not written.
/// Memory is written exactly: "8 GiB" where a unit fits, plain bytes otherwise.
pub fn to_json(config: &SliceConfig) -> String {
    #[derive(Serialize)]
    struct FileOut {
        version: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        region: Option<String>,
        policy: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        priority: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        log: Option<&'static str>,
        devices: Vec<DeviceOut>,
    }
    #[derive(Serialize)]
    struct DeviceOut {
        #[serde(skip_serializing_if = "Option::is_none")]
        uuid: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        memory: Option<MemoryOut>,
        #[serde(skip_serializing_if = "Option::is_none")]
        compute: Option<u32>,
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum MemoryOut {
        Bytes(u64),
        Text(String),
    }

    let devices = config
        .devices
        .iter()
        .map(|limit| {
            let (uuid, index) = match &limit.selector {
                DeviceSelector::Uuid(uuid) => (Some(uuid.clone()), None),
                DeviceSelector::Index(index) => (None, Some(*index)),
            };
            let memory = limit.memory_limit.map(|bytes| {
                let text = format_size(bytes);
                if text.ends_with(" B") {
                    MemoryOut::Bytes(bytes)
                } else {
                    MemoryOut::Text(text)
                }
            });
            DeviceOut {
                uuid,
                index,
                memory,
                compute: limit.compute_percent,
            }
        })
        .collect();
    let file = FileOut {
        version: SCHEMA_VERSION,
        region: config
            .region_path
            .as_ref()
            .map(|path| path.to_string_lossy().into_owned()),
        policy: config.policy.as_str(),
        // Normal is the default: files that never named a priority keep their shape.
        priority: (config.priority != Priority::Normal).then(|| config.priority.as_str()),
        log: config.log_level.map(LogLevel::as_str),
        devices,
    };
    let mut text = serde_json::to_string_pretty(&file)
        .unwrap_or_else(|_| format!("{{\"version\": {SCHEMA_VERSION}, \"devices\": []}}"));
    text.push('\n');
    text
}

/// Reads an env variable, treating the empty string as unset.
fn get_set(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|value| !value.trim().is_empty())
}

/// Indexed HAMi variables are looked for up to this index (those past [`MAX_DEVICES`] are
/// refused: they name a device no process of gpuslice can limit).
const HAMI_INDEX_SCAN: u32 = 256;

/// The indexed HAMi variables that are set (`CUDA_DEVICE_MEMORY_LIMIT_<i>`,
/// `CUDA_DEVICE_SM_LIMIT_<i>`, `i` < [`MAX_DEVICES`]) with the device index each names: each
/// must name a device of the node (the shim checks once the driver can list them), as a
/// limit-file entry must. HAMi's un-indexed defaults name no particular device.
pub fn hami_indexed_variables(get: &dyn Fn(&str) -> Option<String>) -> Vec<(String, u32)> {
    let mut named = Vec::new();
    for index in 0..MAX_DEVICES as u32 {
        for prefix in [HAMI_MEMORY_LIMIT_ENV, HAMI_SM_LIMIT_ENV] {
            let name = format!("{prefix}_{index}");
            if get_set(get, &name).is_some() {
                named.push((name, index));
            }
        }
    }
    named
}

/// The HAMi-compatible env configuration (see the module doc for the mapping). `Ok(None)` when
/// none of the HAMi variables is set.
pub fn from_hami_env(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<SliceConfig>, ConfigError> {
    let mut any_set = false;
    let mut read = |name: &str| {
        let value = get_set(get, name);
        any_set |= value.is_some();
        value.map(|value| (name.to_string(), value))
    };

    // Memory: Some(None) = explicitly unlimited (HAMi's 0), Some(Some(n)) = cap, None = unset.
    let memory = |(name, value): (String, String)| -> Result<Option<u64>, ConfigError> {
        let bytes = parse_size(&value).map_err(|e| ConfigError::new(name, "", e.to_string()))?;
        Ok((bytes != 0).then_some(bytes))
    };
    let compute = |(name, value): (String, String)| -> Result<Option<u32>, ConfigError> {
        match value.trim().parse::<u32>() {
            Ok(0) | Ok(100) => Ok(None),
            Ok(percent @ 1..=99) => Ok(Some(percent)),
            _ => Err(ConfigError::new(
                name,
                "",
                format!(
                    "{value:?} is not a compute share; give a percentage 1..=100 (0 or 100 = not throttled)"
                ),
            )),
        }
    };

    let default_memory = read(HAMI_MEMORY_LIMIT_ENV).map(memory).transpose()?;
    let default_compute = read(HAMI_SM_LIMIT_ENV).map(compute).transpose()?;
    let mut devices = Vec::new();
    for index in 0..MAX_DEVICES as u32 {
        let memory_here = match read(&format!("{HAMI_MEMORY_LIMIT_ENV}_{index}")) {
            Some(var) => Some(memory(var)?),
            None => default_memory,
        };
        let compute_here = match read(&format!("{HAMI_SM_LIMIT_ENV}_{index}")) {
            Some(var) => Some(compute(var)?),
            None => default_compute,
        };
        let memory_limit = memory_here.flatten();
        let compute_percent = compute_here.flatten();
        if memory_limit.is_some() || compute_percent.is_some() {
            devices.push(DeviceLimit {
                selector: DeviceSelector::Index(index),
                memory_limit,
                compute_percent,
            });
        }
    }

    // An indexed variable past the devices a process can have names a device no node gives
    // it: refused, never ignored (ignored, it left the card it meant unlimited).
    for prefix in [HAMI_MEMORY_LIMIT_ENV, HAMI_SM_LIMIT_ENV] {
        for index in MAX_DEVICES as u32..HAMI_INDEX_SCAN {
            let name = format!("{prefix}_{index}");
            if get_set(get, &name).is_some() {
                return Err(ConfigError::new(
                    name,
                    "",
                    format!(
                        "names device index {index}; gpuslice limits devices 0..{} of a process, so this limit would apply to nothing and leave the device it meant unlimited",
                        MAX_DEVICES - 1
                    ),
                ));
            }
        }
    }

    let region_path = match read(HAMI_SHARED_CACHE_ENV) {
        None => None,
        Some((name, value)) => {
            Some(check_region_path(value.trim()).map_err(|p| ConfigError::new(name, "", p))?)
        }
    };
    let policy = match read(HAMI_POLICY_ENV) {
        None => ComputePolicy::Cap,
        Some((name, value)) => match value.trim().to_ascii_lowercase().as_str() {
            "default" | "force" => ComputePolicy::Cap,
            "disable" => ComputePolicy::Off,
            _ => {
                return Err(ConfigError::new(
                    name,
                    "",
                    format!("{value:?} is not a policy; HAMi's are default, force and disable"),
                ))
            }
        },
    };
    // Not a slice by itself (HAMi's webhook sets it on pods that may have no limit at all):
    // read without counting as set.
    let priority = match get_set(get, HAMI_PRIORITY_ENV) {
        None => Priority::Normal,
        Some(value) => Priority::from_hami(&value).ok_or_else(|| {
            ConfigError::new(
                HAMI_PRIORITY_ENV,
                "",
                format!("{value:?} is not a task priority; HAMi's are 0 (high) and 1 (low)"),
            )
        })?,
    };
    let log_level = match read(HAMI_LOG_LEVEL_ENV) {
        None => None,
        Some((name, value)) => Some(LogLevel::from_hami(&value).ok_or_else(|| {
            ConfigError::new(
                name,
                "",
                format!("{value:?} is not a log level; use 0..4 (HAMi) or off, error, warn, info, debug, trace"),
            )
        })?),
    };

    if !any_set {
        return Ok(None);
    }
    Ok(Some(SliceConfig {
        source: ConfigSource::Env,
        devices,
        region_path,
        policy,
        priority,
        log_level,
    }))
}

/// The region file when the configuration names none (`/tmp` is private to a container, so
/// all its processes meet there).
pub const DEFAULT_REGION_PATH: &str = "/tmp/gpuslice.region";

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

/// What looking for a configuration found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOutcome {
    pub loaded: Loaded,
    /// The anchored file exists: no environment variable may change what is enforced (the
    /// shim also ignores its own enforcement-changing variables then).
    pub anchored: bool,
    /// One line each: a variable that is set but ignored because the anchored file exists
    /// (the slice is not what whoever set it thinks).
    pub warnings: Vec<String>,
}

/// Finds the configuration for this process (see the module doc for the order): the
/// anchored file [`DEFAULT_CONFIG_PATH`], else the file named by `GPUSLICE_CONFIG`, else HAMi
/// env, else nothing. Fails closed: a file that exists but cannot be read or parsed, a
/// `GPUSLICE_CONFIG` naming a missing file, or a bad env value is `Loaded::Invalid`, never
/// "unlimited". `get_env` is `std::env::var(..).ok()` in production.
pub fn load(get_env: &dyn Fn(&str) -> Option<String>) -> Loaded {
    load_anchored(Path::new(DEFAULT_CONFIG_PATH), get_env).loaded
}

/// [`load`] with the anchored path given (production passes [`DEFAULT_CONFIG_PATH`]; tests a
/// temporary file, since only root can create the real one), and what it ignored.
pub fn load_anchored(anchor: &Path, get_env: &dyn Fn(&str) -> Option<String>) -> LoadOutcome {
    let mut anchored = false;
    let mut warnings = Vec::new();
    let loaded = match load_config(anchor, get_env, &mut anchored, &mut warnings) {
        Ok(Some(config)) => Loaded::Configured(config),
        Ok(None) => Loaded::Unconfigured,
        Err(error) => Loaded::Invalid(error),
    };
    LoadOutcome {
        loaded,
        anchored,
        warnings,
    }
}

/// The set environment variables (name, value) that would change what is enforced if no
/// anchored file existed: `GPUSLICE_CONFIG` and the HAMi limit, region, policy and priority
/// variables.
pub fn enforcement_env(get_env: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let mut names = vec![
        CONFIG_ENV.to_string(),
        HAMI_MEMORY_LIMIT_ENV.to_string(),
        HAMI_SM_LIMIT_ENV.to_string(),
        HAMI_SHARED_CACHE_ENV.to_string(),
        HAMI_POLICY_ENV.to_string(),
        HAMI_PRIORITY_ENV.to_string(),
    ];
    for index in 0..MAX_DEVICES {
        names.push(format!("{HAMI_MEMORY_LIMIT_ENV}_{index}"));
        names.push(format!("{HAMI_SM_LIMIT_ENV}_{index}"));
    }
    names
        .into_iter()
        .filter_map(|name| get_set(get_env, &name).map(|value| (name, value)))
        .collect()
}

/// A limit file's bytes, reading at most one byte past [`MAX_FILE_BYTES`] (a huge or endless
/// file must not be read whole by every process of the slice).
fn read_limit_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads and parses the limit file at `path`; `Ok(None)` when it does not exist.
fn read_and_parse(path: &Path) -> Result<Option<SliceConfig>, ConfigError> {
    let origin = path.display().to_string();
    match read_limit_file(path) {
        Ok(bytes) if bytes.len() > MAX_FILE_BYTES => Err(ConfigError::new(
            &origin,
            "",
            format!(
                "is larger than {MAX_FILE_BYTES} bytes; a limit file has at most 1 MiB: list only the devices of this node"
            ),
        )),
        Ok(bytes) => {
            let text = String::from_utf8(bytes)
                .map_err(|_| ConfigError::new(&origin, "", "is not UTF-8 text"))?;
            parse_limit_file(path, &text).map(Some)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::new(
            &origin,
            "",
            format!("cannot be read ({e}); refusing to run unlimited"),
        )),
    }
}

fn load_config(
    anchor: &Path,
    get_env: &dyn Fn(&str) -> Option<String>,
    anchored: &mut bool,
    warnings: &mut Vec<String>,
) -> Result<Option<SliceConfig>, ConfigError> {
    // Checked before anything else so a typo in it is reported even without a config.
    let log_override = match get_set(get_env, LOG_ENV) {
        None => None,
        Some(value) => Some(LogLevel::from_name(&value).ok_or_else(|| {
            ConfigError::new(
                LOG_ENV,
                "",
                format!(
                    "{:?} is not a log level; use off, error, warn, info, debug or trace",
                    shorten(&value, 64)
                ),
            )
        })?),
    };

    // The anchored file first. "Exists" is anything but NotFound: an anchored file that
    // cannot be read fails closed rather than letting the environment pick another source.
    let from_anchor = match read_and_parse(anchor) {
        Ok(None) => None,
        result => {
            *anchored = true;
            for (name, value) in enforcement_env(get_env) {
                if name == CONFIG_ENV && Path::new(value.trim()) == anchor {
                    continue; // names the anchored file itself (the CDI spec sets it so)
                }
                warnings.push(format!(
                    "{name}={:?} is ignored: the limit file {} exists and nothing in the environment overrides it",
                    shorten(&value, 64),
                    shorten(&anchor.display().to_string(), MAX_QUOTED)
                ));
            }
            result?
        }
    };
    let config = match from_anchor {
        Some(config) => Some(config),
        None => match get_set(get_env, CONFIG_ENV) {
            Some(explicit) => {
                let path = PathBuf::from(explicit);
                match read_and_parse(&path)? {
                    Some(config) => Some(config),
                    None => {
                        return Err(ConfigError::new(
                            path.display().to_string(),
                            "",
                            format!("{CONFIG_ENV} names this file but it does not exist"),
                        ))
                    }
                }
            }
            None => from_hami_env(get_env)?,
        },
    };
    let config = match config {
        Some(mut config) if matches!(config.source, ConfigSource::File(_)) => {
            if config.log_level.is_none() {
                config.log_level = hami_log_level(get_env)?;
            }
            Some(config)
        }
        other => other,
    };
    Ok(config.map(|mut config| {
        if log_override.is_some() {
            config.log_level = log_override;
        }
        config
    }))
}

fn hami_log_level(
    get_env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<LogLevel>, ConfigError> {
    match get_set(get_env, HAMI_LOG_LEVEL_ENV) {
        None => Ok(None),
        Some(value) => LogLevel::from_hami(&value).map(Some).ok_or_else(|| {
            ConfigError::new(
                HAMI_LOG_LEVEL_ENV,
                "",
                format!("{value:?} is not a log level; use 0..4 (HAMi) or a level name"),
            )
        }),
    }
}

/// JSON parsing that refuses duplicate object keys (serde_json keeps the last one silently,
/// which would let `{"memory": "8g", "memory": null}`-style edits hide a limit).
mod strict_json {
    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Number, Value};
    use std::fmt;

    pub struct StrictValue(pub Value);

    impl<'de> Deserialize<'de> for StrictValue {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(StrictVisitor).map(StrictValue)
        }
    }

    struct StrictVisitor;

    impl<'de> Visitor<'de> for StrictVisitor {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_string()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut items = Vec::new();
            while let Some(StrictValue(item)) = seq.next_element()? {
                items.push(item);
            }
            Ok(Value::Array(items))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut object = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if object.contains_key(&key) {
                    return Err(de::Error::custom(format!("duplicate key {key:?}")));
                }
                let StrictValue(value) = map.next_value()?;
                object.insert(key, value);
            }
            Ok(Value::Object(object))
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
