//! Publishing the node's GPUs as ResourceSlices (resource.k8s.io/v1): what the slices say
//! ([`desired_slices`], pure) and keeping the API server's copy equal to it, safely, on
//! whatever cluster the driver meets ([`Publisher`]).
//!
//! One pool per node (named after the node). GPUs go in groups of [`GPUS_PER_SLICE`], one
//! slice of devices per group, named `<node>-<driver>` (then `-1`, `-2`...). Where the model
//! has shared counters (products) their place depends on the API server ([`Layout`]): in the
//! devices' slice for 1.34 (whose validation wants a device's counter set in its own slice),
//! in a slice of their own `<node>-<driver>-counters[-N]` from 1.35 (whose validation refuses
//! `sharedCounters` and `devices` in one slice). When the content changes the pool's
//! generation goes up (the scheduler ignores slices of older generations), every slice is
//! written with the resourceVersion read (a concurrent writer makes it fail rather than be
//! overwritten) and any other slice of ours for this node is deleted. Every slice is owned by
//! its Node object (an owner reference with the node's UID, as the upstream kubelet-plugin
//! helper sets it), so the garbage collector deletes them with the node.
//!
//! The API server of a cluster whose feature gate is off does not refuse a model's fields: it
//! drops them when it stores the slice (its registry strategy), and the seven products of a
//! card become seven independent devices the scheduler may hand out together. So at the first
//! publication a dry-run create of the model's slices (a probe) shows whether the server keeps
//! its fields; every create and replace after that is sent as a dry run first, with the same
//! body, so a gate switched off at run time shows before anything is stored; and what a real
//! write stored is read back too (for a server that answers the dry run and the write
//! differently: replicas with different gates behind one address). If the model's fields were
//! dropped, the model is not published: [`Publisher`] says so once (its notice), and publishes
//! the gate-free units model instead if the operator allowed it ([`OnMissingGate::Units`]), or
//! nothing. A degraded publisher probes again on a back-off ([`Recheck`]), writing and saying
//! nothing while the answer stays the same, and returns to the model once the server keeps its
//! fields. An update of a stored slice keeps the fields the stored object already uses (the
//! strategy's ratchet), so a gate switched off is noticed at the first write that needs it.
//!
//! Devices of an unhealthy GPU carry a NoSchedule [`TAINT_KEY`] taint; where the server drops
//! taints (`DRADeviceTaints` off) they are left out of the slice instead.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
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
/// GPUs per slice: 8 counter sets is 1.35's limit per slice, and 8 GPUs of products are 56
/// devices, under its 64 for devices that consume counters (1.34: 32 counters in all sets).
pub const GPUS_PER_SLICE: usize = 8;
/// The taint on the devices of a GPU the driver saw failing.
pub const TAINT_KEY: &str = "gpuslice.dev/unhealthy";

/// Where the shared counters go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// In the slice of the devices that consume them (Kubernetes 1.34).
    Combined,
    /// In slices of their own (Kubernetes 1.35 and later).
    Split,
}

/// What the operator allowed when a model's feature gate is off (`--on-missing-gate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnMissingGate {
    /// Publish no devices (claims already prepared stay as they are).
    Withdraw,
    /// Publish the units model, which needs no gate.
    Units,
}

fn quantity(text: String) -> Quantity {
    Quantity(text)
}

fn attributes(gpu: &Gpu, model: Model, share: Option<u32>) -> BTreeMap<String, DeviceAttribute> {
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
    out.insert("model".to_string(), string(model.name()));
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
    if let Some(over) = gpu.oversubscription {
        out.insert(
            "oversubscriptionPercent".to_string(),
            int(over.percent as i64),
        );
        if let Some(share) = share {
            let memory = model::product_memory(gpu.memory_bytes, share);
            out.insert(
                "virtualMemory".to_string(),
                int(over.virtual_memory(memory) as i64),
            );
        }
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

fn fixed_capacity(memory: u64, compute: u32) -> BTreeMap<String, DeviceCapacity> {
    BTreeMap::from([
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
                value: quantity(compute.to_string()),
                request_policy: None,
            },
        ),
    ])
}

