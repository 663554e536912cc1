//! gpuslice-dra in a cluster whose control plane is upstream's own: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler built from the Go module proxy at the release
//! `dra/k8s/<minor>/go.mod` pins (`.ci/k8s-setup.sh`; `common::cluster`), with each version's
//! default feature gates. What stands in for the rest of a node (`common::node`): a Node object
//! registered as a kubelet would, the fake GPU, and the kubelet's side of the DRA gRPC API
//! driven by the pods the real scheduler bound; podman runs the pods' containers with the CDI
//! devices the driver returned.
//!
//! Runs serially (`SERIAL_TEST_BINARIES`). Needs the binaries (`.ci/k8s-setup.sh`, found under
//! `$GPUSLICE_K8S_CACHE`, default `/var/cache/gpuslice`), openssl, and for the container parts
//! root, podman, NVIDIA's nvidia-smi (`.ci/nvidia-smi-setup.sh`) and PyTorch; without them a
//! test prints `SKIPPED: ...` and passes, except with `CI=true`, where it fails.
//! `GPUSLICE_K8S_MINORS="1.37 1.34"` runs every test against each minor built.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::cluster::{ControlPlane, Release};
use common::node::{wait_for, Prepared, TestNode, WAIT};
use cuda_e2e::containers::{
    add_pytorch, copy_with_libs, skip_or_fail, text, torch_fill_command, torch_prefix, u64_at,
    Podman,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const DRIVER_USER: &str = "system:serviceaccount:kube-system:gpuslice-dra";

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker/k8s")
}

/// The releases to test, built; empty after a skip (a failure with `CI=true`).
fn releases() -> Vec<Release> {
    let mut out = Vec::new();
    for minor in common::cluster::minors() {
        match Release::find(&minor) {
            Ok(release) => out.push(release),
            Err(reason) => cuda_e2e::skip::skip_or_fail(&reason),
        }
    }
    out
}

