//! The API server's rules for a ResourceSlice, as a stated Kubernetes version and feature-gate
//! set applies them on create and update: first the registry strategy drops the fields of
//! disabled features, then validation refuses what breaks the rules the driver's objects
//! touch, with the field paths, wording and HTTP status (422 Invalid, a Status body with
//! causes) of the real server.
//!
//! Followed from upstream kubernetes/kubernetes, read for this (written here from scratch):
//! * `pkg/registry/resource/resourceslice/strategy.go` (`PrepareForCreate`,
//!   `PrepareForUpdate`, `dropDisabledFields` and its per-gate `dropDisabled*Fields` with the
//!   "feature in use by the old object" ratchet): DRADeviceTaints drops `devices[].taints`;
//!   DRAPartitionableDevices drops `sharedCounters`, `perDeviceNodeSelection` and
//!   `devices[].consumesCounters/nodeName/nodeSelector/allNodes`; DRADeviceBindingConditions
//!   (with DRAResourceClaimDeviceStatus) drops `devices[].bindingConditions/
//!   bindingFailureConditions/bindsToNode`; DRAConsumableCapacity drops
//!   `devices[].allowMultipleAllocations` and `devices[].capacity[].requestPolicy`.
//! * `pkg/apis/resource/validation/validation.go` (`validateResourceSliceSpec`,
//!   `validateDevice`, `validateCounterSet`, `validateDeviceCounterConsumption`,
//!   `validateRequestPolicy*`, `validateDeviceAttribute`, `validateQualifiedName`), in the
//!   release-1.34 form (counter sets in the devices' slice: every `consumesCounters` names a
//!   set and counters of the same slice; at most 32 counters in all sets and 1024 consumed in
//!   all devices; 128 devices) and the 1.35 form kept in 1.36 (`only one of sharedCounters or
//!   devices is allowed`; 128 devices, 64 when any consumes counters or has taints; 8 counter
//!   sets of at most 32 counters; 2 counter consumptions per device).
//! * `pkg/features/kube_features.go` for the defaults: DRAPartitionableDevices (alpha
//!   1.33, beta on 1.36), DRAConsumableCapacity (alpha 1.34, beta on 1.36), DRADeviceTaints
//!   (alpha 1.33, beta on 1.36), DRAExtendedResource (alpha 1.34, beta on 1.36),
//!   DRADeviceBindingConditions (alpha 1.34, beta on 1.36), DRAResourceClaimDeviceStatus
//!   (beta on 1.33).
//! * `staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go` for how a field
//!   error reads (`spec: Invalid value: "": ...`) and the Status of an Invalid error.
//!
//! * `pkg/apis/resource/v1/defaults.go`: a taint's `timeAdded` ([`default_fields`]).
//! * 1.37 as the real v1.37.2 server answers (`dra/tests/cluster.rs` holds every rule here
//!   against it, with default gates and with the DRA gates off): its declarative validation
//!   reports duplicates at the list item and map-key errors at the map, and its attribute
//!   union message lists the list-valued kinds.
//! * 1.34 as the real v1.34.4 server answers (held the same way with
//!   `GPUSLICE_K8S_MINORS=1.34`): an empty driver name gets the subdomain error too, and an
//!   attribute with two values is printed as its internal Go struct.
//!
//! Not modelled: CEL, node selectors (the driver sets
//! `nodeName`), and fields the driver never sets beyond being dropped. The forms of 1.35 and
//! 1.36 are read from their source and have not been held against a real server of theirs.

use serde_json::{json, Value};

/// The cluster the fake API server plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cluster {
    pub minor: u32,
    pub partitionable_devices: bool,
    pub consumable_capacity: bool,
    pub device_taints: bool,
    pub extended_resource: bool,
    pub binding_conditions: bool,
}

impl Cluster {
    /// Kubernetes 1.`minor` with every DRA gate at its default.
    pub const fn defaults(minor: u32) -> Cluster {
        let beta = minor >= 36;
        Cluster {
            minor,
            partitionable_devices: beta,
            consumable_capacity: beta,
            device_taints: beta,
            extended_resource: beta,
            binding_conditions: beta,
        }
    }

    /// The same version with the DRA alpha gates the driver uses turned on.
    pub const fn with_alpha_gates(self) -> Cluster {
        Cluster {
            partitionable_devices: true,
            consumable_capacity: true,
            device_taints: true,
            extended_resource: true,
            ..self
        }
    }

