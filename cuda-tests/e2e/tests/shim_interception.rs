//! Acceptance for the interception core: libgpuslice.so reaches every path a CUDA or NVML
//! client takes, shown by an observable effect (a 1 GiB slice of a 32 GiB V100 reported by
//! cuMemGetInfo_v2 / cuDeviceTotalMem_v2 / nvmlDeviceGetMemoryInfo) through the real client
//! programs on the fake GPU, while the fake's truth still shows the card's real numbers.
//! Fail-closed and no-config behaviour through the same clients.
//!
//! The host-safety side (RTLD_NEXT, malloc interposers, non-CUDA processes, fork/exec, pointer
//! identity per ABI variant) is pinned in `shim_isolation.rs` against a minimal C driver.

use cuda_e2e::{
    command, run_with_timeout, Client, ClientKind, Env, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB,
};
use serde_json::Value;

const CARD: u64 = 32 * GIB;

fn one_gib_slice() -> Slice {
    Slice::builder().device(0, "1GiB", None).build()
}

/// `client meminfo` with the extra leading arguments procaddr-client takes.
fn meminfo(kind: ClientKind, procaddr_args: &[&str], env: &Env) -> Value {
    let mut args: Vec<&str> = procaddr_args.to_vec();
    args.push("meminfo");
    Client::run(kind, &args, env)
}

/// Every client path, with the procaddr variants the CUDA runtimes use.
fn paths() -> Vec<(ClientKind, Vec<&'static str>)> {
    vec![
        (ClientKind::Linked, vec![]),
        (ClientKind::Cudarc, vec![]),
        (ClientKind::ProcAddr, vec!["--cuda-version", "12080"]),
        (
            ClientKind::ProcAddr,
            vec!["--cuda-version", "13000", "--per-thread"],
        ),
    ]
}

#[test]
fn every_client_path_sees_the_slice_while_the_card_is_unchanged() {
    let gpu = FakeGpu::start("v100");
    let slice = one_gib_slice();
    for (kind, extra) in paths() {
        let direct = meminfo(kind, &extra, &gpu.env());
        assert_eq!(
            direct["result"], "CUDA_SUCCESS",
            "{kind:?} {extra:?}: {direct}"
        );
        assert_eq!(direct["total"], CARD, "{kind:?} without the shim: {direct}");

        let sliced = meminfo(kind, &extra, &slice.env(&gpu));
        assert_eq!(
            sliced["result"], "CUDA_SUCCESS",
            "{kind:?} {extra:?}: {sliced}"
        );
        assert_eq!(
            sliced["total"], GIB,
            "{kind:?} {extra:?}: cuMemGetInfo_v2 total: {sliced}"
        );
        assert_eq!(
            sliced["device_total"], GIB,
            "{kind:?} {extra:?}: cuDeviceTotalMem_v2: {sliced}"
        );
        let free = sliced["free"].as_u64().expect("free reported");
        assert!(
            free <= GIB && free > 0,
            "{kind:?} {extra:?}: free {free} within the slice"
        );
    }
    assert_eq!(
        gpu.truth().total_memory(0),
        CARD,
        "the hardware truth is the card"
    );
}

