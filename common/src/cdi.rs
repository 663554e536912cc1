//! CDI (Container Device Interface) specs for slices: the pure spec generator and the checks
//! on names and container paths, shared by `gpuslice cdi` (one spec per node, named slices)
//! and the DRA driver `gpuslice-dra` (one transient spec per prepared ResourceClaim), so both
//! put a container under a slice with exactly the same mounts.
//!
//! Each device's `containerEdits` carry, and only carry: `libgpuslice.so` read-only at the
//! container lib path and `libgpuslice_core.so` read-only beside it (the front library loads
//! the core from its own directory, see `shim/front/lib.rs`), a generated `/etc/ld.so.preload`
//! naming the front, the slice's limit file
//! read-only at [`DEFAULT_CONFIG_PATH`] with `GPUSLICE_CONFIG` set to it, and the slice's
//! region DIRECTORY read-write where the limit file's `"region"` lies.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use serde_json::{json, Value};

use crate::config::DEFAULT_CONFIG_PATH;
use crate::host_pid_broker;

/// CDI specification version written. 0.5.0 has everything used here (env, mounts) and is
/// read by every runtime that supports CDI at all (podman 4.1+, containerd 1.7+, CRI-O 1.23+,
/// Docker 25+).
pub const CDI_VERSION: &str = "0.5.0";
/// Default `kind` (`vendor/class`) of the devices.
pub const DEFAULT_KIND: &str = "gpuslice.dev/slice";
/// Default container path of the shim.
pub const DEFAULT_CONTAINER_LIB: &str = "/usr/lib/gpuslice/libgpuslice.so";
/// File name of the shim's core, which the front (`libgpuslice.so`) loads from the directory
/// it was loaded from: both files are installed and mounted side by side.
pub const CORE_LIBRARY_NAME: &str = "libgpuslice_core.so";
/// Container path of the generated preload list.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";
/// The directories container runtimes scan for CDI specs.
pub const RUNTIME_SPEC_DIRS: [&str; 3] = ["/etc/cdi", "/var/run/cdi", "/run/cdi"];

/// One validated slice: everything [`generate_spec`] needs for its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceMounts {
    /// CDI device name.
    pub name: String,
    /// Limit file on the host (absolute, canonical).
    pub limit_file: PathBuf,
    /// Region directory on the host (absolute, canonical).
    pub region_host_dir: PathBuf,
    /// Directory of the limit file's `"region"` inside the container.
    pub region_container_dir: String,
}

/// Validated inputs of one spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecInputs {
    pub kind: String,
    /// libgpuslice.so on the host (absolute); the core is mounted from beside it
    /// ([`core_beside`]).
    pub lib_host: PathBuf,
    /// libgpuslice.so in the container (absolute).
    pub lib_container: String,
    /// The generated preload list on the host (absolute).
    pub preload_host: PathBuf,
    pub slices: Vec<SliceMounts>,
    /// The host directory of the node agent's host-PID broker socket (`host-pid.sock`),
    /// mounted read-only at [`host_pid_broker::SOCKET_DIR`] where the shim asks it; `None`:
    /// no broker (the shim measures its host PID instead).
    pub host_pid_dir: Option<PathBuf>,
}

/// The core library that goes with the front library at `lib` (host or container path): the
/// file [`CORE_LIBRARY_NAME`] in the same directory.
pub fn core_beside(lib: &Path) -> PathBuf {
    lib.with_file_name(CORE_LIBRARY_NAME)
}

