//! `gpuslice-dra`: the DRA kubelet plugin of gpuslice (see the library's doc and
//! docs/architecture.md, "DRA driver").

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use gpuslice_common::cdi::{check_container_path, core_beside, DEFAULT_CONTAINER_LIB};
use gpuslice_dra::model::{Model, Oversubscription};
use gpuslice_dra::plugin::{serve_with_health, Driver, HealthService};
use gpuslice_dra::prepare::{NvidiaCdi, Preparer, Settings};
use gpuslice_dra::publish::{OnMissingGate, Publisher, Recheck};
use gpuslice_dra::{health, inventory, DRIVER_NAME};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum NvidiaCdiMode {
    /// Add NVIDIA's CDI device when a spec of its kind is in /etc/cdi or /var/run/cdi.
    Auto,
    Always,
    Never,
}

/// The gpuslice DRA driver: publishes the node's GPUs as ResourceSlices and turns allocated
/// ResourceClaims into enforced gpuslice slices (limit file, region, CDI spec).
#[derive(Debug, Parser)]
#[command(name = "gpuslice-dra", version)]
struct Args {
    /// This node's name (the pool name and spec.nodeName of the ResourceSlice).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// How the GPUs are offered: fixed 25/50/100% products (needs DRAPartitionableDevices),
    /// consumable capacity (needs DRAConsumableCapacity), or four 25% units per card (needs no
    /// feature gate).
    #[arg(long, value_enum, default_value = "products")]
    model: Model,
    /// What to publish when the API server drops the model's fields (its feature gate is off):
    /// nothing, or the gate-free units model.
    #[arg(long, value_enum, default_value = "withdraw")]
    on_missing_gate: OnMissingGate,
    /// Host directory of the claims' limit files, regions and checkpoints.
    #[arg(long, default_value = "/var/lib/gpuslice/dra")]
    state_dir: PathBuf,
    /// Where the claims' transient CDI specs go (runtimes read /etc/cdi and /var/run/cdi).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// libgpuslice.so on the host.
    #[arg(long, default_value = "/opt/gpuslice/libgpuslice.so")]
    lib: PathBuf,
    /// Where libgpuslice.so appears in the containers.
    #[arg(long, default_value = DEFAULT_CONTAINER_LIB)]
    container_lib: String,
    /// The host directory of the node agent's host-PID broker (`gpuslice-node
    /// --host-pid-socket DIR/host-pid.sock`): mounted read-only into every prepared
    /// container, where the shim asks it for each process's host PID (a storm of starts in a
    /// pod then does not queue to measure it). Without it the shim measures.
    #[arg(long = "host-pid-dir", value_name = "DIR")]
    host_pid_dir: Option<PathBuf>,
    /// The most one CUDA context costs on this node's cards (such as 768MiB), written into
    /// every claim's limit file: what a first context reserves before its cost is measured,
    /// and what contexts started together each reserve, so that contexts dearer than the
    /// slice's measured figure cannot pass its cap together [default: the shim's, 512 MiB].
    #[arg(long = "context-overhead", value_name = "SIZE", value_parser = parse_context_overhead)]
    context_overhead: Option<u64>,
    /// The kubelet's plugin directory of this driver (its DRA socket is dra.sock in it).
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpuslice.dev")]
    plugin_dir: PathBuf,
    /// The kubelet's plugin-registration directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// libnvidia-ml.so to load [default: the system's libnvidia-ml.so.1].
    #[arg(long)]
    nvml_lib: Option<PathBuf>,
    /// Offer every device oversubscribed: a claim is told PERCENT% of the memory it is
    /// allocated (101..=1000), the card holds at most what it is allocated and the rest goes
    /// to the pod's host memory (within its memory limit). Devices carry the attribute
    /// oversubscriptionPercent for DeviceClasses to select. Off by default.
    #[arg(long, value_name = "PERCENT", value_parser = Oversubscription::parse)]
    oversubscribe: Option<Oversubscription>,
    /// Whether prepared claims also get the NVIDIA GPU's own CDI device (<kind>=<uuid>).
    #[arg(long, value_enum, default_value = "auto")]
    nvidia_cdi: NvidiaCdiMode,
    /// The kind of NVIDIA's CDI spec.
    #[arg(long, default_value = "nvidia.com/gpu")]
    nvidia_cdi_kind: String,
    /// Seconds between re-publications of the ResourceSlices (a deleted or edited slice is
    /// restored).
    #[arg(long, default_value_t = 60)]
    republish_seconds: u64,
    /// Where the driver's metrics go, as Prometheus text, rewritten when they change (for a
    /// node exporter's textfile collector) [default: <state-dir>/gpuslice-dra.prom].
    #[arg(long)]
    metrics_file: Option<PathBuf>,
    /// Milliseconds between health checks of the GPUs (NVML Xid/ECC events, a GPU gone); an
    /// unhealthy GPU's devices are tainted at once.
    #[arg(long, default_value_t = 2000)]
    health_millis: u64,
}

/// Whether a CDI spec of `kind` is in one of the runtime spec directories.
fn has_cdi_kind(kind: &str) -> bool {
    ["/etc/cdi", "/var/run/cdi"].iter().any(|dir| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let path = entry.path();
                let is_spec = matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                );
                is_spec
                    && std::fs::read_to_string(&path).is_ok_and(|text| {
                        text.contains(&format!("\"{kind}\""))
                            || text.contains(&format!("kind: {kind}"))
                    })
            })
    })
}

