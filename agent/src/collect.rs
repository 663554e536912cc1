//! One look at the node: every discovered slice's ledger (its region, read-only), the
//! driver's cards, and which slice each process the driver reports belongs to.
//!
//! Membership: a process registered in a slice's region (by its host PID) belongs to that
//! slice; so does every other process in the same cgroup (container) as a registered one, so
//! a process that never loaded the shim is still counted against its slice. A cgroup is not
//! used when registered processes of two slices share it, nor when it is the agent's own or
//! the root (processes run from one shell on a host share those; there the cgroup says
//! nothing about the slice).

use crate::discovery::{discover, FoundSlice, Sources};
use crate::driver::{Card, Driver};
use gpuslice_common::region::{
    Liveness, ProcessSnapshot, Region, RegionSnapshot, SliceCounters, MAX_DEVICES,
};
use std::collections::HashMap;

/// A slice and what its region holds.
#[derive(Debug, Clone)]
pub struct SliceState {
    pub found: FoundSlice,
    /// `None` when the region does not exist yet or cannot be read (then a problem says why,
    /// unless no process of the slice ever ran).
    pub snapshot: Option<RegionSnapshot>,
    /// The counters the slice's processes keep in the region (refusals, launch wait,
    /// fail-closed processes); `None` with the snapshot.
    pub counters: Option<SliceCounters>,
}

impl SliceState {
    /// The processes registered in the region and not known to have exited.
    pub fn registered(&self) -> impl Iterator<Item = &ProcessSnapshot> + '_ {
        self.snapshot
            .iter()
            .flat_map(|s| s.processes.iter())
            .filter(|p| p.liveness != Liveness::Stale)
    }
}

/// The host PID of a registered process, when the agent can tell it is that very process:
/// the slot's host PID (or its PID, when it registered in the agent's own PID namespace),
/// provided `/proc/PID` there has the start time the slot recorded. Anything else (a PID of
/// another namespace with no host PID, a PID reused since, no `/proc` view of the host) is
/// no one: counting a stranger against the slice, or killing it, must not happen.
pub fn verified_host_pid(p: &ProcessSnapshot, own_pid_ns: u64) -> Option<u32> {
    let pid = if p.host_pid != 0 {
        p.host_pid
    } else if p.pid_ns != 0 && p.pid_ns == own_pid_ns {
        p.pid
    } else {
        return None;
    };
    (crate::backstop::proc_start_time(pid) == Some(p.start_time)).then_some(pid)
}

fn own_pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The node at one instant.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub slices: Vec<SliceState>,
    pub cards: Result<Vec<Card>, String>,
    /// Host PID -> index into `slices`.
    pub owner: HashMap<u32, usize>,
    /// Registered processes, not known to have exited, whose host PID the agent could not
    /// verify (see [`verified_host_pid`]): while there are any, "belongs to no slice" is not
    /// a safe judgment (an agent without the host's PID view sees every process so).
    pub unverified: usize,
    /// Host PID -> (slice, bytes per device entry) of every verified registered process: what
    /// the slice's ledger accounts for it.
    pub ledger: HashMap<u32, (usize, [u64; MAX_DEVICES])>,
    /// Processes of a slice whose region is broken (unlinked, renamed or replaced while they
    /// map it): (slice, host PID, the file they map). Members of that slice (never "of no
    /// slice"), whose ledger cannot be read.
    pub broken: Vec<(usize, u32, String)>,
}

/// What the unit tests of the agent's judgements build their node views from, in one place
/// (a new field of [`NodeView`] or the region's snapshots is added here, not in every test).
#[cfg(test)]
pub mod fixtures {
    use super::*;
    use gpuslice_common::region::{DeviceId, DeviceSnapshot};

    /// A region with one device entry, `uuid` limited to `limit`, holding `processes`.
    pub fn one_device_region(
        uuid: &str,
        limit: u64,
        processes: Vec<ProcessSnapshot>,
    ) -> RegionSnapshot {
        RegionSnapshot {
            generation: 1,
            devices: vec![DeviceSnapshot {
                id: DeviceId::from_index(0).unwrap(),
                uuid: uuid.into(),
                memory_limit: Some(limit),
                compute_percent: None,
                used_bytes: 0,
                measured_utilization: None,
                context_cost: None,
            }],
            processes,
        }
    }

