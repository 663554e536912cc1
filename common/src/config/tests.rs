//! Tests of the limit-file schema, the HAMi env mapping and the load precedence.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::parse::same_selector;
use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn file(text: &str) -> Result<SliceConfig, ConfigError> {
    parse_limit_file(Path::new("/etc/gpuslice/limits.json"), text)
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name: &str| map.get(name).cloned()
}

fn uuid_limit(uuid: &str, memory: Option<u64>, compute: Option<u32>) -> DeviceLimit {
    DeviceLimit {
        selector: DeviceSelector::Uuid(uuid.into()),
        memory_limit: memory,
        compute_percent: compute,
        virtual_memory: None,
    }
}

fn index_limit(index: u32, memory: Option<u64>, compute: Option<u32>) -> DeviceLimit {
    DeviceLimit {
        selector: DeviceSelector::Index(index),
        memory_limit: memory,
        compute_percent: compute,
        virtual_memory: None,
    }
}

#[test]
fn parses_the_documented_example() {
    let config = file(
        r#"{"version": 1,
            "region": "/var/run/gpuslice/slice-a.region",
            "policy": "burst",
            "log": "debug",
            "devices": [
               {"uuid": "GPU-8a5d1c2e-0000-1111-2222-333344445555", "memory": "8GiB", "compute": 25},
               {"index": 1, "memory": 17179869184}
            ]}"#,
    )
    .unwrap();
    assert_eq!(
        config,
        SliceConfig {
            source: ConfigSource::File("/etc/gpuslice/limits.json".into()),
            devices: vec![
                uuid_limit(
                    "GPU-8a5d1c2e-0000-1111-2222-333344445555",
                    Some(8 * GIB),
                    Some(25)
                ),
                index_limit(1, Some(16 * GIB), None),
            ],
            region_path: Some("/var/run/gpuslice/slice-a.region".into()),
            policy: ComputePolicy::Burst,
            priority: Default::default(),
            log_level: Some(LogLevel::Debug),
            context_bound: None,
        }
    );
}

#[test]
fn a_virtual_size_beside_memory_opts_into_oversubscription() {
    let config = file(
        r#"{"version": 1, "devices": [
              {"index": 0, "memory": "8GiB", "virtual": "24GiB"},
              {"index": 1, "memory": "8GiB", "virtual": 8589934592},
              {"index": 2, "memory": "8GiB"}]}"#,
    )
    .unwrap();
    let [over, equal, plain] = &config.devices[..] else {
        panic!("{:?}", config.devices)
    };
    assert_eq!(over.virtual_memory, Some(24 * GIB));
    assert_eq!(over.host_excess(), Some(16 * GIB));
    assert_eq!(equal.virtual_memory, Some(8 * GIB));
    assert_eq!(
        equal.host_excess(),
        None,
        "equal to memory: no oversubscription"
    );
    assert_eq!((plain.virtual_memory, plain.host_excess()), (None, None));
    // Written back and read again: the same limits.
    let again = parse_limit_file(Path::new("/etc/gpuslice/limits.json"), &to_json(&config));
    assert_eq!(again.unwrap().devices, config.devices);
    assert!(to_json(&config).contains("\"virtual\": \"24 GiB\""));
}

#[test]
fn hamis_oversubscribe_flag_is_reported_not_honoured() {
    let outcome = load_anchored(
        Path::new("/nonexistent/gpuslice-anchor.json"),
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "24g"),
            ("CUDA_OVERSUBSCRIBE", "true"),
        ]),
    );
    assert_eq!(memory_of(&outcome.loaded), Some(24 * GIB), "a hard cap");
    let Loaded::Configured(config) = &outcome.loaded else {
        unreachable!()
    };
    assert_eq!(config.devices[0].virtual_memory, None);
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    assert!(outcome.warnings[0].starts_with("CUDA_OVERSUBSCRIBE=true is ignored"));
    let quiet = load_anchored(
        Path::new("/nonexistent/gpuslice-anchor.json"),
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "24g"),
            ("CUDA_OVERSUBSCRIBE", "false"),
        ]),
    );
    assert!(quiet.warnings.is_empty(), "{:?}", quiet.warnings);
}