fn range(default: String, min: String, max: String, step: String) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(quantity(default)),
        valid_range: Some(CapacityRequestPolicyRange {
            min: quantity(min),
            max: Some(quantity(max)),
            step: Some(quantity(step)),
        }),
        valid_values: None,
    }
}

/// The devices of one GPU in `model`; `taint`: the reason it is unhealthy, if it is.
fn gpu_devices(gpu: &Gpu, model: Model, taint: Option<&str>) -> Vec<Device> {
    let taints = taint.map(|reason| {
        vec![DeviceTaint {
            key: TAINT_KEY.to_string(),
            value: Some(reason.to_string()),
            effect: "NoSchedule".to_string(),
            time_added: None,
        }]
    });
    let mut devices = match model {
        Model::Products => model::product_devices(gpu.index)
            .into_iter()
            .map(|(name, share)| {
                let memory = model::product_memory(gpu.memory_bytes, share);
                Device {
                    name,
                    attributes: Some(attributes(gpu, model, Some(share))),
                    capacity: Some(fixed_capacity(memory, share)),
                    consumes_counters: Some(vec![DeviceCounterConsumption {
                        counter_set: counter_set_name(gpu.index),
                        counters: counters(memory, share),
                    }]),
                    ..Default::default()
                }
            })
            .collect(),
        Model::Units => {
            let memory = model::product_memory(gpu.memory_bytes, model::UNIT_SHARE);
            model::unit_devices(gpu.index)
                .into_iter()
                .map(|name| Device {
                    name,
                    attributes: Some(attributes(gpu, model, Some(model::UNIT_SHARE))),
                    capacity: Some(fixed_capacity(memory, model::UNIT_SHARE)),
                    ..Default::default()
                })
                .collect()
        }
        Model::Capacity => {
            let memory = format_bytes(gpu.memory_bytes);
            vec![Device {
                name: model::capacity_device(gpu.index),
                attributes: Some(attributes(gpu, model, None)),
                allow_multiple_allocations: Some(true),
                capacity: Some(BTreeMap::from([
                    (
                        "memory".to_string(),
                        DeviceCapacity {
                            value: quantity(memory.clone()),
                            request_policy: Some(range(
                                format_bytes(DEFAULT_MEMORY),
                                format_bytes(MEMORY_STEP),
                                memory,
                                format_bytes(MEMORY_STEP),
                            )),
                        },
                    ),
                    (
                        "compute".to_string(),
                        DeviceCapacity {
                            value: quantity("100".to_string()),
                            request_policy: Some(range(
                                DEFAULT_COMPUTE.to_string(),
                                "1".to_string(),
                                "100".to_string(),
                                "1".to_string(),
                            )),
                        },
                    ),
                ])),
                ..Default::default()
            }]
        }
    };
    for device in &mut devices {
        device.taints = taints.clone();
    }
    devices
}

/// The name of the node's first (or only) slice of devices.
pub fn slice_name(driver: &str, node: &str) -> String {
    format!("{node}-{driver}")
}

fn numbered(base: String, group: usize) -> String {
    if group == 0 {
        base
    } else {
        format!("{base}-{group}")
    }
}

