//! `gpuslice write`: a limit file from flags or from HAMi env, validated by the same parser
//! the shim uses. Printed on standard output unless `-o FILE` names where to write it: the
//! machine-wide anchored path (`/etc/gpuslice/limits.json`, which caps every shim process of
//! the machine and silences their own configuration) is written only when named with `-o`.
//! A file is written atomically (temp file in the target directory, fsync, rename, fsync of
//! the directory) with mode 0644. A different existing file is only replaced with `--force`;
//! identical content is a successful no-op. What was written, and where, is said on stderr.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;
use gpuslice_common::config::{self, DEFAULT_CONFIG_PATH};

use crate::error::{CliError, CliResult};
use crate::slice::{self, NoDevices, SliceArgs};

#[derive(Debug, Args)]
pub struct WriteArgs {
    #[command(flatten)]
    pub slice: SliceArgs,

    /// Shared-region file all processes of the slice use (absolute; a relative path is made
    /// absolute against the working directory).
    #[arg(long, value_name = "PATH")]
    pub region: Option<PathBuf>,

    /// Take the slice from HAMi env (CUDA_DEVICE_MEMORY_LIMIT[_i], CUDA_DEVICE_SM_LIMIT[_i],
    /// CUDA_DEVICE_MEMORY_SHARED_CACHE, GPU_CORE_UTILIZATION_POLICY, LIBCUDA_LOG_LEVEL)
    /// instead of flags.
    #[arg(long, conflicts_with_all = ["devices", "memory", "compute", "virtual_memory", "region"])]
    pub from_env: bool,

    /// Where to write the limit file (default, or "-": standard output). The anchored path
    /// /etc/gpuslice/limits.json caps every shim process of the machine: it is written only
    /// when named here.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Replace an existing limit file whose content differs.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &WriteArgs) -> CliResult<()> {
    let config = if args.from_env {
        let get = |name: &str| std::env::var(name).ok();
        match config::from_hami_env(&get)? {
            Some(config) => config,
            None => {
                return Err(CliError::invalid(
                    "--from-env: no HAMi variable is set (CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT, ...); set them or use --device",
                ))
            }
        }
    } else {
        args.slice
            .to_config(args.region.clone(), NoDevices::Refuse)?
    };
    let config = slice::validate(&config)?;
    let text = config::to_json(&config);
    let output = args
        .output
        .as_deref()
        .filter(|path| path.as_os_str() != "-");
    let Some(output) = output else {
        print!("{text}");
        eprintln!(
            "gpuslice: limit file printed on standard output (nothing installed; give -o FILE to write one, and point GPUSLICE_CONFIG at it)"
        );
        describe(&config);
        return Ok(());
    };
    let outcome = write_atomically(output, text.as_bytes(), args.force)?;
    let verb = match outcome {
        Outcome::Unchanged => "unchanged (identical content)",
        Outcome::Created => "written",
        Outcome::Replaced => "replaced",
    };
    eprintln!("gpuslice: {}: {verb}", output.display());
    if is_anchored(output) {
        eprintln!(
            "gpuslice: {DEFAULT_CONFIG_PATH} is the anchored limit file: every process of this machine that loads the shim is held to it, and GPUSLICE_CONFIG and HAMi variables are ignored while it exists"
        );
    }
    describe(&config);
    Ok(())
}

fn describe(config: &config::SliceConfig) {
    for line in crate::check::describe(config) {
        eprintln!("  {line}");
    }
}

/// Whether `path` is (or leads to) the anchored limit file.
fn is_anchored(path: &Path) -> bool {
    let anchored = Path::new(DEFAULT_CONFIG_PATH);
    path == anchored
        || match (fs::canonicalize(path), fs::canonicalize(anchored)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Replaced,
    Unchanged,
}

/// Writes `content` to `path` so that readers see the old file or the new one, never a part.
pub fn write_atomically(path: &Path, content: &[u8], force: bool) -> CliResult<Outcome> {
    let shown = path.display();
    let existed = match fs::read(path) {
        Ok(existing) if existing == content => return Ok(Outcome::Unchanged),
        Ok(_) if !force => {
            return Err(CliError::invalid(format!(
                "{shown} already exists with different limits; pass --force to replace it"
            )))
        }
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory || path.is_dir() => {
            return Err(CliError::invalid(format!(
                "{shown} is a directory; give the limit file's path with -o"
            )))
        }
        Err(e) if !force => {
            return Err(CliError::runtime(format!(
                "cannot read the existing {shown} ({e}); fix its permissions or pass --force to replace it"
            )))
        }
        Err(_) => true,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|e| {
        CliError::runtime(format!(
            "cannot create directory {} ({e}); create it or choose another -o",
            dir.display()
        ))
    })?;
    let file_name = path
        .file_name()
        .ok_or_else(|| CliError::usage(format!("{shown} is not a file path")))?;
    let temp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_temp_and_rename(&temp, path, &dir, content);
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result?;
    Ok(if existed {
        Outcome::Replaced
    } else {
        Outcome::Created
    })
}

fn write_temp_and_rename(temp: &Path, path: &Path, dir: &Path, content: &[u8]) -> CliResult<()> {
    let io = |what: &str, e: std::io::Error| {
        CliError::runtime(format!(
            "cannot {what} {} ({e}); check the directory's permissions or choose another -o",
            path.display()
        ))
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(temp)
        .map_err(|e| io("write", e))?;
    // The umask may have taken bits away; a limit file must be readable by every process.
    file.set_permissions(fs::Permissions::from_mode(0o644))
        .map_err(|e| io("set permissions on", e))?;
    file.write_all(content).map_err(|e| io("write", e))?;
    file.sync_all().map_err(|e| io("sync", e))?;
    drop(file);
    fs::rename(temp, path).map_err(|e| io("rename into", e))?;
    sync_dir(dir).map_err(|e| io("sync the directory of", e))
}

/// fsync on the directory makes the rename itself durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let c_dir = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c_dir` is a valid NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c_dir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is an open descriptor we own.
    let rc = unsafe { libc::fsync(fd) };
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is open and closed exactly once.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpuslice-write-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn creates_replaces_only_with_force_and_accepts_identical() {
        let dir = temp_dir("cycle");
        let path = dir.join("sub/limits.json");
        assert_eq!(write_atomically(&path, b"one", false), Ok(Outcome::Created));
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        assert_eq!(
            write_atomically(&path, b"one", false),
            Ok(Outcome::Unchanged)
        );
        let err = write_atomically(&path, b"two", false).unwrap_err();
        assert!(err.message.contains("--force"), "{}", err.message);
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(write_atomically(&path, b"two", true), Ok(Outcome::Replaced));
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let leftovers: Vec<_> = fs::read_dir(dir.join("sub")).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temp files left behind");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_is_not_a_limit_file() {
        let dir = temp_dir("isdir");
        let err = write_atomically(&dir, b"x", true).unwrap_err();
        assert_eq!(err.code, crate::error::EXIT_INVALID);
        fs::remove_dir_all(&dir).unwrap();
    }
}
