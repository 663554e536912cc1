//! Strict validation of a limit file: every field checked, unknown ones refused, errors naming the field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::schema::{
    ComputePolicy, ConfigError, ConfigSource, DeviceLimit, DeviceSelector, LogLevel, Priority,
    SliceConfig,
};
use super::strict_json;
use super::{
    MAX_DEVICES, MAX_DEVICE_ENTRIES, MAX_FILE_BYTES, MAX_REGION_NAME, MAX_REGION_PATH,
    MAX_UUID_LEN, SCHEMA_VERSION,
};
use crate::size::parse_size;
use crate::text::{shorten, MAX_QUOTED};

const TOP_LEVEL_FIELDS: [&str; 7] = [
    "version",
    "region",
    "policy",
    "priority",
    "log",
    "context_overhead",
    "devices",
];
const DEVICE_FIELDS: [&str; 5] = ["uuid", "index", "memory", "compute", "virtual"];

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
    let context_bound = match top.get("context_overhead") {
        None => None,
        Some(value) => Some(parse_context_bound(value).map_err(|p| fail("context_overhead", p))?),
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
        context_bound,
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

pub(super) fn check_region_path(path: &str) -> Result<PathBuf, String> {
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
pub(super) fn same_selector(a: &DeviceSelector, b: &DeviceSelector) -> bool {
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
    let virtual_memory = match fields.get("virtual") {
        None => None,
        Some(value) => Some(parse_virtual(value, memory_limit).map_err(|p| (at("virtual"), p))?),
    };
    Ok(DeviceLimit {
        selector,
        memory_limit,
        compute_percent,
        virtual_memory,
    })
}

/// The oversubscribed size: a size like `memory`, given only beside a physical `memory` and
/// never below it (the application is told at least what the card holds for it).
fn parse_virtual(value: &Value, memory: Option<u64>) -> Result<u64, String> {
    let bytes = parse_memory(value)?;
    let Some(memory) = memory else {
        return Err(
            "needs \"memory\" beside it: the physical share is what the card holds, the virtual size is what the application is told"
                .into(),
        );
    };
    if bytes < memory {
        return Err(format!(
            "{} is smaller than memory ({}); the virtual size is at least the physical share (equal: no oversubscription)",
            crate::size::format_size(bytes),
            crate::size::format_size(memory)
        ));
    }
    Ok(bytes)
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

/// The largest `context_overhead` accepted: above any card's whole memory, so a typo of
/// units cannot make every context reserve a petabyte.
pub const MAX_CONTEXT_BOUND: u64 = 1 << 40;

/// `context_overhead` given as text (a limit file's string, a command-line flag).
pub fn parse_context_bound_text(text: &str) -> Result<u64, String> {
    parse_context_bound(&Value::String(text.to_string()))
}

fn parse_context_bound(value: &Value) -> Result<u64, String> {
    let bytes = match value {
        Value::String(text) => parse_size(text).map_err(|e| e.to_string())?,
        Value::Number(n) => n.as_u64().ok_or_else(|| {
            format!("{n} is not a whole number of bytes; write a size such as \"768MiB\"")
        })?,
        other => {
            return Err(format!(
                "expected a size such as \"768MiB\" or a number of bytes, found {}",
                json_kind(other)
            ))
        }
    };
    if bytes == 0 {
        return Err(
            "0 would let contexts reserve nothing before their cost is known; omit it for the default (512 MiB)"
                .into(),
        );
    }
    if bytes > MAX_CONTEXT_BOUND {
        return Err(format!(
            "{bytes} bytes is more than any card holds (at most 1 TiB); give what one context costs, such as \"768MiB\""
        ));
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
