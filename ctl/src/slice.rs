//! The flags that describe a slice, shared by `write` and `run`: `--device`, `--memory`,
//! `--compute`, `--policy`, `--region`, and their turning into a validated `SliceConfig`.
//!
//! Device syntax: `DEV[:memory=SIZE,compute=PCT]` where `DEV` is an index (`0`..`15`) or a
//! UUID as `nvidia-smi -L` prints it (`GPU-...`, `MIG-...`). `--memory`/`--compute` are the
//! defaults for every `--device` that does not give its own.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use gpuslice_common::config::{
    self, ComputePolicy, ConfigSource, DeviceLimit, DeviceSelector, LogLevel, Priority,
    SliceConfig, MAX_DEVICES,
};
use gpuslice_common::size::parse_size;

use crate::error::{CliError, CliResult};

/// One `--device` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub selector: DeviceSelector,
    pub memory: Option<u64>,
    pub compute: Option<u32>,
    /// Opt-in oversubscription: the size the slice's processes are told (at least `memory`).
    pub virtual_memory: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Never above the share in steady state (default).
    Cap,
    /// May use idle GPU time, gives it back when a neighbour wants it.
    Burst,
    /// No compute throttling.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PriorityArg {
    /// Takes idle time first under burst.
    High,
    /// The default.
    Normal,
    /// Yields idle time first under burst.
    Low,
}

impl From<PriorityArg> for Priority {
    fn from(priority: PriorityArg) -> Self {
        match priority {
            PriorityArg::High => Priority::High,
            PriorityArg::Normal => Priority::Normal,
            PriorityArg::Low => Priority::Low,
        }
    }
}

impl From<PolicyArg> for ComputePolicy {
    fn from(policy: PolicyArg) -> Self {
        match policy {
            PolicyArg::Cap => ComputePolicy::Cap,
            PolicyArg::Burst => ComputePolicy::Burst,
            PolicyArg::Off => ComputePolicy::Off,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct SliceArgs {
    /// A device of the slice: an index (0..15) or a UUID (GPU-...), optionally with its own
    /// limits, e.g. `0:memory=8GiB,compute=25` or `GPU-8a5d...:memory=16g,virtual=24g`.
    /// Repeat for several devices.
    #[arg(long = "device", short = 'd', value_name = "DEV[:memory=SIZE,compute=PCT,virtual=SIZE]",
          value_parser = parse_device_spec)]
    pub devices: Vec<DeviceSpec>,

    /// Memory cap for every --device that does not set its own (bytes, 8GiB, 8g, 8192m;
    /// G and GB mean GiB).
    #[arg(long, short = 'm', value_name = "SIZE", value_parser = parse_memory_arg)]
    pub memory: Option<u64>,

    /// Compute share in percent (1..100) for every --device that does not set its own.
    #[arg(long, short = 'c', value_name = "PCT", value_parser = parse_compute_arg)]
    pub compute: Option<u32>,

    /// Opt-in oversubscription for every --device that does not set its own: the size the
    /// slice's processes are told and may allocate, at least --memory; the card holds at most
    /// --memory for them, the rest goes to the container's host memory (within its memory
    /// cgroup). Never on unless given.
    #[arg(long = "virtual", value_name = "SIZE", value_parser = parse_memory_arg)]
    pub virtual_memory: Option<u64>,

    /// What the throttle does with the compute share.
    #[arg(long, value_enum, default_value_t = PolicyArg::Cap)]
    pub policy: PolicyArg,

    /// Who gets idle GPU time first under `--policy burst` (never changes the share).
    #[arg(long, value_enum, default_value_t = PriorityArg::Normal)]
    pub priority: PriorityArg,

    /// Log level the shim uses (off, error, warn, info, debug, trace).
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_arg)]
    pub log: Option<LogLevel>,

    /// The most one CUDA context costs on the slice's cards (`context_overhead`, default
    /// 512 MiB): what a first context reserves before its cost is measured, and what contexts
    /// started together each reserve.
    #[arg(long = "context-overhead", value_name = "SIZE", value_parser = parse_memory_arg)]
    pub context_overhead: Option<u64>,
}

