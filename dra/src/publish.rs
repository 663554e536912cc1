//! Publishing the node's GPUs as ResourceSlices (resource.k8s.io/v1): what the slice says
//! ([`desired_spec`], pure) and keeping the API server's copy equal to it ([`publish`]).
//!
//! One pool per node (named after the node) in one ResourceSlice `<node>-<driver>`. When the
//! content changes the pool's generation goes up (the scheduler then ignores slices of older
//! generations), the slice is replaced (with the resourceVersion read, so a concurrent writer
//! makes it fail rather than be overwritten) and any other slice of ours for this node is
//! deleted. The slice is owned by its Node object (an owner reference with the node's UID, as
//! the upstream kubelet-plugin helper sets it), so the API server's garbage collector deletes
//! it with the node: a node removed from the cluster leaves no devices for the scheduler.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use crate::inventory::Gpu;
use crate::model::{self, Model};
use crate::quantity::format_bytes;

/// Smallest and granularity of a memory request in the capacity model.
pub const MEMORY_STEP: u64 = 256 << 20;
/// Default memory and compute of a request that names no amount (capacity model).
pub const DEFAULT_MEMORY: u64 = 1 << 30;
pub const DEFAULT_COMPUTE: u32 = 10;

fn quantity(text: String) -> Quantity {
    Quantity(text)
}

fn attributes(gpu: &Gpu, share: Option<u32>) -> BTreeMap<String, DeviceAttribute> {
    let string = |s: &str| DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    };
    let int = |i: i64| DeviceAttribute {
        int: Some(i),
        ..Default::default()
    };
    let version = |v: String| DeviceAttribute {
        version: Some(v),
        ..Default::default()
    };
    let mut out = BTreeMap::new();
    out.insert("uuid".to_string(), string(&gpu.uuid));
    out.insert("index".to_string(), int(gpu.index as i64));
    out.insert("productName".to_string(), string(&gpu.name));
    let (major, minor) = gpu.compute_capability;
    out.insert(
        "computeCapability".to_string(),
        version(format!("{major}.{minor}.0")),
    );
    // A string, not a version: NVIDIA's driver versions (580.65.06) are not semver.
    out.insert("driverVersion".to_string(), string(&gpu.driver_version));
    let (major, minor) = gpu.cuda_driver_version;
    out.insert(
        "cudaDriverVersion".to_string(),
        version(format!("{major}.{minor}.0")),
    );
    if let Some(share) = share {
        out.insert("share".to_string(), int(share as i64));
    }
    out
}

/// The counter set of GPU `index` (products model).
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}")
}

fn counters(memory: u64, compute: u32) -> BTreeMap<String, Counter> {
    BTreeMap::from([
        (
            "memory".to_string(),
            Counter {
                value: quantity(format_bytes(memory)),
            },
        ),
        (
            "compute".to_string(),
            Counter {
                value: quantity(compute.to_string()),
            },
        ),
    ])
}

/// The spec of the node's ResourceSlice (pool generation `generation`).
pub fn desired_spec(
    driver: &str,
    node: &str,
    gpus: &[Gpu],
    model: Model,
    generation: i64,
) -> ResourceSliceSpec {
    let mut devices = Vec::new();
    let mut shared = Vec::new();
    for gpu in gpus {
        match model {
            Model::Products => {
                shared.push(CounterSet {
                    name: counter_set_name(gpu.index),
                    counters: counters(gpu.memory_bytes, 100),
                });
                for (name, share) in model::product_devices(gpu.index) {
                    let memory = model::product_memory(gpu.memory_bytes, share);
                    devices.push(Device {
                        name,
                        attributes: Some(attributes(gpu, Some(share))),
                        capacity: Some(BTreeMap::from([
                            (
                                "memory".to_string(),
                                DeviceCapacity {
                                    value: quantity(format_bytes(memory)),
                                    request_policy: None,
                                },
                            ),
                            (
                                "compute".to_string(),
                                DeviceCapacity {
                                    value: quantity(share.to_string()),
                                    request_policy: None,
                                },
                            ),
                        ])),
                        consumes_counters: Some(vec![DeviceCounterConsumption {
                            counter_set: counter_set_name(gpu.index),
                            counters: counters(memory, share),
                        }]),
                        ..Default::default()
                    });
                }
            }
            Model::Capacity => {
                devices.push(Device {
                    name: model::capacity_device(gpu.index),
                    attributes: Some(attributes(gpu, None)),
                    allow_multiple_allocations: Some(true),
                    capacity: Some(BTreeMap::from([
                        (
                            "memory".to_string(),
                            DeviceCapacity {
                                value: quantity(format_bytes(gpu.memory_bytes)),
                                request_policy: Some(CapacityRequestPolicy {
                                    default: Some(quantity(format_bytes(DEFAULT_MEMORY))),
                                    valid_range: Some(CapacityRequestPolicyRange {
                                        min: quantity(format_bytes(MEMORY_STEP)),
                                        max: Some(quantity(format_bytes(gpu.memory_bytes))),
                                        step: Some(quantity(format_bytes(MEMORY_STEP))),
                                    }),
                                    valid_values: None,
                                }),
                            },
                        ),
                        (
                            "compute".to_string(),
                            DeviceCapacity {
                                value: quantity("100".to_string()),
                                request_policy: Some(CapacityRequestPolicy {
                                    default: Some(quantity(DEFAULT_COMPUTE.to_string())),
                                    valid_range: Some(CapacityRequestPolicyRange {
                                        min: quantity("1".to_string()),
                                        max: Some(quantity("100".to_string())),
                                        step: Some(quantity("1".to_string())),
                                    }),
                                    valid_values: None,
                                }),
                            },
                        ),
                    ])),
                    ..Default::default()
                });
            }
        }
    }
    ResourceSliceSpec {
        driver: driver.to_string(),
        node_name: Some(node.to_string()),
        pool: ResourcePool {
            name: node.to_string(),
            generation,
            resource_slice_count: 1,
        },
        devices: Some(devices),
        shared_counters: (!shared.is_empty()).then_some(shared),
        ..Default::default()
    }
}

