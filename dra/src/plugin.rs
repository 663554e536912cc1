//! The kubelet-facing gRPC side: the registration service (on the kubelet's plugins_registry
//! socket), the DRA node service in both versions the kubelets speak, `v1` and `v1beta1`, and
//! the resource-health service `v1alpha1.DRAResourceHealth` (on the plugin's own socket; a
//! kubelet without the ResourceHealthStatus gate never calls it). Both versions answer from the same [`Driver`]; the claim
//! itself is read from the API server (resource.k8s.io/v1) because the kubelet sends only its
//! namespace, name and UID.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::health::Unhealthy;
use crate::prepare::{ClaimRef, PreparedDevice, Preparer};
use crate::proto::{dra_health_v1alpha1 as health, dra_v1, dra_v1beta1, pluginregistration as reg};

/// The DRA services this plugin serves, as the registration API names them.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
/// `PluginInfo.type` of a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// Prepares claims read from the API server.
pub struct Driver {
    pub preparer: Arc<Preparer>,
    pub client: Client,
}

impl Driver {
    async fn prepare_one(&self, want: ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let label = format!("claim {}/{} ({})", want.namespace, want.name, want.uid);
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &want.namespace);
        let claim = api
            .get(&want.name)
            .await
            .map_err(|e| format!("{label}: cannot read it from the API server: {e}"))?;
        let preparer = self.preparer.clone();
        tokio::task::spawn_blocking(move || preparer.prepare(&want, &claim))
            .await
            .map_err(|e| format!("{label}: prepare panicked: {e}"))?
    }

    async fn unprepare_one(&self, uid: String) -> Result<(), String> {
        let preparer = self.preparer.clone();
        tokio::task::spawn_blocking(move || preparer.unprepare(&uid))
            .await
            .map_err(|e| format!("unprepare panicked: {e}"))?
    }

    /// Prepares every claim (concurrently: a slow API read of one must not hold up the
    /// others); one entry per claim UID.
    pub async fn prepare_all(
        self: &Arc<Self>,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut tasks = tokio::task::JoinSet::new();
        for claim in claims {
            let driver = self.clone();
            tasks.spawn(async move {
                let uid = claim.uid.clone();
                (uid, driver.prepare_one(claim).await)
            });
        }
        collect(tasks).await
    }

    /// Unprepares every claim (concurrently); one entry per claim UID.
    pub async fn unprepare_all(
        self: &Arc<Self>,
        uids: Vec<String>,
    ) -> HashMap<String, Result<(), String>> {
        let mut tasks = tokio::task::JoinSet::new();
        for uid in uids {
            let driver = self.clone();
            tasks.spawn(async move {
                let result = driver.unprepare_one(uid.clone()).await;
                (uid, result)
            });
        }
        collect(tasks).await
    }
}

async fn collect<T: 'static>(
    mut tasks: tokio::task::JoinSet<(String, Result<T, String>)>,
) -> HashMap<String, Result<T, String>> {
    let mut out = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        // A task that panicked has lost its UID; the kubelet retries claims missing from the
        // response, which is the right outcome for it.
        if let Ok((uid, result)) = joined {
            out.insert(uid, result);
        }
    }
    out
}

