//! Containers, end to end: gpuslice injected through CDI (`gpuslice cdi`) into real podman
//! containers (rootful, runc), all on one simulated GPU that the host and every container share.
//!
//! Each test builds its own root file system from what cargo built (the three clients,
//! `gpuslice`, `env`, `/bin/sh` and their `ldd` libraries; the fake driver installed next to
//! libc, where the NVIDIA CDI spec would put the real one), writes its own limit files and a CDI
//! spec with a unique kind and file name (`/etc/cdi/gpuslice-e2e-<pid>-<n>.json`, removed
//! afterwards), and bind-mounts the fake's state file at `/tmp/fakegpu-0.state` (the fake's
//! default path for root, so `env -i` still reaches the same GPU), with the socket of a host-side
//! `fakegpu pid-broker` next to it, through which the fake learns each containerised process's
//! host PID (what the driver reports). `fakegpu smi --json` on the host is the physical truth
//! the containers' views are compared against.
//!
//! Skipping: when podman is missing or cannot start a container, each test prints
//! `SKIPPED: podman cannot start containers here: <reason>` and returns, except with `CI=true`,
//! where it fails instead. Missing cargo artifacts always fail (build with
//! `cargo build --workspace`, as `cargo xtask test` does). `.ci/container-setup.sh` installs
//! podman and runc and writes the containers.conf used here (`$CONTAINERS_CONF`, else
//! `/etc/gpuslice-ci/containers.conf`, else an equivalent one written by the tests).
//!
//! `E2E_GPUSLICE_CDI_BIN` may name another binary that implements `gpuslice cdi` (for running
//! these tests before the subcommand is wired into the CLI); `gpuslice` itself is still the one
//! copied into the containers.

#[path = "common/agent.rs"]
mod agent;

use agent::{assert_reports_without_killing, is_running, scraped};
use cuda_e2e::containers::{
    add_pytorch, bin_dir, copy_with_libs, install_fake, json_lines, skip_or_fail, text,
    torch_fill_command, torch_prefix, u64_at, Podman, Stage,
};
use serde_json::Value;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
const SUCCESS: &str = "CUDA_SUCCESS";

// ---------------------------------------------------------------------------------------
// Artifacts and podman availability

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("cuda-tests/e2e is two levels below the workspace root")
        .to_path_buf()
}

/// `Some` when podman can start containers; otherwise prints the loud SKIPPED line (or, with
/// `CI=true`, fails the test).
fn podman() -> Option<&'static Podman> {
    static PROBE: OnceLock<Result<Podman, String>> = OnceLock::new();
    match PROBE.get_or_init(probe_podman) {
        Ok(podman) => Some(podman),
        Err(reason) => {
            skip_or_fail(reason);
            None
        }
    }
}

/// The shared probe, then /etc/cdi and a trivial container run.
fn probe_podman() -> Result<Podman, String> {
    let podman = Podman::probe(
        &std::env::temp_dir().join(format!("gpuslice-e2e-conf-{}", std::process::id())),
    )?;
    fs::create_dir_all("/etc/cdi").map_err(|e| format!("cannot create /etc/cdi: {e}"))?;
    remove_stale_specs();

    let dir = TempDir::new("probe");
    let rootfs = dir.path().join("rootfs");
    copy_with_libs(&rootfs, Path::new("/bin/sh"), "/bin/sh");
    let out = podman
        .cmd()
        .args(["run", "--rm", "--network", "none", "--rootfs"])
        .arg(&rootfs)
        .args(["/bin/sh", "-c", "echo container-ok"])
        .output()
        .map_err(|e| format!("cannot run podman: {e}"))?;
    if !out.status.success() || text(&out.stdout).trim() != "container-ok" {
        return Err(format!(
            "a trivial `podman run --rootfs` failed ({}): {} {}",
            out.status,
            text(&out.stdout).trim(),
            text(&out.stderr).trim()
        ));
    }
    Ok(podman)
}