/// What the driver publishes for `gpus` in `model` (pool generation `generation`), as
/// (slice name, spec), in the order they are written. `unhealthy`: GPU index -> reason (a
/// label value), whose devices are tainted, or left out when `withhold_unhealthy`.
#[allow(clippy::too_many_arguments)]
pub fn desired_slices(
    driver: &str,
    node: &str,
    gpus: &[Gpu],
    model: Model,
    layout: Layout,
    generation: i64,
    unhealthy: &BTreeMap<u32, String>,
    withhold_unhealthy: bool,
) -> Vec<(String, ResourceSliceSpec)> {
    let groups: Vec<&[Gpu]> = if gpus.is_empty() {
        vec![&[]]
    } else {
        gpus.chunks(GPUS_PER_SLICE).collect()
    };
    let mut slices = Vec::new();
    for (n, group) in groups.iter().enumerate() {
        let mut devices = Vec::new();
        let mut shared = Vec::new();
        for gpu in group.iter() {
            if model == Model::Products {
                shared.push(CounterSet {
                    name: counter_set_name(gpu.index),
                    counters: counters(gpu.memory_bytes, 100),
                });
            }
            let taint = unhealthy.get(&gpu.index).map(String::as_str);
            if taint.is_some() && withhold_unhealthy {
                continue;
            }
            devices.extend(gpu_devices(gpu, model, taint));
        }
        let spec =
            |devices: Option<Vec<Device>>, shared: Option<Vec<CounterSet>>| ResourceSliceSpec {
                driver: driver.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: 0,
                },
                devices,
                shared_counters: shared,
                ..Default::default()
            };
        let name = numbered(slice_name(driver, node), n);
        match (layout, shared.is_empty()) {
            (Layout::Split, false) => {
                let counters_name = numbered(format!("{}-counters", slice_name(driver, node)), n);
                slices.push((counters_name, spec(None, Some(shared))));
                slices.push((name, spec(Some(devices), None)));
            }
            (_, true) => slices.push((name, spec(Some(devices), None))),
            (Layout::Combined, false) => slices.push((name, spec(Some(devices), Some(shared)))),
        }
    }
    let count = slices.len() as i64;
    for (_, spec) in &mut slices {
        spec.pool.resource_slice_count = count;
    }
    slices
}

/// The owner reference that ties the node's slices to its Node object.
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
pub async fn read_node_owner(client: Client, node: &str) -> Result<OwnerReference, String> {
    let nodes: Api<Node> = Api::all(client);
    let object = nodes.get(node).await.map_err(|e| {
        format!(
            "reading Node {node} (the ResourceSlices are owned by it, so they go with the node): {e}"
        )
    })?;
    let uid = object
        .metadata
        .uid
        .ok_or_else(|| format!("Node {node} has no metadata.uid"))?;
    Ok(node_owner(node, &uid))
}

/// The fields of `sent` that are missing from `stored` (what the API server dropped), by
/// their paths; empty when it kept everything the driver uses.
pub fn dropped_fields(sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> Vec<String> {
    let mut out = Vec::new();
    let nonempty = |v: &Option<Vec<CounterSet>>| v.as_ref().is_some_and(|v| !v.is_empty());
    if nonempty(&sent.shared_counters) && !nonempty(&stored.shared_counters) {
        out.push("spec.sharedCounters".to_string());
    }
    let stored_devices: BTreeMap<&str, &Device> = stored
        .devices
        .iter()
        .flatten()
        .map(|d| (d.name.as_str(), d))
        .collect();
    let mut add = |what: &str| {
        let path = format!("spec.devices[].{what}");
        if !out.contains(&path) {
            out.push(path);
        }
    };
    for device in sent.devices.iter().flatten() {
        let Some(kept) = stored_devices.get(device.name.as_str()) else {
            add("(device missing)");
            continue;
        };
        let has =
            |v: &Option<Vec<DeviceCounterConsumption>>| v.as_ref().is_some_and(|v| !v.is_empty());
        if has(&device.consumes_counters) && !has(&kept.consumes_counters) {
            add("consumesCounters");
        }
        if device.allow_multiple_allocations.is_some() && kept.allow_multiple_allocations.is_none()
        {
            add("allowMultipleAllocations");
        }
        let policies = |d: &Device| {
            d.capacity
                .iter()
                .flatten()
                .filter(|(_, c)| c.request_policy.is_some())
                .count()
        };
        if policies(device) > policies(kept) {
            add("capacity[].requestPolicy");
        }
        let taints = |d: &Device| d.taints.as_ref().map_or(0, Vec::len);
        if taints(device) > taints(kept) {
            add("taints");
        }
    }
    out
}

/// Whether `dropped` (from [`dropped_fields`]) takes away what keeps `model` from
/// over-committing a card.
pub fn model_fields_dropped(model: Model, dropped: &[String]) -> bool {
    dropped.iter().any(|path| match model {
        Model::Products => path == "spec.sharedCounters" || path.ends_with("consumesCounters"),
        Model::Capacity => {
            path.ends_with("allowMultipleAllocations") || path.ends_with("requestPolicy")
        }
        Model::Units => false,
    }) || dropped.iter().any(|p| p.ends_with("(device missing)"))
}

/// Taints the server set that the driver did not (`timeAdded`) are not a difference.
fn normalised(spec: &ResourceSliceSpec) -> ResourceSliceSpec {
    let mut spec = spec.clone();
    for device in spec.devices.iter_mut().flatten() {
        for taint in device.taints.iter_mut().flatten() {
            taint.time_added = None;
        }
    }
    spec
}

/// What one publication did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    Created {
        generation: i64,
    },
    Replaced {
        generation: i64,
    },
    Unchanged {
        generation: i64,
    },
    /// Nothing of this driver is published for the node (any slice there was, was deleted).
    Withdrawn,
}

