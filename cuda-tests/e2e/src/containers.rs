//! The podman test bed shared by the container end-to-end tests (`cuda-tests/e2e/tests/
//! containers.rs` and the DRA driver's `dra/tests/containers.rs`), kept in one place so both
//! run containers the same way.
//!
//! It owns: whether rootful podman can run here and with which containers.conf ([`Podman`],
//! [`skip_or_fail`]); the bounded `podman` command and the containers run with it; and a
//! test's [`Stage`]: the minimal root file system a container runs from (the clients,
//! `gpuslice`, `sh`, `env`, `cat`, their `ldd` libraries, the loader and the fake driver next
//! to libc), the simulated V100 created on the host, the fake's host-PID broker the
//! containers' processes register through, and the `podman run` arguments that mount them.
//! What a test does with its containers (CDI specs, slices, assertions) stays in the test.

use crate::HostPidBroker;
use serde_json::Value;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

/// Where the fake's state file appears in every container: the fake's default for uid 0, so
/// `env -i` still reaches the same GPU.
const STATE_IN_CONTAINER: &str = "/tmp/fakegpu-0.state";
/// The containers.conf written when neither `$CONTAINERS_CONF` nor the CI one exists.
const CONTAINERS_CONF: &str = "# gpuslice container tests: runc, cgroupfs, no systemd\n\
[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n\
cgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n";
/// The client programs copied into every root file system (as `/usr/bin/<name>`).
const CLIENTS: [&str; 3] = ["linked-client", "cudarc-client", "procaddr-client"];
/// Longest any single podman command may take before the test gives up on it.
const PODMAN_TIMEOUT: &str = "120";

/// Lossy UTF-8 of a command's output.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The directory cargo built into ([`crate::target_dir`]), checked once for every artifact a
/// container bed needs; fails with how to build them when one is missing.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = crate::target_dir();
        let mut wanted = vec![
            "gpuslice",
            "libgpuslice.so",
            "libgpuslice_core.so",
            "fakegpu",
            "libfakegpu_cuda.so",
            "libfakegpu_nvml.so",
        ];
        wanted.extend(CLIENTS);
        let missing: Vec<_> = wanted
            .iter()
            .filter(|name| !dir.join(name).is_file())
            .collect();
        assert!(
            missing.is_empty(),
            "container tests need {missing:?} in {}: run `cargo build --workspace` first \
             (`cargo xtask test` does)",
            dir.display()
        );
        dir
    })
}

/// Podman cannot start containers here: prints the loud SKIPPED line and records it (the
/// caller then returns), or with `CI=true` fails the test.
pub fn skip_or_fail(reason: &str) {
    crate::skip::skip_or_fail(&format!("podman cannot start containers here: {reason}"));
}

/// How podman is run here: rootful, with the test containers.conf.
#[derive(Debug)]
pub struct Podman {
    conf: PathBuf,
}

