//! The HAMi-compatible environment variables, the fallback where no limit file exists.

use super::parse::check_region_path;
use super::schema::{
    ComputePolicy, ConfigError, ConfigSource, DeviceLimit, DeviceSelector, LogLevel, Priority,
    SliceConfig,
};
use super::{
    HAMI_LOG_LEVEL_ENV, HAMI_MEMORY_LIMIT_ENV, HAMI_OVERSUBSCRIBE_ENV, HAMI_POLICY_ENV,
    HAMI_PRIORITY_ENV, HAMI_SHARED_CACHE_ENV, HAMI_SM_LIMIT_ENV, MAX_DEVICES,
};
use crate::size::parse_size;

/// Reads an env variable, treating the empty string as unset.
pub(super) fn get_set(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
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
                virtual_memory: None,
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
        context_bound: None,
    }))
}

pub(super) fn hami_log_level(
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

/// HAMi's `CUDA_OVERSUBSCRIBE=true` cannot be honoured: under it HAMi's device plugin hands the
/// container the oversubscribed size in `CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, and the physical
/// share is in no variable, so there is nothing to keep the card within. The limit stays a
/// hard cap on the card; this is the one line that says so.
pub(super) fn hami_oversubscribe_warning(
    get_env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let value = get_set(get_env, HAMI_OVERSUBSCRIBE_ENV)?;
    value.trim().eq_ignore_ascii_case("true").then(|| {
        format!(
            "{HAMI_OVERSUBSCRIBE_ENV}=true is ignored: HAMi's limit variables carry the oversubscribed size, not the physical share, so {HAMI_MEMORY_LIMIT_ENV} stays a hard cap on the card; to oversubscribe, give the physical share as \"memory\" and the larger size as \"virtual\" in a limit file"
        )
    })
}