/// The model the publisher is publishing, and why not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The model asked for (its fields kept by the server, or it needs no gate).
    AsAsked,
    /// The asked model's gate is off: `now` is published instead (`None`: nothing).
    Degraded {
        gate: &'static str,
        dropped: Vec<String>,
        now: Option<Model>,
    },
}

/// How often a publisher that found the asked model's feature gate missing probes again: the
/// first time `first` after the finding, then twice as long each time, at most every `most`.
/// A back-off rather than a signal: nothing a driver can read with its rights tells it that
/// a gate was turned on (`/version` stays the same; the `kubernetes_feature_enabled` series
/// is on `/metrics`, a non-resource URL, and per API server replica), and turning one on
/// restarts the API server, which an operator can follow with a restart of the driver: its
/// first publication probes at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recheck {
    pub first: Duration,
    pub most: Duration,
}

impl Recheck {
    /// For a driver that re-publishes every `period`: first after one period, then at most
    /// every 15 minutes (or every period, if that is longer).
    pub fn for_period(period: Duration) -> Recheck {
        Recheck {
            first: period,
            most: period.max(Duration::from_secs(15 * 60)),
        }
    }
}

/// Where a publisher's time comes from (the monotonic clock, or a test's).
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;
/// Where its log lines go (stderr, or a test's list).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Keeps the node's slices right, from one call to [`Publisher::publish`] to the next.
pub struct Publisher {
    pub driver: String,
    pub node: String,
    pub model: Model,
    pub on_missing_gate: OnMissingGate,
    standing: Standing,
    layout: Option<Layout>,
    /// `Some(false)` once the server was seen dropping device taints.
    taints_kept: Option<bool>,
    notices: Vec<String>,
    recheck: Recheck,
    /// While degraded: when the asked model is probed next, and the wait that led there.
    next_probe: Option<(Instant, Duration)>,
    clock: Clock,
    log: Log,
    /// The outcome line logged last: one line per change, not one per period.
    last_line: String,
}

impl Publisher {
    pub fn new(driver: &str, node: &str, model: Model, on_missing_gate: OnMissingGate) -> Self {
        Publisher {
            driver: driver.to_string(),
            node: node.to_string(),
            model,
            on_missing_gate,
            standing: Standing::AsAsked,
            layout: None,
            taints_kept: None,
            notices: Vec::new(),
            recheck: Recheck::for_period(Duration::from_secs(60)),
            next_probe: None,
            clock: Arc::new(Instant::now),
            log: Arc::new(|line| eprintln!("gpuslice-dra: {line}")),
            last_line: String::new(),
        }
    }