#[test]
fn optional_fields_take_their_defaults() {
    let config = file(r#"{"version": 1, "devices": [{"index": 0}]}"#).unwrap();
    assert_eq!(config.policy, ComputePolicy::Cap);
    assert_eq!(config.log_level, None);
    assert_eq!(config.region_path, None);
    assert_eq!(config.devices, vec![index_limit(0, None, None)]);
    let config = file(r#"{"version": 1, "devices": [], "policy": "OFF"}"#).unwrap();
    assert!(config.devices.is_empty());
    assert_eq!(config.policy, ComputePolicy::Off);
}

#[test]
fn every_file_error_names_path_field_and_problem() {
    // (text, field, words the problem must contain)
    let cases: &[(&str, &str, &str)] = &[
        ("", "", "empty"),
        ("{", "", "not valid JSON"),
        ("[]", "", "top level must be a JSON object"),
        (r#"{"devices": []}"#, "version", "missing"),
        (
            r#"{"version": 2, "devices": []}"#,
            "version",
            "unsupported version 2",
        ),
        (
            r#"{"version": "1", "devices": []}"#,
            "version",
            "unsupported version",
        ),
        (r#"{"version": 1}"#, "devices", "missing"),
        (
            r#"{"version": 1, "devices": {}}"#,
            "devices",
            "expected a list",
        ),
        (
            r#"{"version": 1, "devices": [], "polcy": "cap"}"#,
            "polcy",
            "unknown field \"polcy\"",
        ),
        (
            r#"{"version": 1, "devices": [], "policy": "fast"}"#,
            "policy",
            "\"fast\" is not a policy",
        ),
        (
            r#"{"version": 1, "devices": [], "policy": 1}"#,
            "policy",
            "expected a string",
        ),
        (
            r#"{"version": 1, "devices": [], "log": "loud"}"#,
            "log",
            "not a log level",
        ),
        (
            r#"{"version": 1, "devices": [], "region": "slice.region"}"#,
            "region",
            "relative",
        ),
        (
            r#"{"version": 1, "devices": [], "region": ""}"#,
            "region",
            "empty",
        ),
        (
            r#"{"version": 1, "devices": [], "region": 5}"#,
            "region",
            "expected a path string",
        ),
        (
            r#"{"version": 1, "devices": [7]}"#,
            "devices[0]",
            "expected an object",
        ),
        (
            r#"{"version": 1, "devices": [{"memory": "8g"}]}"#,
            "devices[0]",
            "names no device",
        ),
        (
            r#"{"version": 1, "devices": [{"uuid": "GPU-1", "index": 0}]}"#,
            "devices[0]",
            "both",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memroy": "8g"}]}"#,
            "devices[0].memroy",
            "unknown field",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#,
            "devices[0].memory",
            "unknown unit \"XB\"",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": 0}]}"#,
            "devices[0].memory",
            "0 would refuse every allocation; omit memory to leave it unlimited",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "0GiB"}]}"#,
            "devices[0].memory",
            "0 would refuse every allocation",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": -5}]}"#,
            "devices[0].memory",
            "negative",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "-5g"}]}"#,
            "devices[0].memory",
            "negative",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": 1.5}]}"#,
            "devices[0].memory",
            "whole number of bytes",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": 18446744073709551616}]}"#,
            "devices[0].memory",
            "whole number of bytes",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": null}]}"#,
            "devices[0].memory",
            "omit memory",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": true}]}"#,
            "devices[0].memory",
            "expected a size",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "compute": 0}]}"#,
            "devices[0].compute",
            "1..=100",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "virtual": "16GiB"}]}"#,
            "devices[0].virtual",
            "needs \"memory\" beside it",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "8GiB", "virtual": "4GiB"}]}"#,
            "devices[0].virtual",
            "4 GiB is smaller than memory (8 GiB)",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "8GiB", "virtual": 0}]}"#,
            "devices[0].virtual",
            "0 would refuse",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "8GiB", "virtual": "lots"}]}"#,
            "devices[0].virtual",
            "not a size",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "8GiB", "virtal": "9GiB"}]}"#,
            "devices[0].virtal",
            "known fields: uuid, index, memory, compute, virtual",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "compute": 101}]}"#,
            "devices[0].compute",
            "1..=100",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "compute": "50"}]}"#,
            "devices[0].compute",
            "1..=100",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 16}]}"#,
            "devices[0].index",
            "out of range",
        ),
        (
            r#"{"version": 1, "devices": [{"index": -1}]}"#,
            "devices[0].index",
            "expected a device index",
        ),
        (
            r#"{"version": 1, "devices": [{"uuid": ""}]}"#,
            "devices[0].uuid",
            "empty",
        ),
        (
            r#"{"version": 1, "devices": [{"uuid": 5}]}"#,
            "devices[0].uuid",
            "expected a string",
        ),
        (
            r#"{"version": 1, "devices": [{"uuid": "GPU 1"}]}"#,
            "devices[0].uuid",
            "is not a GPU UUID",
        ),
        (
            r#"{"version": 1, "devices": [{"uuid": "GPU-0123456789012345678901234567890123456789012345678901234567890"}]}"#,
            "devices[0].uuid",
            "at most 63",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0}, {"index": 0}]}"#,
            "devices[1]",
            "already limited by devices[0]",
        ),
        (
            r#"{"version": 1, "devices": [{"uuid": "GPU-abababab-0000-0000-0000-000000000000"}, {"index": 1}, {"uuid": "GPU-ABABABAB-0000-0000-0000-000000000000"}]}"#,
            "devices[2]",
            "already limited by devices[0]",
        ),
        (
            r#"{"version": 1, "devices": [], "devices": []}"#,
            "",
            "duplicate key \"devices\"",
        ),
        (
            r#"{"version": 1, "devices": [{"index": 0, "memory": "1g", "memory": "2g"}]}"#,
            "",
            "duplicate key \"memory\"",
        ),
    ];
    for (text, field, problem) in cases {
        let err = file(text).expect_err(text);
        assert_eq!(err.origin, "/etc/gpuslice/limits.json", "{text}");
        assert_eq!(err.field, *field, "{text}: {err}");
        assert!(err.problem.contains(problem), "{text}: {err}");
        let line = err.to_string();
        assert!(
            line.contains("/etc/gpuslice/limits.json") && line.contains(problem),
            "{line}"
        );
    }
}