/// Parses `DEV[:memory=SIZE,compute=PCT]` (see the module doc).
pub fn parse_device_spec(text: &str) -> Result<DeviceSpec, String> {
    let text = text.trim();
    let (device, limits) = match text.split_once(':') {
        Some((device, limits)) => (device.trim(), Some(limits)),
        None => (text, None),
    };
    let selector = parse_selector(device)?;
    let mut spec = DeviceSpec {
        selector,
        memory: None,
        compute: None,
        virtual_memory: None,
    };
    let Some(limits) = limits else {
        return Ok(spec);
    };
    if limits.trim().is_empty() {
        return Err(format!(
            "{text:?} ends with ':' but gives no limits; write e.g. {device}:memory=8GiB,compute=25"
        ));
    }
    for item in limits.split(',') {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!(
                "{item:?} in {text:?} is not key=value; use memory=SIZE and/or compute=PCT"
            ));
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "memory" | "mem" => {
                if spec.memory.is_some() {
                    return Err(format!("memory is given twice in {text:?}"));
                }
                spec.memory = Some(parse_memory_arg(value)?);
            }
            "compute" | "sm" => {
                if spec.compute.is_some() {
                    return Err(format!("compute is given twice in {text:?}"));
                }
                spec.compute = Some(parse_compute_arg(value)?);
            }
            "virtual" => {
                if spec.virtual_memory.is_some() {
                    return Err(format!("virtual is given twice in {text:?}"));
                }
                spec.virtual_memory = Some(parse_memory_arg(value)?);
            }
            other => {
                return Err(format!(
                    "unknown device limit {other:?} in {text:?}; use memory=SIZE, compute=PCT and/or virtual=SIZE"
                ))
            }
        }
    }
    Ok(spec)
}

/// An index `0..MAX_DEVICES` or a `GPU-`/`MIG-` UUID.
pub fn parse_selector(device: &str) -> Result<DeviceSelector, String> {
    let device = device.trim();
    if !device.is_empty() && device.bytes().all(|b| b.is_ascii_digit()) {
        return match device.parse::<u32>() {
            Ok(index) if (index as usize) < MAX_DEVICES => Ok(DeviceSelector::Index(index)),
            _ => Err(format!(
                "device index {device} is out of range; use 0..={}",
                MAX_DEVICES - 1
            )),
        };
    }
    let upper = device.to_ascii_uppercase();
    if upper.starts_with("GPU-") || upper.starts_with("MIG-") {
        // The limit file's own rule, so `write` never produces a file the shim refuses.
        return config::check_uuid(device).map(DeviceSelector::Uuid);
    }
    Err(format!(
        "unknown device {device:?}: use an index (0..={}) or a UUID like GPU-8a5d... (see nvidia-smi -L)",
        MAX_DEVICES - 1
    ))
}

/// A memory cap: the size grammar of `gpuslice_common::size`, never 0.
pub fn parse_memory_arg(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text).map_err(|e| e.to_string())?;
    if bytes == 0 {
        return Err(
            "a memory cap of 0 would refuse every allocation; leave it out for no cap".into(),
        );
    }
    Ok(bytes)
}

/// A compute share: 1..=100 percent (a trailing `%` is allowed).
pub fn parse_compute_arg(text: &str) -> Result<u32, String> {
    let trimmed = text.trim().trim_end_matches('%').trim();
    match trimmed.parse::<i64>() {
        Ok(percent @ 1..=100) => Ok(percent as u32),
        Ok(_) => Err(format!(
            "compute share {text:?} is out of range; use a percentage 1..=100"
        )),
        Err(_) => Err(format!(
            "{text:?} is not a compute share; use a percentage 1..=100, e.g. 25"
        )),
    }
}

fn parse_log_arg(text: &str) -> Result<LogLevel, String> {
    LogLevel::from_name(text).ok_or_else(|| {
        format!("{text:?} is not a log level; use off, error, warn, info, debug or trace")
    })
}

/// What to do when no `--device` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoDevices {
    /// Refuse (`write`: a persistent file should say which devices it means).
    Refuse,
    /// Apply `--memory`/`--compute` to every device index (`run`, like HAMi's un-indexed env).
    AllIndices,
}

