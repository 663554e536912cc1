//! Publishing against the fake API server playing each Kubernetes version and gate set
//! (common/rules.rs: upstream's strategy and validation): what the driver sends and what the
//! server stored, the slice layout per version, what the scheduler can allocate from it, and
//! what happens where a model's feature gate is off, from the start or switched off at run
//! time (nothing over-committable is stored, ever; one notice and one Event; no rewrite and no
//! probe every period).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::api::{Cluster, FakeApi};
use common::scheduler::Pool;
use common::*;
use gpuslice_dra::model::Model;
use gpuslice_dra::publish::{
    desired_slices, Clock, Layout, Log, OnMissingGate, Published, Publisher, Recheck, Standing,
};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{json, Value};

const SLICE: &str = "gpu-node-1-gpuslice.dev";
const COUNTERS: &str = "gpu-node-1-gpuslice.dev-counters";

fn none() -> BTreeMap<u32, String> {
    BTreeMap::new()
}

fn device<'a>(slice: &'a Value, name: &str) -> &'a Value {
    slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name} in {slice}"))
}

/// The writes that changed something (dry runs are probes, not writes).
fn real_writes(api: &FakeApi) -> Vec<common::api::Recorded> {
    api.writes()
        .into_iter()
        .filter(|w| !w.query.contains("dryRun=All"))
        .filter(|w| !w.path.ends_with("/events"))
        .collect()
}

async fn publish(api: &FakeApi, p: &mut Publisher) -> Published {
    p.publish_and_report(api.client(), &gpus(), &none())
        .await
        .unwrap()
}

async fn publish_via(client: &kube::Client, p: &mut Publisher) -> Published {
    p.publish_and_report(client.clone(), &gpus(), &none())
        .await
        .unwrap()
}

/// A clock the test moves.
struct TestClock(Arc<Mutex<Instant>>);

impl TestClock {
    fn new() -> TestClock {
        TestClock(Arc::new(Mutex::new(Instant::now())))
    }