#[test]
fn procaddr_lookups_answer_like_the_driver_and_probes_are_untouched() {
    let gpu = FakeGpu::start("v100");
    let slice = one_gib_slice();
    for extra in [
        vec!["--cuda-version", "12080"],
        vec!["--cuda-version", "13000", "--per-thread"],
    ] {
        let mut args = extra.clone();
        args.push("resolve");
        let direct = Client::run(ClientKind::ProcAddr, &args, &gpu.env());
        let sliced = Client::run(ClientKind::ProcAddr, &args, &slice.env(&gpu));
        // The runtime's probes (empty name, version 0; cuGetProcAddress itself at 11030 and
        // 12000) and every entry point's result/status are exactly the driver's.
        assert_eq!(
            sliced["probes"]["empty"], direct["probes"]["empty"],
            "{extra:?}"
        );
        assert_eq!(
            sliced["probes"]["cuGetProcAddress_11030"],
            direct["probes"]["cuGetProcAddress_11030"]
        );
        assert_eq!(
            sliced["probes"]["cuGetProcAddress_12000"],
            direct["probes"]["cuGetProcAddress_12000"]
        );
        // The v2 pointer from cuGetProcAddress is the same function dlsym gave: our wrapper.
        assert_eq!(sliced["probes"]["v2_is_dlsym_symbol"], true, "{sliced}");
        assert_eq!(sliced["entry_points"], direct["entry_points"], "{extra:?}");
        assert_eq!(sliced["missing"], direct["missing"]);
        // _ptsz variants stay distinct from the legacy-stream ones (hooked and not).
        assert_eq!(
            sliced["per_thread_distinct"], direct["per_thread_distinct"],
            "{extra:?}"
        );
    }
}

/// `py/nvml_probe.py` (pynvml) in `env`: every device's memory, processes and samples.
fn pynvml_probe(env: &Env) -> Value {
    python_probe("nvml_probe.py", "pynvml", env)
}

/// Runs `py/<script>` with python3 in `env` and parses the JSON it prints; `module` names the
/// Python package it needs (which `cargo xtask test` installs).
fn python_probe(script: &str, module: &str, env: &Env) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .join(script);
    let path = path.to_string_lossy();
    let output = run_with_timeout(
        command(std::path::Path::new("python3"), &[&path], env),
        None,
        DEFAULT_TIMEOUT,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} failed ({module}: `cargo xtask test` installs it): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("probe JSON")
}

#[test]
fn per_process_utilisation_samples_show_only_the_slice() {
    let gpu = FakeGpu::start("v100");
    let slice = one_gib_slice();
    let neighbour = Client::spawn(ClientKind::Linked, &["hold", "64MiB"], &gpu.env());
    let member = Client::spawn(ClientKind::Linked, &["hold", "64MiB"], &slice.env(&gpu));
    let pids = |probe: &Value| -> Vec<u64> {
        let mut pids: Vec<u64> = probe["devices"][0]["process_utilization"]
            .as_array()
            .unwrap_or_else(|| panic!("no samples: {probe}"))
            .iter()
            .map(|s| s["pid"].as_u64().unwrap())
            .collect();
        pids.sort_unstable();
        pids
    };
    let (neighbour_pid, member_pid) = (u64::from(neighbour.pid()), u64::from(member.pid()));
    let mut both = vec![neighbour_pid, member_pid];
    both.sort_unstable();
    // The probe runs without memory of its own: the card lists exactly the two holders.
    assert_eq!(pids(&pynvml_probe(&gpu.env())), both, "the host sees both");
    let sliced = pynvml_probe(&slice.env(&gpu));
    assert_eq!(
        pids(&sliced),
        vec![member_pid],
        "inside the slice, no other tenant: {sliced}"
    );
    neighbour.release();
    member.release();
}

