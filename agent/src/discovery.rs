//! Discovery: which slices exist on this node, from the files `gpuslice cdi` (and later the
//! Kubernetes driver) leaves. Run afresh on every scrape and backstop pass, so slices that
//! appear or go away are seen without a restart.
//!
//! Two sources, merged by slice name:
//! * limit-file directories (`--slices-dir`, the same directories `gpuslice cdi
//!   --slices-dir` reads): every `DIR/NAME.json` is slice NAME;
//! * the state directory's region directories, `<state-dir>/regions/<vendor>/<class>/NAME/`,
//!   which `gpuslice cdi` creates and mounts into the slice's containers: the region file in
//!   it is the slice's ledger.
//!
//! A limit file names its region by the path INSIDE the container; on the host the file lies
//! in the slice's region directory under the same base name. Where no such directory exists
//! the path is taken as a host path (a slice run on the host, `gpuslice run`).

use gpuslice_common::config::{parse_limit_file, SliceConfig};
use std::fs;
use std::path::{Path, PathBuf};

/// A limit file larger than this is not read (the schema's files are a few hundred bytes).
const MAX_LIMIT_FILE: u64 = 1 << 20;

/// Where to look.
#[derive(Debug, Clone)]
pub struct Sources {
    pub slices_dirs: Vec<PathBuf>,
    pub state_dir: PathBuf,
}

/// One slice as found on disk.
#[derive(Debug, Clone, Default)]
pub struct FoundSlice {
    pub name: String,
    pub limit_file: Option<PathBuf>,
    /// The parsed limit file (when there is one and it is valid).
    pub config: Option<SliceConfig>,
    /// The region file on the host, where one was found or is expected.
    pub region: Option<PathBuf>,
    /// What is wrong with this slice's files (each one line; the slice is still reported).
    pub problems: Vec<String>,
    /// For a slice found only from its region directory under the state directory (no limit
    /// file names it): that directory, the clean-up's candidate.
    pub orphan_dir: Option<PathBuf>,
}

impl FoundSlice {
    /// A slice known by its name only: no files found yet, nothing wrong with them.
    pub fn named(name: &str) -> FoundSlice {
        FoundSlice {
            name: name.to_string(),
            ..FoundSlice::default()
        }
    }
}

/// Lists every slice the sources name, sorted by name. Never fails: an unreadable directory
/// or file becomes a problem of the slice (or is logged through `warn` when it names none).
pub fn discover(sources: &Sources, warn: &mut dyn FnMut(String)) -> Vec<FoundSlice> {
    let mut slices: Vec<FoundSlice> = Vec::new();
    let region_dirs = region_dirs(&sources.state_dir, warn);
    for dir in &sources.slices_dirs {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                warn(format!("slices directory {}: {e}", dir.display()));
                continue;
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for file in files {
            let Some(name) = file.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if name.starts_with('.') || slices.iter().any(|s| s.name == name) {
                continue;
            }
            slices.push(from_limit_file(name, &file, &region_dirs));
        }
    }
    // Slices whose region directory exists but whose limit file is not (or no longer) in a
    // slices directory: still reported, from the region alone.
    for (name, dir) in &region_dirs {
        if slices.iter().any(|s| &s.name == name) {
            continue;
        }
        let mut problems = Vec::new();
        let region = match region_file_in(dir) {
            Ok(found) => found,
            Err(e) => {
                problems.push(format!("region directory {}: {e}", dir.display()));
                None
            }
        };
        slices.push(FoundSlice {
            region,
            problems,
            orphan_dir: Some(dir.clone()),
            ..FoundSlice::named(name)
        });
    }
    slices.sort_by(|a, b| a.name.cmp(&b.name));
    slices
}

fn from_limit_file(name: &str, file: &Path, region_dirs: &[(String, PathBuf)]) -> FoundSlice {
    let mut found = FoundSlice {
        limit_file: Some(file.to_path_buf()),
        ..FoundSlice::named(name)
    };
    let text = match read_bounded(file) {
        Ok(text) => text,
        Err(e) => {
            found
                .problems
                .push(format!("limit file {}: {e}", file.display()));
            return found;
        }
    };
    match parse_limit_file(file, &text) {
        Ok(config) => {
            let own_dir = region_dirs.iter().find(|(n, _)| n == name).map(|(_, d)| d);
            found.region = match (&config.region_path, own_dir) {
                (Some(region), Some(dir)) => region.file_name().map(|base| dir.join(base)),
                (Some(region), None) => Some(region.clone()),
                (None, Some(dir)) => region_file_in(dir).ok().flatten(),
                (None, None) => None,
            };
            if found.region.is_none() {
                found.problems.push(format!(
                    "limit file {} names no region the agent can find (give it a \"region\")",
                    file.display()
                ));
            }
            found.config = Some(config);
        }
        Err(e) => found.problems.push(e.to_string()),
    }
    found
}

