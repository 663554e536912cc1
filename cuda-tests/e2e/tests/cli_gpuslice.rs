//! End-to-end tests of the `gpuslice` binary (target/<profile>/gpuslice) against the fake GPU:
//! every subcommand, its bad inputs and their documented exit codes (2 usage, 3 invalid input,
//! 4 runtime), and the slice as real client programs see it. Build first:
//! `cargo build -p gpuslice-ctl -p gpuslice-shim -p fakegpu -p fakegpu-cuda -p fakegpu-nvml -p cuda-clients`
//! (`cargo xtask test` does).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn bin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    // Tests run from target/<profile>/deps; the binaries are one level up.
    let profile = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf));
    profile.unwrap_or_else(|| target.join("debug"))
}

fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo xtask build)",
        path.display()
    );
    path
}

/// `gpuslice` with an environment that names no slice and no GPU state of the host.
fn gpuslice() -> Command {
    let mut cmd = Command::new(bin("gpuslice"));
    for name in [
        "GPUSLICE_CONFIG",
        "LD_PRELOAD",
        "FAKEGPU_STATE",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "GPU_CORE_UTILIZATION_POLICY",
        "LIBCUDA_LOG_LEVEL",
        "GPUSLICE_LOG",
    ] {
        cmd.env_remove(name);
    }
    cmd.env("FAKEGPU_DEVICES", "v100").stdin(Stdio::null());
    cmd
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn ran(output: Output) -> Ran {
    let r = Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert!(
        !r.stderr.contains("panicked"),
        "gpuslice panicked:\n{}",
        r.stderr
    );
    r
}

fn run(args: &[&str]) -> Ran {
    ran(gpuslice().args(args).output().expect("run gpuslice"))
}

fn run_with(cmd: &mut Command) -> Ran {
    ran(cmd.output().expect("run gpuslice"))
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-cli-test-{name}-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        let dir = PathBuf::from(dir.to_string_lossy().replace(['{', '}', ' ', ':'], "_"));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn s(&self, name: &str) -> String {
        self.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json_line(stdout: &str) -> Value {
    stdout
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l.trim())
                .ok()
                .filter(Value::is_object)
        })
        .unwrap_or_else(|| panic!("no JSON line in {stdout:?}"))
}

#[test]
fn help_lists_every_subcommand_and_the_exit_codes() {
    let r = run(&["--help"]);
    assert_eq!(r.code, 0);
    for word in [
        "write",
        "check",
        "status",
        "smi",
        "run",
        "demo",
        "Exit codes",
        "3  invalid input",
    ] {
        assert!(
            r.stdout.contains(word),
            "--help lacks {word:?}:\n{}",
            r.stdout
        );
    }
    for sub in ["write", "check", "status", "smi", "run", "demo"] {
        let r = run(&[sub, "--help"]);
        assert_eq!(r.code, 0, "{sub} --help");
        assert!(
            r.stdout.contains("Exit codes"),
            "{sub} --help lacks exit codes"
        );
    }
}

/// Without `-o`, `write` prints the file on standard output and says so: the machine-wide
/// anchored path (which caps every shim process and silences their own configuration) is
/// never written by accident; named with `-o`, it is, with a line saying what it means.
#[test]
fn write_prints_on_stdout_unless_told_where_and_never_picks_the_anchored_path() {
    let anchored = Path::new("/etc/gpuslice/limits.json");
    let existed = anchored.exists();
    for args in [
        &["write", "-d", "0:memory=8GiB"][..],
        &["write", "-d", "0:memory=8GiB", "-o", "-"],
    ] {
        let r = run(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        let file: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| {
            panic!("{args:?}: not the limit file on stdout ({e}): {}", r.stdout)
        });
        assert_eq!(file["devices"][0]["memory"], "8 GiB", "{}", r.stdout);
        assert!(
            r.stderr.contains("standard output"),
            "{args:?}: says what it wrote: {}",
            r.stderr
        );
        assert_eq!(
            anchored.exists(),
            existed,
            "{args:?}: the anchored limit file was touched"
        );
    }
}