#[test]
fn a_future_version_is_reported_before_its_unknown_fields() {
    let err = file(r#"{"version": 2, "devices": [], "gpus": []}"#).unwrap_err();
    assert_eq!(err.field, "version");
}

#[test]
fn limit_for_prefers_uuid_then_index() {
    let config = SliceConfig {
        source: ConfigSource::Env,
        devices: vec![
            index_limit(0, Some(GIB), None),
            uuid_limit("GPU-AAA", Some(2 * GIB), None),
        ],
        region_path: None,
        policy: ComputePolicy::Cap,
        priority: Default::default(),
        log_level: None,
        context_bound: None,
    };
    assert_eq!(
        config.limit_for(0, "gpu-aaa").unwrap().memory_limit,
        Some(2 * GIB)
    );
    assert_eq!(
        config.limit_for(0, "GPU-BBB").unwrap().memory_limit,
        Some(GIB)
    );
    assert_eq!(
        config.limit_for(3, "GPU-AAA").unwrap().memory_limit,
        Some(2 * GIB)
    );
    assert!(config.limit_for(1, "GPU-BBB").is_none());
}

#[test]
fn round_trips_through_to_json() {
    let text = r#"{"version": 1, "region": "/run/a.region", "policy": "off", "log": "trace",
        "devices": [{"uuid": "GPU-00000001-0000-0000-0000-000000000001", "memory": "1.5GiB", "compute": 30},
                    {"index": 2, "memory": 1025}, {"index": 3, "compute": 100}, {"index": 4}]}"#;
    let config = file(text).unwrap();
    let written = to_json(&config);
    assert!(written.contains("\"1.5 GiB\""), "{written}");
    assert!(written.contains("\"memory\": 1025"), "{written}");
    assert_eq!(file(&written).unwrap(), config);
    let bare = file(r#"{"version": 1, "devices": []}"#).unwrap();
    assert_eq!(file(&to_json(&bare)).unwrap(), bare);
}

#[test]
fn hami_env_table() {
    struct Case {
        env: &'static [(&'static str, &'static str)],
        devices: Vec<DeviceLimit>,
        policy: ComputePolicy,
        region: Option<&'static str>,
        log: Option<LogLevel>,
    }
    let all = |memory: Option<u64>, compute: Option<u32>| -> Vec<DeviceLimit> {
        (0..MAX_DEVICES as u32)
            .map(|i| index_limit(i, memory, compute))
            .collect()
    };
    let cases = vec![
        Case {
            env: &[("CUDA_DEVICE_MEMORY_LIMIT", "3000m")],
            devices: all(Some(3000 * MIB), None),
            policy: ComputePolicy::Cap,
            region: None,
            log: None,
        },
        Case {
            env: &[
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "8g"),
                ("CUDA_DEVICE_SM_LIMIT_1", "30"),
            ],
            devices: vec![index_limit(1, Some(8 * GIB), Some(30))],
            policy: ComputePolicy::Cap,
            region: None,
            log: None,
        },
        Case {
            env: &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_2", "1g"),
                ("CUDA_DEVICE_SM_LIMIT", "50"),
                ("CUDA_DEVICE_SM_LIMIT_3", "0"),
            ],
            devices: (0..MAX_DEVICES as u32)
                .map(|i| match i {
                    2 => index_limit(2, Some(GIB), Some(50)),
                    3 => index_limit(3, Some(4 * GIB), None),
                    _ => index_limit(i, Some(4 * GIB), Some(50)),
                })
                .collect(),
            policy: ComputePolicy::Cap,
            region: None,
            log: None,
        },
        Case {
            // HAMi: 0 memory and 0/100 percent mean "not limited".
            env: &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
                ("CUDA_DEVICE_SM_LIMIT", "100"),
            ],
            devices: vec![],
            policy: ComputePolicy::Cap,
            region: None,
            log: None,
        },
        Case {
            // An index override of 0 lifts the default for that index only.
            env: &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
            ],
            devices: (1..MAX_DEVICES as u32)
                .map(|i| index_limit(i, Some(2 * GIB), None))
                .collect(),
            policy: ComputePolicy::Cap,
            region: None,
            log: None,
        },
        Case {
            env: &[
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/x.cache"),
                ("GPU_CORE_UTILIZATION_POLICY", "disable"),
                ("LIBCUDA_LOG_LEVEL", "4"),
            ],
            devices: vec![],
            policy: ComputePolicy::Off,
            region: Some("/tmp/vgpu/x.cache"),
            log: Some(LogLevel::Debug),
        },
        Case {
            env: &[
                ("GPU_CORE_UTILIZATION_POLICY", "FORCE"),
                ("LIBCUDA_LOG_LEVEL", "0"),
            ],
            devices: vec![],
            policy: ComputePolicy::Cap,
            region: None,
            log: Some(LogLevel::Error),
        },
        Case {
            env: &[
                ("GPU_CORE_UTILIZATION_POLICY", "default"),
                ("LIBCUDA_LOG_LEVEL", "2"),
            ],
            devices: vec![],
            policy: ComputePolicy::Cap,
            region: None,
            log: Some(LogLevel::Warn),
        },
    ];
    for case in cases {
        let config = from_hami_env(&env(case.env))
            .unwrap_or_else(|e| panic!("{:?}: {e}", case.env))
            .unwrap_or_else(|| panic!("{:?} gave no config", case.env));
        assert_eq!(config.source, ConfigSource::Env);
        assert_eq!(config.devices, case.devices, "{:?}", case.env);
        assert_eq!(config.policy, case.policy, "{:?}", case.env);
        assert_eq!(
            config.region_path,
            case.region.map(PathBuf::from),
            "{:?}",
            case.env
        );
        assert_eq!(config.log_level, case.log, "{:?}", case.env);
    }
}

