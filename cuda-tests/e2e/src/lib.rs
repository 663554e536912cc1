//! The end-to-end test harness: where the built artifacts are, a fresh simulated GPU per test,
//! slices (limit file + shared region, injected with LD_PRELOAD), and the client programs run
//! as real child processes.
//!
//! Every end-to-end test of the project goes through this API:
//!
//! ```no_run
//! use cuda_e2e::{Client, ClientKind, FakeGpu, Slice};
//!
//! let gpu = FakeGpu::start("v100");
//! // Without the shim: what the fake says directly.
//! for kind in ClientKind::ALL {
//!     let info = Client::run(kind, &["info"], &gpu.env());
//!     assert_eq!(info["devices"][0]["name"], "Tesla V100-PCIE-32GB");
//! }
//! // Under a slice: same clients, LD_PRELOAD=libgpuslice.so and GPUSLICE_CONFIG set.
//! let slice = Slice::builder().device(0, "4GiB", Some(25)).build();
//! let held = Client::spawn(ClientKind::Linked, &["hold", "1GiB"], &slice.env(&gpu));
//! assert_eq!(held.first["result"], "CUDA_SUCCESS");
//! let pid = held.pid();
//! cuda_e2e::wait_until("the hold child is visible", cuda_e2e::DEFAULT_TIMEOUT, || {
//!     gpu.truth().processes(0).iter().any(|p| p.pid == pid)
//! });
//! held.kill();
//! ```
//!
//! Child processes get an explicit environment: the caller's `Env` on top of the test's own
//! environment minus every variable that would change what a client sees (LD_PRELOAD,
//! GPUSLICE_*, FAKEGPU_*, HAMi's CUDA_DEVICE_*, the clients' CLIENT_CONTEXT and
//! CLIENT_START_BARRIER), so a developer's shell cannot leak a slice, a state file, a context
//! mode or a barrier into a test.

pub mod containers;
pub mod dev_nodes;
pub mod skip;

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Environment variables for a child process, applied on top of the cleaned environment.
pub type Env = Vec<(String, String)>;

/// How long a client run or an awaited condition may take before the test fails. Generous:
/// a loaded 2-core CI machine runs many test binaries at once.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Variables removed from every child's inherited environment (then `Env` is applied).
const SCRUBBED_PREFIXES: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "GPUSLICE_",
    "FAKEGPU_",
    "CUDA_DEVICE_",
    "GPU_CORE_UTILIZATION_POLICY",
    "LIBCUDA_LOG_LEVEL",
    "CUDA_VISIBLE_DEVICES",
    "CLIENT_CONTEXT",
    "CLIENT_START_BARRIER",
];

/// `target/<profile>`: the directory holding this test binary's `deps/` folder.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary has a parent");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// Path of a built artifact in [`target_dir`]; panics with how to build it when missing.
pub fn artifact(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    if !path.exists() {
        panic!(
            "run `cargo xtask test` (or `cargo build --workspace`) first: {} is missing",
            path.display()
        );
    }
    path
}

/// `libgpuslice.so`: the front library every process maps (`shim/front/`); it loads
/// [`shim_core_library`] from its own directory at the first hooked call.
pub fn shim_library() -> PathBuf {
    artifact("libgpuslice.so")
}

/// `libgpuslice_core.so`: the shim proper, beside [`shim_library`].
pub fn shim_core_library() -> PathBuf {
    artifact("libgpuslice_core.so")
}

/// The `gpuslice` CLI.
pub fn gpuslice_binary() -> PathBuf {
    artifact("gpuslice")
}

/// The `fakegpu` tool.
pub fn fakegpu_binary() -> PathBuf {
    artifact("fakegpu")
}

/// A directory removed (with its contents) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory under the system temp dir, unique per process and call.
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "gpuslice-e2e-{label}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One simulated machine: a fresh `FAKEGPU_STATE` file and the fake driver libraries laid
/// out under their real names (`libcuda.so.1`, `libnvidia-ml.so.1`).
pub struct FakeGpu {
    dir: TempDir,
    devices: String,
    truth: fakegpu::SharedState,
}

