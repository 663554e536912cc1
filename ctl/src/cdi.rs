//! `gpuslice cdi`: the container-runtime wiring. Writes one CDI spec (Container Device
//! Interface, read by podman 4.1+, containerd, CRI-O and Docker 25+ from `/etc/cdi` and
//! `/var/run/cdi`) with one device per named slice, so that `--device gpuslice.dev/slice=NAME`
//! (or a Kubernetes DRA claim that resolves to it) puts a container under that slice.
//!
//! Each device's `containerEdits` carry, and only carry:
//! * the shim's two files, `libgpuslice.so` (the front) and `libgpuslice_core.so` (the core it
//!   loads from its own directory), bind-mounted read-only at `--container-lib` and beside it
//!   (default `/usr/lib/gpuslice/libgpuslice.so`);
//! * a generated `/etc/ld.so.preload` (read-only, one line: the container path of the shim), so
//!   every dynamically linked process loads the shim even with `LD_PRELOAD` unset or `env -i`;
//! * the slice's limit file read-only at `/etc/gpuslice/limits.json`, and
//!   `GPUSLICE_CONFIG=/etc/gpuslice/limits.json`;
//! * the slice's region DIRECTORY read-write at the directory the limit file's `"region"` names,
//!   so every container of the slice maps the same region file and shares one cap.
//!
//! No `deviceNodes`: the GPU itself comes from the NVIDIA CDI spec (or device plugin) beside
//! this one. Everything that names a host path is validated before anything is written, and
//! the spec is replaced atomically (temp file, fsync, rename, fsync of the directory) because
//! runtimes re-read the spec directories while containers start.
//!
//! Slices come from `--slice NAME=LIMITFILE[:REGIONDIR]` (repeatable) and/or
//! `--slices-dir DIR` (every `DIR/NAME.json` is slice NAME). Without `:REGIONDIR` the region
//! directory is `<state-dir>/regions/<vendor>/<class>/NAME`, created here.
//!
//! The spec itself is a pure function of validated inputs ([`generate_spec`]); [`run`] does the
//! validation and the file system work.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use clap::Args;
pub use gpuslice_common::cdi::{
    check_container_path, check_device_name, check_kind, core_beside, generate_spec,
    preload_contents, write_atomically, SliceMounts, SpecInputs, CORE_LIBRARY_NAME,
    DEFAULT_CONTAINER_LIB, DEFAULT_KIND, LD_SO_PRELOAD, RUNTIME_SPEC_DIRS,
};
use gpuslice_common::config::{parse_limit_file, DEFAULT_CONFIG_PATH};

/// Default directory the spec is written to.
pub const DEFAULT_OUTPUT_DIR: &str = "/etc/cdi";
/// Default spec file name.
pub const DEFAULT_SPEC_NAME: &str = "gpuslice.json";
/// Default host directory for the generated preload file and the default region directories.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpuslice";
/// Container directories a region directory must never be mounted over: hiding them would
/// break the container (or hide the shim and limit file the spec mounts there).
const FORBIDDEN_REGION_DIRS: [&str; 16] = [
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/proc", "/root", "/run",
    "/sbin", "/sys", "/usr", "/var", "/var/run",
];

/// Flags of `gpuslice cdi`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Write a CDI spec that puts containers under gpuslice slices",
    long_about = "Write a CDI spec (Container Device Interface) with one device per slice. \
        `podman run --device gpuslice.dev/slice=NAME` (or a runtime fed by Kubernetes DRA) then \
        mounts libgpuslice.so, an /etc/ld.so.preload naming it, the slice's limit file (read-only, \
        at /etc/gpuslice/limits.json) and the slice's region directory (read-write, shared by \
        every container of the slice) into the container. No device nodes: the GPU itself comes \
        from the NVIDIA CDI spec or device plugin.",
    after_help = "Example:\n  gpuslice cdi --slice small=/etc/gpuslice/slices/small.json \\\n      \
        --slice big=/etc/gpuslice/slices/big.json:/srv/gpuslice/big\n  \
        podman run --device nvidia.com/gpu=0 --device gpuslice.dev/slice=small IMAGE"
)]
pub struct CdiArgs {
    /// A slice: its device name, its limit file on the host, and optionally the host directory
    /// backing its region (default <state-dir>/regions/<vendor>/<class>/NAME, created). The
    /// limit file must name an absolute "region"; that file's directory is where the region
    /// directory is mounted in the container. Repeatable.
    #[arg(long = "slice", value_name = "NAME=LIMITFILE[:REGIONDIR]")]
    pub slices: Vec<String>,