    /// A node view of `slices` and `cards` in which no process is yet known to be a slice's.
    pub fn view(slices: Vec<SliceState>, cards: Result<Vec<Card>, String>) -> NodeView {
        NodeView {
            slices,
            cards,
            owner: HashMap::new(),
            unverified: 0,
            ledger: HashMap::new(),
            broken: Vec::new(),
        }
    }
}

impl NodeView {
    /// Bytes the driver reports for `slice`'s processes on `card`, and how many there are.
    pub fn driver_usage(&self, slice: usize, card: &Card) -> (u64, usize) {
        card.processes
            .iter()
            .filter(|(pid, _)| self.owner.get(pid) == Some(&slice))
            .fold((0, 0), |(bytes, n), (_, b)| (bytes + b.unwrap_or(0), n + 1))
    }

    /// What the ledger accounts for `pid` on `card`: `None` for a process of no slice's
    /// region (a bypasser in a slice's container, a stranger).
    pub fn ledger_bytes(&self, pid: u32, card: &Card) -> Option<u64> {
        let (slice, bytes) = self.ledger.get(&pid)?;
        let snapshot = self.slices.get(*slice)?.snapshot.as_ref()?;
        let entry = snapshot.devices.iter().find(|d| d.uuid == card.uuid)?;
        Some(bytes[entry.id.index()])
    }

    /// The slice's processes on `card` whose driver bytes exceed what its ledger accounts for
    /// them (all of it for an unregistered one): (PID, driver bytes, ledger bytes). Processes
    /// of a broken region are left out (their ledger is unreadable, not bypassed).
    pub fn unaccounted(&self, slice: usize, card: &Card) -> Vec<(u32, u64, Option<u64>)> {
        card.processes
            .iter()
            .filter(|(pid, _)| self.owner.get(pid) == Some(&slice))
            .filter(|(pid, _)| !self.broken.iter().any(|(_, b, _)| b == pid))
            .map(|&(pid, bytes)| (pid, bytes.unwrap_or(0), self.ledger_bytes(pid, card)))
            .filter(|&(_, driver, ledger)| driver > ledger.unwrap_or(0))
            .collect()
    }

    /// The card's processes that belong to no slice.
    pub fn unsliced<'a>(&'a self, card: &'a Card) -> impl Iterator<Item = (u32, Option<u64>)> + 'a {
        card.processes
            .iter()
            .copied()
            .filter(|(pid, _)| !self.owner.contains_key(pid))
    }
}

/// Discovers the slices, reads their regions and the driver, and maps processes to slices.
pub fn collect(sources: &Sources, driver: &mut Driver, warn: &mut dyn FnMut(String)) -> NodeView {
    let slices: Vec<SliceState> = discover(sources, warn)
        .into_iter()
        .map(read_region)
        .collect();
    let cards = driver.cards();
    let driver_pids: Vec<u32> = match &cards {
        Ok(cards) => cards
            .iter()
            .flat_map(|c| c.processes.iter().map(|(pid, _)| *pid))
            .collect(),
        Err(_) => Vec::new(),
    };
    let own_ns = own_pid_namespace();
    let mut slices = slices;
    let mut ledger = HashMap::new();
    for (index, slice) in slices.iter().enumerate() {
        for p in slice.registered() {
            if let Some(pid) = verified_host_pid(p, own_ns) {
                ledger.entry(pid).or_insert((index, p.used_bytes));
            }
        }
    }
    // Processes that map a slice's region file which is no longer at its path (or no longer
    // the file there): the slice's, whatever the region says now.
    let strangers: Vec<u32> = driver_pids
        .iter()
        .copied()
        .filter(|pid| !ledger.contains_key(pid))
        .collect();
    let broken = broken_region_members(&slices, &strangers, &|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()
    });
    for (index, pid, mapped) in &broken {
        let slice = &mut slices[*index];
        let region = slice
            .found
            .region
            .as_ref()
            .map_or(String::new(), |r| r.display().to_string());
        slice.found.problems.push(format!(
            "region {region} is broken: process {pid} of the slice maps {mapped}; its ledger cannot be read and its processes are not judged"
        ));
    }
    let mut owner = membership(
        &slices,
        &driver_pids,
        &|p| verified_host_pid(p, own_ns),
        &cgroup_of,
        cgroup_of(std::process::id()),
    );
    for (index, pid, _) in &broken {
        owner.insert(*pid, *index);
    }
    let unverified = slices
        .iter()
        .flat_map(|s| s.registered())
        .filter(|p| verified_host_pid(p, own_ns).is_none())
        .count();
    NodeView {
        slices,
        cards,
        owner,
        unverified,
        ledger,
        broken,
    }
}

