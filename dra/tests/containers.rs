//! End to end through a real container runtime: a claim for a quarter of the (fake) V100 is
//! prepared through the kubelet's gRPC API, and podman runs containers with exactly the CDI
//! device IDs the driver returned, reading the spec from /var/run/cdi as a runtime on a node
//! does. Inside, CUDA (cuMemGetInfo) and NVML (`gpuslice smi`) show the 8 GiB slice, two
//! containers of the one claim share one cap, unprepare is refused while one still runs and
//! leaves nothing behind once none does.
//!
//! Needs root, podman and runc (`.ci/container-setup.sh`) and `cargo build --workspace` (the
//! clients, the shim and the fake GPU). Without podman it prints `SKIPPED: ...` and passes,
//! except with `CI=true`, where it fails (as cuda-tests/e2e/tests/containers.rs does).

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::api::FakeApi;
use common::*;
use gpuslice_dra::inventory;
use gpuslice_dra::plugin::{serve, Driver};
use gpuslice_dra::prepare::{Preparer, Settings};
use gpuslice_dra::proto::dra_v1;
use serde_json::Value;

const STATE_IN_CONTAINER: &str = "/tmp/fakegpu-0.state";
const CONTAINERS_CONF: &str = "[containers]\ndefault_ulimits = []\n\n[engine]\n\
runtime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    for name in [
        "linked-client",
        "gpuslice",
        "libgpuslice.so",
        "fakegpu",
        "libfakegpu_nvml.so",
    ] {
        assert!(
            dir.join(name).is_file(),
            "{name} is missing in {}: run `cargo build --workspace` first",
            dir.display()
        );
    }
    dir
}

/// `podman` with the test containers.conf, or why it cannot run containers here.
fn podman_conf(scratch: &Path) -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root (rootful podman, /var/run/cdi)".into());
    }
    let conf = match std::env::var_os("CONTAINERS_CONF") {
        Some(conf) => PathBuf::from(conf),
        None if Path::new("/etc/gpuslice-ci/containers.conf").is_file() => {
            PathBuf::from("/etc/gpuslice-ci/containers.conf")
        }
        None => {
            let conf = scratch.join("containers.conf");
            fs::write(&conf, CONTAINERS_CONF).map_err(|e| e.to_string())?;
            conf
        }
    };
    let version = Command::new("podman").arg("--version").output();
    match version {
        Ok(out) if out.status.success() => Ok(conf),
        Ok(out) => Err(format!("podman --version failed: {}", text(&out.stderr))),
        Err(e) => Err(format!("podman: {e} (run .ci/container-setup.sh)")),
    }
}

fn podman(conf: &Path) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "120", "podman"])
        .env("CONTAINERS_CONF", conf);
    cmd
}

