//! What the agent reads about other processes in `/proc` to tell which slice a process is
//! of, from the kernel's word rather than from the region (whose words the slice's tenants
//! can write): the files a process maps (`maps`, needs ptrace read access to it: root's over
//! its own processes, `CAP_SYS_PTRACE` over others') and the mounts of its mount namespace
//! (`mountinfo`, readable by anyone). Each parser is a function of the text, so tests feed
//! their own.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What `/proc/PID/<file>` said: its text, or that the agent may not read it (the process
/// exists but belongs to another user and the agent lacks the capability), or that there is
/// no such process (any more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Text(String),
    Denied,
    Gone,
}

/// Reads `/proc/<pid>/<file>`.
pub fn read(pid: u32, file: &str) -> Read {
    match std::fs::read_to_string(format!("/proc/{pid}/{file}")) {
        Ok(text) => Read::Text(text),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Read::Denied,
        Err(_) => Read::Gone,
    }
}

/// Whether `maps` (a `/proc/PID/maps` text) maps the file with this device and inode (the
/// kernel prints the device as major:minor in hex, the inode in decimal).
pub fn maps_file(maps: &str, dev: u64, ino: u64) -> bool {
    let device = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    let inode = ino.to_string();
    maps.lines().any(|line| {
        let mut fields = line.split_ascii_whitespace().skip(3);
        fields.next() == Some(device.as_str()) && fields.next() == Some(inode.as_str())
    })
}

/// One mount of a mount namespace: its filesystem's device (major:minor, decimal) and its
/// root (the path within that filesystem it shows).
pub type Mount = (String, String);

/// A directory as a bind mount of it shows in another mount namespace's `mountinfo`: its
/// filesystem's device (major:minor, decimal) and its path from `/regions/` on (the mount's
/// root is the directory's path within its filesystem, which ends so whichever filesystem
/// the state directory is on). `None` for a directory outside a `regions` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountKey {
    pub device: String,
    pub suffix: String,
}

impl MountKey {
    pub fn of(dir: &Path) -> Option<MountKey> {
        let text = dir.to_str()?;
        let start = text.rfind("/regions/")?;
        let dev = std::fs::metadata(dir).ok()?.dev();
        Some(MountKey {
            device: format!("{}:{}", libc::major(dev), libc::minor(dev)),
            suffix: text[start..].trim_end_matches('/').to_string(),
        })
    }

    /// Whether one of `mounts` (from [`mounts`]) is a mount of this directory.
    pub fn mounted_in(&self, mounts: &[Mount]) -> bool {
        mounts
            .iter()
            .any(|(device, root)| *device == self.device && root.ends_with(&self.suffix))
    }
}

/// (device, root) of every mount of a `/proc/PID/mountinfo` text (fields 3 and 4, the root
/// with the kernel's octal escapes undone).
pub fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace().skip(2);
            let device = fields.next()?;
            let root = fields.next()?;
            Some((device.to_string(), unescape(root)))
        })
        .collect()
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A process's start time from `/proc/<pid>/stat` (clock ticks since boot).
pub fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    gpuslice_common::region::parse_stat(&text).map(|s| s.start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_host_sees_a_mapped_file() {
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        let Read::Text(maps) = read(std::process::id(), "maps") else {
            panic!("own maps unreadable");
        };
        assert!(
            maps_file(&maps, exe.dev(), exe.ino()),
            "this binary is mapped"
        );
        assert!(!maps_file(&maps, exe.dev(), u64::MAX));
        assert_eq!(read(u32::MAX, "maps"), Read::Gone);
    }

    #[test]
    fn a_bind_mount_of_a_region_directory_is_found_by_device_and_path() {
        let text = "36 35 254:0 / / rw - ext4 /dev/vda rw\n\
                    41 36 254:0 /var/lib/gpuslice/regions/gpuslice.dev/slice/a /var/run/gpuslice rw - ext4 /dev/vda rw\n\
                    42 36 0:52 /with\\040space /x rw - tmpfs tmpfs rw\n";
        let found = mounts(text);
        assert_eq!(found[2], ("0:52".into(), "/with space".into()));
        let key = |device: &str, suffix: &str| MountKey {
            device: device.into(),
            suffix: suffix.into(),
        };
        assert!(key("254:0", "/regions/gpuslice.dev/slice/a").mounted_in(&found));
        assert!(!key("254:0", "/regions/gpuslice.dev/slice/b").mounted_in(&found));
        assert!(
            !key("8:1", "/regions/gpuslice.dev/slice/a").mounted_in(&found),
            "another filesystem's directory of that name"
        );
        assert_eq!(MountKey::of(Path::new("/tmp")), None, "not a regions tree");
    }
}