/// What a pod asks for.
#[derive(Debug, Clone, Copy)]
enum Ask<'a> {
    /// A claim from this ResourceClaimTemplate.
    Template(&'a str),
    /// `resources.limits: {<name>: 1}`.
    Limit(&'a str),
}

/// A Pod on `node` asking for `ask`; its image is never pulled (the tests' kubelet side runs
/// containers itself).
fn pod(name: &str, node: &str, ask: Ask) -> Pod {
    let mut container = json!({"name": "main", "image": "registry.example.com/workload:1",
                               "command": ["sleep", "3600"]});
    let mut spec = json!({
        "nodeSelector": {"kubernetes.io/hostname": node},
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
    });
    match ask {
        Ask::Template(template) => {
            spec["resourceClaims"] =
                json!([{"name": "gpu", "resourceClaimTemplateName": template}]);
            container["resources"] = json!({"claims": [{"name": "gpu"}]});
        }
        Ask::Limit(resource) => container["resources"] = json!({"limits": {resource: "1"}}),
    }
    spec["containers"] = json!([container]);
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

/// Where the scheduler put a pod.
#[derive(Debug)]
enum Placed {
    Bound(Pod),
    /// The PodScheduled condition's message.
    Unschedulable(String),
}

/// Waits until `name` is bound (with its claims resolved) or the scheduler said it cannot be.
async fn placed(pods: &Api<Pod>, name: &str) -> Placed {
    wait_for(
        &format!("pod {name} to be scheduled or refused"),
        WAIT,
        || async {
            let pod = pods.get(name).await.ok()?;
            let bound = pod.spec.as_ref()?.node_name.is_some();
            if bound && TestNode::claim_names(&pod).is_some() {
                return Some(Placed::Bound(pod));
            }
            let refused = pod
                .status
                .as_ref()?
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            (refused.reason.as_deref() == Some("Unschedulable"))
                .then(|| Placed::Unschedulable(refused.message.clone().unwrap_or_default()))
        },
    )
    .await
}

/// Waits until `name` is bound, however often the scheduler finds no room meanwhile.
async fn rescheduled(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(&format!("pod {name} to be scheduled"), WAIT, || async {
        let pod = pods.get(name).await.ok()?;
        (pod.spec.as_ref()?.node_name.is_some() && TestNode::claim_names(&pod).is_some())
            .then_some(pod)
    })
    .await
}

async fn bound(pods: &Api<Pod>, name: &str) -> Pod {
    match placed(pods, name).await {
        Placed::Bound(pod) => pod,
        Placed::Unschedulable(why) => panic!("pod {name} was not scheduled: {why}"),
    }
}

/// Deletes a pod at once (as `kubectl delete --force --grace-period=0` does: no kubelet
/// confirms the deletion here), after the kubelet side unprepared its claims.
async fn remove(node: &TestNode, pods: &Api<Pod>, name: &str, prepared: &[Prepared]) {
    let claims: Vec<_> = prepared.iter().map(|p| p.claim.clone()).collect();
    if !claims.is_empty() {
        node.unprepare(&claims).await;
    }
    let _ = pods
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
}

/// Creates namespace `name` with the tenant part of the install (templates and quota).
fn tenant(plane: &ControlPlane, name: &str, with_quota: bool) {
    plane.kubectl(&["create", "namespace", name]);
    let tenant = k8s_dir().join("tenant");
    if with_quota {
        plane.kubectl(&[
            "apply",
            "--server-side",
            "-n",
            name,
            "-k",
            tenant.to_str().unwrap(),
        ]);
    } else {
        let templates = tenant.join("resourceclaimtemplates.yaml");
        plane.kubectl(&[
            "apply",
            "--server-side",
            "-n",
            name,
            "-f",
            templates.to_str().unwrap(),
        ]);
    }
}

/// The cluster-wide install: `kubectl kustomize docker/k8s`, applied with a server-side dry
/// run (every object accepted), then for real. Returns the number of objects.
fn install(plane: &ControlPlane) -> usize {
    let rendered = plane.kubectl(&["kustomize", k8s_dir().to_str().unwrap()]);
    let dry = plane.kubectl_stdin(
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        Some(&rendered),
    );
    let objects =
        rendered.matches("\nkind: ").count() + usize::from(rendered.starts_with("kind: "));
    assert_eq!(
        dry.matches("serverside-applied (server dry run)").count(),
        objects,
        "every object of the tree passes the server's dry run:\n{dry}"
    );
    plane.kubectl(&["apply", "--server-side", "-k", k8s_dir().to_str().unwrap()]);
    objects
}

/// The driver's requests in the audit log: none refused (403), and the (verb, resource) pairs
/// it used.
fn driver_rights_used(plane: &ControlPlane) -> Vec<(String, String)> {
    let events = plane.audit_events(DRIVER_USER);
    assert!(
        !events.is_empty(),
        "the driver made no request as its ServiceAccount"
    );
    let refused: Vec<&Value> = events
        .iter()
        .filter(|e| e["responseStatus"]["code"] == 403)
        .collect();
    assert!(
        refused.is_empty(),
        "the shipped ClusterRole refused the driver: {refused:#?}"
    );
    let mut used: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_string(),
                e["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    used.sort();
    used.dedup();
    used
}

/// The ClusterRole dra-driver.yaml ships: (verb, resource) pairs.
fn driver_rights_granted() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(k8s_dir().join("dra-driver.yaml")).unwrap();
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc: Value = serde_json::to_value(
            <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap(),
        )
        .unwrap();
        if doc["kind"] != "ClusterRole" {
            continue;
        }
        for rule in doc["rules"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.push((
                        verb.as_str().unwrap().to_string(),
                        resource.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// The first nvidia-smi build `.ci/nvidia-smi-setup.sh` unpacked, with the CUDA version its
/// driver reports (the fake plays that driver).
fn nvidia_smi() -> Option<(PathBuf, &'static str)> {
    for (suite, cuda) in [("bookworm", "12020"), ("trixie", "12040")] {
        let path = Path::new("/opt/gpuslice-ci/nvidia-smi")
            .join(suite)
            .join("nvidia-smi");
        if path.is_file() {
            return Some((path, cuda));
        }
    }
    cuda_e2e::skip::skip_or_fail(
        "nvidia-smi not found in /opt/gpuslice-ci/nvidia-smi (run .ci/nvidia-smi-setup.sh)",
    );
    None
}

/// In podman containers given `devices` (a prepared claim's CDI devices) on `node`'s card:
/// NVIDIA's nvidia-smi's one-line view, then PyTorch filling the device until its
/// out-of-memory error. Returns the nvidia-smi line and the three lines of the fill. Two
/// containers: nvidia-smi needs the fake to play the driver it ships with (CUDA 12.x), the
/// PyTorch wheel a CUDA 13 driver (the fake's default).
fn run_workload(node: &TestNode, podman: &Podman, devices: &[String]) -> (String, Vec<Value>) {
    let (smi, cuda) = nvidia_smi().expect("nvidia-smi");
    let prefix = torch_prefix().expect("PyTorch");
    let rootfs = node.stage.rootfs();
    copy_with_libs(rootfs, &smi, "/usr/bin/nvidia-smi");
    let mount = add_pytorch(rootfs, &prefix);
    let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
    let run = |tag: &str, extra: Vec<String>, script: &str| {
        let name = format!(
            "gpuslice-cluster-{}-{}-{tag}",
            std::process::id(),
            node.name
        );
        let mut args = node.stage.run_args(&name, false, &devices);
        let at = args.iter().position(|a| a == "--rootfs").unwrap();
        args.splice(at..at, extra);
        let out = podman
            .cmd()
            .args(&args)
            .args(["/bin/sh", "-c", script])
            .output()
            .unwrap();
        podman.remove(&name);
        assert!(
            out.status.success(),
            "{tag} failed ({}):\n{}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let smi_line = run(
        "smi",
        vec!["-e".to_string(), format!("FAKEGPU_DRIVER_VERSION={cuda}")],
        "/usr/bin/nvidia-smi --query-gpu=name,memory.total --format=csv,noheader",
    );
    let fill = run("torch", mount, &torch_fill_command(&prefix))
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (smi_line.trim_end().to_string(), fill)
}

/// The events of `namespace` about `object`, as "reason: message" lines.
async fn events_of(client: &Client, namespace: &str, object: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={object}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// The API server's refusal of `create` (a dry run), or `None` when it accepts.
async fn refusal<K>(api: &Api<K>, object: &K) -> Option<String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&dry, object).await {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some(format!("{} ({})", e.message, e.code)),
        Err(e) => panic!("create: {e}"),
    }
}

/// A ResourceClaimTemplate (or, with `claim`, a ResourceClaim) from JSON.
fn template(value: Value) -> k8s_openapi::api::resource::v1::ResourceClaimTemplate {
    serde_json::from_value(value).unwrap()
}

/// What a release's default feature gates let the driver publish for one V100, and the
/// catalogue's names for it: the products model where DRAPartitionableDevices is on by default
/// (1.36+); elsewhere (1.34, 1.35) the shipped driver's products fall back to the gate-free
/// units model (`--on-missing-gate=units`, as docker/README.md tells an operator whose cluster
/// runs no alpha gates), and tenants use the `gpu-units-*` templates.
struct Catalogue {
    /// gpuslice-dra's `--model` and extra arguments.
    model: &'static str,
    args: &'static [&'static str],
    /// The ResourceSlices and devices it publishes for the card.
    slices: usize,
    devices: usize,
    /// The templates of a 25, 50 and 100% slice.
    templates: [&'static str; 3],
    /// The DeviceClass the quota counts a quarter in.
    quarter_class: &'static str,
    /// How a quarter's device name starts on card 0.
    quarter_device: &'static str,
}

const PRODUCTS: Catalogue = Catalogue {
    model: "products",
    args: &[],
    slices: 2,
    devices: 7,
    templates: ["gpu-slice-25", "gpu-slice-50", "gpu-slice-100"],
    quarter_class: "gpu-25.gpuslice.dev",
    quarter_device: "gpu-0-25-",
};

const UNITS: Catalogue = Catalogue {
    model: "units",
    args: &[],
    slices: 1,
    devices: 4,
    templates: ["gpu-units-25", "gpu-units-50", "gpu-units-100"],
    quarter_class: "unit.gpuslice.dev",
    quarter_device: "gpu-0-unit-",
};

/// The shipped products model on a release whose gate is off: the units it falls back to.
const UNITS_FALLBACK: Catalogue = Catalogue {
    model: "products",
    args: &["--on-missing-gate=units"],
    ..UNITS
};

impl Catalogue {
    /// The catalogue `release` serves with its default gates.
    fn of(release: &Release) -> &'static Catalogue {
        if common::rules::Cluster::defaults(release.minor_number()).partitionable_devices {
            &PRODUCTS
        } else {
            &UNITS_FALLBACK
        }
    }
}

/// The operator's journey on one node with one simulated V100, in the model the release's
/// default gates allow ([`Catalogue`]: products on 1.36+, units before): the install
/// (kustomize tree, server-side dry run, then applied), a tenant namespace with the catalogue
/// and quota, the driver publishing as its ServiceAccount, the admission policies refusing
/// and accepting, a pod from the quarter's template (`gpu-slice-25`, `gpu-units-25`) whose
/// claim the controller manager makes and the scheduler allocates, prepared, and in its
/// container nvidia-smi shows
/// `Tesla V100-PCIE-32GB, 8192 MiB` and PyTorch runs out of memory at the cap; the card filled
/// with four quarters, a fifth pod Pending with the scheduler's own reason until one frees,
/// a namespace's quota refusing a fifth claim; every component stopped cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_journey_on_a_real_control_plane() {
    for release in releases() {
        journey(&release).await;
    }
}

async fn journey(release: &Release) {
    let scratch = common::Scratch::new("journey-podman");
    let podman = match Podman::probe(scratch.path()) {
        Ok(podman) => podman,
        Err(reason) => return skip_or_fail(&reason),
    };
    if nvidia_smi().is_none() || torch_prefix().is_none() {
        return;
    }
    eprintln!("journey: Kubernetes {}", release.version);
    let mut plane = ControlPlane::start(release, "").await;
    let admin = plane.admin().await;
    let version = plane.kubectl(&["version", "-o", "json"]);
    let version: Value = serde_json::from_str(&version).unwrap();
    assert_eq!(
        version["serverVersion"]["gitVersion"],
        release.version.as_str()
    );

    // 1. The install, and a tenant.
    let objects = install(&plane);
    assert!(objects >= 15, "{objects} objects in the tree");
    tenant(&plane, "team-a", true);
    tenant(&plane, "team-b", true);

    // 2. The driver on the node, as its ServiceAccount: it publishes the card's products
    //    (on 1.34/1.35's default gates: units).
    let catalogue = Catalogue::of(release);
    let quarter = Ask::Template(catalogue.templates[0]);
    let node = TestNode::start(&plane, "gpu-node-1", catalogue.model, catalogue.args).await;
    let slices = node.await_published(&admin, catalogue.devices).await;
    assert_eq!(
        slices.len(),
        catalogue.slices,
        "products: a counter slice and a device slice; units: one slice"
    );

    // 3. The contract, enforced by the API server's admission policies.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    let plain = pod("plain", "gpu-node-1", Ask::Limit("nvidia.com/gpu"));
    let why = wait_for(
        "the pod policy to refuse a plain GPU request",
        WAIT,
        || async { refusal(&pods, &plain).await },
    )
    .await;
    for shape in [
        "ask for a GPU as a plain resource",
        "gpu-slice-25",
        "gpuslice.dev/gpu-25",
    ] {
        assert!(why.contains(shape), "{why}");
    }
    assert!(why.contains("(403)"), "refused as Forbidden: {why}");
    for ok in [
        pod("ok-template", "gpu-node-1", quarter),
        pod(
            "ok-extended",
            "gpu-node-1",
            Ask::Limit("gpuslice.dev/gpu-25"),
        ),
    ] {
        assert_eq!(refusal(&pods, &ok).await, None, "{ok:?}");
    }
    check_template_policy(&admin).await;

    // 4. A pod with a quarter: the controller manager makes its claim, the scheduler
    //    allocates it, the kubelet side prepares it, and inside: the slice.
    pods.create(&PostParams::default(), &pod("smi", "gpu-node-1", quarter))
        .await
        .unwrap();
    let smi = bound(&pods, "smi").await;
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-a");
    let claim_name = &TestNode::claim_names(&smi).unwrap()[0];
    let claim = claims.get(claim_name).await.unwrap();
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        owner.name, "smi",
        "the controller manager made the claim for the pod"
    );
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()["resource.kubernetes.io/pod-claim-name"],
        "gpu"
    );
    let result = &claim
        .status
        .as_ref()
        .unwrap()
        .allocation
        .as_ref()
        .unwrap()
        .devices;
    let device = &result.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert!(
        device.device.starts_with(catalogue.quarter_device),
        "{device:?}"
    );
    let mut prepared = BTreeMap::new();
    let smi_claims = node.prepare(&admin, &smi).await.unwrap();
    let (line, fill) = run_workload(&node, &podman, &smi_claims[0].cdi_devices);
    assert_eq!(line, "Tesla V100-PCIE-32GB, 8192 MiB");
    assert_eq!(fill.len(), 3, "{fill:?}");
    assert_eq!(u64_at(&fill[0], &["total"]), 8 * GIB, "{}", fill[0]);
    assert_eq!(
        fill[1]["oom"], true,
        "torch.cuda.OutOfMemoryError: {}",
        fill[1]
    );
    let filled = u64_at(&fill[1], &["filled"]);
    assert!(
        (7 * GIB..=8 * GIB).contains(&filled),
        "filled up to the 8 GiB cap: {filled}"
    );
    let peak = fakegpu::open_state_at(node.stage.state())
        .unwrap()
        .peak_memory(0);
    assert!(peak <= 8 * GIB, "the card held {peak} bytes for the slice");
    prepared.insert("smi".to_string(), smi_claims);

    // 5. Three more quarters fill the card; a fifth (another tenant) waits with the
    //    scheduler's reason, and is scheduled when a quarter frees.
    for n in 1..=3 {
        let name = format!("quarter-{n}");
        pods.create(&PostParams::default(), &pod(&name, "gpu-node-1", quarter))
            .await
            .unwrap();
        let placed = bound(&pods, &name).await;
        prepared.insert(name, node.prepare(&admin, &placed).await.unwrap());
    }
    let limits = node.prepared_limits();
    assert_eq!(limits.len(), 4);
    assert!(limits
        .iter()
        .all(|(_, memory, compute)| *memory == 8 * GIB && *compute == 25));
    let others: Api<Pod> = Api::namespaced(admin.clone(), "team-b");
    others
        .create(&PostParams::default(), &pod("fifth", "gpu-node-1", quarter))
        .await
        .unwrap();
    match placed(&others, "fifth").await {
        Placed::Unschedulable(why) => {
            assert!(why.contains("cannot allocate all claims"), "{why}")
        }
        Placed::Bound(_) => panic!("a fifth quarter was scheduled on a full card"),
    }
    // team-a's quota (4 quarters) refuses a fifth claim: its pod waits too.
    pods.create(
        &PostParams::default(),
        &pod("over-quota", "gpu-node-1", quarter),
    )
    .await
    .unwrap();
    let quota_event = wait_for("the quota refusal of over-quota's claim", WAIT, || async {
        events_of(&admin, "team-a", "over-quota")
            .await
            .into_iter()
            .find(|e| e.contains("exceeded quota"))
    })
    .await;
    let quota_resource = format!(
        "{}.deviceclass.resource.k8s.io/devices",
        catalogue.quarter_class
    );
    assert!(quota_event.contains(&quota_resource), "{quota_event}");
    // What `kubectl get resourcequota` shows: the quarter class's hard limit, all four used.
    let quota: Value = serde_json::from_str(&plane.kubectl(&[
        "get",
        "resourcequota",
        "gpu-slices",
        "-n",
        "team-a",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(quota["status"]["hard"][&quota_resource], "4", "{quota}");
    assert_eq!(quota["status"]["used"][&quota_resource], "4", "{quota}");
    pods.delete("over-quota", &DeleteParams::default())
        .await
        .unwrap();

    let freed = prepared.remove("smi").unwrap();
    remove(&node, &pods, "smi", &freed).await;
    let fifth = rescheduled(&others, "fifth").await;
    prepared.insert("fifth".into(), node.prepare(&admin, &fifth).await.unwrap());
    assert_eq!(node.prepared_limits().len(), 4);

    // 6. The driver needed only the rights its ClusterRole grants.
    let used = driver_rights_used(&plane);
    let granted = driver_rights_granted();
    for right in &used {
        assert!(
            granted.contains(right),
            "{right:?} used but not granted ({granted:?})"
        );
    }
    eprintln!("journey: the driver used {used:?} of {granted:?}");
    assert!(
        !node.log().to_lowercase().contains("forbidden"),
        "{}",
        node.log()
    );

    for (name, claims) in &prepared {
        let api = if name == "fifth" { &others } else { &pods };
        remove(&node, api, name, claims).await;
    }
    drop(node);
    plane.stop().expect("the control plane stops cleanly");
}

/// The template and claim policies: each deviation refused with the documented shape named,
/// the documented ones accepted.
async fn check_template_policy(admin: &Client) {
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(admin.clone(), "team-a");
    let shape = |name: &str, label: Option<&str>, exactly: Value| {
        let mut metadata = json!({"name": name});
        if let Some(label) = label {
            metadata["labels"] = json!({"gpuslice.dev/product": label});
        }
        template(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": metadata,
            "spec": {"spec": {"devices": {"requests": [{"name": "slice", "exactly": exactly}]}}}}),
        )
    };
    let quarter = json!({"deviceClassName": "gpu-25.gpuslice.dev", "count": 1});
    let cases = [
        (
            shape("gpu-slice-30", Some("30"), quarter.clone()),
            "is not a gpuslice product",
        ),
        (
            shape("my-gpu", None, quarter.clone()),
            "is not a gpuslice product",
        ),
        (
            shape("gpu-slice-25", Some("50"), quarter.clone()),
            "must carry the label gpuslice.dev/product: \"25\"",
        ),
        (
            shape("gpu-slice-25", None, quarter.clone()),
            "must carry the label gpuslice.dev/product: \"25\"",
        ),
        (
            shape(
                "gpu-slice-25",
                Some("25"),
                json!({"deviceClassName": "gpu-25.gpuslice.dev", "count": 2}),
            ),
            "differs from the documented product",
        ),
        (
            shape(
                "gpu-slice-25",
                Some("25"),
                json!({"deviceClassName": "gpu-50.gpuslice.dev", "count": 1}),
            ),
            "differs from the documented product",
        ),
        (
            shape(
                "gpu-slice-25",
                Some("25"),
                json!({"deviceClassName": "slice.gpuslice.dev",
                       "capacity": {"requests": {"memory": "12Gi"}}}),
            ),
            "differs from the documented product",
        ),
    ];
    for (object, expected) in &cases {
        let why = wait_for("the template policy", WAIT, || async {
            refusal(&templates, object).await
        })
        .await;
        assert!(why.contains(expected), "{expected:?} not in {why}");
        assert!(
            why.contains("docker/k8s/tenant/resourceclaimtemplates.yaml"),
            "the documented shape is named: {why}"
        );
    }
    // The documented ones (applied by the tenant kustomization) pass again.
    let catalogue =
        std::fs::read_to_string(k8s_dir().join("tenant/resourceclaimtemplates.yaml")).unwrap();
    let mut documented = 0;
    for doc in serde_yaml::Deserializer::from_str(&catalogue) {
        let value: Value = serde_json::to_value(
            <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap(),
        )
        .unwrap();
        let mut object = template(value);
        let name = object.metadata.name.clone().unwrap();
        let api: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
            Api::namespaced(admin.clone(), "team-b");
        // Already there (the tenant kustomization): a dry-run replace is the same admission
        // check as the create was.
        object.metadata.resource_version = api.get(&name).await.unwrap().metadata.resource_version;
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        api.replace(&name, &dry, &object)
            .await
            .unwrap_or_else(|e| panic!("the documented template {name} is refused: {e}"));
        documented += 1;
    }
    assert_eq!(documented, 6);

    // Hand-written claims: the documented shape (pod-shared-claim.yaml) passes, another not.
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-a");
    let example = std::fs::read_to_string(k8s_dir().join("pod-shared-claim.yaml")).unwrap();
    let first = serde_yaml::Deserializer::from_str(&example).next().unwrap();
    let shared: ResourceClaim = serde_json::from_value(
        serde_json::to_value(
            <serde_yaml::Value as serde::Deserialize>::deserialize(first).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(refusal(&claims, &shared).await, None);
    let mut custom = shared.clone();
    custom.metadata.name = Some("custom".into());
    let request = &mut custom
        .spec
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0];
    request.exactly.as_mut().unwrap().device_class_name = "slice.gpuslice.dev".into();
    let why = wait_for("the claim policy", WAIT, || async {
        refusal(&claims, &custom).await
    })
    .await;
    assert!(
        why.contains("differs from the documented products"),
        "{why}"
    );
}

/// One mix of products on one card: all pods created at once; whatever the real scheduler
/// binds is prepared, and no prepare is ever refused by the driver's own guard (the allocator
/// never promised more than the card); the bound shares fit the card and no pending pod
/// would have fit next to them; every prepared slice's limits are its product's.
async fn mix(
    node: &TestNode,
    admin: &Client,
    pods: &Api<Pod>,
    round: usize,
    asks: &[(Ask<'_>, u32)],
) {
    let names: Vec<String> = (0..asks.len())
        .map(|i| format!("mix-{round}-{i}"))
        .collect();
    for (name, (ask, _)) in names.iter().zip(asks) {
        pods.create(&PostParams::default(), &pod(name, &node.name, *ask))
            .await
            .unwrap();
    }
    // Settled: each pod bound or refused by the scheduler, and no refused one would fit next
    // to the bound ones (the scheduler retries a refused pod when claims change).
    let settled = wait_for(&format!("round {round} to settle"), WAIT, || async {
        let mut bound = Vec::new();
        let mut pending = Vec::new();
        for (name, (_, share)) in names.iter().zip(asks) {
            let pod = pods.get(name).await.ok()?;
            if pod.spec.as_ref()?.node_name.is_some() && TestNode::claim_names(&pod).is_some() {
                bound.push((name.clone(), pod, *share));
                continue;
            }
            let refused = pod.status.as_ref()?.conditions.iter().flatten().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })?;
            let why = refused.message.clone().unwrap_or_default();
            assert!(why.contains("cannot allocate all claims"), "{why}");
            pending.push(*share);
        }
        let used: u32 = bound.iter().map(|(_, _, share)| share).sum();
        let fits = pending.iter().any(|share| used + share <= 100);
        (!fits).then_some((bound, used))
    })
    .await;
    let (bound, used) = settled;
    let mut prepared = Vec::new();
    for (name, pod, _) in bound {
        let claims = node
            .prepare(admin, &pod)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the allocator over-committed: {e}"));
        prepared.push((name, claims));
    }
    assert!(used <= 100, "round {round}: {used}% of the card prepared");
    let limits = node.prepared_limits();
    let memory: u64 = limits.iter().map(|(_, m, _)| m).sum();
    let compute: u32 = limits.iter().map(|(_, _, c)| c).sum();
    assert!(
        memory <= 32 * GIB && compute <= 100,
        "round {round}: {limits:?}"
    );
    assert_eq!(compute, used, "round {round}: {limits:?}");
    for (_, memory, compute) in &limits {
        assert_eq!(
            *memory,
            *compute as u64 * 32 * GIB / 100,
            "round {round}: {limits:?}"
        );
    }
    for (name, claims) in &prepared {
        remove(node, pods, name, claims).await;
    }
    for name in &names {
        let _ = pods
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await;
    }
    // The claims are gone (deallocated) before the next round.
    no_claims_left(admin, pods.namespace().unwrap()).await;
}

/// Waits until `namespace` holds no ResourceClaim (every device it held is free again).
async fn no_claims_left(admin: &Client, namespace: &str) {
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), namespace);
    wait_for("the claims to be deleted", WAIT, || async {
        claims
            .list(&ListParams::default())
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(|_| ())
    })
    .await;
}

/// Churn: pods of random products created and deleted without waiting for the scheduler to
/// settle; after every step the card's prepared claims fit it and no prepare was refused.
async fn churn(
    node: &TestNode,
    admin: &Client,
    pods: &Api<Pod>,
    products: &[(Ask<'_>, u32)],
    steps: usize,
) {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut live: Vec<String> = Vec::new();
    let mut prepared: BTreeMap<String, Vec<Prepared>> = BTreeMap::new();
    for step in 0..steps {
        if live.is_empty() || next() % 3 != 0 {
            let (ask, _) = products[(next() % products.len() as u64) as usize];
            let name = format!("churn-{step}");
            pods.create(&PostParams::default(), &pod(&name, &node.name, ask))
                .await
                .unwrap();
            live.push(name);
        } else {
            let name = live.remove((next() % live.len() as u64) as usize);
            let claims = prepared.remove(&name).unwrap_or_default();
            remove(node, pods, &name, &claims).await;
        }
        // The kubelet side: prepare whatever is bound now.
        for name in &live {
            if prepared.contains_key(name) {
                continue;
            }
            let Ok(pod) = pods.get(name).await else {
                continue;
            };
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
                || TestNode::claim_names(&pod).is_none()
            {
                continue;
            }
            let claims = node
                .prepare(admin, &pod)
                .await
                .unwrap_or_else(|e| panic!("churn step {step}: the allocator over-committed: {e}"));
            prepared.insert(name.clone(), claims);
        }
        let limits = node.prepared_limits();
        let compute: u32 = limits.iter().map(|(_, _, c)| c).sum();
        let memory: u64 = limits.iter().map(|(_, m, _)| m).sum();
        assert!(
            compute <= 100 && memory <= 32 * GIB,
            "churn step {step}: {limits:?}"
        );
    }
    for name in live {
        let claims = prepared.remove(&name).unwrap_or_default();
        remove(node, pods, &name, &claims).await;
    }
    no_claims_left(admin, pods.namespace().unwrap()).await;
}

/// Every slice of a prepared mix enforces its cap on the shared card: each fills to its
/// product's memory and no further (the fake GPU's truth), one after the other.
fn caps_hold(node: &TestNode, podman: &Podman, slices: &[(Vec<String>, u64)]) {
    for (n, (devices, cap)) in slices.iter().enumerate() {
        let name = format!("gpuslice-cluster-cap-{}-{n}", std::process::id());
        let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
        let args = node.stage.run_args(&name, false, &devices);
        let lines = podman.run_script(&args, "/usr/bin/linked-client alloc-until-oom 256MiB");
        podman.remove(&name);
        assert_eq!(
            lines[0]["error"], "CUDA_ERROR_OUT_OF_MEMORY",
            "{}",
            lines[0]
        );
        let total = u64_at(&lines[0], &["total_bytes"]);
        assert!(
            total <= *cap && total + 512 * MIB >= *cap,
            "slice {n}: filled {total} of a {cap}-byte cap"
        );
    }
    let peak = fakegpu::open_state_at(node.stage.state())
        .unwrap()
        .peak_memory(0);
    let largest = slices.iter().map(|(_, cap)| *cap).max().unwrap_or(0);
    assert!(
        peak <= largest,
        "the card held {peak} bytes, the largest cap is {largest}"
    );
}

/// No over-commit with the real allocator: every mix of 25/50/100% products on one card (the
/// products model where the release's default gates serve it, 1.36+, and the gate-free units
/// model on every release), created at once and in churn. The
/// extended-resource route is not mixed here: on 1.37.2 its pods created together on a full
/// card sometimes stay Pending for minutes (the scheduler's PreBind finds the claim it made
/// for the pod deleted, "add allocation and reservation to claim ...: not found", and
/// retries), so a round cannot be awaited to settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_allocator_never_over_commits_a_card() {
    for release in releases() {
        over_commit(&release).await;
    }
}

async fn over_commit(release: &Release) {
    let scratch = common::Scratch::new("mix-podman");
    let podman = match Podman::probe(scratch.path()) {
        Ok(podman) => podman,
        Err(reason) => return skip_or_fail(&reason),
    };
    eprintln!("over-commit: Kubernetes {}", release.version);
    let mut plane = ControlPlane::start(release, "").await;
    let admin = plane.admin().await;
    install(&plane);
    tenant(&plane, "mix", false);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "mix");

    // Every multiset of the three sizes worth more than a card and at most 150% (plus the
    // ones that just fit), in each model the release serves: products where its default
    // gates allow them, and the gate-free units model.
    let mut shapes: Vec<Vec<usize>> = Vec::new();
    for a in 0..=5usize {
        for b in 0..=3usize {
            for c in 0..=2usize {
                let total = 25 * a + 50 * b + 100 * c;
                if (100..=150).contains(&total) {
                    shapes.push([vec![0; a], vec![1; b], vec![2; c]].concat());
                }
            }
        }
    }
    let mut models = vec![&UNITS];
    if std::ptr::eq(Catalogue::of(release), &PRODUCTS) {
        models.insert(0, &PRODUCTS);
    }
    let mut round = 0;
    for model in models {
        let nodename = format!("gpu-node-{}", model.model);
        let node = TestNode::start(&plane, &nodename, model.model, model.args).await;
        node.await_published(&admin, model.devices).await;
        let catalogue: Vec<(Ask, u32)> = model
            .templates
            .iter()
            .zip([25, 50, 100])
            .map(|(template, share)| (Ask::Template(template), share))
            .collect();
        for shape in &shapes {
            let asks: Vec<(Ask, u32)> = shape.iter().map(|&i| catalogue[i]).collect();
            mix(&node, &admin, &pods, round, &asks).await;
            round += 1;
        }
        churn(&node, &admin, &pods, &catalogue, 40).await;
        // A full card: every cap enforced on it.
        let mut held = Vec::new();
        let mut slices = Vec::new();
        for (i, share) in [50u32, 25, 25].iter().enumerate() {
            let ask = catalogue.iter().find(|(_, s)| s == share).unwrap().0;
            let name = format!("caps-{round}-{i}");
            pods.create(&PostParams::default(), &pod(&name, &nodename, ask))
                .await
                .unwrap();
            let placed = bound(&pods, &name).await;
            let claims = node.prepare(&admin, &placed).await.unwrap();
            slices.push((
                claims[0].cdi_devices.clone(),
                *share as u64 * 32 * GIB / 100,
            ));
            held.push((name, claims));
        }
        round += 1;
        caps_hold(&node, &podman, &slices);
        for (name, claims) in &held {
            remove(&node, &pods, name, claims).await;
        }
        no_claims_left(&admin, "mix").await;
        drop(node);
    }
    let used = driver_rights_used(&plane);
    eprintln!("over-commit: the driver used {used:?}");
    plane.stop().expect("the control plane stops cleanly");
}

/// One request of the parity check: a ResourceSlice created (a dry run), or, with `old`,
/// created as `old` and then replaced by it (a dry run).
struct Case {
    name: &'static str,
    slice: Value,
    old: Option<Value>,
}

/// A valid device slice of node `parity-node` named `name`.
fn parity_slice(name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "gpuslice.dev", "nodeName": "parity-node",
            "pool": {"name": "parity-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0-25-a",
                "attributes": {"share": {"int": 25}, "uuid": {"string": "GPU-1"}},
                "capacity": {"memory": {"value": "8Gi"}}}]}})
}