    /// Probes a missing gate again on this back-off (default: [`Recheck::for_period`] of 60 s).
    pub fn with_recheck(mut self, recheck: Recheck) -> Self {
        self.recheck = recheck;
        self
    }

    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_log(mut self, log: Log) -> Self {
        self.log = log;
        self
    }

    pub fn standing(&self) -> &Standing {
        &self.standing
    }

    /// The layout chosen (after the first publication of a model with counters).
    pub fn layout(&self) -> Option<Layout> {
        self.layout
    }

    /// The publisher's standing as Prometheus text (for a node exporter's textfile
    /// collector): which model is asked and published, whether a gate is missing, how many
    /// GPUs are unhealthy.
    pub fn metrics(&self, unhealthy: &BTreeMap<u32, String>) -> String {
        let (published, gate) = match &self.standing {
            Standing::AsAsked => (self.model.name(), None),
            Standing::Degraded { gate, now, .. } => (now.map_or("none", Model::name), Some(*gate)),
        };
        let mut out = String::new();
        out.push_str(
            "# HELP gpuslice_dra_model The model asked for (--model) and the one published.\n\
             # TYPE gpuslice_dra_model gauge\n",
        );
        out.push_str(&format!(
            "gpuslice_dra_model{{node=\"{}\",asked=\"{}\",published=\"{published}\"}} 1\n",
            self.node,
            self.model.name()
        ));
        out.push_str(
            "# HELP gpuslice_dra_feature_gate_missing 1 when the API server drops the asked \
             model's fields (its feature gate is off).\n\
             # TYPE gpuslice_dra_feature_gate_missing gauge\n",
        );
        out.push_str(&format!(
            "gpuslice_dra_feature_gate_missing{{node=\"{}\",gate=\"{}\"}} {}\n",
            self.node,
            gate.or(self.model.feature_gate()).unwrap_or("none"),
            u8::from(gate.is_some())
        ));
        out.push_str(
            "# HELP gpuslice_dra_unhealthy_gpus GPUs whose devices are tainted or withheld.\n\
             # TYPE gpuslice_dra_unhealthy_gpus gauge\n",
        );
        out.push_str(&format!(
            "gpuslice_dra_unhealthy_gpus{{node=\"{}\"}} {}\n",
            self.node,
            unhealthy.len()
        ));
        out
    }