/// One shared file mapping of a `/proc/PID/maps` line: (its length, the file's path as
/// the kernel prints it). `None`: private or anonymous.
fn shared_mapping(line: &str) -> Option<(u64, &str)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    if !fields.next()?.ends_with('s') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let len = u64::from_str_radix(end, 16).ok()? - u64::from_str_radix(start, 16).ok()?;
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = &rest[rest.find(char::is_whitespace)?..];
    }
    let path = rest.trim();
    path.starts_with('/').then_some((len, path))
}

/// How long a region's mapping is (the whole file, page-rounded).
fn region_mapping_len() -> u64 {
    (gpuslice_common::region::REGION_SIZE as u64).div_ceil(4096) * 4096
}

/// Whether a process's shared mapping of `len` bytes of `mapped` (a maps path, maybe ending
/// in " (deleted)") is `region`'s file although `region` no longer leads to it: the same
/// path marked deleted (unlinked, or replaced by another file); or, a region's size, a
/// deleted file of the same directory (the kernel may print an unlinked file as `#<inode>`)
/// or, while `region` is gone, a file of its directory whose name begins with its name
/// (renamed, `region` -> `region.old`).
fn maps_broken_region(
    len: u64,
    mapped: &str,
    region: &std::path::Path,
    region_exists: bool,
) -> bool {
    let (path, deleted) = match mapped.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (mapped, false),
    };
    let path = std::path::Path::new(path);
    if path == region {
        return deleted;
    }
    let (Some(dir), Some(name)) = (region.parent(), region.file_name().and_then(|n| n.to_str()))
    else {
        return false;
    };
    if len != region_mapping_len() || path.parent() != Some(dir) {
        return false;
    }
    let renamed = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() > name.len() && n.starts_with(name));
    deleted || (renamed && !region_exists)
}

/// (slice, PID, mapped file) for every PID in `pids` that maps a slice's broken region.
pub fn broken_region_members(
    slices: &[SliceState],
    pids: &[u32],
    maps_of: &dyn Fn(u32) -> Option<String>,
) -> Vec<(usize, u32, String)> {
    let regions: Vec<(usize, &std::path::Path, bool)> = slices
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.found.region.as_deref().map(|r| (i, r, r.exists())))
        .collect();
    let mut found = Vec::new();
    if regions.is_empty() {
        return found;
    }
    for &pid in pids {
        let Some(maps) = maps_of(pid) else { continue };
        let hit = maps
            .lines()
            .filter_map(shared_mapping)
            .find_map(|(len, mapped)| {
                regions
                    .iter()
                    .find(|(_, region, exists)| maps_broken_region(len, mapped, region, *exists))
                    .map(|(i, _, _)| (*i, mapped.to_string()))
            });
        if let Some((index, mapped)) = hit {
            found.push((index, pid, mapped));
        }
    }
    found
}

fn read_region(mut found: FoundSlice) -> SliceState {
    let mut counters = None;
    let snapshot = match &found.region {
        // The region's directory is writable by the slice's containers: a FIFO or device put
        // there would block or misbehave on open, so only a regular file is opened (the
        // region module refuses a symbolic link at the name itself). A swap between this
        // check and the open is not excluded here.
        Some(path) if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) => {
            found.problems.push(format!(
                "region {}: not a regular file; not opened",
                path.display()
            ));
            None
        }
        Some(path) if path.exists() => match Region::open_existing(path) {
            Ok(view) => {
                counters = Some(view.counters());
                Some(view.snapshot())
            }
            Err(e) => {
                found.problems.push(format!("region: {e}"));
                None
            }
        },
        // No process of the slice has run yet: nothing to read, nothing wrong.
        _ => None,
    };
    SliceState {
        found,
        snapshot,
        counters,
    }
}