/// A counter slice (1.35's layout) named `name`.
fn parity_counters(name: &str) -> Value {
    let mut slice = parity_slice(name);
    slice["spec"].as_object_mut().unwrap().remove("devices");
    slice["spec"]["sharedCounters"] = json!([{"name": "gpu-0", "counters": {
        "memory": {"value": "32Gi"}, "compute": {"value": "100"}}}]);
    slice
}

/// Every rule of the fake API server (`common::rules`, `common::api`) as one request.
fn parity_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |name: &'static str, base: fn(&str) -> Value, edit: &dyn Fn(&mut Value)| {
        let mut slice = base(name);
        edit(&mut slice);
        cases.push(Case {
            name,
            slice,
            old: None,
        });
    };
    let n_devices = |s: &mut Value, n: usize, extra: Value| {
        let mut template = s["spec"]["devices"][0].clone();
        for (k, v) in extra.as_object().unwrap() {
            template[k] = v.clone();
        }
        s["spec"]["devices"] = Value::Array(
            (0..n)
                .map(|i| {
                    let mut d = template.clone();
                    d["name"] = json!(format!("gpu-{i}"));
                    d
                })
                .collect(),
        );
    };
    // Kept or dropped, by feature gate.
    add("valid", parity_slice, &|_| {});
    add("consumes-counters", parity_slice, &|s| {
        s["spec"]["devices"][0]["consumesCounters"] =
            json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "8Gi"}}}]);
    });
    add("counters", parity_counters, &|_| {});
    add("taints", parity_slice, &|s| {
        s["spec"]["devices"][0]["taints"] =
            json!([{"key": "gpuslice.dev/unhealthy", "value": "xid", "effect": "NoSchedule"}]);
    });
    add("consumable", parity_slice, &|s| {
        s["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
        s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = json!({"default": "1Gi",
            "validRange": {"min": "256Mi", "max": "8Gi", "step": "256Mi"}});
    });
    add("binding-conditions", parity_slice, &|s| {
        s["spec"]["devices"][0]["bindingConditions"] = json!(["ready"]);
        s["spec"]["devices"][0]["bindingFailureConditions"] = json!(["failed"]);
        s["spec"]["devices"][0]["bindsToNode"] = json!(true);
    });
    add("per-device-node", parity_slice, &|s| {
        s["spec"].as_object_mut().unwrap().remove("nodeName");
        s["spec"]["perDeviceNodeSelection"] = json!(true);
        s["spec"]["devices"][0]["nodeName"] = json!("parity-node");
    });
    add("counters-and-devices", parity_slice, &|s| {
        s["spec"]["sharedCounters"] = parity_counters("x")["spec"]["sharedCounters"].clone();
    });
    // Metadata, driver, pool.
    add("bad-name", |_| parity_slice("Bad_Name"), &|_| {});
    add("no-driver", parity_slice, &|s| {
        s["spec"]["driver"] = json!("")
    });
    add("long-driver", parity_slice, &|s| {
        s["spec"]["driver"] = json!(format!("{}.dev", "a".repeat(62)))
    });
    add("bad-driver", parity_slice, &|s| {
        s["spec"]["driver"] = json!("not_a.domain")
    });
    add("no-pool", parity_slice, &|s| {
        s["spec"]["pool"]["name"] = json!("")
    });
    add("bad-pool", parity_slice, &|s| {
        s["spec"]["pool"]["name"] = json!("a/Bad_Part")
    });
    add("zero-slices", parity_slice, &|s| {
        s["spec"]["pool"]["resourceSliceCount"] = json!(0)
    });
    add("negative-generation", parity_slice, &|s| {
        s["spec"]["pool"]["generation"] = json!(-1)
    });
    // Node selection.
    add("empty-node-name", parity_slice, &|s| {
        s["spec"]["nodeName"] = json!("")
    });
    add("no-node-selection", parity_slice, &|s| {
        s["spec"].as_object_mut().unwrap().remove("nodeName");
    });
    add("two-node-selections", parity_slice, &|s| {
        s["spec"]["allNodes"] = json!(true)
    });
    add("all-nodes-false", parity_slice, &|s| {
        s["spec"]["allNodes"] = json!(false)
    });
    add("per-device-false", parity_slice, &|s| {
        s["spec"]["perDeviceNodeSelection"] = json!(false)
    });
    // Sizes.
    add("129-devices", parity_slice, &|s| {
        n_devices(s, 129, json!({}))
    });
    add("65-tainted-devices", parity_slice, &|s| {
        n_devices(
            s,
            65,
            json!({"taints": [{"key": "k", "effect": "NoSchedule"}]}),
        )
    });
    add("65-consuming-devices", parity_slice, &|s| {
        n_devices(
            s,
            65,
            json!({"consumesCounters": [{"counterSet": "gpu-0",
                                         "counters": {"memory": {"value": "1Gi"}}}]}),
        )
    });
    add("9-counter-sets", parity_counters, &|s| {
        s["spec"]["sharedCounters"] = Value::Array(
            (0..9)
                .map(|i| json!({"name": format!("gpu-{i}"), "counters": {"c": {"value": "1"}}}))
                .collect(),
        );
    });
    add("33-counters", parity_counters, &|s| {
        let counters: serde_json::Map<String, Value> = (0..33)
            .map(|i| (format!("c{i}"), json!({"value": "1"})))
            .collect();
        s["spec"]["sharedCounters"][0]["counters"] = Value::Object(counters);
    });
    add("bad-counter-set", parity_counters, &|s| {
        s["spec"]["sharedCounters"][0]["name"] = json!("Bad_Set")
    });
    add("duplicate-counter-set", parity_counters, &|s| {
        let set = s["spec"]["sharedCounters"][0].clone();
        s["spec"]["sharedCounters"]
            .as_array_mut()
            .unwrap()
            .push(set);
    });
    add("no-counters", parity_counters, &|s| {
        s["spec"]["sharedCounters"][0]["counters"] = json!({})
    });
    add("bad-counter", parity_counters, &|s| {
        s["spec"]["sharedCounters"][0]["counters"] = json!({"Bad_Counter": {"value": "1"}})
    });
    // Devices.
    add("bad-device", parity_slice, &|s| {
        s["spec"]["devices"][0]["name"] = json!("Bad_Device")
    });
    add("duplicate-device", parity_slice, &|s| {
        let d = s["spec"]["devices"][0].clone();
        s["spec"]["devices"].as_array_mut().unwrap().push(d);
    });
    add("33-attributes", parity_slice, &|s| {
        let attributes: serde_json::Map<String, Value> = (0..32)
            .map(|i| (format!("a{i}"), json!({"int": i})))
            .collect();
        s["spec"]["devices"][0]["attributes"] = Value::Object(attributes);
    });
    add("bad-attribute-name", parity_slice, &|s| {
        s["spec"]["devices"][0]["attributes"] = json!({"bad/na/me": {"int": 1}})
    });
    add("two-values", parity_slice, &|s| {
        s["spec"]["devices"][0]["attributes"] = json!({"a": {"int": 1, "string": "x"}})
    });
    add("no-value", parity_slice, &|s| {
        s["spec"]["devices"][0]["attributes"] = json!({"a": {}})
    });
    add("long-string", parity_slice, &|s| {
        s["spec"]["devices"][0]["attributes"] = json!({"a": {"string": "x".repeat(65)}})
    });
    add("not-semver", parity_slice, &|s| {
        s["spec"]["devices"][0]["attributes"] = json!({"a": {"version": "1.0"}})
    });
    add("bad-capacity-name", parity_slice, &|s| {
        s["spec"]["devices"][0]["capacity"] = json!({"Bad_Cap": {"value": "1"}})
    });
    add("policy-without-multiple", parity_slice, &|s| {
        s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] =
            json!({"default": "1Gi", "validValues": ["1Gi"]});
    });
    let policy = |p: Value| {
        move |s: &mut Value| {
            s["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
            s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = p.clone();
        }
    };
    add(
        "values-and-range",
        parity_slice,
        &policy(json!({"default": "1Gi",
        "validValues": ["1Gi"], "validRange": {"min": "1Gi"}})),
    );
    add(
        "range-without-default",
        parity_slice,
        &policy(json!({"validRange": {"min": "1Gi"}})),
    );
    add(
        "min-over-capacity",
        parity_slice,
        &policy(json!({"default": "16Gi",
        "validRange": {"min": "16Gi"}})),
    );
    add(
        "off-step",
        parity_slice,
        &policy(json!({"default": "1000Mi",
        "validRange": {"min": "256Mi", "max": "8Gi", "step": "256Mi"}})),
    );
    add(
        "max-over-capacity",
        parity_slice,
        &policy(json!({"default": "1Gi",
        "validRange": {"min": "1Gi", "max": "9Gi"}})),
    );
    add(
        "values-without-default",
        parity_slice,
        &policy(json!({"validValues": ["1Gi"]})),
    );
    // Taints.
    add("5-taints", parity_slice, &|s| {
        s["spec"]["devices"][0]["taints"] = Value::Array(
            (0..5)
                .map(|i| json!({"key": format!("k{i}"), "effect": "NoSchedule"}))
                .collect(),
        );
    });
    add("taint-without-key", parity_slice, &|s| {
        s["spec"]["devices"][0]["taints"] = json!([{"key": "", "effect": "NoSchedule"}])
    });
    add("bad-effect", parity_slice, &|s| {
        s["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "Sometimes"}])
    });
    add("no-effect", parity_slice, &|s| {
        s["spec"]["devices"][0]["taints"] = json!([{"key": "k"}])
    });
    add("effect-none", parity_slice, &|s| {
        s["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "None"}])
    });
    // Counter consumption.
    let consumes =
        |c: Value| move |s: &mut Value| s["spec"]["devices"][0]["consumesCounters"] = c.clone();
    let one = |set: &str| json!({"counterSet": set, "counters": {"memory": {"value": "1Gi"}}});
    add(
        "3-consumptions",
        parity_slice,
        &consumes(json!([one("a"), one("b"), one("c")])),
    );
    add(
        "consumption-without-set",
        parity_slice,
        &consumes(json!([one("")])),
    );
    add(
        "consumption-twice",
        parity_slice,
        &consumes(json!([one("a"), one("a")])),
    );
    add(
        "consumption-empty",
        parity_slice,
        &consumes(json!([{"counterSet": "a", "counters": {}}])),
    );
    add(
        "consumption-33",
        parity_slice,
        &consumes(json!([{"counterSet": "a",
        "counters": (0..33).map(|i| (format!("c{i}"), json!({"value": "1"})))
            .collect::<serde_json::Map<String, Value>>()}])),
    );
    // Updates.
    let mut update = |name: &'static str, edit: &dyn Fn(&mut Value)| {
        let old = parity_slice(name);
        let mut slice = old.clone();
        edit(&mut slice);
        cases.push(Case {
            name,
            slice,
            old: Some(old),
        });
    };
    update("same", &|_| {});
    update("pool-renamed", &|s| {
        s["spec"]["pool"]["name"] = json!("other")
    });
    update("driver-changed", &|s| {
        s["spec"]["driver"] = json!("other.dev")
    });
    update("node-changed", &|s| {
        s["spec"]["nodeName"] = json!("other-node")
    });
    update("stale-version", &|s| {
        s["metadata"]["resourceVersion"] = json!("1")
    });
    cases
}

/// `method path` with a JSON body; the status and the JSON answer.
async fn call(client: &Client, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
        .unwrap();
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .unwrap();
    let code = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await.unwrap();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// What one server answers to `case`: the status, then either the stored spec or the
/// Status's message and its causes as "reason field" lines, sorted.
async fn verdict(client: &Client, case: &Case) -> String {
    let (code, answer) = match &case.old {
        None => {
            call(
                client,
                "POST",
                &format!("{SLICES}?dryRun=All"),
                Some(&case.slice),
            )
            .await
        }
        Some(old) => {
            let (created, stored) = call(client, "POST", SLICES, Some(old)).await;
            assert_eq!(created, 201, "{}: {stored}", case.name);
            let mut slice = case.slice.clone();
            if slice["metadata"]["resourceVersion"].is_null() {
                slice["metadata"]["resourceVersion"] =
                    stored["metadata"]["resourceVersion"].clone();
            }
            let path = format!("{SLICES}/{}?dryRun=All", case.name);
            let answer = call(client, "PUT", &path, Some(&slice)).await;
            call(client, "DELETE", &format!("{SLICES}/{}", case.name), None).await;
            answer
        }
    };
    if code < 300 {
        // The time a taint was added differs between two servers by nature.
        let mut spec = answer["spec"].clone();
        for device in spec["devices"].as_array_mut().into_iter().flatten() {
            for taint in device["taints"].as_array_mut().into_iter().flatten() {
                if taint["timeAdded"].is_string() {
                    taint["timeAdded"] = json!("(set)");
                }
            }
        }
        return format!("{code}\n{spec:#}");
    }
    let mut causes: Vec<String> = answer["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {}",
                c["reason"].as_str().unwrap_or(""),
                c["field"].as_str().unwrap_or("")
            )
        })
        .collect();
    causes.sort();
    format!(
        "{code} {}\n{}\n{}",
        answer["reason"].as_str().unwrap_or(""),
        answer["message"].as_str().unwrap_or(""),
        causes.join("\n")
    )
}