/// Specs left in /etc/cdi by test processes that died before cleaning up.
fn remove_stale_specs() {
    let Ok(entries) = fs::read_dir("/etc/cdi") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("gpuslice-e2e-") else {
            continue;
        };
        let pid: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// File system helpers

struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "gpuslice-e2e-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// One test's world: rootfs, fake GPU, slices, CDI spec, containers

struct Bed {
    podman: &'static Podman,
    dir: TempDir,
    id: String,
    /// The root file system and the fake GPU every container of the test gets.
    stage: Stage,
    /// Unique CDI kind of this test's devices.
    kind: String,
    spec: Option<PathBuf>,
    containers: Vec<String>,
    next_container: usize,
    /// The shim's host-PID broker, once [`Bed::serve_host_pids`] started it: its directory
    /// goes into the CDI spec.
    shim_broker: Option<cuda_e2e::HostPidBroker>,
}

impl Bed {
    fn new(podman: &'static Podman) -> Bed {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{n}", std::process::id());
        let dir = TempDir::new("bed");
        let stage = Stage::new(dir.path());
        // The fake driver on the host too, for the node agent.
        install_fake(&dir.path().join("fake"));
        Bed {
            podman,
            stage,
            kind: format!("gpuslice-e2e.dev/t{}", id.replace('-', "x")),
            id,
            spec: None,
            containers: Vec::new(),
            next_container: 0,
            dir,
            shim_broker: None,
        }
    }

    /// Starts the shim's host-PID broker (`gpuslice host-pid-broker`, as the node agent
    /// serves it in a cluster); the specs written after this mount its directory.
    fn serve_host_pids(&mut self) {
        let socket = self.dir.path().join("node").join("host-pid.sock");
        self.shim_broker = Some(cuda_e2e::HostPidBroker::for_shim(&socket));
    }

    /// Writes a limit file for slice `name` whose device 0 entry holds `fields` (JSON
    /// members, e.g. `"memory": "1GiB"`; region in /var/run/gpuslice) and returns its host
    /// path.
    fn limit_file_with(&self, name: &str, fields: &str) -> PathBuf {
        let limits = self.dir.path().join("limits");
        fs::create_dir_all(&limits).unwrap();
        let path = limits.join(format!("{name}.json"));
        fs::write(
            &path,
            format!(
                "{{\"version\": 1, \"region\": \"/var/run/gpuslice/{name}.region\", \
                 \"policy\": \"cap\", \"devices\": [{{\"index\": 0, {fields}}}]}}\n"
            ),
        )
        .unwrap();
        path
    }

    /// Runs `gpuslice cdi` for `slices` (name, memory) and returns their CDI device names.
    fn write_spec(&mut self, slices: &[(&str, &str)]) -> Vec<String> {
        let entries: Vec<(&str, String)> = slices
            .iter()
            .map(|(name, memory)| (*name, format!("\"memory\": \"{memory}\"")))
            .collect();
        self.write_spec_with(&entries)
    }

    /// [`Bed::write_spec`] for slices given as (name, device 0 entry's JSON members).
    fn write_spec_with(&mut self, slices: &[(&str, String)]) -> Vec<String> {
        let cdi_bin = std::env::var_os("E2E_GPUSLICE_CDI_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| bin_dir().join("gpuslice"));
        let spec_name = format!("gpuslice-e2e-{}.json", self.id);
        let mut cmd = Command::new(&cdi_bin);
        cmd.arg("cdi")
            .args([
                "--kind",
                &self.kind,
                "--name",
                &spec_name,
                "--output-dir",
                "/etc/cdi",
            ])
            .arg("--lib")
            .arg(bin_dir().join("libgpuslice.so"))
            .arg("--state-dir")
            .arg(self.dir.path().join("state"));
        if let Some(broker) = &self.shim_broker {
            cmd.arg("--host-pid-dir")
                .arg(broker.socket.parent().unwrap());
        }
        for (name, fields) in slices {
            let file = self.limit_file_with(name, fields);
            cmd.arg("--slice").arg(format!("{name}={}", file.display()));
        }
        let out = cmd.output().unwrap();
        self.spec = Some(PathBuf::from("/etc/cdi").join(&spec_name));
        assert!(
            out.status.success(),
            "`{} cdi` failed ({}): {}{}\n(if `cdi` is an unknown subcommand, ctl/src/cdi.rs is \
             not wired into main.rs yet; E2E_GPUSLICE_CDI_BIN can point at a binary that has it)",
            cdi_bin.display(),
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        let printed: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
        let expected: Vec<String> = slices
            .iter()
            .map(|(name, _)| format!("{}={name}", self.kind))
            .collect();
        assert_eq!(
            printed, expected,
            "gpuslice cdi prints the device names it wrote"
        );
        expected
    }

    fn container_name(&mut self) -> String {
        self.next_container += 1;
        let name = format!("gpuslice-e2e-{}-{}", self.id, self.next_container);
        self.containers.push(name.clone());
        name
    }

    /// `podman run` arguments up to (not including) the command, for a container that gets
    /// `device` (a CDI device name; `None` = no slice at all).
    fn run_args(&mut self, device: Option<&str>, interactive: bool) -> (String, Vec<String>) {
        let name = self.container_name();
        let devices: Vec<&str> = device.into_iter().collect();
        let args = self.stage.run_args(&name, interactive, &devices);
        (name, args)
    }

    /// Runs `script` with /bin/sh in a new container; returns each stdout line parsed as JSON.
    fn run(&mut self, device: Option<&str>, script: &str) -> Vec<Value> {
        let (_, args) = self.run_args(device, false);
        self.podman.run_script(&args, script)
    }

    /// Runs `script` in the running container `name` (`podman exec`).
    fn exec(&self, name: &str, script: &str) -> Vec<Value> {
        let out = self
            .podman
            .cmd()
            .args(["exec", name, "/bin/sh", "-c", script])
            .output()
            .unwrap();
        json_lines(&out, &format!("exec in {name}: {script:?}"))
    }

    /// Starts `linked-client hold SIZE` in a new container and waits for its report line.
    fn hold(&mut self, device: &str, size: &str) -> Holder {
        let (name, args) = self.run_args(Some(device), true);
        let (report, mut child) = self.podman.hold(&args, size);
        let stdin = child.stdin.take();
        Holder {
            name,
            report,
            stdin,
            child: Some(child),
        }
    }

    /// The host's view: `fakegpu smi --json` on the shared state.
    fn host_smi(&self) -> Value {
        let out = Command::new(bin_dir().join("fakegpu"))
            .args(["smi", "--json", "--state"])
            .arg(self.stage.state())
            .output()
            .unwrap();
        assert!(out.status.success(), "fakegpu smi: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("fakegpu smi --json prints JSON")
    }

    fn physical_total(&self) -> u64 {
        u64_at(&self.host_smi(), &["devices", "0", "memory_total"])
    }

    /// The fake's truth on the host: (PID the driver reports, bytes) of every process on
    /// device 0, dead ones whose memory is not released yet included.
    fn card_processes(&self) -> Vec<(u32, u64)> {
        self.truth()
            .processes(0)
            .iter()
            .map(|p| (p.pid, p.used_memory))
            .collect()
    }

    /// The bytes the card holds for `pid` (0 when it lists no such process).
    fn card_bytes(&self, pid: u32) -> u64 {
        self.card_processes()
            .iter()
            .filter(|(p, _)| *p == pid)
            .map(|(_, used)| used)
            .sum()
    }

    fn truth(&self) -> fakegpu::SharedState {
        fakegpu::open_state_at(self.stage.state()).expect("open the fake's state on the host")
    }

    /// The node agent on the host, for this bed's slices (`gpuslice cdi`'s state directory
    /// and limit files), on the same simulated card.
    fn agent(&self, extra: &[&str]) -> (agent::Daemon, String) {
        let env = [
            (
                "LD_LIBRARY_PATH".to_string(),
                self.dir.path().join("fake").display().to_string(),
            ),
            (
                "FAKEGPU_STATE".to_string(),
                self.stage.state().display().to_string(),
            ),
        ];
        agent::start(
            &env,
            self.dir.path(),
            &self.dir.path().join("limits"),
            extra,
        )
    }

    /// The host path of slice `name`'s region, as `gpuslice cdi` laid it out.
    fn region(&self, name: &str) -> PathBuf {
        fn find(dir: &Path, file: &str) -> Option<PathBuf> {
            for entry in fs::read_dir(dir).ok()?.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    if let Some(found) = find(&path, file) {
                        return Some(found);
                    }
                } else if entry.file_name() == file {
                    return Some(path);
                }
            }
            None
        }
        let file = format!("{name}.region");
        find(&self.dir.path().join("state"), &file)
            .unwrap_or_else(|| panic!("no {file} under the bed's state directory"))
    }
}

/// The `NSpid:` line of a host process: its PID in every namespace, outermost first.
fn ns_pids(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Bed {
    fn drop(&mut self) {
        for name in &self.containers {
            self.podman.remove(name);
        }
        if let Some(spec) = &self.spec {
            let _ = fs::remove_file(spec);
        }
    }
}

/// A container holding memory until released (stdin closed).
struct Holder {
    name: String,
    /// The hold scenario's JSON line.
    report: Value,
    stdin: Option<ChildStdin>,
    child: Option<Child>,
}

impl Holder {
    /// Closes the holder's stdin and waits for its container to exit.
    fn release(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        // Closing stdin is the hold scenario's signal to free and exit.
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.finish();
    }
}

fn str_at<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key]
        .as_str()
        .unwrap_or_else(|| panic!("no string {key:?} in {value}"))
}

/// Asserts an `alloc-until-oom` result stayed under `cap_left` and was refused with OOM.
fn assert_refused_within(result: &Value, cap_left: u64, what: &str) -> u64 {
    assert_eq!(result["error"], OOM, "{what}: must end in {OOM}: {result}");
    let total = u64_at(result, &["total_bytes"]);
    assert!(
        total <= cap_left,
        "{what}: got {} MiB, more than the {} MiB left in the slice: {result}",
        total / MIB,
        cap_left / MIB
    );
    total
}

// ---------------------------------------------------------------------------------------
// The tests

/// A client in a container with a 1 GiB slice sees 1 GiB and is refused past it, on every
/// path the clients use; the same client without the slice sees the whole card; the host's
/// `fakegpu smi` shows the physical truth while the container holds memory.
#[test]
fn container_slice_caps_and_reports_one_gib() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let physical = bed.physical_total();
    assert!(physical >= 16 * GIB, "the fake V100 has {physical} bytes");
    let devices = bed.write_spec(&[("one", "1GiB")]);
    let one = devices[0].as_str();

    // Control: no slice, the container sees the physical card.
    let control = bed.run(None, "/usr/bin/linked-client meminfo");
    assert_eq!(
        u64_at(&control[0], &["total"]),
        physical,
        "without a slice the container must see the whole card: {}",
        control[0]
    );

    let script = "/usr/bin/linked-client meminfo; \
        for c in linked-client cudarc-client procaddr-client; do /usr/bin/$c alloc-until-oom 256MiB; done";
    let lines = bed.run(Some(one), script);
    assert_eq!(lines.len(), 4, "{lines:?}");
    let meminfo = &lines[0];
    assert_eq!(str_at(meminfo, "result"), SUCCESS, "{meminfo}");
    assert_eq!(
        u64_at(meminfo, &["total"]),
        GIB,
        "cuMemGetInfo total: {meminfo}"
    );
    assert_eq!(
        u64_at(meminfo, &["device_total"]),
        GIB,
        "cuDeviceTotalMem: {meminfo}"
    );
    assert!(u64_at(meminfo, &["free"]) <= GIB, "{meminfo}");
    for result in &lines[1..] {
        let client = str_at(result, "client");
        let total = assert_refused_within(result, GIB, client);
        assert!(
            total >= 512 * MIB,
            "{client}: a 1 GiB slice must still grant 512 MiB in 256 MiB chunks: {result}"
        );
    }

    // Host truth while the container holds 512 MiB.
    let holder = bed.hold(one, "512MiB");
    assert_eq!(
        str_at(&holder.report, "result"),
        SUCCESS,
        "{}",
        holder.report
    );
    let in_container_free = u64_at(&holder.report, &["mem_free"]);
    assert!(
        in_container_free <= GIB - 512 * MIB,
        "the container's free memory must be the slice's: {}",
        holder.report
    );
    let smi = bed.host_smi();
    let device = &smi["devices"][0];
    assert_eq!(u64_at(device, &["memory_total"]), physical, "host: {smi}");
    assert!(u64_at(device, &["memory_used"]) >= 512 * MIB, "host: {smi}");
    let holding = device["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["used_memory"].as_u64().unwrap_or(0) >= 512 * MIB);
    assert!(holding, "host smi must list the container's process: {smi}");
    assert!(
        physical - u64_at(device, &["memory_used"]) > 8 * GIB,
        "the card itself is nowhere near full; only the slice is: {smi}"
    );
    holder.release();
}

/// Two containers with different slices on one GPU, both holding memory at once, are each
/// held to their own cap.
#[test]
fn two_containers_two_slices_each_held_to_its_own_cap() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    // Every process's context (300 MiB on the fake, reserved at an upper bound until the
    // shim has measured it) counts against its slice, so the small slice is 2 GiB: room for
    // the holder, its context and a second process's context.
    let devices = bed.write_spec(&[("small", "2GiB"), ("large", "4GiB")]);
    let small = bed.hold(&devices[0], "512MiB");
    let large = bed.hold(&devices[1], "1GiB");
    assert_eq!(str_at(&small.report, "result"), SUCCESS, "{}", small.report);
    assert_eq!(str_at(&large.report, "result"), SUCCESS, "{}", large.report);

    // Both hold at the same time: the host sees both.
    let smi = bed.host_smi();
    assert!(
        u64_at(&smi, &["devices", "0", "memory_used"]) >= 1536 * MIB,
        "host must see both holds: {smi}"
    );

    let small_more = bed.exec(&small.name, "/usr/bin/linked-client alloc-until-oom 128MiB");
    let large_more = bed.exec(&large.name, "/usr/bin/linked-client alloc-until-oom 128MiB");
    let small_total = assert_refused_within(&small_more[0], 2 * GIB - 512 * MIB, "small slice");
    let large_total = assert_refused_within(&large_more[0], 3 * GIB, "large slice");
    assert!(
        large_total >= 2 * GIB,
        "the 4 GiB slice with 1 GiB held must still grant 2 GiB: {}",
        large_more[0]
    );
    assert!(large_total > small_total);
    small.release();
    large.release();
}

