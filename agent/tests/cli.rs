//! `gpuslice-node` as a program: bad flags are refused with a clear message, and `--once`
//! reports a node with no driver and a broken slice instead of failing.

use std::path::PathBuf;
use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuslice-node"))
}

fn tmp(label: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("gpuslice-node-cli-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether this machine has a real NVML the dynamic loader would find anyway.
fn system_nvml() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so"))
        .unwrap_or(false)
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    for (flag, value, reason) in [
        ("--tolerance", "lots", "lots"),
        ("--grace=-1", "", "seconds"),
        ("--interval=NaN", "", "seconds"),
    ] {
        let args: Vec<&str> = [flag, value]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let out = agent().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(reason), "{flag} {value}: {stderr}");
    }
    let out = agent()
        .args(["--listen", "not an address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on not an address"));
}

#[test]
fn once_reports_no_driver_and_a_broken_slice_without_failing() {
    let dir = tmp("once");
    let slices = dir.join("slices");
    std::fs::create_dir_all(&slices).unwrap();
    std::fs::write(slices.join("broken.json"), "{\"version\": 1,").unwrap();
    std::fs::write(
        slices.join("fresh.json"),
        r#"{"version": 1, "region": "/nonexistent/gpuslice/f.region", "devices": [{"index": 0, "memory": "1GiB"}]}"#,
    )
    .unwrap();
    let empty = dir.join("no-driver");
    std::fs::create_dir_all(&empty).unwrap();
    let out = agent()
        .arg("--once")
        .arg("--slices-dir")
        .arg(&slices)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("LD_LIBRARY_PATH", &empty)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("gpuslice_slice_up{slice=\"broken\"} 0"),
        "{text}"
    );
    // A slice none of whose processes ran yet has no region: not a problem.
    assert!(
        text.contains("gpuslice_slice_up{slice=\"fresh\"} 1"),
        "{text}"
    );
    assert!(text.contains("# TYPE gpuslice_slice_up gauge"), "{text}");
    if !system_nvml() {
        assert!(text.contains("gpuslice_driver_up 0"), "{text}");
        assert!(!text.contains("gpuslice_card_"), "{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
