//! Acceptance of the fake GPU through real clients, no shim: every lookup path (linked,
//! cudarc, cuGetProcAddress) must see the devices, memory and error codes the simulated
//! hardware defines, and what clients do must show up in the hardware truth (the state file)
//! and in `fakegpu smi`, across processes, until the process dies.

use cuda_e2e::{wait_until, Client, ClientKind, FakeGpu, DEFAULT_TIMEOUT, GIB, MIB};
use fakegpu::timeline::BUCKET_NS;
use serde_json::Value;

/// FAKEGPU_CTX_OVERHEAD's default: each context costs this much device memory.
const CTX_OVERHEAD: u64 = 300 * MIB;

/// Strips the field that names the client, so results of different paths compare equal.
fn without_client(mut v: Value) -> Value {
    v.as_object_mut().expect("object").remove("client");
    v
}

#[test]
fn info_matches_the_fake_devices_on_every_path() {
    let gpu = FakeGpu::start("v100,h200");
    let truth = gpu.truth();
    let mut outputs = Vec::new();
    for kind in ClientKind::ALL {
        let info = Client::run(kind, &["info"], &gpu.env());
        assert_eq!(info["client"], kind.label());
        assert_eq!(info["device_count"], 2, "{kind:?}: {info}");
        assert_eq!(info["driver_version"], 13000, "{kind:?}: {info}");
        for i in 0..2u32 {
            let spec = truth.device(i).expect("device in truth");
            let d = &info["devices"][i as usize];
            assert_eq!(d["name"], spec.name.as_str(), "{kind:?}: {d}");
            assert_eq!(d["uuid"], spec.uuid.as_str(), "{kind:?}: {d}");
            assert_eq!(d["total_memory"], spec.total_memory, "{kind:?}: {d}");
            assert_eq!(d["sm_count"], spec.sm_count, "{kind:?}: {d}");
            assert_eq!(
                d["max_threads_per_sm"], spec.max_threads_per_sm,
                "{kind:?}: {d}"
            );
            assert_eq!(d["cc_major"], spec.cc_major, "{kind:?}: {d}");
            assert_eq!(d["cc_minor"], spec.cc_minor, "{kind:?}: {d}");
        }
        outputs.push(without_client(info));
    }
    assert_eq!(outputs[0], outputs[1], "linked and cudarc disagree");
    assert_eq!(outputs[0], outputs[2], "linked and procaddr disagree");
    // The presets the conventions document.
    assert_eq!(truth.device(0).unwrap().name, "Tesla V100-PCIE-32GB");
    assert_eq!(truth.device(0).unwrap().total_memory, 32 * GIB);
    assert_eq!(truth.device(1).unwrap().name, "NVIDIA H200");
    assert_eq!(truth.device(1).unwrap().total_memory, 143_771 * MIB);
}

#[test]
fn driver_version_follows_the_environment() {
    let gpu = FakeGpu::start("v100");
    let mut env = gpu.env();
    env.push(("FAKEGPU_DRIVER_VERSION".into(), "12080".into()));
    for kind in ClientKind::ALL {
        let info = Client::run(kind, &["info"], &env);
        assert_eq!(info["driver_version"], 12080, "{kind:?}: {info}");
    }
}

#[test]
fn meminfo_reports_the_card_minus_the_context() {
    let gpu = FakeGpu::start("v100");
    for kind in ClientKind::ALL {
        let m = Client::run(kind, &["meminfo"], &gpu.env());
        assert_eq!(m["result"], "CUDA_SUCCESS", "{kind:?}: {m}");
        assert_eq!(m["total"], 32 * GIB, "{kind:?}: {m}");
        assert_eq!(m["device_total"], 32 * GIB, "{kind:?}: {m}");
        // Nobody else uses this GPU: free is the card minus this process's context.
        assert_eq!(m["free"], 32 * GIB - CTX_OVERHEAD, "{kind:?}: {m}");
    }
}