    /// What happened that an operator must hear of (each once): to log and to record as an
    /// Event on the Node.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    fn effective(&self) -> Option<Model> {
        match &self.standing {
            Standing::AsAsked => Some(self.model),
            Standing::Degraded { now, .. } => *now,
        }
    }

    /// Publishes the effective model instead of the asked one from now on (`instead`), and
    /// probes the asked one again after `wait`. `announce`: a notice says so (once per
    /// change: not when a probe that saw the gate back is contradicted in the same pass).
    fn degrade(&mut self, dropped: Vec<String>, now: Instant, wait: Duration, announce: bool) {
        let gate = self.model.feature_gate().unwrap_or("?");
        let instead = match self.on_missing_gate {
            OnMissingGate::Withdraw => None,
            OnMissingGate::Units => Some(Model::Units),
        };
        if announce {
            let what = match instead {
                Some(m) => format!(
                    "publishing the {} model instead (--on-missing-gate=units)",
                    m.name()
                ),
                None => "publishing no devices (--on-missing-gate=withdraw; =units publishes \
                         the gate-free units model)"
                    .to_string(),
            };
            self.notices.push(format!(
                "the API server drops {} of the {} model (feature gate {gate} is off on it): its \
                 devices would be independent and a card over-committable; {what}",
                dropped.join(", "),
                self.model.name(),
            ));
        }
        self.standing = Standing::Degraded {
            gate,
            dropped,
            now: instead,
        };
        self.next_probe = Some((now + wait, wait));
    }

    /// The wait after `wait`, on the back-off.
    fn longer(&self, wait: Duration) -> Duration {
        (wait * 2).clamp(self.recheck.first, self.recheck.most)
    }

    /// [`Publisher::publish`]; then each notice as one log line and a Warning Event on the
    /// Node (an Event that cannot be recorded is logged, never fatal), and the outcome as one
    /// log line when it differs from the last one logged.
    pub async fn publish_and_report(
        &mut self,
        client: Client,
        gpus: &[Gpu],
        unhealthy: &BTreeMap<u32, String>,
    ) -> Result<Published, String> {
        let result = self.publish(client.clone(), gpus, unhealthy).await;
        for notice in self.take_notices() {
            (self.log)(&format!("ResourceSlices: {notice}"));
            let recorded = match read_node_owner(client.clone(), &self.node).await {
                Ok(owner) => node_event(client.clone(), &owner, "DRAModel", &notice).await,
                Err(e) => Err(e),
            };
            if let Err(e) = recorded {
                (self.log)(&e);
            }
        }
        let line = match &result {
            Ok(outcome) => format!("ResourceSlices: {outcome:?}"),
            Err(e) => format!("publishing: {e}"),
        };
        if line != self.last_line {
            (self.log)(&line);
            self.last_line = line;
        }
        result
    }

    /// One publication: probes a gated model (dry run) at the first publication and, while its
    /// gate is missing, on the back-off; writes what should be published, each write sent as
    /// a dry run first; and reads back what was stored.
    pub async fn publish(
        &mut self,
        client: Client,
        gpus: &[Gpu],
        unhealthy: &BTreeMap<u32, String>,
    ) -> Result<Published, String> {
        let owner = read_node_owner(client.clone(), &self.node).await?;
        let api: Api<ResourceSlice> = Api::all(client.clone());
        let now = (self.clock)();
        let degraded = matches!(self.standing, Standing::Degraded { .. });
        let due = self.next_probe.is_none_or(|(at, _)| now >= at);
        // When a probe of this pass found the gate back: its notice, and the wait before it.
        let mut restored: Option<(usize, Duration)> = None;
        if self.model.feature_gate().is_some() && (self.layout.is_none() || (degraded && due)) {
            match self.probe(&api, &owner, gpus).await? {
                None => {
                    if degraded {
                        let wait = self
                            .next_probe
                            .take()
                            .map_or(self.recheck.first, |(_, w)| w);
                        restored = Some((self.notices.len(), wait));
                        self.notices.push(format!(
                            "the API server now keeps the fields of the {} model: publishing it",
                            self.model.name()
                        ));
                    }
                    self.standing = Standing::AsAsked;
                }
                // Still missing: said already; the next probe after a longer wait.
                Some(_) if degraded => {
                    let wait = self.longer(self.next_probe.map_or(Duration::ZERO, |(_, w)| w));
                    self.next_probe = Some((now + wait, wait));
                }
                Some(dropped) => self.degrade(dropped, now, self.recheck.first, true),
            }
        }
        // A dry run or a read-back that shows dropped fields changes what is published; each
        // change happens once, so three passes are enough.
        for _ in 0..3 {
            let (published, dropped) = self.write(&api, &owner, gpus, unhealthy).await?;
            if self.effective() == Some(self.model) && model_fields_dropped(self.model, &dropped) {
                // The server answers otherwise than the probe did (another replica, a
                // restart with other gates between the two). Right after a probe that saw the
                // gate back nothing changed for the operator: neither is said, and the next
                // probe waits longer.
                match restored.take() {
                    Some((notice, wait)) => {
                        self.notices.remove(notice);
                        let wait = self.longer(wait);
                        self.degrade(dropped, now, wait, false);
                    }
                    None => self.degrade(dropped, now, self.recheck.first, true),
                }
                continue;
            }
            if dropped.iter().any(|p| p.ends_with("taints")) && self.taints_kept != Some(false) {
                self.taints_kept = Some(false);
                self.notices.push(
                    "the API server drops device taints (feature gate DRADeviceTaints is off \
                     on it): the devices of an unhealthy GPU are left out of the slices instead"
                        .to_string(),
                );
                continue;
            }
            let Some(published) = published else {
                return Err(format!(
                    "the API server would drop {} of the slices; nothing written",
                    dropped.join(", ")
                ));
            };
            return Ok(published);
        }
        Err(
            "the API server's answers kept changing within one publication; trying again at \
             the next"
                .to_string(),
        )
    }

    /// A dry-run create of the model's first slices in each layout (1.35's first): `None`
    /// when the server keeps the model's fields, else the fields it drops. Sets the layout.
    async fn probe(
        &mut self,
        api: &Api<ResourceSlice>,
        owner: &OwnerReference,
        gpus: &[Gpu],
    ) -> Result<Option<Vec<String>>, String> {
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let mut refusals = Vec::new();
        for layout in [Layout::Split, Layout::Combined] {
            let first: Vec<_> = gpus.iter().take(1).cloned().collect();
            let slices = desired_slices(
                &self.driver,
                &self.node,
                &first,
                self.model,
                layout,
                1,
                &BTreeMap::new(),
                false,
            );
            let mut dropped = Vec::new();
            let mut refused = None;
            for (name, spec) in &slices {
                let slice = ResourceSlice {
                    metadata: ObjectMeta {
                        name: Some(format!("{name}-probe")),
                        owner_references: Some(vec![owner.clone()]),
                        ..Default::default()
                    },
                    spec: spec.clone(),
                };
                match api.create(&dry, &slice).await {
                    Ok(stored) => dropped.extend(dropped_fields(spec, &stored.spec)),
                    Err(kube::Error::Api(e)) if e.code == 422 => {
                        refused = Some(e.message);
                        break;
                    }
                    Err(e) => return Err(format!("dry-run create of ResourceSlice {name}: {e}")),
                }
            }
            match refused {
                None => {
                    self.layout = Some(layout);
                    dropped.dedup();
                    return Ok((!dropped.is_empty()).then_some(dropped));
                }
                Some(message) => refusals.push(format!("{layout:?}: {message}")),
            }
        }
        Err(format!(
            "the API server refuses the {} model's slices in every layout: {}",
            self.model.name(),
            refusals.join("; ")
        ))
    }

    /// Makes the server's slices of this driver and node what the effective model says,
    /// every create and replace sent as a dry run first. Returns the outcome and the fields the
    /// server dropped; `None` (nothing written) when the dry runs show it would drop some.
    async fn write(
        &mut self,
        api: &Api<ResourceSlice>,
        owner: &OwnerReference,
        gpus: &[Gpu],
        unhealthy: &BTreeMap<u32, String>,
    ) -> Result<(Option<Published>, Vec<String>), String> {
        let owners = Some(vec![owner.clone()]);
        let selector = format!("spec.driver={},spec.nodeName={}", self.driver, self.node);
        let existing = api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| format!("listing ResourceSlices ({selector}): {e}"))?
            .items;
        let generation = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let Some(model) = self.effective() else {
            for slice in &existing {
                let name = slice.metadata.name.clone().unwrap_or_default();
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map_err(|e| format!("deleting ResourceSlice {name}: {e}"))?;
            }
            return Ok((Some(Published::Withdrawn), Vec::new()));
        };
        let layout = self.layout.unwrap_or(Layout::Split);
        let withhold = self.taints_kept == Some(false);
        let want = |generation| {
            desired_slices(
                &self.driver,
                &self.node,
                gpus,
                model,
                layout,
                generation,
                unhealthy,
                withhold,
            )
        };
        let by_name: BTreeMap<&str, &ResourceSlice> = existing
            .iter()
            .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
            .collect();
        let same = {
            let desired = want(generation);
            desired.len() == existing.len()
                && desired.iter().all(|(name, spec)| {
                    by_name.get(name.as_str()).is_some_and(|s| {
                        normalised(&s.spec) == *spec && s.metadata.owner_references == owners
                    })
                })
        };
        if same {
            return Ok((Some(Published::Unchanged { generation }), Vec::new()));
        }
        let generation = generation + 1;
        let writes: Vec<(ResourceSlice, bool)> = want(generation)
            .into_iter()
            .map(|(name, spec)| {
                let current = by_name.get(name.as_str());
                let slice = ResourceSlice {
                    metadata: ObjectMeta {
                        name: Some(name),
                        resource_version: current.and_then(|s| s.metadata.resource_version.clone()),
                        owner_references: owners.clone(),
                        ..Default::default()
                    },
                    spec,
                };
                (slice, current.is_some())
            })
            .collect();
        // What the server would store, before anything is stored: a server that drops a field
        // (a gate switched off at run time) never holds a slice without it, even briefly.
        let mut dropped = Vec::new();
        for (slice, replace) in &writes {
            let stored = send(api, slice, *replace, true).await?;
            add_dropped(&mut dropped, &slice.spec, &stored.spec);
        }
        if !dropped.is_empty() {
            return Ok((None, dropped));
        }
        for (slice, replace) in &writes {
            let stored = send(api, slice, *replace, false).await?;
            add_dropped(&mut dropped, &slice.spec, &stored.spec);
        }
        for stale in &existing {
            let Some(stale_name) = stale.metadata.name.as_deref() else {
                continue;
            };
            if !writes
                .iter()
                .any(|(s, _)| s.metadata.name.as_deref() == Some(stale_name))
            {
                api.delete(stale_name, &DeleteParams::default())
                    .await
                    .map_err(|e| format!("deleting stale ResourceSlice {stale_name}: {e}"))?;
            }
        }
        let published = if existing.is_empty() {
            Published::Created { generation }
        } else {
            Published::Replaced { generation }
        };
        Ok((Some(published), dropped))
    }
}