#[test]
fn write_then_check_round_trips_and_guards_existing_files() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("write");
    let out = dir.s("etc/limits.json");
    let r = run(&[
        "write",
        "--device",
        "0:memory=8GiB,compute=25",
        "--region",
        "/run/gpuslice/a.region",
        "-o",
        &out,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::metadata(&out).unwrap().mode() & 0o777, 0o644);

    let r = run(&["check", "--no-probe", &out]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("device 0: memory 8 GiB, compute 25%"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("region /run/gpuslice/a.region; policy cap"),
        "{}",
        r.stdout
    );

    let r = run(&["check", "--no-probe", "--json", &out]);
    let v = json_line(&r.stdout);
    assert_eq!(v["valid"], true);
    assert_eq!(v["config"]["devices"][0]["compute"], 25);

    // Without FILE, check reads GPUSLICE_CONFIG like the shim.
    let r = run_with(
        gpuslice()
            .args(["check", "--no-probe"])
            .env("GPUSLICE_CONFIG", &out),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);

    // Identical content: success, no change. Different: refused unless --force.
    let before = std::fs::read(&out).unwrap();
    let same = run(&[
        "write",
        "-d",
        "0:memory=8GiB,compute=25",
        "--region",
        "/run/gpuslice/a.region",
        "-o",
        &out,
    ]);
    assert_eq!(same.code, 0, "{}", same.stderr);
    assert!(same.stderr.contains("unchanged"), "{}", same.stderr);
    let other = run(&["write", "-d", "0", "--memory", "4g", "-o", &out]);
    assert_eq!(other.code, 3, "{}", other.stderr);
    assert!(other.stderr.contains("--force"), "{}", other.stderr);
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "refused write changed the file"
    );
    let forced = run(&["write", "-d", "0", "--memory", "4g", "--force", "-o", &out]);
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    let r = run(&["check", "--no-probe", &out]);
    assert!(
        r.stdout
            .contains("device 0: memory 4 GiB, compute not throttled"),
        "{}",
        r.stdout
    );
    let leftovers = std::fs::read_dir(dir.join("etc")).unwrap().count();
    assert_eq!(leftovers, 1, "temporary files left beside the limit file");
}