    /// A directory of limit files: every DIR/NAME.json is the slice NAME (region directory
    /// defaulted as for --slice). May be combined with --slice.
    #[arg(long = "slices-dir", value_name = "DIR")]
    pub slices_dir: Option<PathBuf>,

    /// CDI kind (vendor/class) of the devices; containers ask for KIND=NAME.
    #[arg(long, value_name = "VENDOR/CLASS", default_value = DEFAULT_KIND)]
    pub kind: String,

    /// libgpuslice.so on the host [default: libgpuslice.so beside this gpuslice binary].
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,

    /// Where libgpuslice.so appears in the container (absolute; no whitespace or ':', since
    /// /etc/ld.so.preload separates entries with them).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_CONTAINER_LIB)]
    pub container_lib: String,

    /// The host directory of a host-PID broker's socket (`gpuslice host-pid-broker --socket
    /// DIR/host-pid.sock`, or the node agent's): mounted read-only into the containers, where
    /// the shim asks it for each process's host PID instead of measuring it.
    #[arg(long = "host-pid-dir", value_name = "DIR")]
    pub host_pid_dir: Option<PathBuf>,

    /// Directory the spec is written to (runtimes read /etc/cdi and /var/run/cdi).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_OUTPUT_DIR)]
    pub output_dir: PathBuf,

    /// File name of the spec in --output-dir (must end in .json).
    #[arg(long, value_name = "FILE", default_value = DEFAULT_SPEC_NAME)]
    pub name: String,

    /// Host directory for the generated ld.so.preload (cdi/<spec name>.ld.so.preload) and the
    /// default region directories (regions/<vendor>/<class>/<slice>).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,

    /// Print the spec on stdout instead of writing it into --output-dir (the host files it
    /// names, the preload list and default region directories, are still prepared).
    #[arg(long)]
    pub stdout: bool,

    /// An empty --slices-dir is not an error: the node has no static slices (for example a
    /// node whose slices come from the Kubernetes DRA driver), so the spec this command
    /// wrote before, if any, is removed and nothing else is done. Without it an empty
    /// directory is refused, since it is most often a wrong path.
    #[arg(long)]
    pub allow_none: bool,
}

/// Why `gpuslice cdi` failed. `code` follows the CLI's exit codes: 2 usage (a flag's syntax),
/// 3 invalid input (a limit file, path or name that cannot be used), 4 runtime (cannot write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiError {
    pub code: i32,
    pub message: String,
}

