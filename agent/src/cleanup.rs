//! Clean-up (`--clean-up`): removes the region directory `gpuslice cdi` created under the
//! state directory for a slice that is gone, and nothing of a slice that may still live.
//!
//! A directory `<state-dir>/regions/<vendor>/<class>/NAME/` is removed only when ALL hold, on
//! every watch pass for `--clean-up-after` (default 60 s) in a row:
//! * the agent is given limit-file directories (`--slices-dir`) and none has `NAME.json`;
//! * its region, if any, is a readable region in which no process is alive or of unknown
//!   state (a corrupt or unreadable one is kept: nothing can be judged from it);
//! * no process on the node maps the region file (its device and inode in `/proc/*/maps`);
//! * no mount namespace has the directory mounted (its path in `/proc/*/mountinfo`), i.e. no
//!   container that was given the slice still exists, with or without a GPU process.
//!
//! Only regular files directly in the directory are removed, then the directory; anything
//! else in it (a subdirectory, a link) keeps it, with a log line.

use crate::collect::{NodeView, SliceState};
use gpuslice_common::region::Liveness;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the clean-up remembers: since when each candidate directory has been removable.
#[derive(Default)]
pub struct Cleanup {
    removable_since: HashMap<PathBuf, Instant>,
}

/// The node's processes as the clean-up needs them (a seam for tests).
pub trait Host {
    /// Whether any process maps the file with this (device, inode).
    fn maps_file(&self, dev: u64, ino: u64) -> bool;
    /// Whether any mount namespace has a mount whose source path ends with `dir_suffix`.
    fn mounts_dir(&self, dir_suffix: &str) -> bool;
}

/// The real node, through `/proc`.
pub struct Proc;

impl Host for Proc {
    fn maps_file(&self, dev: u64, ino: u64) -> bool {
        for_each_proc_file("maps", |text| crate::host::maps_file(text, dev, ino))
    }

    fn mounts_dir(&self, dir_suffix: &str) -> bool {
        // A bind mount of the region directory shows its path (within its filesystem) as the
        // mount's root.
        for_each_proc_file("mountinfo", |text| {
            crate::host::mounts(text)
                .iter()
                .any(|(_, root)| root.ends_with(dir_suffix))
        })
    }
}

/// True when `found` says so for any process's `/proc/PID/<name>`.
fn for_each_proc_file(name: &str, mut found: impl FnMut(&str) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // Cannot look: say "in use", so nothing is removed.
        return true;
    };
    for entry in entries.filter_map(Result::ok) {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/{name}")) {
            if found(&text) {
                return true;
            }
        }
    }
    false
}

impl Cleanup {
    /// One pass: returns the directories removed and log lines.
    pub fn pass(
        &mut self,
        view: &NodeView,
        have_limit_dirs: bool,
        after: Duration,
        now: Instant,
        host: &dyn Host,
    ) -> Vec<String> {
        let mut log = Vec::new();
        let mut candidates = Vec::new();
        if have_limit_dirs {
            for slice in &view.slices {
                if let Some(dir) = &slice.found.orphan_dir {
                    if removable(slice, dir, host) {
                        candidates.push(dir.clone());
                    }
                }
            }
        }
        self.removable_since.retain(|d, _| candidates.contains(d));
        for dir in candidates {
            let since = *self.removable_since.entry(dir.clone()).or_insert(now);
            if now.duration_since(since) < after {
                continue;
            }
            self.removable_since.remove(&dir);
            log.push(match remove(&dir) {
                Ok(()) => format!(
                    "clean-up: removed {} (no limit file, no process, not mounted)",
                    dir.display()
                ),
                Err(e) => format!("clean-up: kept {}: {e}", dir.display()),
            });
        }
        log
    }
}

