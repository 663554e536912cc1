//! A GPU node of the cluster tests: its Node object on the real API server, one simulated
//! V100 (`cuda_e2e::containers::Stage`: the fake GPU's state, a root file system for podman
//! and the fake's host-PID broker), the real `gpuslice-dra` binary as a kubelet plugin runs it
//! (its own ServiceAccount token and the shipped ClusterRole, NVML from the fake, CDI specs in
//! /var/run/cdi where podman reads them), and the kubelet's side of the DRA gRPC API, driven by
//! the pods the real scheduler bound to the node: it resolves a pod's claims as the kubelet
//! does (`status.resourceClaimStatuses`, `status.extendedResourceClaimStatus`), checks they are
//! allocated and reserved for the pod, and calls NodePrepareResources / NodeUnprepareResources
//! on the driver's socket.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cuda_e2e::containers::{bin_dir, Stage};
use gpuslice_dra::proto::dra_v1;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::cluster::{tail, ControlPlane};
use super::{channel, Scratch};

/// A claim as the kubelet hands it to the plugin, and the CDI devices it got.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub claim: dra_v1::Claim,
    pub cdi_devices: Vec<String>,
}

pub struct TestNode {
    pub name: String,
    pub scratch: Scratch,
    pub stage: Stage,
    pub state_dir: PathBuf,
    pub driver_log: PathBuf,
    dra_socket: PathBuf,
    driver: Option<Child>,
    /// The ServiceAccount kubeconfig the driver runs with.
    kubeconfig: PathBuf,
}

/// Polls `check` every 100 ms until it returns `Some`; panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub const WAIT: Duration = Duration::from_secs(120);

impl TestNode {
    /// Registers Node `name` (labelled as a GPU node, Ready, as a kubelet would register it)
    /// and starts `gpuslice-dra --model <model> <extra>` for it, authenticated as the
    /// ServiceAccount `kube-system/gpuslice-dra` (which must exist, with its RBAC).
    pub async fn start(plane: &ControlPlane, name: &str, model: &str, extra: &[&str]) -> TestNode {
        let admin = plane.admin().await;
        register_node(&admin, name).await;
        let scratch = Scratch::new(&format!("node-{name}"));
        let stage = Stage::new(scratch.path());
        let kubeconfig = plane.service_account_kubeconfig("kube-system", "gpuslice-dra");
        let mut node = TestNode {
            name: name.to_string(),
            state_dir: scratch.path().join("state"),
            driver_log: scratch.path().join("gpuslice-dra.log"),
            dra_socket: scratch.path().join("plugins/gpuslice.dev/dra.sock"),
            scratch,
            stage,
            driver: None,
            kubeconfig,
        };
        node.start_driver(model, extra);
        node
    }

    /// (Re)starts the driver process.
    pub fn start_driver(&mut self, model: &str, extra: &[&str]) {
        let bin = bin_dir();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.driver_log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpuslice-dra"))
            .arg(format!("--model={model}"))
            .args(extra)
            .arg(format!("--lib={}", bin.join("libgpuslice.so").display()))
            .arg(format!(
                "--nvml-lib={}",
                bin.join("libfakegpu_nvml.so").display()
            ))
            .arg(format!("--state-dir={}", self.state_dir.display()))
            .arg("--cdi-dir=/var/run/cdi")
            .arg(format!(
                "--plugin-dir={}",
                self.scratch.path().join("plugins/gpuslice.dev").display()
            ))
            .arg(format!(
                "--registry-dir={}",
                self.scratch.path().join("plugins_registry").display()
            ))
            .arg("--nvidia-cdi=never")
            .arg("--republish-seconds=2")
            .env("NODE_NAME", &self.name)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("FAKEGPU_STATE", self.stage.state())
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start gpuslice-dra");
        self.driver = Some(child);
    }