impl CdiError {
    fn usage(message: impl Into<String>) -> Self {
        CdiError {
            code: 2,
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> Self {
        CdiError {
            code: 3,
            message: message.into(),
        }
    }
    fn runtime(message: impl Into<String>) -> Self {
        CdiError {
            code: 4,
            message: message.into(),
        }
    }

    /// The process exit code for this error.
    pub fn code(&self) -> i32 {
        self.code
    }
}

impl fmt::Display for CdiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CdiError {}

/// One slice as the command line names it, before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceArg {
    pub name: String,
    pub limit_file: PathBuf,
    pub region_dir: Option<PathBuf>,
}

/// Parses `NAME=LIMITFILE[:REGIONDIR]`. The region directory is recognised as the part after
/// the last `:` when that part is an absolute path, so limit-file paths may contain `:`.
pub fn parse_slice_arg(text: &str) -> Result<SliceArg, CdiError> {
    let bad = |why: &str| {
        CdiError::usage(format!(
            "--slice {text:?}: {why}; expected NAME=LIMITFILE[:REGIONDIR], e.g. small=/etc/gpuslice/small.json"
        ))
    };
    let (name, rest) = text.split_once('=').ok_or_else(|| bad("no '='"))?;
    check_device_name(name).map_err(|why| bad(&why))?;
    let (limit, region) = match rest.rsplit_once(':') {
        Some((limit, region)) if region.starts_with('/') => (limit, Some(region)),
        _ => (rest, None),
    };
    if limit.is_empty() {
        return Err(bad("the limit file is missing"));
    }
    Ok(SliceArg {
        name: name.to_string(),
        limit_file: PathBuf::from(limit),
        region_dir: region.map(PathBuf::from),
    })
}

/// Whether container path `outer` is `inner` or one of its ancestors (mounting at `outer`
/// would hide `inner`).
fn covers(outer: &str, inner: &str) -> bool {
    outer == "/"
        || inner == outer
        || (inner.starts_with(outer) && inner.as_bytes().get(outer.len()) == Some(&b'/'))
}

/// Reads and validates one slice's limit file; returns the container directory of its region.
fn region_container_dir(
    name: &str,
    limit_file: &Path,
    lib_container: &str,
) -> Result<String, CdiError> {
    let text = fs::read_to_string(limit_file).map_err(|e| {
        CdiError::invalid(format!(
            "slice {name}: cannot read limit file {}: {e}",
            limit_file.display()
        ))
    })?;
    let config = parse_limit_file(limit_file, &text)
        .map_err(|e| CdiError::invalid(format!("slice {name}: {e}")))?;
    let region = config.region_path.ok_or_else(|| {
        CdiError::invalid(format!(
            "slice {name}: limit file {} has no \"region\"; containers of one slice must share \
             one region file, so give it an absolute path such as \
             \"/var/run/gpuslice/{name}.region\" (its directory is mounted read-write)",
            limit_file.display()
        ))
    })?;
    let region = region
        .to_str()
        .ok_or_else(|| CdiError::invalid(format!("slice {name}: the region path is not UTF-8")))?;
    check_container_path("region", region).map_err(|why| {
        CdiError::invalid(format!(
            "slice {name}: limit file {}: {why}",
            limit_file.display()
        ))
    })?;
    let dir = match region.rfind('/') {
        Some(0) | None => "/",
        Some(end) => &region[..end],
    };
    if FORBIDDEN_REGION_DIRS.contains(&dir) {
        return Err(CdiError::invalid(format!(
            "slice {name}: limit file {}: region {region:?} lies directly in {dir}, which the \
             spec would have to mount over; use a directory of its own such as \
             /var/run/gpuslice/{name}.region",
            limit_file.display()
        )));
    }
    for inner in [DEFAULT_CONFIG_PATH, LD_SO_PRELOAD, lib_container] {
        if covers(dir, inner) {
            return Err(CdiError::invalid(format!(
                "slice {name}: limit file {}: the region directory {dir} would hide {inner}, \
                 which the spec also mounts; put the region elsewhere (e.g. /var/run/gpuslice)",
                limit_file.display()
            )));
        }
    }
    Ok(dir.to_string())
}

fn canonical_file(what: &str, path: &Path) -> Result<PathBuf, CdiError> {
    let canonical = fs::canonicalize(path)
        .map_err(|e| CdiError::invalid(format!("{what} {}: {e}", path.display())))?;
    if !canonical.is_file() {
        return Err(CdiError::invalid(format!(
            "{what} {} is not a regular file",
            path.display()
        )));
    }
    Ok(canonical)
}

/// The slices named by `--slice` and `--slices-dir`, in that order (directory entries
/// sorted by name).
fn collect_slices(args: &CdiArgs) -> Result<Vec<SliceArg>, CdiError> {
    let mut slices = args
        .slices
        .iter()
        .map(|text| parse_slice_arg(text))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(dir) = &args.slices_dir {
        let entries = fs::read_dir(dir)
            .map_err(|e| CdiError::invalid(format!("--slices-dir {}: {e}", dir.display())))?;
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry
                .map_err(|e| CdiError::invalid(format!("--slices-dir {}: {e}", dir.display())))?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            check_device_name(&stem).map_err(|why| {
                CdiError::invalid(format!(
                    "--slices-dir: {}: {why} (the file name is the slice name)",
                    path.display()
                ))
            })?;
            found.push(SliceArg {
                name: stem,
                limit_file: path,
                region_dir: None,
            });
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        if found.is_empty() && !args.allow_none {
            return Err(CdiError::invalid(format!(
                "--slices-dir {} holds no NAME.json limit files",
                dir.display()
            )));
        }
        slices.extend(found);
    }
    if slices.is_empty() && !(args.allow_none && args.slices_dir.is_some()) {
        return Err(CdiError::usage(
            "no slices: give --slice NAME=LIMITFILE[:REGIONDIR] (repeatable) or --slices-dir DIR",
        ));
    }
    let mut seen = BTreeSet::new();
    for slice in &slices {
        if !seen.insert(slice.name.as_str()) {
            return Err(CdiError::usage(format!(
                "slice {:?} is named twice; device names must be unique within a spec",
                slice.name
            )));
        }
    }
    Ok(slices)
}

fn absolute(path: &Path) -> Result<PathBuf, CdiError> {
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(path))
            .map_err(|e| CdiError::runtime(format!("cannot find the working directory: {e}")))
    }
}

fn create_dir_all(path: &Path) -> Result<(), CdiError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| CdiError::runtime(format!("cannot create {}: {e}", path.display())))
}