/// Creates (`replace`: replaces) `slice`; `dry_run`: only asks what the server would store.
async fn send(
    api: &Api<ResourceSlice>,
    slice: &ResourceSlice,
    replace: bool,
    dry_run: bool,
) -> Result<ResourceSlice, String> {
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let what = if dry_run { "dry-run " } else { "" };
    if replace {
        api.replace(name, &params, slice)
            .await
            .map_err(|e| format!("{what}replacing ResourceSlice {name}: {e}"))
    } else {
        api.create(&params, slice)
            .await
            .map_err(|e| format!("{what}creating ResourceSlice {name}: {e}"))
    }
}

/// Adds the fields `stored` lacks of `sent` to `dropped` (each path once).
fn add_dropped(dropped: &mut Vec<String>, sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) {
    for path in dropped_fields(sent, stored) {
        if !dropped.contains(&path) {
            dropped.push(path);
        }
    }
}

/// Records `message` as a Warning Event on the Node (`reason`: one word), as a kubelet
/// plugin's events appear in `kubectl describe node`.
pub async fn node_event(
    client: Client,
    owner: &OwnerReference,
    reason: &str,
    message: &str,
) -> Result<(), String> {
    use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    let now = k8s_openapi::chrono::Utc::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.gpuslice-dra.", owner.name)),
            namespace: Some("default".to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Node".to_string()),
            name: Some(owner.name.clone()),
            uid: Some(owner.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some("Warning".to_string()),
        source: Some(EventSource {
            component: Some("gpuslice-dra".to_string()),
            host: Some(owner.name.clone()),
        }),
        reporting_component: Some("gpuslice.dev/gpuslice-dra".to_string()),
        reporting_instance: Some(owner.name.clone()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some("Publish".to_string()),
        count: Some(1),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &event)
        .await
        .map(|_| ())
        .map_err(|e| format!("recording an Event on Node {}: {e}", owner.name))
}