#[test]
fn hami_env_absent_or_empty_is_none() {
    assert_eq!(from_hami_env(&env(&[])), Ok(None));
    assert_eq!(
        from_hami_env(&env(&[("CUDA_DEVICE_MEMORY_LIMIT", "")])),
        Ok(None)
    );
    assert_eq!(from_hami_env(&env(&[("UNRELATED", "1")])), Ok(None));
}

#[test]
fn bad_hami_values_name_the_variable() {
    let cases: &[(&str, &str, &str)] = &[
        ("CUDA_DEVICE_MEMORY_LIMIT", "banana", "not a size"),
        ("CUDA_DEVICE_MEMORY_LIMIT_3", "-1g", "negative"),
        ("CUDA_DEVICE_SM_LIMIT", "150", "1..=100"),
        ("CUDA_DEVICE_SM_LIMIT_0", "half", "1..=100"),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "relative.cache",
            "relative",
        ),
        ("GPU_CORE_UTILIZATION_POLICY", "sometimes", "not a policy"),
        ("LIBCUDA_LOG_LEVEL", "loud", "not a log level"),
        ("CUDA_TASK_PRIORITY", "2", "not a task priority"),
        ("CUDA_TASK_PRIORITY", "high", "not a task priority"),
    ];
    for (name, value, problem) in cases {
        let err = from_hami_env(&env(&[(name, value)])).expect_err(name);
        assert_eq!(err.origin, *name);
        assert!(err.problem.contains(problem), "{name}={value}: {err}");
        assert!(err.to_string().contains(name));
        let Loaded::Invalid(err) = load(&env(&[(name, value), (CONFIG_ENV, "")])) else {
            panic!("{name}={value} did not fail closed");
        };
        assert_eq!(err.origin, *name);
    }
}

/// A temp directory removed on drop (no tempfile crate in the dependency set).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gpuslice-config-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn file_wins_over_hami_env() {
    let dir = TempDir::new("precedence");
    let path = dir.path("limits.json");
    std::fs::write(
        &path,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "2g"}]}"#,
    )
    .unwrap();
    let path_str = path.to_str().unwrap();
    let loaded = load(&env(&[
        (CONFIG_ENV, path_str),
        ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
    ]));
    let Loaded::Configured(config) = loaded else {
        panic!("{loaded:?}")
    };
    assert_eq!(config.source, ConfigSource::File(path.clone()));
    assert_eq!(config.devices, vec![index_limit(0, Some(2 * GIB), None)]);
    assert_eq!(config.policy, ComputePolicy::Cap);
}

