//! Every manifest in docker/k8s/ is what its `kind` says: each YAML document deserialises into
//! its k8s-openapi type and serialises back to exactly the same JSON. k8s-openapi skips
//! unknown fields when reading, so the round trip is what catches a misspelt field name (it
//! disappears). The ResourceSlice example is exactly what the driver publishes.

use std::path::{Path, PathBuf};

use gpuslice_dra::inventory::Gpu;
use gpuslice_dra::model::{Model, PRODUCTS};
use gpuslice_dra::publish::{desired_spec, slice_name};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker/k8s")
}

/// The YAML documents of `file`, as JSON values.
fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display()));
            serde_json::to_value(value).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn round_trip<T: DeserializeOwned + Serialize>(what: &str, value: &Value) -> Value {
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{what}: does not deserialise: {e}"));
    serde_json::to_value(&typed).unwrap()
}

/// Checks one document against the type its apiVersion/kind name; returns the kind.
fn check(file: &Path, doc: &Value) -> String {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let what = format!(
        "{} ({api_version} {kind} {})",
        file.display(),
        doc["metadata"]["name"]
    );
    macro_rules! dispatch {
        ($($ty:ty),*) => {{
            $(
                if api_version == <$ty as k8s_openapi::Resource>::API_VERSION
                    && kind == <$ty as k8s_openapi::Resource>::KIND
                {
                    round_trip::<$ty>(&what, doc)
                } else
            )*
            {
                panic!("{what}: no k8s-openapi type for this apiVersion/kind")
            }
        }};
    }
    let back = dispatch!(
        DaemonSet,
        Pod,
        ServiceAccount,
        ClusterRole,
        ClusterRoleBinding,
        DeviceClass,
        ResourceClaim,
        ResourceClaimTemplate,
        ResourceSlice
    );
    assert_eq!(
        &back, doc,
        "{what}: a field was lost reading it (misspelt or misplaced?)"
    );
    kind.to_string()
}

#[test]
fn every_manifest_is_its_kubernetes_type() {
    let mut kinds = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(k8s_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    for file in &files {
        for doc in documents(file) {
            kinds.push(check(file, &doc));
        }
    }
    for kind in [
        "DaemonSet",
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
        "DeviceClass",
        "ResourceClaimTemplate",
        "ResourceClaim",
        "ResourceSlice",
        "Pod",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} among {kinds:?}");
    }
}

#[test]
fn a_misspelt_field_fails() {
    let mut doc = documents(&k8s_dir().join("deviceclass.yaml")).remove(0);
    doc["spec"]["selector"] = doc["spec"]["selectors"].take();
    doc["spec"].as_object_mut().unwrap().remove("selectors");
    let result = std::panic::catch_unwind(|| check(Path::new("deviceclass.yaml"), &doc));
    assert!(result.is_err(), "a misspelt field was accepted");
}

#[test]
fn the_resourceslice_example_is_what_the_driver_publishes() {
    let doc = documents(&k8s_dir().join("resourceslice-example.yaml")).remove(0);
    let example: ResourceSlice = serde_json::from_value(doc).unwrap();
    let v100 = Gpu {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        name: "Tesla V100-PCIE-32GB".into(),
        memory_bytes: 32 << 30,
        compute_capability: (7, 0),
        driver_version: "580.65.06".into(),
        cuda_driver_version: (13, 0),
    };
    assert_eq!(
        example.metadata.name.as_deref(),
        Some(slice_name("gpuslice.dev", "gpu-node-1").as_str())
    );
    assert_eq!(
        example.spec,
        desired_spec("gpuslice.dev", "gpu-node-1", &[v100], Model::Products, 1)
    );
}

#[test]
fn the_claim_templates_ask_for_products_the_driver_offers() {
    let templates = documents(&k8s_dir().join("resourceclaimtemplates.yaml"));
    let mut shares = Vec::new();
    for doc in templates {
        let template: ResourceClaimTemplate = serde_json::from_value(doc).unwrap();
        for request in template.spec.spec.devices.unwrap().requests.unwrap() {
            let exactly = request.exactly.unwrap();
            assert_eq!(exactly.device_class_name, "slice.gpuslice.dev");
            for selector in exactly.selectors.unwrap_or_default() {
                let expression = selector.cel.unwrap().expression;
                let share: u32 = expression
                    .strip_prefix("device.attributes[\"gpuslice.dev\"].share == ")
                    .unwrap_or_else(|| panic!("unexpected selector {expression}"))
                    .parse()
                    .unwrap();
                shares.push(share);
            }
        }
    }
    let offered: Vec<u32> = PRODUCTS.iter().map(|(share, _)| *share).collect();
    assert_eq!(shares, offered);
}
