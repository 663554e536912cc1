//! Publishing against the fake API server: what the driver sends (the ResourceSlice's shape,
//! field values, pool generations, resourceVersions) and which calls it makes.

mod common;

use common::api::FakeApi;
use common::*;
use gpuslice_dra::model::Model;
use gpuslice_dra::publish::{publish, Published};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{json, Value};

const SLICE: &str = "gpu-node-1-gpuslice.dev";

fn device<'a>(slice: &'a Value, name: &str) -> &'a Value {
    slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name} in {slice}"))
}

#[tokio::test]
async fn products_are_partitionable_devices_consuming_the_cards_counters() {
    let api = FakeApi::start();
    let outcome = publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Products)
        .await
        .unwrap();
    assert_eq!(outcome, Published::Created { generation: 1 });
    let writes = api.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].method, "POST");
    assert_eq!(writes[0].path, "/apis/resource.k8s.io/v1/resourceslices");
    let sent = writes[0].body.clone().unwrap();
    // It is a ResourceSlice as k8s-openapi reads it, and nothing in it is lost on the way.
    let typed: ResourceSlice = serde_json::from_value(sent.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap()["spec"], sent["spec"]);

    assert_eq!(sent["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(sent["kind"], "ResourceSlice");
    assert_eq!(sent["metadata"]["name"], SLICE);
    assert_eq!(sent["spec"]["driver"], "gpuslice.dev");
    assert_eq!(sent["spec"]["nodeName"], NODE);
    // Owned by the Node object, so the API server's garbage collector deletes it with the node.
    assert_eq!(
        sent["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE,
                "uid": common::api::node_uid(NODE), "controller": true}])
    );
    assert_eq!(
        sent["spec"]["pool"],
        json!({"name": NODE, "generation": 1, "resourceSliceCount": 1})
    );
    assert_eq!(
        sent["spec"]["sharedCounters"],
        json!([
            {"name": "gpu-0", "counters": {"memory": {"value": "32Gi"}, "compute": {"value": "100"}}},
            {"name": "gpu-1", "counters": {"memory": {"value": "32Gi"}, "compute": {"value": "100"}}},
        ])
    );
    assert_eq!(sent["spec"]["devices"].as_array().unwrap().len(), 14);
    let quarter = device(&sent, "gpu-1-25-d");
    assert_eq!(
        quarter["attributes"],
        json!({
            "uuid": {"string": UUID1},
            "index": {"int": 1},
            "share": {"int": 25},
            "productName": {"string": "Tesla V100-PCIE-32GB"},
            "computeCapability": {"version": "7.0.0"},
            "driverVersion": {"string": "580.65.06"},
            "cudaDriverVersion": {"version": "13.0.0"},
        })
    );
    assert_eq!(
        quarter["capacity"],
        json!({"memory": {"value": "8Gi"}, "compute": {"value": "25"}})
    );
    assert_eq!(
        quarter["consumesCounters"],
        json!([{"counterSet": "gpu-1", "counters": {"memory": {"value": "8Gi"}, "compute": {"value": "25"}}}])
    );
    assert_eq!(
        device(&sent, "gpu-0-100")["consumesCounters"][0]["counters"],
        json!({"memory": {"value": "32Gi"}, "compute": {"value": "100"}})
    );
    assert!(quarter.get("allowMultipleAllocations").is_none());

    // Nothing changed: nothing is written.
    api.clear_requests();
    let outcome = publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Products)
        .await
        .unwrap();
    assert_eq!(outcome, Published::Unchanged { generation: 1 });
    assert!(api.writes().is_empty(), "{:?}", api.writes());
    // It read its Node (for the owner's UID), then listed only this driver's slices of this
    // node.
    let node = &api.requests()[0];
    assert_eq!(
        (node.method.as_str(), node.path.as_str()),
        ("GET", "/api/v1/nodes/gpu-node-1")
    );
    let list = &api.requests()[1];
    assert_eq!(list.method, "GET");
    assert!(list.query.contains("fieldSelector="), "{}", list.query);
}

#[tokio::test]
async fn a_changed_node_replaces_its_slice_with_a_new_generation_and_drops_stale_ones() {
    let api = FakeApi::start();
    publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Products)
        .await
        .unwrap();
    let stored_version = api.slices()[SLICE]["metadata"]["resourceVersion"].clone();
    // A stale slice of ours for this node (an older driver's name), and slices that are not
    // ours to touch: another node's, another driver's.
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

    // GPU 1 is gone; the node now publishes in the capacity model.
    let one = &gpus()[..1];
    let outcome = publish(api.client(), "gpuslice.dev", NODE, one, Model::Capacity)
        .await
        .unwrap();
    // Above every generation of this pool (the stale slice had 3).
    assert_eq!(outcome, Published::Replaced { generation: 4 });
    let writes = api.writes();
    assert_eq!(
        writes
            .iter()
            .map(|w| (w.method.as_str(), w.path.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (
                "PUT",
                "/apis/resource.k8s.io/v1/resourceslices/gpu-node-1-gpuslice.dev"
            ),
            ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/old-name"),
        ]
    );
    let sent = writes[0].body.clone().unwrap();
    assert_eq!(sent["metadata"]["resourceVersion"], stored_version);
    assert_eq!(sent["spec"]["pool"]["generation"], 4);
    assert!(sent["spec"].get("sharedCounters").is_none());
    let gpu = device(&sent, "gpu-0");
    assert_eq!(sent["spec"]["devices"].as_array().unwrap().len(), 1);
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
    let left: Vec<_> = api.slices().keys().cloned().collect();
    assert_eq!(
        left,
        vec![
            "gpu-node-1-gpuslice.dev",
            "gpu-node-1-nvidia",
            "gpu-node-2-gpuslice.dev"
        ]
    );
}

#[tokio::test]
async fn the_slice_follows_its_node_object_and_without_one_nothing_is_written() {
    let api = FakeApi::start();
    // A slice an older driver wrote without an owner: same content, but it would outlive the
    // node, so it is replaced once with the owner (and a new generation).
    publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Products)
        .await
        .unwrap();
    let mut orphan = api.slices()[SLICE].clone();
    orphan["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    api.put_slice(orphan);
    api.clear_requests();
    let outcome = publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Products)
        .await
        .unwrap();
    assert_eq!(outcome, Published::Replaced { generation: 2 });
    let owner = &api.slices()[SLICE]["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], common::api::node_uid(NODE), "{owner}");

    // The node was deleted and registered again under its name: a new UID, a new owner.
    api.put_node(NODE, "uid-of-the-new-node");
    let outcome = publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Products)
        .await
        .unwrap();
    assert_eq!(outcome, Published::Replaced { generation: 3 });
    let owner = &api.slices()[SLICE]["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], "uid-of-the-new-node", "{owner}");

    // No Node object (a wrong --node-name, or the node is gone): a clear error naming it, and
    // no slice written that nothing would ever delete.
    api.remove_node(NODE);
    api.clear_requests();
    let error = publish(api.client(), "gpuslice.dev", NODE, &gpus(), Model::Capacity)
        .await
        .unwrap_err();
    assert!(error.contains("reading Node gpu-node-1"), "{error}");
    assert!(api.writes().is_empty(), "{:?}", api.writes());
}