/// `/etc/ld.so.preload` puts the shim into processes whose environment was cleared:
/// `env -i` and `env -u LD_PRELOAD -u GPUSLICE_CONFIG` are still held.
#[test]
fn cleared_environment_is_still_held_by_ld_so_preload() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let devices = bed.write_spec(&[("one", "1GiB")]);
    let script = "/bin/cat /etc/ld.so.preload >&2; \
        env -i /usr/bin/linked-client meminfo; \
        env -i /usr/bin/linked-client alloc-until-oom 256MiB; \
        env -u LD_PRELOAD -u GPUSLICE_CONFIG /usr/bin/cudarc-client alloc-until-oom 256MiB; \
        env -i /usr/bin/procaddr-client alloc-until-oom 256MiB";
    let lines = bed.run(Some(&devices[0]), script);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(
        u64_at(&lines[0], &["total"]),
        GIB,
        "env -i meminfo: {}",
        lines[0]
    );
    for result in &lines[1..] {
        assert_refused_within(result, GIB, str_at(result, "client"));
    }
}

/// `gpuslice smi` inside the container shows the slice, not the card.
#[test]
fn gpuslice_smi_in_the_container_shows_the_slice() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let physical = bed.physical_total();
    let devices = bed.write_spec(&[("two", "2GiB")]);
    let lines = bed.run(Some(&devices[0]), "/usr/bin/gpuslice smi --json");
    let smi = &lines[0];
    assert_eq!(
        u64_at(smi, &["devices", "0", "memory", "total"]),
        2 * GIB,
        "{smi}"
    );
    assert_ne!(2 * GIB, physical);
    // The table form runs too (what a user types).
    let (_, args) = bed.run_args(Some(&devices[0]), false);
    let out = bed
        .podman
        .cmd()
        .args(&args)
        .args(["/usr/bin/gpuslice", "smi"])
        .output()
        .unwrap();
    assert!(out.status.success(), "gpuslice smi: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("2048MiB"),
        "the table shows the 2 GiB slice: {}",
        text(&out.stdout)
    );
}