    pub const V1_34: Cluster = Cluster::defaults(34);
    pub const V1_34_GATES: Cluster = Cluster::defaults(34).with_alpha_gates();
    pub const V1_35: Cluster = Cluster::defaults(35);
    pub const V1_35_GATES: Cluster = Cluster::defaults(35).with_alpha_gates();
    pub const V1_36: Cluster = Cluster::defaults(36);

    /// What `GET /version` answers.
    pub fn version(&self) -> Value {
        json!({"major": "1", "minor": self.minor.to_string(),
               "gitVersion": format!("v1.{}.0", self.minor), "platform": "linux/amd64"})
    }
}

/// How the API server prints an attribute as the bad value of its error up to 1.36: its
/// internal Go struct (`resource.DeviceAttribute` of pkg/apis/resource/types.go, no JSON tags)
/// through `json.Marshal`, every field of the release in declaration order, unset ones `null`
/// (the list-valued ones from 1.36), as `validateDeviceAttribute`
/// (pkg/apis/resource/validation/validation.go) passes the whole attribute to `field.Invalid`;
/// the real v1.34.4 prints `{"IntValue":1,"BoolValue":null,"StringValue":"x",
/// "VersionValue":null}`.
fn internal_attribute(attribute: &Value, minor: u32) -> String {
    let mut fields = vec![
        ("IntValue", "int"),
        ("BoolValue", "bool"),
        ("StringValue", "string"),
        ("VersionValue", "version"),
    ];
    if minor >= 36 {
        fields.extend([
            ("IntValues", "ints"),
            ("BoolValues", "bools"),
            ("StringValues", "strings"),
            ("VersionValues", "versions"),
        ]);
    }
    let fields: Vec<String> = fields
        .iter()
        .map(|(go, json)| {
            let value = attribute.get(*json).cloned().unwrap_or(Value::Null);
            format!("{}:{value}", Value::from(*go))
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

fn devices_mut(spec: &mut Value) -> Vec<&mut serde_json::Map<String, Value>> {
    spec.get_mut("devices")
        .and_then(Value::as_array_mut)
        .map(|d| d.iter_mut().filter_map(Value::as_object_mut).collect())
        .unwrap_or_default()
}

fn devices(spec: &Value) -> Vec<&serde_json::Map<String, Value>> {
    spec.get("devices")
        .and_then(Value::as_array)
        .map(|d| d.iter().filter_map(Value::as_object).collect())
        .unwrap_or_default()
}

fn any_device(
    spec: Option<&Value>,
    test: impl Fn(&serde_json::Map<String, Value>) -> bool,
) -> bool {
    spec.is_some_and(|spec| devices(spec).into_iter().any(test))
}

fn nonempty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

fn set(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null))
}

/// The v1 defaults of a ResourceSlice's spec (`pkg/apis/resource/v1/defaults.go`, applied when
/// the request is decoded): a device taint without `timeAdded` gets the time, to the second.
pub fn default_fields(spec: &mut Value) {
    let now = k8s_openapi::chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    for device in devices_mut(spec) {
        for taint in device
            .get_mut("taints")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(taint) = taint.as_object_mut() {
                taint
                    .entry("timeAdded")
                    .or_insert_with(|| json!(now.clone()));
            }
        }
    }
}

