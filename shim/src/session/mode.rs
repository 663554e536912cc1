//! The configuration this process runs under, as loaded: the [`Mode`] (pass through, fail
//! closed, or enforce a slice), the pure mapping from a configuration outcome to it, and
//! whether the anchored limit file exists. `hooks::lifecycle` loads the mode once per
//! process and `session::state` keeps it (the one place a process's state is kept).
//!
//! Owns `ANCHORED` (whether the anchored limit file exists; rewritten at every load).

use std::sync::atomic::{AtomicBool, Ordering};

use gpuslice_common::config::{ComputePolicy, ConfigError, Loaded, SliceConfig};

/// How this process treats CUDA/NVML calls, as its configuration says (`session::state`
/// keeps it, with the states before and after loading).
#[derive(Debug)]
pub enum Mode {
    /// No configuration: everything goes straight to the driver.
    PassThrough,
    /// Invalid configuration: every entry point refuses (never silently unlimited).
    FailClosed(ConfigError),
    /// A valid slice: policies apply.
    Enforcing(SliceConfig),
}

/// Survives fork (the child's next load writes it again).
static ANCHORED: AtomicBool = AtomicBool::new(false);
/// Records whether the anchored limit file exists (by `hooks::lifecycle`, while loading).
pub fn set_anchored(anchored: bool) {
    ANCHORED.store(anchored, Ordering::Release);
}

/// Whether the anchored limit file exists: then no environment variable may change what is
/// enforced (the shim's own ones included, see `memory`). Valid once the state is loaded.
pub fn anchored() -> bool {
    ANCHORED.load(Ordering::Acquire)
}

/// Pure: whether `config` asks for any compute throttling.
pub fn config_throttles(config: &SliceConfig) -> bool {
    config.policy != ComputePolicy::Off
        && config
            .devices
            .iter()
            .any(|d| matches!(d.compute_percent, Some(1..=99)))
}

/// The refusal for a region that cannot be used: origin and field say where its path is set.
pub fn region_error(config: &SliceConfig, problem: String) -> ConfigError {
    let (origin, field) = config.region_source();
    ConfigError {
        origin,
        field,
        problem: format!("the shared region cannot be used: {problem}"),
    }
}

/// Pure: what a configuration outcome means for this process (also sets the log level).
pub fn mode_from(loaded: Loaded) -> Mode {
    match loaded {
        Loaded::Unconfigured => Mode::PassThrough,
        Loaded::Invalid(error) => Mode::FailClosed(error),
        Loaded::Configured(config) => {
            if let Some(level) = config.log_level {
                crate::ground::log::set_level(level);
            }
            Mode::Enforcing(config)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::{ConfigSource, DeviceLimit, DeviceSelector};

    #[test]
    fn configuration_outcomes_map_to_modes() {
        assert!(matches!(mode_from(Loaded::Unconfigured), Mode::PassThrough));
        let error = ConfigError {
            origin: "/etc/gpuslice/limits.json".into(),
            field: "devices[0].memory".into(),
            problem: "bad".into(),
        };
        assert!(matches!(
            mode_from(Loaded::Invalid(error)),
            Mode::FailClosed(_)
        ));
        let config = SliceConfig {
            source: ConfigSource::Env,
            devices: vec![],
            region_path: None,
            policy: ComputePolicy::Cap,
            priority: Default::default(),
            log_level: None,
            context_bound: None,
        };
        assert!(matches!(
            mode_from(Loaded::Configured(config)),
            Mode::Enforcing(_)
        ));
    }

    #[test]
    fn only_a_share_below_100_with_a_policy_other_than_off_throttles() {
        let device = |p| DeviceLimit {
            selector: DeviceSelector::Index(0),
            memory_limit: None,
            compute_percent: p,
            virtual_memory: None,
        };
        let config = |policy, p| SliceConfig {
            source: ConfigSource::Env,
            devices: vec![device(p)],
            region_path: None,
            policy,
            priority: Default::default(),
            log_level: None,
            context_bound: None,
        };
        assert!(config_throttles(&config(ComputePolicy::Cap, Some(25))));
        assert!(config_throttles(&config(ComputePolicy::Burst, Some(99))));
        assert!(!config_throttles(&config(ComputePolicy::Cap, Some(100))));
        assert!(!config_throttles(&config(ComputePolicy::Cap, None)));
        assert!(!config_throttles(&config(ComputePolicy::Off, Some(25))));
    }

    #[test]
    fn a_region_refusal_names_where_the_region_path_is_set() {
        let mut config = SliceConfig {
            source: ConfigSource::File("/etc/gpuslice/limits.json".into()),
            devices: vec![],
            region_path: Some("/var/run/gpuslice/a.region".into()),
            policy: ComputePolicy::Cap,
            priority: Default::default(),
            log_level: None,
            context_bound: None,
        };
        let line = region_error(&config, "open: No such file or directory".into()).to_string();
        assert!(
            line.starts_with("invalid configuration /etc/gpuslice/limits.json: region: "),
            "{line}"
        );
        config.region_path = None;
        let error = region_error(&config, "x".into());
        assert_eq!(
            error.field,
            "region (not set; default /tmp/gpuslice.region)"
        );
        config.source = ConfigSource::Env;
        let error = region_error(&config, "x".into());
        assert_eq!(error.origin, "HAMi env");
        assert!(error.field.starts_with("CUDA_DEVICE_MEMORY_SHARED_CACHE"));
    }
}