impl FakeGpu {
    /// A new GPU with `devices` (FAKEGPU_DEVICES syntax: "v100", "h200", "v100,v100").
    pub fn start(devices: &str) -> FakeGpu {
        let dir = TempDir::new("fakegpu");
        let lib_dir = dir.path().join("lib");
        std::fs::create_dir_all(&lib_dir).expect("create lib dir");
        install_fake(&lib_dir);
        let specs = fakegpu::spec::parse_presets(devices)
            .unwrap_or_else(|e| panic!("bad device list {devices:?}: {e}"));
        let state = dir.path().join("fakegpu.state");
        let truth = fakegpu::state::open_state_with(&state, &specs)
            .unwrap_or_else(|e| panic!("cannot create fake GPU state {}: {e}", state.display()));
        FakeGpu {
            dir,
            devices: devices.to_string(),
            truth,
        }
    }

    /// The directory holding `libcuda.so.1` and `libnvidia-ml.so.1` (LD_LIBRARY_PATH).
    pub fn lib_dir(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    /// The shared state file every process of this GPU maps.
    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("fakegpu.state")
    }

    /// A scratch directory that lives as long as this GPU.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Environment for a client of this GPU (no shim).
    pub fn env(&self) -> Env {
        vec![
            (
                "LD_LIBRARY_PATH".into(),
                self.lib_dir().display().to_string(),
            ),
            (
                "FAKEGPU_STATE".into(),
                self.state_path().display().to_string(),
            ),
            ("FAKEGPU_DEVICES".into(), self.devices.clone()),
        ]
    }

    /// The host's physical view: what the (simulated) hardware really holds, independent of
    /// anything a client or the shim reports.
    pub fn truth(&self) -> &fakegpu::SharedState {
        &self.truth
    }

    /// `fakegpu smi --json` for this GPU (the host administrator's nvidia-smi).
    pub fn smi_json(&self) -> Value {
        let mut cmd = Command::new(fakegpu_binary());
        cmd.args(["smi", "--json", "--state"])
            .arg(self.state_path());
        let output = run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
        assert!(
            output.status.success(),
            "fakegpu smi failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "fakegpu smi --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}

/// Lays the fake driver out in `dir`: `fakegpu install` when that tool is built, else the
/// same copies made here.
fn install_fake(dir: &Path) {
    let tool = target_dir().join("fakegpu");
    if tool.exists() {
        let mut cmd = Command::new(&tool);
        cmd.arg("install").arg(dir);
        let out = run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
        assert!(
            out.status.success(),
            "fakegpu install failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    for (built, soname, link) in [
        ("libfakegpu_cuda.so", "libcuda.so.1", "libcuda.so"),
        ("libfakegpu_nvml.so", "libnvidia-ml.so.1", "libnvidia-ml.so"),
    ] {
        std::fs::copy(artifact(built), dir.join(soname)).expect("copy fake library");
        std::os::unix::fs::symlink(soname, dir.join(link)).expect("symlink fake library");
    }
}

/// A slice: a limit file and a shared-region path in a temp dir, injected into clients with
/// `LD_PRELOAD=libgpuslice.so` and `GPUSLICE_CONFIG`.
pub struct Slice {
    dir: TempDir,
}

/// Builds a [`Slice`]'s limit file (schema version 1).
pub struct SliceBuilder {
    policy: String,
    devices: Vec<Value>,
    raw: Option<String>,
}

impl Slice {
    /// Starts a limit file with policy "cap" and no devices.
    pub fn builder() -> SliceBuilder {
        SliceBuilder {
            policy: "cap".into(),
            devices: Vec::new(),
            raw: None,
        }
    }

    /// The limit file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("limits.json")
    }

    /// The shared region file the limit file names.
    pub fn region_path(&self) -> PathBuf {
        self.dir.path().join("region")
    }

    /// `fake`'s environment plus this slice (GPUSLICE_CONFIG, LD_PRELOAD).
    pub fn env(&self, fake: &FakeGpu) -> Env {
        let mut env = fake.env();
        env.push((
            "GPUSLICE_CONFIG".into(),
            self.config_path().display().to_string(),
        ));
        env.push(("LD_PRELOAD".into(), shim_library().display().to_string()));
        env
    }
}

impl SliceBuilder {
    /// `"cap"` (default) or another policy name the schema knows.
    pub fn policy(mut self, policy: &str) -> Self {
        self.policy = policy.into();
        self
    }

    /// Limits device `index`: `memory` like "1GiB", `compute` in percent.
    pub fn device(mut self, index: u32, memory: &str, compute: Option<u32>) -> Self {
        let mut d = serde_json::json!({"index": index, "memory": memory});
        if let Some(c) = compute {
            d["compute"] = c.into();
        }
        self.devices.push(d);
        self
    }

    /// Limits a device by UUID instead of index.
    pub fn device_uuid(mut self, uuid: &str, memory: &str, compute: Option<u32>) -> Self {
        let mut d = serde_json::json!({"uuid": uuid, "memory": memory});
        if let Some(c) = compute {
            d["compute"] = c.into();
        }
        self.devices.push(d);
        self
    }

    /// Writes `text` verbatim as the limit file (malformed-file tests). `{region}` is
    /// replaced by the slice's region path.
    pub fn raw(mut self, text: &str) -> Self {
        self.raw = Some(text.into());
        self
    }

    /// Writes the limit file.
    pub fn build(self) -> Slice {
        let slice = Slice {
            dir: TempDir::new("slice"),
        };
        let region = slice.region_path().display().to_string();
        let text = match self.raw {
            Some(raw) => raw.replace("{region}", &region),
            None => serde_json::json!({
                "version": 1,
                "region": region,
                "policy": self.policy,
                "devices": self.devices,
            })
            .to_string(),
        };
        std::fs::write(slice.config_path(), text).expect("write limit file");
        slice
    }
}

/// The three ways a client reaches the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// `linked-client`: linked with -lcuda / -lnvidia-ml.
    Linked,
    /// `cudarc-client`: cudarc (dlopen + dlsym).
    Cudarc,
    /// `procaddr-client`: dlopen + cuGetProcAddress_v2 (the CUDA runtime's path).
    ProcAddr,
}

impl ClientKind {
    pub const ALL: [ClientKind; 3] = [ClientKind::Linked, ClientKind::Cudarc, ClientKind::ProcAddr];

