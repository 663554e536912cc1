//! One look at the node: every discovered slice's ledger (its region, read-only), the
//! driver's cards, and which slice each process the driver reports belongs to.
//!
//! A region is written by the slice's own processes, so nothing in it is taken on its word
//! where a tenant could gain by writing it: a slot names a process (host PID and start time),
//! but that process is the slice's only when the kernel agrees: it maps the slice's region
//! file (`/proc/PID/maps`) or its mount namespace has the slice's region directory mounted
//! (`/proc/PID/mountinfo`, a container given the slice). A slot naming a process that maps
//! neither is forged and ignored; one the agent may not look at (another user's process,
//! without `CAP_SYS_PTRACE`) is unverified. The caps come from the limit files
//! ([`NodeView::cap`]), never from the region's limit words.
//!
//! Membership, in this order: a verified registered process belongs to its slice; so does a
//! process that maps a slice's broken region (unlinked or replaced: [`broken_region_members`]),
//! one whose mount namespace has a slice's region directory mounted (every process of a
//! container given the slice, whether it loaded the shim, registered, or wrote its slot
//! away), and every other process in the same cgroup (container) as a verified registered
//! one. A cgroup is not used when registered processes of two slices share it, nor when it
//! is the agent's own or the root (processes run from one shell on a host share those;
//! there the cgroup says nothing about the slice).

use crate::discovery::{discover, FoundSlice, Sources};
use crate::driver::{Card, Driver};
use crate::host::{self, MountKey};
use gpuslice_common::config::{DeviceSelector, SliceConfig};
use gpuslice_common::region::{
    Liveness, ProcessSnapshot, Region, RegionSnapshot, SliceCounters, SlotId, MAX_DEVICES,
};
use gpuslice_common::unpriced::UNPRICED_BOUND_BYTES;
use std::collections::{HashMap, HashSet};

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
    /// (device, inode) of the region file read, with the snapshot.
    pub region_id: Option<(u64, u64)>,
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

/// The host PID a registered slot names, when a process with that PID and the slot's start
/// time runs: the slot's host PID (or its PID, when it registered in the agent's own PID
/// namespace). Anything else (a PID of another namespace with no host PID, a PID reused
/// since, no `/proc` view of the host) is no one. Whether that process is really the slice's
/// is [`Evidence::proof`]'s question: the slot's words are the tenant's to write.
pub fn claimed_host_pid(p: &ProcessSnapshot, own_pid_ns: u64) -> Option<u32> {
    let pid = if p.host_pid != 0 {
        p.host_pid
    } else if p.pid_ns != 0 && p.pid_ns == own_pid_ns {
        p.pid
    } else {
        return None;
    };
    (host::start_time(pid) == Some(p.start_time)).then_some(pid)
}

/// What the kernel says of a registered slot's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The process maps the slice's region, or has its region directory mounted.
    Verified(u32),
    /// The agent may not read the process's mappings, and it has no mount of the slice.
    Unknowable(u32),
    /// The process maps no region of the slice and has none of its mounts: the slot names a
    /// process that is not the slice's (a tenant wrote it).
    Forged(u32),
    /// The slot names no running process the agent can see.
    NoProcess,
}

/// What the agent learnt from `/proc` about processes, kept for their lives (keyed by host
/// PID and start time, so a reused PID is another key): a process's mappings and mounts are
/// looked at once, not on every pass.
#[derive(Default)]
pub struct Evidence {
    /// (PID, start time, region device, region inode) -> maps it (`None`: may not look).
    maps: HashMap<(u32, u64, u64, u64), Option<bool>>,
    /// (PID, start time) -> (device, root) of its mount namespace's mounts (`None`: cannot
    /// be read).
    mounts: HashMap<(u32, u64), Option<Vec<host::Mount>>>,
}

impl Evidence {
    fn maps_region(&mut self, pid: u32, start: u64, (dev, ino): (u64, u64)) -> Option<bool> {
        *self
            .maps
            .entry((pid, start, dev, ino))
            .or_insert_with(|| match host::read(pid, "maps") {
                host::Read::Text(maps) => Some(host::maps_file(&maps, dev, ino)),
                host::Read::Denied => None,
                host::Read::Gone => Some(false),
            })
    }

    fn mounts(&mut self, pid: u32, start: u64) -> Option<&[host::Mount]> {
        self.mounts
            .entry((pid, start))
            .or_insert_with(|| match host::read(pid, "mountinfo") {
                host::Read::Text(text) => Some(host::mounts(&text)),
                _ => None,
            })
            .as_deref()
    }

