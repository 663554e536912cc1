//! The `fakegpu` tool: `install DIR` lays the fake driver libraries out under their real
//! names; `smi` prints the host's view of the simulated GPU (see `smi.rs` for the JSON).

mod smi;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const HELP: &str = "\
fakegpu: tools for the simulated NVIDIA GPU

USAGE:
    fakegpu install DIR
        Copy the fake driver into DIR: libfakegpu_cuda.so -> DIR/libcuda.so.1,
        libfakegpu_nvml.so -> DIR/libnvidia-ml.so.1, plus the libcuda.so and
        libnvidia-ml.so symlinks. The libraries are taken from the directory this
        binary lives in (target/debug or target/release); build them first with
        `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml`.
        Then run clients with LD_LIBRARY_PATH=DIR.

    fakegpu smi [--json] [--state PATH]
        The host administrator's view (like nvidia-smi on the host): every device with
        used/total memory and utilisation, every process with its real PID and physical
        memory. --json prints
        {\"devices\":[{\"index\",\"name\",\"uuid\",\"memory_total\",\"memory_used\",
                      \"utilization_gpu\",\"processes\":[{\"pid\",\"used_memory\"}]}]}
        (bytes and percent). The state is PATH, else $FAKEGPU_STATE, else
        /tmp/fakegpu-$UID.state.

    fakegpu pid-broker [--state PATH]
        The host-PID broker (run it in the PID namespace the state was created in,
        e.g. on the host): answers every connection on the unix socket PATH.hostpid
        with the caller's PID as the kernel translates it into this namespace. A
        process of another PID namespace (a container) that registers with the fake
        asks it for its host PID, which NVML then reports, as the real driver does;
        without it such a process's cuInit fails (CUDA_ERROR_NO_DEVICE). Mount the
        socket next to the state file in the container. Prints `listening on SOCKET`
        once ready; runs until killed.

    fakegpu --help

EXIT STATUS:
    0 success, 1 error, 2 usage, 141 standard output closed by its reader (`| head`)

ENVIRONMENT:
    FAKEGPU_STATE           shared state file (one simulated machine per path)
    FAKEGPU_UTIL_WINDOW_MS  utilisation sampling window, default 1000
    FAKEGPU_RELEASE_DELAY_MS
                            a dead process's memory is released (and it leaves the
                            process lists) only once it has been seen dead this long;
                            default 0; kept in the state for every process
";

