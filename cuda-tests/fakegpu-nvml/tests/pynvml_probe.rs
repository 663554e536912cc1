//! pynvml (nvidia-ml-py), the NVML client of most Python tooling, loads the fake
//! `libnvidia-ml.so.1` from a `fakegpu install` directory and sees exactly the fake GPU's
//! state: devices, versions, memory v1/v2, processes with the PID offset, utilisation.
//!
//! Needs `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` and pynvml
//! (`python3 -m pip install nvidia-ml-py`; `cargo xtask test` installs it). A missing pynvml
//! fails the test with that command rather than skipping it.

mod common;

use common::{artifact, child_scratch, isolated, spawn_holder, truth};
use fakegpu::nvml_view::RESERVED_MEMORY_BYTES;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// The interpreter, as `cargo xtask test` chooses it.
fn python() -> String {
    std::env::var("GPUSLICE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn require_pynvml() {
    let python = python();
    let probe = Command::new(&python).args(["-c", "import pynvml"]).output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "pynvml is not installed for {python} ({}): run `{python} -m pip install \
             nvidia-ml-py` (cargo xtask test does it for you)",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run {python} ({e}): install Python 3, then `python3 -m pip install \
             nvidia-ml-py`"
        ),
    }
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../e2e/py")
        .join(name)
}

/// Lays out the fake driver in the test's scratch dir and runs a pynvml script against it.
fn run_probe() -> Value {
    let lib = child_scratch().join("lib");
    let out = Command::new(artifact("fakegpu"))
        .arg("install")
        .arg(&lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(python())
        .arg(script("nvml_probe.py"))
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("run nvml_probe.py");
    assert!(
        out.status.success(),
        "nvml_probe.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("nvml_probe.py prints JSON")
}

#[test]
fn pynvml_sees_the_fake_gpu_state() {
    const NAME: &str = "pynvml_sees_the_fake_gpu_state";
    isolated(
        NAME,
        &[
            ("FAKEGPU_DEVICES", "v100,h200"),
            ("FAKEGPU_PID_OFFSET", "7"),
            ("FAKEGPU_CTX_OVERHEAD", "33554432"),
            ("FAKEGPU_DRIVER_VERSION", "12080"),
        ],
        || {
            if common::is_holder() {
                common::run_holder();
                return;
            }
            require_pynvml();
            let holder = spawn_holder(NAME, 6 * MIB);
            let seen = run_probe();
            let state = truth();

            assert_eq!(seen["count"], 2);
            assert_eq!(seen["driver_version"], "570.172.08");
            assert_eq!(seen["cuda_driver_version"], 12080);
            assert_eq!(seen["nvml_version"], "12.570.172.08");
            for i in 0..2u32 {
                let dev = &seen["devices"][i as usize];
                let spec = state.device(i).unwrap();
                let used = state.used_memory(i);
                assert_eq!(dev["index"], i);
                assert_eq!(dev["index_by_uuid"], i);
                assert_eq!(dev["name"], spec.name.as_str());
                assert_eq!(dev["uuid"], spec.uuid.as_str());
                assert_eq!(dev["pci_bus_id"], spec.pci_bus_id.as_str());
                assert_eq!(
                    dev["compute_capability"],
                    serde_json::json!([spec.cc_major, spec.cc_minor])
                );
                assert_eq!(
                    dev["memory"],
                    serde_json::json!({
                        "total": spec.total_memory,
                        "used": used + RESERVED_MEMORY_BYTES,
                        "free": spec.total_memory - used - RESERVED_MEMORY_BYTES,
                    })
                );
                assert_eq!(
                    dev["memory_v2"],
                    serde_json::json!({
                        "total": spec.total_memory,
                        "reserved": RESERVED_MEMORY_BYTES,
                        "used": used,
                        "free": spec.total_memory - used - RESERVED_MEMORY_BYTES,
                    })
                );
                assert_eq!(dev["utilization"]["gpu"], 0, "no kernel ran");
            }

            let v100 = &seen["devices"][0];
            assert_eq!(v100["errors"], serde_json::json!({}), "{v100:#}");
            assert_eq!(
                v100["processes"],
                serde_json::json!([{"pid": holder.pid + 7, "used_memory": 38 * MIB}])
            );
            assert_eq!(v100["process_utilization"][0]["pid"], holder.pid + 7);
            assert_eq!(v100["process_utilization"][0]["sm_util"], 0);

            let h200 = &seen["devices"][1];
            assert_eq!(h200["processes"], serde_json::json!([]));
            // No process on it: the real driver's NOT_FOUND, which pynvml raises.
            assert_eq!(
                h200["errors"],
                serde_json::json!({"process_utilization": "Not Found"})
            );
        },
    );
}
