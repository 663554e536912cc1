//! Where the configuration comes from: the anchored file, `GPUSLICE_CONFIG`, HAMi env, in that order.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::hami::{from_hami_env, get_set, hami_log_level, hami_oversubscribe_warning};
use super::parse::parse_limit_file;
use super::schema::{ConfigError, ConfigSource, Loaded, LogLevel, SliceConfig};
use super::{
    CONFIG_ENV, DEFAULT_CONFIG_PATH, HAMI_MEMORY_LIMIT_ENV, HAMI_POLICY_ENV, HAMI_PRIORITY_ENV,
    HAMI_SHARED_CACHE_ENV, HAMI_SM_LIMIT_ENV, LOG_ENV, MAX_DEVICES, MAX_FILE_BYTES,
};
use crate::text::{shorten, MAX_QUOTED};

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
pub(crate) fn enforcement_env(get_env: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
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
            None => {
                let config = from_hami_env(get_env)?;
                if config.is_some() {
                    warnings.extend(hami_oversubscribe_warning(get_env));
                }
                config
            }
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