/// The cgroup a process is in (the unified hierarchy's path, or all lines of a v1 host).
fn cgroup_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
}

/// Maps host PIDs to slices: registered processes first, then the driver's other processes
/// by cgroup (see the module doc).
pub fn membership(
    slices: &[SliceState],
    driver_pids: &[u32],
    host_pid: &dyn Fn(&ProcessSnapshot) -> Option<u32>,
    cgroup_of: &dyn Fn(u32) -> Option<String>,
    own_cgroup: Option<String>,
) -> HashMap<u32, usize> {
    let mut owner = HashMap::new();
    for (index, slice) in slices.iter().enumerate() {
        for pid in slice.registered().filter_map(host_pid) {
            owner.entry(pid).or_insert(index);
        }
    }
    let strangers: Vec<u32> = driver_pids
        .iter()
        .copied()
        .filter(|pid| !owner.contains_key(pid))
        .collect();
    if strangers.is_empty() {
        return owner;
    }
    // cgroup -> the one slice whose registered processes are in it (None: more than one).
    let mut by_cgroup: HashMap<String, Option<usize>> = HashMap::new();
    for (&pid, &index) in &owner {
        let Some(cgroup) = cgroup_of(pid) else {
            continue;
        };
        if is_root(&cgroup) || Some(&cgroup) == own_cgroup.as_ref() {
            continue;
        }
        by_cgroup
            .entry(cgroup)
            .and_modify(|slot| {
                if *slot != Some(index) {
                    *slot = None;
                }
            })
            .or_insert(Some(index));
    }
    for pid in strangers {
        if let Some(Some(index)) = cgroup_of(pid).and_then(|c| by_cgroup.get(&c).copied()) {
            owner.insert(pid, index);
        }
    }
    owner
}