    /// Whether the process `pid` (started at `start`) has `key`'s directory mounted.
    fn mounted(&mut self, pid: u32, start: u64, key: Option<&MountKey>) -> bool {
        key.is_some_and(|key| self.mounts(pid, start).is_some_and(|m| key.mounted_in(m)))
    }

    /// The kernel's word on the process a registered slot of `slice` names.
    fn proof(
        &mut self,
        p: &ProcessSnapshot,
        own_ns: u64,
        slice: &SliceState,
        mount: Option<&MountKey>,
    ) -> Proof {
        let Some(pid) = claimed_host_pid(p, own_ns) else {
            return Proof::NoProcess;
        };
        let maps = slice
            .region_id
            .map_or(Some(false), |id| self.maps_region(pid, p.start_time, id));
        match maps {
            Some(true) => Proof::Verified(pid),
            _ if self.mounted(pid, p.start_time, mount) => Proof::Verified(pid),
            Some(false) => Proof::Forged(pid),
            None => Proof::Unknowable(pid),
        }
    }

    /// Forgets every process not in `live`.
    fn keep_only(&mut self, live: &HashSet<u32>) {
        self.maps.retain(|(pid, ..), _| live.contains(pid));
        self.mounts.retain(|(pid, _), _| live.contains(pid));
    }
}

/// What a slice's ledger holds for one of its processes on a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ledger {
    /// A registered process's entry.
    Entry(u64),
    /// Not registered (or not verifiably): none of its bytes are in the ledger.
    Unregistered,
    /// It maps the slice's broken region: its entry cannot be read.
    Unreadable,
}

/// A slice's process on a card, weighed against its ledger entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub pid: u32,
    /// What the driver holds for it.
    pub driver: u64,
    pub ledger: Ledger,
}

impl Member {
    /// Bytes beyond its entry within [`UNPRICED_BOUND_BYTES`]: what the shim's model of the
    /// memory the driver places by itself may miss.
    pub fn unpriced(&self) -> u64 {
        match self.ledger {
            Ledger::Entry(entry) => self.driver.saturating_sub(entry).min(UNPRICED_BOUND_BYTES),
            _ => 0,
        }
    }

    /// Bytes the ledger does not account for: a registered process's beyond its entry plus
    /// [`UNPRICED_BOUND_BYTES`], all of an unregistered one's.
    pub fn unaccounted(&self) -> u64 {
        match self.ledger {
            Ledger::Entry(entry) => self
                .driver
                .saturating_sub(entry.saturating_add(UNPRICED_BOUND_BYTES)),
            Ledger::Unregistered => self.driver,
            Ledger::Unreadable => 0,
        }
    }
}

/// Where a slice's cap on a card comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapSource {
    /// Its limit file (which no tenant can write).
    LimitFile,
    /// Its region's limit word: only for a slice found without a readable limit file.
    Region,
}

/// The node at one instant.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub slices: Vec<SliceState>,
    pub cards: Result<Vec<Card>, String>,
    /// Host PID -> index into `slices`.
    pub owner: HashMap<u32, usize>,
    /// Registered processes, not known to have exited, whose process the agent could not
    /// prove to be the slice's nor to be another's ([`Proof::Unknowable`], [`Proof::NoProcess`]).
    pub unverified: usize,
    /// Host PIDs of [`Proof::Unknowable`] slots: processes that may be a slice's although the
    /// agent cannot prove it (never judged as processes of no slice).
    pub unknowable: HashSet<u32>,
    /// (slice, slot, host PID) of every [`Proof::Forged`] slot.
    pub forged: Vec<(usize, SlotId, u32)>,
    /// Whether every process the driver reports is in the agent's `/proc` (the host's PID
    /// view): without it no process can be judged to be of no slice.
    pub host_view: bool,
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

    /// A slice found as `found` whose region holds `snapshot`.
    pub fn slice(found: FoundSlice, snapshot: Option<RegionSnapshot>) -> SliceState {
        SliceState {
            found,
            snapshot,
            counters: None,
            region_id: None,
        }
    }

    /// A node view of `slices` and `cards` in which no process is yet known to be a slice's.
    pub fn view(slices: Vec<SliceState>, cards: Result<Vec<Card>, String>) -> NodeView {
        NodeView {
            slices,
            cards,
            owner: HashMap::new(),
            unverified: 0,
            unknowable: HashSet::new(),
            forged: Vec::new(),
            host_view: true,
            ledger: HashMap::new(),
            broken: Vec::new(),
        }
    }
}