    fn clock(&self) -> Clock {
        let now = self.0.clone();
        Arc::new(move || *now.lock().unwrap())
    }

    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

/// A log that keeps the publisher's lines.
fn kept_log() -> (Log, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    (
        Arc::new(move |line: &str| kept.lock().unwrap().push(line.to_string())),
        lines,
    )
}

/// Why the slices a server holds would let a card be promised more than once, if they would:
/// a product that consumes no counters or a capacity device without its sharing fields (the
/// model's fields dropped), or more than 100% of a card allocatable at once by the scheduler.
fn over_committable(slices: &BTreeMap<String, Value>) -> Option<String> {
    for (slice, value) in slices {
        for device in value["spec"]["devices"].as_array().into_iter().flatten() {
            let name = device["name"].as_str().unwrap();
            let bare = match device["attributes"]["model"]["string"].as_str() {
                Some("products") => device.get("consumesCounters").is_none(),
                Some("capacity") => {
                    device["allowMultipleAllocations"] != true
                        || device["capacity"]["memory"].get("requestPolicy").is_none()
                }
                _ => false,
            };
            if bare {
                return Some(format!("{slice}: device {name} without its model's fields"));
            }
        }
    }
    // An incomplete pool allocates nothing.
    let pool = Pool::of(slices, "gpuslice.dev", NODE).ok()?;
    for gpu in 0..2 {
        let (mut taken, mut share) = (Vec::<&str>::new(), 0);
        for (name, device) in &pool.devices {
            let Some(s) = device["attributes"]["share"]["int"].as_i64() else {
                continue;
            };
            if !name.starts_with(&format!("gpu-{gpu}-")) {
                continue;
            }
            let claims: Vec<[&str; 1]> =
                taken.iter().chain([&name.as_str()]).map(|d| [*d]).collect();
            let claims: Vec<&[&str]> = claims.iter().map(|c| &c[..]).collect();
            if pool.allocate(&claims).is_ok() {
                taken.push(name);
                share += s;
            }
        }
        if share > 100 {
            return Some(format!(
                "GPU {gpu}: {share}% allocatable at once: {taken:?}"
            ));
        }
    }
    None
}

#[tokio::test]
async fn products_publish_in_the_layout_each_version_requires_and_cannot_over_commit() {
    for (cluster, layout) in [
        (Cluster::V1_34_GATES, Layout::Combined),
        (Cluster::V1_35_GATES, Layout::Split),
        (Cluster::V1_36, Layout::Split),
    ] {
        let api = FakeApi::start_as(cluster);
        let mut p = Publisher::new(
            "gpuslice.dev",
            NODE,
            Model::Products,
            OnMissingGate::Withdraw,
        );
        assert_eq!(
            publish(&api, &mut p).await,
            Published::Created { generation: 1 },
            "{cluster:?}"
        );
        assert_eq!(p.layout(), Some(layout), "{cluster:?}");
        assert_eq!(p.standing(), &Standing::AsAsked);
        assert!(api.events().is_empty());
        // What the server stored is exactly what the driver computes, nothing dropped.
        let stored = api.slices();
        let want = desired_slices(
            "gpuslice.dev",
            NODE,
            &gpus(),
            Model::Products,
            layout,
            1,
            &none(),
            false,
        );
        assert_eq!(stored.len(), want.len(), "{cluster:?}: {:?}", stored.keys());
        for (name, spec) in &want {
            let slice: ResourceSlice = serde_json::from_value(stored[name].clone()).unwrap();
            assert_eq!(&slice.spec, spec, "{cluster:?} {name}");
            assert_eq!(
                stored[name]["metadata"]["ownerReferences"],
                json!([{"apiVersion": "v1", "kind": "Node", "name": NODE,
                        "uid": common::api::node_uid(NODE), "controller": true}])
            );
        }
        let (devices_slice, counters_slice) = match layout {
            Layout::Combined => (&stored[SLICE], &stored[SLICE]),
            Layout::Split => {
                assert!(stored[SLICE]["spec"].get("sharedCounters").is_none());
                assert!(stored[COUNTERS]["spec"].get("devices").is_none());
                assert_eq!(stored[SLICE]["spec"]["pool"]["resourceSliceCount"], 2);
                (&stored[SLICE], &stored[COUNTERS])
            }
        };
        assert_eq!(
            counters_slice["spec"]["sharedCounters"],
            json!([
                {"name": "gpu-0", "counters": {"memory": {"value": "32Gi"}, "compute": {"value": "100"}}},
                {"name": "gpu-1", "counters": {"memory": {"value": "32Gi"}, "compute": {"value": "100"}}},
            ])
        );
        assert_eq!(
            devices_slice["spec"]["devices"].as_array().unwrap().len(),
            14
        );
        let quarter = device(devices_slice, "gpu-1-25-d");
        assert_eq!(
            quarter["attributes"],
            json!({
                "uuid": {"string": UUID1}, "index": {"int": 1}, "share": {"int": 25},
                "model": {"string": "products"},
                "productName": {"string": "Tesla V100-PCIE-32GB"},
                "computeCapability": {"version": "7.0.0"},
                "driverVersion": {"string": "580.65.06"},
                "cudaDriverVersion": {"version": "13.0.0"},
            })
        );
        assert_eq!(
            quarter["consumesCounters"],
            json!([{"counterSet": "gpu-1", "counters": {"memory": {"value": "8Gi"}, "compute": {"value": "25"}}}])
        );
        // The scheduler's view: the whole card, or its parts, never both.
        let pool = Pool::of(&stored, "gpuslice.dev", NODE).unwrap();
        let (n, why) = pool
            .allocate(&[&["gpu-0-100"], &["gpu-0-25-a"]])
            .unwrap_err();
        assert_eq!(n, 1, "{why}");
        assert!(why.contains("exhausted"), "{why}");
        pool.allocate(&[
            &["gpu-0-50-a"],
            &["gpu-0-25-a"],
            &["gpu-0-25-b"],
            &["gpu-1-100"],
        ])
        .unwrap();
        assert!(pool
            .allocate(&[&["gpu-0-50-a"], &["gpu-0-50-b"], &["gpu-0-25-c"]])
            .is_err());

        // Nothing changed: nothing is written.
        api.clear_requests();
        assert_eq!(
            publish(&api, &mut p).await,
            Published::Unchanged { generation: 1 }
        );
        assert!(api.writes().is_empty(), "{:?}", api.writes());
    }
}

#[tokio::test]
async fn capacity_publishes_on_each_version_with_its_gate() {
    for cluster in [Cluster::V1_34_GATES, Cluster::V1_35_GATES, Cluster::V1_36] {
        let api = FakeApi::start_as(cluster);
        let mut p = Publisher::new(
            "gpuslice.dev",
            NODE,
            Model::Capacity,
            OnMissingGate::Withdraw,
        );
        assert_eq!(
            publish(&api, &mut p).await,
            Published::Created { generation: 1 }
        );
        let stored = api.slices();
        assert_eq!(
            stored.keys().collect::<Vec<_>>(),
            vec![SLICE],
            "{cluster:?}"
        );
        let gpu = device(&stored[SLICE], "gpu-0");
        assert_eq!(gpu["allowMultipleAllocations"], true);
        assert_eq!(
            gpu["capacity"],
            json!({
                "memory": {"value": "32Gi", "requestPolicy": {"default": "1Gi",
                           "validRange": {"min": "256Mi", "max": "32Gi", "step": "256Mi"}}},
                "compute": {"value": "100", "requestPolicy": {"default": "10",
                            "validRange": {"min": "1", "max": "100", "step": "1"}}},
            })
        );
        assert!(gpu["attributes"].get("share").is_none());
        api.clear_requests();
        assert_eq!(
            publish(&api, &mut p).await,
            Published::Unchanged { generation: 1 }
        );
        assert!(api.writes().is_empty());
    }
}

#[tokio::test]
async fn without_the_gate_no_over_committable_slice_is_published_and_it_is_said_once() {
    const PERIOD: Duration = Duration::from_secs(60);
    for (cluster, model, gate) in [
        (Cluster::V1_34, Model::Products, "DRAPartitionableDevices"),
        (Cluster::V1_35, Model::Products, "DRAPartitionableDevices"),
        (Cluster::V1_34, Model::Capacity, "DRAConsumableCapacity"),
        (Cluster::V1_35, Model::Capacity, "DRAConsumableCapacity"),
    ] {
        let api = FakeApi::start_as(cluster);
        // One client (one connection) for the whole run, as the driver has.
        let client = api.client();
        let clock = TestClock::new();
        let (log, lines) = kept_log();
        let mut p = Publisher::new("gpuslice.dev", NODE, model, OnMissingGate::Withdraw)
            .with_recheck(Recheck::for_period(PERIOD))
            .with_clock(clock.clock())
            .with_log(log);
        // A slice of an earlier run (or another driver version) of the same model.
        for (name, spec) in desired_slices(
            "gpuslice.dev",
            NODE,
            &gpus(),
            model,
            Layout::Split,
            3,
            &none(),
            false,
        ) {
            let mut value = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                   "metadata": {"name": name}});
            value["spec"] = serde_json::to_value(spec).unwrap();
            api.put_slice(value);
        }
        api.clear_requests();
        assert_eq!(
            publish_via(&client, &mut p).await,
            Published::Withdrawn,
            "{cluster:?} {model:?}"
        );
        assert!(api.slices().is_empty(), "{:?}", api.slices().keys());
        // Nothing but deletions was written: the model never reached the store.
        assert!(
            real_writes(&api).iter().all(|w| w.method == "DELETE"),
            "{:?}",
            real_writes(&api)
        );
        match p.standing() {
            Standing::Degraded {
                gate: g,
                now,
                dropped,
            } => {
                assert_eq!((*g, *now), (gate, None));
                assert!(!dropped.is_empty());
            }
            other => panic!("{other:?}"),
        }
        // One Event on the Node naming the gate, and two log lines: the finding, the outcome.
        let events = api.events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["involvedObject"]["kind"], "Node");
        assert_eq!(
            events[0]["involvedObject"]["uid"],
            common::api::node_uid(NODE)
        );
        assert_eq!(events[0]["type"], "Warning");
        let message = events[0]["message"].as_str().unwrap();
        assert!(
            message.contains(gate) && message.contains("over-committable"),
            "{message}"
        );
        assert_eq!(
            lines.lock().unwrap().len(),
            2,
            "{:?}",
            lines.lock().unwrap()
        );

        // A hundred periods with the gate still off: each reads the Node and lists the slices
        // (to restore a deleted one), nothing else; the gate is probed again (dry runs) after
        // 1, 2, 4 and 8 periods, then every 15 minutes; nothing more is said.
        let mut probed = Vec::new();
        for period in 1..=100 {
            clock.advance(PERIOD);
            api.clear_requests();
            assert_eq!(publish_via(&client, &mut p).await, Published::Withdrawn);
            let requests = api.requests();
            let (dry, other): (Vec<_>, Vec<_>) = requests
                .iter()
                .partition(|r| r.query.contains("dryRun=All"));
            assert_eq!(
                other
                    .iter()
                    .map(|r| (r.method.as_str(), r.path.as_str()))
                    .collect::<Vec<_>>(),
                vec![
                    ("GET", "/api/v1/nodes/gpu-node-1"),
                    ("GET", "/apis/resource.k8s.io/v1/resourceslices")
                ],
                "period {period}"
            );
            if !dry.is_empty() {
                probed.push(period);
            }
        }
        assert_eq!(
            probed,
            [1, 3, 7, 15, 30, 45, 60, 75, 90],
            "{cluster:?} {model:?}"
        );
        assert_eq!(
            lines.lock().unwrap().len(),
            2,
            "{:?}",
            lines.lock().unwrap()
        );
        assert_eq!(api.events().len(), 1);

        // The gate is turned on: seen at the next probe (period 105), and said once.
        api.set_cluster(cluster.with_alpha_gates());
        for _ in 101..105 {
            clock.advance(PERIOD);
            assert_eq!(publish_via(&client, &mut p).await, Published::Withdrawn);
        }
        clock.advance(PERIOD);
        assert!(matches!(
            publish_via(&client, &mut p).await,
            Published::Created { .. }
        ));
        assert_eq!(p.standing(), &Standing::AsAsked);
        assert_eq!(api.events().len(), 2);
        assert!(api.events()[1]["message"]
            .as_str()
            .unwrap()
            .contains("now keeps"));
        let lines = lines.lock().unwrap().clone();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[3].starts_with("ResourceSlices: Created"), "{lines:?}");
    }
}