/// `nvmlDeviceGetUtilizationRates` inside a slice is the slice's own share of the card: a
/// neighbour outside the slice keeps the card busy while pynvml inside the slice reads 0 (it
/// used to read the card's 80-100 %, disclosing the neighbour), then the slice's share once
/// it runs kernels. The fake's timeline is the truth. A device without a limit in the slice
/// passes through.
#[test]
fn device_utilisation_inside_a_slice_is_the_slices_own_share() {
    // The fake's utilisation window (FAKEGPU_UTIL_WINDOW_MS default).
    const WINDOW_NS: u64 = 1_000_000_000;
    // Two cards: the `elsewhere` slice limits the second, so the first is unlimited there
    // (an entry naming a card the node does not have would fail the slice closed).
    let gpu = FakeGpu::start("v100,v100");
    let slice = one_gib_slice();
    let elsewhere = Slice::builder().device(1, "1GiB", None).build();
    let busy_percent = |pid: Option<u32>| -> u64 {
        let now = fakegpu::state::now_ns();
        gpu.truth()
            .busy_ns(0, pid, now.saturating_sub(WINDOW_NS), now)
            .min(WINDOW_NS)
            * 100
            / WINDOW_NS
    };
    // 1 ms kernels in batches of 20: each launcher keeps the card as busy as it can.
    let spin = |env: Env, seconds: &str| {
        let args: Vec<String> = [
            "launch",
            "--kernels",
            "20",
            "--ns-per-wave",
            "1000000",
            "--duration-s",
            seconds,
        ]
        .map(String::from)
        .to_vec();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Client::run(ClientKind::Linked, &args, &env)
        })
    };
    let utilisation = |probe: &Value| -> (u64, u64) {
        let u = &probe["devices"][0]["utilization"];
        let read = |k: &str| {
            u[k].as_u64()
                .unwrap_or_else(|| panic!("no utilization.{k}: {probe}"))
        };
        (read("gpu"), read("memory"))
    };

    let neighbour = spin(gpu.env(), "8");
    cuda_e2e::wait_until("the neighbour keeps the card busy", DEFAULT_TIMEOUT, || {
        busy_percent(None) >= 80
    });
    let card = utilisation(&pynvml_probe(&gpu.env()));
    assert!(card.0 >= 50, "the card is busy: {card:?}");
    let idle = pynvml_probe(&slice.env(&gpu));
    assert_eq!(
        utilisation(&idle),
        (0, 0),
        "an idle slice reads 0 whatever the neighbours do: {idle}"
    );
    let unlimited = utilisation(&pynvml_probe(&elsewhere.env(&gpu)));
    assert!(
        unlimited.0 >= 50,
        "a device without a limit in the slice passes through: {unlimited:?}"
    );

    let before: Vec<u32> = gpu.truth().processes(0).iter().map(|p| p.pid).collect();
    let member = spin(slice.env(&gpu), "4");
    let mut member_pid = None;
    cuda_e2e::wait_until("the slice's launcher runs", DEFAULT_TIMEOUT, || {
        member_pid = member_pid.or_else(|| {
            gpu.truth()
                .processes(0)
                .iter()
                .map(|p| p.pid)
                .find(|p| !before.contains(p))
        });
        member_pid.is_some_and(|pid| busy_percent(Some(pid)) >= 30)
    });
    let member_pid = member_pid.expect("awaited");
    let sliced = pynvml_probe(&slice.env(&gpu));
    let (ours, card) = (busy_percent(Some(member_pid)), busy_percent(None));
    let reading = utilisation(&sliced).0;
    eprintln!(
        "utilisation: card {card} %, slice's own {ours} % (fake timeline), read in the slice {reading} %"
    );
    assert!(
        reading.abs_diff(ours) <= 15,
        "the slice reads its own share: {reading} vs the fake's {ours} % (card {card} %): {sliced}"
    );
    assert!(
        reading + 15 < card,
        "and not the neighbour's: {reading} vs card {card} %"
    );
    for launcher in [member, neighbour] {
        let out = launcher.join().expect("launcher");
        assert_eq!(out["ok"], out["launches"], "{out}");
    }
}

