//! The `gpuslice-dra` binary itself, as the DaemonSet runs it: configured from flags and a
//! kubeconfig (here pointing at the fake API server), GPUs from the fake GPU's NVML. It
//! publishes the node's ResourceSlice, registers and serves on its sockets, prepares a claim,
//! and on SIGTERM exits cleanly, removing its sockets. Needs `cargo build -p fakegpu-nvml`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::api::FakeApi;
use common::*;
use gpuslice_dra::proto::{dra_v1, pluginregistration as reg};

fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("libfakegpu_nvml.so");
    assert!(
        lib.exists(),
        "{} is missing: run `cargo build -p fakegpu-nvml`",
        lib.display()
    );
    lib
}

async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_publishes_registers_prepares_and_stops_on_sigterm() {
    let scratch = Scratch::new("binary");
    let api = FakeApi::start();
    let kubeconfig = scratch.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n\
             current-context: c\n",
            api.url
        ),
    )
    .unwrap();
    let lib = scratch.path().join("libgpuslice.so");
    std::fs::write(&lib, b"stand-in").unwrap();
    // The shim is two files; the driver refuses to start without the core beside the front.
    std::fs::write(scratch.path().join("libgpuslice_core.so"), b"stand-in").unwrap();
    let plugin_dir = scratch.path().join("plugins/gpuslice.dev");
    let registry_dir = scratch.path().join("plugins_registry");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice-dra"))
        .arg("--node-name")
        .arg(NODE)
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--lib")
        .arg(&lib)
        .arg("--state-dir")
        .arg(scratch.path().join("state"))
        .arg("--cdi-dir")
        .arg(scratch.path().join("cdi"))
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .arg("--registry-dir")
        .arg(&registry_dir)
        .args(["--nvidia-cdi", "always"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("FAKEGPU_STATE", scratch.path().join("fakegpu.state"))
        .env("FAKEGPU_DEVICES", "v100")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();

    // Published: one slice, seven products of the fake V100, its UUID from NVML.
    wait_for("the ResourceSlice", || {
        api.slices().contains_key("gpu-node-1-gpuslice.dev")
    })
    .await;
    let slice = api.slices()["gpu-node-1-gpuslice.dev"].clone();
    let uuid = fakegpu::spec::preset("v100", 0).unwrap().uuid;
    assert_eq!(slice["spec"]["devices"].as_array().unwrap().len(), 7);
    assert_eq!(
        slice["spec"]["devices"][0]["attributes"]["uuid"]["string"],
        uuid.as_str()
    );

    let registration_socket = registry_dir.join("gpuslice.dev-reg.sock");
    let dra_socket = plugin_dir.join("dra.sock");
    wait_for("the sockets", || {
        registration_socket.exists() && dra_socket.exists()
    })
    .await;
    let info = reg::registration_client::RegistrationClient::new(
        channel(registration_socket.clone()).await,
    )
    .get_info(reg::InfoRequest {})
    .await
    .unwrap()
    .into_inner();
    assert_eq!(Path::new(&info.endpoint), dra_socket);

    let id = "b1a00000-0000-4000-8000-000000000001";
    api.put_claim(&claim("team-a", "half", id, &[ours("gpu", "gpu-0-50-b")]));
    let response =
        dra_v1::dra_plugin_client::DraPluginClient::new(channel(dra_socket.clone()).await)
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![dra_v1::Claim {
                    namespace: "team-a".into(),
                    name: "half".into(),
                    uid: id.into(),
                }],
            })
            .await
            .unwrap()
            .into_inner();
    assert_eq!(
        response.claims[id].devices[0].cdi_device_ids,
        vec![
            format!("gpuslice.dev/claim={id}"),
            format!("nvidia.com/gpu={uuid}")
        ]
    );

    // SAFETY: kill(2) on our own child's PID; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(!dra_socket.exists() && !registration_socket.exists());
    // The prepared claim outlives the plugin (its checkpoint).
    assert!(scratch
        .path()
        .join("state/claims")
        .join(id)
        .join("checkpoint.json")
        .exists());
}

/// On a 1.34 cluster with the DRA alpha gates off, the binary asked for products and allowed
/// the fallback publishes the gate-free units, says why in one line and one Node Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_falls_back_to_units_where_the_gate_is_off() {
    let scratch = Scratch::new("binary-gates");
    let api = FakeApi::start_as(common::api::Cluster::V1_34);
    let kubeconfig = scratch.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n\
             current-context: c\n",
            api.url
        ),
    )
    .unwrap();
    let lib = scratch.path().join("libgpuslice.so");
    std::fs::write(&lib, b"stand-in").unwrap();
    std::fs::write(scratch.path().join("libgpuslice_core.so"), b"stand-in").unwrap();
    let log = scratch.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice-dra"))
        .arg("--node-name")
        .arg(NODE)
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--lib")
        .arg(&lib)
        .arg("--state-dir")
        .arg(scratch.path().join("state"))
        .arg("--cdi-dir")
        .arg(scratch.path().join("cdi"))
        .arg("--plugin-dir")
        .arg(scratch.path().join("plugins/gpuslice.dev"))
        .arg("--registry-dir")
        .arg(scratch.path().join("plugins_registry"))
        .args(["--model", "products", "--on-missing-gate", "units"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("FAKEGPU_STATE", scratch.path().join("fakegpu.state"))
        .env("FAKEGPU_DEVICES", "v100")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for("the Event", || !api.events().is_empty()).await;
    wait_for("the units", || {
        api.slices()
            .get("gpu-node-1-gpuslice.dev")
            .is_some_and(|s| {
                s["spec"]["devices"]
                    .as_array()
                    .is_some_and(|d| d.len() == 4)
            })
    })
    .await;
    let prom = scratch.path().join("state/gpuslice-dra.prom");
    wait_for("the metrics", || prom.exists()).await;
    let slice = &api.slices()["gpu-node-1-gpuslice.dev"];
    assert!(slice["spec"]["devices"][0]["name"]
        .as_str()
        .unwrap()
        .contains("-unit-"));
    // SAFETY: kill(2) on our own child's PID; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<_> = text
        .lines()
        .filter(|l| l.contains("DRAPartitionableDevices"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("units model instead"), "{text}");
    assert_eq!(api.events().len(), 1);
    // The metric says the same.
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains(
            "gpuslice_dra_model{node=\"gpu-node-1\",asked=\"products\",published=\"units\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "gpuslice_dra_feature_gate_missing{node=\"gpu-node-1\",gate=\"DRAPartitionableDevices\"} 1"
        ),
        "{metrics}"
    );
}
