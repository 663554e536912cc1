//! The node's prepare lock: every gpuslice-dra process sharing a state directory (the old and
//! the new pod of a rolling update with surge, a second copy started by hand) takes it around
//! the guard's check-and-write, so two processes never promise one card twice.
//!
//! It is an exclusive `flock(2)` on the state directory itself, through a description opened
//! for each acquisition and closed on release. The kernel drops the lock when the holder
//! closes the description or dies (SIGKILL included), so a crashed process never blocks the
//! survivor; the pods of a DaemonSet share it because they mount the same host directory (one
//! inode). No lock file: nothing's existence means anything, and there is no file that a hand
//! could delete or replace while the lock is held, letting a second holder in. A state
//! directory moved away and made again under its name is noticed after locking (the name no
//! longer leads to the locked directory) and the lock is taken again on the new one.
//!
//! Waiting is bounded ([`WAIT`]): a holder that is stopped (SIGSTOP, a frozen cgroup) makes
//! the other process's prepares fail with an error naming the lock, which the kubelet retries,
//! rather than hang past the kubelet's own timeout for the call (45 s).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long an acquisition waits for another holder before it gives up.
pub const WAIT: Duration = Duration::from_secs(10);

/// The lock, held until dropped.
#[derive(Debug)]
pub struct NodeLock {
    // Closing the description releases the lock.
    _file: File,
}

impl NodeLock {
    /// Takes the lock of `state_dir` (creating the directory if need be), waiting at most
    /// `wait` for another holder.
    pub fn acquire(state_dir: &Path, wait: Duration) -> Result<NodeLock, String> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(state_dir)
            .map_err(|e| format!("cannot create {}: {e}", state_dir.display()))?;
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let file =
                open(state_dir).map_err(|e| format!("cannot open {}: {e}", state_dir.display()))?;
            if try_lock(&file).map_err(|e| format!("cannot lock {}: {e}", state_dir.display()))? {
                if leads_to(state_dir, &file) {
                    return Ok(NodeLock { _file: file });
                }
                // Replaced while we opened it: lock what the name leads to now.
                continue;
            }
            if Instant::now() >= deadline {
                return Err(busy(state_dir, wait));
            }
            // The holder's section is a few file writes: poll briefly, backing off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

fn busy(path: &Path, wait: Duration) -> String {
    format!(
        "another gpuslice-dra process on this node has held the prepare lock (flock on {}) for \
         over {} s (a stopped process?); not preparing now, the kubelet retries",
        path.display(),
        wait.as_secs()
    )
}

/// The directory, read-only (flock needs no write access).
fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(path)
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another description holds it.
fn try_lock(file: &File) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) on a descriptor `file` keeps open for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Whether `path` still names the open `file` (not moved or replaced since it was opened).
fn leads_to(path: &Path, file: &File) -> bool {
    match (fs::metadata(path), file.metadata()) {
        (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
        _ => false,
    }
}