/// Two containers given the same slice (same region directory) share one cap, each in its
/// own PID namespace; when one exits, its memory returns to the slice.
#[test]
fn two_containers_sharing_one_slice_share_one_cap() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    // 2 GiB: the holder's 1 GiB and both processes' contexts fit; what is left is less
    // than 1 GiB, and the second container must see that.
    let devices = bed.write_spec(&[("shared", "2GiB")]);
    let holder = bed.hold(&devices[0], "1GiB");
    assert_eq!(
        str_at(&holder.report, "result"),
        SUCCESS,
        "{}",
        holder.report
    );

    let second = bed.run(
        Some(&devices[0]),
        "/usr/bin/linked-client meminfo; /usr/bin/linked-client alloc-until-oom 64MiB",
    );
    assert_eq!(u64_at(&second[0], &["total"]), 2 * GIB, "{}", second[0]);
    assert!(
        u64_at(&second[0], &["free"]) < GIB,
        "the other container's 1 GiB is gone from the shared slice: {}",
        second[0]
    );
    assert_refused_within(&second[1], GIB, "second container of the slice");

    holder.release();
    let after = bed.run(
        Some(&devices[0]),
        "/usr/bin/linked-client alloc-until-oom 64MiB",
    );
    let total = assert_refused_within(&after[0], 2 * GIB, "after the holder left");
    assert!(
        total >= GIB,
        "the departed container's memory must return to the slice: {}",
        after[0]
    );
}