impl SliceArgs {
    /// The slice these flags describe, validated by a round trip through the limit-file
    /// parser (the same code the shim runs), so a file `write` accepts is one the shim loads.
    pub fn to_config(
        &self,
        region: Option<PathBuf>,
        no_devices: NoDevices,
    ) -> CliResult<SliceConfig> {
        let specs: Vec<DeviceSpec> = if self.devices.is_empty() {
            match no_devices {
                NoDevices::Refuse => {
                    return Err(CliError::usage(
                        "say which devices the slice limits: --device 0 (or --device GPU-uuid), repeat for more",
                    ))
                }
                NoDevices::AllIndices => (0..MAX_DEVICES as u32)
                    .map(|index| DeviceSpec {
                        selector: DeviceSelector::Index(index),
                        memory: None,
                        compute: None,
                        virtual_memory: None,
                    })
                    .collect(),
            }
        } else {
            self.devices.clone()
        };
        let mut devices = Vec::new();
        for spec in specs {
            let memory_limit = spec.memory.or(self.memory);
            let compute_percent = spec.compute.or(self.compute);
            if memory_limit.is_none() && compute_percent.is_none() {
                let what = match &spec.selector {
                    DeviceSelector::Index(i) => i.to_string(),
                    DeviceSelector::Uuid(u) => u.clone(),
                };
                return Err(CliError::usage(format!(
                    "device {what} has no limit: add :memory=SIZE or :compute=PCT, or --memory/--compute"
                )));
            }
            devices.push(DeviceLimit {
                selector: spec.selector,
                memory_limit,
                compute_percent,
                virtual_memory: spec.virtual_memory.or(self.virtual_memory),
            });
        }
        let region_path = region.map(|path| absolute(&path));
        let config = SliceConfig {
            source: ConfigSource::Env,
            devices,
            region_path,
            policy: self.policy.into(),
            priority: self.priority.into(),
            log_level: self.log,
            context_bound: self.context_overhead,
        };
        validate(&config)
    }
}

/// Round-trips `config` through the limit-file text and parser; the parsed result is what
/// gets written, so what is written is exactly what the shim will read.
pub fn validate(config: &SliceConfig) -> CliResult<SliceConfig> {
    let text = config::to_json(config);
    config::parse_limit_file(Path::new("(the limits given on the command line)"), &text)
        .map_err(|e| CliError::usage(e.to_string()))
}