/// A gate switched off at run time (an API server restarted with other flags): updates keep
/// the fields stored objects use, and once the slices are deleted and made again the driver
/// learns from the dry run of the write, before anything is stored. Every state the server
/// passes through is checked, not only the last.
#[tokio::test]
async fn a_gate_switched_off_at_run_time_never_stores_an_over_committable_slice() {
    for (on, off) in [
        (Cluster::V1_34_GATES, Cluster::V1_34),
        (Cluster::V1_35_GATES, Cluster::V1_35),
    ] {
        for model in [Model::Products, Model::Capacity] {
            for fallback in [OnMissingGate::Withdraw, OnMissingGate::Units] {
                let case = format!("{on:?} -> {off:?} {model:?} {fallback:?}");
                let api = FakeApi::start_as(on);
                let mut p = Publisher::new("gpuslice.dev", NODE, model, fallback);
                assert_eq!(
                    publish(&api, &mut p).await,
                    Published::Created { generation: 1 },
                    "{case}"
                );
                api.set_cluster(off);
                // GPU 1 is gone: the update keeps the model's fields (the strategy's ratchet).
                let one = &gpus()[..1];
                let outcome = p
                    .publish_and_report(api.client(), one, &none())
                    .await
                    .unwrap();
                assert_eq!(outcome, Published::Replaced { generation: 2 }, "{case}");
                assert_eq!(p.standing(), &Standing::AsAsked, "{case}");
                // The slices are deleted (by an operator, the node's garbage collection) and
                // made again.
                let slices: kube::Api<ResourceSlice> = kube::Api::all(api.client());
                for name in api.slices().keys() {
                    slices.delete(name, &Default::default()).await.unwrap();
                }
                let outcome = p
                    .publish_and_report(api.client(), one, &none())
                    .await
                    .unwrap();
                let fell_back = match fallback {
                    OnMissingGate::Withdraw => {
                        assert_eq!(outcome, Published::Withdrawn, "{case}");
                        None
                    }
                    OnMissingGate::Units => {
                        assert_eq!(outcome, Published::Created { generation: 1 }, "{case}");
                        Some(Model::Units)
                    }
                };
                assert!(
                    matches!(p.standing(), Standing::Degraded { now, .. } if *now == fell_back),
                    "{case}: {:?}",
                    p.standing()
                );
                assert_eq!(api.events().len(), 1, "{case}");
                let history = api.history();
                for (n, state) in history.iter().enumerate() {
                    if let Some(why) = over_committable(state) {
                        panic!("{case}: state {n} of {}: {why}", history.len());
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn without_the_gate_the_operator_may_fall_back_to_units() {
    for cluster in [Cluster::V1_34, Cluster::V1_35] {
        let api = FakeApi::start_as(cluster);
        let mut p = Publisher::new("gpuslice.dev", NODE, Model::Products, OnMissingGate::Units);
        assert_eq!(
            publish(&api, &mut p).await,
            Published::Created { generation: 1 }
        );
        let stored = api.slices();
        assert_eq!(stored.keys().collect::<Vec<_>>(), vec![SLICE]);
        let units = stored[SLICE]["spec"]["devices"].as_array().unwrap();
        assert_eq!(units.len(), 8);
        assert_eq!(
            device(&stored[SLICE], "gpu-1-unit-c")["attributes"]["model"],
            json!({"string": "units"})
        );
        assert_eq!(
            device(&stored[SLICE], "gpu-1-unit-c")["capacity"],
            json!({"memory": {"value": "8Gi"}, "compute": {"value": "25"}})
        );
        let message = api.events()[0]["message"].as_str().unwrap().to_string();
        assert!(message.contains("units model instead"), "{message}");
        // What the scheduler can do with units: four of a card, never five.
        let pool = Pool::of(&stored, "gpuslice.dev", NODE).unwrap();
        pool.allocate(&[
            &["gpu-0-unit-a", "gpu-0-unit-b"],
            &["gpu-0-unit-c", "gpu-0-unit-d"],
        ])
        .unwrap();
        assert!(pool
            .allocate(&[
                &[
                    "gpu-0-unit-a",
                    "gpu-0-unit-b",
                    "gpu-0-unit-c",
                    "gpu-0-unit-d"
                ],
                &["gpu-0-unit-a"]
            ])
            .is_err());
        for _ in 0..3 {
            api.clear_requests();
            assert_eq!(
                publish(&api, &mut p).await,
                Published::Unchanged { generation: 1 }
            );
            assert!(real_writes(&api).is_empty(), "{:?}", real_writes(&api));
        }
        assert_eq!(api.events().len(), 1);
    }
}

#[tokio::test]
async fn a_write_judged_otherwise_than_its_dry_run_is_read_back_and_replaced_at_once() {
    // Two API server replicas behind one address, their flags changed one at a time: the
    // one that answers dry runs has the gate, the one that answers writes has not.
    let api = FakeApi::start_as(Cluster::V1_35_GATES);
    let mut p = Publisher::new("gpuslice.dev", NODE, Model::Products, OnMissingGate::Units);
    publish(&api, &mut p).await;
    assert_eq!(api.slices().len(), 2);
    api.set_cluster_for_writes(Some(Cluster::V1_35));
    // An update keeps what the stored object already uses (the strategy's ratchet) ...
    let one = &gpus()[..1];
    p.publish_and_report(api.client(), one, &none())
        .await
        .unwrap();
    assert!(api.slices()[COUNTERS]["spec"]["sharedCounters"].is_array());
    assert_eq!(p.standing(), &Standing::AsAsked);
    // ... but the slices are deleted and made again: the dry runs say the fields are kept,
    // the writes drop them. The driver reads back what was stored and replaces it within the
    // same publication.
    let slices: kube::Api<ResourceSlice> = kube::Api::all(api.client());
    for name in [SLICE, COUNTERS] {
        slices.delete(name, &Default::default()).await.unwrap();
    }
    let before = api.history().len();
    let outcome = p
        .publish_and_report(api.client(), one, &none())
        .await
        .unwrap();
    assert!(matches!(outcome, Published::Replaced { .. }), "{outcome:?}");
    let stored = api.slices();
    assert_eq!(stored.keys().collect::<Vec<_>>(), vec![SLICE]);
    assert!(stored[SLICE]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["name"].as_str().unwrap().contains("-unit-")));
    assert!(matches!(
        p.standing(),
        Standing::Degraded {
            now: Some(Model::Units),
            ..
        }
    ));
    assert_eq!(api.events().len(), 1);
    // The window no client can close (the server answered the dry run and the write
    // differently): the bare products were stored from their write to the driver's next
    // request, and no longer.
    let states = &api.history()[before..];
    let bare: Vec<usize> = (0..states.len())
        .filter(|n| over_committable(&states[*n]).is_some())
        .collect();
    assert_eq!(bare, [1], "{} states", states.len());
}

#[tokio::test]
async fn the_fake_refuses_the_layouts_upstream_refuses() {
    let client_error = |e: kube::Error| match e {
        kube::Error::Api(e) => (e.code, e.reason, e.message),
        other => panic!("{other}"),
    };
    let create = |api: &FakeApi, layout: Layout| {
        let api = api.clone();
        async move {
            let slices: kube::Api<ResourceSlice> = kube::Api::all(api.client());
            for (name, spec) in desired_slices(
                "gpuslice.dev",
                NODE,
                &gpus(),
                Model::Products,
                layout,
                1,
                &none(),
                false,
            ) {
                let slice = ResourceSlice {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name),
                        ..Default::default()
                    },
                    spec,
                };
                slices.create(&Default::default(), &slice).await?;
            }
            Ok::<_, kube::Error>(())
        }
    };
    // 1.35 with the gate: counters and devices in one slice are refused.
    let api = FakeApi::start_as(Cluster::V1_35_GATES);
    let (code, reason, message) = client_error(create(&api, Layout::Combined).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        format!("ResourceSlice.resource.k8s.io \"{SLICE}\" is invalid: spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed")
    );
    // 1.34 with the gate: a device's counter set must be in its own slice.
    let api = FakeApi::start_as(Cluster::V1_34_GATES);
    let (code, _, message) = client_error(create(&api, Layout::Split).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"gpu-0\": must reference a counterSet defined in the ResourceSlice sharedCounters"),
        "{message}"
    );
    // Without the gate the same slice is accepted, its counters dropped.
    let api = FakeApi::start_as(Cluster::V1_35);
    create(&api, Layout::Combined).await.unwrap();
    let stored = &api.slices()[SLICE];
    assert!(stored["spec"].get("sharedCounters").is_none());
    assert!(device(stored, "gpu-0-100")
        .get("consumesCounters")
        .is_none());
    // ... and the scheduler then over-commits the card: what the driver must never publish.
    Pool::of(&api.slices(), "gpuslice.dev", NODE)
        .unwrap()
        .allocate(&[&["gpu-0-100"], &["gpu-0-25-a"], &["gpu-0-50-a"]])
        .unwrap();
}

#[tokio::test]
async fn a_changed_node_replaces_its_slices_with_a_new_generation_and_drops_stale_ones() {
    let api = FakeApi::start();
    let mut p = Publisher::new(
        "gpuslice.dev",
        NODE,
        Model::Products,
        OnMissingGate::Withdraw,
    );
    publish(&api, &mut p).await;
    let stored_version = api.slices()[SLICE]["metadata"]["resourceVersion"].clone();
    let other = |name: &str, driver: &str, node: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": name},
               "spec": {"driver": driver, "nodeName": node,
                        "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
                        "devices": []}})
    };
    api.put_slice(other("old-name", "gpuslice.dev", NODE));
    api.put_slice(other(
        "gpu-node-2-gpuslice.dev",
        "gpuslice.dev",
        "gpu-node-2",
    ));
    api.put_slice(other("gpu-node-1-nvidia", "gpu.nvidia.com", NODE));
    api.clear_requests();

    // GPU 1 is gone.
    let one = &gpus()[..1];
    let outcome = p
        .publish_and_report(api.client(), one, &none())
        .await
        .unwrap();
    // Above every generation of this pool (the stale slice had 3).
    assert_eq!(outcome, Published::Replaced { generation: 4 });
    let writes = real_writes(&api);
    assert_eq!(
        writes
            .iter()
            .map(|w| (w.method.as_str(), w.path.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (
                "PUT",
                "/apis/resource.k8s.io/v1/resourceslices/gpu-node-1-gpuslice.dev-counters"
            ),
            (
                "PUT",
                "/apis/resource.k8s.io/v1/resourceslices/gpu-node-1-gpuslice.dev"
            ),
            ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/old-name"),
        ]
    );
    assert_eq!(
        writes[1].body.as_ref().unwrap()["metadata"]["resourceVersion"],
        stored_version
    );
    let left: Vec<_> = api.slices().keys().cloned().collect();
    assert_eq!(
        left,
        vec![
            SLICE,
            COUNTERS,
            "gpu-node-1-nvidia",
            "gpu-node-2-gpuslice.dev"
        ]
    );
    assert_eq!(
        api.slices()[SLICE]["spec"]["devices"]
            .as_array()
            .unwrap()
            .len(),
        7
    );
    // The server counts spec changes in metadata.generation.
    assert_eq!(api.slices()[SLICE]["metadata"]["generation"], 2);
}

