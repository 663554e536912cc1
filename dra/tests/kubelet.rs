//! The kubelet's side, over the real unix sockets: a tonic client generated from the same
//! protos registers (GetInfo), prepares and unprepares through both DRA versions, across a
//! plugin restart, and concurrently. The claims come from the fake API server, as the driver
//! reads them from a real one.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::api::FakeApi;
use common::*;
use gpuslice_dra::plugin::{serve, Driver};
use gpuslice_dra::prepare::Preparer;
use gpuslice_dra::proto::{dra_v1, dra_v1beta1, pluginregistration as reg};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running plugin: its sockets, and how to stop it.
struct Plugin {
    dra_socket: PathBuf,
    registration_socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), String>>,
}

impl Plugin {
    async fn start(scratch: &Scratch, api: &FakeApi) -> Plugin {
        let preparer = Arc::new(Preparer::new(settings(scratch, true), gpus()));
        let driver = Arc::new(Driver {
            preparer,
            client: api.client(),
        });
        let dra_socket = scratch.path().join("plugins/gpuslice.dev/dra.sock");
        let registration_socket = scratch
            .path()
            .join("plugins_registry/gpuslice.dev-reg.sock");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = {
            let (dra, registration) = (dra_socket.clone(), registration_socket.clone());
            tokio::spawn(async move {
                serve(driver, "gpuslice.dev", &dra, &registration, async {
                    let _ = stopped.await;
                })
                .await
            })
        };
        for socket in [&dra_socket, &registration_socket] {
            wait_for_socket(socket).await;
        }
        Plugin {
            dra_socket,
            registration_socket,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
        assert!(!self.dra_socket.exists() && !self.registration_socket.exists());
    }

    async fn v1(&self) -> dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        dra_v1::dra_plugin_client::DraPluginClient::new(channel(self.dra_socket.clone()).await)
    }

    async fn v1beta1(
        &self,
    ) -> dra_v1beta1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel(self.dra_socket.clone()).await)
    }
}