/// The CDI spec for `inputs` (pure; `inputs` are assumed validated, as `gpuslice cdi` and the DRA driver do).
pub fn generate_spec(inputs: &SpecInputs) -> Value {
    let ro = json!(["ro", "nosuid", "nodev", "bind"]);
    let devices: Vec<Value> = inputs
        .slices
        .iter()
        .map(|slice| {
            json!({
                "name": slice.name,
                "containerEdits": {
                    "env": [format!("GPUSLICE_CONFIG={DEFAULT_CONFIG_PATH}")],
                    "mounts": [
                        {
                            "hostPath": inputs.lib_host.to_string_lossy(),
                            "containerPath": inputs.lib_container,
                            "options": ro,
                        },
                        {
                            "hostPath": core_beside(&inputs.lib_host).to_string_lossy(),
                            "containerPath": core_beside(Path::new(&inputs.lib_container))
                                .to_string_lossy(),
                            "options": ro,
                        },
                        {
                            "hostPath": inputs.preload_host.to_string_lossy(),
                            "containerPath": LD_SO_PRELOAD,
                            "options": ro,
                        },
                        {
                            "hostPath": slice.limit_file.to_string_lossy(),
                            "containerPath": DEFAULT_CONFIG_PATH,
                            "options": ro,
                        },
                        {
                            "hostPath": slice.region_host_dir.to_string_lossy(),
                            "containerPath": slice.region_container_dir,
                            "options": ["rw", "nosuid", "nodev", "noexec", "bind"],
                        },
                    ],
                },
            })
        })
        .map(|mut device| {
            if let Some(dir) = &inputs.host_pid_dir {
                // Read-only is enough: connecting to a socket is not a write to its mount.
                device["containerEdits"]["mounts"]
                    .as_array_mut()
                    .expect("mounts is an array")
                    .push(json!({
                        "hostPath": dir.to_string_lossy(),
                        "containerPath": host_pid_broker::SOCKET_DIR,
                        "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
                    }));
            }
            device
        })
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": inputs.kind,
        "devices": devices,
    })
}

/// The contents of the generated `/etc/ld.so.preload`.
pub fn preload_contents(lib_container: &str) -> String {
    format!("{lib_container}\n")
}

/// CDI device names: `[A-Za-z0-9][A-Za-z0-9_.-]*` (CDI also allows ':'; refused here because
/// the name becomes a directory name and the `--slice` syntax uses ':').
pub fn check_device_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("the slice name is empty".into()),
        Some(c) if c.is_ascii_alphanumeric() => {}
        Some(_) => {
            return Err(format!(
                "slice name {name:?} must start with a letter or digit"
            ))
        }
    }
    if chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err(format!(
            "slice name {name:?} may only contain letters, digits, '_', '.' and '-'"
        ))
    }
}

/// CDI kinds: `vendor/class`; vendor a domain-like name (letters, digits, '-', '_', '.'),
/// class letters, digits, '-', '_'; both start with a letter and end with a letter or digit.
pub fn check_kind(kind: &str) -> Result<(), String> {
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("kind {kind:?} must be VENDOR/CLASS, e.g. {DEFAULT_KIND}"))?;
    let part_ok = |part: &str, extra: &[char]| {
        let bytes = part.as_bytes();
        !bytes.is_empty()
            && bytes[0].is_ascii_alphabetic()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || extra.contains(&c))
    };
    if !part_ok(vendor, &['.']) {
        return Err(format!(
            "kind {kind:?}: vendor {vendor:?} must start with a letter, end with a letter or digit \
             and contain only letters, digits, '-', '_' and '.'"
        ));
    }
    if !part_ok(class, &[]) {
        return Err(format!(
            "kind {kind:?}: class {class:?} must start with a letter, end with a letter or digit \
             and contain only letters, digits, '-' and '_'"
        ));
    }
    Ok(())
}

/// A container path the spec may mount at: absolute, normalised (no `.`, `..`, `//`, trailing
/// `/`), no whitespace, ':' or control characters (the preload list and the runtimes' mount
/// option parsing split on them).
pub fn check_container_path(what: &str, path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!(
            "{what} {path:?} must be an absolute container path"
        ));
    }
    if path.len() > 1 && path.ends_with('/') || path.contains("//") {
        return Err(format!(
            "{what} {path:?} is not normalised (drop the extra '/')"
        ));
    }
    if Path::new(path)
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
        || path.split('/').any(|part| part == "." || part == "..")
    {
        return Err(format!("{what} {path:?} must not contain '.' or '..'"));
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == ':')
    {
        return Err(format!(
            "{what} {path:?} must not contain whitespace, ':' or control characters"
        ));
    }
    Ok(())
}

/// Replaces `dir/name` with `contents` atomically: a reader sees the old file or the new one,
/// never a partial one, and the new one survives a crash once this returns.
pub fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    let target = dir.join(name);
    // A name the runtimes skip (they read only *.json / *.yaml), unique per process.
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, &target)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}