/// The `prebuilt` image (docker/Dockerfile, no registry needed) installs the very binaries
/// cargo built into a host directory (the shim with its debug info split off).
#[test]
fn prebuilt_installer_image_copies_the_binaries_to_the_host() {
    let Some(podman) = podman() else { return };
    let bin = bin_dir();
    let dir = TempDir::new("image");
    let context = dir.path().join("context");
    let out = Command::new("bash")
        .arg(workspace_root().join("docker/assemble-prebuilt.sh"))
        .arg(&context)
        .arg(bin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "assemble-prebuilt.sh: {}",
        text(&out.stderr)
    );

    let tag = format!("localhost/gpuslice-e2e:{}", std::process::id());
    let build = podman
        .cmd()
        .args([
            "build",
            "-q",
            "--network",
            "none",
            "--target",
            "prebuilt",
            "-t",
            &tag,
            "-f",
        ])
        .arg(workspace_root().join("docker/Dockerfile"))
        .arg(&context)
        .output()
        .unwrap();
    let host = dir.path().join("host");
    fs::create_dir_all(&host).unwrap();
    let run = build.status.success().then(|| {
        podman
            .cmd()
            .args(["run", "--rm", "--network", "none", "-v"])
            .arg(format!("{}:/host", host.display()))
            .arg(&tag)
            .output()
            .unwrap()
    });
    let _ = podman.cmd().args(["rmi", "-f", &tag]).output();
    assert!(
        build.status.success(),
        "podman build --target prebuilt: {}",
        text(&build.stderr)
    );
    let run = run.unwrap();
    assert!(run.status.success(), "installer: {}", text(&run.stderr));
    // The shim ships as docker/split-debug.sh makes it from cargo's: the front as built, the
    // core's debug info split off into libgpuslice_core.so.debug (objcopy is deterministic,
    // so the same bytes).
    let split = dir.path().join("split");
    let out = Command::new("sh")
        .arg(workspace_root().join("docker/split-debug.sh"))
        .arg(bin.join("libgpuslice.so"))
        .arg(&split)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "split-debug.sh: {}",
        text(&out.stderr)
    );
    for (file, expected) in [
        ("libgpuslice.so", split.join("libgpuslice.so")),
        ("libgpuslice_core.so", split.join("libgpuslice_core.so")),
        (
            "libgpuslice_core.so.debug",
            split.join("libgpuslice_core.so.debug"),
        ),
        ("gpuslice", bin.join("gpuslice")),
    ] {
        let installed = fs::read(host.join(file))
            .unwrap_or_else(|e| panic!("{file} did not arrive in the host directory: {e}"));
        assert!(
            installed == fs::read(&expected).unwrap(),
            "{file} in the host directory differs from {}",
            expected.display()
        );
    }
    // Atomic install leaves no temporary files behind.
    let mut names: Vec<_> = fs::read_dir(&host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "gpuslice",
            "libgpuslice.so",
            "libgpuslice_core.so",
            "libgpuslice_core.so.debug"
        ]
    );
}

/// The anchored limit file wins: inside a CDI container, a tenant that writes a
/// limit file of its own and points `GPUSLICE_CONFIG` at it (and sets the HAMi limit and the
/// context bound too) is still held to the operator's 1 GiB, on every client path, and is
/// told that its variables are ignored.
#[test]
fn a_tenant_set_gpuslice_config_is_ignored_in_a_cdi_container() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let devices = bed.write_spec(&[("one", "1GiB")]);
    let tenant_env = "GPUSLICE_CONFIG=/tmp/mine.json CUDA_DEVICE_MEMORY_LIMIT=16g \
        GPUSLICE_CONTEXT_OVERHEAD=1";
    let script = format!(
        "echo '{{\"version\": 1, \"region\": \"/tmp/mine.region\", \"devices\": \
           [{{\"index\": 0, \"memory\": \"16GiB\"}}]}}' > /tmp/mine.json; \
         for c in linked-client cudarc-client procaddr-client; do \
           err=$(env {tenant_env} /usr/bin/$c alloc-until-oom 256MiB 2>&1 >/tmp/out); \
           /bin/cat /tmp/out; \
           case \"$err\" in \
             *'warning: GPUSLICE_CONFIG='*'is ignored'*'warning: CUDA_DEVICE_MEMORY_LIMIT='*'is ignored'*'warning: GPUSLICE_CONTEXT_OVERHEAD='*'is ignored'*) \
               echo '{{\"warned\": true}}';; \
             *) echo \"{{\\\"warned\\\": false}}\" >&2; echo \"$err\" >&2; echo '{{\"warned\": false}}';; \
           esac; \
         done"
    );
    let lines = bed.run(Some(&devices[0]), &script);
    assert_eq!(lines.len(), 6, "{lines:?}");
    for pair in lines.chunks(2) {
        let client = str_at(&pair[0], "client");
        assert_refused_within(&pair[0], GIB, client);
        assert_eq!(
            pair[1]["warned"], true,
            "{client}: the ignored variables are named at the default log level"
        );
    }
}

/// With the host-PID broker's directory in the CDI spec (`gpuslice cdi --host-pid-dir`), a
/// containerised process asks the broker at registration (through the read-only mount) and
/// knows the host PID the driver lists it under before its first context: the shim says so
/// at debug level, and the region records exactly the PID on the card.
#[test]
fn a_container_learns_its_host_pid_from_the_broker_its_spec_mounts() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    bed.serve_host_pids();
    let devices = bed.write_spec(&[("one", "2GiB")]);
    let (_, mut args) = bed.run_args(Some(&devices[0]), true);
    // Before the image (`--rootfs PATH`, the last two arguments).
    let at = args.len() - 2;
    args.splice(at..at, ["-e".to_string(), "GPUSLICE_LOG=debug".to_string()]);
    let (report, mut child) = podman.hold(&args, "256MiB");
    assert_eq!(str_at(&report, "result"), SUCCESS, "{report}");
    let on_card = bed.card_processes();
    assert_eq!(on_card.len(), 1, "{on_card:?}");
    assert_eq!(
        cuda_e2e::recorded_host_pids(&bed.region("one"), &[]),
        [u64::from(on_card[0].0)]
    );
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "host PID {} from the host-PID broker",
            on_card[0].0
        )),
        "the shim's debug lines: {stderr}"
    );
}