/// Waits until something accepts connections on `path` (the plugin binds on its first poll).
async fn wait_for_socket(path: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::UnixStream::connect(path).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never accepted",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn v1_claim(namespace: &str, name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn uid(n: usize) -> String {
    format!("7c1e0000-0000-4000-8000-{n:012}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_registers_the_plugin() {
    let scratch = Scratch::new("register");
    let api = FakeApi::start();
    let plugin = Plugin::start(&scratch, &api).await;
    let mut client = reg::registration_client::RegistrationClient::new(
        channel(plugin.registration_socket.clone()).await,
    );
    let info = client
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpuslice.dev");
    assert_eq!(Path::new(&info.endpoint), plugin.dra_socket);
    assert_eq!(
        info.supported_versions,
        vec!["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_and_unprepare_through_both_versions_and_a_restart() {
    let scratch = Scratch::new("kubelet");
    let api = FakeApi::start();
    let id = uid(1);
    api.put_claim(&claim(
        "team-a",
        "quarter",
        &id,
        &[ours("gpu", "gpu-0-25-b")],
    ));
    let plugin = Plugin::start(&scratch, &api).await;

    let response = plugin
        .v1()
        .await
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![v1_claim("team-a", "quarter", &id)],
        })
        .await
        .unwrap()
        .into_inner();
    let prepared = &response.claims[&id];
    assert_eq!(prepared.error, "");
    assert_eq!(
        prepared.devices,
        vec![dra_v1::Device {
            request_names: vec!["gpu".into()],
            pool_name: NODE.into(),
            device_name: "gpu-0-25-b".into(),
            cdi_device_ids: vec![
                format!("gpuslice.dev/claim={id}"),
                format!("nvidia.com/gpu={UUID0}")
            ],
        }]
    );
    // The driver read the claim from the API server, by namespace and name.
    assert!(api.requests().iter().any(|r| r.method == "GET"
        && r.path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/quarter"));
    let spec = scratch
        .path()
        .join(format!("cdi/gpuslice.dev-claim-{id}.json"));
    assert!(spec.exists());

    // An older kubelet asks the same through v1beta1: the same answer.
    let beta = plugin
        .v1beta1()
        .await
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: "team-a".into(),
                name: "quarter".into(),
                uid: id.clone(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        beta.claims[&id].devices[0].cdi_device_ids,
        prepared.devices[0].cdi_device_ids
    );

    // The plugin restarts (a DaemonSet rollout) between prepare and unprepare.
    plugin.stop().await;
    let plugin = Plugin::start(&scratch, &api).await;
    let response = plugin
        .v1()
        .await
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim("team-a", "quarter", &id)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims[&id].error, "");
    assert!(!spec.exists());
    assert!(!scratch.path().join("state/claims").join(&id).exists());
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_prepares_each_get_their_own_slice_and_one_claim_one_slice() {
    let scratch = Scratch::new("concurrent");
    let api = FakeApi::start();
    let products = [
        "gpu-0-25-a",
        "gpu-0-25-b",
        "gpu-0-25-c",
        "gpu-0-25-d",
        "gpu-1-25-a",
        "gpu-1-25-b",
    ];
    for (n, product) in products.iter().enumerate() {
        api.put_claim(&claim(
            "team-a",
            &format!("c{n}"),
            &uid(n),
            &[ours("gpu", product)],
        ));
    }
    let plugin = Plugin::start(&scratch, &api).await;
    let mut calls = Vec::new();
    // Each claim by its own call, and claim 0 by three more at once (pods sharing it).
    for n in (0..products.len()).chain([0, 0, 0]) {
        let mut client = plugin.v1().await;
        calls.push(tokio::spawn(async move {
            let response = client
                .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                    claims: vec![v1_claim("team-a", &format!("c{n}"), &uid(n))],
                })
                .await
                .unwrap()
                .into_inner();
            (n, response.claims[&uid(n)].clone())
        }));
    }
    let mut answers = std::collections::BTreeMap::new();
    for call in calls {
        let (n, answer) = call.await.unwrap();
        assert_eq!(answer.error, "", "claim {n}");
        assert_eq!(
            answer.devices[0].cdi_device_ids[0],
            format!("gpuslice.dev/claim={}", uid(n))
        );
        if let Some(earlier) = answers.insert(n, answer.clone()) {
            assert_eq!(earlier, answer, "claim {n} answered differently");
        }
    }
    assert_eq!(answers.len(), products.len());
    let specs = std::fs::read_dir(scratch.path().join("cdi"))
        .unwrap()
        .count();
    assert_eq!(specs, products.len(), "one CDI spec per claim");

    // One batch with a good claim, a claim of another node's device and a claim the API
    // server does not have: per-claim answers, the good one prepared.
    let mut foreign = ours("gpu", "gpu-0-25-a");
    foreign.pool = "gpu-node-9";
    api.put_claim(&claim("team-b", "elsewhere", &uid(100), &[foreign]));
    api.put_claim(&claim(
        "team-b",
        "good",
        &uid(101),
        &[ours("gpu", "gpu-1-50-a")],
    ));
    let response = plugin
        .v1()
        .await
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![
                v1_claim("team-b", "elsewhere", &uid(100)),
                v1_claim("team-b", "good", &uid(101)),
                v1_claim("team-b", "gone", &uid(102)),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims.len(), 3);
    assert!(
        response.claims[&uid(100)].error.contains("another node"),
        "{:?}",
        response.claims[&uid(100)]
    );
    assert!(response.claims[&uid(100)].devices.is_empty());
    assert_eq!(response.claims[&uid(101)].error, "");
    assert!(
        response.claims[&uid(102)]
            .error
            .contains("cannot read it from the API server"),
        "{:?}",
        response.claims[&uid(102)]
    );

    // Unprepare everything in one call.
    let all: Vec<_> = (0..products.len())
        .map(|n| v1_claim("team-a", &format!("c{n}"), &uid(n)))
        .collect();
    let response = plugin
        .v1()
        .await
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: all })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims.len(), products.len());
    assert!(
        response.claims.values().all(|c| c.error.is_empty()),
        "{response:?}"
    );
    let left: Vec<_> = std::fs::read_dir(scratch.path().join("cdi"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from(format!(
            "gpuslice.dev-claim-{}.json",
            uid(101)
        ))]
    );
    plugin.stop().await;
}

async fn prepare(
    plugin: &Plugin,
    namespace: &str,
    name: &str,
    id: &str,
) -> dra_v1::NodePrepareResourceResponse {
    plugin
        .v1()
        .await
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![v1_claim(namespace, name, id)],
        })
        .await
        .unwrap()
        .into_inner()
        .claims[id]
        .clone()
}