/// The DRA node service of one API version: the same messages in two packages.
macro_rules! dra_service {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef {
                        namespace: c.namespace,
                        name: c.name,
                        uid: c.uid,
                    })
                    .collect();
                let claims = self
                    .driver
                    .prepare_all(claims)
                    .await
                    .into_iter()
                    .map(|(uid, result)| {
                        let response = match result {
                            Ok(devices) => $api::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|d| $api::Device {
                                        request_names: d.request_names,
                                        pool_name: d.pool_name,
                                        device_name: d.device_name,
                                        cdi_device_ids: d.cdi_device_ids,
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(error) => {
                                eprintln!("gpuslice-dra: prepare: {error}");
                                $api::NodePrepareResourceResponse {
                                    devices: Vec::new(),
                                    error,
                                }
                            }
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let uids = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| c.uid)
                    .collect();
                let claims = self
                    .driver
                    .unprepare_all(uids)
                    .await
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().unwrap_or_default();
                        if !error.is_empty() {
                            eprintln!("gpuslice-dra: unprepare: {error}");
                        }
                        (uid, $api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

/// Serves both DRA versions from one [`Driver`].
#[derive(Clone)]
pub struct DraService {
    pub driver: Arc<Driver>,
}

dra_service!(dra_v1);
dra_service!(dra_v1beta1);

/// `NodeWatchResources`: every device the driver may publish on this node (in any model: the
/// kubelet matches them to the claims it prepared), Healthy or Unhealthy by its GPU, sent
/// once at the start and again whenever a GPU's health changes.
#[derive(Clone)]
pub struct HealthService {
    /// The pool (the node's name).
    pub pool: String,
    /// (GPU index, device name).
    pub devices: Vec<(u32, String)>,
    pub unhealthy: tokio::sync::watch::Receiver<Unhealthy>,
    /// Set by [`serve_with_health`]: open streams end when the plugin stops (a graceful
    /// shutdown would otherwise wait for the kubelet to hang up).
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
}

impl HealthService {
    /// The devices of `gpus` in every model.
    pub fn new(
        pool: &str,
        gpus: &[crate::inventory::Gpu],
        unhealthy: tokio::sync::watch::Receiver<Unhealthy>,
    ) -> HealthService {
        use crate::model;
        let mut devices = Vec::new();
        for gpu in gpus {
            let i = gpu.index;
            devices.extend(model::product_devices(i).into_iter().map(|(d, _)| (i, d)));
            devices.push((i, model::capacity_device(i)));
            devices.extend(model::unit_devices(i).into_iter().map(|d| (i, d)));
        }
        HealthService {
            pool: pool.to_string(),
            devices,
            unhealthy,
            stopping: None,
        }
    }

    /// The full list for `unhealthy`.
    pub fn report(&self, unhealthy: &Unhealthy) -> health::NodeWatchResourcesResponse {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        health::NodeWatchResourcesResponse {
            devices: self
                .devices
                .iter()
                .map(|(gpu, name)| health::DeviceHealth {
                    device: Some(health::DeviceIdentifier {
                        pool_name: self.pool.clone(),
                        device_name: name.clone(),
                    }),
                    health: if unhealthy.contains_key(gpu) {
                        health::HealthStatus::Unhealthy
                    } else {
                        health::HealthStatus::Healthy
                    } as i32,
                    last_updated_time: now,
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl health::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = std::pin::Pin<
        Box<
            dyn tokio_stream::Stream<Item = Result<health::NodeWatchResourcesResponse, Status>>
                + Send,
        >,
    >;

    async fn node_watch_resources(
        &self,
        _request: Request<health::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let this = self.clone();
        let mut unhealthy = self.unhealthy.clone();
        let mut stopping = self.stopping.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // Ends when the kubelet goes away (send fails), the health thread does, or the plugin
        // stops.
        tokio::spawn(async move {
            let stopped = async {
                match stopping.as_mut() {
                    Some(s) => {
                        let _ = s.wait_for(|stop| *stop).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(stopped);
            loop {
                let report = this.report(&unhealthy.borrow_and_update().clone());
                if tx.send(Ok(report)).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = unhealthy.changed() => if changed.is_err() { return },
                    _ = &mut stopped => return,
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The registration service: tells the kubelet our name, socket and versions.
#[derive(Clone)]
pub struct RegistrationService {
    pub driver_name: String,
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            eprintln!("gpuslice-dra: registered with the kubelet");
        } else {
            eprintln!(
                "gpuslice-dra: the kubelet refused the registration: {}",
                status.error
            );
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Binds a unix socket at `path`, replacing a stale one (a socket file left by an earlier
/// run; anything else at that path is refused).
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Serves the DRA services on `plugin_socket` and the registration service on
/// `registration_socket` until `shutdown` completes; removes both sockets afterwards.
pub async fn serve(
    driver: Arc<Driver>,
    driver_name: &str,
    plugin_socket: &Path,
    registration_socket: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    serve_with_health(
        driver,
        None,
        driver_name,
        plugin_socket,
        registration_socket,
        shutdown,
    )
    .await
}

/// [`serve`], with the resource-health service on the DRA socket when `health` is given.
pub async fn serve_with_health(
    driver: Arc<Driver>,
    health: Option<HealthService>,
    driver_name: &str,
    plugin_socket: &Path,
    registration_socket: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let dra = bind(plugin_socket)
        .map_err(|e| format!("cannot listen on {}: {e}", plugin_socket.display()))?;
    let registration = bind(registration_socket)
        .map_err(|e| format!("cannot listen on {}: {e}", registration_socket.display()))?;
    let service = DraService { driver };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let health = health.map(|mut h| {
        h.stopping = Some(stop_rx.clone());
        h
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let dra_server = tonic::transport::Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(
            service.clone(),
        ))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
            service,
        ))
        .add_optional_service(
            health.map(health::dra_resource_health_server::DraResourceHealthServer::new),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(dra), stopped(stop_rx.clone()));
    // Registration last: the kubelet calls the DRA socket as soon as it has registered us.
    let registration_server = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            RegistrationService {
                driver_name: driver_name.to_string(),
                endpoint: plugin_socket.to_path_buf(),
            },
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(registration), stopped(stop_rx));
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (a, b) = tokio::join!(dra_server, registration_server);
    let _ = std::fs::remove_file(registration_socket);
    let _ = std::fs::remove_file(plugin_socket);
    a.map_err(|e| format!("DRA service: {e}"))?;
    b.map_err(|e| format!("registration service: {e}"))?;
    Ok(())
}