    /// Stops the driver (SIGTERM) and waits for it.
    pub fn stop_driver(&mut self) {
        if let Some(mut child) = self.driver.take() {
            // SAFETY: kill on the PID of a child this process spawned and has not reaped.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }

    /// The driver's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.driver_log).unwrap_or_default()
    }

    /// Waits until the driver serves its DRA socket and the server holds the node's
    /// ResourceSlices with `devices` devices in all; returns them.
    pub async fn await_published(&self, client: &Client, devices: usize) -> Vec<ResourceSlice> {
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        let selector = format!("spec.nodeName={}", self.name);
        let found = tokio::time::timeout(WAIT, async {
            loop {
                let list = slices
                    .list(&ListParams::default().fields(&selector))
                    .await
                    .unwrap()
                    .items;
                let count: usize = list
                    .iter()
                    .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                    .sum();
                if count == devices
                    && tokio::net::UnixStream::connect(&self.dra_socket)
                        .await
                        .is_ok()
                {
                    return list;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "node {}: {devices} devices never published; driver log:\n{}",
                self.name,
                tail(&self.driver_log, 30)
            )
        })
    }

    /// The names of `pod`'s ResourceClaims, as the kubelet resolves them; `None` while one is
    /// not created yet.
    pub fn claim_names(pod: &Pod) -> Option<Vec<String>> {
        let status = pod.status.as_ref();
        let mut names = Vec::new();
        for claim in pod.spec.as_ref()?.resource_claims.iter().flatten() {
            let name = match &claim.resource_claim_name {
                Some(name) => name.clone(),
                None => status?
                    .resource_claim_statuses
                    .iter()
                    .flatten()
                    .find(|s| s.name == claim.name)?
                    .resource_claim_name
                    .clone()?,
            };
            names.push(name);
        }
        if let Some(extended) = status.and_then(|s| s.extended_resource_claim_status.as_ref()) {
            names.push(extended.resource_claim_name.clone());
        }
        Some(names)
    }

    /// The kubelet's part for a pod bound here: its claims, each allocated and reserved for
    /// it, prepared through the driver's socket (DRA v1). `Err` is the driver's error.
    pub async fn prepare(&self, client: &Client, pod: &Pod) -> Result<Vec<Prepared>, String> {
        let namespace = pod.metadata.namespace.clone().unwrap();
        let pod_uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(self.name.as_str()),
            "the pod is bound to this node"
        );
        let names = TestNode::claim_names(pod).expect("the pod's claims exist");
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &namespace);
        let mut claims = Vec::new();
        for name in names {
            let claim = api.get(&name).await.unwrap();
            let status = claim.status.as_ref().expect("an allocated claim");
            assert!(status.allocation.is_some(), "claim {name} is allocated");
            assert!(
                status
                    .reserved_for
                    .iter()
                    .flatten()
                    .any(|r| r.uid == pod_uid),
                "claim {name} is reserved for the pod"
            );
            claims.push(dra_v1::Claim {
                namespace: namespace.clone(),
                name,
                uid: claim.metadata.uid.clone().unwrap(),
            });
        }
        let mut kubelet =
            dra_v1::dra_plugin_client::DraPluginClient::new(channel(self.dra_socket.clone()).await);
        let response = kubelet
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: claims.clone(),
            })
            .await
            .map_err(|e| format!("NodePrepareResources: {e}"))?
            .into_inner();
        let mut out = Vec::new();
        for claim in claims {
            let answer = &response.claims[&claim.uid];
            if !answer.error.is_empty() {
                return Err(answer.error.clone());
            }
            out.push(Prepared {
                cdi_devices: answer
                    .devices
                    .iter()
                    .flat_map(|d| d.cdi_device_ids.clone())
                    .collect(),
                claim,
            });
        }
        Ok(out)
    }

    /// NodeUnprepareResources for `claims`; panics on an error.
    pub async fn unprepare(&self, claims: &[dra_v1::Claim]) {
        let mut kubelet =
            dra_v1::dra_plugin_client::DraPluginClient::new(channel(self.dra_socket.clone()).await);
        let response = kubelet
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: claims.to_vec(),
            })
            .await
            .unwrap()
            .into_inner();
        for claim in claims {
            assert_eq!(
                response.claims[&claim.uid].error, "",
                "unprepare {}",
                claim.name
            );
        }
    }

    /// What the driver has prepared on this node: per claim UID, the limit file's memory cap
    /// (bytes) and compute share of each device, read from its state directory.
    pub fn prepared_limits(&self) -> Vec<(String, u64, u32)> {
        let mut out = Vec::new();
        for entry in fs::read_dir(self.state_dir.join("claims"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let uid = entry.file_name().to_string_lossy().into_owned();
            let Ok(text) = fs::read_to_string(entry.path().join("limits.json")) else {
                continue;
            };
            let path = entry.path().join("limits.json");
            let limits = gpuslice_common::config::parse_limit_file(&path, &text).unwrap();
            for device in limits.devices {
                out.push((
                    uid.clone(),
                    device.memory_limit.unwrap_or(u64::MAX),
                    device.compute_percent.unwrap_or(100),
                ));
            }
        }
        out
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.stop_driver();
        // The claims' CDI specs in /var/run/cdi, if a test ended before unpreparing them.
        for entry in fs::read_dir(self.state_dir.join("claims"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let uid = entry.file_name().to_string_lossy().into_owned();
            let spec = Path::new("/var/run/cdi").join(gpuslice_dra::prepare::spec_name(&uid));
            let _ = fs::remove_file(spec);
        }
    }
}

/// Creates Node `name` as a kubelet registers it: labelled a GPU node, Ready, room for pods.
pub async fn register_node(client: &Client, name: &str) {
    let now = k8s_openapi::chrono::Utc::now().to_rfc3339();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "nvidia.com/gpu.present": "true"}},
        "status": {
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "the cluster tests' node", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}
    }))
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    // The API server's TaintNodesByCondition admission taints a new Node not-ready; the node
    // lifecycle controller lifts it once the kubelet reports Ready. That controller is off
    // here (nothing heartbeats), so the taint is lifted as it would.
    if created
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| !t.is_empty())
    {
        let patch = json!({"spec": {"taints": null}});
        nodes
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
    // The status of a create is kept on some versions and not on others: set it as the
    // kubelet's status update does.
    if created
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_none()
    {
        let patch = json!({"status": node.status});
        nodes
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
}
