//! A fake Kubernetes API server for the driver's tests: HTTP/1.1 with keep-alive on a local
//! port, JSON bodies, playing a stated Kubernetes version and feature-gate set ([`Cluster`]:
//! what it drops from a ResourceSlice and what it refuses, with the real status and message,
//! are upstream's rules in [`super::rules`]), and exactly the calls the driver makes:
//! * `GET  /version`
//! * `POST /api/v1/namespaces/{ns}/events` (stored: [`FakeApi::events`])
//! * `GET  /api/v1/nodes/{name}` (the nodes [`FakeApi::put_node`] registered; `common::NODE` and
//!   `gpu-node-2` from the start)
//! * `GET  /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`
//! * `GET  /apis/resource.k8s.io/v1/resourceslices?fieldSelector=...` (honours
//!   `spec.driver=` and `spec.nodeName=`)
//! * `POST /apis/resource.k8s.io/v1/resourceslices` (409 when the name exists; 422 when
//!   invalid; `?dryRun=All` answers what would be stored and stores nothing)
//! * `PUT  /apis/resource.k8s.io/v1/resourceslices/{name}` (409 on a stale resourceVersion;
//!   422 when invalid)
//! * `DELETE /apis/resource.k8s.io/v1/resourceslices/{name}`
//!
//! Anything else is answered 404 and recorded, so a test sees an unexpected call. Every
//! request is recorded (method, path, query, JSON body) for the tests to check what the driver
//! sent; objects written get a resourceVersion and uid as the real server gives them; the
//! slices held after every change are kept ([`FakeApi::history`]), so a test sees what was
//! stored even for a moment.
//!
//! One knob beyond a single server: [`FakeApi::set_cluster_for_writes`] has real writes judged
//! by other gates than dry runs, as two API server replicas behind one address are while their
//! flags are changed one at a time.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

pub use super::rules::Cluster;
use super::rules::{default_fields, drop_disabled_fields, invalid_status, validate_resource_slice};

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Option<Value>,
}

struct State {
    cluster: Cluster,
    events: Vec<Value>,
    nodes: HashMap<String, Value>,
    claims: HashMap<(String, String), Value>,
    slices: BTreeMap<String, Value>,
    /// `slices` after each change.
    history: Vec<BTreeMap<String, Value>>,
    /// Gates that real (not dry-run) writes are judged by, when not `cluster`'s.
    write_cluster: Option<Cluster>,
    requests: Vec<Recorded>,
    resource_version: u64,
}

/// The running server (its accept thread ends with the test process).
#[derive(Clone)]
pub struct FakeApi {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A server playing Kubernetes 1.36 with its default gates.
    pub fn start() -> FakeApi {
        FakeApi::start_as(Cluster::V1_36)
    }

