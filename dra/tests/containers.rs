//! End to end through a real container runtime: a claim for a quarter of the (fake) V100 is
//! prepared through the kubelet's gRPC API, and podman runs containers with exactly the CDI
//! device IDs the driver returned, reading the spec from /var/run/cdi as a runtime on a node
//! does. Inside, CUDA (cuMemGetInfo) and NVML (`gpuslice smi`) show the 8 GiB slice, two
//! containers of the one claim share one cap, unprepare is refused while one still runs and
//! leaves nothing behind once none does. The claim's spec mounts the node agent's host-PID
//! broker (`--host-pid-dir`): a container's process learns from it the PID the card lists.
//!
//! Needs root, podman and runc (`.ci/container-setup.sh`) and `cargo build --workspace` (the
//! clients, the shim and the fake GPU). Without podman it prints `SKIPPED: ...` and passes,
//! except with `CI=true`, where it fails (as cuda-tests/e2e/tests/containers.rs does).

mod common;

use std::fs;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

use common::api::FakeApi;
use common::*;
use cuda_e2e::containers::{bin_dir, skip_or_fail, u64_at, Podman, Stage};
use gpuslice_dra::inventory;
use gpuslice_dra::plugin::{serve, Driver};
use gpuslice_dra::prepare::{Preparer, Settings};
use gpuslice_dra::proto::dra_v1;
use serde_json::Value;

/// The PIDs the fake card lists on device 0 (the driver's host PIDs), sorted.
fn card_pids(state: &std::path::Path) -> Vec<u64> {
    let truth = fakegpu::state::open_state_at(state).unwrap();
    let mut pids: Vec<u64> = truth
        .processes(0)
        .iter()
        .map(|p| u64::from(p.pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// A container run with the claim's CDI devices and the fake GPU's state.
struct Containers {
    podman: Podman,
    /// The root file system and the fake GPU.
    stage: Stage,
    devices: Vec<String>,
    names: Vec<String>,
}

impl Containers {
    fn args(&mut self, interactive: bool) -> Vec<String> {
        let name = format!(
            "gpuslice-dra-e2e-{}-{}",
            std::process::id(),
            self.names.len()
        );
        self.names.push(name.clone());
        let devices: Vec<&str> = self.devices.iter().map(String::as_str).collect();
        self.stage.run_args(&name, interactive, &devices)
    }

    fn run(&mut self, script: &str) -> Vec<Value> {
        let args = self.args(false);
        self.podman.run_script(&args, script)
    }

    /// `linked-client hold SIZE` in a container; returns its report and the running child
    /// (closing its stdin ends it).
    fn hold(&mut self, size: &str) -> (Value, Child) {
        let args = self.args(true);
        self.podman.hold(&args, size)
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for name in &self.names {
            self.podman.remove(name);
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
    let podman = match Podman::probe(scratch.path()) {
        Ok(podman) => podman,
        Err(reason) => {
            skip_or_fail(&reason);
            return;
        }
    };
    let bin = bin_dir();
    // The simulated V100, created from the host; the driver reads it through NVML. The card
    // reports host PIDs, as the kernel driver does: the fake learns a containerised process's
    // from the stage's broker (a socket next to the state file, mounted beside it).
    let stage = Stage::new(scratch.path());
    let state = stage.state();
    std::env::set_var("FAKEGPU_STATE", state);
    let gpus = inventory::from_nvml(Some(&bin.join("libfakegpu_nvml.so"))).unwrap();
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].memory_bytes, 32 * GIB);

    // The node agent's host-PID broker, as `gpuslice-node --host-pid-socket` serves it; the
    // driver mounts its directory into the containers (`--host-pid-dir`).
    let broker = cuda_e2e::HostPidBroker::for_shim(&scratch.path().join("node/host-pid.sock"));
    // The driver as on a node: specs in /var/run/cdi, the shim from the build.
    let settings = Settings {
        driver: "gpuslice.dev".into(),
        node: NODE.into(),
        state_dir: scratch.path().join("state"),
        cdi_dir: PathBuf::from("/var/run/cdi"),
        lib_host: bin.join("libgpuslice.so"),
        lib_container: "/usr/lib/gpuslice/libgpuslice.so".into(),
        host_pid_dir: Some(broker.socket.parent().unwrap().to_path_buf()),
        context_bound: None,
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
        podman,
        stage,
        devices,
        names: Vec::new(),
    };
    // Pod A holds 6 GiB of the claim's 8.
    let (held, mut holder) = containers.hold("6GiB");
    assert_eq!(held["result"], "CUDA_SUCCESS", "{held}");
    // Its process asked the broker the spec mounts: its slot records the PID on the card...
    let region = preparer
        .claim_dir(&uid)
        .join("region")
        .join(gpuslice_dra::prepare::REGION_FILE);
    assert_eq!(
        cuda_e2e::recorded_host_pids(&region, &[]),
        card_pids(containers.stage.state()),
        "host PIDs the slot records"
    );
    // ...and it was the broker that told it: the shim says so at debug level.
    let told = containers.run(
        "GPUSLICE_LOG=debug /usr/bin/linked-client meminfo 2>&1 >/dev/null | while read -r line; \
         do case \"$line\" in *'from the host-PID broker'*) echo '{\"told\": true}';; esac; done",
    );
    assert_eq!(told, vec![serde_json::json!({"told": true})], "{told:?}");
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