#[test]
fn write_from_hami_env() {
    let dir = TempDir::new("fromenv");
    let out = dir.s("limits.json");
    let r = run_with(
        gpuslice()
            .args(["write", "--from-env", "-o", &out])
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m")
            .env("CUDA_DEVICE_SM_LIMIT_0", "30"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run(&["check", "--no-probe", &out]);
    assert!(
        r.stdout.contains("device 0: memory 3000 MiB, compute 30%"),
        "{}",
        r.stdout
    );

    let r = run(&["write", "--from-env", "-o", &dir.s("none.json")]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let r = run_with(
        gpuslice()
            .args(["write", "--from-env", "-o", &dir.s("bad.json")])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("CUDA_DEVICE_MEMORY_LIMIT"),
        "{}",
        r.stderr
    );
}

#[test]
fn bad_input_gets_the_documented_exit_code_and_a_one_line_reason() {
    let dir = TempDir::new("bad");
    let bad_field = dir.join("bad-field.json");
    std::fs::write(
        &bad_field,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#,
    )
    .unwrap();
    let corrupt = dir.join("corrupt.region");
    std::fs::write(&corrupt, b"definitely not a region").unwrap();
    let foreign = dir.join("foreign.region");
    std::fs::write(&foreign, vec![0xAB_u8; 267_392]).unwrap();
    let out = dir.s("limits.json");
    let p = |path: &Path| path.to_string_lossy().into_owned();

    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec![
                "write".into(),
                "-d".into(),
                "gpu0".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "unknown device",
        ),
        (
            vec![
                "write".into(),
                "-d".into(),
                "0:memory=-1g".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "negative",
        ),
        (
            vec![
                "write".into(),
                "-d".into(),
                "0:memory=lots".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "not a size",
        ),
        (
            vec![
                "write".into(),
                "-d".into(),
                "0:compute=101".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "1..=100",
        ),
        (
            vec![
                "write".into(),
                "-d".into(),
                "0:colour=red".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "unknown device limit",
        ),
        (
            vec![
                "write".into(),
                "-d".into(),
                "0".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "has no limit",
        ),
        (
            vec![
                "write".into(),
                "--memory".into(),
                "1g".into(),
                "-o".into(),
                out.clone(),
            ],
            2,
            "say which devices",
        ),
        (
            vec![
                "write".into(),
                "-d".into(),
                "0:memory=1g".into(),
                "-o".into(),
                "/proc/gpuslice/limits.json".into(),
            ],
            4,
            "cannot",
        ),
        (
            vec!["check".into(), p(&dir.join("missing.json"))],
            3,
            "cannot read limit file",
        ),
        (vec!["check".into(), p(&bad_field)], 3, "devices[0].memory"),
        (vec!["check".into(), p(&dir.0)], 3, "limit file"),
        (
            vec![
                "status".into(),
                "--region".into(),
                p(&dir.join("missing.region")),
            ],
            3,
            "cannot read region",
        ),
        (
            vec!["status".into(), "--region".into(), p(&corrupt)],
            3,
            "not a gpuslice region",
        ),
        (
            vec!["status".into(), "--region".into(), p(&foreign)],
            3,
            "not a gpuslice region",
        ),
        (
            vec!["status".into(), "--config".into(), p(&bad_field)],
            3,
            "devices[0].memory",
        ),
        (vec!["status".into(), "--watch=0".into()], 2, "interval"),
        (vec!["run".into(), "--memory".into(), "1g".into()], 2, "CMD"),
        (
            vec![
                "run".into(),
                "--memory".into(),
                "0".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            "refuse every allocation",
        ),
        (
            vec![
                "run".into(),
                "--lib".into(),
                p(&dir.join("nope.so")),
                "-m".into(),
                "1g".into(),
                "--".into(),
                "true".into(),
            ],
            3,
            "--lib",
        ),
        (
            vec![
                "run".into(),
                "--fake-gpu".into(),
                "-m".into(),
                "64GiB".into(),
                "--".into(),
                "true".into(),
            ],
            3,
            "larger than device 0",
        ),
        (
            vec![
                "run".into(),
                "--fake-gpu".into(),
                "-d".into(),
                "5:memory=1g".into(),
                "--".into(),
                "true".into(),
            ],
            3,
            "no device index 5",
        ),
        (
            vec![
                "run".into(),
                "--fake-gpu".into(),
                "-m".into(),
                "1g".into(),
                "--".into(),
                p(&dir.join("no-such-program")),
            ],
            3,
            "cannot start",
        ),
        (vec!["frobnicate".into()], 2, "unrecognized subcommand"),
    ];
    for (args, code, needle) in cases {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run(&argv);
        assert_eq!(r.code, code, "gpuslice {argv:?}: stderr {}", r.stderr);
        assert!(
            r.stderr.contains(needle),
            "gpuslice {argv:?}: stderr lacks {needle:?}: {}",
            r.stderr
        );
    }

    // Nothing configured anywhere: check and status say so (the default path is assumed absent).
    if !Path::new("/etc/gpuslice/limits.json").exists() {
        let r = run(&["check"]);
        assert_eq!(r.code, 3, "{}", r.stderr);
        assert!(r.stderr.contains("no slice configured"), "{}", r.stderr);
        let r = run(&["status"]);
        assert_eq!(r.code, 2, "{}", r.stderr);
    }
    // GPUSLICE_CONFIG naming a missing file fails closed, like the shim.
    let r = run_with(
        gpuslice()
            .arg("check")
            .env("GPUSLICE_CONFIG", dir.join("absent.json")),
    );
    assert_eq!(r.code, 3, "{}", r.stderr);

    // A limit larger than any card: write cannot know the card and accepts it (documented).
    let r = run(&["write", "-d", "0:memory=64GiB", "-o", &out]);
    assert_eq!(r.code, 0, "{}", r.stderr);

    // No NVML library on a machine without a driver: a clear message, exit 4.
    if !Path::new("/dev/nvidia0").exists() {
        let r = run_with(gpuslice().arg("smi").env("LD_LIBRARY_PATH", dir.s("empty")));
        assert_eq!(r.code, 4, "{}", r.stderr);
        assert!(r.stderr.contains("no NVML library"), "{}", r.stderr);
    }
}

/// The fake GPU's libraries laid out in `dir`, and the env that makes a process use them.
fn fake_env(dir: &TempDir, cmd: &mut Command) {
    let lib = dir.join("fakegpu");
    if !lib.exists() {
        let status = Command::new(bin("fakegpu"))
            .arg("install")
            .arg(&lib)
            .status()
            .unwrap();
        assert!(status.success(), "fakegpu install failed");
    }
    cmd.env("LD_LIBRARY_PATH", &lib)
        .env("FAKEGPU_STATE", dir.join("fakegpu.state"))
        .env("FAKEGPU_DEVICES", "v100");
}

#[test]
fn check_warns_about_a_limit_larger_than_the_card() {
    let dir = TempDir::new("checkwarn");
    let out = dir.s("limits.json");
    assert_eq!(run(&["write", "-d", "0:memory=64GiB", "-o", &out]).code, 0);
    let mut cmd = gpuslice();
    cmd.args(["check", &out]);
    fake_env(&dir, &mut cmd);
    let r = run_with(&mut cmd);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("larger than the card"), "{}", r.stderr);
}

#[test]
fn run_propagates_the_exit_code_and_cleans_up() {
    let r = run(&[
        "run",
        "--fake-gpu",
        "-m",
        "1g",
        "--",
        "sh",
        "-c",
        "test -n \"$GPUSLICE_CONFIG\" && test -n \"$LD_PRELOAD\" && exit 7",
    ]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.stderr.contains("simulated GPU"), "{}", r.stderr);
    let region = region_from_stderr(&r.stderr);
    assert!(
        !region.parent().unwrap().exists(),
        "temporary slice directory left behind"
    );
}

fn region_from_stderr(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find(|l| l.contains("slice region "))
        .unwrap_or_else(|| panic!("no region line in {stderr}"));
    let rest = line.split("slice region ").nth(1).unwrap();
    PathBuf::from(rest.split_whitespace().next().unwrap())
}

/// `gpuslice run` of a shell `script` under a 1 GiB fake slice, returned once the script has
/// printed its first line, `ready` (so a signal sent next reaches a running command).
fn run_until_ready(script: &str) -> Child {
    let mut child = gpuslice()
        .args(["run", "--fake-gpu", "-m", "1g", "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

#[test]
fn run_forwards_sigterm_to_the_command() {
    let mut child =
        run_until_ready("trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done");
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(42),
        "the command did not get SIGTERM: {status}"
    );
}

/// A command that does not touch its signal mask (unlike `sh` with a trap) must still get
/// the forwarded signal: it dies of SIGTERM and `run` exits 128+15.
#[test]
fn run_passes_an_unblocked_signal_mask_to_the_command() {
    let mut child = run_until_ready("echo ready; exec sleep 30");
    let started = Instant::now();
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "sleep outlived SIGTERM"
    );
}

/// NEEDS the shim's memory slice (shim/) and fakegpu's libcuda (cuda-tests/fakegpu-cuda):
/// fails until both are in place.
#[test]
fn run_gives_clients_a_1gib_device_and_refuses_past_it() {
    for client in ["linked-client", "cudarc-client", "procaddr-client"] {
        let client_path = bin(client);
        let c = client_path.to_str().unwrap();
        let r = run(&["run", "--memory", "1GiB", "--fake-gpu", "--", c, "meminfo"]);
        assert_eq!(r.code, 0, "{client} meminfo: {}", r.stderr);
        let v = json_line(&r.stdout);
        assert_eq!(v["total"], GIB, "{client} meminfo: {v}");
        assert!(v["free"].as_u64().unwrap() <= GIB, "{client}: {v}");

        let r = run(&[
            "run",
            "--memory",
            "1GiB",
            "--fake-gpu",
            "--",
            c,
            "alloc-until-oom",
            "256MiB",
        ]);
        assert_eq!(r.code, 0, "{client} alloc-until-oom: {}", r.stderr);
        let v = json_line(&r.stdout);
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{client}: {v}");
        let got = v["total_bytes"].as_u64().unwrap();
        assert!(
            (256 * MIB..=GIB).contains(&got),
            "{client} got {got} bytes in a 1 GiB slice: {v}"
        );
    }
}

/// A running `gpuslice run` whose command is a `hold` client; ends it on drop.
struct Holder {
    child: Child,
    region: PathBuf,
    pid: u64,
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn start_holder(size: &str) -> Holder {
    let mut child = gpuslice()
        .args([
            "run",
            "--fake-gpu",
            "-m",
            "1GiB",
            "--",
            bin("linked-client").to_str().unwrap(),
            "hold",
            size,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let region = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("gpuslice run ended before printing the region: {seen}");
        }
        seen.push_str(&line);
        if line.contains("slice region ") {
            break region_from_stderr(&line);
        }
    };
    // Keep draining stderr so the client never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let held = json_line(&line);
    assert_eq!(held["result"], "CUDA_SUCCESS", "hold failed: {held}");
    let pid = held["pid"].as_u64().unwrap();
    Holder { child, region, pid }
}

/// NEEDS the shim registering processes in the region: fails until it does.
#[test]
fn status_shows_a_holding_client_and_its_memory() {
    let holder = start_holder("256MiB");
    let region = holder.region.to_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (view, last) = loop {
        let r = run(&["status", "--region", &region, "--json"]);
        if r.code == 0 {
            let v = json_line(&r.stdout);
            let found = v["processes"].as_array().into_iter().flatten().any(|p| {
                p["pid"].as_u64() == Some(holder.pid) && p["used_total"].as_u64() >= Some(256 * MIB)
            });
            if found {
                break (v, r);
            }
        }
        assert!(
            Instant::now() < deadline,
            "status never showed pid {} with 256 MiB: {} {}",
            holder.pid,
            r.stdout,
            r.stderr
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(last.code, 0);
    assert_eq!(view["devices"][0]["limit"], GIB, "{view}");
    assert!(
        view["devices"][0]["used"].as_u64().unwrap() >= 256 * MIB,
        "{view}"
    );
    let human = run(&["status", "--region", &region]);
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(
        human.stdout.contains(&holder.pid.to_string()) && human.stdout.contains("alive"),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("1 GiB"), "{}", human.stdout);
}

#[test]
fn smi_shows_the_slice_under_the_shim_and_the_card_without_it() {
    let gpuslice_path = bin("gpuslice");
    let me = gpuslice_path.to_str().unwrap();
    let r = run(&["run", "--fake-gpu", "-m", "1GiB", "--", me, "smi", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json_line(&r.stdout);
    assert_eq!(v["devices"][0]["memory"]["total"], GIB, "slice view: {v}");
    let r = run(&["run", "--fake-gpu", "-m", "1GiB", "--", me, "smi"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("/ 1024MiB"), "{}", r.stdout);
    assert!(r.stdout.contains("Tesla V100-PCIE-32GB"), "{}", r.stdout);

    let dir = TempDir::new("smi");
    let mut cmd = gpuslice();
    cmd.args(["smi", "--json"]);
    fake_env(&dir, &mut cmd);
    let r = run_with(&mut cmd);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json_line(&r.stdout);
    assert_eq!(
        v["devices"][0]["memory"]["total"],
        32 * GIB,
        "card view: {v}"
    );
}

/// NEEDS the shim (memory slice) and the fake's libcuda; the compute step only reports until
/// the throttle lands.
#[test]
fn demo_runs_to_completion() {
    let started = Instant::now();
    let r = run(&["demo", "--fake-gpu"]);
    assert_eq!(r.code, 0, "demo failed:\n{}\n{}", r.stdout, r.stderr);
    for needle in [
        "[1/3]",
        "[2/3]",
        "[3/3]",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "demo complete",
    ] {
        assert!(
            r.stdout.contains(needle),
            "demo output lacks {needle:?}:\n{}",
            r.stdout
        );
    }
    // No wall-clock bound here: the demo bounds each of its steps itself (its clients' and
    // PyTorch's deadlines fail the run), and this test runs beside the whole parallel suite.
    eprintln!("demo took {:?}", started.elapsed());
}

#[test]
fn reset_rebuilds_a_corrupt_region_but_not_one_in_use() {
    let dir = TempDir::new("reset");
    let corrupt = dir.s("corrupt.region");
    std::fs::write(&corrupt, b"definitely not a region").unwrap();
    let before = run(&["status", "--region", &corrupt]);
    assert_eq!(before.code, 3, "{}", before.stderr);
    assert!(
        before.stderr.contains("gpuslice reset"),
        "{}",
        before.stderr
    );

    let reset = run(&["reset", "--region", &corrupt]);
    assert_eq!(reset.code, 0, "{}", reset.stderr);
    let after = run(&["status", "--region", &corrupt, "--json"]);
    assert_eq!(after.code, 0, "status after reset: {}", after.stderr);
    assert_eq!(json_line(&after.stdout)["processes"], serde_json::json!([]));

    let holder = start_holder("64MiB");
    let region = holder.region.to_str().unwrap().to_string();
    let refused = run(&["reset", "--region", &region]);
    assert_eq!(
        refused.code, 3,
        "reset of a live region: {}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains(&holder.pid.to_string()),
        "the refusal names the live pid {}: {}",
        holder.pid,
        refused.stderr
    );
}

/// Runs `cmd` with standard output a pipe whose read end is already closed, so its first
/// write meets EPIPE (what `| head -1` leaves behind once head has exited).
fn run_into_closed_pipe(cmd: &mut Command) -> Ran {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let output = cmd
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run the tool");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `gpuslice status --watch | head -1`, `gpuslice smi | head -1`, `fakegpu smi | head -1`:
/// a reader that went away ends the tool quietly with 141 (128 + SIGPIPE, as a shell reports
/// for a Unix tool), never the panic "failed printing to stdout: Broken pipe" (exit 101).
#[test]
fn a_closed_pipe_ends_the_tools_quietly() {
    let dir = TempDir::new("pipe");
    let region = dir.s("pipe.region");
    std::fs::write(&region, b"not yet a region").unwrap();
    assert_eq!(run(&["reset", "--region", &region]).code, 0);

    let mut status = gpuslice();
    status.args(["status", "--region", &region, "--watch", "0.05"]);
    let mut status_json = gpuslice();
    status_json.args(["status", "--region", &region, "--json"]);
    let mut smi = gpuslice();
    smi.arg("smi");
    fake_env(&dir, &mut smi);
    // Also brings the fake GPU's state into being for `fakegpu smi`.
    let mut smi_json = gpuslice();
    smi_json.args(["smi", "--json"]);
    fake_env(&dir, &mut smi_json);
    assert_eq!(run_with(&mut smi_json).code, 0);
    let mut fake_smi = Command::new(bin("fakegpu"));
    fake_smi.args(["smi", "--state", &dir.s("fakegpu.state")]);
    let mut fake_help = Command::new(bin("fakegpu"));
    fake_help.arg("--help");

    for (label, cmd) in [
        ("gpuslice status --watch", &mut status),
        ("gpuslice status --json", &mut status_json),
        ("gpuslice smi", &mut smi),
        ("gpuslice smi --json", &mut smi_json),
        ("fakegpu smi", &mut fake_smi),
        ("fakegpu --help", &mut fake_help),
    ] {
        let r = run_into_closed_pipe(cmd);
        assert_eq!(
            r.code, 141,
            "{label}: exit {} stderr {:?}",
            r.code, r.stderr
        );
        assert_eq!(r.stderr, "", "{label}: nothing on stderr");
    }
}

/// `gpuslice smi` in a process whose slice configuration is invalid (the shim refuses NVML):
/// one line that says so and what to run, not nvml-wrapper's "NVML was not first initialized
/// with `Nvml::init()`", which reads like a bug in the tool.
#[test]
fn smi_under_an_invalid_configuration_says_why_nvml_refused() {
    let dir = TempDir::new("smi-refused");
    let limits = dir.join("limits.json");
    std::fs::write(
        &limits,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#,
    )
    .unwrap();
    let mut cmd = gpuslice();
    cmd.arg("smi")
        .env("LD_PRELOAD", bin("libgpuslice.so"))
        .env("GPUSLICE_CONFIG", &limits);
    fake_env(&dir, &mut cmd);
    let r = run_with(&mut cmd);
    assert_eq!(r.code, 4, "{}", r.stderr);
    let shim_line = r
        .stderr
        .lines()
        .find(|l| l.starts_with("[gpuslice]"))
        .unwrap_or_else(|| panic!("no [gpuslice] line: {}", r.stderr));
    assert!(
        shim_line.contains(&format!("gpuslice check {}", limits.display())),
        "{shim_line}"
    );
    let own = r
        .stderr
        .lines()
        .find(|l| l.starts_with("gpuslice:"))
        .unwrap_or_else(|| panic!("no gpuslice: line: {}", r.stderr));
    assert!(
        own.contains("NVML_ERROR_UNINITIALIZED") && own.contains("invalid"),
        "{own}"
    );
    assert!(!r.stderr.contains("Nvml::init"), "{}", r.stderr);
}
