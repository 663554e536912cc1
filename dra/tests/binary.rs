//! The `gpuslice-dra` binary itself, as the DaemonSet runs it: configured from flags and a
//! kubeconfig (here pointing at the fake API server), GPUs from the fake GPU's NVML. It
//! publishes the node's ResourceSlice, registers and serves on its sockets, prepares a claim,
//! and on SIGTERM exits cleanly, removing its sockets; two copies sharing a state directory,
//! one of them killed at random points, never prepare more than the card. Needs
//! `cargo build -p fakegpu-nvml`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::api::FakeApi;
use common::*;
use gpuslice_common::config::{parse_limit_file, DeviceSelector};
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

/// A kubeconfig for `api` and a stand-in shim (both files) in `scratch`.
fn node_files(scratch: &Scratch, api: &FakeApi) -> (PathBuf, PathBuf) {
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
    (kubeconfig, lib)
}

/// One `gpuslice-dra` process on the fake V100, its state and CDI directories in `scratch`,
/// its sockets under `scratch/<copy>/`.
struct Plugin {
    child: Child,
    dra_socket: PathBuf,
    registration_socket: PathBuf,
}

impl Plugin {
    fn spawn(scratch: &Scratch, api: &FakeApi, copy: &str, args: &[&str], stderr: Stdio) -> Plugin {
        let (kubeconfig, lib) = node_files(scratch, api);
        let plugin_dir = scratch.path().join(copy).join("plugins/gpuslice.dev");
        let registry_dir = scratch.path().join(copy).join("plugins_registry");
        let child = Command::new(env!("CARGO_BIN_EXE_gpuslice-dra"))
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
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("FAKEGPU_STATE", scratch.path().join("fakegpu.state"))
            .env("FAKEGPU_DEVICES", "v100")
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        Plugin {
            child,
            dra_socket: plugin_dir.join("dra.sock"),
            registration_socket: registry_dir.join("gpuslice.dev-reg.sock"),
        }
    }