/// The scheduler (a dropped counter, a stale slice, a bug) allocated the whole card and a
/// quarter of it to two claims, and a third product too: the driver prepares the first and
/// refuses the others with an error naming the card and the claims, across a restart, until
/// the first is unprepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_never_promises_a_card_twice_whatever_the_scheduler_did() {
    let scratch = Scratch::new("guard");
    let api = FakeApi::start();
    api.put_claim(&claim(
        "team-a",
        "whole",
        &uid(1),
        &[ours("gpu", "gpu-0-100")],
    ));
    api.put_claim(&claim(
        "team-b",
        "quarter",
        &uid(2),
        &[ours("gpu", "gpu-0-25-a")],
    ));
    api.put_claim(&claim(
        "team-c",
        "half",
        &uid(3),
        &[ours("gpu", "gpu-0-50-b")],
    ));
    // Another card is not this card's business.
    api.put_claim(&claim(
        "team-d",
        "other",
        &uid(4),
        &[ours("gpu", "gpu-1-100")],
    ));
    let plugin = Plugin::start(&scratch, &api).await;
    assert_eq!(prepare(&plugin, "team-a", "whole", &uid(1)).await.error, "");
    let refused = prepare(&plugin, "team-b", "quarter", &uid(2)).await;
    assert!(refused.devices.is_empty());
    for part in [
        "team-b/quarter",
        &uid(2),
        "not prepared",
        "GPU 0",
        UUID0,
        "32Gi",
        "team-a/whole",
        &uid(1),
        "40Gi and 125%",
    ] {
        assert!(
            refused.error.contains(part),
            "{:?} lacks {part:?}",
            refused.error
        );
    }
    assert!(!scratch.path().join("state/claims").join(uid(2)).exists());
    assert_eq!(prepare(&plugin, "team-d", "other", &uid(4)).await.error, "");

    // A restart: the guard knows the prepared claims from their files.
    plugin.stop().await;
    let plugin = Plugin::start(&scratch, &api).await;
    let refused = prepare(&plugin, "team-c", "half", &uid(3)).await;
    assert!(refused.error.contains("team-a/whole"), "{}", refused.error);
    assert!(refused.error.contains("48Gi and 150%"), "{}", refused.error);

    // Once the whole card is given back, the others fit (75% together).
    let response = plugin
        .v1()
        .await
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim("team-a", "whole", &uid(1))],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims[&uid(1)].error, "");
    assert_eq!(
        prepare(&plugin, "team-b", "quarter", &uid(2)).await.error,
        ""
    );
    assert_eq!(prepare(&plugin, "team-c", "half", &uid(3)).await.error, "");
    plugin.stop().await;
}

/// Many claims of one card prepared at once: what is prepared never adds up to more than the
/// card, and exactly the ones that fit are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_prepares_of_one_card_never_add_up_to_more_than_the_card() {
    let scratch = Scratch::new("guard-race");
    let api = FakeApi::start();
    let products = [
        "gpu-0-100",
        "gpu-0-50-a",
        "gpu-0-50-b",
        "gpu-0-25-a",
        "gpu-0-25-b",
        "gpu-0-25-c",
    ];
    for (n, product) in products.iter().enumerate() {
        api.put_claim(&claim(
            "ns",
            &format!("c{n}"),
            &uid(n),
            &[ours("gpu", product)],
        ));
    }
    let plugin = Plugin::start(&scratch, &api).await;
    let mut calls = Vec::new();
    for n in 0..products.len() {
        let mut client = plugin.v1().await;
        calls.push(tokio::spawn(async move {
            let response = client
                .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                    claims: vec![v1_claim("ns", &format!("c{n}"), &uid(n))],
                })
                .await
                .unwrap()
                .into_inner();
            (n, response.claims[&uid(n)].error.is_empty())
        }));
    }
    let mut share = 0;
    for call in calls {
        let (n, ok) = call.await.unwrap();
        if ok {
            share += [100, 50, 50, 25, 25, 25][n];
        }
    }
    assert!((75..=100).contains(&share), "{share}% of the card prepared");
    // The truth on disk: the limit files of the prepared claims.
    let preparer = Preparer::new(settings(&scratch, true), gpus());
    let on_disk: u32 = preparer
        .ledger()
        .unwrap()
        .iter()
        .filter_map(|(_, by_uuid)| by_uuid.get(UUID0))
        .map(|s| s.compute)
        .sum();
    assert_eq!(on_disk, share);
    plugin.stop().await;
}