fn removable(slice: &SliceState, dir: &Path, host: &dyn Host) -> bool {
    if !slice.found.problems.is_empty() {
        return false;
    }
    if let Some(region) = &slice.found.region {
        let Some(snapshot) = &slice.snapshot else {
            return false;
        };
        if snapshot
            .processes
            .iter()
            .any(|p| p.liveness != Liveness::Stale)
        {
            return false;
        }
        match std::fs::symlink_metadata(region) {
            Ok(meta) if host.maps_file(meta.dev(), meta.ino()) => return false,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    // The directory's path from "/regions/" on: how it appears as a bind mount's root,
    // whichever filesystem the state directory is on.
    let text = dir.to_string_lossy();
    let Some(start) = text.rfind("/regions/") else {
        return false;
    };
    !host.mounts_dir(&text[start..])
}

fn remove(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            return Err(std::io::Error::other(format!(
                "{} is not a regular file; remove it by hand",
                entry.path().display()
            )));
        }
    }
    for entry in std::fs::read_dir(dir)? {
        std::fs::remove_file(entry?.path())?;
    }
    std::fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::FoundSlice;
    use gpuslice_common::region::{ProcessSnapshot, RegionSnapshot, SlotId, MAX_DEVICES};

    struct Fake {
        mapped: bool,
        mounted: bool,
    }

    impl Host for Fake {
        fn maps_file(&self, _: u64, _: u64) -> bool {
            self.mapped
        }
        fn mounts_dir(&self, suffix: &str) -> bool {
            assert!(suffix.starts_with("/regions/v/c/"), "{suffix}");
            self.mounted
        }
    }

    fn setup(label: &str, liveness: Option<Liveness>) -> (PathBuf, NodeView) {
        let root = std::env::temp_dir().join(format!(
            "gpuslice-agent-cleanup-{label}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("regions/v/c/old");
        std::fs::create_dir_all(&dir).unwrap();
        let region = dir.join("old.region");
        std::fs::write(&region, b"x").unwrap();
        let processes = liveness
            .into_iter()
            .map(|liveness| ProcessSnapshot {
                slot: SlotId::from_index(0).unwrap(),
                pid: 5,
                host_pid: 5,
                start_time: 0,
                pid_ns: 0,
                used_bytes: [0; MAX_DEVICES],
                contexts: [0; MAX_DEVICES],
                liveness,
            })
            .collect();
        let slice = SliceState {
            counters: None,
            found: FoundSlice {
                region: Some(region),
                orphan_dir: Some(dir.clone()),
                ..FoundSlice::named("old")
            },
            snapshot: Some(RegionSnapshot {
                generation: 1,
                devices: Vec::new(),
                processes,
            }),
            region_id: None,
        };
        let view = crate::collect::fixtures::view(vec![slice], Err("none".into()));
        (root, view)
    }

    #[test]
    fn a_gone_slice_is_removed_after_the_wait_and_only_then() {
        let (root, view) = setup("gone", Some(Liveness::Stale));
        let dir = root.join("regions/v/c/old");
        let host = Fake {
            mapped: false,
            mounted: false,
        };
        let mut cleanup = Cleanup::default();
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        assert!(cleanup.pass(&view, true, after, t0, &host).is_empty());
        assert!(dir.exists());
        let log = cleanup.pass(&view, true, after, t0 + after, &host);
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(!dir.exists(), "{log:?}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn anything_that_may_live_keeps_the_directory() {
        let after = Duration::ZERO;
        let cases: [(&str, Option<Liveness>, bool, bool, bool); 5] = [
            ("alive", Some(Liveness::Alive), false, false, true),
            ("unknown", Some(Liveness::Unknown), false, false, true),
            ("mapped", None, true, false, true),
            ("mounted", None, false, true, true),
            ("no-slices-dir", None, false, false, false),
        ];
        for (label, liveness, mapped, mounted, have_limit_dirs) in cases {
            let (root, view) = setup(label, liveness);
            let host = Fake { mapped, mounted };
            let mut cleanup = Cleanup::default();
            let now = Instant::now();
            cleanup.pass(&view, have_limit_dirs, after, now, &host);
            cleanup.pass(&view, have_limit_dirs, after, now, &host);
            assert!(root.join("regions/v/c/old/old.region").exists(), "{label}");
            std::fs::remove_dir_all(&root).unwrap();
        }
    }

    #[test]
    fn a_directory_holding_more_than_files_is_kept() {
        let (root, view) = setup("subdir", None);
        std::fs::create_dir(root.join("regions/v/c/old/keep")).unwrap();
        let host = Fake {
            mapped: false,
            mounted: false,
        };
        let log = Cleanup::default().pass(&view, true, Duration::ZERO, Instant::now(), &host);
        assert!(log[0].contains("kept"), "{log:?}");
        assert!(root.join("regions/v/c/old/old.region").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