    /// Waits until the DRA socket accepts (a socket file left by a killed copy does not).
    async fn serving(self) -> Plugin {
        let socket = self.dra_socket.clone();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::net::UnixStream::connect(&socket).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {}",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID; no memory is involved.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Plugin {
    /// A failed test leaves no copy running (one that exited already is only reaped).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_publishes_registers_prepares_and_stops_on_sigterm() {
    let scratch = Scratch::new("binary");
    let api = FakeApi::start();
    let mut plugin = Plugin::spawn(
        &scratch,
        &api,
        "one",
        &["--nvidia-cdi", "always"],
        Stdio::inherit(),
    );

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

    let (registration_socket, dra_socket) = (
        plugin.registration_socket.clone(),
        plugin.dra_socket.clone(),
    );
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

    plugin.signal(libc::SIGTERM);
    let status = plugin.child.wait().unwrap();
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
    let log = scratch.path().join("stderr");
    let mut plugin = Plugin::spawn(
        &scratch,
        &api,
        "one",
        &["--model", "products", "--on-missing-gate", "units"],
        std::fs::File::create(&log).unwrap().into(),
    );
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
    plugin.signal(libc::SIGTERM);
    assert!(plugin.child.wait().unwrap().success());
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

/// Memory and compute promised on the card `uuid` by the claims prepared in `state` (those
/// with a checkpoint), read from their limit files; and how many claim directories have no
/// checkpoint (a prepare cut short).
fn promised_on_disk(state: &Path, uuid: &str) -> (u64, u32, usize) {
    let (mut memory, mut compute, mut unfinished) = (0, 0, 0);
    for entry in std::fs::read_dir(state.join("claims"))
        .into_iter()
        .flatten()
    {
        let dir = entry.unwrap().path();
        if !dir.join("checkpoint.json").exists() {
            unfinished += 1;
            continue;
        }
        let limits = dir.join("limits.json");
        let config = parse_limit_file(&limits, &std::fs::read_to_string(&limits).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", limits.display()));
        for device in config.devices {
            if device.selector == DeviceSelector::Uuid(uuid.to_string()) {
                memory += device.memory_limit.unwrap();
                compute += device.compute_percent.unwrap_or(100);
            }
        }
    }
    (memory, compute, unfinished)
}

/// A small deterministic generator (the seed is printed: a run's choices can be replayed,
/// though not its timing).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

type DraClient = dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

async fn prepare(
    mut client: DraClient,
    claims: Vec<dra_v1::Claim>,
) -> Result<dra_v1::NodePrepareResourcesResponse, tonic::Status> {
    client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims })
        .await
        .map(tonic::Response::into_inner)
}

/// Two plugin processes share one state directory (a rolling update with surge): each is
/// asked, at the same time, to prepare claims for products of the one card that add up to far
/// more than it has, and one of them is SIGKILLed at a random point, then started again.
/// After every round the limit files on disk promise at most the card's memory and 100% of
/// its compute, and the survivor answered every claim (a refusal for what does not fit, never
/// a wait on the dead copy's lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_sharing_a_state_dir_never_prepare_more_than_the_card() {
    const ROUNDS: usize = 40;
    const PER_COPY: usize = 8;
    let products = [
        "gpu-0-100",
        "gpu-0-50-a",
        "gpu-0-50-b",
        "gpu-0-25-a",
        "gpu-0-25-b",
        "gpu-0-25-c",
        "gpu-0-25-d",
    ];
    let seed = std::env::var("GPUSLICE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("seed {seed} (GPUSLICE_TEST_SEED replays it)");
    let mut rng = Rng(seed);
    let scratch = Scratch::new("two-copies");
    let api = FakeApi::start();
    let card = fakegpu::spec::preset("v100", 0).unwrap();
    let quiet = || Stdio::null();
    let mut copies = [
        Plugin::spawn(&scratch, &api, "a", &[], quiet())
            .serving()
            .await,
        Plugin::spawn(&scratch, &api, "b", &[], quiet())
            .serving()
            .await,
    ];
    let (mut most, mut cut_short, mut over) = (0, 0, Vec::new());
    for round in 0..ROUNDS {
        let mut asked: [Vec<dra_v1::Claim>; 2] = Default::default();
        for (copy, claims) in asked.iter_mut().enumerate() {
            for i in 0..PER_COPY {
                let uid = format!("c0de{round:04x}-{copy:04x}-4000-8000-{i:012x}");
                let name = format!("r{round}-{copy}-{i}");
                let product = products[rng.below(products.len() as u64) as usize];
                api.put_claim(&claim("team-a", &name, &uid, &[ours("gpu", product)]));
                claims.push(dra_v1::Claim {
                    namespace: "team-a".into(),
                    name,
                    uid,
                });
            }
        }
        let victim = rng.below(2) as usize;
        let survivor = 1 - victim;
        // Both connected first, so that the two calls start together.
        let mut clients = Vec::new();
        for copy in &copies {
            clients.push(DraClient::new(channel(copy.dra_socket.clone()).await));
        }
        let calls: Vec<_> = clients
            .into_iter()
            .zip(asked.iter().cloned())
            .map(|(client, claims)| tokio::spawn(prepare(client, claims)))
            .collect();
        // Anywhere in the two calls (which take 20 to 300 ms here), or after them.
        tokio::time::sleep(Duration::from_millis(rng.below(250))).await;
        copies[victim].signal(libc::SIGKILL);
        let [a, b]: [_; 2] = calls.try_into().unwrap();
        let (first, second) = tokio::join!(a, b);
        let answer = (if survivor == 0 { first } else { second })
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the survivor failed: {e}"));
        assert_eq!(answer.claims.len(), PER_COPY, "round {round}");
        for (uid, result) in &answer.claims {
            assert!(
                result.error.is_empty() || result.error.contains("more than the card has"),
                "round {round}: claim {uid}: {}",
                result.error
            );
        }
        copies[victim].child.wait().unwrap();

        let (memory, compute, unfinished) =
            promised_on_disk(&scratch.path().join("state"), &card.uuid);
        if memory > 32 * GIB || compute > 100 {
            over.push(format!(
                "round {round}: {} GiB and {compute}%",
                memory as f64 / GIB as f64
            ));
        }
        most = most.max(compute);
        cut_short += usize::from(unfinished > 0);

        // The survivor unprepares everything, also what the dead copy left half-written.
        let uids: Vec<String> = asked.iter().flatten().map(|c| c.uid.clone()).collect();
        let done = DraClient::new(channel(copies[survivor].dra_socket.clone()).await)
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: asked.iter().flatten().cloned().collect(),
            })
            .await
            .unwrap()
            .into_inner();
        for uid in &uids {
            assert_eq!(done.claims[uid].error, "", "round {round}: unprepare {uid}");
        }
        assert_eq!(
            std::fs::read_dir(scratch.path().join("state/claims"))
                .unwrap()
                .count(),
            0
        );
        let name = if victim == 0 { "a" } else { "b" };
        copies[victim] = Plugin::spawn(&scratch, &api, name, &[], quiet())
            .serving()
            .await;
    }
    eprintln!(
        "{ROUNDS} rounds: at most {most}% of the card prepared; {cut_short} kills left a \
         prepare cut short"
    );
    assert!(
        over.is_empty(),
        "more than the 32 GiB card prepared (seed {seed}): {over:?}"
    );
    for copy in &mut copies {
        copy.signal(libc::SIGTERM);
        assert!(copy.child.wait().unwrap().success());
    }
}