/// `dropDisabledFields(new, old)`: what the strategy removes from `new` (a slice's spec) on
/// create (`old` = None) and update.
pub fn drop_disabled_fields(cluster: &Cluster, new: &mut Value, old: Option<&Value>) {
    let taints_in_use = any_device(old, |d| nonempty(d.get("taints")));
    if !cluster.device_taints && !taints_in_use {
        for d in devices_mut(new) {
            d.remove("taints");
        }
    }
    let partitionable_in_use = old.is_some_and(|old| {
        nonempty(old.get("sharedCounters")) || set(old.get("perDeviceNodeSelection"))
    }) || any_device(old, |d| {
        nonempty(d.get("consumesCounters"))
            || set(d.get("nodeName"))
            || set(d.get("nodeSelector"))
            || set(d.get("allNodes"))
    });
    if !cluster.partitionable_devices && !partitionable_in_use {
        if let Some(spec) = new.as_object_mut() {
            spec.remove("sharedCounters");
            spec.remove("perDeviceNodeSelection");
        }
        for d in devices_mut(new) {
            for field in ["consumesCounters", "nodeName", "nodeSelector", "allNodes"] {
                d.remove(field);
            }
        }
    }
    let binding_in_use = any_device(old, |d| {
        nonempty(d.get("bindingConditions"))
            || nonempty(d.get("bindingFailureConditions"))
            || set(d.get("bindsToNode"))
    });
    // DRAResourceClaimDeviceStatus is beta and on in every version played here.
    if !cluster.binding_conditions && !binding_in_use {
        for d in devices_mut(new) {
            for field in [
                "bindingConditions",
                "bindingFailureConditions",
                "bindsToNode",
            ] {
                d.remove(field);
            }
        }
    }
    let consumable_in_use = any_device(old, |d| {
        set(d.get("allowMultipleAllocations"))
            || d.get("capacity")
                .and_then(Value::as_object)
                .is_some_and(|c| c.values().any(|c| set(c.get("requestPolicy"))))
    });
    if !cluster.consumable_capacity && !consumable_in_use {
        for d in devices_mut(new) {
            d.remove("allowMultipleAllocations");
            if let Some(capacity) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                for c in capacity.values_mut().filter_map(Value::as_object_mut) {
                    c.remove("requestPolicy");
                }
            }
        }
    }
}

/// One field error, as `field.Error` has it.
#[derive(Debug, Clone)]
pub struct FieldError {
    pub kind: Kind,
    pub field: String,
    /// The bad value as Go's `%#v`-ish rendering shows it (strings quoted), if the kind shows one.
    pub value: String,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Invalid,
    Required,
    Forbidden,
    TooMany,
    TooLong,
    Duplicate,
    NotSupported,
}

impl FieldError {
    /// `field.Error.Error()`.
    pub fn text(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }

    fn body(&self) -> String {
        let with = |head: &str| {
            if self.detail.is_empty() {
                head.to_string()
            } else {
                format!("{head}: {}", self.detail)
            }
        };
        match self.kind {
            Kind::Invalid => format!("Invalid value: {}: {}", self.value, self.detail),
            Kind::Required => with("Required value"),
            Kind::Forbidden => with("Forbidden"),
            Kind::TooMany => format!("Too many: {}: {}", self.value, self.detail),
            Kind::TooLong => format!("Too long: {}", self.detail),
            Kind::Duplicate => format!("Duplicate value: {}", self.value),
            Kind::NotSupported => format!("Unsupported value: {}: {}", self.value, self.detail),
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            Kind::Invalid => "FieldValueInvalid",
            Kind::Required => "FieldValueRequired",
            Kind::Forbidden => "FieldValueForbidden",
            Kind::TooMany => "FieldValueTooMany",
            Kind::TooLong => "FieldValueTooLong",
            Kind::Duplicate => "FieldValueDuplicate",
            Kind::NotSupported => "FieldValueNotSupported",
        }
    }
}

/// The 422 Status the server answers for `errors` on object `name` of `kind` in `group`.
pub fn invalid_status(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Value {
    let listed: Vec<String> = errors.iter().map(FieldError::text).collect();
    let joined = if listed.len() == 1 {
        listed[0].clone()
    } else {
        format!("[{}]", listed.join(", "))
    };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{kind}.{group} {name:?} is invalid: {joined}"),
        "reason": "Invalid",
        "details": {"name": name, "group": group, "kind": kind,
                    "causes": errors.iter().map(|e| json!({
                        "reason": e.reason(), "message": e.body(), "field": e.field})).collect::<Vec<_>>()},
        "code": 422,
    })
}

struct Errors(Vec<FieldError>);

impl Errors {
    fn push(
        &mut self,
        kind: Kind,
        field: impl Into<String>,
        value: String,
        detail: impl Into<String>,
    ) {
        self.0.push(FieldError {
            kind,
            field: field.into(),
            value,
            detail: detail.into(),
        });
    }
}

fn q(s: &str) -> String {
    format!("{s:?}")
}

const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
/// The members of a device attribute's value union (1.37's declarative message).
const ATTRIBUTE_KINDS: &str =
    "`int`, `bool`, `string`, `version`, `ints`, `bools`, `strings`, `versions`";