#[test]
fn errors_scenario_returns_the_drivers_codes_on_every_path() {
    let gpu = FakeGpu::start("v100");
    let expected = serde_json::json!({
        "device_count_before_init": "CUDA_ERROR_NOT_INITIALIZED",
        "device_get_before_init": "CUDA_ERROR_NOT_INITIALIZED",
        "mem_alloc_before_init": "CUDA_ERROR_NOT_INITIALIZED",
        "init": "CUDA_SUCCESS",
        "device_count_null": "CUDA_ERROR_INVALID_VALUE",
        "device_get_null": "CUDA_ERROR_INVALID_VALUE",
        "device_get_bad_ordinal": "CUDA_ERROR_INVALID_DEVICE",
        "device_total_mem_bad_device": "CUDA_ERROR_INVALID_DEVICE",
        "device_name_null": "CUDA_ERROR_INVALID_VALUE",
        "get_error_name_unknown_code": "CUDA_ERROR_INVALID_VALUE",
        "mem_alloc_no_context": "CUDA_ERROR_INVALID_CONTEXT",
        "mem_get_info_no_context": "CUDA_ERROR_INVALID_CONTEXT",
        "context": "CUDA_SUCCESS",
        "mem_get_info_null": "CUDA_ERROR_INVALID_VALUE",
        "mem_alloc_null": "CUDA_ERROR_INVALID_VALUE",
        "mem_alloc_zero": "CUDA_ERROR_INVALID_VALUE",
        "mem_free_unknown": "CUDA_ERROR_INVALID_VALUE",
        "mem_free_first": "CUDA_SUCCESS",
        "mem_free_twice": "CUDA_ERROR_INVALID_VALUE",
    });
    for kind in ClientKind::ALL {
        let e = Client::run(kind, &["errors"], &gpu.env());
        assert_eq!(e["checks"], expected, "{kind:?}");
    }
}

#[test]
fn alloc_until_oom_fills_exactly_the_card() {
    let gpu = FakeGpu::start("v100");
    // 32 GiB - 300 MiB context = 31.7 GiB: 31 one-GiB chunks fit, the 32nd does not.
    for kind in ClientKind::ALL {
        let r = Client::run(kind, &["alloc-until-oom", "1GiB"], &gpu.env());
        assert_eq!(r["count"], 31, "{kind:?}: {r}");
        assert_eq!(r["total_bytes"], 31 * GIB, "{kind:?}: {r}");
        assert_eq!(r["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{kind:?}: {r}");
        assert_eq!(
            r["mem_free_at_oom"],
            32 * GIB - CTX_OVERHEAD - 31 * GIB,
            "{kind:?}: {r}"
        );
        assert_eq!(
            r["free_results"],
            serde_json::json!({"CUDA_SUCCESS": 31}),
            "{kind:?}"
        );
        assert_eq!(
            r["mem_free_after"],
            32 * GIB - CTX_OVERHEAD,
            "{kind:?}: {r}"
        );
    }
    // The processes are gone: the hardware holds nothing.
    assert_eq!(gpu.truth().used_memory(0), 0);
    // Small chunks: rounding to 2 MiB granularity means 1-byte requests cost 2 MiB each.
    let r = Client::run(
        ClientKind::Linked,
        &["alloc-until-oom", "1", "--max", "100"],
        &gpu.env(),
    );
    assert_eq!(r["count"], 100, "{r}");
    assert_eq!(
        r["mem_free_at_oom"],
        32 * GIB - CTX_OVERHEAD - 100 * 2 * MIB,
        "allocations are charged in 2 MiB units: {r}"
    );
}

#[test]
fn caching_allocator_ends_at_the_card_limit() {
    let gpu = FakeGpu::start("v100");
    for kind in ClientKind::ALL {
        let r = Client::run(kind, &["caching-allocator"], &gpu.env());
        let total = r["total_held"].as_u64().expect("total_held");
        // It released one GiB block and refilled down to 2 MiB pieces: within 2 MiB of full.
        assert!(total <= 32 * GIB - CTX_OVERHEAD, "{kind:?}: {r}");
        assert!(total > 32 * GIB - CTX_OVERHEAD - 2 * MIB, "{kind:?}: {r}");
        let errors = r["errors"].as_array().expect("errors");
        assert!(
            errors
                .iter()
                .all(|e| e["error"] == "CUDA_ERROR_OUT_OF_MEMORY"),
            "{kind:?}: {r}"
        );
        assert_eq!(
            r["mem_free_at_oom"],
            32 * GIB - CTX_OVERHEAD - total,
            "{kind:?}: {r}"
        );
    }
}

#[test]
fn every_allocation_path_is_charged_in_the_hardware_truth() {
    let gpu = FakeGpu::start("v100");
    let truth = gpu.truth();
    for kind in ClientKind::ALL {
        for path in [
            "alloc", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap",
        ] {
            let held = Client::spawn(kind, &["hold", "256MiB", "--path", path], &gpu.env());
            assert_eq!(
                held.first["result"], "CUDA_SUCCESS",
                "{kind:?} {path}: {}",
                held.first
            );
            let pid = held.pid();
            // The context plus at least the 256 MiB (array rounding may add a little).
            let used = truth.used_memory(0);
            assert!(
                (CTX_OVERHEAD + 256 * MIB..=CTX_OVERHEAD + 260 * MIB).contains(&used),
                "{kind:?} {path}: hardware holds {used} bytes"
            );
            let mine = truth.processes(0).into_iter().find(|p| p.pid == pid);
            let mine = mine.unwrap_or_else(|| panic!("{kind:?} {path}: pid {pid} not in truth"));
            assert!(mine.used_memory >= 256 * MIB, "{kind:?} {path}: {mine:?}");
            assert_eq!(
                held.first["mem_free"].as_u64(),
                Some(32 * GIB - used),
                "{kind:?} {path}: cuMemGetInfo disagrees with the hardware"
            );
            assert!(held.release().success());
            wait_until(
                &format!("{kind:?} {path} memory is back"),
                DEFAULT_TIMEOUT,
                || truth.used_memory(0) == 0,
            );
        }
    }
}

#[test]
fn alloc_results_are_identical_on_every_path() {
    let gpu = FakeGpu::start("v100");
    let mut outputs = Vec::new();
    for kind in ClientKind::ALL {
        let r = Client::run(kind, &["alloc", "3GiB", "--count", "12"], &gpu.env());
        // 10 fit (30 GiB + context), the 11th and 12th do not.
        let results = r["results"].as_array().expect("results");
        assert_eq!(
            results.iter().filter(|c| *c == "CUDA_SUCCESS").count(),
            10,
            "{kind:?}: {r}"
        );
        assert_eq!(results[10], "CUDA_ERROR_OUT_OF_MEMORY", "{kind:?}: {r}");
        outputs.push(without_client(r));
    }
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);
}