#[test]
fn nvml_reports_the_slice_through_the_linked_client_and_pynvml() {
    let gpu = FakeGpu::start("v100");
    let slice = one_gib_slice();

    let direct = Client::run(ClientKind::Linked, &["nvml"], &gpu.env());
    let sliced = Client::run(ClientKind::Linked, &["nvml"], &slice.env(&gpu));
    let memory = |v: &Value| v["devices"][0]["memory"].clone();
    assert_eq!(memory(&direct)["total"], CARD, "{direct}");
    assert_eq!(memory(&sliced)["total"], GIB, "{sliced}");
    let (used, free) = (
        memory(&sliced)["used"].as_u64().unwrap(),
        memory(&sliced)["free"].as_u64().unwrap(),
    );
    assert_eq!(used + free, GIB, "no wrap, parts add up: {sliced}");

    let direct = pynvml_probe(&gpu.env());
    let sliced = pynvml_probe(&slice.env(&gpu));
    assert_eq!(direct["devices"][0]["memory"]["total"], CARD, "{direct}");
    assert_eq!(
        sliced["devices"][0]["memory"]["total"], GIB,
        "pynvml v1: {sliced}"
    );
    let v2 = &sliced["devices"][0]["memory_v2"];
    if v2.is_object() {
        assert_eq!(v2["total"], GIB, "pynvml v2: {sliced}");
        let parts = ["reserved", "used", "free"].map(|k| v2[k].as_u64().unwrap_or(0));
        assert_eq!(parts.iter().sum::<u64>(), GIB, "v2 parts add up: {v2}");
    }
    assert_eq!(gpu.truth().total_memory(0), CARD);
}

