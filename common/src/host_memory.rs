//! Host memory for oversubscribed slices: what the shim, the CLI and the node agent share about
//! it. A slice whose limit file gives a device a `virtual` size above its `memory` places the
//! bytes past the physical cap in the container's host memory; they are counted in the region
//! under a companion device entry ([`host_entry_key`]), and before placing more the shim asks
//! the container's memory cgroup how much it can still hold ([`CgroupMemory`]).
//!
//! ## The companion entry
//! The host bytes of device `KEY` are a region device entry of their own, keyed
//! `host:KEY`, whose memory limit is `virtual - memory`. So they get everything the region
//! gives device bytes for free: one compare-and-swap per reservation against the limit, per
//! process attribution, and a dead process's bytes returned exactly once the driver has let go
//! of it. Readers of the region fold the entry into its device ([`host_entry_device`]).
//!
//! ## The cgroup
//! The bytes placed on the host are the pod's memory: they count against the memory cgroup of
//! the process that placed them. Past what that cgroup (and every ancestor the process can
//! see) can still hold, less [`HOST_MARGIN_BYTES`] kept free for the rest of the pod, the shim
//! refuses with `CUDA_ERROR_OUT_OF_MEMORY` instead of letting the kernel's OOM killer end the
//! pod. cgroup v2 (`memory.max`, `memory.current`) and v1 (`memory.limit_in_bytes`,
//! `memory.usage_in_bytes`) are both read; the process's cgroup directory comes from
//! `/proc/self/cgroup` and `/proc/self/mountinfo`, so a container that sees its own cgroup at
//! the mount root (a cgroup namespace, or a v1 bind mount) is found too.

use std::path::{Path, PathBuf};

/// Prefix of a device's companion entry in the region.
pub const HOST_ENTRY_PREFIX: &str = "host:";

/// Bytes of a memory cgroup's limit kept free for the rest of the pod (its processes' own
/// heaps, page cache, the shim's and the runtime's bookkeeping): the host bytes an
/// oversubscribed slice places never take the cgroup closer than this to its limit.
pub const HOST_MARGIN_BYTES: u64 = 256 << 20;

/// cgroup v1 reports "no limit" as the largest page-aligned counter (9223372036854771712 on
/// x86-64); anything from here up is no limit.
const V1_UNLIMITED_FROM: u64 = 1 << 62;

/// Deepest cgroup path walked up (a path this deep is not a container's).
const MAX_LEVELS: usize = 64;

/// The region key of `device_key`'s host bytes.
pub fn host_entry_key(device_key: &str) -> String {
    format!("{HOST_ENTRY_PREFIX}{device_key}")
}

/// The device key a companion entry belongs to; `None` for a device's own entry.
pub fn host_entry_device(key: &str) -> Option<&str> {
    key.strip_prefix(HOST_ENTRY_PREFIX)
}

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// One level of the process's memory cgroup and its ancestors up to the mount root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLevel {
    pub dir: PathBuf,
    /// `None` = no limit at this level.
    pub limit: Option<u64>,
    pub usage: u64,
}

/// The process's memory cgroup as read now: every visible level that has the memory files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMemory {
    pub version: CgroupVersion,
    /// Innermost first.
    pub levels: Vec<CgroupLevel>,
}

impl CgroupMemory {
    /// The calling process's memory cgroup, from `/proc/self`; `None` when no memory
    /// controller is mounted or its files cannot be read (no cgroup to protect: the host
    /// bytes are then bounded by the slice's own budget only).
    pub fn of_this_process() -> Option<CgroupMemory> {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let (version, dir, mount) = locate(&cgroup, &mountinfo)?;
        CgroupMemory::read(version, &dir, &mount)
    }

    /// Reads the memory files of `dir` and of each ancestor up to `mount` (the hierarchy's
    /// mount point, included when it has them: a container's own cgroup often is).
    pub fn read(version: CgroupVersion, dir: &Path, mount: &Path) -> Option<CgroupMemory> {
        let (limit_file, usage_file) = match version {
            CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            CgroupVersion::V2 => ("memory.max", "memory.current"),
        };
        let mut levels = Vec::new();
        let mut at = dir.to_path_buf();
        for _ in 0..MAX_LEVELS {
            let limit = std::fs::read_to_string(at.join(limit_file));
            let usage = std::fs::read_to_string(at.join(usage_file));
            if let (Ok(limit), Ok(usage)) = (limit, usage) {
                levels.push(CgroupLevel {
                    dir: at.clone(),
                    limit: parse_limit(version, &limit)?,
                    usage: usage.trim().parse().ok()?,
                });
            }
            if at == mount || !at.starts_with(mount) || !at.pop() {
                break;
            }
        }
        (!levels.is_empty()).then_some(CgroupMemory { version, levels })
    }

    /// What the tightest limited level can still take (`limit - usage`, 0 when over);
    /// `None` when no level has a limit.
    pub fn room(&self) -> Option<u64> {
        self.levels
            .iter()
            .filter_map(|level| level.limit.map(|limit| limit.saturating_sub(level.usage)))
            .min()
    }

    /// The level whose room is [`Self::room`] (for messages).
    pub fn tightest(&self) -> Option<&CgroupLevel> {
        self.levels
            .iter()
            .filter(|level| level.limit.is_some())
            .min_by_key(|level| level.limit.unwrap_or(u64::MAX).saturating_sub(level.usage))
    }

    /// How many more bytes may be placed on the host: [`Self::room`] less
    /// [`HOST_MARGIN_BYTES`]; `None` when nothing limits the cgroup.
    pub fn placeable(&self) -> Option<u64> {
        self.room()
            .map(|room| room.saturating_sub(HOST_MARGIN_BYTES))
    }
}

