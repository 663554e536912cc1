//! Device-node stand-ins for frameworks that look for the driver's device nodes before they
//! use a GPU: JAX uses its CUDA plugin only when `/dev/nvidia0` or `/dev/nvidiactl` exists
//! (`jax/_src/hardware_utils.py`, `has_visible_nvidia_gpu`), else it runs on the CPU without a
//! word. The fake driver needs no device node, so the tests give such a process empty files of
//! those names, in a private mount namespace, never on the host:
//!
//! `unshare -m` (private propagation, util-linux's default) runs a shell that binds the host's
//! `/dev` (with its submounts: `pts`, `shm`, `mqueue`) to a scratch directory, mounts a small
//! tmpfs on `/dev`, links every host entry back into it, creates `nvidiactl` and `nvidia0`, and
//! execs the program. Nothing of this is seen outside the namespace; the scratch directory
//! stays empty on the host. Needs the right to make a mount namespace (root, as in CI); where
//! `unshare` cannot, the caller skips (fails with `CI=true`).

use crate::{command, Env};
use std::path::Path;
use std::process::Command;

const SCRIPT: &str = r#"set -e
host=$1; shift
mount --rbind /dev "$host"
mount -t tmpfs -o mode=755,size=1m gpuslice-dev /dev
for entry in "$host"/* "$host"/.[!.]*; do
    if [ -e "$entry" ] || [ -L "$entry" ]; then ln -s "$entry" /dev/; fi
done
: > /dev/nvidiactl
: > /dev/nvidia0
exec "$@""#;

/// Whether this process may make a mount namespace with stand-ins (checked once per call by
/// doing it: `unshare` present, permitted, and the script working).
pub fn available(scratch: &Path) -> bool {
    let dir = scratch.join("dev-nodes-probe");
    let _ = std::fs::create_dir_all(&dir);
    wrap(
        &dir,
        Path::new("/bin/sh"),
        &["-c", "test -e /dev/nvidiactl"],
        &Vec::new(),
    )
    .output()
    .is_ok_and(|o| o.status.success())
}

/// `program args` under `env`, seeing `/dev/nvidiactl` and `/dev/nvidia0`. `host_dev` is an
/// empty directory that outlives the process (the host's `/dev` is bound there inside the
/// namespace only).
pub fn wrap(host_dev: &Path, program: &Path, args: &[&str], env: &Env) -> Command {
    let host = host_dev.to_str().expect("a UTF-8 scratch path");
    let program = program.to_str().expect("a UTF-8 program path");
    let mut all = vec!["-m", "sh", "-c", SCRIPT, "sh", host, program];
    all.extend(args);
    command(Path::new("unshare"), &all, env)
}