fn run(args: Args) -> Result<(), String> {
    check_container_path("--container-lib", &args.container_lib)?;
    let lib = std::fs::canonicalize(&args.lib)
        .map_err(|e| format!("--lib {}: {e}", args.lib.display()))?;
    // The front fails closed without its core beside it: refuse to start without one.
    let core = core_beside(&lib);
    if !core.is_file() {
        return Err(format!(
            "--lib {}: {} is missing beside it (the shim is two files)",
            args.lib.display(),
            core.display()
        ));
    }
    let mut gpus = inventory::from_nvml(args.nvml_lib.as_deref())?;
    for gpu in &mut gpus {
        gpu.oversubscription = args.oversubscribe;
    }
    eprintln!(
        "gpuslice-dra: node {}: {} GPU(s)",
        args.node_name,
        gpus.len()
    );
    for gpu in &gpus {
        eprintln!(
            "gpuslice-dra:   GPU {} {} {} ({} bytes)",
            gpu.index, gpu.uuid, gpu.name, gpu.memory_bytes
        );
    }
    let nvidia_cdi = match args.nvidia_cdi {
        NvidiaCdiMode::Always => true,
        NvidiaCdiMode::Never => false,
        NvidiaCdiMode::Auto => has_cdi_kind(&args.nvidia_cdi_kind),
    }
    .then(|| NvidiaCdi {
        kind: args.nvidia_cdi_kind.clone(),
    });
    let settings = Settings {
        driver: DRIVER_NAME.to_string(),
        node: args.node_name.clone(),
        state_dir: args.state_dir.clone(),
        cdi_dir: args.cdi_dir.clone(),
        lib_host: lib,
        lib_container: args.container_lib.clone(),
        host_pid_dir: args.host_pid_dir.clone(),
        context_bound: args.context_overhead,
        nvidia_cdi,
    };
    let preparer = Arc::new(Preparer::new(settings, gpus.clone()));
    for claim in preparer.prepared() {
        eprintln!(
            "gpuslice-dra: claim {}/{} ({}) is prepared (checkpoint)",
            claim.namespace, claim.name, claim.uid
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let unhealthy = runtime.block_on(async {
        health::spawn(
            args.nvml_lib.as_deref(),
            gpus.clone(),
            Duration::from_millis(args.health_millis.max(10)),
        )
    })?;
    runtime.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("cannot configure the Kubernetes client: {e}"))?;
        let health_service = HealthService::new(&args.node_name, &gpus, unhealthy.clone());
        let metrics_file = args
            .metrics_file
            .clone()
            .unwrap_or_else(|| args.state_dir.join("gpuslice-dra.prom"));
        let publisher = {
            let client = client.clone();
            let mut metrics = String::new();
            let mut unhealthy = unhealthy;
            let period = Duration::from_secs(args.republish_seconds.max(1));
            let mut publisher = Publisher::new(
                DRIVER_NAME,
                &args.node_name,
                args.model,
                args.on_missing_gate,
            )
            .with_recheck(Recheck::for_period(period));
            async move {
                loop {
                    let now = unhealthy.borrow_and_update().clone();
                    // Logs its notices and each change of outcome (an error is retried at
                    // the next period).
                    let _ = publisher
                        .publish_and_report(client.clone(), &gpus, &now)
                        .await;
                    let now_metrics = publisher.metrics(&now);
                    if now_metrics != metrics {
                        if let Err(e) = write_metrics(&metrics_file, &now_metrics) {
                            eprintln!("gpuslice-dra: metrics: {e}");
                        }
                        metrics = now_metrics;
                    }
                    // The next period, or at once when a GPU's health changes.
                    tokio::select! {
                        _ = tokio::time::sleep(period) => {}
                        changed = unhealthy.changed() => {
                            // The health thread is gone: keep to the period.
                            if changed.is_err() {
                                tokio::time::sleep(period).await;
                            }
                        }
                    }
                }
            }
        };
        let publisher = tokio::spawn(publisher);
        let driver = Arc::new(Driver { preparer, client });
        let plugin_socket = args.plugin_dir.join("dra.sock");
        let registration_socket: PathBuf =
            Path::new(&args.registry_dir).join(format!("{DRIVER_NAME}-reg.sock"));
        // Handlers in place before the sockets exist: a SIGTERM as soon as the plugin answers
        // is a clean stop, not the default action (which would leave the sockets behind).
        use tokio::signal::unix::{signal, SignalKind};
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
        let mut interrupt =
            signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        eprintln!(
            "gpuslice-dra: serving {} and {}",
            plugin_socket.display(),
            registration_socket.display()
        );
        let result = serve_with_health(
            driver,
            Some(health_service),
            DRIVER_NAME,
            &plugin_socket,
            &registration_socket,
            shutdown,
        )
        .await;
        publisher.abort();
        result
    })
}

/// Replaces `path` with `text` atomically (a collector never reads half a file).
fn write_metrics(path: &Path, text: &str) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: not a file name", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    gpuslice_common::cdi::write_atomically(dir, name, text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice-dra: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--context-overhead`: a size the limit file accepts (not 0, at most 1 TiB).
fn parse_context_overhead(text: &str) -> Result<u64, String> {
    gpuslice_common::config::parse_context_bound_text(text)
}

#[cfg(test)]
mod context_overhead_flag {
    use super::parse_context_overhead;

    #[test]
    fn a_size_is_taken_and_nonsense_named() {
        assert_eq!(parse_context_overhead("768MiB"), Ok(768 << 20));
        assert_eq!(parse_context_overhead("1073741824"), Ok(1 << 30));
        assert!(parse_context_overhead("0").unwrap_err().contains("0 would"));
        assert!(parse_context_overhead("2TiB")
            .unwrap_err()
            .contains("more than any card"));
        assert!(parse_context_overhead("lots\"}").is_err());
    }
}
