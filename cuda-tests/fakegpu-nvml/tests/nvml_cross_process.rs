//! Several processes on one simulated GPU: another process's memory shows up in this
//! process's NVML (with the PID offset) and in `fakegpu smi --json` (with the real PID), and
//! disappears from both once that process is SIGKILLed. Also the `fakegpu` tool's install
//! and CLI contract.
//!
//! Needs `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` first.

mod common;

use common::{artifact, child_scratch, isolated, smi_json, spawn_holder, truth, Nvml, Scratch};
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[test]
fn another_process_is_visible_in_nvml_and_smi_until_killed() {
    const NAME: &str = "another_process_is_visible_in_nvml_and_smi_until_killed";
    isolated(
        NAME,
        &[
            ("FAKEGPU_PID_OFFSET", "5000"),
            ("FAKEGPU_CTX_OVERHEAD", "33554432"),
        ],
        || {
            if common::is_holder() {
                common::run_holder();
                return;
            }
            let nvml = Nvml::load();
            nvml.init();
            let h = nvml.handle(0);
            let state_path = child_scratch().join("state");
            assert!(nvml.processes(h).is_empty());
            assert_eq!(nvml.memory_v2(h).used, 0);

            let mut holder = spawn_holder(NAME, 64 * MIB);
            let expected = 32 * MIB + 64 * MIB;

            // NVML (container view): translated PID, the holder's physical memory.
            let procs = nvml.processes(h);
            assert_eq!(procs.len(), 1, "{procs:?}");
            assert_eq!(procs[0].pid, holder.pid + 5000);
            assert_eq!(procs[0].usedGpuMemory, expected);
            assert_eq!(nvml.memory_v2(h).used, expected);
            assert_eq!(truth().used_memory(0), expected);

            // smi (host view): the real PID, same bytes, same device total.
            let smi = smi_json(&state_path);
            let dev = &smi["devices"][0];
            assert_eq!(dev["index"], 0);
            assert_eq!(dev["name"], nvml.device_string("nvmlDeviceGetName", h));
            assert_eq!(dev["uuid"], nvml.device_string("nvmlDeviceGetUUID", h));
            assert_eq!(dev["memory_total"], nvml.memory_v2(h).total);
            assert_eq!(dev["memory_used"], expected);
            assert!(dev["utilization_gpu"].as_u64().unwrap() <= 100);
            let smi_procs = dev["processes"].as_array().unwrap();
            assert_eq!(smi_procs.len(), 1, "{smi:#}");
            assert_eq!(smi_procs[0]["pid"], holder.pid);
            assert_eq!(smi_procs[0]["used_memory"], expected);

            holder.kill();
            // The next observer reaps the dead process; await it rather than assume.
            common::await_value(
                Duration::from_secs(5),
                "killed holder still listed by NVML",
                || nvml.processes(h).is_empty().then_some(()),
            );
            assert_eq!(nvml.memory_v2(h).used, 0);
            let smi = smi_json(&state_path);
            assert_eq!(smi["devices"][0]["processes"].as_array().unwrap().len(), 0);
            assert_eq!(smi["devices"][0]["memory_used"], 0);
        },
    );
}

/// `FAKEGPU_RELEASE_DELAY_MS`: a killed process stays in NVML's process list and memory
/// info (and smi's) with its usage until it has been seen dead for that long, as a driver
/// that tears processes down late shows it. The first look starts the delay, so the first
/// look always finds it.
#[test]
fn a_killed_process_stays_listed_until_the_release_delay_has_passed() {
    const NAME: &str = "a_killed_process_stays_listed_until_the_release_delay_has_passed";
    isolated(
        NAME,
        &[
            ("FAKEGPU_RELEASE_DELAY_MS", "1500"),
            ("FAKEGPU_CTX_OVERHEAD", "33554432"),
        ],
        || {
            if common::is_holder() {
                common::run_holder();
                return;
            }
            let nvml = Nvml::load();
            nvml.init();
            let h = nvml.handle(0);
            let state_path = child_scratch().join("state");
            let mut holder = spawn_holder(NAME, 64 * MIB);
            let expected = 32 * MIB + 64 * MIB;
            holder.kill();
            let first_look = std::time::Instant::now();
            let procs = nvml.processes(h);
            assert_eq!(procs.len(), 1, "{procs:?}");
            assert_eq!(procs[0].pid, holder.pid);
            assert_eq!(procs[0].usedGpuMemory, expected);
            assert_eq!(nvml.memory_v2(h).used, expected);
            common::await_value(
                Duration::from_secs(20),
                "the killed holder's release",
                || nvml.processes(h).is_empty().then_some(()),
            );
            assert!(
                first_look.elapsed() >= Duration::from_millis(1500),
                "released before the delay passed"
            );
            assert_eq!(nvml.memory_v2(h).used, 0);
            let smi = smi_json(&state_path);
            assert_eq!(smi["devices"][0]["processes"].as_array().unwrap().len(), 0);
            assert_eq!(smi["devices"][0]["memory_used"], 0);
        },
    );
}