/// What a limit file says of the memory of the card `uuid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileCap {
    /// A UUID entry names the card: its cap.
    Exact(u64),
    /// Index entries (`entries` of them, every one with a memory limit) name devices as the
    /// slice's processes number them (CUDA ordinals, which need not be the node's indices):
    /// the card may be any of them, so the largest bounds it.
    Index { bound: u64, entries: usize },
}

/// `None`: the file does not limit the card's memory (no entry names it, or an index entry
/// without memory might).
fn file_cap(config: &SliceConfig, uuid: &str) -> Option<FileCap> {
    let by_uuid = config.devices.iter().find(
        |d| matches!(&d.selector, DeviceSelector::Uuid(want) if want.eq_ignore_ascii_case(uuid)),
    );
    if let Some(entry) = by_uuid {
        return entry.memory_limit.map(FileCap::Exact);
    }
    let limits: Option<Vec<u64>> = config
        .devices
        .iter()
        .filter(|d| matches!(d.selector, DeviceSelector::Index(_)))
        .map(|d| d.memory_limit)
        .collect();
    let limits = limits?;
    let bound = *limits.iter().max()?;
    Some(FileCap::Index {
        bound,
        entries: limits.len(),
    })
}

impl NodeView {
    /// Bytes the driver reports for `slice`'s processes on `card`, and how many there are.
    pub fn driver_usage(&self, slice: usize, card: &Card) -> (u64, usize) {
        card.processes
            .iter()
            .filter(|(pid, _)| self.owner.get(pid) == Some(&slice))
            .fold((0, 0), |(bytes, n), (_, b)| (bytes + b.unwrap_or(0), n + 1))
    }

    /// The limit word `slice`'s region holds for the card `uuid`: `None` without an entry,
    /// `Some(None)` for "not limited".
    fn region_limit(&self, slice: usize, uuid: &str) -> Option<Option<u64>> {
        let snapshot = self.slices.get(slice)?.snapshot.as_ref()?;
        let entry = snapshot.devices.iter().find(|d| d.uuid == uuid)?;
        Some(entry.memory_limit)
    }

    /// On how many cards `slice`'s processes hold memory.
    fn cards_used(&self, slice: usize) -> usize {
        self.cards.as_ref().map_or(0, |cards| {
            cards
                .iter()
                .filter(|card| self.driver_usage(slice, card).0 > 0)
                .count()
        })
    }

    /// `slice`'s memory cap on the card `uuid`, as the backstop judges the card: its limit
    /// file's. A UUID entry's exactly. Index entries' bound where the slice's processes bound
    /// the card in their region (lowered to the region's word, which only a stricter binder
    /// or the slice's own harm can make lower), or where the file has an index entry for each
    /// card the slice's processes use (then every one of them is one of the file's); else the
    /// card may be one the file leaves unlimited, and is not judged. Only a slice found
    /// without a readable limit file is judged by its region's word.
    pub fn cap(&self, slice: usize, uuid: &str) -> Option<(u64, CapSource)> {
        let state = self.slices.get(slice)?;
        let region = self.region_limit(slice, uuid);
        let Some(config) = &state.found.config else {
            return region.flatten().map(|bytes| (bytes, CapSource::Region));
        };
        let bytes = match file_cap(config, uuid)? {
            FileCap::Exact(bytes) => bytes,
            FileCap::Index { bound, .. } if matches!(region, Some(Some(_))) => {
                bound.min(region.flatten().unwrap_or(bound))
            }
            FileCap::Index { bound, entries } if entries >= self.cards_used(slice) => bound,
            FileCap::Index { .. } => return None,
        };
        Some((bytes, CapSource::LimitFile))
    }

    /// The region's limit word for `uuid` where it allows more than the limit file: a
    /// process of the slice wrote it (or the file was lowered since the slice's processes
    /// started). (word, the file's cap; a word of "not limited" reads as `u64::MAX`).
    pub fn raised_limit(&self, slice: usize, uuid: &str) -> Option<(u64, u64)> {
        let word = self.region_limit(slice, uuid)?.unwrap_or(u64::MAX);
        let config = self.slices.get(slice)?.found.config.as_ref()?;
        let cap = match file_cap(config, uuid)? {
            FileCap::Exact(bytes) => bytes,
            FileCap::Index { bound, .. } => bound,
        };
        (word > cap).then_some((word, cap))
    }