    /// A server playing `cluster`.
    pub fn start_as(cluster: Cluster) -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            cluster,
            events: Vec::new(),
            nodes: HashMap::new(),
            claims: HashMap::new(),
            slices: BTreeMap::new(),
            history: Vec::new(),
            write_cluster: None,
            requests: Vec::new(),
            resource_version: 0,
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve_connection(stream, &state));
            }
        });
        let api = FakeApi { url, state };
        api.put_node(super::NODE, &node_uid(super::NODE));
        api.put_node("gpu-node-2", &node_uid("gpu-node-2"));
        api
    }

    /// Registers a Node object (as the kubelet does) with this UID; replaces one of that name.
    pub fn put_node(&self, name: &str, uid: &str) {
        let node = json!({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "uid": uid, "resourceVersion": "1"}});
        self.lock().nodes.insert(name.to_string(), node);
    }

    /// Deletes a Node object.
    pub fn remove_node(&self, name: &str) {
        self.lock().nodes.remove(name);
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Serves `claim` (a k8s-openapi ResourceClaim) at its namespace and name.
    pub fn put_claim(&self, claim: &k8s_openapi::api::resource::v1::ResourceClaim) {
        let mut value = serde_json::to_value(claim).unwrap();
        value["apiVersion"] = json!("resource.k8s.io/v1");
        value["kind"] = json!("ResourceClaim");
        let ns = claim.metadata.namespace.clone().unwrap();
        let name = claim.metadata.name.clone().unwrap();
        self.lock().claims.insert((ns, name), value);
    }

    /// Stores a ResourceSlice as if someone had created it.
    pub fn put_slice(&self, mut value: Value) {
        let mut state = self.lock();
        state.resource_version += 1;
        value["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        let name = value["metadata"]["name"].as_str().unwrap().to_string();
        state.slices.insert(name, value);
        state.remember();
    }

    /// Plays another version or gate set from now on (an upgrade, a gate turned on).
    pub fn set_cluster(&self, cluster: Cluster) {
        self.lock().cluster = cluster;
    }

    /// From now on real writes (not dry runs) are judged by `cluster`'s gates (`None`: the
    /// same as dry runs): another API server replica answers them.
    pub fn set_cluster_for_writes(&self, cluster: Option<Cluster>) {
        self.lock().write_cluster = cluster;
    }

    /// The slices the server held after each change (create, replace, delete), oldest first.
    pub fn history(&self) -> Vec<BTreeMap<String, Value>> {
        self.lock().history.clone()
    }

    /// The Events recorded.
    pub fn events(&self) -> Vec<Value> {
        self.lock().events.clone()
    }

    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.lock().slices.clone()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// The requests other than GETs (what the driver changed).
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn remember(&mut self) {
        let now = self.slices.clone();
        self.history.push(now);
    }

    /// The gates a write is judged by.
    fn judge(&self, query: &str) -> Cluster {
        match self.write_cluster {
            Some(cluster) if !dry_run(query) => cluster,
            _ => self.cluster,
        }
    }
}

fn serve_connection(stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut length = 0usize;
        let mut chunked = false;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                _ => {}
            }
        }
        assert!(
            !chunked,
            "the fake API server expects Content-Length bodies"
        );
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let body = (!body.is_empty())
            .then(|| serde_json::from_slice::<Value>(&body).expect("the driver sends JSON bodies"));
        let (code, response) = {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.requests.push(Recorded {
                method: method.clone(),
                path: path.to_string(),
                query: query.to_string(),
                body: body.clone(),
            });
            route(&mut state, &method, path, query, body)
        };
        let text = response.to_string();
        let reason = match code {
            200 => "OK",
            201 => "Created",
            404 => "Not Found",
            409 => "Conflict",
            422 => "Unprocessable Entity",
            _ => "Bad Request",
        };
        // Head and body in one write: two small writes meet Nagle's algorithm and the
        // client's delayed ACK, and every response would wait 40 ms.
        let response = format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn status(code: u16, reason: &str, message: String) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// Decodes `%XX` escapes of a query value.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn dry_run(query: &str) -> bool {
    query.split('&').any(|kv| kv == "dryRun=All")
}

/// The UID the fake gives a node registered at start.
pub fn node_uid(name: &str) -> String {
    format!("uid-of-node-{name}")
}