/// The two cdylibs and the names real clients load them by.
const LIBRARIES: &[(&str, &str, &str)] = &[
    ("libfakegpu_cuda.so", "libcuda.so.1", "libcuda.so"),
    ("libfakegpu_nvml.so", "libnvidia-ml.so.1", "libnvidia-ml.so"),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None | Some("--help" | "-h" | "help") => {
            emit(format_args!("{HELP}"));
            return ExitCode::SUCCESS;
        }
        Some("install") => match &args[1..] {
            [flag] if matches!(flag.as_str(), "--help" | "-h") => {
                emit(format_args!("{HELP}"));
                return ExitCode::SUCCESS;
            }
            // An option is never a directory name: `install --help` once made `./--help`.
            [dir] if dir.starts_with('-') => {
                Err(usage(&format!("install: unknown option `{dir}`")))
            }
            [dir] => install(Path::new(dir)),
            _ => Err(usage("install takes exactly one DIR")),
        },
        Some("smi") => smi_command(&args[1..]),
        Some("pid-broker") => pid_broker_command(&args[1..]),
        Some(other) => Err(usage(&format!("unknown command `{other}`"))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("fakegpu: {message}\n\n{HELP}");
            ExitCode::from(2)
        }
        Err(Failure::Error(message)) => {
            eprintln!("fakegpu: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Exit status when standard output was closed by its reader: 128 + SIGPIPE, what a shell
/// reports for a Unix tool that SIGPIPE ended.
const EXIT_CLOSED_PIPE: i32 = 141;

/// Writes to standard output. `print!` would panic on a closed pipe (`fakegpu smi | head -1`:
/// exit 101 and a panic message, since Rust ignores SIGPIPE); this ends the tool quietly
/// with [`EXIT_CLOSED_PIPE`] instead. A helper, not SIGPIPE's default action, so the exit
/// status stays one this tool documents whatever the write.
fn emit(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(EXIT_CLOSED_PIPE);
        }
        drop(stdout);
        eprintln!("fakegpu: cannot write to standard output: {error}");
        std::process::exit(1);
    }
}

enum Failure {
    Usage(String),
    Error(String),
}

fn usage(message: &str) -> Failure {
    Failure::Usage(message.to_string())
}

fn error(message: String) -> Failure {
    Failure::Error(message)
}

fn install(dir: &Path) -> Result<(), Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| error(format!("cannot locate the fakegpu binary: {e}")))?;
    let from = exe
        .parent()
        .ok_or_else(|| error(format!("{} has no parent directory", exe.display())))?;
    // Check every source before touching DIR, so a half-built tree never gets half-installed.
    for (source, _, _) in LIBRARIES {
        let path = from.join(source);
        if !path.is_file() {
            return Err(error(format!(
                "{} not found (looked next to {}); build it with \
                 `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` (add --release for \
                 target/release)",
                path.display(),
                exe.display()
            )));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| error(format!("cannot create {}: {e}", dir.display())))?;
    for (source, soname, link) in LIBRARIES {
        let target = dir.join(soname);
        copy_replacing(&from.join(source), &target)?;
        let link_path = dir.join(link);
        match std::fs::symlink_metadata(&link_path) {
            Ok(_) => std::fs::remove_file(&link_path)
                .map_err(|e| error(format!("cannot replace {}: {e}", link_path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(error(format!(
                    "cannot inspect {}: {e}",
                    link_path.display()
                )))
            }
        }
        // Relative, so the directory can be moved or bind-mounted into a container.
        std::os::unix::fs::symlink(soname, &link_path)
            .map_err(|e| error(format!("cannot link {}: {e}", link_path.display())))?;
    }
    emit(format_args!(
        "installed the fake driver in {}\n",
        dir.display()
    ));
    Ok(())
}

/// Copies through a temporary name and renames over the target: a process that has the old
/// library mapped keeps its (unlinked) copy instead of seeing its code change under it.
fn copy_replacing(from: &Path, to: &Path) -> Result<(), Failure> {
    let tmp = to.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::copy(from, &tmp).map_err(|e| {
        error(format!(
            "cannot copy {} to {}: {e}",
            from.display(),
            tmp.display()
        ))
    })?;
    std::fs::rename(&tmp, to).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        error(format!("cannot move {} into place: {e}", to.display()))
    })
}

fn default_state_path() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/fakegpu-{uid}.state"))
}

fn pid_broker_command(args: &[String]) -> Result<(), Failure> {
    let path = match args {
        [] => std::env::var_os("FAKEGPU_STATE")
            .map(PathBuf::from)
            .unwrap_or_else(default_state_path),
        [flag, path] if flag == "--state" => PathBuf::from(path),
        _ => return Err(usage("pid-broker takes only --state PATH")),
    };
    let socket = fakegpu::host_pid::broker_socket(&path);
    fakegpu::host_pid::serve(&socket, || {
        emit(format_args!("listening on {}\n", socket.display()))
    })
    .map_err(error)
}

fn smi_command(args: &[String]) -> Result<(), Failure> {
    let mut json = false;
    let mut state_path: Option<PathBuf> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--state" => {
                let path = rest.next().ok_or_else(|| usage("--state needs a PATH"))?;
                state_path = Some(PathBuf::from(path));
            }
            other => return Err(usage(&format!("unknown smi option `{other}`"))),
        }
    }
    let path = state_path
        .or_else(|| std::env::var_os("FAKEGPU_STATE").map(PathBuf::from))
        .unwrap_or_else(default_state_path);
    // The admin's view must not create a machine as a side effect of looking at it.
    if !path.exists() {
        return Err(error(format!(
            "no fake GPU state at {} (nothing has used the fake GPU with this FAKEGPU_STATE \
             yet; pass --state PATH or set FAKEGPU_STATE)",
            path.display()
        )));
    }
    let state = fakegpu::open_state_at(&path).map_err(|e| {
        error(format!(
            "cannot open fake GPU state {}: {e}",
            path.display()
        ))
    })?;
    let report = smi::snapshot(&state);
    if json {
        emit(format_args!("{}\n", smi::to_json(&report)));
    } else {
        emit(format_args!("{}", smi::render_table(&report)));
    }
    Ok(())
}
