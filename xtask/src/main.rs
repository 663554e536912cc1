//! `cargo xtask`: the two commands of the README's quick start.
//!
//! * `cargo xtask demo` builds the shim, the CLI and the fake GPU, then runs `gpuslice demo`
//!   (on the simulated GPU when no NVIDIA driver is present).
//! * `cargo xtask test` installs what the tests need that cargo cannot (the Python NVML
//!   client), builds every artifact the end-to-end tests load (cdylibs are not built by
//!   `cargo test` on its own), then runs the whole suite: the parallel tests first, then the
//!   timing-dependent test binaries one test at a time.

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

/// Test binaries whose tests measure time (throttle accuracy, reaping delays) or storm the
/// slice with kills, stops and forks for a bounded time (torture). They are
/// declared `test = false` in their Cargo.toml and run here serially, so that a loaded
/// 2-core CI machine does not run two of them against each other.
const SERIAL_TEST_BINARIES: &[(&str, &str)] = &[
    ("fakegpu-nvml", "nvml_utilization"),
    ("gpuslice-common", "region_timing"),
    ("cuda-e2e", "throttle"),
    ("cuda-e2e", "torture"),
    ("cuda-e2e", "frameworks_compute"),
    ("cuda-e2e", "late_release"),
    ("cuda-e2e", "start_storm"),
    ("cuda-e2e", "backstop"),
    ("gpuslice-dra", "cluster"),
    ("cuda-e2e", "vllm"),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&root, &args[1..]),
        Some("demo") => demo(&root, &args[1..]),
        Some("build") => build(&root),
        _ => {
            eprintln!("usage: cargo xtask <test|demo|build> [args...]");
            eprintln!("  test   build everything and run the whole test suite");
            eprintln!("  demo   run `gpuslice demo` (simulated GPU when no real one is present)");
            eprintln!("  build  build the shim, CLI and fake GPU libraries");
            exit(2);
        }
    };
    if let Err(message) = result {
        eprintln!("xtask: {message}");
        exit(1);
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(mut cmd: Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: running {shown}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

fn build(root: &Path) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args(["build", "--workspace", "--all-targets"]);
    run(cmd)
}

fn demo(root: &Path, extra: &[String]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args(["build", "--workspace", "--quiet"]);
    run(cmd)?;
    let mut demo = Command::new(root.join("target/debug/gpuslice"));
    demo.arg("demo").args(extra);
    run(demo)
}

fn test(root: &Path, extra: &[String]) -> Result<(), String> {
    ensure_python_clients()?;
    build(root)?;
    // Every test that cannot run here (a missing podman, Prometheus, nvidia-smi, PyTorch)
    // appends a line to this file (`cuda_e2e::skip`); the list is printed at the end.
    let skip_log = root.join("target/skipped-tests.txt");
    std::fs::create_dir_all(root.join("target"))
        .map_err(|e| format!("cannot create {}: {e}", root.join("target").display()))?;
    std::fs::write(&skip_log, "")
        .map_err(|e| format!("cannot reset {}: {e}", skip_log.display()))?;
    // Run every binary even after a failure, so one run shows every broken test.
    let mut failures = Vec::new();
    let mut all = cargo();
    all.current_dir(root)
        .env(SKIP_LOG_VAR, &skip_log)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(extra);
    if let Err(e) = run(all) {
        failures.push(e);
    }
    for (package, binary) in SERIAL_TEST_BINARIES {
        let mut serial = cargo();
        serial
            .current_dir(root)
            .env(SKIP_LOG_VAR, &skip_log)
            .args(["test", "--package", package, "--test", binary, "--"])
            .arg("--test-threads=1");
        if let Err(e) = run(serial) {
            failures.push(e);
        }
    }
    if let Some(skips) = report_skips(&skip_log) {
        failures.push(skips);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} test run(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

/// The variable `cuda_e2e::skip` appends each skipped test to.
const SKIP_LOG_VAR: &str = "GPUSLICE_SKIP_LOG";

/// Prints the tests that skipped and why. A skip passes in cargo's count, so this list is
/// the only honest summary of what did not run. With `CI=true` any skip fails the run
/// (the tests themselves fail there too; this catches one that did not).
fn report_skips(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let skips: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if skips.is_empty() {
        eprintln!("xtask: no test skipped");
        return None;
    }
    eprintln!(
        "xtask: {} test(s) SKIPPED (they count as passed above):",
        skips.len()
    );
    for line in &skips {
        let (test, why) = line.split_once('\t').unwrap_or((line, ""));
        eprintln!("  {test}: {why}");
    }
    let ci = matches!(
        std::env::var("CI").as_deref(),
        Ok("true") | Ok("TRUE") | Ok("1")
    );
    ci.then(|| format!("{} test(s) skipped with CI=true", skips.len()))
}

/// The Python clients the tests drive the shim through: `nvidia-ml-py` (pynvml, what most
/// Python tools read NVML with) and `cuda-bindings` (cuda-python's driver layer, which takes
/// every entry point from cuGetProcAddress_v2). Install what is missing; if that is
/// impossible, say exactly what to do.
fn ensure_python_clients() -> Result<(), String> {
    let python = python();
    for (module, requirement) in [
        ("pynvml", "nvidia-ml-py"),
        ("cuda.bindings.driver", "cuda-bindings<14"),
    ] {
        let probe = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .output();
        match probe {
            Ok(out) if out.status.success() => continue,
            Ok(_) => {}
            Err(e) => {
                return Err(format!(
                    "the Python client tests need Python 3 ({python}: {e}); install python3 \
                     and pip, then `python3 -m pip install nvidia-ml-py 'cuda-bindings<14'`"
                ))
            }
        }
        let mut pip = Command::new(&python);
        pip.args(["-m", "pip", "install", "--quiet", requirement]);
        run(pip).map_err(|e| {
            format!(
                "{e}; the Python client tests need {module}: run `{python} -m pip install \
                 '{requirement}'`"
            )
        })?;
    }
    Ok(())
}

fn python() -> String {
    std::env::var("GPUSLICE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}