impl Podman {
    /// Podman if this process is root and `podman --version` runs, with `$CONTAINERS_CONF`,
    /// else `/etc/gpuslice-ci/containers.conf` (`.ci/container-setup.sh`), else
    /// `CONTAINERS_CONF` written into `conf_dir`; otherwise why not.
    pub fn probe(conf_dir: &Path) -> Result<Podman, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(
                "not running as root (these tests use rootful podman and write CDI specs)".into(),
            );
        }
        let version = Command::new("podman")
            .arg("--version")
            .output()
            .map_err(|e| format!("`podman --version`: {e} (run .ci/container-setup.sh)"))?;
        if !version.status.success() {
            return Err(format!(
                "`podman --version` failed: {}",
                text(&version.stderr)
            ));
        }
        let conf = match std::env::var_os("CONTAINERS_CONF") {
            Some(conf) => PathBuf::from(conf),
            None if Path::new("/etc/gpuslice-ci/containers.conf").is_file() => {
                PathBuf::from("/etc/gpuslice-ci/containers.conf")
            }
            None => {
                fs::create_dir_all(conf_dir)
                    .map_err(|e| format!("cannot create {}: {e}", conf_dir.display()))?;
                let conf = conf_dir.join("containers.conf");
                fs::write(&conf, CONTAINERS_CONF)
                    .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
                conf
            }
        };
        Ok(Podman { conf })
    }

    /// `timeout -k 5 120 podman ARGS` with the test containers.conf.
    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args(["-k", "5", PODMAN_TIMEOUT, "podman"])
            .env("CONTAINERS_CONF", &self.conf);
        cmd
    }

    /// Runs `script` with /bin/sh in a new container (`args` from [`Stage::run_args`]); returns each
    /// stdout line parsed as JSON.
    pub fn run_script(&self, args: &[String], script: &str) -> Vec<Value> {
        let out = self
            .cmd()
            .args(args)
            .args(["/bin/sh", "-c", script])
            .output()
            .unwrap();
        json_lines(&out, &format!("container {script:?}"))
    }

    /// Starts `linked-client hold SIZE` in a new container (`args` from [`Stage::run_args`], made
    /// interactive) and waits for its report line; returns the report and the running podman
    /// (closing its stdin is the hold scenario's signal to free and exit).
    pub fn hold(&self, args: &[String], size: &str) -> (Value, Child) {
        self.hold_running(args, &["/usr/bin/linked-client", "hold", size])
    }

    /// [`Podman::hold`] with another holding `command` (a client scenario that prints one
    /// line, then holds until its stdin closes).
    pub fn hold_running(&self, args: &[String], command: &[&str]) -> (Value, Child) {
        let size = command.join(" ");
        let mut child = self
            .cmd()
            .args(args)
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        match serde_json::from_str(line.trim()) {
            Ok(report) => (report, child),
            Err(_) => {
                drop(child.stdin.take());
                let out = child.wait_with_output().unwrap();
                let name = args
                    .iter()
                    .skip_while(|arg| *arg != "--name")
                    .nth(1)
                    .map_or("a container", String::as_str);
                panic!(
                    "hold {size} in {name}: no JSON line (got {line:?}); exit {}; stderr: {}",
                    out.status,
                    text(&out.stderr)
                );
            }
        }
    }

    /// Removes container `name` if it is still there (a test that failed half way).
    pub fn remove(&self, name: &str) {
        let _ = self
            .cmd()
            .args(["rm", "-f", "-t", "0", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// What every container of a test runs on: a root file system (`rootfs`) and one simulated
/// V100 (`create_v100`) whose state file every container mounts, with the host-PID broker
/// for it (`HostPidBroker::start`, the fake's `fakegpu pid-broker`) mounted next to it.
#[derive(Debug)]
pub struct Stage {
    rootfs: PathBuf,
    state: PathBuf,
    broker: HostPidBroker,
}

impl Stage {
    /// The root file system at `dir/rootfs`, the fake GPU at `dir/fakegpu.state`.
    pub fn new(dir: &Path) -> Stage {
        let rootfs = rootfs(dir);
        let state = dir.join("fakegpu.state");
        create_v100(&state);
        let broker = HostPidBroker::start(&state);
        Stage {
            rootfs,
            state,
            broker,
        }
    }

    /// The fake GPU's state file on the host.
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// The root file system the containers run from (add files to it before a run).
    pub fn rootfs(&self) -> &Path {
        &self.rootfs
    }

    /// `podman run` arguments up to (not including) the command: container `name` with the
    /// fake GPU's state at `STATE_IN_CONTAINER` (and the broker's socket next to it), CDI
    /// `devices`, from the root file system; `interactive` keeps stdin open.
    pub fn run_args(&self, name: &str, interactive: bool, devices: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = ["run", "--rm", "--network", "none", "--name", name]
            .map(String::from)
            .to_vec();
        if interactive {
            args.push("-i".into());
        }
        args.extend([
            "-v".into(),
            format!("{}:{STATE_IN_CONTAINER}", self.state.display()),
            "-v".into(),
            format!(
                "{}:{STATE_IN_CONTAINER}.hostpid",
                self.broker.socket.display()
            ),
            "-e".into(),
            format!("FAKEGPU_STATE={STATE_IN_CONTAINER}"),
        ]);
        for device in devices {
            args.extend(["--device".into(), device.to_string()]);
        }
        args.extend(["--rootfs".into(), self.rootfs.display().to_string()]);
        args
    }
}

/// The libraries `ldd` resolves for `file` (absolute paths, the loader included).
fn ldd(file: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(file).output().expect("run ldd");
    text(&out.stdout)
        .lines()
        .filter_map(|line| {
            // "name => /path (0x...)", "/path (0x...)"; "name => not found" has no path.
            line.split_whitespace()
                .find(|word| word.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// Copies every library `file` needs under `rootfs`, at the same path as on the host.
fn copy_libs(rootfs: &Path, file: &Path) {
    for lib in ldd(file) {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap());
        if !dest.exists() {
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            fs::copy(&lib, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", lib.display()));
        }
    }
}

/// Copies `file` to `target` under `rootfs`, and every library it needs.
pub fn copy_with_libs(rootfs: &Path, file: &Path, target: &str) {
    let dest = rootfs.join(target.trim_start_matches('/'));
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    fs::copy(file, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
    copy_libs(rootfs, file);
}

fn which(program: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{program} not found on this machine");
    PathBuf::from(text(&out.stdout).trim())
}

/// A root file system at `dir/rootfs` from what cargo built: the `CLIENTS` and `gpuslice`
/// in /usr/bin, `/bin/sh`, `env` and `cat`, all their libraries and the shim's, and the fake
/// driver installed next to libc (in the loader's default search path, so `env -i` finds it
/// too; where the NVIDIA CDI spec mounts the real libcuda.so.1).
fn rootfs(dir: &Path) -> PathBuf {
    let bin = bin_dir();
    let rootfs = dir.join("rootfs");
    for client in CLIENTS {
        copy_with_libs(&rootfs, &bin.join(client), &format!("/usr/bin/{client}"));
    }
    copy_with_libs(&rootfs, &bin.join("gpuslice"), "/usr/bin/gpuslice");
    // The shim's own dependencies must be in every image it is injected into.
    copy_libs(&rootfs, &bin.join("libgpuslice.so"));
    copy_libs(&rootfs, &bin.join("libgpuslice_core.so"));
    copy_with_libs(&rootfs, Path::new("/bin/sh"), "/bin/sh");
    copy_with_libs(&rootfs, &which("env"), "/usr/bin/env");
    copy_with_libs(&rootfs, &which("cat"), "/bin/cat");
    for sub in ["tmp", "etc", "proc", "sys", "dev", "var/run"] {
        fs::create_dir_all(rootfs.join(sub)).unwrap();
    }

    let libc_dir = ldd(&bin.join("linked-client"))
        .into_iter()
        .find(|lib| lib.file_name().is_some_and(|n| n == "libc.so.6"))
        .and_then(|lib| lib.parent().map(Path::to_path_buf))
        .expect("ldd shows libc.so.6");
    let libc_in_rootfs = rootfs.join(libc_dir.strip_prefix("/").unwrap());
    // The loader also by its soname in libc's directory, as a distribution image has it (ldd
    // names only /lib64's): a library loaded into a new link-map namespace (`dlmopen`, the
    // bypass test) finds its libc's `ld-linux*.so.2` only by search path.
    for loader in ldd(&bin.join("linked-client")) {
        let name = loader.file_name().unwrap_or_default();
        let dest = libc_in_rootfs.join(name);
        if name.to_string_lossy().starts_with("ld-") && !dest.exists() {
            fs::copy(&loader, &dest).unwrap();
        }
    }
    install_fake(&libc_in_rootfs);
    for lib in ["libfakegpu_cuda.so", "libfakegpu_nvml.so"] {
        copy_libs(&rootfs, &bin.join(lib));
    }
    rootfs
}

/// `fakegpu install DIR`: the fake driver's libraries under the names a real driver has.
pub fn install_fake(dir: &Path) {
    let out = Command::new(bin_dir().join("fakegpu"))
        .arg("install")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fakegpu install: {}",
        text(&out.stderr)
    );
}

/// Creates the simulated V100 at `state` from the host (an empty state file is initialised by
/// the first opener, here the host's `fakegpu smi`), so the file exists to be bind-mounted.
fn create_v100(state: &Path) {
    fs::write(state, b"").unwrap();
    let out = Command::new(bin_dir().join("fakegpu"))
        .args(["smi", "--json", "--state"])
        .arg(state)
        .env("FAKEGPU_DEVICES", "v100")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "creating the fake GPU on the host failed: {} {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Each non-empty stdout line of a successful command, parsed as JSON; `what` names the
/// command in the failure message.
pub fn json_lines(out: &Output, what: &str) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                panic!(
                    "{what}: stdout line {line:?} is not JSON ({e}); stderr: {}",
                    text(&out.stderr)
                )
            })
        })
        .collect()
}

/// The number at `path` (object keys or array indices) in `value`.
pub fn u64_at(value: &Value, path: &[&str]) -> u64 {
    let mut at = value;
    for key in path {
        at = match key.parse::<usize>() {
            Ok(i) if at.is_array() => &at[i],
            _ => &at[*key],
        };
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {value}"))
}

/// The prefix of the Python that has PyTorch (`E2E_PYTHON`, default `python3`), or `None`
/// after a loud skip (a failure with `CI=true`).
pub fn torch_prefix() -> Option<PathBuf> {
    let python = std::env::var("E2E_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys, torch; print(sys.prefix); print(sys.executable)",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = text(&o.stdout);
            text.lines().next().map(PathBuf::from)
        }
        _ => {
            crate::skip::skip_or_fail(&format!("PyTorch is not installed for {python}"));
            None
        }
    }
}

/// Copies into `rootfs` the system libraries (those outside `prefix`) that `files` need.
fn copy_system_libs(rootfs: &Path, prefix: &Path, files: &[PathBuf]) {
    for chunk in files.chunks(64) {
        let out = Command::new("ldd").args(chunk).output().expect("run ldd");
        for lib in text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
            .map(PathBuf::from)
        {
            if lib.starts_with(prefix) || !lib.is_file() {
                continue;
            }
            let dest = rootfs.join(lib.strip_prefix("/").unwrap());
            if !dest.exists() {
                fs::create_dir_all(dest.parent().unwrap()).unwrap();
                fs::copy(&lib, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", lib.display()));
            }
        }
    }
}

/// Shared objects directly in `dir` (not recursive).
fn shared_objects(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().contains(".so"))
                .collect()
        })
        .unwrap_or_default()
}

/// What [`torch_fill_command`] runs: prints `{"free", "total"}` (torch.cuda.mem_get_info),
/// fills the device in 64 MiB tensors until torch.cuda.OutOfMemoryError and prints
/// `{"oom", "filled"}`, frees and prints `{"after"}` (the free memory then).
const TORCH_FILL_SCRIPT: &str = r#"
import json, warnings
warnings.simplefilter("ignore")
import torch
free, total = torch.cuda.mem_get_info()
print(json.dumps({"free": free, "total": total}), flush=True)
xs, oom = [], False
try:
    while True:
        xs.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    oom = True
print(json.dumps({"oom": oom, "filled": len(xs) * (64 << 20)}), flush=True)
del xs
torch.cuda.empty_cache()
print(json.dumps({"after": torch.cuda.mem_get_info()[0]}), flush=True)
"#;

/// Makes PyTorch of `prefix` (from [`torch_prefix`]) runnable in containers of `rootfs`: the
/// system libraries the interpreter and its packages need are copied in, with the fill
/// script of [`torch_fill_command`]; the interpreter and its packages are mounted read-only
/// from the host at the same path by the `podman run` arguments returned (to insert before
/// `--rootfs`).
pub fn add_pytorch(rootfs: &Path, prefix: &Path) -> Vec<String> {
    let site = prefix
        .join("lib")
        .read_dir()
        .unwrap()
        .flatten()
        .find_map(|e| {
            let p = e.path().join("site-packages");
            p.join("torch").is_dir().then_some(p)
        });
    let site = site.expect("torch's site-packages under the prefix");
    let mut files = vec![fs::canonicalize(prefix.join("bin/python3")).unwrap()];
    for dir in [
        site.join("torch/lib"),
        site.join("torch"),
        site.join("numpy/_core"),
        site.join("nvidia/cu13/lib"),
    ] {
        files.extend(shared_objects(&dir));
    }
    if let Some(dynload) = prefix
        .join("lib")
        .read_dir()
        .unwrap()
        .flatten()
        .find_map(|e| {
            let p = e.path().join("lib-dynload");
            p.is_dir().then_some(p)
        })
    {
        files.extend(shared_objects(&dynload));
    }
    files.extend(shared_objects(&prefix.join("lib")));
    copy_system_libs(rootfs, prefix, &files);
    fs::create_dir_all(rootfs.join("usr/share")).unwrap();
    fs::write(rootfs.join("usr/share/torch_slice.py"), TORCH_FILL_SCRIPT).unwrap();
    vec![
        "-v".to_string(),
        format!("{}:{}:ro", prefix.display(), prefix.display()),
    ]
}

/// The shell command that runs the fill script with the Python of `prefix` in a container
/// prepared by [`add_pytorch`]; it prints three JSON lines (see `TORCH_FILL_SCRIPT`).
pub fn torch_fill_command(prefix: &Path) -> String {
    format!(
        "{} /usr/share/torch_slice.py",
        prefix.join("bin/python3").display()
    )
}