/// Each rule of the fake API server held against the real one: the same ResourceSlice
/// request to both, on the release's default gates and with the DRA gates the driver's
/// models need turned off, must get the same verdict (status, stored spec or message and
/// causes). The fake plays the real server's release and gates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_api_server_gives_the_real_servers_verdicts() {
    for release in releases() {
        let minor = release.minor_number();
        let defaults = common::rules::Cluster::defaults(minor);
        let gates_off = common::rules::Cluster {
            partitionable_devices: false,
            consumable_capacity: false,
            device_taints: false,
            binding_conditions: false,
            ..defaults
        };
        // Each gate the release knows (DRADeviceTaintRules is 1.35's; a gate a release does
        // not know stops its API server).
        let mut off = vec![
            "DRAPartitionableDevices",
            "DRAConsumableCapacity",
            "DRADeviceTaints",
            "DRADeviceBindingConditions",
        ];
        if minor >= 35 {
            off.push("DRADeviceTaintRules");
        }
        let off: Vec<String> = off.iter().map(|gate| format!("{gate}=false")).collect();
        let mut mismatches = Vec::new();
        for (cluster, gates) in [(defaults, String::new()), (gates_off, off.join(","))] {
            let mut plane = ControlPlane::start_api_server(&release, &gates).await;
            let real = plane.admin().await;
            let fake = common::api::FakeApi::start_as(cluster);
            let fake_client = fake.client();
            for case in parity_cases() {
                let (want, got) = (
                    verdict(&real, &case).await,
                    verdict(&fake_client, &case).await,
                );
                if want != got {
                    mismatches.push(format!(
                        "{} with gates [{gates}]:\n--- real {}\n{want}\n--- fake\n{got}",
                        case.name, release.version
                    ));
                }
            }
            plane.stop().expect("the API server stops cleanly");
        }
        assert!(
            mismatches.is_empty(),
            "{} verdicts differ:\n{}",
            mismatches.len(),
            mismatches.join("\n\n")
        );
    }
}

