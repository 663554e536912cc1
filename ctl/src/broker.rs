//! `gpuslice host-pid-broker`: tells each process that connects its PID in the host's PID
//! namespace, the one NVIDIA's driver lists it under (`gpuslice_common::host_pid_broker`).
//! The node agent serves the same socket in Kubernetes; this command is for hosts that run
//! containers without it (podman, Docker): run it once per host, in the host's PID namespace,
//! and mount its directory into the containers.

use std::path::PathBuf;

use clap::Args;
use gpuslice_common::host_pid_broker;

use crate::error::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct BrokerArgs {
    /// The socket to serve (its directory is created; a stale socket there is replaced).
    #[arg(long, value_name = "PATH", default_value = host_pid_broker::DEFAULT_SOCKET)]
    pub socket: PathBuf,

    /// Serve although this is not the host's PID namespace: only where this namespace is the
    /// one the driver names processes in (a test bed with a simulated driver).
    #[arg(long)]
    pub any_pid_namespace: bool,
}

pub fn run(args: &BrokerArgs) -> CliResult<()> {
    host_pid_broker::may_serve(args.any_pid_namespace).map_err(CliError::invalid)?;
    let listener = host_pid_broker::bind(&args.socket)
        .map_err(|e| CliError::runtime(format!("{}: {e}", args.socket.display())))?;
    println!("listening on {}", args.socket.display());
    crate::output::flush();
    let error = host_pid_broker::serve(&listener, |_| {});
    Err(CliError::runtime(format!(
        "{}: accepting stopped: {error}",
        args.socket.display()
    )))
}