    /// The binary's file name.
    pub fn binary_name(self) -> &'static str {
        match self {
            ClientKind::Linked => "linked-client",
            ClientKind::Cudarc => "cudarc-client",
            ClientKind::ProcAddr => "procaddr-client",
        }
    }

    /// The `client` field its JSON carries.
    pub fn label(self) -> &'static str {
        match self {
            ClientKind::Linked => "linked",
            ClientKind::Cudarc => "cudarc",
            ClientKind::ProcAddr => "procaddr",
        }
    }

    pub fn binary(self) -> PathBuf {
        artifact(self.binary_name())
    }
}

/// Runs client programs.
pub struct Client;

impl Client {
    /// Runs one scenario to completion and returns its JSON line; panics (with stderr) when
    /// the client exits non-zero, prints no JSON, or outlives [`DEFAULT_TIMEOUT`].
    pub fn run(kind: ClientKind, args: &[&str], env: &Env) -> Value {
        let output = Client::output(kind, args, env);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
            kind.binary_name(),
            output.status
        );
        let line = stdout.lines().last().unwrap_or("");
        serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "{} {args:?} printed no JSON ({e}):\nstdout: {stdout}\nstderr: {stderr}",
                kind.binary_name()
            )
        })
    }

    /// Runs one scenario and returns the raw output (for tests expecting a failure).
    pub fn output(kind: ClientKind, args: &[&str], env: &Env) -> Output {
        let mut cmd = command(&kind.binary(), args, env);
        cmd.stdin(Stdio::null());
        run_with_timeout(cmd, None, DEFAULT_TIMEOUT)
    }

    /// Starts a long-running scenario (`hold`) and waits for its first JSON line. The child
    /// runs until [`Running::release`] (stdin EOF), [`Running::kill`] or drop (SIGKILL).
    pub fn spawn(kind: ClientKind, args: &[&str], env: &Env) -> Running {
        let mut cmd = command(&kind.binary(), args, env);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", kind.binary_name()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        // Every line the child prints, in order (scenarios that answer commands print more
        // than the first); the reader ends with the child's stdout.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(n) if n > 0 => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        });
        let line = match rx.recv_timeout(DEFAULT_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("{} {args:?} printed nothing in time", kind.binary_name());
            }
        };
        let first = serde_json::from_str(line.trim()).unwrap_or_else(|e| {
            let _ = child.kill();
            let status = child.wait();
            panic!(
                "{} {args:?} printed no JSON ({e}): {line:?} (exit: {status:?})",
                kind.binary_name()
            )
        });
        Running {
            child: Some(child),
            stdin,
            first,
            lines: rx,
        }
    }
}