/// On an API server whose DRA gates are off (what 1.34 and 1.35 have by default), the driver
/// asked for products sees the server drop their counters, says so once (one Warning Event
/// on its Node), and publishes the gate-free units model instead
/// (`--on-missing-gate=units`), as its ServiceAccount with the shipped ClusterRole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_products_gate_the_driver_publishes_units_and_says_so_once() {
    for release in releases() {
        let mut plane =
            ControlPlane::start_api_server(&release, "DRAPartitionableDevices=false").await;
        let admin = plane.admin().await;
        plane.kubectl(&[
            "apply",
            "--server-side",
            "-f",
            k8s_dir().join("dra-driver.yaml").to_str().unwrap(),
        ]);
        let node = TestNode::start(
            &plane,
            "gpu-node-1",
            "products",
            &["--on-missing-gate=units"],
        )
        .await;
        let slices = node.await_published(&admin, 4).await;
        for device in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            assert!(device.name.starts_with("gpu-0-unit-"), "{}", device.name);
        }
        // Three republish periods later (three more lists of its slices), still one Event.
        let lists = |plane: &ControlPlane| {
            plane
                .audit_events(DRIVER_USER)
                .iter()
                .filter(|e| e["verb"] == "list" && e["objectRef"]["resource"] == "resourceslices")
                .count()
        };
        let before = lists(&plane);
        wait_for("three more republish periods", WAIT, || async {
            (lists(&plane) >= before + 3).then_some(())
        })
        .await;
        let events: Vec<String> = events_of(&admin, "default", "gpu-node-1")
            .await
            .into_iter()
            .filter(|e| e.starts_with("DRAModel"))
            .collect();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].contains("DRAPartitionableDevices"), "{events:?}");
        let used = driver_rights_used(&plane);
        assert!(
            used.contains(&("create".to_string(), "events".to_string())),
            "{used:?}"
        );
        drop(node);
        plane.stop().expect("the API server stops cleanly");
    }
}