#[test]
fn hami_env_is_used_when_no_file_exists() {
    // No GPUSLICE_CONFIG: the default path (absent on a build machine) falls through to env.
    if Path::new(DEFAULT_CONFIG_PATH).exists() {
        return; // a real installation; precedence is covered by the explicit-path tests
    }
    let loaded = load(&env(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")]));
    let Loaded::Configured(config) = loaded else {
        panic!("{loaded:?}")
    };
    assert_eq!(config.source, ConfigSource::Env);
    assert_eq!(config.devices, vec![index_limit(0, Some(GIB), None)]);
    assert_eq!(load(&env(&[])), Loaded::Unconfigured);
}

#[test]
fn explicit_config_path_that_is_missing_fails_closed() {
    let dir = TempDir::new("missing");
    let path = dir.path("nope.json");
    let loaded = load(&env(&[
        (CONFIG_ENV, path.to_str().unwrap()),
        ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
    ]));
    let Loaded::Invalid(err) = loaded else {
        panic!("{loaded:?}")
    };
    assert_eq!(err.origin, path.display().to_string());
    assert!(err.problem.contains("does not exist"), "{err}");
}

#[test]
fn malformed_or_unreadable_file_fails_closed_with_path_field_problem() {
    let dir = TempDir::new("malformed");
    let path = dir.path("limits.json");
    std::fs::write(
        &path,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#,
    )
    .unwrap();
    let loaded = load(&env(&[(CONFIG_ENV, path.to_str().unwrap())]));
    let Loaded::Invalid(err) = loaded else {
        panic!("{loaded:?}")
    };
    let line = err.to_string();
    assert!(line.contains(path.to_str().unwrap()), "{line}");
    assert!(line.contains("devices[0].memory"), "{line}");
    assert!(line.contains("unknown unit"), "{line}");

    // A directory where the file should be cannot be read: still Invalid, never unlimited.
    let loaded = load(&env(&[(CONFIG_ENV, dir.0.to_str().unwrap())]));
    assert!(
        matches!(loaded, Loaded::Invalid(ref e) if e.problem.contains("cannot be read")),
        "{loaded:?}"
    );

    std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
    let loaded = load(&env(&[(CONFIG_ENV, path.to_str().unwrap())]));
    assert!(
        matches!(loaded, Loaded::Invalid(ref e) if e.problem.contains("UTF-8")),
        "{loaded:?}"
    );
}

#[test]
fn log_level_precedence() {
    let dir = TempDir::new("log");
    let with_log = dir.path("with.json");
    let without_log = dir.path("without.json");
    std::fs::write(&with_log, r#"{"version": 1, "devices": [], "log": "info"}"#).unwrap();
    std::fs::write(&without_log, r#"{"version": 1, "devices": []}"#).unwrap();
    let level = |pairs: &[(&str, &str)]| match load(&env(pairs)) {
        Loaded::Configured(config) => config.log_level,
        other => panic!("{other:?}"),
    };
    let with = with_log.to_str().unwrap();
    let without = without_log.to_str().unwrap();
    assert_eq!(level(&[(CONFIG_ENV, with)]), Some(LogLevel::Info));
    assert_eq!(
        level(&[(CONFIG_ENV, with), (LOG_ENV, "trace")]),
        Some(LogLevel::Trace)
    );
    assert_eq!(
        level(&[(CONFIG_ENV, with), (HAMI_LOG_LEVEL_ENV, "4")]),
        Some(LogLevel::Info)
    );
    assert_eq!(
        level(&[(CONFIG_ENV, without), (HAMI_LOG_LEVEL_ENV, "4")]),
        Some(LogLevel::Debug)
    );
    assert_eq!(level(&[(CONFIG_ENV, without)]), None);
    assert_eq!(
        level(&[
            (CONFIG_ENV, without),
            (LOG_ENV, "off"),
            (HAMI_LOG_LEVEL_ENV, "4")
        ]),
        Some(LogLevel::Off)
    );
    let loaded = load(&env(&[(CONFIG_ENV, with), (LOG_ENV, "loud")]));
    assert!(
        matches!(loaded, Loaded::Invalid(ref e) if e.origin == LOG_ENV),
        "{loaded:?}"
    );
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
        "[0-9]{1,4}[kmgKMG]?(iB)?".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("version".to_string()),
            Just("devices".to_string()),
            Just("uuid".to_string()),
            Just("index".to_string()),
            Just("memory".to_string()),
            Just("compute".to_string()),
            Just("policy".to_string()),
            Just("region".to_string()),
            "[a-z]{1,6}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arbitrary_config() -> impl Strategy<Value = SliceConfig> {
    let selector = prop_oneof![
        (0u32..MAX_DEVICES as u32).prop_map(DeviceSelector::Index),
        "GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
            .prop_map(DeviceSelector::Uuid),
    ];
    let limit = (
        selector,
        prop::option::of(1u64..),
        prop::option::of(1u32..=100),
        prop::option::of(0u64..),
    )
        .prop_map(
            |(selector, memory_limit, compute_percent, excess)| DeviceLimit {
                selector,
                memory_limit,
                compute_percent,
                // Only beside a memory cap, and never below it.
                virtual_memory: memory_limit.zip(excess).map(|(m, e)| m.saturating_add(e)),
            },
        );
    let policy = prop::sample::select(vec![
        ComputePolicy::Cap,
        ComputePolicy::Burst,
        ComputePolicy::Off,
    ]);
    let priority = prop::sample::select(vec![Priority::High, Priority::Normal, Priority::Low]);
    let log = prop::option::of(prop::sample::select(vec![
        LogLevel::Off,
        LogLevel::Error,
        LogLevel::Warn,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Trace,
    ]));
    (
        prop::collection::vec(limit, 0..6),
        prop::option::of("/[a-z]{1,8}/[a-z.]{1,8}"),
        policy,
        priority,
        log,
        prop::option::of(1u64..=super::parse::MAX_CONTEXT_BOUND),
    )
        .prop_map(
            |(limits, region, policy, priority, log_level, context_bound)| {
                let mut devices: Vec<DeviceLimit> = Vec::new();
                for limit in limits {
                    if !devices
                        .iter()
                        .any(|d| same_selector(&d.selector, &limit.selector))
                    {
                        devices.push(limit);
                    }
                }
                SliceConfig {
                    source: ConfigSource::File("/p.json".into()),
                    devices,
                    region_path: region.map(PathBuf::from),
                    policy,
                    priority,
                    log_level,
                    context_bound,
                }
            },
        )
}

proptest! {
    #[test]
    fn arbitrary_json_never_panics(value in arbitrary_json()) {
        let text = value.to_string();
        if let Err(err) = file(&text) {
            prop_assert!(!err.problem.is_empty());
        }
        let mut versioned = value.clone();
        if let Value::Object(map) = &mut versioned {
            map.insert("version".into(), Value::from(1));
            let _ = file(&versioned.to_string());
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,64}") {
        let _ = file(&text);
    }

    #[test]
    fn arbitrary_devices_never_panic(devices in prop::collection::vec(arbitrary_json(), 0..4)) {
        let text = serde_json::json!({"version": 1, "devices": devices}).to_string();
        let _ = file(&text);
    }

    #[test]
    fn to_json_round_trips(config in arbitrary_config()) {
        let text = to_json(&config);
        prop_assert_eq!(parse_limit_file(Path::new("/p.json"), &text), Ok(config));
    }

    #[test]
    fn arbitrary_hami_env_never_panics(
        memory in ".{0,10}", sm in ".{0,5}", policy in ".{0,8}", level in ".{0,3}"
    ) {
        let get = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", memory.as_str()),
            ("CUDA_DEVICE_SM_LIMIT_2", sm.as_str()),
            ("GPU_CORE_UTILIZATION_POLICY", policy.as_str()),
            ("LIBCUDA_LOG_LEVEL", level.as_str()),
        ]);
        let _ = from_hami_env(&get);
    }
}

// ---- A limit file that cannot fail open ----

const UUID_A: &str = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf";

fn one_device(selector_json: &str) -> Result<SliceConfig, ConfigError> {
    file(&format!(
        r#"{{"version": 1, "devices": [{{{selector_json}, "memory": "1GiB"}}]}}"#
    ))
}

#[test]
fn a_malformed_uuid_is_a_syntax_error_naming_the_entry() {
    let cases = [
        // One character short, one too many, one not hex.
        (&UUID_A[..UUID_A.len() - 1], "is not a GPU UUID"),
        (&format!("{UUID_A}0") as &str, "is not a GPU UUID"),
        (&UUID_A.replace('f', "g") as &str, "is not a GPU UUID"),
        // nvidia-smi's UUID without its prefix gets a precise hint.
        (&UUID_A[4..], "lacks the \"GPU-\" prefix"),
        ("GPU-8a5d", "is not a GPU UUID"),
        (
            "MIG-GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf/1",
            "is not a GPU UUID",
        ),
    ];
    for (uuid, problem) in cases {
        let err = one_device(&format!(r#""uuid": "{uuid}""#)).expect_err(uuid);
        assert_eq!(err.field, "devices[0].uuid", "{uuid}: {err}");
        assert!(err.problem.contains(problem), "{uuid}: {err}");
    }
    for uuid in [
        UUID_A,
        &UUID_A.to_uppercase(),
        "gpu-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf",
        "MIG-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf",
        "MIG-GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf/1/0",
    ] {
        let config = one_device(&format!(r#""uuid": "{uuid}""#)).expect(uuid);
        assert_eq!(
            config.devices[0].selector,
            DeviceSelector::Uuid(uuid.into())
        );
    }
}

fn limits_file(memory: &str) -> String {
    format!(r#"{{"version": 1, "devices": [{{"index": 0, "memory": "{memory}"}}]}}"#)
}

fn memory_of(loaded: &Loaded) -> Option<u64> {
    match loaded {
        Loaded::Configured(config) => config.devices.first()?.memory_limit,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_anchored_file_wins_over_every_environment_variable() {
    let dir = TempDir::new("anchored");
    let anchor = dir.path("limits.json");
    let tenant = dir.path("tenant.json");
    std::fs::write(&anchor, limits_file("1GiB")).unwrap();
    std::fs::write(&tenant, limits_file("64GiB")).unwrap();
    let tenant_env = env(&[
        (CONFIG_ENV, tenant.to_str().unwrap()),
        ("CUDA_DEVICE_MEMORY_LIMIT", "64g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "64g"),
        ("CUDA_DEVICE_SM_LIMIT", "0"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine.region"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
    ]);
    let outcome = load_anchored(&anchor, &tenant_env);
    assert!(outcome.anchored);
    assert_eq!(memory_of(&outcome.loaded), Some(GIB));
    let Loaded::Configured(config) = &outcome.loaded else {
        unreachable!()
    };
    assert_eq!(config.source, ConfigSource::File(anchor.clone()));
    assert_eq!(config.region_path, None);
    assert_eq!(config.policy, ComputePolicy::Cap);
    assert_eq!(outcome.warnings.len(), 6, "{:?}", outcome.warnings);
    for name in [
        CONFIG_ENV,
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "GPU_CORE_UTILIZATION_POLICY",
    ] {
        assert!(
            outcome
                .warnings
                .iter()
                .any(|w| w.starts_with(&format!("{name}="))
                    && w.contains("is ignored")
                    && w.contains(anchor.to_str().unwrap())),
            "{name}: {:?}",
            outcome.warnings
        );
    }

    // GPUSLICE_CONFIG naming the anchored file itself (the CDI spec sets it so): no warning.
    let outcome = load_anchored(&anchor, &env(&[(CONFIG_ENV, anchor.to_str().unwrap())]));
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);

    // An anchored file that is broken fails closed; a valid tenant file does not rescue it.
    std::fs::write(&anchor, limits_file("8XB")).unwrap();
    let outcome = load_anchored(&anchor, &env(&[(CONFIG_ENV, tenant.to_str().unwrap())]));
    assert!(outcome.anchored);
    assert!(
        matches!(&outcome.loaded, Loaded::Invalid(e) if e.origin == anchor.display().to_string()),
        "{:?}",
        outcome.loaded
    );

    // No anchored file: the environment route serves (a developer's machine, `gpuslice run`).
    std::fs::remove_file(&anchor).unwrap();
    let outcome = load_anchored(&anchor, &tenant_env);
    assert!(!outcome.anchored);
    assert!(outcome.warnings.is_empty());
    assert_eq!(memory_of(&outcome.loaded), Some(64 * GIB));
}

#[test]
fn an_anchored_path_that_cannot_be_read_fails_closed_instead_of_using_the_env() {
    let dir = TempDir::new("anchordir");
    let anchor = dir.path("limits.json");
    std::fs::create_dir(&anchor).unwrap();
    let outcome = load_anchored(&anchor, &env(&[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]));
    assert!(outcome.anchored);
    assert!(
        matches!(&outcome.loaded, Loaded::Invalid(e) if e.problem.contains("cannot be read")),
        "{:?}",
        outcome.loaded
    );
}

#[test]
fn a_limit_file_is_bounded_in_size_and_entries() {
    let entry = format!(r#"{{"uuid": "{UUID_A}"}}"#);
    // Text over 1 MiB: refused before JSON parsing, whatever it holds.
    let huge = format!(
        r#"{{"version": 1, "devices": [{}]}}"#,
        vec![entry.as_str(); 30_000].join(",")
    );
    assert!(huge.len() > MAX_FILE_BYTES);
    let err = file(&huge).unwrap_err();
    assert_eq!(err.field, "");
    assert!(err.problem.contains("at most 1048576 bytes"), "{err}");

    // The same on disk: read only up to the limit.
    let dir = TempDir::new("huge");
    let path = dir.path("limits.json");
    std::fs::write(&path, &huge).unwrap();
    let loaded = load_anchored(
        &dir.path("absent"),
        &env(&[(CONFIG_ENV, path.to_str().unwrap())]),
    )
    .loaded;
    assert!(
        matches!(&loaded, Loaded::Invalid(e) if e.problem.contains("larger than 1048576 bytes")),
        "{loaded:?}"
    );

    // Entries: the limit is accepted, one more is not.
    let entries = |n: usize| {
        let list: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"uuid": "GPU-{i:08x}-0000-0000-0000-000000000000"}}"#))
            .collect();
        format!(r#"{{"version": 1, "devices": [{}]}}"#, list.join(","))
    };
    assert_eq!(
        file(&entries(MAX_DEVICE_ENTRIES)).unwrap().devices.len(),
        MAX_DEVICE_ENTRIES
    );
    let err = file(&entries(MAX_DEVICE_ENTRIES + 1)).unwrap_err();
    assert_eq!(err.field, "devices");
    assert!(err.problem.contains("at most 128"), "{err}");
}

#[test]
fn duplicate_detection_still_finds_the_first_entry_among_many() {
    let mut list: Vec<String> = (0..100)
        .map(|i| format!(r#"{{"uuid": "GPU-{i:08x}-0000-0000-0000-000000000000"}}"#))
        .collect();
    list.push(r#"{"uuid": "GPU-0000002A-0000-0000-0000-000000000000"}"#.into());
    let err = file(&format!(
        r#"{{"version": 1, "devices": [{}]}}"#,
        list.join(",")
    ))
    .unwrap_err();
    assert_eq!(err.field, "devices[100]");
    assert!(
        err.problem.contains("already limited by devices[42]"),
        "{err}"
    );
}

#[test]
fn region_paths_the_file_system_cannot_hold_are_refused() {
    let long_name = format!("/run/{}.region", "r".repeat(300));
    let err = file(&format!(
        r#"{{"version": 1, "region": "{long_name}", "devices": []}}"#
    ))
    .unwrap_err();
    assert_eq!(err.field, "region");
    assert!(err.problem.contains("at most 255"), "{err}");
    let long_path = format!("{}/x.region", "/abc".repeat(1100));
    let err = file(&format!(
        r#"{{"version": 1, "region": "{long_path}", "devices": []}}"#
    ))
    .unwrap_err();
    assert!(err.problem.contains("at most 4095"), "{err}");
}

#[test]
fn every_message_is_bounded_whatever_the_input_size() {
    let big = "x".repeat(900_000);
    let texts = [
        format!(r#"{{"version": 1, "region": "/{big}", "devices": []}}"#),
        format!(r#"{{"version": 1, "region": "{big}", "devices": []}}"#),
        format!(r#"{{"version": 1, "policy": "{big}", "devices": []}}"#),
        format!(r#"{{"version": 1, "log": "{big}", "devices": []}}"#),
        format!(r#"{{"version": 1, "devices": [{{"uuid": "{big}"}}]}}"#),
        format!(r#"{{"version": 1, "devices": [{{"index": 0, "memory": "{big}"}}]}}"#),
        format!(r#"{{"version": 1, "{big}": 1, "devices": []}}"#),
    ];
    for text in &texts {
        let err = parse_limit_file(Path::new(&format!("/{big}.json")), text).unwrap_err();
        let line = err.to_string();
        assert!(line.len() <= 2048, "{} bytes: {}", line.len(), &line[..200]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Files with up to twice the entry limit of near-valid entries (random UUID-ish text,
    /// indices, duplicates): never a panic, and every refusal is one bounded line.
    #[test]
    fn many_random_entries_never_panic_and_errors_stay_bounded(
        entries in prop::collection::vec(
            prop_oneof![
                "GPU-[0-9a-fA-F-]{0,40}".prop_map(|u| serde_json::json!({"uuid": u})),
                "[0-9a-f]{8}".prop_map(|h| serde_json::json!(
                    {"uuid": format!("GPU-{h}-0000-0000-0000-000000000000"), "memory": "1g"}
                )),
                (0u32..20).prop_map(|i| serde_json::json!({"index": i, "compute": 50})),
            ],
            0..2 * MAX_DEVICE_ENTRIES,
        )
    ) {
        let text = serde_json::json!({"version": 1, "devices": entries}).to_string();
        match file(&text) {
            Ok(config) => prop_assert!(config.devices.len() <= MAX_DEVICE_ENTRIES),
            Err(err) => prop_assert!(err.to_string().len() <= 2048),
        }
    }
}

#[test]
fn priority_comes_from_the_file_or_hamis_task_priority_and_defaults_to_normal() {
    let parsed = |text: &str| file(text).map(|c| c.priority);
    assert_eq!(
        parsed(r#"{"version": 1, "devices": []}"#),
        Ok(Priority::Normal)
    );
    for (name, priority) in [
        ("high", Priority::High),
        ("Normal", Priority::Normal),
        ("LOW", Priority::Low),
    ] {
        let text = format!(r#"{{"version": 1, "devices": [], "priority": "{name}"}}"#);
        assert_eq!(parsed(&text), Ok(priority), "{name}");
    }
    for (text, problem) in [
        (
            r#"{"version": 1, "devices": [], "priority": "urgent"}"#,
            "\"urgent\" is not a priority",
        ),
        (
            r#"{"version": 1, "devices": [], "priority": 0}"#,
            "expected a string",
        ),
    ] {
        let err = file(text).expect_err(text);
        assert_eq!(err.field, "priority", "{err}");
        assert!(err.problem.contains(problem), "{err}");
    }
    let hami = |value: &str| {
        from_hami_env(&env(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_TASK_PRIORITY", value),
        ]))
        .map(|c| c.map(|c| c.priority))
    };
    assert_eq!(hami("0"), Ok(Some(Priority::High)));
    assert_eq!(hami(" 1 "), Ok(Some(Priority::Low)));
    assert_eq!(hami(""), Ok(Some(Priority::Normal)), "empty is unset");
    assert_eq!(
        from_hami_env(&env(&[("CUDA_TASK_PRIORITY", "0")])),
        Ok(None),
        "a priority alone is no slice (HAMi's webhook sets it on every pod)"
    );
    // Round trip: a non-default priority is written, the default is left out.
    let low = file(r#"{"version": 1, "devices": [], "priority": "low"}"#).unwrap();
    assert!(to_json(&low).contains("\"priority\": \"low\""));
    assert_eq!(file(&to_json(&low)).unwrap().priority, Priority::Low);
    let normal = file(r#"{"version": 1, "devices": []}"#).unwrap();
    assert!(!to_json(&normal).contains("priority"));
}

#[test]
fn hami_variables_past_the_device_limit_are_refused_not_ignored() {
    for name in ["CUDA_DEVICE_MEMORY_LIMIT_16", "CUDA_DEVICE_SM_LIMIT_200"] {
        let error = from_hami_env(&env(&[(name, "1")])).unwrap_err();
        assert_eq!(error.origin, name);
        assert!(error.problem.contains("leave the device"), "{error}");
    }
}

#[test]
fn hami_indexed_variables_name_their_devices_and_defaults_name_none() {
    let get = env(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_7", "1g"),
        ("CUDA_DEVICE_SM_LIMIT_0", "50"),
        ("CUDA_DEVICE_SM_LIMIT_2", " "),
    ]);
    assert_eq!(
        hami_indexed_variables(&get),
        vec![
            ("CUDA_DEVICE_SM_LIMIT_0".to_string(), 0),
            ("CUDA_DEVICE_MEMORY_LIMIT_7".to_string(), 7),
        ]
    );
}

#[test]
fn the_context_bound_is_a_size_within_what_a_card_holds() {
    let with = |value: &str| {
        file(&format!(
            r#"{{"version": 1, "context_overhead": {value}, "devices": []}}"#
        ))
    };
    assert_eq!(with(r#""768MiB""#).unwrap().context_bound, Some(768 << 20));
    assert_eq!(with("1073741824").unwrap().context_bound, Some(1 << 30));
    assert_eq!(
        file(r#"{"version": 1, "devices": []}"#)
            .unwrap()
            .context_bound,
        None
    );
    for (value, says) in [
        ("0", "0 would let contexts reserve nothing"),
        (r#""2TiB""#, "more than any card holds"),
        (r#""lots""#, "lots"),
        ("-5", "not a whole number"),
        ("true", "expected a size"),
    ] {
        let err = with(value).unwrap_err();
        assert_eq!(err.field, "context_overhead", "{value}");
        assert!(err.problem.contains(says), "{value}: {}", err.problem);
    }
}