/// A client still running (see [`Client::spawn`]).
pub struct Running {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// The scenario's first JSON line.
    pub first: Value,
    lines: mpsc::Receiver<String>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("child present").id()
    }

    /// Closes the child's stdin (the scenario frees and exits) and waits for it.
    pub fn release(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.wait()
    }

    /// SIGKILLs the child (no cleanup runs in it) and reaps it.
    pub fn kill(mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("child present");
        let _ = child.kill();
        self.wait()
    }

    /// The child's next JSON line (scenarios that answer commands), waiting at most
    /// `DEFAULT_TIMEOUT`.
    pub fn next_line(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(DEFAULT_TIMEOUT)
            .unwrap_or_else(|e| panic!("no further line from the client: {e}"));
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
    }

    /// Writes `text` to the child's stdin (scenarios that read commands).
    pub fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(text.as_bytes()).expect("write to child");
        stdin.flush().expect("flush to child");
    }

    fn wait(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("child present");
        let deadline = Instant::now() + DEFAULT_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("client {} did not exit in time", child.id());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A command for `program` with the scrubbed environment plus `env`.
pub fn command(program: &Path, args: &[&str], env: &Env) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if SCRUBBED_PREFIXES.iter().any(|p| key.starts_with(p)) {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// A host-PID broker running for the tests, killed on drop: the fake's (`fakegpu
/// pid-broker`, through which the simulated driver names a process of another PID namespace
/// by its host PID, as the kernel driver does) or the product's (`gpuslice host-pid-broker`,
/// which the shim asks).
#[derive(Debug)]
pub struct HostPidBroker {
    child: std::process::Child,
    pub socket: PathBuf,
}

impl HostPidBroker {
    /// The fake's broker for the state file `state` (its socket is `<state>.hostpid`).
    pub fn start(state: &Path) -> HostPidBroker {
        let mut cmd = Command::new(fakegpu_binary());
        cmd.args(["pid-broker", "--state"]).arg(state);
        Self::listening(cmd)
    }

    /// The shim's broker on `socket` (this test bed's PID namespace is the fake driver's).
    pub fn for_shim(socket: &Path) -> HostPidBroker {
        let mut cmd = Command::new(gpuslice_binary());
        cmd.args(["host-pid-broker", "--any-pid-namespace", "--socket"])
            .arg(socket);
        Self::listening(cmd)
    }

    /// Sends `signal` to the broker (SIGSTOP: it accepts nothing more and answers nobody).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Starts `cmd` and waits for its line "listening on PATH".
    fn listening(mut cmd: Command) -> HostPidBroker {
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {shown}: {e}"));
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let socket = line
            .trim()
            .strip_prefix("listening on ")
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{shown} printed {line:?}"));
        HostPidBroker { child, socket }
    }
}

impl Drop for HostPidBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` to completion (optionally feeding `input`), killing it after `timeout`.
pub fn run_with_timeout(mut cmd: Command, input: Option<&[u8]>, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("piped stdin");
        let _ = stdin.write_all(input);
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.unwrap_or_else(|e| panic!("waiting for {shown}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the pid of our own unreaped child (the waiter thread holds it).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{shown} did not finish within {timeout:?}");
        }
    }
}

/// The result names in a client's `tally` (result name -> count) other than `allowed`; a
/// missing tally is one problem of its own.
pub fn unexpected_results(tally: &Value, allowed: &[&str]) -> Vec<String> {
    tally
        .as_object()
        .map(|m| {
            m.keys()
                .filter(|k| !allowed.contains(&k.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_else(|| vec![format!("no tally: {tally}")])
}

/// Polls `condition` until it holds; panics naming `what` after `timeout`. The way tests
/// wait for another process's effect (never a bare sleep).
/// `gpuslice status --json --region PATH`, parsed (without a driver to ask: a dead slot's
/// bytes stay counted).
pub fn region_status(region: &Path) -> Value {
    region_status_with(region, &[])
}

/// The host PIDs the slots of `region` record (`gpuslice status`; 0 = none), sorted.
pub fn recorded_host_pids(region: &Path, env: &[(String, String)]) -> Vec<u64> {
    let status = region_status_with(region, env);
    let mut pids: Vec<u64> = status["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes in {status}"))
        .iter()
        .map(|p| p["host_pid"].as_u64().unwrap_or(0))
        .collect();
    pids.sort_unstable();
    pids
}

/// [`region_status`] run with `env` (the fake's, so that `status` can ask its NVML whether
/// a dead slot's process is still listed).
pub fn region_status_with(region: &Path, env: &[(String, String)]) -> Value {
    let mut cmd = Command::new(gpuslice_binary());
    cmd.args(["status", "--json", "--region"]).arg(region);
    cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let out = run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gpuslice status --json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The bytes the slice's LIVE processes hold by its ledger (exited processes keep their slot
/// until someone reaps it: the ledger of the live ones is what must match the card).
pub fn live_ledger_bytes(region: &Path) -> u64 {
    let v = region_status(region);
    v["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes in {v}"))
        .iter()
        .filter(|p| p["alive"] == true)
        .map(|p| p["used_total"].as_u64().unwrap())
        .sum()
}

pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A start barrier for client processes (`CLIENT_START_BARRIER`, see the clients' README):
/// every client given [`StartBarrier::env`] blocks right before making its context until
/// [`StartBarrier::release`], which lets them all go in the same instant.
pub struct StartBarrier {
    dir: TempDir,
    writer: Option<std::fs::File>,
}

impl StartBarrier {
    pub fn new() -> StartBarrier {
        let dir = TempDir::new("barrier");
        let fifo = dir.path().join("start");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())
            .expect("temp path without NUL");
        // SAFETY: c_path is a valid NUL-terminated path.
        let made = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
        assert_eq!(
            made,
            0,
            "mkfifo {}: {}",
            fifo.display(),
            std::io::Error::last_os_error()
        );
        StartBarrier { dir, writer: None }
    }

    fn fifo(&self) -> PathBuf {
        self.dir.path().join("start")
    }

    /// `CLIENT_START_BARRIER` for the clients that wait at this barrier.
    pub fn env(&self) -> (String, String) {
        (
            "CLIENT_START_BARRIER".into(),
            self.fifo().display().to_string(),
        )
    }

    /// Waits until `waiting` clients stand at the barrier, then releases them all at once
    /// (opening the FIFO for writing wakes every reader blocked in open). The write end stays
    /// open until the barrier is dropped, so a client that announced itself just before
    /// blocking goes through at once instead of waiting forever.
    pub fn release(&mut self, waiting: usize) {
        let dir = self.dir.path().to_path_buf();
        wait_until(
            &format!("{waiting} clients stand at the start barrier"),
            DEFAULT_TIMEOUT,
            || {
                std::fs::read_dir(&dir).map_or(0, |entries| {
                    entries
                        .filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().starts_with("start.ready."))
                        .count()
                }) >= waiting
            },
        );
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .open(self.fifo())
            .expect("open the start barrier for writing");
        self.writer = Some(writer);
    }
}

impl Default for StartBarrier {
    fn default() -> Self {
        StartBarrier::new()
    }
}

/// Builds C test programs once per source version: `sources` (file name, text) are written
/// to a fresh directory under `root` (a test binary's `CARGO_TARGET_TMPDIR`), `build` compiles
/// them there (see [`cc`]), and the directory is renamed to `<label>-<hash of the sources>`,
/// which later runs and other test binaries reuse. Returns that directory.
pub fn build_c_once(
    root: &Path,
    label: &str,
    sources: &[(&str, &str)],
    build: impl FnOnce(&Path),
) -> PathBuf {
    let mut hash: u64 = 0xcbf29ce484222325;
    for (name, text) in sources {
        for byte in name.bytes().chain(text.bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x100000001b3);
        }
    }
    let done = root.join(format!("{label}-{hash:016x}"));
    if done.is_dir() {
        return done;
    }
    let work = root.join(format!("{label}-{hash:016x}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("create C build dir");
    for (name, text) in sources {
        std::fs::write(work.join(name), text).expect("write C source");
    }
    build(&work);
    if std::fs::rename(&work, &done).is_err() {
        // Another test binary finished first; theirs is identical.
        let _ = std::fs::remove_dir_all(&work);
    }
    done
}

/// Runs the C compiler (`cc`) in `dir` with `args`; panics when it fails.
pub fn cc(dir: &Path, args: &[&str]) {
    let status = Command::new("cc")
        .current_dir(dir)
        .args(args)
        .status()
        .expect("a C compiler (cc) is needed for the C test programs");
    assert!(status.success(), "cc {args:?} failed");
}

/// The legacy-ABI C client (tests/shim_c/legacy.c: the pre-3.2 entry points by their bare
/// names through dlsym or cuGetProcAddress_v2), built once under `root` (the calling test
/// binary's `CARGO_TARGET_TMPDIR`).
pub fn legacy_client(root: &Path) -> PathBuf {
    let sources = [("legacy.c", include_str!("../tests/shim_c/legacy.c"))];
    let dir = build_c_once(root, "legacy-c", &sources, |work| {
        cc(
            work,
            &["-Wall", "-Werror", "-o", "legacy", "legacy.c", "-ldl"],
        );
    });
    dir.join("legacy")
}

/// Sizes in bytes, for readable assertions.
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