/// Long enough for a loaded 2-core machine to start containers and for the agent's passes.
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The fake reports containerised processes by their HOST PIDs, as the kernel driver does
/// (learnt through the bed's `fakegpu pid-broker`): two containers of one slice, each
/// process PID 1 in its own namespace, are two distinct host PIDs on the card; the shim in
/// each container finds its host PID in NVML's list (the region records it), the node agent
/// maps both to their slice, and when one is SIGKILLed the shim gives its bytes back to the
/// slice only once the driver stops listing its host PID (the fake's release delay holds
/// them), not when the kernel says it exited.
#[test]
fn containerised_processes_are_known_by_host_pid_to_the_shim_the_agent_and_the_reaper() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let devices = bed.write_spec(&[("one", "2GiB")]);
    let a = bed.hold(&devices[0], "512MiB");
    let b = bed.hold(&devices[0], "256MiB");
    assert_eq!(str_at(&a.report, "result"), SUCCESS, "{}", a.report);
    assert_eq!(str_at(&b.report, "result"), SUCCESS, "{}", b.report);

    // The card names them by host PID: each is a process of this host whose innermost PID
    // (its container's) is 1.
    let on_card = bed.card_processes();
    assert_eq!(on_card.len(), 2, "two processes on the card: {on_card:?}");
    let holder_of = |bytes: u64| {
        on_card
            .iter()
            .find(|(_, used)| (bytes..bytes + 200 * MIB).contains(used))
            .map(|(pid, _)| *pid)
            .unwrap_or_else(|| panic!("nobody holds about {bytes} bytes: {on_card:?}"))
    };
    let (pid_a, pid_b) = (
        holder_of(512 * MIB + 300 * MIB),
        holder_of(256 * MIB + 300 * MIB),
    );
    for pid in [pid_a, pid_b] {
        let ns = ns_pids(pid);
        assert!(
            ns.len() >= 2 && ns[0] == pid && ns.last() == Some(&1),
            "the card lists {pid}, which must be the host PID of a container's PID 1 \
             (NSpid {ns:?}); cards: {on_card:?}"
        );
    }

    // The shim in each container found its host PID in NVML's list.
    let region = bed.region("one");
    let status = cuda_e2e::region_status(&region);
    let mut recorded: Vec<u64> = status["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes in {status}"))
        .iter()
        .filter(|p| p["alive"] == true)
        .map(|p| p["host_pid"].as_u64().unwrap_or(0))
        .collect();
    recorded.sort_unstable();
    let mut want = vec![u64::from(pid_a), u64::from(pid_b)];
    want.sort_unstable();
    assert_eq!(recorded, want, "host PIDs the region records: {status}");

    // The agent maps both to the slice, and nothing to no slice.
    let (_agent, addr) = bed.agent(&[]);
    let sel = "{slice=\"one\",";
    let truth = bed.card_bytes(pid_a) + bed.card_bytes(pid_b);
    let mut last = String::new();
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cuda_e2e::wait_until(
            "the agent maps both containers' processes to the slice",
            AGENT_TIMEOUT,
            || {
                let got = (
                    scraped(&addr, &format!("gpuslice_slice_device_processes{sel}")),
                    scraped(&addr, &format!("gpuslice_slice_memory_driver_bytes{sel}")),
                    scraped(&addr, "gpuslice_card_unsliced_processes{"),
                    scraped(&addr, "gpuslice_unverified_processes"),
                );
                last = format!("{got:?}");
                got == (Some(2.0), Some(truth as f64), Some(0.0), Some(0.0))
            },
        )
    }));
    assert!(
        seen.is_ok(),
        "agent never matched (device processes, driver bytes, unsliced, unverified): last {last}, want (2, {truth}, 0, 0)"
    );

    // The driver keeps a killed process's memory until told otherwise (the longest release
    // delay; set back to 0 below), and meanwhile lists its host PID.
    bed.truth()
        .set_release_delay_ms(fakegpu::state::MAX_RELEASE_DELAY_MS);
    let held_a = bed.card_bytes(pid_a);
    let held_b = bed.card_bytes(pid_b);
    // SAFETY: kill has no memory preconditions; pid_a is the container's process, checked
    // above to be that container's PID 1.
    assert_eq!(unsafe { libc::kill(pid_a as i32, libc::SIGKILL) }, 0);
    cuda_e2e::wait_until("the killed process is gone", AGENT_TIMEOUT, || {
        !is_running(pid_a)
    });
    let during = bed.exec(&b.name, "/usr/bin/linked-client alloc-until-oom 64MiB");
    assert_eq!(
        bed.card_bytes(pid_a),
        held_a,
        "the fake must still hold the dead process's memory after the allocations"
    );
    let granted = assert_refused_within(
        &during[0],
        2 * GIB - held_a - held_b,
        "while the card holds the dead process's memory",
    );

    // The driver releases it: the slice gets it back.
    bed.truth().set_release_delay_ms(0);
    cuda_e2e::wait_until(
        "the card releases the dead process's memory",
        AGENT_TIMEOUT,
        || bed.card_bytes(pid_a) == 0,
    );
    let after = bed.exec(&b.name, "/usr/bin/linked-client alloc-until-oom 64MiB");
    let regained = assert_refused_within(&after[0], 2 * GIB - held_b, "after the release");
    assert!(
        regained >= granted + 512 * MIB,
        "the dead process's bytes must return to the slice once the driver lets them go: \
         {granted} bytes before, {regained} after"
    );
    drop(a);
    b.release();
}