const C_IDENTIFIER: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn label(errs: &mut Errors, field: &str, s: &str) {
    if s.len() > 63 {
        errs.push(
            Kind::Invalid,
            field,
            q(s),
            "must be no more than 63 characters",
        );
    }
    if !is_label(s) {
        errs.push(Kind::Invalid, field, q(s), DNS1123_LABEL);
    }
}

fn subdomain(errs: &mut Errors, field: &str, s: &str) {
    if s.len() > 253 {
        errs.push(
            Kind::Invalid,
            field,
            q(s),
            "must be no more than 253 characters",
        );
    }
    if s.is_empty() || !s.split('.').all(is_label) {
        errs.push(Kind::Invalid, field, q(s), DNS1123_SUBDOMAIN);
    }
}

fn c_identifier(errs: &mut Errors, field: &str, s: &str) {
    if s.len() > 32 {
        errs.push(
            Kind::TooLong,
            field,
            String::new(),
            "may not be more than 32 bytes",
        );
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if !ok {
        errs.push(Kind::Invalid, field, q(s), C_IDENTIFIER);
    }
}

/// `validateQualifiedName`: `id` or `domain/id`.
/// `validateQualifiedName`: a C identifier, or `domain/identifier`. A name with more than one
/// slash is accepted unchecked (an upstream gap its source notes as a TODO, seen on 1.37).
fn qualified_name(errs: &mut Errors, field: &str, name: &str) {
    let parts: Vec<&str> = name.split('/').collect();
    match parts[..] {
        [name] => c_identifier(errs, field, name),
        [domain, id] => {
            if domain.is_empty() {
                errs.push(Kind::Invalid, field, q(""), "the domain must not be empty");
            } else {
                if domain.len() > 63 {
                    errs.push(
                        Kind::TooLong,
                        field,
                        String::new(),
                        "may not be more than 63 bytes",
                    );
                }
                subdomain(errs, field, domain);
            }
            if id.is_empty() {
                errs.push(Kind::Invalid, field, q(""), "the name must not be empty");
            } else {
                c_identifier(errs, field, id);
            }
        }
        _ => {}
    }
}

fn semver(s: &str) -> bool {
    let core = s.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
        })
}

/// A quantity as the server parses it (whole numbers here: all the driver sends); `None`
/// when it is not one.
fn quantity(v: Option<&Value>) -> Option<u128> {
    gpuslice_dra::quantity::parse(v?.as_str()?)
        .ok()
        .map(u128::from)
}

/// `validateRequestPolicy` of a capacity whose value is `value` (`capacity_text` as sent).
fn validate_request_policy(
    errs: &mut Errors,
    path: &str,
    value: Option<u128>,
    capacity_text: &str,
    policy: &Value,
) {
    let Some(capacity) = value else { return };
    let has_values = nonempty(policy.get("validValues"));
    let range = policy.get("validRange").filter(|r| set(Some(r)));
    if has_values && range.is_some() {
        errs.push(
            Kind::Forbidden,
            path,
            String::new(),
            "exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time",
        );
        return;
    }
    let default = quantity(policy.get("default"));
    if let Some(range) = range {
        let Some(default) = default else {
            errs.push(
                Kind::Required,
                format!("{path}.default"),
                String::new(),
                "required when validRange is defined",
            );
            return;
        };
        let Some(min) = quantity(range.get("min")) else {
            errs.push(
                Kind::Required,
                format!("{path}.validRange.min"),
                String::new(),
                "required when validRange is defined",
            );
            return;
        };
        let text = |v: Option<&Value>| q(v.and_then(Value::as_str).unwrap_or_default());
        if min > capacity {
            errs.push(
                Kind::Invalid,
                format!("{path}.validRange.min"),
                text(range.get("min")),
                format!("min is larger than capacity value: {capacity_text}"),
            );
        }
        if default < min {
            errs.push(
                Kind::Invalid,
                format!("{path}.validRange.min"),
                text(policy.get("default")),
                "default is less than min",
            );
        }
        if let Some(max) = quantity(range.get("max")) {
            if min > max {
                errs.push(
                    Kind::Invalid,
                    format!("{path}.validRange.max"),
                    text(range.get("min")),
                    "min is larger than max",
                );
            }
            if max > capacity {
                errs.push(
                    Kind::Invalid,
                    format!("{path}.validRange.max"),
                    text(range.get("max")),
                    format!("max is larger than capacity value: {capacity_text}"),
                );
            }
            if default > max {
                errs.push(
                    Kind::Invalid,
                    format!("{path}.validRange.max"),
                    text(policy.get("default")),
                    "default is more than max",
                );
            }
        }
        if let Some(step) = quantity(range.get("step")).filter(|s| *s > 0) {
            if min + step > capacity {
                errs.push(
                    Kind::Invalid,
                    format!("{path}.validRange.step"),
                    text(range.get("step")),
                    "one step is larger than capacity value",
                );
            }
            let step_text = range["step"].as_str().unwrap_or_default();
            let min_text = range["min"].as_str().unwrap_or_default();
            let mut check = |v: u128, value: Option<&Value>| {
                if !(v - min.min(v)).is_multiple_of(step) {
                    errs.push(
                        Kind::Invalid,
                        format!("{path}.validRange.step"),
                        text(value),
                        format!(
                            "value is not a multiple of a given step ({step_text}) from ({min_text})"
                        ),
                    );
                }
            };
            check(default, policy.get("default"));
            if let Some(max) = quantity(range.get("max")) {
                check(max, range.get("max"));
            }
        }
    } else if has_values && default.is_none() {
        errs.push(
            Kind::Required,
            format!("{path}.default"),
            String::new(),
            "required when validValues is defined",
        );
    }
}