fn route(
    state: &mut State,
    method: &str,
    path: &str,
    query: &str,
    body: Option<Value>,
) -> (u16, Value) {
    if path == "/version" && method == "GET" {
        return (200, state.cluster.version());
    }
    if method == "POST" && path.starts_with("/api/v1/namespaces/") && path.ends_with("/events") {
        let mut event = body.expect("POST without a body");
        state.resource_version += 1;
        let name = format!(
            "{}{}",
            event["metadata"]["generateName"]
                .as_str()
                .unwrap_or("event."),
            state.resource_version
        );
        event["metadata"]["name"] = json!(name);
        event["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        state.events.push(event.clone());
        return (201, event);
    }
    if let Some(name) = path.strip_prefix("/api/v1/nodes/") {
        if method == "GET" {
            return match state.nodes.get(name) {
                Some(node) => (200, node.clone()),
                None => status(404, "NotFound", format!("nodes \"{name}\" not found")),
            };
        }
    }
    let claim_prefix = "/apis/resource.k8s.io/v1/namespaces/";
    if method == "GET" && path.starts_with(claim_prefix) {
        let rest = &path[claim_prefix.len()..];
        let parts: Vec<_> = rest.split('/').collect();
        if let [ns, "resourceclaims", name] = parts.as_slice() {
            return match state.claims.get(&(ns.to_string(), name.to_string())) {
                Some(claim) => (200, claim.clone()),
                None => status(
                    404,
                    "NotFound",
                    format!("resourceclaims \"{name}\" not found"),
                ),
            };
        }
    }
    if path == SLICES && method == "GET" {
        let selector = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "fieldSelector")
            .map(|(_, v)| unescape(v))
            .unwrap_or_default();
        let items: Vec<Value> = state
            .slices
            .values()
            .filter(|slice| {
                selector.split(',').filter(|s| !s.is_empty()).all(|term| {
                    match term.split_once('=') {
                        Some(("spec.driver", v)) => slice["spec"]["driver"] == json!(v),
                        Some(("spec.nodeName", v)) => slice["spec"]["nodeName"] == json!(v),
                        _ => panic!("the fake API server does not know field selector {term:?}"),
                    }
                })
            })
            .cloned()
            .collect();
        return (
            200,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                   "metadata": {"resourceVersion": state.resource_version.to_string()},
                   "items": items}),
        );
    }
    if path == SLICES && method == "POST" {
        let mut slice = body.expect("POST without a body");
        if slice["apiVersion"] != json!("resource.k8s.io/v1")
            || slice["kind"] != json!("ResourceSlice")
        {
            return status(
                400,
                "BadRequest",
                format!("not a v1 ResourceSlice: {slice}"),
            );
        }
        let name = slice["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state.slices.contains_key(&name) {
            return status(
                409,
                "AlreadyExists",
                format!("resourceslices.resource.k8s.io {name:?} already exists"),
            );
        }
        // PrepareForCreate, then Validate.
        let cluster = state.judge(query);
        slice["metadata"]["generation"] = json!(1);
        default_fields(&mut slice["spec"]);
        drop_disabled_fields(&cluster, &mut slice["spec"], None);
        let errors = validate_resource_slice(&cluster, &slice, None);
        if !errors.is_empty() {
            return (
                422,
                invalid_status("resource.k8s.io", "ResourceSlice", &name, &errors),
            );
        }
        if dry_run(query) {
            return (201, slice);
        }
        state.resource_version += 1;
        slice["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        slice["metadata"]["uid"] = json!(format!("uid-{}", state.resource_version));
        state.slices.insert(name, slice.clone());
        state.remember();
        return (201, slice);
    }
    if let Some(name) = path.strip_prefix(&format!("{SLICES}/")) {
        match method {
            "PUT" => {
                let mut slice = body.expect("PUT without a body");
                let Some(stored) = state.slices.get(name) else {
                    return status(
                        404,
                        "NotFound",
                        format!("resourceslices {name:?} not found"),
                    );
                };
                if slice["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"] {
                    return status(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on resourceslices.resource.k8s.io \
                             {name:?}: the object has been modified; please apply your changes \
                             to the latest version and try again"
                        ),
                    );
                }
                // PrepareForUpdate, then ValidateUpdate.
                let cluster = state.judge(query);
                let old = stored.clone();
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
                slice["metadata"]["uid"] = old["metadata"]["uid"].clone();
                slice["metadata"]["generation"] = json!(if slice["spec"] != old["spec"] {
                    generation + 1
                } else {
                    generation
                });
                default_fields(&mut slice["spec"]);
                drop_disabled_fields(&cluster, &mut slice["spec"], Some(&old["spec"]));
                let errors = validate_resource_slice(&cluster, &slice, Some(&old));
                if !errors.is_empty() {
                    return (
                        422,
                        invalid_status("resource.k8s.io", "ResourceSlice", name, &errors),
                    );
                }
                if dry_run(query) {
                    return (200, slice);
                }
                state.resource_version += 1;
                slice["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
                state.slices.insert(name.to_string(), slice.clone());
                state.remember();
                return (200, slice);
            }
            "DELETE" => {
                return match state.slices.remove(name) {
                    Some(slice) => {
                        state.remember();
                        (200, slice)
                    }
                    None => status(
                        404,
                        "NotFound",
                        format!("resourceslices {name:?} not found"),
                    ),
                };
            }
            _ => {}
        }
    }
    status(
        404,
        "NotFound",
        format!("the fake API server does not serve {method} {path}"),
    )
}