#[test]
fn a_holding_process_is_seen_by_others_and_released_by_sigkill() {
    let gpu = FakeGpu::start("v100");
    let truth = gpu.truth();
    let held = Client::spawn(ClientKind::Linked, &["hold", "4GiB"], &gpu.env());
    assert_eq!(held.first["result"], "CUDA_SUCCESS", "{}", held.first);
    let pid = held.pid();
    assert_eq!(held.first["pid"], pid);

    // The hardware truth in this (parent) process.
    assert_eq!(truth.used_memory(0), CTX_OVERHEAD + 4 * GIB);
    let usage = truth.processes(0);
    assert!(
        usage
            .iter()
            .any(|p| p.pid == pid && p.used_memory >= 4 * GIB),
        "{usage:?}"
    );
    // Another client process on every path sees less free memory.
    for kind in ClientKind::ALL {
        let m = Client::run(kind, &["meminfo"], &gpu.env());
        assert_eq!(
            m["free"],
            32 * GIB - 2 * CTX_OVERHEAD - 4 * GIB,
            "{kind:?}: {m}"
        );
    }
    // The host's nvidia-smi.
    let smi = gpu.smi_json();
    let dev = &smi["devices"][0];
    assert_eq!(dev["memory_used"], CTX_OVERHEAD + 4 * GIB, "{smi}");
    assert!(
        dev["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .any(|p| p["pid"] == pid),
        "{smi}"
    );
    // NVML inside another process.
    let nvml = Client::run(ClientKind::Linked, &["nvml"], &gpu.env());
    assert_eq!(nvml["init"], "NVML_SUCCESS", "{nvml}");
    let nd = &nvml["devices"][0];
    assert_eq!(nd["memory"]["total"], 32 * GIB, "{nvml}");
    assert!(
        nd["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .any(|p| p["pid"] == pid),
        "{nvml}"
    );

    // SIGKILL: no cleanup runs in the child; the driver (fake) must release its memory.
    let status = held.kill();
    assert!(!status.success());
    wait_until(
        "the killed holder's memory is released",
        DEFAULT_TIMEOUT,
        || truth.used_memory(0) == 0,
    );
    assert!(truth.processes(0).iter().all(|p| p.pid != pid));
    let smi = gpu.smi_json();
    assert_eq!(smi["devices"][0]["memory_used"], 0, "{smi}");
}

#[test]
fn nvml_reports_the_fake_devices() {
    let gpu = FakeGpu::start("v100,h200");
    let nvml = Client::run(ClientKind::Linked, &["nvml"], &gpu.env());
    assert_eq!(nvml["init"], "NVML_SUCCESS", "{nvml}");
    assert_eq!(nvml["count"], 2, "{nvml}");
    for i in 0..2u32 {
        let spec = gpu.truth().device(i).unwrap();
        let d = &nvml["devices"][i as usize];
        assert_eq!(d["name"], spec.name.as_str(), "{d}");
        assert_eq!(d["uuid"], spec.uuid.as_str(), "{d}");
        assert_eq!(d["memory"]["total"], spec.total_memory, "{d}");
        assert_eq!(d["memory_v2_result"], "NVML_SUCCESS", "{d}");
        assert_eq!(d["processes_result"], "NVML_SUCCESS", "{d}");
    }
}

#[test]
fn procaddr_resolves_everything_at_12080_and_13000_with_and_without_per_thread() {
    let gpu = FakeGpu::start("v100");
    for version in ["12080", "13000"] {
        for per_thread in [false, true] {
            let mut args = vec!["--cuda-version", version];
            if per_thread {
                args.push("--per-thread");
            }
            let mut resolve = args.clone();
            resolve.push("resolve");
            let r = Client::run(ClientKind::ProcAddr, &resolve, &gpu.env());
            assert_eq!(
                r["missing"],
                serde_json::json!([]),
                "{version} {per_thread}: {r}"
            );
            // The runtime's probes: "" fails cleanly, cuGetProcAddress resolves itself.
            let probes = &r["probes"];
            assert_ne!(probes["empty"]["result"], 0, "{probes}");
            assert_eq!(probes["empty"]["found"], false, "{probes}");
            assert_eq!(probes["cuGetProcAddress_11030"]["found"], true, "{probes}");
            assert_eq!(probes["cuGetProcAddress_12000"]["found"], true, "{probes}");
            // Per-thread lookups hand out the _ptsz functions, different from the legacy ones.
            let distinct = r["per_thread_distinct"].as_object().expect("map");
            assert!(!distinct.is_empty());
            for (name, differs) in distinct {
                assert_eq!(
                    differs, true,
                    "{version}: {name} has no distinct _ptsz variant"
                );
            }
            // And the scenarios run through what it resolved.
            let mut alloc = args.clone();
            alloc.extend(["alloc", "1GiB", "--count", "2"]);
            let a = Client::run(ClientKind::ProcAddr, &alloc, &gpu.env());
            assert_eq!(a["ok"], 2, "{version} {per_thread}: {a}");
            let mut launch = args.clone();
            launch.extend([
                "launch",
                "--kernels",
                "5",
                "--ns-per-wave",
                "1000",
                "--path",
                "kernel",
            ]);
            let l = Client::run(ClientKind::ProcAddr, &launch, &gpu.env());
            assert_eq!(l["ok"], 5, "{version} {per_thread}: {l}");
        }
    }
}

#[test]
fn launches_advance_the_fake_busy_time_on_every_path() {
    let gpu = FakeGpu::start("v100");
    let truth = gpu.truth();
    // V100: 80 SMs x (2048 / 1024) blocks per SM = 160 blocks per wave. Grid 160 = one wave,
    // grid 161 = two waves. A cooperative grid must be resident all at once, so it never has a
    // second wave (the driver refuses it; checked below).
    for kind in ClientKind::ALL {
        for path in ["kernel", "ex", "cooperative", "graph"] {
            let shapes: &[(&str, u64)] = if path == "cooperative" {
                &[("160", 1)]
            } else {
                &[("160", 1), ("161", 2)]
            };
            for &(grid, waves) in shapes {
                for stream in ["default", "created"] {
                    let from = first_bucket_after(&gpu);
                    let r = Client::run(
                        kind,
                        &[
                            "launch",
                            "--kernels",
                            "4",
                            "--ns-per-wave",
                            "2000000",
                            "--grid",
                            grid,
                            "--block",
                            "1024",
                            "--stream",
                            stream,
                            "--path",
                            path,
                        ],
                        &gpu.env(),
                    );
                    assert_eq!(r["ok"], 4, "{kind:?} {path} {stream}: {r}");
                    assert_eq!(r["sync"], serde_json::json!({"CUDA_SUCCESS": 1}), "{r}");
                    // Whole buckets only: the timeline counts a partly covered bucket pro
                    // rata, which misses up to a bucket's worth when the client exits less
                    // than a bucket after its last kernel (seen: 7.91 ms of 8).
                    let end = fakegpu::now_ns().max(truth.busy_until(0));
                    let to = end.div_ceil(BUCKET_NS) * BUCKET_NS;
                    let busy = truth.busy_ns(0, None, from, to);
                    let expected = 4 * waves * 2_000_000;
                    // Exact but for rounding inside the timeline: allow 1% either way.
                    assert!(
                        busy.abs_diff(expected) <= expected / 100,
                        "{kind:?} {path} grid {grid} {stream}: busy {busy} ns, expected {expected}"
                    );
                    // Synchronising waits for the simulated kernels.
                    assert!(
                        r["elapsed_ns"].as_u64().unwrap() >= expected,
                        "{kind:?} {path}: returned before the kernels finished: {r}"
                    );
                }
            }
        }
    }
}

/// The start of the first timeline bucket after every kernel enqueued so far, once the clock
/// has reached it: a window from there holds nothing of earlier runs, in whole buckets.
fn first_bucket_after(gpu: &FakeGpu) -> u64 {
    let idle_from = fakegpu::now_ns().max(gpu.truth().busy_until(0));
    let boundary = (idle_from / BUCKET_NS + 1) * BUCKET_NS;
    // At most one bucket (1 ms) away: wait for the clock itself, not for a guessed delay.
    while fakegpu::now_ns() < boundary {
        std::thread::yield_now();
    }
    boundary
}

#[test]
fn a_cooperative_grid_larger_than_the_device_is_refused_on_every_path() {
    let gpu = FakeGpu::start("v100");
    for kind in ClientKind::ALL {
        let r = Client::run(
            kind,
            &[
                "launch",
                "--kernels",
                "1",
                "--ns-per-wave",
                "1000",
                "--grid",
                "161",
                "--block",
                "1024",
                "--path",
                "cooperative",
            ],
            &gpu.env(),
        );
        assert_eq!(
            r["codes"],
            serde_json::json!({"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": 1}),
            "{kind:?}: {r}"
        );
    }
}

#[test]
fn sixteen_threads_allocate_and_free_concurrently() {
    let gpu = FakeGpu::start("v100");
    for kind in ClientKind::ALL {
        let r = Client::run(
            kind,
            &[
                "threads",
                "--threads",
                "16",
                "--iterations",
                "50",
                "--size",
                "64MiB",
            ],
            &gpu.env(),
        );
        assert_eq!(
            r["alloc_results"],
            serde_json::json!({"CUDA_SUCCESS": 800}),
            "{kind:?}: {r}"
        );
        assert_eq!(
            r["free_results"],
            serde_json::json!({"CUDA_SUCCESS": 800}),
            "{kind:?}: {r}"
        );
        assert_eq!(
            r["mem_free_after"], r["mem_free_before"],
            "{kind:?}: leaked: {r}"
        );
    }
}

#[test]
fn concurrent_processes_never_overcommit_the_card() {
    // Eight processes race for 4 GiB each on a 32 GiB card (31.7 GiB after one context,
    // less with eight): the hardware must refuse what does not fit, never overcommit.
    let gpu = FakeGpu::start("v100");
    let truth = gpu.truth();
    let env = gpu.env();
    let holders: Vec<_> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..8)
            .map(|i| {
                let env = &env;
                s.spawn(move || Client::spawn(ClientKind::ALL[i % 3], &["hold", "4GiB"], env))
            })
            .collect();
        starting
            .into_iter()
            .map(|h| h.join().expect("spawn"))
            .collect()
    });
    let ok = holders
        .iter()
        .filter(|h| h.first["result"] == "CUDA_SUCCESS")
        .count() as u64;
    // 8 contexts = 2.34 GiB; 29.66 GiB left: 7 fit.
    assert_eq!(
        ok,
        7,
        "{:?}",
        holders.iter().map(|h| &h.first).collect::<Vec<_>>()
    );
    assert!(truth.used_memory(0) <= 32 * GIB);
    assert_eq!(truth.used_memory(0), 8 * CTX_OVERHEAD + ok * 4 * GIB);
    for h in holders {
        h.kill();
    }
    wait_until("all holders are reaped", DEFAULT_TIMEOUT, || {
        truth.used_memory(0) == 0
    });
}