/// The name of the node's ResourceSlice.
pub fn slice_name(driver: &str, node: &str) -> String {
    format!("{node}-{driver}")
}

/// The owner reference that ties the node's slice to its Node object.
pub fn node_owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        ..Default::default()
    }
}

/// The Node's owner reference, from the API server (the UID is the node object's identity: a
/// node deleted and re-registered under the same name is another owner).
async fn read_node_owner(client: Client, node: &str) -> Result<OwnerReference, String> {
    let nodes: Api<Node> = Api::all(client);
    let object = nodes.get(node).await.map_err(|e| {
        format!(
            "reading Node {node} (the ResourceSlice is owned by it, so it goes with the node): {e}"
        )
    })?;
    let uid = object
        .metadata
        .uid
        .ok_or_else(|| format!("Node {node} has no metadata.uid"))?;
    Ok(node_owner(node, &uid))
}

/// What [`publish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    Created { generation: i64 },
    Replaced { generation: i64 },
    Unchanged { generation: i64 },
}

/// Makes the API server's ResourceSlices of this driver and node say `desired_spec` (see the
/// module doc). Errors name the call that failed.
pub async fn publish(
    client: Client,
    driver: &str,
    node: &str,
    gpus: &[Gpu],
    model: Model,
) -> Result<Published, String> {
    let owners = Some(vec![read_node_owner(client.clone(), node).await?]);
    let api: Api<ResourceSlice> = Api::all(client);
    let selector = format!("spec.driver={driver},spec.nodeName={node}");
    let existing = api
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(|e| format!("listing ResourceSlices ({selector}): {e}"))?
        .items;
    let name = slice_name(driver, node);
    let generation = existing
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let current = existing
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name.as_str()));
    let outcome = match current {
        Some(current)
            if existing.len() == 1
                && current.spec == desired_spec(driver, node, gpus, model, generation)
                && current.metadata.owner_references == owners =>
        {
            Published::Unchanged { generation }
        }
        Some(current) => {
            let generation = generation + 1;
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    resource_version: current.metadata.resource_version.clone(),
                    owner_references: owners.clone(),
                    ..Default::default()
                },
                spec: desired_spec(driver, node, gpus, model, generation),
            };
            api.replace(&name, &PostParams::default(), &slice)
                .await
                .map_err(|e| format!("replacing ResourceSlice {name}: {e}"))?;
            Published::Replaced { generation }
        }
        None => {
            let generation = generation + 1;
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    owner_references: owners.clone(),
                    ..Default::default()
                },
                spec: desired_spec(driver, node, gpus, model, generation),
            };
            api.create(&PostParams::default(), &slice)
                .await
                .map_err(|e| format!("creating ResourceSlice {name}: {e}"))?;
            Published::Created { generation }
        }
    };
    for stale in &existing {
        let Some(stale_name) = stale.metadata.name.as_deref() else {
            continue;
        };
        if stale_name != name {
            api.delete(stale_name, &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting stale ResourceSlice {stale_name}: {e}"))?;
        }
    }
    Ok(outcome)
}