fn is_root(cgroup: &str) -> bool {
    cgroup.lines().all(|line| line.ends_with(":/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::region::{ProcessSnapshot, SlotId, MAX_DEVICES};

    fn slice(name: &str, pids: &[(u32, Liveness)]) -> SliceState {
        let processes = pids
            .iter()
            .enumerate()
            .map(|(i, &(pid, liveness))| ProcessSnapshot {
                slot: SlotId::from_index(i).unwrap(),
                pid: 1,
                host_pid: pid,
                start_time: 0,
                pid_ns: 0,
                used_bytes: [0; MAX_DEVICES],
                contexts: [0; MAX_DEVICES],
                liveness,
            })
            .collect();
        SliceState {
            counters: None,
            found: FoundSlice::named(name),
            snapshot: Some(RegionSnapshot {
                generation: 1,
                devices: Vec::new(),
                processes,
            }),
        }
    }

    fn cgroups(pid: u32) -> Option<String> {
        Some(
            match pid {
                10..=12 => "0::/kubepods/pod-a/c1",
                20 | 21 => "0::/kubepods/pod-b/c2",
                30 => "0::/kubepods/pod-a/c1", // shared with slice a AND c below
                40 | 41 => "0::/",
                50 | 51 => "0::/user.slice/agent",
                _ => return None,
            }
            .to_string(),
        )
    }

    #[test]
    fn a_region_that_is_not_a_regular_file_is_a_problem_not_a_hang() {
        let dir = std::env::temp_dir().join(format!("gpuslice-agent-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("s.region");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path and mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let state = read_region(FoundSlice {
            region: Some(fifo),
            ..FoundSlice::named("s")
        });
        assert!(state.snapshot.is_none());
        assert!(
            state.found.problems[0].contains("not a regular file"),
            "{:?}",
            state.found
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn registered_processes_and_their_containers_belong_to_the_slice() {
        let slices = [
            slice("a", &[(10, Liveness::Alive), (99, Liveness::Stale)]),
            slice("b", &[(20, Liveness::Unknown)]),
        ];
        let owner = membership(
            &slices,
            &[10, 11, 20, 21, 99, 7],
            &|p| Some(p.host_pid),
            &cgroups,
            Some("0::/user.slice/agent".into()),
        );
        assert_eq!(owner.get(&10), Some(&0));
        assert_eq!(
            owner.get(&11),
            Some(&0),
            "same container as a registered one"
        );
        assert_eq!(owner.get(&20), Some(&1));
        assert_eq!(owner.get(&21), Some(&1));
        assert_eq!(owner.get(&99), None, "a stale slot's PID may be reused");
        assert_eq!(owner.get(&7), None);
    }

    #[test]
    fn only_a_registered_process_the_agent_can_verify_is_a_member() {
        let me = gpuslice_common::region::ProcessIdentity::current().unwrap();
        let base = slice("a", &[(0, Liveness::Alive)])
            .snapshot
            .unwrap()
            .processes[0]
            .clone();
        let with = |pid, host_pid, pid_ns, start_time| ProcessSnapshot {
            pid,
            host_pid,
            pid_ns,
            start_time,
            ..base.clone()
        };
        let own = me.pid_ns;
        assert_eq!(
            verified_host_pid(&with(me.pid, 0, own, me.start_time), own),
            Some(me.pid)
        );
        assert_eq!(
            verified_host_pid(&with(7, me.pid, own + 1, me.start_time), own),
            Some(me.pid),
            "a container's process by its host PID"
        );
        assert_eq!(
            verified_host_pid(&with(me.pid, 0, own + 1, me.start_time), own),
            None,
            "a PID of another namespace without a host PID names no one here"
        );
        assert_eq!(
            verified_host_pid(&with(me.pid, 0, own, me.start_time + 1), own),
            None,
            "the PID was reused by a later process"
        );
    }

    #[test]
    fn a_process_mapping_an_unlinked_or_renamed_region_is_the_slices() {
        let dir =
            std::env::temp_dir().join(format!("gpuslice-agent-broken-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let region = dir.join("s.region");
        let mut s = slice("s", &[]);
        s.found.region = Some(region.clone());
        let len = region_mapping_len();
        let line = |path: &str| {
            format!(
                "7f0000000-{:x} rw-s 00000000 fd:01 1234     {path}\n",
                0x7_f000_0000 + len
            )
        };
        let r = region.display().to_string();
        let maps = |pid: u32| {
            Some(match pid {
                1 => line(&format!("{r} (deleted)")),
                2 => line(&format!("{r}.old")),
                3 => line("/usr/lib/libc.so.6"),
                5 => line(&format!("{} (deleted)", dir.join("#1234").display())),
                6 => format!(
                    "7f00-7f10 rw-s 00000000 fd:01 1234     {} (deleted)\n",
                    dir.join("#1").display()
                ),
                _ => return None,
            })
        };
        // Gone from its path: the unlinked copy and the renamed one are the slice's.
        let found = broken_region_members(std::slice::from_ref(&s), &[1, 2, 3, 4, 5, 6], &maps);
        let hash = format!("{} (deleted)", dir.join("#1234").display());
        assert_eq!(
            found,
            [
                (0, 1, format!("{r} (deleted)")),
                (0, 2, format!("{r}.old")),
                (0, 5, hash),
            ],
            "6 is not a region's size"
        );
        // A region at its path again: a renamed file beside it is not the slice's live one,
        // but a deleted one at the path still is (the file was replaced).
        std::fs::write(&region, b"x").unwrap();
        let found = broken_region_members(std::slice::from_ref(&s), &[1, 2], &maps);
        assert_eq!(found, [(0, 1, format!("{r} (deleted)"))]);
        assert_eq!(shared_mapping("7f00-7f10 rw-p 00000000 00:00 0 "), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shared_root_and_own_cgroups_say_nothing() {
        let slices = [
            slice(
                "a",
                &[
                    (10, Liveness::Alive),
                    (40, Liveness::Alive),
                    (50, Liveness::Alive),
                ],
            ),
            slice("c", &[(30, Liveness::Alive)]),
        ];
        let owner = membership(
            &slices,
            &[12, 41, 51],
            &|p| Some(p.host_pid),
            &cgroups,
            Some("0::/user.slice/agent".into()),
        );
        assert_eq!(owner.get(&12), None, "two slices share the cgroup");
        assert_eq!(owner.get(&41), None, "root cgroup");
        assert_eq!(owner.get(&51), None, "the agent's own cgroup");
    }
}