fn read_bounded(file: &Path) -> std::io::Result<String> {
    let meta = fs::metadata(file)?;
    if meta.len() > MAX_LIMIT_FILE {
        return Err(std::io::Error::other(format!(
            "{} bytes, more than a limit file can be ({MAX_LIMIT_FILE})",
            meta.len()
        )));
    }
    fs::read_to_string(file)
}

/// `(slice name, directory)` for every `<state>/regions/<vendor>/<class>/<name>/`.
fn region_dirs(state_dir: &Path, warn: &mut dyn FnMut(String)) -> Vec<(String, PathBuf)> {
    let root = state_dir.join("regions");
    let mut out = Vec::new();
    let vendors = match fs::read_dir(&root) {
        Ok(v) => v,
        // No slice was ever prepared with a default region directory: nothing to report.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            warn(format!("state directory {}: {e}", root.display()));
            return out;
        }
    };
    for vendor in vendors.filter_map(Result::ok).map(|e| e.path()) {
        let Ok(classes) = fs::read_dir(&vendor) else {
            continue;
        };
        for class in classes.filter_map(Result::ok).map(|e| e.path()) {
            let Ok(slices) = fs::read_dir(&class) else {
                continue;
            };
            for slice in slices.filter_map(Result::ok) {
                let path = slice.path();
                if !path.is_dir() {
                    continue;
                }
                if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                    if !out.iter().any(|(n, _)| n == name) {
                        out.push((name.to_string(), path.clone()));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// The region file in a slice's region directory: its one regular, non-hidden file (the
/// region module's temporary files start with a dot). `None` while no process has run.
fn region_file_in(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'))
        })
        .collect();
    files.sort();
    Ok(files.into_iter().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(label: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-agent-{label}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn limit_files_and_region_directories_merge_by_name() {
        let root = tmp("merge");
        let slices = root.join("slices");
        let state = root.join("state");
        fs::create_dir_all(&slices).unwrap();
        let a_dir = state.join("regions/gpuslice.dev/slice/a");
        let orphan_dir = state.join("regions/gpuslice.dev/slice/orphan");
        fs::create_dir_all(&a_dir).unwrap();
        fs::create_dir_all(&orphan_dir).unwrap();
        fs::write(orphan_dir.join("o.region"), b"").unwrap();
        fs::write(orphan_dir.join(".o.region.tmp"), b"").unwrap();
        fs::write(
            slices.join("a.json"),
            r#"{"version": 1, "region": "/var/run/gpuslice/a.region", "devices": [{"index": 0, "memory": "1GiB"}]}"#,
        )
        .unwrap();
        fs::write(
            slices.join("host.json"),
            r#"{"version": 1, "region": "/srv/h.region", "devices": [{"index": 0, "memory": "1GiB"}]}"#,
        )
        .unwrap();
        fs::write(slices.join("bad.json"), b"{not json").unwrap();
        fs::write(slices.join("notes.txt"), b"ignored").unwrap();
        let sources = Sources {
            slices_dirs: vec![slices.clone(), root.join("missing")],
            state_dir: state,
        };
        let mut warnings = Vec::new();
        let found = discover(&sources, &mut |w| warnings.push(w));
        let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "bad", "host", "orphan"]);
        // The container path's base name, in the slice's own region directory.
        assert_eq!(found[0].region.as_deref(), Some(&*a_dir.join("a.region")));
        assert!(found[0].problems.is_empty(), "{:?}", found[0].problems);
        assert!(found[1].config.is_none());
        assert_eq!(found[1].problems.len(), 1, "{:?}", found[1].problems);
        assert_eq!(found[2].region.as_deref(), Some(Path::new("/srv/h.region")));
        assert_eq!(
            found[3].region.as_deref(),
            Some(&*orphan_dir.join("o.region"))
        );
        assert!(found[3].limit_file.is_none());
        assert_eq!(found[3].orphan_dir.as_deref(), Some(&*orphan_dir));
        assert!(found[0].orphan_dir.is_none());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("missing"), "{warnings:?}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_oversized_limit_file_is_a_problem_not_a_read() {
        let root = tmp("big");
        fs::write(
            root.join("big.json"),
            vec![b' '; (MAX_LIMIT_FILE + 1) as usize],
        )
        .unwrap();
        let sources = Sources {
            slices_dirs: vec![root.clone()],
            state_dir: root.join("state"),
        };
        let found = discover(&sources, &mut |_| {});
        assert_eq!(found.len(), 1);
        assert!(found[0].problems[0].contains("more than"), "{:?}", found[0]);
        fs::remove_dir_all(&root).unwrap();
    }
}