fn parse_limit(version: CgroupVersion, text: &str) -> Option<Option<u64>> {
    let text = text.trim();
    match version {
        CgroupVersion::V2 if text == "max" => Some(None),
        CgroupVersion::V2 => text.parse().ok().map(Some),
        CgroupVersion::V1 => {
            let bytes: u64 = text.parse().ok()?;
            Some((bytes < V1_UNLIMITED_FROM).then_some(bytes))
        }
    }
}

/// The memory cgroup of a process from its `/proc/PID/cgroup` and `/proc/PID/mountinfo`:
/// (version, its directory, the hierarchy's mount point). A v1 memory hierarchy wins over v2
/// (a controller is in one hierarchy only; on a hybrid host the v2 mount has no memory).
pub fn locate(cgroup: &str, mountinfo: &str) -> Option<(CgroupVersion, PathBuf, PathBuf)> {
    let v1_path = cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    });
    let v2_path = cgroup.lines().find_map(|line| line.strip_prefix("0::"));
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let after: Vec<&str> = after.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype)) =
            (fields.get(3), fields.get(4), after.first())
        else {
            continue;
        };
        let super_options = after.get(2).copied().unwrap_or("");
        let (version, path) = match (*fstype, v1_path, v2_path) {
            ("cgroup", Some(path), _) if super_options.split(',').any(|o| o == "memory") => {
                (CgroupVersion::V1, path)
            }
            ("cgroup2", _, Some(path)) if v1_path.is_none() => (CgroupVersion::V2, path),
            _ => continue,
        };
        let mount = PathBuf::from(unescape(mount_point));
        // The mount shows the hierarchy from `root` down: the process's path below it.
        let relative = path
            .strip_prefix(root.trim_end_matches('/'))
            .unwrap_or(if *root == "/" { path } else { "" });
        let dir = mount.join(relative.trim_start_matches('/'));
        return Some((version, dir, mount));
    }
    None
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        if let Some(digits) = octal {
            let code = digits.iter().fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
            out.push(code as u8);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn companion_keys_name_their_device() {
        let key = host_entry_key("GPU-8a5d1c2e-0000-1111-2222-333344445555");
        assert_eq!(key, "host:GPU-8a5d1c2e-0000-1111-2222-333344445555");
        assert_eq!(
            host_entry_device(&key),
            Some("GPU-8a5d1c2e-0000-1111-2222-333344445555")
        );
        assert_eq!(host_entry_device("GPU-8a5d"), None);
    }

    #[test]
    fn finds_a_v1_memory_cgroup_below_its_mount() {
        let cgroup = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
35 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            locate(cgroup, mountinfo),
            Some((
                CgroupVersion::V1,
                PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"),
                PathBuf::from("/sys/fs/cgroup/memory")
            ))
        );
    }

    #[test]
    fn a_container_sees_its_own_cgroup_at_the_mount_root() {
        // v1 without a cgroup namespace: /proc/self/cgroup names the host's path, and the
        // mount shows that very cgroup at its root.
        let cgroup = "5:memory:/kubepods/pod1/ctr\n";
        let mountinfo =
            "50 40 0:31 /kubepods/pod1/ctr /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        let (version, dir, mount) = locate(cgroup, mountinfo).unwrap();
        assert_eq!(version, CgroupVersion::V1);
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(mount, PathBuf::from("/sys/fs/cgroup/memory"));
        // v2 with a cgroup namespace: "0::/".
        let cgroup = "0::/\n";
        let mountinfo = "60 40 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let (version, dir, _) = locate(cgroup, mountinfo).unwrap();
        assert_eq!(
            (version, dir),
            (CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup"))
        );
        // No memory controller anywhere.
        assert_eq!(
            locate("1:cpu:/\n", "30 25 0:26 / /x rw - tmpfs tmpfs rw\n"),
            None
        );
    }

    #[test]
    fn room_is_the_tightest_level_less_the_margin() {
        let dir = std::env::temp_dir().join(format!("gpuslice-cg-{}", std::process::id()));
        let inner = dir.join("pod/ctr");
        std::fs::create_dir_all(&inner).unwrap();
        let write = |at: &Path, max: &str, current: u64| {
            std::fs::write(at.join("memory.max"), format!("{max}\n")).unwrap();
            std::fs::write(at.join("memory.current"), format!("{current}\n")).unwrap();
        };
        write(&dir, "max", 10_000 * MIB);
        write(&dir.join("pod"), &(1024 * MIB).to_string(), 900 * MIB);
        write(&inner, &(2048 * MIB).to_string(), 100 * MIB);
        let memory = CgroupMemory::read(CgroupVersion::V2, &inner, &dir).unwrap();
        assert_eq!(memory.levels.len(), 3);
        assert_eq!(memory.room(), Some(124 * MIB), "the pod level is tightest");
        assert_eq!(memory.tightest().unwrap().dir, dir.join("pod"));
        assert_eq!(memory.placeable(), Some(0), "less than the margin is left");
        write(&dir.join("pod"), "max", 900 * MIB);
        let memory = CgroupMemory::read(CgroupVersion::V2, &inner, &dir).unwrap();
        assert_eq!(memory.placeable(), Some(1948 * MIB - HOST_MARGIN_BYTES));
        // v1's "unlimited" is a huge number.
        std::fs::write(inner.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(inner.join("memory.usage_in_bytes"), "4096\n").unwrap();
        let memory = CgroupMemory::read(CgroupVersion::V1, &inner, &inner).unwrap();
        assert_eq!((memory.room(), memory.placeable()), (None, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mount_points_with_spaces_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/trailing\\"), "/trailing\\");
    }
}
