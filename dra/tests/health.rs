//! Device health end to end with the fake GPU's NVML (cuda-tests/fakegpu-nvml) and its fault
//! knob `FAKEGPU_NVML_FAULTS`: an Xid or ECC event or a GPU fallen off the bus makes the GPU
//! unhealthy; its devices are tainted in the published slices where the API server keeps
//! taints (1.36) and left out where it drops them (1.35 without the gate); the kubelet's
//! resource-health stream (`v1alpha1.DRAResourceHealth/NodeWatchResources`) reports them.
//! One test per binary: it sets the fake's environment for the whole process. Needs
//! `cargo build -p fakegpu-nvml`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::api::{Cluster, FakeApi};
use common::scheduler::Pool;
use common::*;
use gpuslice_dra::health::{self, Monitor, Unhealthy};
use gpuslice_dra::inventory;
use gpuslice_dra::model::Model;
use gpuslice_dra::plugin::{serve_with_health, Driver, HealthService};
use gpuslice_dra::prepare::Preparer;
use gpuslice_dra::proto::dra_health_v1alpha1 as proto;
use gpuslice_dra::publish::{OnMissingGate, Publisher, TAINT_KEY};
use nvml_wrapper::Nvml;
use serde_json::{json, Value};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_gpus_are_tainted_withheld_and_reported_to_the_kubelet() {
    let scratch = Scratch::new("health");
    let faults = scratch.path().join("faults");
    std::fs::write(&faults, "").unwrap();
    // The only test of this binary: no other thread reads the environment meanwhile.
    std::env::set_var("FAKEGPU_STATE", scratch.path().join("fakegpu.state"));
    std::env::set_var("FAKEGPU_DEVICES", "v100,v100");
    std::env::set_var("FAKEGPU_NVML_FAULTS", &faults);
    let gpus = inventory::from_nvml(Some(&fake_nvml())).unwrap();

    // The monitor, through nvml-wrapper's calls on the fake's NVML.
    {
        let nvml = Nvml::builder()
            .lib_path(fake_nvml().as_os_str())
            .init()
            .unwrap();
        let mut monitor = Monitor::new(&nvml, &gpus);
        assert_eq!(monitor.poll(), Unhealthy::new());
        // An application's own fault (Xid 13) leaves the card healthy; Xid 79 does not.
        std::fs::write(&faults, "xid 1 13\nxid 1 79\n").unwrap();
        assert_eq!(monitor.poll(), Unhealthy::from([(1, "xid-79".to_string())]));
        std::fs::write(&faults, "xid 1 13\nxid 1 79\nlost 0\n").unwrap();
        assert_eq!(
            monitor.poll(),
            Unhealthy::from([(0, "gpu-lost".into()), (1, "xid-79".into())])
        );
        // The lost GPU is found again; the Xid stays until a restart.
        std::fs::write(&faults, "xid 1 13\nxid 1 79\n").unwrap();
        assert_eq!(monitor.poll(), Unhealthy::from([(1, "xid-79".to_string())]));
    }
    let unhealthy = Unhealthy::from([(1, "xid-79".to_string())]);

    // 1.36 keeps taints: GPU 1's devices carry a NoSchedule taint, GPU 0's none.
    let api = FakeApi::start_as(Cluster::V1_36);
    let mut p = Publisher::new(
        "gpuslice.dev",
        NODE,
        Model::Products,
        OnMissingGate::Withdraw,
    );
    p.publish_and_report(api.client(), &gpus, &unhealthy)
        .await
        .unwrap();
    let pool = Pool::of(&api.slices(), "gpuslice.dev", NODE).unwrap();
    for (name, device) in &pool.devices {
        let taints = &device["taints"];
        if name.starts_with("gpu-1-") {
            // The server stamps `timeAdded` (upstream's defaulting); the driver sets the rest.
            let mut taints = taints.clone();
            for taint in taints.as_array_mut().into_iter().flatten() {
                let stamped = taint.as_object_mut().and_then(|t| t.remove("timeAdded"));
                assert!(
                    stamped.as_ref().is_some_and(Value::is_string),
                    "{name}: {stamped:?}"
                );
            }
            assert_eq!(
                taints,
                json!([{"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}]),
                "{name}"
            );
        } else {
            assert!(taints.is_null(), "{name}: {taints}");
        }
    }
    // Healthy again after a restart of the driver: the taints go.
    p.publish_and_report(api.client(), &gpus, &Unhealthy::new())
        .await
        .unwrap();
    let pool = Pool::of(&api.slices(), "gpuslice.dev", NODE).unwrap();
    assert!(pool.devices.values().all(|d| d["taints"].is_null()));

    // 1.35 without DRADeviceTaints drops taints: the unhealthy GPU's devices are left out.
    let api = FakeApi::start_as(Cluster::V1_35);
    let mut p = Publisher::new("gpuslice.dev", NODE, Model::Units, OnMissingGate::Withdraw);
    p.publish_and_report(api.client(), &gpus, &unhealthy)
        .await
        .unwrap();
    let pool = Pool::of(&api.slices(), "gpuslice.dev", NODE).unwrap();
    let names: Vec<&String> = pool.devices.keys().collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("gpu-0-")), "{names:?}");
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0]["message"]
        .as_str()
        .unwrap()
        .contains("DRADeviceTaints"));
    // No rewrite every period.
    api.clear_requests();
    p.publish_and_report(api.client(), &gpus, &unhealthy)
        .await
        .unwrap();
    assert!(api.writes().is_empty(), "{:?}", api.writes());

    // The kubelet's resource-health stream, fed by the health thread.
    std::fs::write(&faults, "").unwrap();
    let rx = health::spawn(Some(&fake_nvml()), gpus.clone(), Duration::from_millis(10)).unwrap();
    let service = HealthService::new(NODE, &gpus, rx);
    let driver = Arc::new(Driver {
        preparer: Arc::new(Preparer::new(settings(&scratch, false), gpus.clone())),
        client: api.client(),
    });
    let dra = scratch.path().join("plugins/gpuslice.dev/dra.sock");
    let registration = scratch
        .path()
        .join("plugins_registry/gpuslice.dev-reg.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (dra, registration) = (dra.clone(), registration.clone());
        tokio::spawn(async move {
            serve_with_health(
                driver,
                Some(service),
                "gpuslice.dev",
                &dra,
                &registration,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::UnixStream::connect(&dra).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client =
        proto::dra_resource_health_client::DraResourceHealthClient::new(channel(dra.clone()).await);
    let mut stream = client
        .node_watch_resources(proto::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let health_of = |response: &proto::NodeWatchResourcesResponse, name: &str| {
        let device = response
            .devices
            .iter()
            .find(|d| d.device.as_ref().unwrap().device_name == name)
            .unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(device.device.as_ref().unwrap().pool_name, NODE);
        assert!(device.last_updated_time > 1_700_000_000);
        proto::HealthStatus::try_from(device.health).unwrap()
    };
    let first = stream.message().await.unwrap().unwrap();
    // Every device of every model of both GPUs: 7 + 1 + 4 each.
    assert_eq!(first.devices.len(), 24);
    assert_eq!(
        health_of(&first, "gpu-0-25-a"),
        proto::HealthStatus::Healthy
    );
    // A double-bit ECC error on GPU 0 is streamed without asking.
    std::fs::write(&faults, "dbe 0\n").unwrap();
    let next = tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .expect("a health update")
        .unwrap()
        .unwrap();
    for name in ["gpu-0-25-a", "gpu-0-100", "gpu-0", "gpu-0-unit-d"] {
        assert_eq!(
            health_of(&next, name),
            proto::HealthStatus::Unhealthy,
            "{name}"
        );
    }
    assert_eq!(health_of(&next, "gpu-1-50-b"), proto::HealthStatus::Healthy);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