/// `path` made absolute against the working directory (the limit file needs absolute paths:
/// every process of the slice must find the same region).
pub fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn device_specs_parse() {
        assert_eq!(
            parse_device_spec("0:memory=8GiB,compute=25"),
            Ok(DeviceSpec {
                selector: DeviceSelector::Index(0),
                memory: Some(8 * GIB),
                compute: Some(25),
                virtual_memory: None,
            })
        );
        assert_eq!(
            parse_device_spec("GPU-8a5d1c2e-0000-1111-2222-333344445555:mem=16g"),
            Ok(DeviceSpec {
                selector: DeviceSelector::Uuid("GPU-8a5d1c2e-0000-1111-2222-333344445555".into()),
                memory: Some(16 * GIB),
                compute: None,
                virtual_memory: None,
            })
        );
        assert_eq!(
            parse_device_spec("3"),
            Ok(DeviceSpec {
                selector: DeviceSelector::Index(3),
                memory: None,
                compute: None,
                virtual_memory: None,
            })
        );
        assert_eq!(
            parse_device_spec("1:compute=50%").unwrap().compute,
            Some(50)
        );
        assert_eq!(
            parse_device_spec("0:memory=8g,virtual=24g")
                .unwrap()
                .virtual_memory,
            Some(24 * GIB)
        );
    }

    #[test]
    fn bad_device_specs_say_why() {
        let cases = [
            ("gpu0", "unknown device"),
            ("", "unknown device"),
            ("16", "out of range"),
            ("99999999999999999999", "out of range"),
            ("0:", "gives no limits"),
            ("0:memory", "not key=value"),
            ("0:memory=8XB", "unknown unit"),
            ("0:memory=-1g", "negative"),
            ("0:memory=0", "refuse every allocation"),
            ("0:compute=0", "out of range"),
            ("0:compute=101", "out of range"),
            ("0:compute=-5", "out of range"),
            ("0:compute=lots", "not a compute share"),
            ("0:colour=red", "unknown device limit"),
            ("0:memory=1g,memory=2g", "given twice"),
            ("GPU-", "is not a GPU UUID"),
            ("GPU-8a5d1c2e-0000", "is not a GPU UUID"),
        ];
        for (input, want) in cases {
            let err = parse_device_spec(input).expect_err(input);
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn sizes_and_percents() {
        assert_eq!(parse_memory_arg("1GiB"), Ok(GIB));
        assert!(parse_memory_arg("-1GiB").unwrap_err().contains("negative"));
        assert!(parse_memory_arg("lots").is_err());
        assert_eq!(parse_compute_arg("25"), Ok(25));
        assert_eq!(parse_compute_arg("100%"), Ok(100));
        assert!(parse_compute_arg("0").is_err());
    }

    fn args(devices: &[&str], memory: Option<u64>, compute: Option<u32>) -> SliceArgs {
        SliceArgs {
            devices: devices
                .iter()
                .map(|d| parse_device_spec(d).unwrap())
                .collect(),
            memory,
            compute,
            virtual_memory: None,
            policy: PolicyArg::Cap,
            priority: PriorityArg::Normal,
            log: None,
            context_overhead: None,
        }
    }

    #[test]
    fn a_virtual_size_reaches_the_file_and_is_checked_like_one() {
        let mut over = args(&["0", "1:memory=4g,virtual=6g"], Some(2 * GIB), None);
        over.virtual_memory = Some(8 * GIB);
        let config = over
            .to_config(Some("/run/s.region".into()), NoDevices::Refuse)
            .unwrap();
        assert_eq!(config.devices[0].virtual_memory, Some(8 * GIB));
        assert_eq!(config.devices[1].virtual_memory, Some(6 * GIB));
        let err = args(&["0:memory=4g,virtual=2g"], None, None)
            .to_config(None, NoDevices::Refuse)
            .unwrap_err();
        assert!(
            err.message.contains("devices[0].virtual") && err.message.contains("smaller"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_context_bound_reaches_the_file_and_is_checked_like_one() {
        let mut bounded = args(&["0"], Some(2 * GIB), None);
        bounded.context_overhead = Some(768 << 20);
        let config = bounded.to_config(None, NoDevices::Refuse).unwrap();
        assert_eq!(config.context_bound, Some(768 << 20));
        assert!(config::to_json(&config).contains("\"context_overhead\": \"768 MiB\""));
        bounded.context_overhead = Some(4 << 40);
        let err = bounded
            .to_config(None, NoDevices::Refuse)
            .unwrap_err()
            .to_string();
        assert!(err.contains("context_overhead"), "{err}");
    }

    #[test]
    fn a_priority_reaches_the_file_and_round_trips() {
        let mut low = args(&["0"], None, Some(30));
        low.policy = PolicyArg::Burst;
        low.priority = PriorityArg::Low;
        let config = low
            .to_config(Some("/run/s.region".into()), NoDevices::Refuse)
            .unwrap();
        assert_eq!(config.priority, Priority::Low);
        assert!(config::to_json(&config).contains("\"priority\": \"low\""));
    }

    #[test]
    fn defaults_fill_devices_and_round_trip() {
        let config = args(&["0", "1:memory=2g"], Some(GIB), Some(25))
            .to_config(Some("/run/s.region".into()), NoDevices::Refuse)
            .unwrap();
        assert_eq!(config.devices.len(), 2);
        assert_eq!(config.devices[0].memory_limit, Some(GIB));
        assert_eq!(config.devices[1].memory_limit, Some(2 * GIB));
        assert_eq!(config.devices[1].compute_percent, Some(25));
        assert_eq!(config.region_path, Some(PathBuf::from("/run/s.region")));
    }

    #[test]
    fn no_devices_is_refused_or_means_all() {
        let err = args(&[], Some(GIB), None)
            .to_config(None, NoDevices::Refuse)
            .unwrap_err();
        assert_eq!(err.code, crate::error::EXIT_USAGE);
        let config = args(&[], Some(GIB), None)
            .to_config(None, NoDevices::AllIndices)
            .unwrap();
        assert_eq!(config.devices.len(), MAX_DEVICES);
    }

    #[test]
    fn a_device_without_limits_and_duplicates_are_refused() {
        let err = args(&["0"], None, None)
            .to_config(None, NoDevices::Refuse)
            .unwrap_err();
        assert!(err.message.contains("has no limit"), "{}", err.message);
        let err = args(&["0:memory=1g", "0:compute=5"], None, None)
            .to_config(None, NoDevices::Refuse)
            .unwrap_err();
        assert!(err.message.contains("devices[1]"), "{}", err.message);
    }
}
