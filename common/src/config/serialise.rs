//! Writing a configuration back as a limit file.

use serde::Serialize;

use super::schema::{DeviceSelector, LogLevel, Priority, SliceConfig};
use super::SCHEMA_VERSION;
use crate::size::format_size;

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
        #[serde(skip_serializing_if = "Option::is_none")]
        context_overhead: Option<MemoryOut>,
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
        #[serde(rename = "virtual", skip_serializing_if = "Option::is_none")]
        virtual_memory: Option<MemoryOut>,
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum MemoryOut {
        Bytes(u64),
        Text(String),
    }

    let size = |bytes: u64| {
        let text = format_size(bytes);
        if text.ends_with(" B") {
            MemoryOut::Bytes(bytes)
        } else {
            MemoryOut::Text(text)
        }
    };
    let devices = config
        .devices
        .iter()
        .map(|limit| {
            let (uuid, index) = match &limit.selector {
                DeviceSelector::Uuid(uuid) => (Some(uuid.clone()), None),
                DeviceSelector::Index(index) => (None, Some(*index)),
            };
            DeviceOut {
                uuid,
                index,
                memory: limit.memory_limit.map(size),
                compute: limit.compute_percent,
                virtual_memory: limit.virtual_memory.map(size),
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
        context_overhead: config.context_bound.map(size),
        devices,
    };
    let mut text = serde_json::to_string_pretty(&file)
        .unwrap_or_else(|_| format!("{{\"version\": {SCHEMA_VERSION}, \"devices\": []}}"));
    text.push('\n');
    text
}
