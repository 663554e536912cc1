//! Every manifest in docker/k8s/ (and tenant/) is what its `kind` says: each YAML document
//! deserialises into its k8s-openapi type and serialises back to exactly the same JSON. k8s-openapi skips
//! unknown fields when reading, so the round trip is what catches a misspelt field name (it
//! disappears). The ResourceSlice example is exactly what the driver publishes.

use std::path::{Path, PathBuf};

use gpuslice_dra::inventory::Gpu;
use gpuslice_dra::model::{self, Model, PRODUCTS};
use gpuslice_dra::publish::{desired_slices, Layout};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, ServiceAccount};
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
        ResourceQuota,
        ServiceAccount,
        ValidatingAdmissionPolicy,
        ValidatingAdmissionPolicyBinding,
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

/// The manifests of docker/k8s and its sub-directories, kustomization files aside.
fn manifests() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![k8s_dir()];
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_manifest_is_its_kubernetes_type() {
    let mut kinds = Vec::new();
    let files = manifests();
    assert!(files.len() >= 10, "{files:?}");
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
        "ResourceQuota",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
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
    let docs = documents(&k8s_dir().join("resourceslice-example.yaml"));
    let v100 = Gpu {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        name: "Tesla V100-PCIE-32GB".into(),
        memory_bytes: 32 << 30,
        compute_capability: (7, 0),
        driver_version: "580.65.06".into(),
        cuda_driver_version: (13, 0),
        oversubscription: None,
    };
    let want = desired_slices(
        "gpuslice.dev",
        "gpu-node-1",
        &[v100],
        Model::Products,
        Layout::Split,
        1,
        &Default::default(),
        false,
    );
    assert_eq!(docs.len(), want.len());
    for (doc, (name, spec)) in docs.into_iter().zip(want) {
        let example: ResourceSlice = serde_json::from_value(doc).unwrap();
        assert_eq!(example.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(example.spec, spec, "{name}");
    }
}

#[test]
fn the_claim_templates_ask_for_products_or_units_of_one_card() {
    let templates = documents(&k8s_dir().join("tenant/resourceclaimtemplates.yaml"));
    let classes = product_classes();
    let mut shares = Vec::new();
    let mut units = Vec::new();
    for doc in templates {
        let template: ResourceClaimTemplate = serde_json::from_value(doc).unwrap();
        let name = template.metadata.name.clone().unwrap();
        let devices = template.spec.spec.devices.unwrap();
        for request in devices.requests.unwrap() {
            let exactly = request.exactly.unwrap();
            if exactly.device_class_name == "unit.gpuslice.dev" {
                let count = exactly.count.unwrap();
                assert_eq!(
                    exactly.allocation_mode.as_deref(),
                    Some("ExactCount"),
                    "{name}"
                );
                assert!((1..=model::UNITS_PER_GPU as i64).contains(&count), "{name}");
                // More than one unit: all on one card.
                if count > 1 {
                    let constraints = devices.constraints.clone().unwrap_or_default();
                    assert!(
                        constraints.iter().any(|c| c.match_attribute.as_deref()
                            == Some("gpuslice.dev/uuid")
                            && c.requests
                                .as_ref()
                                .is_some_and(|r| r.contains(&request.name))),
                        "{name}: units not constrained to one card"
                    );
                }
                units.push(count as u32 * model::UNIT_SHARE);
                continue;
            }
            // A product: one device of the product's class, which selects that share.
            assert_eq!(exactly.count, Some(1), "{name}");
            assert!(exactly.selectors.is_none(), "{name}");
            let share = classes
                .iter()
                .find(|(class, _)| *class == exactly.device_class_name)
                .unwrap_or_else(|| {
                    panic!("{name}: {} is no product class", exactly.device_class_name)
                })
                .1;
            assert_eq!(name, format!("gpu-slice-{share}"));
            shares.push(share);
        }
    }
    let offered: Vec<u32> = PRODUCTS.iter().map(|(share, _)| *share).collect();
    assert_eq!(shares, offered);
    assert_eq!(units, vec![25, 50, 100]);
}

/// The product classes of deviceclass.yaml: (class name, the share its selector picks).
fn product_classes() -> Vec<(String, u32)> {
    documents(&k8s_dir().join("deviceclass.yaml"))
        .into_iter()
        .map(|d| serde_json::from_value::<DeviceClass>(d).unwrap())
        .filter_map(|c| {
            let expression = c.spec.selectors.as_ref()?[0]
                .cel
                .as_ref()?
                .expression
                .clone();
            let (_, share) = expression.split_once(".share == ")?;
            expression
                .contains(".model == \"products\"")
                .then_some(())?;
            Some((c.metadata.name?, share.parse().ok()?))
        })
        .collect()
}

#[test]
fn product_classes_carry_extended_resource_names_the_pod_asks_for() {
    let classes: Vec<DeviceClass> = documents(&k8s_dir().join("deviceclass.yaml"))
        .into_iter()
        .map(|d| serde_json::from_value(d).unwrap())
        .collect();
    let extended: Vec<(String, String)> = classes
        .iter()
        .filter_map(|c| {
            let name = c.spec.extended_resource_name.clone()?;
            let expression = c.spec.selectors.as_ref()?[0]
                .cel
                .as_ref()?
                .expression
                .clone();
            Some((name, expression))
        })
        .collect();
    for (share, _) in PRODUCTS {
        let (_, expression) = extended
            .iter()
            .find(|(name, _)| *name == format!("gpuslice.dev/gpu-{share}"))
            .unwrap_or_else(|| panic!("no class for gpuslice.dev/gpu-{share}"));
        assert!(
            expression.ends_with(&format!(".share == {share}"))
                && expression.contains(".model == \"products\""),
            "{expression}"
        );
    }
    let pod: Pod =
        serde_json::from_value(documents(&k8s_dir().join("pod-extended-resource.yaml")).remove(0))
            .unwrap();
    let limits = pod.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    for (resource, amount) in limits {
        assert!(extended.iter().any(|(n, _)| *n == resource), "{resource}");
        assert_eq!(amount.0, "1");
    }
}