/// Validates everything, prepares the host files the spec names, then writes (or prints) it.
/// No slices to describe (`--allow-none`): the spec written before, if any, names slices that
/// are gone, so a runtime must stop offering them.
fn remove_old_spec(args: &CdiArgs) -> Result<(), CdiError> {
    if args.stdout {
        return Ok(());
    }
    let spec = absolute(&args.output_dir)?.join(&args.name);
    match fs::remove_file(&spec) {
        Ok(()) => eprintln!(
            "gpuslice cdi: no slices in {}; removed the old spec {}",
            args.slices_dir
                .as_deref()
                .unwrap_or(Path::new(""))
                .display(),
            spec.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => eprintln!(
            "gpuslice cdi: no slices in {}; no spec written",
            args.slices_dir
                .as_deref()
                .unwrap_or(Path::new(""))
                .display()
        ),
        Err(e) => {
            return Err(CdiError::runtime(format!(
                "cannot remove the old spec {}: {e}",
                spec.display()
            )))
        }
    }
    Ok(())
}

/// `--host-pid-dir`: absolute and an existing directory. A runtime refuses to start a
/// container whose mount source is missing, so a wrong path here would stop every container
/// of every slice, where no broker only slows their starts.
fn check_host_pid_dir(dir: &Path) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err(format!(
            "--host-pid-dir {}: not an absolute path",
            dir.display()
        ));
    }
    if !dir.is_dir() {
        return Err(format!(
            "--host-pid-dir {}: no such directory (start the broker first: gpuslice \
             host-pid-broker --socket {}/host-pid.sock, or gpuslice-node --host-pid-socket)",
            dir.display(),
            dir.display()
        ));
    }
    Ok(())
}