fn ldd(file: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(file).output().expect("run ldd");
    text(&out.stdout)
        .lines()
        .filter_map(|line| {
            line.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

fn copy_with_libs(rootfs: &Path, file: &Path, target: &str) {
    let dest = rootfs.join(target.trim_start_matches('/'));
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    fs::copy(file, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
    for lib in ldd(file) {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap());
        if !dest.exists() {
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            fs::copy(&lib, &dest).unwrap();
        }
    }
}

/// A root file system with the clients, gpuslice, sh and the fake driver next to libc (where
/// NVIDIA's CDI spec would mount the real one).
fn rootfs(scratch: &Path, bin: &Path) -> PathBuf {
    let rootfs = scratch.join("rootfs");
    copy_with_libs(
        &rootfs,
        &bin.join("linked-client"),
        "/usr/bin/linked-client",
    );
    copy_with_libs(&rootfs, &bin.join("gpuslice"), "/usr/bin/gpuslice");
    copy_with_libs(&rootfs, Path::new("/bin/sh"), "/bin/sh");
    for lib in ldd(&bin.join("libgpuslice.so"))
        .into_iter()
        .chain(ldd(&bin.join("libfakegpu_nvml.so")))
    {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap());
        if !dest.exists() {
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            fs::copy(&lib, &dest).unwrap();
        }
    }
    for sub in ["tmp", "etc", "proc", "sys", "dev", "var/run"] {
        fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    let libc_dir = ldd(&bin.join("linked-client"))
        .into_iter()
        .find(|lib| lib.file_name().is_some_and(|n| n == "libc.so.6"))
        .and_then(|lib| lib.parent().map(Path::to_path_buf))
        .expect("ldd shows libc.so.6");
    let out = Command::new(bin.join("fakegpu"))
        .arg("install")
        .arg(rootfs.join(libc_dir.strip_prefix("/").unwrap()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fakegpu install: {}",
        text(&out.stderr)
    );
    rootfs
}

fn json_lines(out: &Output, what: &str) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {l:?}: {e}")))
        .collect()
}

fn u64_at(value: &Value, path: &[&str]) -> u64 {
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

/// A container run with the claim's CDI devices and the fake GPU's state.
struct Containers {
    conf: PathBuf,
    rootfs: PathBuf,
    state: PathBuf,
    /// The host-PID broker's socket (see `fakegpu::host_pid`).
    broker: PathBuf,
    devices: Vec<String>,
    names: Vec<String>,
}

impl Containers {
    fn args(&mut self) -> Vec<String> {
        let name = format!(
            "gpuslice-dra-e2e-{}-{}",
            std::process::id(),
            self.names.len()
        );
        self.names.push(name.clone());
        let mut args: Vec<String> = ["run", "--rm", "--network", "none", "--name", &name]
            .map(String::from)
            .to_vec();
        args.extend([
            "-v".into(),
            format!("{}:{STATE_IN_CONTAINER}", self.state.display()),
            "-v".into(),
            format!("{}:{STATE_IN_CONTAINER}.hostpid", self.broker.display()),
        ]);
        args.extend(["-e".into(), format!("FAKEGPU_STATE={STATE_IN_CONTAINER}")]);
        for device in &self.devices {
            args.extend(["--device".into(), device.clone()]);
        }
        args.extend(["--rootfs".into(), self.rootfs.display().to_string()]);
        args
    }

    fn run(&mut self, script: &str) -> Vec<Value> {
        let args = self.args();
        let out = podman(&self.conf)
            .args(&args)
            .args(["/bin/sh", "-c", script])
            .output()
            .unwrap();
        json_lines(&out, &format!("container {script:?}"))
    }

    /// `linked-client hold SIZE` in a container; returns its report and the running child
    /// (closing its stdin ends it).
    fn hold(&mut self, size: &str) -> (Value, Child) {
        let mut args = self.args();
        args.insert(1, "-i".into());
        let mut child = podman(&self.conf)
            .args(&args)
            .args(["/usr/bin/linked-client", "hold", size])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let report = serde_json::from_str(line.trim())
            .unwrap_or_else(|e| panic!("hold {size}: {line:?}: {e}"));
        (report, child)
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = podman(&self.conf)
                .args(["rm", "-f", "-t", "0", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Removes the claim's spec from /var/run/cdi however the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_claim_is_an_enforced_slice_in_podman_containers() {
    let scratch = Scratch::new("containers");
    let conf = match podman_conf(scratch.path()) {
        Ok(conf) => conf,
        Err(reason) if matches!(std::env::var("CI").as_deref(), Ok("true" | "1")) => {
            panic!("podman cannot start containers here: {reason} (CI=true: failing)")
        }
        Err(reason) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: podman cannot start containers here: {reason}"
            );
            return;
        }
    };
    let bin = bin_dir();
    let rootfs = rootfs(scratch.path(), &bin);

    // The simulated V100, created from the host; the driver reads it through NVML.
    let state = scratch.path().join("fakegpu.state");
    fs::write(&state, b"").unwrap();
    let out = Command::new(bin.join("fakegpu"))
        .args(["smi", "--json", "--state"])
        .arg(&state)
        .env("FAKEGPU_DEVICES", "v100")
        .output()
        .unwrap();
    assert!(out.status.success(), "fakegpu smi: {}", text(&out.stderr));
    // The card reports host PIDs, as the kernel driver does: the fake learns a containerised
    // process's from this broker (a socket next to the state file, mounted beside it).
    let broker = fakegpu::host_pid::broker_socket(&state);
    let (ready, is_ready) = std::sync::mpsc::channel();
    {
        let broker = broker.clone();
        std::thread::spawn(move || {
            let served = fakegpu::host_pid::serve(&broker, || ready.send(()).unwrap());
            panic!("the host-PID broker stopped: {served:?}");
        });
    }
    is_ready.recv().expect("the host-PID broker listens");
    std::env::set_var("FAKEGPU_STATE", &state);
    let gpus = inventory::from_nvml(Some(&bin.join("libfakegpu_nvml.so"))).unwrap();
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].memory_bytes, 32 * GIB);

    // The driver as on a node: specs in /var/run/cdi, the shim from the build.
    let settings = Settings {
        driver: "gpuslice.dev".into(),
        node: NODE.into(),
        state_dir: scratch.path().join("state"),
        cdi_dir: PathBuf::from("/var/run/cdi"),
        lib_host: bin.join("libgpuslice.so"),
        lib_container: "/usr/lib/gpuslice/libgpuslice.so".into(),
        nvidia_cdi: None,
    };
    let preparer = Arc::new(Preparer::new(settings, gpus));
    let api = FakeApi::start();
    let uid = format!("e2e00000-0000-4000-8000-{:012}", std::process::id());
    api.put_claim(&claim(
        "team-a",
        "quarter",
        &uid,
        &[ours("gpu", "gpu-0-25-a")],
    ));
    let driver = Arc::new(Driver {
        preparer: preparer.clone(),
        client: api.client(),
    });
    let dra_socket = scratch.path().join("plugins/gpuslice.dev/dra.sock");
    let registration = scratch
        .path()
        .join("plugins_registry/gpuslice.dev-reg.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (d, r) = (dra_socket.clone(), registration.clone());
        tokio::spawn(async move {
            serve(driver, "gpuslice.dev", &d, &r, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::UnixStream::connect(&dra_socket).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut kubelet =
        dra_v1::dra_plugin_client::DraPluginClient::new(channel(dra_socket.clone()).await);
    let claim_ref = dra_v1::Claim {
        namespace: "team-a".into(),
        name: "quarter".into(),
        uid: uid.clone(),
    };
    let response = kubelet
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    let prepared = &response.claims[&uid];
    assert_eq!(prepared.error, "");
    let devices: Vec<String> = prepared
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect();
    assert_eq!(devices, vec![format!("gpuslice.dev/claim={uid}")]);
    let spec = preparer.spec_path(&uid);
    let _cleanup = RemoveOnDrop(spec.clone());
    assert!(spec.starts_with("/var/run/cdi") && spec.exists());

    let mut containers = Containers {
        conf,
        rootfs,
        state: state.clone(),
        broker,
        devices,
        names: Vec::new(),
    };
    // Pod A holds 6 GiB of the claim's 8.
    let (held, mut holder) = containers.hold("6GiB");
    assert_eq!(held["result"], "CUDA_SUCCESS", "{held}");
    // Pod B, same claim: sees the 8 GiB slice through CUDA and NVML, and only what A left.
    let lines = containers.run(
        "/usr/bin/linked-client meminfo; /usr/bin/linked-client alloc-until-oom 256MiB; \
         /usr/bin/gpuslice smi --json",
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(
        u64_at(&lines[0], &["total"]),
        8 * GIB,
        "cuMemGetInfo: {}",
        lines[0]
    );
    assert!(
        u64_at(&lines[0], &["free"]) < 2 * GIB,
        "A's 6 GiB counts: {}",
        lines[0]
    );
    assert_eq!(
        lines[1]["error"], "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        lines[1]
    );
    assert!(
        u64_at(&lines[1], &["total_bytes"]) < 2 * GIB,
        "B got more than the slice had left: {}",
        lines[1]
    );
    assert_eq!(
        u64_at(&lines[2], &["devices", "0", "memory", "total"]),
        8 * GIB,
        "NVML (gpuslice smi): {}",
        lines[2]
    );

    // The kubelet unprepares while A still runs: refused, nothing removed.
    let unprepare = dra_v1::NodeUnprepareResourcesRequest {
        claims: vec![claim_ref],
    };
    let response = kubelet
        .node_unprepare_resources(unprepare.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(
        response.claims[&uid].error.contains("still in use"),
        "{response:?}"
    );
    assert!(spec.exists());

    // A ends; now unprepare leaves nothing behind.
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let response = kubelet
        .node_unprepare_resources(unprepare)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims[&uid].error, "", "{response:?}");
    assert!(!spec.exists(), "the CDI spec is left behind");
    assert!(
        !preparer.claim_dir(&uid).exists(),
        "the claim's files are left behind"
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