/// `ValidateResourceSlice` / `ValidateResourceSliceUpdate` for `cluster`'s release, on the
/// object after [`drop_disabled_fields`]. `old`: the stored object on update.
pub fn validate_resource_slice(
    cluster: &Cluster,
    slice: &Value,
    old: Option<&Value>,
) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    let name = slice["metadata"]["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        errs.push(
            Kind::Required,
            "metadata.name",
            String::new(),
            "name or generateName is required",
        );
    } else {
        subdomain(&mut errs, "metadata.name", name);
    }
    let spec = &slice["spec"];
    let driver = spec["driver"].as_str().unwrap_or_default();
    if driver.is_empty() {
        errs.push(Kind::Required, "spec.driver", String::new(), "");
        // Up to 1.34 the subdomain check runs on the empty name too (a second cause, as the
        // real v1.34.4 answers); from 1.35 a missing name ends the check
        // (`ValidateCSIDriverName`, pkg/apis/core/validation/validation.go).
        if cluster.minor <= 34 {
            subdomain(&mut errs, "spec.driver", "");
        }
    } else {
        if driver.len() > 63 {
            errs.push(
                Kind::TooLong,
                "spec.driver",
                String::new(),
                "may not be more than 63 bytes",
            );
        }
        subdomain(&mut errs, "spec.driver", &driver.to_lowercase());
    }
    // The pool.
    let pool = &spec["pool"];
    let pool_name = pool["name"].as_str().unwrap_or_default();
    if pool_name.is_empty() {
        errs.push(Kind::Required, "spec.pool.name", String::new(), "");
    } else {
        if pool_name.len() > 253 {
            errs.push(
                Kind::TooLong,
                "spec.pool.name",
                String::new(),
                "may not be more than 253 bytes",
            );
        }
        for part in pool_name.split('/') {
            subdomain(&mut errs, "spec.pool.name", part);
        }
    }
    let count = pool["resourceSliceCount"].as_i64().unwrap_or(0);
    if count <= 0 {
        errs.push(
            Kind::Invalid,
            "spec.pool.resourceSliceCount",
            count.to_string(),
            "must be greater than zero",
        );
    }
    let generation = pool["generation"].as_i64().unwrap_or(0);
    if generation < 0 {
        errs.push(
            Kind::Invalid,
            "spec.pool.generation",
            generation.to_string(),
            "must be greater than or equal to zero",
        );
    }
    if let Some(old) = old {
        for (path, new, was) in [
            (
                "spec.pool.name",
                &spec["pool"]["name"],
                &old["spec"]["pool"]["name"],
            ),
            ("spec.driver", &spec["driver"], &old["spec"]["driver"]),
            ("spec.nodeName", &spec["nodeName"], &old["spec"]["nodeName"]),
        ] {
            if new != was {
                errs.push(Kind::Invalid, path, new.to_string(), "field is immutable");
            }
        }
    }
    // Node selection: exactly one.
    let mut selected = Vec::new();
    match spec.get("nodeName") {
        Some(Value::String(n)) if !n.is_empty() => {
            selected.push("`nodeName`");
            subdomain(&mut errs, "spec.nodeName", n);
        }
        Some(Value::String(_)) => errs.push(
            Kind::Invalid,
            "spec.nodeName",
            q(""),
            "must be either unset or set to a non-empty string",
        ),
        _ => {}
    }
    if set(spec.get("nodeSelector")) {
        selected.push("`nodeSelector`");
    }
    match spec.get("allNodes") {
        Some(Value::Bool(true)) => selected.push("`allNodes`"),
        Some(Value::Bool(false)) => errs.push(
            Kind::Invalid,
            "spec.allNodes",
            "false".into(),
            "must be either unset or set to true",
        ),
        _ => {}
    }
    match spec.get("perDeviceNodeSelection") {
        Some(Value::Bool(true)) => selected.push("`perDeviceNodeSelection`"),
        Some(Value::Bool(false)) => errs.push(
            Kind::Invalid,
            "spec.perDeviceNodeSelection",
            "false".into(),
            "must be either unset or set to true",
        ),
        _ => {}
    }
    match selected.len() {
        0 => errs.push(Kind::Required, "spec", String::new(), "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"),
        1 => {}
        _ => errs.push(Kind::Invalid, "spec", q(&format!("{{{}}}", selected.join(", "))), "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set"),
    }

    let since_135 = cluster.minor >= 35;
    // 1.37 reports list-item errors as its declarative validation does: duplicates at the
    // item, map-key errors at the map.
    let declarative = cluster.minor >= 37;
    let shared: Vec<&Value> = spec
        .get("sharedCounters")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if since_135 && set(spec.get("sharedCounters")) && set(spec.get("devices")) {
        errs.push(
            Kind::Invalid,
            "spec",
            q(""),
            "only one of `sharedCounters` or `devices` is allowed",
        );
    }
    let list = devices(spec);
    let consumes = list.iter().any(|d| nonempty(d.get("consumesCounters")));
    let tainted = list.iter().any(|d| nonempty(d.get("taints")));
    let max_devices = if since_135 && (consumes || tainted) {
        64
    } else {
        128
    };
    if list.len() > max_devices {
        errs.push(
            Kind::TooMany,
            "spec.devices",
            list.len().to_string(),
            format!("must have at most {max_devices} items"),
        );
        return errs.0;
    }
    // Shared counters.
    let mut set_names = std::collections::BTreeMap::new();
    if since_135 && shared.len() > 8 {
        errs.push(
            Kind::TooMany,
            "spec.sharedCounters",
            shared.len().to_string(),
            "must have at most 8 items",
        );
    }
    let total_counters: usize = shared
        .iter()
        .map(|s| s["counters"].as_object().map_or(0, |c| c.len()))
        .sum();
    if !since_135 && total_counters > 32 {
        errs.push(
            Kind::Invalid,
            "spec.sharedCounters",
            total_counters.to_string(),
            "the total number of shared counters must not exceed 32",
        );
    }
    for (i, counter_set) in shared.iter().enumerate() {
        let path = format!("spec.sharedCounters[{i}]");
        let set_name = counter_set["name"].as_str().unwrap_or_default();
        if set_name.is_empty() {
            errs.push(Kind::Required, format!("{path}.name"), String::new(), "");
        } else {
            label(&mut errs, &format!("{path}.name"), set_name);
        }
        let counters = counter_set["counters"].as_object();
        match counters {
            Some(c) if !c.is_empty() => {
                if since_135 && c.len() > 32 {
                    errs.push(
                        Kind::TooMany,
                        format!("{path}.counters"),
                        c.len().to_string(),
                        "must have at most 32 items",
                    );
                }
                for key in c.keys() {
                    let at = if declarative {
                        format!("{path}.counters")
                    } else {
                        format!("{path}.counters[{key}]")
                    };
                    label(&mut errs, &at, key);
                }
            }
            _ => errs.push(
                Kind::Required,
                format!("{path}.counters"),
                String::new(),
                "",
            ),
        }
        if set_names
            .insert(
                set_name.to_string(),
                counters
                    .map(|c| c.keys().cloned().collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .is_some()
        {
            if declarative {
                let item = format!(
                    "{{\"name\":{},\"counters\":{}}}",
                    q(set_name),
                    counter_set["counters"]
                );
                errs.push(Kind::Duplicate, path.clone(), item, "");
            } else {
                errs.push(Kind::Duplicate, format!("{path}.name"), q(set_name), "");
            }
        }
    }
    // Devices.
    let mut names = std::collections::BTreeSet::new();
    let mut consumed_total = 0usize;
    for (i, device) in list.iter().enumerate() {
        let path = format!("spec.devices[{i}]");
        let device_name = device
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if device_name.is_empty() {
            errs.push(Kind::Required, format!("{path}.name"), String::new(), "");
        } else {
            label(&mut errs, &format!("{path}.name"), device_name);
        }
        if !names.insert(device_name.to_string()) {
            let at = if declarative {
                path.clone()
            } else {
                format!("{path}.name")
            };
            errs.push(Kind::Duplicate, at, q(device_name), "");
        }
        let attributes = device.get("attributes").and_then(Value::as_object);
        let capacity = device.get("capacity").and_then(Value::as_object);
        let combined = attributes.map_or(0, |a| a.len()) + capacity.map_or(0, |c| c.len());
        if combined > 32 {
            errs.push(
                Kind::Invalid,
                path.clone(),
                combined.to_string(),
                "the total number of attributes and capacities must not exceed 32",
            );
        }
        for (key, attribute) in attributes.into_iter().flatten() {
            let apath = format!("{path}.attributes[{key}]");
            qualified_name(&mut errs, &apath, key);
            let kinds: Vec<&str> = ["int", "bool", "string", "version"]
                .into_iter()
                .filter(|k| set(attribute.get(*k)))
                .collect();
            match (kinds.len(), cluster.minor) {
                (1, _) => {}
                (0, ..=34) => errs.push(
                    Kind::Required,
                    apath.clone(),
                    String::new(),
                    "exactly one value must be specified",
                ),
                (0, 35..=36) => errs.push(
                    Kind::Invalid,
                    apath.clone(),
                    q(""),
                    "exactly one value must be specified",
                ),
                (_, ..=36) => errs.push(
                    Kind::Invalid,
                    apath.clone(),
                    internal_attribute(attribute, cluster.minor),
                    "exactly one value must be specified",
                ),
                // The declarative union check (list-valued attributes are members from 1.37).
                (0, _) => errs.push(
                    Kind::Invalid,
                    apath.clone(),
                    q(""),
                    format!("must specify one of: {ATTRIBUTE_KINDS}"),
                ),
                (_, _) => errs.push(
                    Kind::Invalid,
                    apath.clone(),
                    q(&format!("{{{}}}", kinds.join(", "))),
                    format!("must specify exactly one of: {ATTRIBUTE_KINDS}"),
                ),
            }
            if let Some(s) = attribute.get("string").and_then(Value::as_str) {
                if s.len() > 64 {
                    errs.push(
                        Kind::TooLong,
                        format!("{apath}.string"),
                        String::new(),
                        "may not be more than 64 bytes",
                    );
                }
            }
            if let Some(v) = attribute.get("version").and_then(Value::as_str) {
                if !semver(v) {
                    errs.push(
                        Kind::Invalid,
                        format!("{apath}.version"),
                        q(v),
                        "must be a string compatible with semver.org spec 2.0.0",
                    );
                }
                if v.len() > 64 {
                    errs.push(
                        Kind::TooLong,
                        format!("{apath}.version"),
                        String::new(),
                        "may not be more than 64 bytes",
                    );
                }
            }
        }
        let multiple = device.get("allowMultipleAllocations") == Some(&Value::Bool(true));
        for (key, cap) in capacity.into_iter().flatten() {
            let cpath = format!("{path}.capacity[{key}]");
            qualified_name(&mut errs, &cpath, key);
            if let Some(policy) = cap.get("requestPolicy").filter(|p| set(Some(p))) {
                if multiple {
                    validate_request_policy(
                        &mut errs,
                        &format!("{cpath}.requestPolicy"),
                        quantity(cap.get("value")),
                        cap["value"].as_str().unwrap_or_default(),
                        policy,
                    );
                } else {
                    errs.push(
                        Kind::Forbidden,
                        format!("{cpath}.requestPolicy"),
                        String::new(),
                        "allowMultipleAllocations must be true",
                    );
                }
            }
        }
        // Taints.
        let taints: Vec<&Value> = device
            .get("taints")
            .and_then(Value::as_array)
            .map(|t| t.iter().collect())
            .unwrap_or_default();
        let max_taints = if cluster.minor >= 35 { 16 } else { 4 };
        if taints.len() > max_taints {
            errs.push(
                Kind::TooMany,
                format!("{path}.taints"),
                taints.len().to_string(),
                format!("must have at most {max_taints} items"),
            );
        }
        for (t, taint) in taints.iter().enumerate() {
            let tpath = format!("{path}.taints[{t}]");
            let key = taint["key"].as_str().unwrap_or_default();
            if key.is_empty() {
                // ValidateLabelName: both the emptiness and the pattern complain.
                errs.push(
                    Kind::Invalid,
                    format!("{tpath}.key"),
                    q(""),
                    "name part must be non-empty",
                );
                errs.push(
                    Kind::Invalid,
                    format!("{tpath}.key"),
                    q(""),
                    QUALIFIED_NAME_PART,
                );
            }
            match taint["effect"].as_str() {
                Some("NoSchedule" | "NoExecute") => {}
                Some("None") if cluster.minor >= 35 => {}
                None => errs.push(Kind::Required, format!("{tpath}.effect"), String::new(), ""),
                Some(other) => errs.push(
                    Kind::NotSupported,
                    format!("{tpath}.effect"),
                    q(other),
                    if cluster.minor >= 35 {
                        "supported values: \"NoExecute\", \"NoSchedule\", \"None\""
                    } else {
                        "supported values: \"NoExecute\", \"NoSchedule\""
                    },
                ),
            }
        }
        // Counter consumption.
        let consumptions: Vec<&Value> = device
            .get("consumesCounters")
            .and_then(Value::as_array)
            .map(|c| c.iter().collect())
            .unwrap_or_default();
        if since_135 && consumptions.len() > 2 {
            errs.push(
                Kind::TooMany,
                format!("{path}.consumesCounters"),
                consumptions.len().to_string(),
                "must have at most 2 items",
            );
        }
        let mut consumed_sets = std::collections::BTreeSet::new();
        for (c, consumption) in consumptions.iter().enumerate() {
            let cpath = format!("{path}.consumesCounters[{c}]");
            let set_name = consumption["counterSet"].as_str().unwrap_or_default();
            if set_name.is_empty() {
                errs.push(
                    Kind::Required,
                    format!("{cpath}.counterSet"),
                    String::new(),
                    "",
                );
            } else {
                label(&mut errs, &format!("{cpath}.counterSet"), set_name);
            }
            if !consumed_sets.insert(set_name) {
                if declarative {
                    let item = format!(
                        "{{\"counterSet\":{},\"counters\":{}}}",
                        q(set_name),
                        consumption["counters"]
                    );
                    errs.push(Kind::Duplicate, cpath.clone(), item, "");
                } else {
                    errs.push(
                        Kind::Duplicate,
                        format!("{cpath}.counterSet"),
                        q(set_name),
                        "",
                    );
                }
            }
            let counters = consumption["counters"].as_object();
            match counters {
                Some(m) if !m.is_empty() => {
                    consumed_total += m.len();
                    if since_135 && m.len() > 32 {
                        errs.push(
                            Kind::TooMany,
                            format!("{cpath}.counters"),
                            m.len().to_string(),
                            "must have at most 32 items",
                        );
                    }
                }
                _ => errs.push(
                    Kind::Required,
                    format!("{cpath}.counters"),
                    String::new(),
                    "",
                ),
            }
            // 1.34: the set and its counters are this slice's.
            if !since_135 {
                match set_names.get(set_name) {
                    None => errs.push(
                        Kind::Invalid,
                        format!("{cpath}.counterSet"),
                        q(set_name),
                        "must reference a counterSet defined in the ResourceSlice sharedCounters",
                    ),
                    Some(known) => {
                        for key in counters.into_iter().flatten().map(|(k, _)| k) {
                            if !known.contains(key) {
                                errs.push(Kind::Invalid, format!("{cpath}.counters"), q(key), "must reference a counter defined in the ResourceSlice sharedCounters");
                            }
                        }
                    }
                }
            }
        }
    }
    if !since_135 && consumed_total > 1024 {
        errs.push(
            Kind::Invalid,
            "spec.devices",
            consumed_total.to_string(),
            "the total number of counters in devices must not exceed 1024",
        );
    }
    errs.0
}