pub fn run(args: &CdiArgs) -> Result<(), CdiError> {
    check_kind(&args.kind).map_err(CdiError::usage)?;
    if let Some(dir) = &args.host_pid_dir {
        check_host_pid_dir(dir).map_err(CdiError::invalid)?;
    }
    check_container_path("--container-lib", &args.container_lib).map_err(CdiError::usage)?;
    if covers(&args.container_lib, DEFAULT_CONFIG_PATH) || args.container_lib == LD_SO_PRELOAD {
        return Err(CdiError::usage(format!(
            "--container-lib {} collides with {DEFAULT_CONFIG_PATH} or {LD_SO_PRELOAD}",
            args.container_lib
        )));
    }
    if !args.name.ends_with(".json")
        || args.name.len() <= ".json".len()
        || args.name.contains('/')
        || args.name.starts_with('.')
    {
        return Err(CdiError::usage(format!(
            "--name {:?} must be a plain file name ending in .json (runtimes read only *.json and \
             *.yaml)",
            args.name
        )));
    }

    let lib = match &args.lib {
        Some(lib) => lib.clone(),
        None => std::env::current_exe()
            .map_err(|e| CdiError::runtime(format!("cannot find the gpuslice binary: {e}")))?
            .with_file_name("libgpuslice.so"),
    };
    let lib_host = canonical_file("libgpuslice.so (--lib)", &lib)?;
    // The front fails closed without its core: refuse a spec that would mount only one.
    canonical_file(
        &format!("{CORE_LIBRARY_NAME} (beside --lib)"),
        &core_beside(&lib_host),
    )?;

    let mut mounts = Vec::new();
    let (vendor, class) = args.kind.split_once('/').unwrap_or((&args.kind, ""));
    let state_dir = absolute(&args.state_dir)?;
    for slice in collect_slices(args)? {
        let limit_file = canonical_file(
            &format!("slice {}: limit file", slice.name),
            &slice.limit_file,
        )?;
        let region_container_dir =
            region_container_dir(&slice.name, &limit_file, &args.container_lib)?;
        let region_host_dir = match &slice.region_dir {
            Some(dir) => {
                let canonical = fs::canonicalize(dir).map_err(|e| {
                    CdiError::invalid(format!(
                        "slice {}: region directory {}: {e}",
                        slice.name,
                        dir.display()
                    ))
                })?;
                if !canonical.is_dir() {
                    return Err(CdiError::invalid(format!(
                        "slice {}: region directory {} is not a directory",
                        slice.name,
                        dir.display()
                    )));
                }
                canonical
            }
            None => state_dir
                .join("regions")
                .join(vendor)
                .join(class)
                .join(&slice.name),
        };
        mounts.push((slice, limit_file, region_host_dir, region_container_dir));
    }

    if mounts.is_empty() {
        // --allow-none with an empty --slices-dir: no static slices on this node.
        return remove_old_spec(args);
    }

    // Everything is valid: now touch the file system.
    let preload_dir = state_dir.join("cdi");
    create_dir_all(&preload_dir)?;
    let preload_name = format!("{}.ld.so.preload", args.name.trim_end_matches(".json"));
    write_atomically(
        &preload_dir,
        &preload_name,
        preload_contents(&args.container_lib).as_bytes(),
    )
    .map_err(|e| {
        CdiError::runtime(format!(
            "cannot write {}: {e}",
            preload_dir.join(&preload_name).display()
        ))
    })?;
    let mut slices = Vec::new();
    for (slice, limit_file, region_host_dir, region_container_dir) in mounts {
        if slice.region_dir.is_none() {
            create_dir_all(&region_host_dir)?;
        }
        slices.push(SliceMounts {
            name: slice.name,
            limit_file,
            region_host_dir,
            region_container_dir,
        });
    }
    let inputs = SpecInputs {
        kind: args.kind.clone(),
        lib_host,
        lib_container: args.container_lib.clone(),
        preload_host: preload_dir.join(&preload_name),
        slices,
        host_pid_dir: args.host_pid_dir.clone(),
    };
    let mut text = serde_json::to_string_pretty(&generate_spec(&inputs))
        .map_err(|e| CdiError::runtime(format!("cannot serialise the spec: {e}")))?;
    text.push('\n');

    if args.stdout {
        print!("{text}");
        return Ok(());
    }
    let output_dir = absolute(&args.output_dir)?;
    create_dir_all(&output_dir)?;
    write_atomically(&output_dir, &args.name, text.as_bytes()).map_err(|e| {
        CdiError::runtime(format!(
            "cannot write {}: {e}",
            output_dir.join(&args.name).display()
        ))
    })?;
    if !RUNTIME_SPEC_DIRS
        .iter()
        .any(|dir| Path::new(dir) == output_dir)
    {
        eprintln!(
            "gpuslice cdi: note: container runtimes read specs from /etc/cdi and /var/run/cdi, \
             not {}",
            output_dir.display()
        );
    }
    eprintln!(
        "gpuslice cdi: wrote {} ({} device{})",
        output_dir.join(&args.name).display(),
        inputs.slices.len(),
        if inputs.slices.len() == 1 { "" } else { "s" }
    );
    for slice in &inputs.slices {
        println!("{}={}", args.kind, slice.name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory per test, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "gpuslice-cdi-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn args(tmp: &Path, slices: &[String]) -> CdiArgs {
        let lib = tmp.join("libgpuslice.so");
        fs::write(&lib, b"not really a library").unwrap();
        fs::write(core_beside(&lib), b"not really the core").unwrap();
        CdiArgs {
            slices: slices.to_vec(),
            slices_dir: None,
            kind: DEFAULT_KIND.into(),
            lib: Some(lib),
            container_lib: DEFAULT_CONTAINER_LIB.into(),
            host_pid_dir: None,
            output_dir: tmp.join("cdi"),
            name: DEFAULT_SPEC_NAME.into(),
            state_dir: tmp.join("state"),
            stdout: false,
            allow_none: false,
        }
    }

    fn limit_file(dir: &Path, name: &str, region: Option<&str>) -> PathBuf {
        let path = dir.join(format!("{name}.json"));
        let region = region.map_or(String::new(), |r| format!("\"region\": \"{r}\", "));
        fs::write(
            &path,
            format!(
                "{{\"version\": 1, {region}\"devices\": [{{\"index\": 0, \"memory\": \"1GiB\", \"compute\": 25}}]}}"
            ),
        )
        .unwrap();
        path
    }

    /// Changes one flag of a refusal case.
    type Tweak = Box<dyn Fn(&mut CdiArgs)>;

    fn written_spec(args: &CdiArgs) -> Value {
        let text = fs::read_to_string(args.output_dir.join(&args.name)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn mount<'a>(device: &'a Value, container_path: &str) -> &'a Value {
        device["containerEdits"]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["containerPath"] == container_path)
            .unwrap_or_else(|| panic!("no mount at {container_path} in {device}"))
    }

    #[test]
    fn slice_argument_syntax() {
        assert_eq!(
            parse_slice_arg("a=/etc/x.json").unwrap(),
            SliceArg {
                name: "a".into(),
                limit_file: "/etc/x.json".into(),
                region_dir: None
            }
        );
        assert_eq!(
            parse_slice_arg("b-1=/etc/x:y.json:/srv/r").unwrap(),
            SliceArg {
                name: "b-1".into(),
                limit_file: "/etc/x:y.json".into(),
                region_dir: Some("/srv/r".into())
            }
        );
        // A ':' not followed by an absolute path belongs to the limit file.
        assert_eq!(
            parse_slice_arg("c=rel:x.json").unwrap().limit_file,
            PathBuf::from("rel:x.json")
        );
        for bad in [
            "noequals",
            "=x.json",
            "a=",
            "-a=x.json",
            "a/b=x.json",
            "a:b=x.json",
        ] {
            let err = parse_slice_arg(bad).unwrap_err();
            assert_eq!(err.code(), 2, "{bad}: {err}");
            assert!(err.message.contains("NAME=LIMITFILE"), "{err}");
        }
    }

    #[test]
    fn kind_and_container_path_grammar() {
        assert!(check_kind("gpuslice.dev/slice").is_ok());
        assert!(check_kind("example.com/gpu-slice_2").is_ok());
        for bad in [
            "slice",
            "/slice",
            "gpuslice.dev/",
            "1x.dev/slice",
            "a.dev/sl.ice",
            "a.dev/x-",
        ] {
            assert!(check_kind(bad).is_err(), "{bad}");
        }
        assert!(check_container_path("p", "/usr/lib/gpuslice/libgpuslice.so").is_ok());
        for bad in [
            "usr/lib/x.so",
            "/usr/../x.so",
            "/usr/./x.so",
            "/usr//x.so",
            "/a b.so",
            "/a:b.so",
            "/x/",
        ] {
            assert!(check_container_path("p", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn generated_spec_mounts_shim_preload_limits_and_region() {
        let inputs = SpecInputs {
            kind: "gpuslice.dev/slice".into(),
            lib_host: "/opt/gpuslice/libgpuslice.so".into(),
            lib_container: DEFAULT_CONTAINER_LIB.into(),
            preload_host: "/var/lib/gpuslice/cdi/gpuslice.ld.so.preload".into(),
            slices: vec![SliceMounts {
                name: "small".into(),
                limit_file: "/etc/gpuslice/slices/small.json".into(),
                region_host_dir: "/var/lib/gpuslice/regions/small".into(),
                region_container_dir: "/var/run/gpuslice".into(),
            }],
            host_pid_dir: None,
        };
        let spec = generate_spec(&inputs);
        assert_eq!(spec["cdiVersion"], "0.5.0");
        assert_eq!(spec["kind"], "gpuslice.dev/slice");
        let device = &spec["devices"][0];
        assert_eq!(device["name"], "small");
        assert!(device["containerEdits"].get("deviceNodes").is_none());
        assert_eq!(
            device["containerEdits"]["env"],
            json!(["GPUSLICE_CONFIG=/etc/gpuslice/limits.json"])
        );
        let lib = mount(device, DEFAULT_CONTAINER_LIB);
        assert_eq!(lib["hostPath"], "/opt/gpuslice/libgpuslice.so");
        // The front loads its core from its own directory: mounted beside it, read-only.
        let core = mount(device, "/usr/lib/gpuslice/libgpuslice_core.so");
        assert_eq!(core["hostPath"], "/opt/gpuslice/libgpuslice_core.so");
        assert_eq!(core["options"], lib["options"]);
        assert_eq!(lib["options"][0], "ro");
        // The shim is mmap'd executable: its mount must not be noexec.
        assert!(!lib["options"]
            .as_array()
            .unwrap()
            .contains(&json!("noexec")));
        let preload = mount(device, "/etc/ld.so.preload");
        assert_eq!(
            preload["hostPath"],
            "/var/lib/gpuslice/cdi/gpuslice.ld.so.preload"
        );
        assert_eq!(preload["options"][0], "ro");
        let limits = mount(device, "/etc/gpuslice/limits.json");
        assert_eq!(limits["hostPath"], "/etc/gpuslice/slices/small.json");
        assert_eq!(limits["options"][0], "ro");
        let region = mount(device, "/var/run/gpuslice");
        assert_eq!(region["hostPath"], "/var/lib/gpuslice/regions/small");
        assert_eq!(region["options"][0], "rw");
        assert_eq!(
            preload_contents(DEFAULT_CONTAINER_LIB),
            "/usr/lib/gpuslice/libgpuslice.so\n"
        );
        // No broker named: no broker mounted; named: its directory, read-only, where the
        // shim asks.
        let mounts = device["containerEdits"]["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 5, "{mounts:?}");
        let with_broker = generate_spec(&SpecInputs {
            host_pid_dir: Some("/run/gpuslice-node".into()),
            ..inputs
        });
        let broker = mount(&with_broker["devices"][0], "/run/gpuslice/node");
        assert_eq!(broker["hostPath"], "/run/gpuslice-node");
        assert_eq!(broker["options"][0], "ro");
        assert_eq!(
            gpuslice_common::host_pid_broker::DEFAULT_SOCKET,
            "/run/gpuslice/node/host-pid.sock",
            "the shim asks inside the mounted directory"
        );
    }

    /// A broker directory that is missing or relative is refused before anything is written
    /// (a runtime would refuse every container whose mount source is missing); an existing
    /// one is mounted into every device.
    #[test]
    fn the_host_pid_dir_must_exist_and_is_mounted_into_every_slice() {
        let tmp = TempDir::new();
        let a = limit_file(&tmp.0, "a", Some("/var/run/gpuslice/a.region"));
        let mut with_broker = args(&tmp.0, &[format!("a={}", a.display())]);
        for bad in [
            PathBuf::from("run/gpuslice/node"),
            tmp.0.join("no-such-dir"),
        ] {
            with_broker.host_pid_dir = Some(bad.clone());
            let error = run(&with_broker).unwrap_err();
            assert_eq!(error.code(), crate::error::EXIT_INVALID, "{bad:?}");
            assert!(
                error.message.contains("--host-pid-dir"),
                "{}",
                error.message
            );
            assert!(!with_broker.output_dir.join(DEFAULT_SPEC_NAME).exists());
        }
        let node = tmp.0.join("node");
        fs::create_dir(&node).unwrap();
        with_broker.host_pid_dir = Some(node.clone());
        run(&with_broker).unwrap();
        let spec = written_spec(&with_broker);
        let broker = mount(&spec["devices"][0], "/run/gpuslice/node");
        assert_eq!(broker["hostPath"], node.to_str().unwrap());
        assert_eq!(broker["options"][0], "ro");
    }

    #[test]
    fn run_writes_spec_preload_and_region_dirs() {
        let tmp = TempDir::new();
        let a = limit_file(&tmp.0, "a", Some("/var/run/gpuslice/a.region"));
        let b = limit_file(&tmp.0, "b", Some("/run/slices/b/b.region"));
        let b_region = tmp.0.join("b-region");
        fs::create_dir(&b_region).unwrap();
        let args = args(
            &tmp.0,
            &[
                format!("a={}", a.display()),
                format!("b={}:{}", b.display(), b_region.display()),
            ],
        );
        run(&args).unwrap();

        let spec = written_spec(&args);
        let devices = spec["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        let a_region = mount(&devices[0], "/var/run/gpuslice");
        let default_dir = tmp.0.join("state/regions/gpuslice.dev/slice/a");
        assert!(
            default_dir.is_dir(),
            "default region directory was not created"
        );
        assert_eq!(a_region["hostPath"], default_dir.to_str().unwrap());
        assert_eq!(
            mount(&devices[1], "/run/slices/b")["hostPath"],
            b_region.to_str().unwrap()
        );
        assert_eq!(
            mount(&devices[1], "/etc/gpuslice/limits.json")["hostPath"],
            b.to_str().unwrap()
        );
        let preload = tmp.0.join("state/cdi/gpuslice.ld.so.preload");
        assert_eq!(
            mount(&devices[0], "/etc/ld.so.preload")["hostPath"],
            preload.to_str().unwrap()
        );
        assert_eq!(
            fs::read_to_string(&preload).unwrap(),
            "/usr/lib/gpuslice/libgpuslice.so\n"
        );
        // Nothing but the spec is left in the output directory (no temp files).
        let names: Vec<_> = fs::read_dir(&args.output_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("gpuslice.json")]);

        // Rerunning replaces the spec in place.
        let mut again = args.clone();
        again.slices.truncate(1);
        run(&again).unwrap();
        assert_eq!(written_spec(&again)["devices"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn slices_dir_names_devices_by_file_stem() {
        let tmp = TempDir::new();
        let dir = tmp.0.join("slices");
        fs::create_dir(&dir).unwrap();
        limit_file(&dir, "quarter", Some("/var/run/gpuslice/q.region"));
        limit_file(&dir, "half", Some("/var/run/gpuslice/h.region"));
        fs::write(dir.join("README"), "ignored").unwrap();
        let mut args = args(&tmp.0, &[]);
        args.slices_dir = Some(dir);
        args.kind = "example.com/gpu".into();
        args.name = "slices.json".into();
        run(&args).unwrap();
        let spec = written_spec(&args);
        assert_eq!(spec["kind"], "example.com/gpu");
        let names: Vec<_> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["half", "quarter"]);
        assert!(tmp.0.join("state/cdi/slices.ld.so.preload").is_file());
    }

    #[test]
    fn an_empty_slices_dir_is_refused_unless_allowed_and_then_removes_the_old_spec() {
        let tmp = TempDir::new();
        let dir = tmp.0.join("slices");
        fs::create_dir(&dir).unwrap();
        limit_file(&dir, "quarter", Some("/var/run/gpuslice/q.region"));
        let mut args = args(&tmp.0, &[]);
        args.slices_dir = Some(dir.clone());
        run(&args).unwrap();
        let spec = args.output_dir.join(&args.name);
        assert!(spec.is_file());
        // The node's last static slice is removed.
        fs::remove_file(dir.join("quarter.json")).unwrap();
        let err = run(&args).unwrap_err();
        assert_eq!(err.code, 3, "{err:?}");
        assert!(err.message.contains("holds no NAME.json"), "{err:?}");
        assert!(spec.is_file(), "a refusal changes nothing");
        // Allowed (a DRA node, an installer DaemonSet): the stale spec goes, twice is fine.
        args.allow_none = true;
        run(&args).unwrap();
        assert!(
            !spec.exists(),
            "the runtime must stop offering the removed slice"
        );
        run(&args).unwrap();
        // Without any source of slices it is still a usage error.
        args.slices_dir = None;
        assert_eq!(run(&args).unwrap_err().code, 2);
    }

    #[test]
    fn refuses_bad_inputs_before_writing_anything() {
        let tmp = TempDir::new();
        let good = limit_file(&tmp.0, "good", Some("/var/run/gpuslice/g.region"));
        let no_region = limit_file(&tmp.0, "noregion", None);
        let in_etc = limit_file(&tmp.0, "inetc", Some("/etc/x.region"));
        let over_lib = limit_file(&tmp.0, "overlib", Some("/usr/lib/gpuslice/x.region"));
        let broken = tmp.0.join("broken.json");
        fs::write(
            &broken,
            "{\"version\": 1, \"devices\": [{\"index\": 0, \"memory\": \"8XB\"}]}",
        )
        .unwrap();
        // A front library without its core beside it (the front would fail closed).
        fs::create_dir_all(tmp.0.join("alone")).unwrap();
        let coreless = tmp.0.join("alone/libgpuslice.so");
        fs::write(&coreless, b"not really a library").unwrap();
        let cases: Vec<(Vec<String>, Tweak, i32, &str)> = vec![
            (
                vec![format!("a={}", no_region.display())],
                Box::new(|_| {}),
                3,
                "has no \"region\"",
            ),
            (
                vec![format!("a={}", in_etc.display())],
                Box::new(|_| {}),
                3,
                "lies directly in /etc",
            ),
            (
                vec![format!("a={}", over_lib.display())],
                Box::new(|_| {}),
                3,
                "would hide /usr/lib/gpuslice/libgpuslice.so",
            ),
            (
                vec![format!("a={}", broken.display())],
                Box::new(|_| {}),
                3,
                "devices[0].memory",
            ),
            (
                vec!["a=/nonexistent/limits.json".into()],
                Box::new(|_| {}),
                3,
                "/nonexistent/limits.json",
            ),
            (
                vec![format!("a={}:/nonexistent/dir", good.display())],
                Box::new(|_| {}),
                3,
                "region directory /nonexistent/dir",
            ),
            (
                vec![
                    format!("a={}", good.display()),
                    format!("a={}", good.display()),
                ],
                Box::new(|_| {}),
                2,
                "named twice",
            ),
            (vec![], Box::new(|_| {}), 2, "no slices"),
            (
                vec![format!("a={}", good.display())],
                Box::new(|a| a.lib = Some("/nonexistent/libgpuslice.so".into())),
                3,
                "--lib",
            ),
            (
                vec![format!("a={}", good.display())],
                Box::new(move |a| a.lib = Some(coreless.clone())),
                3,
                "libgpuslice_core.so (beside --lib)",
            ),
            (
                vec![format!("a={}", good.display())],
                Box::new(|a| a.container_lib = "lib/x.so".into()),
                2,
                "absolute",
            ),
            (
                vec![format!("a={}", good.display())],
                Box::new(|a| a.kind = "noslash".into()),
                2,
                "VENDOR/CLASS",
            ),
            (
                vec![format!("a={}", good.display())],
                Box::new(|a| a.name = "spec.yaml".into()),
                2,
                ".json",
            ),
        ];
        for (slices, tweak, code, needle) in cases {
            let mut args = args(&tmp.0, &slices);
            tweak(&mut args);
            let err = run(&args).unwrap_err();
            assert_eq!(err.code(), code, "{slices:?}: {err}");
            assert!(
                err.message.contains(needle),
                "{slices:?}: {err:?} lacks {needle:?}"
            );
            assert!(!args.output_dir.exists(), "{slices:?}: wrote despite {err}");
            assert!(
                !args.state_dir.exists(),
                "{slices:?}: prepared state despite {err}"
            );
        }
    }
}