#[test]
fn a_malformed_limit_file_refuses_cuda_and_names_file_and_field() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder()
        .raw(r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#)
        .build();
    let path = slice.config_path().display().to_string();
    for (kind, extra) in paths() {
        let mut args = extra.clone();
        args.push("info");
        let output = Client::output(kind, &args, &slice.env(&gpu));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Every client gets an error code from the call it made, named by the driver's own
        // cuGetErrorName: cuInit answers CUDA_ERROR_NOT_INITIALIZED. The procaddr client (the
        // CUDA runtime's and cuda-bindings' path) gets every entry point from
        // cuGetProcAddress_v2 (before, the refused lookups made every function look missing:
        // cuda-bindings' "function cuInit is not found").
        let result: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{kind:?}: {e}: {stdout} / {stderr}"));
        assert_eq!(
            result["error"], "CUDA_ERROR_NOT_INITIALIZED",
            "{kind:?}: {result} / {stderr}"
        );
        assert_eq!(result["failed_step"], "cuInit", "{kind:?}: {result}");
        assert!(
            !stderr.contains("found no"),
            "{kind:?}: no entry point is missing: {stderr}"
        );
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("[gpuslice]"))
            .collect();
        assert_eq!(lines.len(), 1, "{kind:?}: one line: {stderr}");
        assert!(
            lines[0].contains(&path) && lines[0].contains("devices[0].memory"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains(&format!("gpuslice check {path}")),
            "says what to run: {}",
            lines[0]
        );
    }

    // cuGetProcAddress answers every entry point as without a configuration; the
    // driver's own cuDriverGetVersion / cuGetErrorString / cuGetErrorName among them.
    for extra in [
        vec!["--cuda-version", "12080"],
        vec!["--cuda-version", "13000", "--per-thread"],
    ] {
        let mut args = extra.clone();
        args.push("resolve");
        let refused = Client::run(ClientKind::ProcAddr, &args, &slice.env(&gpu));
        let direct = Client::run(ClientKind::ProcAddr, &args, &gpu.env());
        assert_eq!(refused["missing"], serde_json::json!([]), "{refused}");
        assert_eq!(refused["entry_points"], direct["entry_points"], "{extra:?}");
        assert_eq!(refused["probes"], direct["probes"], "{extra:?}");
        for name in ["cuInit", "cuDriverGetVersion", "cuGetErrorName"] {
            assert_eq!(
                refused["entry_points"][name]["found"], true,
                "{name}: {refused}"
            );
        }
    }

    // pynvml: nvmlInit raises NVMLError with NVML_ERROR_UNINITIALIZED (1), and its text comes
    // from the library's nvmlErrorString, which still answers.
    let script = "import json, pynvml\n\
        try:\n    pynvml.nvmlInit(); print(json.dumps({'init': 'ok'}))\n\
        except pynvml.NVMLError as e:\n    print(json.dumps({'init': e.value, 'text': str(e)}))\n";
    let output = run_with_timeout(
        command(
            std::path::Path::new("python3"),
            &["-c", script],
            &slice.env(&gpu),
        ),
        None,
        DEFAULT_TIMEOUT,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "pynvml: {e}: {stdout} / {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(result["init"], 1, "NVML_ERROR_UNINITIALIZED: {result}");
    assert_eq!(result["text"], "Uninitialized", "nvmlErrorString: {result}");
}

/// NVIDIA's cuda-bindings (cuda-python's driver layer) builds its function table through
/// cuGetProcAddress_v2. Under a refused slice it used to raise `FunctionNotFoundError:
/// function cuInit is not found`; it now gets CUDA_ERROR_NOT_INITIALIZED from cuInit and can
/// still ask the driver's version and the error's text. Under a valid slice it sees the slice.
#[test]
fn cuda_bindings_gets_error_codes_from_a_refused_slice() {
    let gpu = FakeGpu::start("v100");
    let probe = |env: &Env| python_probe("cuda_bindings_probe.py", "cuda-bindings", env);
    let refused = Slice::builder()
        .raw(r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#)
        .build();
    let out = probe(&refused.env(&gpu));
    assert_eq!(out["cuInit"], "CUDA_ERROR_NOT_INITIALIZED", "{out}");
    assert_eq!(out["cuDriverGetVersion"][0], "CUDA_SUCCESS", "{out}");
    assert_eq!(
        out["cuGetErrorString"],
        serde_json::json!(["CUDA_SUCCESS", "initialization error"]),
        "{out}"
    );
    assert!(out.get("exception").is_none(), "{out}");

    let out = probe(&one_gib_slice().env(&gpu));
    assert_eq!(
        out["cuMemGetInfo"],
        serde_json::json!(["CUDA_SUCCESS", GIB]),
        "{out}"
    );
}

/// The same binding in a process whose front cannot load its core (a half-installed shim):
/// every lookup is answered with a function that returns a CUDA error, so the binding shows
/// `CUDA_ERROR_NOT_INITIALIZED` instead of "function cuInit is not found".
#[test]
fn cuda_bindings_gets_error_codes_from_a_front_without_its_core() {
    let gpu = FakeGpu::start("v100");
    let dir = cuda_e2e::TempDir::new("front-alone");
    let alone = dir.path().join("libgpuslice.so");
    std::fs::copy(cuda_e2e::shim_library(), &alone).unwrap();
    let mut env = one_gib_slice().env(&gpu);
    for (key, value) in env.iter_mut() {
        if key == "LD_PRELOAD" {
            *value = alone.display().to_string();
        }
    }
    let out = python_probe("cuda_bindings_probe.py", "cuda-bindings", &env);
    assert_eq!(out["cuInit"], "CUDA_ERROR_NOT_INITIALIZED", "{out}");
    assert_eq!(
        out["cuDriverGetVersion"][0], "CUDA_ERROR_NOT_INITIALIZED",
        "{out}"
    );
    assert_eq!(
        out["cuGetErrorString"][0], "CUDA_ERROR_NOT_INITIALIZED",
        "{out}"
    );
    assert!(out.get("exception").is_none(), "{out}");
}

#[test]
fn no_configuration_is_pure_pass_through() {
    let gpu = FakeGpu::start("v100");
    let mut preload_only = gpu.env();
    preload_only.push((
        "LD_PRELOAD".into(),
        cuda_e2e::shim_library().display().to_string(),
    ));
    for (kind, extra) in paths() {
        let direct = meminfo(kind, &extra, &gpu.env());
        let shimmed = meminfo(kind, &extra, &preload_only);
        for key in ["result", "total", "device_total", "free"] {
            assert_eq!(shimmed[key], direct[key], "{kind:?} {extra:?} {key}");
        }
    }
}