#[tokio::test]
async fn the_slices_follow_their_node_object_and_without_one_nothing_is_written() {
    let api = FakeApi::start();
    let mut p = Publisher::new("gpuslice.dev", NODE, Model::Units, OnMissingGate::Withdraw);
    publish(&api, &mut p).await;
    let mut orphan = api.slices()[SLICE].clone();
    orphan["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    api.put_slice(orphan);
    api.clear_requests();
    assert_eq!(
        publish(&api, &mut p).await,
        Published::Replaced { generation: 2 }
    );
    let owner = &api.slices()[SLICE]["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], common::api::node_uid(NODE), "{owner}");

    api.put_node(NODE, "uid-of-the-new-node");
    assert_eq!(
        publish(&api, &mut p).await,
        Published::Replaced { generation: 3 }
    );
    let owner = &api.slices()[SLICE]["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], "uid-of-the-new-node", "{owner}");

    api.remove_node(NODE);
    api.clear_requests();
    let error = p
        .publish_and_report(api.client(), &gpus(), &none())
        .await
        .unwrap_err();
    assert!(error.contains("reading Node gpu-node-1"), "{error}");
    assert!(api.writes().is_empty(), "{:?}", api.writes());
}

#[tokio::test]
async fn many_gpus_go_in_slices_within_every_versions_limits() {
    let many: Vec<_> = (0..20u32)
        .map(|i| {
            let mut gpu = gpus()[0].clone();
            gpu.index = i;
            gpu.uuid = format!("GPU-8a5d1c2e-0000-4000-8000-{i:012}");
            gpu
        })
        .collect();
    for cluster in [Cluster::V1_34_GATES, Cluster::V1_35_GATES, Cluster::V1_36] {
        for model in [Model::Products, Model::Capacity, Model::Units] {
            let api = FakeApi::start_as(cluster);
            let mut p = Publisher::new("gpuslice.dev", NODE, model, OnMissingGate::Withdraw);
            p.publish_and_report(api.client(), &many, &none())
                .await
                .unwrap_or_else(|e| panic!("{cluster:?} {model:?}: {e}"));
            let pool = Pool::of(&api.slices(), "gpuslice.dev", NODE).unwrap();
            let per_gpu = match model {
                Model::Products => 7,
                Model::Capacity => 1,
                Model::Units => 4,
            };
            assert_eq!(pool.devices.len(), 20 * per_gpu, "{cluster:?} {model:?}");
        }
    }
}

/// The fake's rules on their own, against what upstream's strategy and validation say.
#[test]
fn the_fake_drops_and_refuses_as_upstream_does() {
    use common::rules::{drop_disabled_fields, validate_resource_slice};
    let device = json!({
        "name": "d",
        "taints": [{"key": "k", "effect": "NoSchedule"}],
        "consumesCounters": [{"counterSet": "s", "counters": {"c": {"value": "1"}}}],
        "allowMultipleAllocations": true,
        "capacity": {"memory": {"value": "1Gi", "requestPolicy": {"default": "1Gi"}}},
        "bindingConditions": ["ready"],
        "bindsToNode": true,
    });
    let spec = json!({"driver": "gpuslice.dev", "nodeName": "n",
                      "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                      "sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}],
                      "perDeviceNodeSelection": null,
                      "devices": [device]});
    // 1.35 with every gate off: all of the gated fields go.
    let mut dropped = spec.clone();
    drop_disabled_fields(&Cluster::V1_35, &mut dropped, None);
    assert!(dropped.get("sharedCounters").is_none());
    let d = &dropped["devices"][0];
    for field in [
        "taints",
        "consumesCounters",
        "allowMultipleAllocations",
        "bindingConditions",
        "bindsToNode",
    ] {
        assert!(d.get(field).is_none(), "{field} kept: {d}");
    }
    assert!(d["capacity"]["memory"].get("requestPolicy").is_none());
    assert_eq!(d["capacity"]["memory"]["value"], "1Gi");
    // The ratchet: an update keeps what the stored object uses.
    let mut update = spec.clone();
    drop_disabled_fields(&Cluster::V1_35, &mut update, Some(&spec));
    assert_eq!(update, spec);
    // 1.36 defaults keep them all.
    let mut kept = spec.clone();
    drop_disabled_fields(&Cluster::V1_36, &mut kept, None);
    assert_eq!(kept, spec);

    let slice = |spec: Value| json!({"metadata": {"name": "s1"}, "spec": spec});
    let texts = |cluster: &Cluster, spec: Value| -> Vec<String> {
        validate_resource_slice(cluster, &slice(spec), None)
            .iter()
            .map(|e| e.text())
            .collect()
    };
    // A request policy without allowMultipleAllocations is forbidden.
    let mut forbidden = kept.clone();
    forbidden["devices"][0]
        .as_object_mut()
        .unwrap()
        .remove("allowMultipleAllocations");
    forbidden.as_object_mut().unwrap().remove("sharedCounters");
    forbidden["devices"][0]
        .as_object_mut()
        .unwrap()
        .remove("consumesCounters");
    assert!(texts(&Cluster::V1_36, forbidden.clone()).contains(
        &"spec.devices[0].capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations must be true".to_string()
    ));
    // 65 devices that consume counters: 1.35 allows 64, 1.34 128.
    let mut many = json!({"driver": "gpuslice.dev", "nodeName": "n",
                          "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                          "sharedCounters": [{"name": "s", "counters": {"c": {"value": "100"}}}],
                          "devices": []});
    for i in 0..65 {
        many["devices"].as_array_mut().unwrap().push(json!({
            "name": format!("d{i}"),
            "consumesCounters": [{"counterSet": "s", "counters": {"c": {"value": "1"}}}]}));
    }
    assert!(texts(&Cluster::V1_34_GATES, many.clone()).is_empty());
    let mut devices_only = many.clone();
    devices_only
        .as_object_mut()
        .unwrap()
        .remove("sharedCounters");
    assert_eq!(
        texts(&Cluster::V1_36, devices_only),
        vec!["spec.devices: Too many: 65: must have at most 64 items".to_string()]
    );
    // Names, pool and node selection.
    let bad = json!({"driver": "GPU_slice", "pool": {"name": "", "generation": -1, "resourceSliceCount": 0},
                     "devices": [{"name": "Bad_Name"}, {"name": "Bad_Name"}]});
    let errors = texts(&Cluster::V1_36, bad);
    for expected in [
        "spec.pool.name: Required value",
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        "spec.pool.generation: Invalid value: -1: must be greater than or equal to zero",
        "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        "spec.devices[1].name: Duplicate value: \"Bad_Name\"",
    ] {
        assert!(errors.iter().any(|e| e == expected), "{expected:?} not in {errors:#?}");
    }
    assert!(errors.iter().any(|e| e.starts_with(
        "spec.devices[0].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label"
    )));
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("spec.driver: Invalid value: \"gpu_slice\"")),
        "{errors:#?}"
    );
    // Over 32 counters in all sets on 1.34.
    let mut counters = json!({"driver": "gpuslice.dev", "nodeName": "n",
                              "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                              "sharedCounters": []});
    for i in 0..17 {
        counters["sharedCounters"]
            .as_array_mut()
            .unwrap()
            .push(json!({
            "name": format!("gpu-{i}"),
            "counters": {"memory": {"value": "1Gi"}, "compute": {"value": "100"}}}));
    }
    assert_eq!(
        texts(&Cluster::V1_34_GATES, counters.clone()),
        vec!["spec.sharedCounters: Invalid value: 34: the total number of shared counters must not exceed 32".to_string()]
    );
    assert_eq!(
        texts(&Cluster::V1_35_GATES, counters),
        vec!["spec.sharedCounters: Too many: 17: must have at most 8 items".to_string()]
    );
}

/// Replicas that disagree keep the driver degraded without a word: a probe that sees the gate
/// back, contradicted by the write that follows, is neither announced nor undone aloud, and
/// the next probe waits longer.
#[tokio::test]
async fn a_probe_contradicted_by_the_write_says_nothing_and_waits_longer() {
    const PERIOD: Duration = Duration::from_secs(60);
    let api = FakeApi::start_as(Cluster::V1_35);
    let client = api.client();
    let clock = TestClock::new();
    let (log, lines) = kept_log();
    let mut p = Publisher::new("gpuslice.dev", NODE, Model::Products, OnMissingGate::Units)
        .with_recheck(Recheck::for_period(PERIOD))
        .with_clock(clock.clock())
        .with_log(log);
    assert_eq!(
        publish_via(&client, &mut p).await,
        Published::Created { generation: 1 }
    );
    assert_eq!(api.events().len(), 1);
    // The replica answering dry runs now has the gate; the one answering writes has not.
    api.set_cluster(Cluster::V1_35_GATES);
    api.set_cluster_for_writes(Some(Cluster::V1_35));
    let mut probes = Vec::new();
    for period in 1..=20 {
        clock.advance(PERIOD);
        api.clear_requests();
        publish_via(&client, &mut p).await;
        if api
            .requests()
            .iter()
            .any(|r| r.path.ends_with("resourceslices") && r.query.contains("dryRun=All"))
        {
            probes.push(period);
        }
        assert!(
            matches!(
                p.standing(),
                Standing::Degraded {
                    now: Some(Model::Units),
                    ..
                }
            ),
            "{:?}",
            p.standing()
        );
    }
    // Waits of 2, 4, 8 periods after the first probe (which the writes contradicted).
    assert_eq!(probes, [1, 3, 7, 15]);
    assert_eq!(api.events().len(), 1);
    // One notice in all; the other lines are outcomes (each flap wrote twice).
    let notices: Vec<_> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| !l.contains(" { generation: "))
        .cloned()
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    // What stays stored after each flap is the units.
    let last = api.slices();
    assert_eq!(last.keys().collect::<Vec<_>>(), vec![SLICE]);
    assert!(over_committable(&last).is_none());
}