/// A process of a slice's container that reaches the driver without the shim
/// (`procaddr-client --dlmopen`: `dlmopen(LM_ID_NEWLM)`, which `/etc/ld.so.preload` does not
/// reach) and takes the slice over its cap is counted against the slice by the node agent
/// (same container, same cgroup), reported, and with `--enforce` ended by SIGKILL while the
/// container's well-behaved process keeps running; judged by the fake's physical bytes and
/// the bypasser's exit status.
#[test]
fn the_backstop_ends_a_containerised_process_that_bypasses_the_shim() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let devices = bed.write_spec(&[("s", "1GiB")]);
    let member = bed.hold(&devices[0], "100MiB");
    assert_eq!(
        str_at(&member.report, "result"),
        SUCCESS,
        "{}",
        member.report
    );

    // The bypasser, exec'd into the member's container: 800 MiB + its context, which the
    // shim never sees (it would have refused: 1 GiB cap).
    let mut bypass = podman
        .cmd()
        .args(["exec", "-i", &member.name])
        .args(["/usr/bin/procaddr-client", "--dlmopen", "hold", "800MiB"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _bypass_stdin = bypass.stdin.take();
    let mut line = String::new();
    BufReader::new(bypass.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let Ok(report) = serde_json::from_str::<Value>(line.trim()) else {
        let out = bypass.wait_with_output().unwrap();
        panic!(
            "the bypasser printed {line:?}, no JSON; exit {}; stderr: {}",
            out.status,
            text(&out.stderr)
        );
    };
    assert_eq!(
        (str_at(&report, "result"), str_at(&report, "client")),
        (SUCCESS, "dlmopen"),
        "{report}"
    );
    let on_card = bed.card_processes();
    let pid_of = |min: u64, max: u64| {
        on_card
            .iter()
            .find(|(_, used)| (min..max).contains(used))
            .map(|(pid, _)| *pid)
            .unwrap_or_else(|| panic!("nobody holds {min}..{max} bytes: {on_card:?}"))
    };
    let member_pid = pid_of(100 * MIB, 800 * MIB);
    let bypass_pid = pid_of(800 * MIB, 2 * GIB);
    assert!(
        bed.card_bytes(member_pid) + bed.card_bytes(bypass_pid) > GIB + 64 * MIB,
        "the slice must be over its cap on the card: {on_card:?}"
    );

    // Report only: an event, the bypasser's bytes counted against the slice, no kill.
    let backstop = ["--grace", "1", "--tolerance", "64MiB"];
    {
        let (_agent, addr) = bed.agent(&backstop);
        let slice_bytes = bed.card_bytes(member_pid) + bed.card_bytes(bypass_pid);
        assert_reports_without_killing(&addr, AGENT_TIMEOUT, slice_bytes, member_pid, bypass_pid);
    }

    // Enforcing: the process whose bytes the ledger does not account for, the bypasser, is
    // SIGKILLed.
    let mut enforce = backstop.to_vec();
    enforce.push("--enforce");
    let (_agent, addr) = bed.agent(&enforce);
    let mut status = None;
    cuda_e2e::wait_until(
        "the enforcing backstop ends the bypasser",
        AGENT_TIMEOUT,
        || {
            status = bypass.try_wait().unwrap();
            status.is_some()
        },
    );
    // `podman exec` reports a process ended by signal N as 128 + N.
    assert_eq!(
        status.unwrap().code(),
        Some(128 + libc::SIGKILL),
        "the bypasser must end by SIGKILL"
    );
    cuda_e2e::wait_until("the card no longer holds its memory", AGENT_TIMEOUT, || {
        bed.card_bytes(bypass_pid) == 0
    });
    assert_eq!(
        scraped(&addr, "gpuslice_backstop_kills_total{slice=\"s\","),
        Some(1.0)
    );
    assert!(
        is_running(member_pid),
        "the well-behaved process was killed"
    );
    assert!(bed.card_bytes(member_pid) > 100 * MIB);
    member.release();
}

/// A container given a slice whose only process reaches the driver without the shim
/// (`dlmopen`): nothing of it is in the slice's region and no registered process shares its
/// cgroup, yet the node agent counts it against the slice by the container's mount of the
/// slice's region directory, which no process in the container can undo, and ends it once the
/// slice has been over its cap for the grace time. Judged by the fake's physical bytes and
/// the process's exit status.
#[test]
fn a_container_whose_only_process_bypasses_the_shim_is_still_the_slices() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let devices = bed.write_spec(&[("s", "1GiB")]);
    let (_name, args) = bed.run_args(Some(&devices[0]), true);
    let (report, mut bypass) = podman.hold_running(
        &args,
        &["/usr/bin/procaddr-client", "--dlmopen", "hold", "1500MiB"],
    );
    assert_eq!(
        (str_at(&report, "result"), str_at(&report, "client")),
        (SUCCESS, "dlmopen"),
        "{report}"
    );
    let on_card = bed.card_processes();
    let (pid, held) = *on_card
        .iter()
        .find(|(_, used)| *used >= 1500 * MIB)
        .unwrap_or_else(|| panic!("nobody holds 1500 MiB: {on_card:?}"));
    eprintln!(
        "the bypasser holds {} MiB above the cap",
        (held - GIB) / MIB
    );
    let (agent, addr) = bed.agent(&["--grace", "1", "--enforce"]);
    let mut status = None;
    cuda_e2e::wait_until("the backstop ends the bypasser", AGENT_TIMEOUT, || {
        status = bypass.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(128 + libc::SIGKILL));
    cuda_e2e::wait_until("the card no longer holds its memory", AGENT_TIMEOUT, || {
        bed.card_bytes(pid) == 0
    });
    assert_eq!(
        scraped(&addr, "gpuslice_backstop_kills_total{slice=\"s\","),
        Some(1.0)
    );
    let log = fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(log.contains(&format!("process {pid} holds")), "{log}");
}

/// A compute-only slice (a share, no memory limit) in a container with its own PID
/// namespace, next to an unthrottled neighbour on the host: the container's process is
/// named by its host PID in NVML (the fake learns it from the broker, as the driver from the
/// kernel), which neither its `getpid()` nor `NSpid` shows and no memory ledger measures.
/// The throttle learns it from NVML's list around its context creation and steers on its
/// own samples. It used to steer on the whole device (the neighbour counted as the slice's)
/// and sink far below its share. Figures from the fake's timeline; margin: twice the
/// issue's 5 points (a loaded 2-core machine running podman).
#[test]
fn a_compute_only_container_slice_steers_on_its_own_processes_next_to_a_neighbour() {
    let Some(podman) = podman() else { return };
    let mut bed = Bed::new(podman);
    let devices = bed.write_spec_with(&[("share", "\"compute\": 30".to_string())]);
    let launch = |seconds: &str| {
        [
            "launch",
            "--kernels",
            "20",
            "--ns-per-wave",
            "1000000",
            "--path",
            "kernel",
            "--duration-s",
            seconds,
        ]
        .map(String::from)
    };
    let registered =
        |bed: &Bed| -> Vec<u32> { bed.truth().processes(0).iter().map(|p| p.pid).collect() };
    // The neighbour: on the host, no slice, 1 ms kernels back to back.
    let mut neighbour = Command::new(bin_dir().join("linked-client"))
        .args(launch("40"))
        .env("FAKEGPU_STATE", bed.stage.state())
        .env("LD_LIBRARY_PATH", bed.dir.path().join("fake"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let neighbour_pid = neighbour.id();
    cuda_e2e::wait_until(
        "the neighbour registered",
        cuda_e2e::DEFAULT_TIMEOUT,
        || registered(&bed).contains(&neighbour_pid),
    );
    let (_, args) = bed.run_args(Some(&devices[0]), false);
    let container = podman
        .cmd()
        .args(&args)
        .arg("/usr/bin/linked-client")
        .args(launch("8"))
        .env_remove("GPUSLICE_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut slice_pid = 0;
    cuda_e2e::wait_until(
        "the container's process registered",
        Duration::from_secs(60),
        || {
            slice_pid = registered(&bed)
                .into_iter()
                .find(|&p| p != neighbour_pid)
                .unwrap_or(0);
            slice_pid != 0
        },
    );
    let (settle, window) = (3_000_000_000u64, 2_000_000_000u64);
    let from = fakegpu::state::now_ns() + settle;
    let wait = from + window - fakegpu::state::now_ns();
    std::thread::sleep(Duration::from_nanos(wait));
    let truth = bed.truth();
    let percent =
        |pid| truth.busy_ns(0, Some(pid), from, from + window) as f64 * 100.0 / window as f64;
    let (slice, other) = (percent(slice_pid), percent(neighbour_pid));
    let out = container.wait_with_output().unwrap();
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    let lines = json_lines(&out, "the container's client");
    eprintln!(
        "compute-only container at 30 %: slice {slice:.1}%, neighbour {other:.1}%: {}",
        text(&out.stderr)
    );
    assert_eq!(lines[0]["ok"], lines[0]["launches"], "{lines:?}");
    assert!(
        !text(&out.stderr).contains("cannot tell this process's host PID"),
        "the process found its host PID: {}",
        text(&out.stderr)
    );
    assert!(
        (slice - 30.0).abs() <= 10.0,
        "the slice holds its 30 % next to the neighbour: {slice:.1}% (neighbour {other:.1}%)"
    );
}

/// PyTorch from PyPI in a podman container that gets a 2 GiB slice through CDI: it sees the
/// slice, is refused at it with torch.cuda.OutOfMemoryError, and the card (host truth)
/// never holds more for it. The interpreter and its packages are mounted read-only from
/// the host at the same path; the system libraries they need are copied into the image.
#[test]
fn pytorch_in_a_cdi_container_is_held_to_its_slice() {
    let Some(podman) = podman() else { return };
    let Some(prefix) = torch_prefix() else { return };
    let mut bed = Bed::new(podman);
    let rootfs = bed.dir.path().join("rootfs");
    let mount = add_pytorch(&rootfs, &prefix);

    let devices = bed.write_spec(&[("torch", "2GiB")]);
    let (_, mut args) = bed.run_args(Some(&devices[0]), false);
    let at = args.iter().position(|a| a == "--rootfs").unwrap();
    args.splice(at..at, mount);
    let lines = bed.podman.run_script(&args, &torch_fill_command(&prefix));
    assert_eq!(lines.len(), 3, "{lines:?}");
    let physical = bed.physical_total();
    assert_eq!(u64_at(&lines[0], &["total"]), 2 * GIB, "{}", lines[0]);
    assert!(u64_at(&lines[0], &["free"]) < 2 * GIB, "{}", lines[0]);
    assert_eq!(
        lines[1]["oom"], true,
        "torch.cuda.OutOfMemoryError: {}",
        lines[1]
    );
    let filled = u64_at(&lines[1], &["filled"]);
    assert!(filled >= GIB, "the slice was usable: {}", lines[1]);
    assert!(
        u64_at(&lines[2], &["after"]) >= 2 * GIB - 400 * MIB,
        "empty_cache gave the memory back to the slice: {}",
        lines[2]
    );
    let peak = bed.truth().peak_memory(0);
    assert!(peak <= 2 * GIB, "the card held {peak} for the container");
    assert!(physical > 16 * GIB, "and had far more: {physical}");
}