    /// What the ledger accounts for `pid` on `card`: `None` for a process of no slice's
    /// region (a bypasser in a slice's container, a stranger) or of a broken one; 0 for a
    /// registered process on a card its region has no entry for.
    pub fn ledger_bytes(&self, pid: u32, card: &Card) -> Option<u64> {
        let (slice, bytes) = self.ledger.get(&pid)?;
        let snapshot = self.slices.get(*slice)?.snapshot.as_ref()?;
        let entry = snapshot.devices.iter().find(|d| d.uuid == card.uuid);
        Some(entry.map_or(0, |e| bytes[e.id.index()]))
    }

    /// `slice`'s processes on `card`, each weighed against its ledger entry.
    pub fn members(&self, slice: usize, card: &Card) -> Vec<Member> {
        card.processes
            .iter()
            .filter(|(pid, _)| self.owner.get(pid) == Some(&slice))
            .map(|&(pid, bytes)| Member {
                pid,
                driver: bytes.unwrap_or(0),
                ledger: if self.is_broken(pid) {
                    Ledger::Unreadable
                } else {
                    self.ledger_bytes(pid, card)
                        .map_or(Ledger::Unregistered, Ledger::Entry)
                },
            })
            .collect()
    }

    /// Whether `pid` maps a slice's broken region.
    pub fn is_broken(&self, pid: u32) -> bool {
        self.broken.iter().any(|(_, b, _)| *b == pid)
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
pub fn collect(
    sources: &Sources,
    driver: &mut Driver,
    evidence: &mut Evidence,
    warn: &mut dyn FnMut(String),
) -> NodeView {
    let mut slices: Vec<SliceState> = discover(sources, warn)
        .into_iter()
        .map(read_region)
        .collect();
    let cards = driver.cards();
    // The ledgers again, after the driver: a process charges before the driver allocates
    // and refunds after it frees, so the larger of two reads around the driver's keeps an
    // allocation or a free in flight from passing for bytes the ledger does not account for.
    for slice in &mut slices {
        reread_ledger(slice);
    }
    let driver_pids: Vec<u32> = match &cards {
        Ok(cards) => cards
            .iter()
            .flat_map(|c| c.processes.iter().map(|(pid, _)| *pid))
            .collect(),
        Err(_) => Vec::new(),
    };
    let own_ns = gpuslice_common::region::own_pid_namespace();
    let mounts: Vec<Option<MountKey>> = slices
        .iter()
        .map(|s| {
            s.found
                .region
                .as_deref()
                .and_then(|r| r.parent())
                .and_then(MountKey::of)
        })
        .collect();
    let mut ledger = HashMap::new();
    let mut registered = HashMap::new();
    let mut unverified = 0;
    let mut unknowable = HashSet::new();
    let mut forged = Vec::new();
    let mut live: HashSet<u32> = driver_pids.iter().copied().collect();
    for (index, slice) in slices.iter().enumerate() {
        for p in slice.registered() {
            match evidence.proof(p, own_ns, slice, mounts[index].as_ref()) {
                Proof::Verified(pid) => {
                    ledger.entry(pid).or_insert((index, p.used_bytes));
                    registered.entry(pid).or_insert(index);
                    live.insert(pid);
                }
                Proof::Unknowable(pid) => {
                    unverified += 1;
                    unknowable.insert(pid);
                    live.insert(pid);
                }
                Proof::Forged(pid) => {
                    forged.push((index, p.slot, pid));
                    live.insert(pid);
                }
                Proof::NoProcess => unverified += 1,
            }
        }
    }
    // Processes that map a slice's region file which is no longer at its path (or no longer
    // the file there): the slice's, whatever the region says now.
    let strangers: Vec<u32> = driver_pids
        .iter()
        .copied()
        .filter(|pid| !registered.contains_key(pid))
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
            "region {region} is broken: process {pid} of the slice maps {mapped}; its ledger cannot be read"
        ));
    }
    let mut owner = registered.clone();
    for (index, pid, _) in &broken {
        owner.entry(*pid).or_insert(*index);
    }
    // A container given a slice has its region directory mounted, whatever its processes
    // write in the region.
    let mut host_view = true;
    for &pid in &driver_pids {
        let Some(start) = host::start_time(pid) else {
            host_view = false;
            continue;
        };
        if owner.contains_key(&pid) {
            continue;
        }
        if let Some(index) =
            (0..slices.len()).find(|&i| evidence.mounted(pid, start, mounts[i].as_ref()))
        {
            owner.insert(pid, index);
        }
    }
    let strangers: Vec<u32> = driver_pids
        .iter()
        .copied()
        .filter(|pid| !owner.contains_key(pid))
        .collect();
    owner.extend(membership(
        &registered,
        &strangers,
        &cgroup_of,
        cgroup_of(std::process::id()),
    ));
    evidence.keep_only(&live);
    NodeView {
        slices,
        cards,
        owner,
        unverified,
        unknowable,
        forged,
        host_view,
        ledger,
        broken,
    }
}