#[test]
fn smi_reaps_a_killed_process_without_nvml() {
    const NAME: &str = "smi_reaps_a_killed_process_without_nvml";
    isolated(NAME, &[("FAKEGPU_DEVICES", "v100,h200")], || {
        if common::is_holder() {
            common::run_holder();
            return;
        }
        let state_path = child_scratch().join("state");
        let mut holder = spawn_holder(NAME, 2 * MIB);
        let smi = smi_json(&state_path);
        let devices = smi["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1]["name"], "NVIDIA H200");
        assert_eq!(devices[1]["processes"].as_array().unwrap().len(), 0);
        let procs = devices[0]["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0]["pid"], holder.pid, "smi shows host PIDs");
        holder.kill();
        let smi = common::await_value(Duration::from_secs(5), "smi still lists it", || {
            let smi = smi_json(&state_path);
            let empty = smi["devices"][0]["processes"].as_array()?.is_empty();
            empty.then_some(smi)
        });
        assert_eq!(smi["devices"][0]["memory_used"], 0);
    });
}

#[test]
fn smi_table_lists_devices_and_processes() {
    const NAME: &str = "smi_table_lists_devices_and_processes";
    isolated(NAME, &[], || {
        if common::is_holder() {
            common::run_holder();
            return;
        }
        let state_path = child_scratch().join("state");
        let holder = spawn_holder(NAME, 2 * MIB);
        let out = Command::new(artifact("fakegpu"))
            .arg("smi")
            .env("FAKEGPU_STATE", &state_path)
            .output()
            .unwrap();
        assert!(out.status.success());
        let table = String::from_utf8(out.stdout).unwrap();
        assert!(table.contains("Tesla V100-PCIE-32GB"), "{table}");
        assert!(table.contains("Driver Version: 580.95.05"), "{table}");
        assert!(table.contains("/ 32768MiB"), "{table}");
        let row = table
            .lines()
            .find(|l| l.contains(&format!(" {} ", holder.pid)))
            .unwrap_or_else(|| panic!("no row for pid {}:\n{table}", holder.pid));
        // 300 MiB default context overhead + 2 MiB.
        assert!(row.contains("302MiB"), "{row}");
    });
}

#[test]
fn smi_refuses_a_missing_state_and_bad_usage() {
    let scratch = Scratch::new("smi-missing");
    let missing = scratch.dir.join("nope.state");
    let out = Command::new(artifact("fakegpu"))
        .args(["smi", "--json", "--state"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(!missing.exists(), "looking must not create a machine");

    let out = Command::new(artifact("fakegpu"))
        .args(["smi", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(artifact("fakegpu"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("fakegpu install DIR") && help.contains("fakegpu smi"));
}

#[test]
fn install_lays_out_the_driver_under_its_real_names() {
    let scratch = Scratch::new("install");
    let dir = scratch.dir.join("lib");
    for _ in 0..2 {
        // Twice: reinstalling over an existing layout must work.
        let out = Command::new(artifact("fakegpu"))
            .arg("install")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (source, soname, link) in [
        ("libfakegpu_cuda.so", "libcuda.so.1", "libcuda.so"),
        ("libfakegpu_nvml.so", "libnvidia-ml.so.1", "libnvidia-ml.so"),
    ] {
        assert_eq!(
            std::fs::read(dir.join(soname)).unwrap(),
            std::fs::read(artifact(source)).unwrap(),
            "{soname} is a copy of {source}"
        );
        assert_eq!(
            std::fs::read_link(dir.join(link)).unwrap(),
            std::path::PathBuf::from(soname)
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A fakegpu binary without its libraries next to it names what is missing.
    let lonely = scratch.dir.join("bin");
    std::fs::create_dir_all(&lonely).unwrap();
    std::fs::copy(artifact("fakegpu"), lonely.join("fakegpu")).unwrap();
    let out = Command::new(lonely.join("fakegpu"))
        .arg("install")
        .arg(scratch.dir.join("other"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("libfakegpu_cuda.so"), "{err}");
    assert!(err.contains("cargo build -p fakegpu"), "{err}");
    assert!(
        !scratch.dir.join("other").exists(),
        "nothing half-installed"
    );

    // An option is never taken for DIR (`install --help` once created `./--help`).
    for (option, code) in [("--help", Some(0)), ("--force", Some(2))] {
        let out = Command::new(artifact("fakegpu"))
            .current_dir(&scratch.dir)
            .args(["install", option])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), code, "install {option}");
        assert!(!scratch.dir.join(option).exists(), "install {option}");
    }
}
