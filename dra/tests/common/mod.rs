//! Shared by the driver's tests: a fake Kubernetes API server speaking the API's JSON wire
//! format for exactly the calls the driver makes, claim and GPU fixtures, scratch directories
//! and a kubelet-side gRPC channel over a unix socket.
#![allow(dead_code)]

pub mod api;
pub mod cluster;
pub mod node;
pub mod rules;
pub mod scheduler;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use gpuslice_dra::inventory::Gpu;
use gpuslice_dra::prepare::{NvidiaCdi, Settings};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub const GIB: u64 = 1 << 30;
pub const NODE: &str = "gpu-node-1";
pub const UUID0: &str = "GPU-8a5d1c2e-0000-4000-8000-000000000000";
pub const UUID1: &str = "GPU-8a5d1c2e-0000-4000-8000-000000000001";

/// A fresh directory per use, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "gpuslice-dra-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two 32 GiB V100s, as the fake GPU presents them.
pub fn gpus() -> Vec<Gpu> {
    [UUID0, UUID1]
        .iter()
        .enumerate()
        .map(|(index, uuid)| Gpu {
            index: index as u32,
            uuid: uuid.to_string(),
            name: "Tesla V100-PCIE-32GB".into(),
            memory_bytes: 32 * GIB,
            compute_capability: (7, 0),
            driver_version: "580.65.06".into(),
            cuda_driver_version: (13, 0),
            oversubscription: None,
        })
        .collect()
}

/// Settings rooted in `scratch` (state/, cdi/, a stand-in libgpuslice.so).
pub fn settings(scratch: &Scratch, nvidia: bool) -> Settings {
    let lib = scratch.path().join("libgpuslice.so");
    std::fs::write(&lib, b"stand-in").unwrap();
    std::fs::write(scratch.path().join("libgpuslice_core.so"), b"stand-in").unwrap();
    Settings {
        driver: "gpuslice.dev".into(),
        node: NODE.into(),
        state_dir: scratch.path().join("state"),
        cdi_dir: scratch.path().join("cdi"),
        lib_host: lib,
        lib_container: "/usr/lib/gpuslice/libgpuslice.so".into(),
        host_pid_dir: None,
        context_bound: None,
        nvidia_cdi: nvidia.then(|| NvidiaCdi {
            kind: "nvidia.com/gpu".into(),
        }),
    }
}

/// One allocated device: (request, driver, pool, device, consumed capacity (memory, compute)).
pub struct Alloc<'a> {
    pub request: &'a str,
    pub driver: &'a str,
    pub pool: &'a str,
    pub device: &'a str,
    pub consumed: Option<(&'a str, &'a str)>,
}

pub fn ours<'a>(request: &'a str, device: &'a str) -> Alloc<'a> {
    Alloc {
        request,
        driver: "gpuslice.dev",
        pool: NODE,
        device,
        consumed: None,
    }
}

/// A ResourceClaim as the scheduler leaves it once allocated.
pub fn claim(namespace: &str, name: &str, uid: &str, allocs: &[Alloc]) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        allocs
                            .iter()
                            .map(|a| DeviceRequestAllocationResult {
                                request: a.request.into(),
                                driver: a.driver.into(),
                                pool: a.pool.into(),
                                device: a.device.into(),
                                consumed_capacity: a.consumed.map(|(memory, compute)| {
                                    [
                                        ("memory".to_string(), Quantity(memory.into())),
                                        ("compute".to_string(), Quantity(compute.into())),
                                    ]
                                    .into()
                                }),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A tonic channel to the unix socket `path`, as the kubelet opens it.
pub async fn channel(path: PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connect to the plugin's socket")
}
