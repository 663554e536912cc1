//! `gpuslice check`'s look at the region path the way the shim will use it: the shim opens
//! (creating if missing) the region file for reading and writing in its directory, and a
//! region it cannot open refuses every process of the slice. So a missing or unwritable
//! directory, an unwritable file, a symbolic link or something that is not a file at the
//! region path is reported here, before a workload starts, naming the limit file and its
//! `region` field. (Name lengths are refused by the limit-file parser already.)
//!
//! The checks run as the user running `check`: root passes permission checks a container's
//! user may fail, so the message says whose permissions were tested.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use gpuslice_common::config::{ConfigError, SliceConfig};
use gpuslice_common::text::{shorten, MAX_QUOTED};

/// `Err` when the shim could not open or create the region of `config` here.
pub fn check(config: &SliceConfig) -> Result<(), ConfigError> {
    let path = config.region_or_default();
    problem(&path).map_err(|problem| {
        let (origin, field) = config.region_source();
        ConfigError {
            origin,
            field,
            problem: format!(
                "{}: {problem}; the shim would refuse every process of the slice",
                shorten(&path.display().to_string(), MAX_QUOTED)
            ),
        }
    })
}

fn problem(path: &Path) -> Result<(), String> {
    let who = user();
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(
            "is a symbolic link; name the region file itself (a link lets whoever can change it choose where the slice's ledger lives)"
                .into(),
        ),
        Ok(meta) if meta.is_dir() => Err("is a directory, not a region file".into()),
        Ok(meta) if meta.file_type().is_fifo() || meta.file_type().is_socket()
            || meta.file_type().is_block_device() || meta.file_type().is_char_device() =>
        {
            Err("is not a regular file".into())
        }
        Ok(_) => accessible(path, libc::R_OK | libc::W_OK).map_err(|e| {
            format!("exists but {who} cannot read and write it ({e}); every process of the slice opens it for writing")
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = path.parent().unwrap_or(Path::new("/"));
            let dir_text = shorten(&dir.display().to_string(), MAX_QUOTED).into_owned();
            match std::fs::metadata(dir) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
                    "its directory {dir_text} does not exist; the shim creates the region file but not its directory"
                )),
                Err(e) => Err(format!("its directory {dir_text} cannot be examined ({e})")),
                Ok(meta) if !meta.is_dir() => Err(format!("{dir_text} is not a directory")),
                Ok(_) => accessible(dir, libc::W_OK | libc::X_OK).map_err(|e| {
                    format!(
                        "does not exist and {who} cannot create it: its directory {dir_text} is not writable ({e})"
                    )
                }),
            }
        }
        Err(e) => Err(format!("cannot be examined ({e})")),
    }
}

/// access(2) with the real user's permissions (EROFS for a read-only file system too).
fn accessible(path: &Path, mode: libc::c_int) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: c_path is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::access(c_path.as_ptr(), mode) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn user() -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    format!("uid {}", unsafe { libc::getuid() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::parse_limit_file;

    fn config_with_region(region: &Path) -> SliceConfig {
        let text = format!(
            r#"{{"version": 1, "region": "{}", "devices": []}}"#,
            region.display()
        );
        parse_limit_file(Path::new("/etc/gpuslice/limits.json"), &text).unwrap()
    }

    #[test]
    fn a_usable_region_passes_and_each_unusable_one_names_file_field_and_cause() {
        let dir = crate::sandbox::TempDir::new("gpuslice-region-check").unwrap();
        let root = dir.path();
        assert!(check(&config_with_region(&root.join("new.region"))).is_ok());
        std::fs::write(root.join("old.region"), b"").unwrap();
        assert!(check(&config_with_region(&root.join("old.region"))).is_ok());

        std::os::unix::fs::symlink(root.join("old.region"), root.join("link.region")).unwrap();
        let cases = [
            (root.join("absent/a.region"), "does not exist"),
            (root.join("link.region"), "symbolic link"),
            (root.to_path_buf(), "is a directory"),
            (root.join("old.region/a.region"), "Not a directory"),
        ];
        for (path, needle) in cases {
            let err = check(&config_with_region(&path)).unwrap_err();
            assert_eq!(err.origin, "/etc/gpuslice/limits.json");
            assert_eq!(err.field, "region");
            assert!(err.problem.contains(needle), "{path:?}: {err}");
        }
        // Permissions mean nothing to root.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            let locked = root.join("locked");
            std::fs::create_dir(&locked).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
            let err = check(&config_with_region(&locked.join("a.region"))).unwrap_err();
            assert!(err.problem.contains("not writable"), "{err}");
            std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn no_region_field_means_the_default_and_the_message_says_so() {
        let config =
            parse_limit_file(Path::new("/l.json"), r#"{"version": 1, "devices": []}"#).unwrap();
        let (origin, field) = config.region_source();
        assert_eq!(origin, "/l.json");
        assert!(field.contains("default /tmp/gpuslice.region"), "{field}");
    }
}