/// Reads `slice`'s region again and keeps, per slot and device entry, the larger of the two
/// reads' bytes (for the same process: same PID and start time).
fn reread_ledger(slice: &mut SliceState) {
    let (Some(snapshot), Some(path)) = (&mut slice.snapshot, &slice.found.region) else {
        return;
    };
    let Ok(view) = Region::open_existing(path) else {
        return;
    };
    if Some(view.file_id()) != slice.region_id {
        return;
    }
    let again = view.snapshot();
    for p in &mut snapshot.processes {
        let same = again
            .processes
            .iter()
            .find(|q| q.slot == p.slot && q.pid == p.pid && q.start_time == p.start_time);
        if let Some(q) = same {
            for (mine, theirs) in p.used_bytes.iter_mut().zip(q.used_bytes) {
                *mine = (*mine).max(theirs);
            }
        }
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
    let mut region_id = None;
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
                region_id = Some(view.file_id());
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
        region_id,
    }
}

/// The cgroup a process is in (the unified hierarchy's path, or all lines of a v1 host).
fn cgroup_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
}

/// The slice of each of `strangers` that shares its cgroup with `registered` processes (host
/// PID -> slice) of one slice only (see the module doc).
pub fn membership(
    registered: &HashMap<u32, usize>,
    strangers: &[u32],
    cgroup_of: &dyn Fn(u32) -> Option<String>,
    own_cgroup: Option<String>,
) -> HashMap<u32, usize> {
    let mut owner = HashMap::new();
    if strangers.is_empty() {
        return owner;
    }
    // cgroup -> the one slice whose registered processes are in it (None: more than one).
    let mut by_cgroup: HashMap<String, Option<usize>> = HashMap::new();
    for (&pid, &index) in registered {
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
    for &pid in strangers {
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
        fixtures::slice(
            FoundSlice::named(name),
            Some(RegionSnapshot {
                generation: 1,
                devices: Vec::new(),
                processes,
            }),
        )
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
        // 10 of slice a and 20 of slice b are verified registered processes; 99 was one of
        // a's and has exited (its PID may be reused).
        let registered = [(10, 0), (20, 1)].into_iter().collect();
        let owner = membership(
            &registered,
            &[11, 21, 99, 7],
            &cgroups,
            Some("0::/user.slice/agent".into()),
        );
        assert_eq!(
            owner.get(&11),
            Some(&0),
            "same container as a registered one"
        );
        assert_eq!(owner.get(&21), Some(&1));
        assert_eq!(owner.get(&99), None, "a stale slot's PID may be reused");
        assert_eq!(owner.get(&7), None);
    }

    #[test]
    fn a_slot_names_a_process_by_host_pid_and_start_time() {
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
            claimed_host_pid(&with(me.pid, 0, own, me.start_time), own),
            Some(me.pid)
        );
        assert_eq!(
            claimed_host_pid(&with(7, me.pid, own + 1, me.start_time), own),
            Some(me.pid),
            "a container's process by its host PID"
        );
        assert_eq!(
            claimed_host_pid(&with(me.pid, 0, own + 1, me.start_time), own),
            None,
            "a PID of another namespace without a host PID names no one here"
        );
        assert_eq!(
            claimed_host_pid(&with(me.pid, 0, own, me.start_time + 1), own),
            None,
            "the PID was reused by a later process"
        );
    }

    #[test]
    fn a_slot_is_the_slices_only_where_its_process_maps_the_region_or_mounts_its_directory() {
        use std::os::unix::fs::MetadataExt;
        let me = gpuslice_common::region::ProcessIdentity::current().unwrap();
        let mut state = slice("a", &[(me.pid, Liveness::Alive)]);
        let mut p = state.registered().next().unwrap().clone();
        p.start_time = me.start_time;
        // This test binary stands for the region: this process maps it.
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        state.region_id = Some((exe.dev(), exe.ino()));
        let mut evidence = Evidence::default();
        assert_eq!(
            evidence.proof(&p, me.pid_ns, &state, None),
            Proof::Verified(me.pid)
        );
        // A slot naming this very process for another slice's region: forged.
        let mut other = state.clone();
        other.region_id = Some((exe.dev(), u64::MAX));
        assert_eq!(
            evidence.proof(&p, me.pid_ns, &other, None),
            Proof::Forged(me.pid)
        );
        // ... unless this process had that slice's region directory mounted.
        let root = evidence.mounts(me.pid, me.start_time).unwrap()[0].clone();
        let mount = MountKey {
            device: root.0,
            suffix: root.1,
        };
        assert_eq!(
            evidence.proof(&p, me.pid_ns, &other, Some(&mount)),
            Proof::Verified(me.pid)
        );
        // A start time that is not this process's: no such process.
        p.start_time += 1;
        assert_eq!(
            evidence.proof(&p, me.pid_ns, &state, None),
            Proof::NoProcess
        );
        evidence.keep_only(&HashSet::new());
        assert!(evidence.maps.is_empty() && evidence.mounts.is_empty());
    }

    #[test]
    fn a_limit_file_caps_a_card_by_uuid_exactly_and_by_index_at_most() {
        use gpuslice_common::config::parse_limit_file;
        let config = |devices: &str| {
            parse_limit_file(
                std::path::Path::new("s.json"),
                &format!(r#"{{"version": 1, "region": "/r/s.region", "devices": [{devices}]}}"#),
            )
            .unwrap()
        };
        let uuid = "GPU-12345678-1234-1234-1234-123456789abc";
        let mut state = slice("s", &[]);
        state.snapshot = Some(fixtures::one_device_region(uuid, 8 << 30, Vec::new()));
        state.found.config = Some(config(&format!(
            r#"{{"uuid": "{uuid}", "memory": "1GiB"}}, {{"index": 0, "memory": "2GiB"}}"#
        )));
        let mut view = fixtures::view(vec![state], Ok(Vec::new()));
        // The region's word (8 GiB, as a tenant wrote it) changes nothing.
        assert_eq!(view.cap(0, uuid), Some((1 << 30, CapSource::LimitFile)));
        assert_eq!(view.raised_limit(0, uuid), Some((8 << 30, 1 << 30)));
        // Index entries: the largest bounds the card; a lower region word is stricter.
        view.slices[0].found.config = Some(config(
            r#"{"index": 0, "memory": "1GiB"}, {"index": 1, "memory": "2GiB"}"#,
        ));
        assert_eq!(view.cap(0, uuid), Some((2 << 30, CapSource::LimitFile)));
        view.slices[0].snapshot = Some(fixtures::one_device_region(uuid, 1 << 30, Vec::new()));
        assert_eq!(view.cap(0, uuid), Some((1 << 30, CapSource::LimitFile)));
        assert_eq!(view.raised_limit(0, uuid), None);
        // No entry in the region for the card: an index entry for each card the slice uses
        // makes it one of them; with fewer, it may be one the file leaves unlimited.
        view.slices[0].snapshot = Some(fixtures::one_device_region("GPU-other", 1, Vec::new()));
        assert_eq!(view.cap(0, uuid), Some((2 << 30, CapSource::LimitFile)));
        view.slices[0].found.config = Some(config(r#"{"index": 0, "memory": "1GiB"}"#));
        view.owner = [(7, 0), (8, 0)].into_iter().collect();
        view.cards = Ok(["GPU-other", uuid]
            .iter()
            .zip([7, 8])
            .enumerate()
            .map(|(index, (uuid, pid))| Card {
                index: index as u32,
                uuid: (*uuid).into(),
                total: 32 << 30,
                used: 0,
                free: 0,
                utilization: None,
                processes: vec![(pid, Some(1 << 20))],
            })
            .collect());
        assert_eq!(view.cap(0, uuid), None, "one index entry, two cards");
        // No limit file: the region's word, said so.
        view.slices[0].found.config = None;
        view.slices[0].snapshot = Some(fixtures::one_device_region(uuid, 1 << 30, Vec::new()));
        assert_eq!(view.cap(0, uuid), Some((1 << 30, CapSource::Region)));
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
        let registered = [(10, 0), (40, 0), (50, 0), (30, 1)].into_iter().collect();
        let owner = membership(
            &registered,
            &[12, 41, 51],
            &cgroups,
            Some("0::/user.slice/agent".into()),
        );
        assert_eq!(owner.get(&12), None, "two slices share the cgroup");
        assert_eq!(owner.get(&41), None, "root cgroup");
        assert_eq!(owner.get(&51), None, "the agent's own cgroup");
    }
}
