//! The GPUs the driver publishes come from NVML: here the fake GPU's libnvidia-ml
//! (cuda-tests/fakegpu-nvml), two simulated cards, read through the same nvml-wrapper calls
//! the driver makes on a real node; a claim prepared against them names the fake's UUIDs.
//! One test per binary: it sets the fake's environment for the whole process.
//!
//! Needs `cargo build -p fakegpu-nvml` first (cargo test does not build other packages'
//! cdylibs; `cargo xtask test` builds the workspace).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use gpuslice_common::config::{parse_limit_file, DeviceSelector};
use gpuslice_dra::inventory;
use gpuslice_dra::prepare::{ClaimRef, Preparer};

fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in <target>/<profile>/deps")
        .join("libfakegpu_nvml.so");
    assert!(
        lib.exists(),
        "{} is missing: run `cargo build -p fakegpu-nvml` first",
        lib.display()
    );
    lib
}

#[test]
fn gpus_come_from_nvml_and_a_claim_on_them_names_their_uuids() {
    let scratch = Scratch::new("nvml");
    // The only test of this binary: no other thread reads the environment meanwhile.
    std::env::set_var("FAKEGPU_STATE", scratch.path().join("fakegpu.state"));
    std::env::set_var("FAKEGPU_DEVICES", "v100,t4");

    let missing =
        inventory::from_nvml(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
    assert!(
        missing.contains("/nonexistent/libnvidia-ml.so.1"),
        "{missing}"
    );

    let gpus = inventory::from_nvml(Some(&fake_nvml())).unwrap();
    let truth: Vec<_> = ["v100", "t4"]
        .iter()
        .enumerate()
        .map(|(i, name)| fakegpu::spec::preset(name, i).unwrap())
        .collect();
    assert_eq!(gpus.len(), 2);
    for (gpu, spec) in gpus.iter().zip(&truth) {
        assert_eq!(gpu.uuid, spec.uuid);
        assert_eq!(gpu.name, spec.name);
        assert_eq!(gpu.memory_bytes, spec.total_memory);
        assert_eq!(gpu.compute_capability, (spec.cc_major, spec.cc_minor));
        assert_eq!(gpu.cuda_driver_version, (13, 0));
        assert!(!gpu.driver_version.is_empty());
    }
    assert_eq!((gpus[0].index, gpus[1].index), (0, 1));

    // Half of the T4 (15360 MiB): 7680 MiB.
    let p = Preparer::new(settings(&scratch, false), gpus.clone());
    let uid = "3e1d0000-0000-4000-8000-000000000001";
    let want = ClaimRef {
        namespace: "ns".into(),
        name: "half-t4".into(),
        uid: uid.into(),
    };
    p.prepare(
        &want,
        &claim("ns", "half-t4", uid, &[ours("r", "gpu-1-50-a")]),
    )
    .unwrap();
    let limits = p.claim_dir(uid).join("limits.json");
    let config = parse_limit_file(&limits, &std::fs::read_to_string(&limits).unwrap()).unwrap();
    assert_eq!(
        config.devices[0].selector,
        DeviceSelector::Uuid(truth[1].uuid.clone())
    );
    assert_eq!(config.devices[0].memory_limit, Some(7680 << 20));
}
