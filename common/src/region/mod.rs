//! The shared region: one mmap'd file per slice, shared by every process of the container
//! (and by every container sharing the slice). It holds the container-wide memory ledger per
//! device and one fixed slot per process. The shim reserves and releases on it on every
//! allocation; the CLI reads a snapshot of it.
//!
//! Submodules: `layout` (the bytes), `lock` (kernel-released OFD locks), `proc` (process
//! identity). This file owns the rules below.
//!
//! ## Creation and validation
//! `Region::open_or_create` opens the file with O_CREAT (mode 0666 minus umask; the parent
//! directory must exist), takes the registration lock, and then: an empty file is sized to
//! [`REGION_SIZE`] and initialised (header written last, `init_state` published with Release);
//! a file of exactly `REGION_SIZE` bytes is validated (magic, layout version, struct sizes,
//! counts); a file of any other size is refused *before* mapping it, so a truncated file can
//! never be touched past its end (SIGBUS). Concurrent creators serialise on the lock, so
//! exactly one initialises. A right-sized file whose `init_state` is not ready but whose magic
//! is ours or zero is an interrupted initialisation and is initialised again.
//!
//! **Corrupt-file rule:** a foreign, truncated or incompatible file is never repaired
//! implicitly: every open returns a `RegionError` naming the path and what is wrong, and the
//! shim fails closed. `Region::reset(path)` (for `gpuslice`) rebuilds it, and refuses while a
//! live process holds a slot. (Someone truncating a file that processes already map is outside
//! what any mapping can survive; the file should live in a directory only the slice writes.)
//!
//! **Limits rule:** the header's device entries hold the limits in force, keyed by device UUID
//! (indices differ between processes with different `CUDA_VISIBLE_DEVICES`; UUIDs do not).
//! `Region::bind_devices` reconciles the caller's configured limits with them under the
//! registration lock:
//! * when no other live process holds a slot, the configuration replaces the entry's limits (a
//!   changed limit file takes effect with the first process of the next run);
//! * while other processes live, the stricter of the two stays in force (lower memory limit,
//!   lower compute share): a tighter limit file applies at once, but one process started with
//!   a missing or looser configuration (an `ssh` session without the env, an old file) can
//!   never lift the cap for everyone. A looser limit applies once the others have exited, or
//!   after `gpuslice` resets the region.
//!
//! Every difference between configuration and entry is returned as a `LimitChange` (what was
//! there, what was asked, what is now in force) for the shim to log. Lowering a limit below
//! current use evicts nobody: new reservations fail until use drops under it.
//!
//! ## Liveness: who owns a slot
//! The owner of a slot holds an OFD write lock on that slot's first byte, through a descriptor
//! opened for that registration (close-on-exec). The kernel drops the lock when the owner dies
//! (SIGKILL included) or execs, so "nobody holds the slot lock" means dead, across PID
//! namespaces too. The lock can outlive its owner in one case: a child forked while the parent
//! was registered inherits the descriptor. So a held lock is additionally checked against the
//! slot's PID and start time when the slot is from our own PID namespace: a missing PID, a
//! zombie, or a different start time (PID reuse) is dead. A forked child must call `register`
//! again; that also closes the inherited descriptors in the child.
//!
//! ## Hot path and drift
//! `reserve` is a compare-and-swap loop on the device's `used_bytes` against the limit (never
//! lets the sum pass it), then a `fetch_add` on the slot's own counter. `release` takes from the
//! slot's counter first (saturating, never below zero) and gives exactly that much back to the
//! device. A SIGKILL between the two atomics of either leaves the device total *higher* than
//! the sum of the slots (drift always over-counts, so the cap is never exceeded). Reaping a
//! dead slot subtracts its counters (saturating); when a reap finds no live slot at all, the
//! device totals are reset to what the still-pending dead slots hold (0 when none), which
//! clears any drift.
//!
//! ## Reaping: a dead slot's bytes return only once the driver has let go
//! The slot lock is one descriptor among the process's others: the kernel closes them one by
//! one as the process exits, and the driver frees the process's device memory when ITS
//! descriptors close (a real driver may even defer that teardown). So "the slot lock is free"
//! can be seen while the driver still holds the dead process's memory; giving its budget back
//! then would let another process allocate it while it is still physically in use, and the
//! slice's physical usage would pass the cap. Reaping is therefore two-phase
//! ([`Region::reap_dead_if`]): each stale slot is described as a [`DeadSlot`] (its bytes, host
//! PID, how far its owner has got in exiting per /proc, how long it has been seen dead) and
//! the caller decides whether the driver has released it (the shim asks NVML's process list).
//! Undecided slots stay claimed and charged (`ReapReport::pending`), so the budget never
//! exceeds what the driver really has free. [`Region::reap_dead`] uses the region's own
//! evidence: the owner is gone or a zombie (after all its descriptors are closed) in our PID
//! namespace. Every rule is bounded by [`RELEASE_TIMEOUT`] so nothing stays unavailable for good.
//!
//! Registration, reaping, binding and unregistering take the registration lock (byte 0); the
//! lock is per open description, and each acquisition opens its own, so threads of one
//! process also exclude each other. A mapping keeps its description alive, so locks are never
//! taken through the descriptor a mapping was made from (the lock would outlive the close). Known limit: a fork while another thread holds the
//! registration lock leaves the child's inherited copy holding it forever.

mod layout;
mod lock;
mod proc;

pub use layout::{
    slot_lock_offset, DEVICE_ENTRY_SIZE, HEADER_SIZE, LAYOUT_VERSION, MAGIC, MAX_DEVICES,
    MAX_PROCESSES, REGION_SIZE, REGISTRATION_LOCK_OFFSET, SLOTS_OFFSET, SLOT_SIZE, THROTTLE_WORDS,
    UUID_BYTES,
};
pub use proc::{parse_stat, ProcessIdentity, StatFields};

use layout::{
    magic_word, uuid_from_words, uuid_to_words, DeviceEntry, ProcessSlot, RegionLayout, INIT_EMPTY,
    INIT_READY, SLOT_CLAIMED, SLOT_FREE, UNLIMITED,
};
use lock::OwnedFd;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// A device entry of the region (0..MAX_DEVICES), obtained from `bind_devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(u8);

impl DeviceId {
    pub fn from_index(index: usize) -> Option<DeviceId> {
        (index < MAX_DEVICES).then_some(DeviceId(index as u8))
    }
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A process slot (0..MAX_PROCESSES), obtained from `register`. Slots never move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(u16);

impl SlotId {
    pub fn from_index(index: usize) -> Option<SlotId> {
        (index < MAX_PROCESSES).then_some(SlotId(index as u16))
    }
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A reservation that would take the device past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    pub limit: u64,
    /// Container-wide use at the moment of refusal.
    pub used: u64,
    pub requested: u64,
}

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocating {} bytes would exceed the slice's limit of {} bytes ({} in use)",
            self.requested, self.limit, self.used
        )
    }
}

impl std::error::Error for OverLimit {}

/// Why a region could not be opened or changed. Display names the path and the problem.
#[derive(Debug)]
pub enum RegionError {
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    /// The file is not `REGION_SIZE` bytes (truncated, or not a region).
    WrongSize {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    /// The file does not start with our magic.
    Foreign { path: PathBuf, found_magic: [u8; 8] },
    /// Our magic, but a layout this build does not understand.
    Incompatible {
        path: PathBuf,
        what: &'static str,
        found: u64,
        expected: u64,
    },
    /// Read-only open of a region nobody has initialised yet.
    NotInitialised { path: PathBuf },
    /// The path now names a different file than the one this process mapped.
    Replaced { path: PathBuf },
    /// Every slot belongs to a live process.
    Full { path: PathBuf },
    /// Every device entry is taken by other UUIDs, or the UUID is empty.
    NoDeviceEntry { path: PathBuf, uuid: String },
    /// The slot does not belong to this process.
    NotOwner { path: PathBuf, slot: SlotId },
    /// `reset` refused: these PIDs still hold slots.
    InUse { path: PathBuf, pids: Vec<u32> },
}

impl RegionError {
    fn io(path: &Path, action: &'static str, source: io::Error) -> RegionError {
        RegionError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io {
                path,
                action,
                source,
            } => write!(f, "shared region {}: cannot {action}: {source}", path.display()),
            RegionError::WrongSize {
                path,
                found,
                expected,
            } => write!(
                f,
                "shared region {}: file is {found} bytes, a region is {expected}; it is truncated or not a gpuslice region (`gpuslice reset --region PATH` rebuilds it)",
                path.display()
            ),
            RegionError::Foreign { path, found_magic } => write!(
                f,
                "shared region {}: not a gpuslice region (starts with {:?}); refusing to overwrite it (`gpuslice reset --region PATH` rebuilds it if it really is the slice's file)",
                path.display(),
                String::from_utf8_lossy(found_magic)
            ),
            RegionError::Incompatible {
                path,
                what,
                found,
                expected,
            } => write!(
                f,
                "shared region {}: {what} is {found}, this gpuslice uses {expected}; processes with different gpuslice versions cannot share a region",
                path.display()
            ),
            RegionError::NotInitialised { path } => write!(
                f,
                "shared region {}: not initialised yet (no process has opened it)",
                path.display()
            ),
            RegionError::Replaced { path } => write!(
                f,
                "shared region {}: the path now names a different file than the one in use",
                path.display()
            ),
            RegionError::Full { path } => write!(
                f,
                "shared region {}: all {MAX_PROCESSES} process slots belong to live processes",
                path.display()
            ),
            RegionError::NoDeviceEntry { path, uuid } => write!(
                f,
                "shared region {}: no device entry for {uuid:?} (empty UUID, or {MAX_DEVICES} other devices already recorded)",
                path.display()
            ),
            RegionError::NotOwner { path, slot } => write!(
                f,
                "shared region {}: slot {} does not belong to this process",
                path.display(),
                slot.index()
            ),
            RegionError::InUse { path, pids } => write!(
                f,
                "shared region {}: still used by live processes {pids:?}; stop them first",
                path.display()
            ),
        }
    }
}

impl std::error::Error for RegionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RegionError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The limits a process's configuration gives one device, for `bind_devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    pub uuid: String,
    /// `None` = not limited.
    pub memory_limit: Option<u64>,
    /// `None` (or 100) = not throttled.
    pub compute_percent: Option<u32>,
}

/// A device whose configured limits differed from the region's (see the limits rule).
/// `None` = not limited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitChange {
    pub uuid: String,
    /// What the region held before.
    pub old_memory_limit: Option<u64>,
    /// What the caller's configuration asked for.
    pub configured_memory_limit: Option<u64>,
    /// What is in force now.
    pub new_memory_limit: Option<u64>,
    pub old_compute_percent: Option<u32>,
    pub configured_compute_percent: Option<u32>,
    pub new_compute_percent: Option<u32>,
}

/// Result of `bind_devices`: `ids[i]` is the entry for `devices[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceBinding {
    pub ids: Vec<DeviceId>,
    pub changes: Vec<LimitChange>,
}

/// A slot freed because its owner was dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimedSlot {
    pub slot: SlotId,
    pub pid: u32,
    /// Bytes given back to the device totals, all devices together.
    pub bytes: u64,
}

/// A slot whose owner is dead but whose memory the driver may still hold: it stays claimed,
/// and its bytes stay charged, until a reap finds the memory released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingSlot {
    pub slot: SlotId,
    pub pid: u32,
    /// Bytes still charged for it, all devices together.
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    pub reclaimed: Vec<ReclaimedSlot>,
    /// Dead slots kept charged because the driver may still hold their memory.
    pub pending: Vec<PendingSlot>,
    /// Bytes cleared from the device totals because no live slot remained (drift).
    pub drift_cleared_bytes: u64,
}

/// How far a dead slot's owner has got in exiting, as this process's /proc shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitState {
    /// Gone, a zombie, or its PID reused: the kernel has closed every descriptor it had,
    /// the driver's included, so the driver has been told to free its memory.
    Exited,
    /// Still running with the same start time: it is closing its descriptors (our lock went
    /// first, the driver's may still be open), or it exec'd (close-on-exec dropped both).
    Exiting,
    /// Another PID namespace (or no /proc): cannot tell.
    Unknown,
}

/// A dead slot offered to the caller of [`Region::reap_dead_if`], which decides whether the
/// driver has released its memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadSlot {
    pub slot: SlotId,
    pub pid: u32,
    /// PID as NVML reports it; 0 = never learnt.
    pub host_pid: u32,
    /// Bytes still charged per device entry.
    pub used_bytes: [u64; MAX_DEVICES],
    pub exit: ExitState,
    /// Time since a reap first found it dead (0 on that first reap).
    pub dead_for: std::time::Duration,
}

/// How long a dead slot stays charged at most while nothing proves the driver released its
/// memory (another PID namespace without NVML evidence, an exec'd process, a driver that is
/// slow to tear down). Bounded so a dead process's budget is never lost for good.
pub const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl DeadSlot {
    /// The region's own evidence: the owner has finished exiting (every descriptor closed,
    /// the driver's included), or [`RELEASE_TIMEOUT`] has passed.
    pub fn exited_or_timed_out(&self) -> bool {
        self.exit == ExitState::Exited || self.dead_for >= RELEASE_TIMEOUT
    }

    pub fn bytes(&self) -> u64 {
        self.used_bytes
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(*b))
    }
}

impl ReapReport {
    pub fn bytes_reclaimed(&self) -> u64 {
        self.reclaimed.iter().map(|r| r.bytes).sum::<u64>() + self.drift_cleared_bytes
    }
}

/// Container-wide memory of one device entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceUsage {
    /// `None` = not limited.
    pub limit: Option<u64>,
    pub used: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// The owner is gone; the slot awaits reaping.
    Stale,
    /// Could not be judged (e.g. the file could not be opened to probe locks).
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub id: DeviceId,
    pub uuid: String,
    pub memory_limit: Option<u64>,
    pub compute_percent: Option<u32>,
    pub used_bytes: u64,
    /// The slice's last measured utilisation of the device, if the compute throttle has
    /// published one.
    pub measured_utilization: Option<MeasuredUtilization>,
    /// What one context costs on the device, as a process of the slice measured it.
    pub context_cost: Option<u64>,
}

/// A utilisation the compute throttle measured (`Region::publish_utilization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeasuredUtilization {
    /// Percent x 100 (2500 = 25 %).
    pub basis_points: u32,
    /// When it was measured, CLOCK_MONOTONIC nanoseconds (the same clock in every container
    /// of the host), so readers can tell a live figure from one left by an idle slice.
    pub at_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub slot: SlotId,
    pub pid: u32,
    pub host_pid: u32,
    pub start_time: u64,
    pub pid_ns: u64,
    /// Per device entry (indexed like `DeviceId::index`).
    pub used_bytes: [u64; MAX_DEVICES],
    pub contexts: [u32; MAX_DEVICES],
    pub liveness: Liveness,
}

/// Plain owned copy of a region for display (`gpuslice status`). Not a consistent cut: each
/// counter is read once, atomically, while processes keep running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionSnapshot {
    pub generation: u64,
    /// Entries that name a device.
    pub devices: Vec<DeviceSnapshot>,
    /// Claimed slots.
    pub processes: Vec<ProcessSnapshot>,
}

/// A mapping of exactly `REGION_SIZE` bytes of a region file.
struct Mapping {
    base: NonNull<RegionLayout>,
    dev: u64,
    ino: u64,
}

// SAFETY: the mapping is plain shared memory consisting only of atomics; every access goes
// through `&RegionLayout`, whose fields are all atomic, so sharing it across threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `fd`, whose size the caller has checked to be `REGION_SIZE`.
    fn map(path: &Path, fd: &OwnedFd, writable: bool) -> Result<Mapping, RegionError> {
        let (dev, ino, size) = lock::fstat(fd).map_err(|e| RegionError::io(path, "stat", e))?;
        if size != REGION_SIZE as u64 {
            return Err(RegionError::WrongSize {
                path: path.to_path_buf(),
                found: size,
                expected: REGION_SIZE as u64,
            });
        }
        let protection = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: mapping a whole, size-checked file MAP_SHARED at a kernel-chosen address;
        // the result is checked for MAP_FAILED before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION_SIZE,
                protection,
                libc::MAP_SHARED,
                fd.raw(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(RegionError::io(path, "map", io::Error::last_os_error()));
        }
        Ok(Mapping {
            base: NonNull::new(base.cast()).expect("mmap never returns NULL on success"),
            dev,
            ino,
        })
    }

    fn layout(&self) -> &RegionLayout {
        // SAFETY: `base` points to REGION_SIZE mapped, page-aligned bytes that live as long as
        // `self`; RegionLayout is exactly that size, all-atomic, and valid for any bit pattern.
        unsafe { self.base.as_ref() }
    }

    /// The whole mapping as 64-bit words (for zeroing without non-atomic writes).
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: same memory as `layout`; REGION_SIZE is a multiple of 8 and the base is
        // page-aligned, and AtomicU64 is valid for any bit pattern.
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), REGION_SIZE / 8)
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `map`; no reference outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), REGION_SIZE) };
    }
}

/// This process's descriptor holding one slot's liveness lock.
struct HeldSlot {
    fd: AtomicI32,
    owner_pid: AtomicU32,
}

/// A region opened for reading and writing (the shim).
pub struct Region {
    map: Mapping,
    path: PathBuf,
    held: Box<[HeldSlot]>,
}

/// A region opened read-only (the CLI): snapshots only, no locks taken, no write access needed.
pub struct RegionView {
    map: Mapping,
    path: PathBuf,
}

/// Holds the registration lock until dropped.
struct RegistrationGuard {
    fd: OwnedFd,
}

impl Region {
    /// Opens the region at `path`, creating and initialising it if the file is new. See the
    /// module doc for what is refused.
    pub fn open_or_create(path: &Path) -> Result<Region, RegionError> {
        let fd =
            lock::open(path, libc::O_RDWR, true).map_err(|e| RegionError::io(path, "open", e))?;
        lock::lock_wait(&fd, REGISTRATION_LOCK_OFFSET)
            .map_err(|e| RegionError::io(path, "lock", e))?;
        let (_, _, size) = lock::fstat(&fd).map_err(|e| RegionError::io(path, "stat", e))?;
        if size == 0 {
            set_len(path, &fd, REGION_SIZE as u64)?;
        }
        let map = map_separately(path, &fd)?;
        match validate(&map, path) {
            Ok(()) => {}
            Err(RegionError::NotInitialised { .. }) if may_initialise(&map) => initialise(&map),
            Err(e) => return Err(e),
        }
        // Dropping `fd` releases the registration lock (the mapping uses another description).
        drop(fd);
        Ok(Region {
            map,
            path: path.to_path_buf(),
            held: (0..MAX_PROCESSES)
                .map(|_| HeldSlot {
                    fd: AtomicI32::new(-1),
                    owner_pid: AtomicU32::new(0),
                })
                .collect(),
        })
    }

    /// Opens an existing, initialised region read-only (the CLI; needs only read permission).
    pub fn open_existing(path: &Path) -> Result<RegionView, RegionError> {
        RegionView::open(path)
    }

    /// Rebuilds the region at `path` as a fresh, empty one (creating it if missing), whatever
    /// it held: the way out of a corrupt, truncated or foreign file. Refused while a live
    /// process holds a slot of a valid region.
    pub fn reset(path: &Path) -> Result<(), RegionError> {
        let fd =
            lock::open(path, libc::O_RDWR, true).map_err(|e| RegionError::io(path, "open", e))?;
        lock::lock_wait(&fd, REGISTRATION_LOCK_OFFSET)
            .map_err(|e| RegionError::io(path, "lock", e))?;
        let (_, _, size) = lock::fstat(&fd).map_err(|e| RegionError::io(path, "stat", e))?;
        if size != REGION_SIZE as u64 {
            // Not a region anyone can have mapped (opens refuse other sizes): resize freely.
            set_len(path, &fd, 0)?;
            set_len(path, &fd, REGION_SIZE as u64)?;
        }
        let map = map_separately(path, &fd)?;
        if validate(&map, path).is_ok() {
            let live: Vec<u32> = claimed_slots(map.layout())
                .filter(|(i, slot)| judge(slot, *i, Some(&fd)) == Liveness::Alive)
                .map(|(_, slot)| slot.pid.load(Ordering::Relaxed))
                .collect();
            if !live.is_empty() {
                return Err(RegionError::InUse {
                    path: path.to_path_buf(),
                    pids: live,
                });
            }
        }
        initialise(&map);
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Finds or creates the entry for each device (by UUID) and writes its configured limits
    /// into it (the configuration wins; see the module doc).
    pub fn bind_devices(&self, devices: &[DeviceLimits]) -> Result<DeviceBinding, RegionError> {
        let guard = self.lock_registration()?;
        let layout = self.map.layout();
        let others_live = self.others_live(&guard);
        let mut binding = DeviceBinding {
            ids: Vec::with_capacity(devices.len()),
            changes: Vec::new(),
        };
        for wanted in devices {
            let no_entry = || RegionError::NoDeviceEntry {
                path: self.path.clone(),
                uuid: wanted.uuid.clone(),
            };
            if wanted.uuid.is_empty() {
                return Err(no_entry());
            }
            let words = uuid_to_words(&wanted.uuid);
            let configured_memory = wanted.memory_limit.unwrap_or(UNLIMITED);
            // 100 and above mean "not throttled", stored as 0.
            let configured_compute = wanted
                .compute_percent
                .filter(|p| (1..=99).contains(p))
                .unwrap_or(0);
            let existing = layout
                .devices
                .iter()
                .position(|entry| load_uuid(entry) == words);
            let index = match existing {
                Some(index) => index,
                None => {
                    let index = layout
                        .devices
                        .iter()
                        .position(|entry| load_uuid(entry) == [0; UUID_BYTES / 8])
                        .ok_or_else(no_entry)?;
                    let entry = &layout.devices[index];
                    entry.used_bytes.store(0, Ordering::Relaxed);
                    entry.context_cost.store(0, Ordering::Relaxed);
                    entry
                        .memory_limit
                        .store(configured_memory, Ordering::Relaxed);
                    entry
                        .compute_percent
                        .store(configured_compute, Ordering::Relaxed);
                    for (slot_word, word) in entry.uuid.iter().zip(words) {
                        slot_word.store(word, Ordering::Relaxed);
                    }
                    index
                }
            };
            let entry = &layout.devices[index];
            let old_memory = entry.memory_limit.load(Ordering::Relaxed);
            let old_compute = entry.compute_percent.load(Ordering::Relaxed);
            if (old_memory, old_compute) != (configured_memory, configured_compute) {
                let (new_memory, new_compute) = if others_live {
                    (
                        old_memory.min(configured_memory),
                        stricter_percent(old_compute, configured_compute),
                    )
                } else {
                    (configured_memory, configured_compute)
                };
                entry.memory_limit.store(new_memory, Ordering::Relaxed);
                entry.compute_percent.store(new_compute, Ordering::Relaxed);
                binding.changes.push(LimitChange {
                    uuid: wanted.uuid.clone(),
                    old_memory_limit: limit_option(old_memory),
                    configured_memory_limit: limit_option(configured_memory),
                    new_memory_limit: limit_option(new_memory),
                    old_compute_percent: percent_option(old_compute),
                    configured_compute_percent: percent_option(configured_compute),
                    new_compute_percent: percent_option(new_compute),
                });
            }
            binding.ids.push(DeviceId(index as u8));
        }
        if !binding.changes.is_empty() {
            layout.header.generation.fetch_add(1, Ordering::Release);
        }
        Ok(binding)
    }

    /// Whether a live slot exists that this `Region` did not register.
    fn others_live(&self, guard: &RegistrationGuard) -> bool {
        let me = std::process::id();
        claimed_slots(self.map.layout()).any(|(index, slot)| {
            let held = &self.held[index];
            let ours = held.fd.load(Ordering::Relaxed) >= 0
                && held.owner_pid.load(Ordering::Relaxed) == me;
            !ours && judge(slot, index, Some(&guard.fd)) != Liveness::Stale
        })
    }

    /// Claims a slot for `identity`: a free one, else one whose owner is dead (reclaiming its
    /// memory). Call again in a forked child: it gets its own slot.
    pub fn register(&self, identity: &ProcessIdentity) -> Result<SlotId, RegionError> {
        self.register_with(identity, |_| {})
    }

    /// `register`, running `while_locked` with the claimed slot before the registration lock
    /// is released (tests use it to die at the worst moment).
    pub fn register_with(
        &self,
        identity: &ProcessIdentity,
        while_locked: impl FnOnce(SlotId),
    ) -> Result<SlotId, RegionError> {
        let guard = self.lock_registration()?;
        self.close_inherited_slot_locks();
        for attempt in 0..2 {
            if let Some(slot) = self.claim_free_slot(identity)? {
                while_locked(slot);
                return Ok(slot);
            }
            if attempt == 0 {
                self.reap_locked(&guard, DeadSlot::exited_or_timed_out);
            }
        }
        Err(RegionError::Full {
            path: self.path.clone(),
        })
    }

    /// Gives back a slot this process registered, returning its bytes to the device totals.
    pub fn unregister(&self, slot: SlotId) -> Result<(), RegionError> {
        let _guard = self.lock_registration()?;
        let held = &self.held[slot.index()];
        if held.fd.load(Ordering::Relaxed) < 0
            || held.owner_pid.load(Ordering::Relaxed) != std::process::id()
        {
            return Err(RegionError::NotOwner {
                path: self.path.clone(),
                slot,
            });
        }
        self.reclaim_slot(slot.index());
        Ok(())
    }

    /// Frees every slot whose owner is dead AND has finished exiting (or has been dead for
    /// [`RELEASE_TIMEOUT`]), returning its memory; see "Reaping" in the module doc.
    pub fn reap_dead(&self) -> Result<ReapReport, RegionError> {
        self.reap_dead_if(DeadSlot::exited_or_timed_out)
    }

    /// Two-phase reap: every slot whose owner is dead is offered to `released`, which says
    /// whether the driver no longer holds that process's memory. Only those slots are freed
    /// and their bytes given back; the others stay claimed and charged (`pending`) until a
    /// later reap. The shim calls this before refusing an allocation.
    pub fn reap_dead_if(
        &self,
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Result<ReapReport, RegionError> {
        let guard = self.lock_registration()?;
        Ok(self.reap_locked(&guard, released))
    }

    /// The UUID a device entry is bound to (empty for an unused entry).
    pub fn device_uuid(&self, device: DeviceId) -> String {
        uuid_from_words(&load_uuid(&self.map.layout().devices[device.index()]))
    }

    /// Reserves `bytes` on `device` for `slot`, or refuses without changing anything when the
    /// container-wide total would pass the limit. Lock-free.
    #[inline]
    pub fn reserve(&self, slot: SlotId, device: DeviceId, bytes: u64) -> Result<(), OverLimit> {
        let layout = self.map.layout();
        let entry = &layout.devices[device.index()];
        let limit = entry.memory_limit.load(Ordering::Relaxed);
        let mut used = entry.used_bytes.load(Ordering::Relaxed);
        loop {
            let next = match used.checked_add(bytes) {
                Some(next) if next <= limit => next,
                _ => {
                    return Err(OverLimit {
                        limit,
                        used,
                        requested: bytes,
                    })
                }
            };
            match entry.used_bytes.compare_exchange_weak(
                used,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(current) => used = current,
            }
        }
        layout.slots[slot.index()].used[device.index()].fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Adds `bytes` on `device` for `slot` even past the limit: for memory the driver already
    /// holds and could not be made to give back, so the total matches the card and later
    /// reservations are refused. Lock-free.
    #[inline]
    pub fn reserve_past_limit(&self, slot: SlotId, device: DeviceId, bytes: u64) {
        let layout = self.map.layout();
        let _ = layout.devices[device.index()].used_bytes.fetch_update(
            Ordering::AcqRel,
            Ordering::Relaxed,
            |used| Some(used.saturating_add(bytes)),
        );
        let _ = layout.slots[slot.index()].used[device.index()].fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |used| Some(used.saturating_add(bytes)),
        );
    }

    /// Returns up to `bytes` of `slot`'s reservation on `device` (never below zero) and gives
    /// the same amount back to the device total. Returns the bytes actually released.
    #[inline]
    pub fn release(&self, slot: SlotId, device: DeviceId, bytes: u64) -> u64 {
        let layout = self.map.layout();
        let taken = saturating_take(&layout.slots[slot.index()].used[device.index()], bytes);
        saturating_take(&layout.devices[device.index()].used_bytes, taken);
        taken
    }

    /// Limit and container-wide use of `device` (for cuMemGetInfo-style answers).
    pub fn usage(&self, device: DeviceId) -> DeviceUsage {
        let entry = &self.map.layout().devices[device.index()];
        DeviceUsage {
            limit: limit_option(entry.memory_limit.load(Ordering::Relaxed)),
            used: entry.used_bytes.load(Ordering::Relaxed),
        }
    }

    /// Bytes `slot` holds on `device`.
    pub fn slot_used(&self, slot: SlotId, device: DeviceId) -> u64 {
        self.map.layout().slots[slot.index()].used[device.index()].load(Ordering::Relaxed)
    }

    /// Compute share of `device`; `None` = not throttled.
    pub fn compute_percent(&self, device: DeviceId) -> Option<u32> {
        percent_option(
            self.map.layout().devices[device.index()]
                .compute_percent
                .load(Ordering::Relaxed),
        )
    }

    /// The words reserved for the compute throttle of `device`.
    /// Records the slice's measured utilisation of `device` (`basis_points` = percent x 100)
    /// at `at_ns` (CLOCK_MONOTONIC), for `gpuslice status`.
    pub fn publish_utilization(&self, device: DeviceId, basis_points: u32, at_ns: u64) {
        let entry = &self.map.layout().devices[device.index()];
        // Time first: a reader that sees the new figure also sees a time at least as new.
        entry.measured_at_ns.store(at_ns, Ordering::Relaxed);
        entry
            .measured_utilization
            .store(u64::from(basis_points) + 1, Ordering::Release);
    }

    /// Records that a context on `device` was measured to cost `bytes`; the entry keeps the
    /// largest figure, so a process that reserves it rarely has to settle upwards.
    pub fn record_context_cost(&self, device: DeviceId, bytes: u64) {
        self.map.layout().devices[device.index()]
            .context_cost
            .fetch_max(bytes, Ordering::AcqRel);
    }

    /// What a context on `device` costs as a process of the slice measured it; `None` until
    /// one has.
    pub fn context_cost(&self, device: DeviceId) -> Option<u64> {
        match self.map.layout().devices[device.index()]
            .context_cost
            .load(Ordering::Acquire)
        {
            0 => None,
            bytes => Some(bytes),
        }
    }

    pub fn throttle_words(&self, device: DeviceId) -> &[AtomicU64; THROTTLE_WORDS] {
        &self.map.layout().devices[device.index()].throttle
    }

    /// Records the host PID of `slot` once the shim learns it (e.g. from NVML).
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) {
        self.map.layout().slots[slot.index()]
            .host_pid
            .store(host_pid, Ordering::Relaxed);
    }

    pub fn context_created(&self, slot: SlotId, device: DeviceId) {
        self.map.layout().slots[slot.index()].contexts[device.index()]
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn context_destroyed(&self, slot: SlotId, device: DeviceId) {
        let counter = &self.map.layout().slots[slot.index()].contexts[device.index()];
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    pub fn snapshot(&self) -> RegionSnapshot {
        let probe = lock::open(&self.path, libc::O_RDONLY, false).ok();
        snapshot(&self.map, probe.as_ref())
    }

    fn lock_registration(&self) -> Result<RegistrationGuard, RegionError> {
        let fd = lock::open(&self.path, libc::O_RDWR, false)
            .map_err(|e| RegionError::io(&self.path, "open", e))?;
        let (dev, ino, _) = lock::fstat(&fd).map_err(|e| RegionError::io(&self.path, "stat", e))?;
        if (dev, ino) != (self.map.dev, self.map.ino) {
            return Err(RegionError::Replaced {
                path: self.path.clone(),
            });
        }
        lock::lock_wait(&fd, REGISTRATION_LOCK_OFFSET)
            .map_err(|e| RegionError::io(&self.path, "lock", e))?;
        Ok(RegistrationGuard { fd })
    }

    /// In a forked child, the parent's slot descriptors are copies that would keep the
    /// parent's slots looking alive after the parent dies; the child has no use for them.
    fn close_inherited_slot_locks(&self) {
        let me = std::process::id();
        for held in self.held.iter() {
            let fd = held.fd.load(Ordering::Relaxed);
            if fd >= 0 && held.owner_pid.load(Ordering::Relaxed) != me {
                held.fd.store(-1, Ordering::Relaxed);
                drop(OwnedFd::from_raw(fd));
            }
        }
    }

    fn claim_free_slot(&self, identity: &ProcessIdentity) -> Result<Option<SlotId>, RegionError> {
        let layout = self.map.layout();
        let fd = lock::open(&self.path, libc::O_RDWR, false)
            .map_err(|e| RegionError::io(&self.path, "open", e))?;
        for (index, slot) in layout.slots.iter().enumerate() {
            if slot.state.load(Ordering::Acquire) != SLOT_FREE {
                continue;
            }
            // A free slot whose lock is still held (a descendant inherited a dead owner's
            // descriptor) cannot be owned by us; skip it.
            let locked = lock::try_lock(&fd, slot_lock_offset(index))
                .map_err(|e| RegionError::io(&self.path, "lock a slot of", e))?;
            if !locked {
                continue;
            }
            slot.pid.store(identity.pid, Ordering::Relaxed);
            slot.host_pid.store(identity.host_pid, Ordering::Relaxed);
            slot.start_time
                .store(identity.start_time, Ordering::Relaxed);
            slot.pid_ns.store(identity.pid_ns, Ordering::Relaxed);
            slot.heartbeat.store(0, Ordering::Relaxed);
            slot.dead_since.store(0, Ordering::Relaxed);
            for (used, contexts) in slot.used.iter().zip(&slot.contexts) {
                used.store(0, Ordering::Relaxed);
                contexts.store(0, Ordering::Relaxed);
            }
            slot.state.store(SLOT_CLAIMED, Ordering::Release);
            let held = &self.held[index];
            held.owner_pid.store(std::process::id(), Ordering::Relaxed);
            held.fd.store(fd.into_raw(), Ordering::Relaxed);
            return Ok(Some(SlotId(index as u16)));
        }
        Ok(None)
    }

    fn reap_locked(
        &self,
        guard: &RegistrationGuard,
        mut released: impl FnMut(&DeadSlot) -> bool,
    ) -> ReapReport {
        let layout = self.map.layout();
        let mut report = ReapReport::default();
        let mut live = 0usize;
        let mut pending_bytes = [0u64; MAX_DEVICES];
        let now = monotonic_ns();
        for (index, slot) in claimed_slots(layout) {
            match judge(slot, index, Some(&guard.fd)) {
                Liveness::Stale => {
                    let dead = dead_slot(slot, index, now);
                    if released(&dead) {
                        let bytes = self.reclaim_slot(index);
                        report.reclaimed.push(ReclaimedSlot {
                            slot: dead.slot,
                            pid: dead.pid,
                            bytes,
                        });
                    } else {
                        for (sum, bytes) in pending_bytes.iter_mut().zip(dead.used_bytes) {
                            *sum = sum.saturating_add(bytes);
                        }
                        report.pending.push(PendingSlot {
                            slot: dead.slot,
                            pid: dead.pid,
                            bytes: dead.bytes(),
                        });
                    }
                }
                Liveness::Alive | Liveness::Unknown => live += 1,
            }
        }
        if live == 0 {
            // Nobody can be reserving: the totals must be exactly what pending slots hold.
            for (entry, keep) in layout.devices.iter().zip(pending_bytes) {
                let before = entry.used_bytes.swap(keep, Ordering::AcqRel);
                report.drift_cleared_bytes += before.saturating_sub(keep);
            }
        }
        report
    }

    /// Frees slot `index` (caller holds the registration lock), returning its bytes.
    fn reclaim_slot(&self, index: usize) -> u64 {
        let layout = self.map.layout();
        let slot = &layout.slots[index];
        let mut total = 0u64;
        for (device, entry) in layout.devices.iter().enumerate() {
            let bytes = slot.used[device].swap(0, Ordering::AcqRel);
            saturating_take(&entry.used_bytes, bytes);
            total = total.saturating_add(bytes);
            slot.contexts[device].store(0, Ordering::Relaxed);
        }
        slot.state.store(SLOT_FREE, Ordering::Release);
        // Our own descriptor for it (unregister, or a slot of ours judged dead) goes last, so
        // nobody sees the slot unlocked while it is still claimed.
        let held = &self.held[index];
        let fd = held.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            drop(OwnedFd::from_raw(fd));
        }
        total
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        for held in self.held.iter() {
            let fd = held.fd.swap(-1, Ordering::Relaxed);
            if fd >= 0 {
                drop(OwnedFd::from_raw(fd));
            }
        }
    }
}

impl RegionView {
    /// Opens an existing, initialised region read-only.
    pub fn open(path: &Path) -> Result<RegionView, RegionError> {
        let fd = lock::open(path, libc::O_RDONLY, false)
            .map_err(|e| RegionError::io(path, "open", e))?;
        // A creator has made the file but not sized it yet.
        if lock::fstat(&fd)
            .map_err(|e| RegionError::io(path, "stat", e))?
            .2
            == 0
        {
            return Err(RegionError::NotInitialised {
                path: path.to_path_buf(),
            });
        }
        let map = Mapping::map(path, &fd, false)?;
        validate(&map, path)?;
        Ok(RegionView {
            map,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn snapshot(&self) -> RegionSnapshot {
        let probe = lock::open(&self.path, libc::O_RDONLY, false).ok();
        snapshot(&self.map, probe.as_ref())
    }
}

/// Maps the file `lock_fd` is open on through a description of its own: a mapping keeps its
/// open file description alive, and with it any OFD lock taken through it, so the lock and the
/// mapping must never share one.
fn map_separately(path: &Path, lock_fd: &OwnedFd) -> Result<Mapping, RegionError> {
    let map_fd =
        lock::open(path, libc::O_RDWR, false).map_err(|e| RegionError::io(path, "open", e))?;
    let (dev, ino, _) = lock::fstat(lock_fd).map_err(|e| RegionError::io(path, "stat", e))?;
    let map = Mapping::map(path, &map_fd, true)?;
    if (map.dev, map.ino) != (dev, ino) {
        return Err(RegionError::Replaced {
            path: path.to_path_buf(),
        });
    }
    Ok(map)
}

fn set_len(path: &Path, fd: &OwnedFd, len: u64) -> Result<(), RegionError> {
    // SAFETY: fd is an open, writable descriptor.
    if unsafe { libc::ftruncate(fd.raw(), len as libc::off_t) } != 0 {
        return Err(RegionError::io(path, "resize", io::Error::last_os_error()));
    }
    Ok(())
}

fn validate(map: &Mapping, path: &Path) -> Result<(), RegionError> {
    let header = &map.layout().header;
    if header.init_state.load(Ordering::Acquire) != INIT_READY {
        let magic = header.magic.load(Ordering::Relaxed);
        if magic != 0 && magic != magic_word() {
            return Err(RegionError::Foreign {
                path: path.to_path_buf(),
                found_magic: magic.to_le_bytes(),
            });
        }
        return Err(RegionError::NotInitialised {
            path: path.to_path_buf(),
        });
    }
    let magic = header.magic.load(Ordering::Relaxed);
    if magic != magic_word() {
        return Err(RegionError::Foreign {
            path: path.to_path_buf(),
            found_magic: magic.to_le_bytes(),
        });
    }
    let checks: [(&'static str, u64, u64); 7] = [
        (
            "layout version",
            header.layout_version.load(Ordering::Relaxed).into(),
            LAYOUT_VERSION.into(),
        ),
        (
            "header size",
            header.header_size.load(Ordering::Relaxed).into(),
            HEADER_SIZE as u64,
        ),
        (
            "device entry size",
            header.device_entry_size.load(Ordering::Relaxed).into(),
            DEVICE_ENTRY_SIZE as u64,
        ),
        (
            "slot size",
            header.slot_size.load(Ordering::Relaxed).into(),
            SLOT_SIZE as u64,
        ),
        (
            "device count",
            header.max_devices.load(Ordering::Relaxed).into(),
            MAX_DEVICES as u64,
        ),
        (
            "process slot count",
            header.max_processes.load(Ordering::Relaxed).into(),
            MAX_PROCESSES as u64,
        ),
        (
            "total size",
            header.total_size.load(Ordering::Relaxed),
            REGION_SIZE as u64,
        ),
    ];
    for (what, found, expected) in checks {
        if found != expected {
            return Err(RegionError::Incompatible {
                path: path.to_path_buf(),
                what,
                found,
                expected,
            });
        }
    }
    Ok(())
}

/// An unready file may be initialised only if it is ours or blank (an interrupted init).
fn may_initialise(map: &Mapping) -> bool {
    let magic = map.layout().header.magic.load(Ordering::Relaxed);
    magic == 0 || magic == magic_word()
}

/// Writes a fresh, empty region (caller holds the registration lock).
fn initialise(map: &Mapping) {
    let header = &map.layout().header;
    let generation = header.generation.load(Ordering::Relaxed);
    header.init_state.store(INIT_EMPTY, Ordering::Release);
    for word in map.words() {
        word.store(0, Ordering::Relaxed);
    }
    for entry in &map.layout().devices {
        entry.memory_limit.store(UNLIMITED, Ordering::Relaxed);
    }
    header.magic.store(magic_word(), Ordering::Relaxed);
    header
        .layout_version
        .store(LAYOUT_VERSION, Ordering::Relaxed);
    header
        .header_size
        .store(HEADER_SIZE as u32, Ordering::Relaxed);
    header
        .device_entry_size
        .store(DEVICE_ENTRY_SIZE as u32, Ordering::Relaxed);
    header.slot_size.store(SLOT_SIZE as u32, Ordering::Relaxed);
    header
        .max_devices
        .store(MAX_DEVICES as u32, Ordering::Relaxed);
    header
        .max_processes
        .store(MAX_PROCESSES as u32, Ordering::Relaxed);
    header
        .total_size
        .store(REGION_SIZE as u64, Ordering::Relaxed);
    header
        .generation
        .store(generation.wrapping_add(1), Ordering::Relaxed);
    header.init_state.store(INIT_READY, Ordering::Release);
}

fn claimed_slots(layout: &RegionLayout) -> impl Iterator<Item = (usize, &ProcessSlot)> {
    layout
        .slots
        .iter()
        .enumerate()
        .filter(|(_, slot)| slot.state.load(Ordering::Acquire) == SLOT_CLAIMED)
}

/// Liveness of a claimed slot (module doc, "Liveness"). `probe` is any descriptor of the file
/// that does not itself hold the slot's lock; without one, liveness is unknown.
fn judge(slot: &ProcessSlot, index: usize, probe: Option<&OwnedFd>) -> Liveness {
    let Some(probe) = probe else {
        return Liveness::Unknown;
    };
    match lock::is_locked_by_other(probe, slot_lock_offset(index)) {
        Err(_) => Liveness::Unknown,
        Ok(false) => Liveness::Stale,
        Ok(true) => {
            let identity = ProcessIdentity {
                pid: slot.pid.load(Ordering::Relaxed),
                host_pid: slot.host_pid.load(Ordering::Relaxed),
                start_time: slot.start_time.load(Ordering::Relaxed),
                pid_ns: slot.pid_ns.load(Ordering::Relaxed),
            };
            if identity.same_namespace_as_current() && !identity.is_alive() {
                Liveness::Stale
            } else {
                Liveness::Alive
            }
        }
    }
}

fn snapshot(map: &Mapping, probe: Option<&OwnedFd>) -> RegionSnapshot {
    let layout = map.layout();
    let devices = layout
        .devices
        .iter()
        .enumerate()
        .filter_map(|(index, entry)| {
            let words = load_uuid(entry);
            (words != [0; UUID_BYTES / 8]).then(|| DeviceSnapshot {
                id: DeviceId(index as u8),
                uuid: uuid_from_words(&words),
                memory_limit: limit_option(entry.memory_limit.load(Ordering::Relaxed)),
                compute_percent: percent_option(entry.compute_percent.load(Ordering::Relaxed)),
                used_bytes: entry.used_bytes.load(Ordering::Relaxed),
                measured_utilization: match entry.measured_utilization.load(Ordering::Acquire) {
                    0 => None,
                    stored => Some(MeasuredUtilization {
                        basis_points: u32::try_from(stored - 1).unwrap_or(u32::MAX),
                        at_ns: entry.measured_at_ns.load(Ordering::Relaxed),
                    }),
                },
                context_cost: match entry.context_cost.load(Ordering::Acquire) {
                    0 => None,
                    bytes => Some(bytes),
                },
            })
        })
        .collect();
    let processes = claimed_slots(layout)
        .map(|(index, slot)| ProcessSnapshot {
            slot: SlotId(index as u16),
            pid: slot.pid.load(Ordering::Relaxed),
            host_pid: slot.host_pid.load(Ordering::Relaxed),
            start_time: slot.start_time.load(Ordering::Relaxed),
            pid_ns: slot.pid_ns.load(Ordering::Relaxed),
            used_bytes: std::array::from_fn(|d| slot.used[d].load(Ordering::Relaxed)),
            contexts: std::array::from_fn(|d| slot.contexts[d].load(Ordering::Relaxed)),
            liveness: judge(slot, index, probe),
        })
        .collect();
    RegionSnapshot {
        generation: layout.header.generation.load(Ordering::Acquire),
        devices,
        processes,
    }
}

fn load_uuid(entry: &DeviceEntry) -> [u64; UUID_BYTES / 8] {
    std::array::from_fn(|i| entry.uuid[i].load(Ordering::Relaxed))
}

/// The lower of two stored compute shares, where 0 means 100 (not throttled).
fn stricter_percent(a: u32, b: u32) -> u32 {
    let effective = |p: u32| if p == 0 { 100 } else { p };
    let lower = effective(a).min(effective(b));
    if lower >= 100 {
        0
    } else {
        lower
    }
}

fn limit_option(raw: u64) -> Option<u64> {
    (raw != UNLIMITED).then_some(raw)
}

fn percent_option(raw: u32) -> Option<u32> {
    (1..=99).contains(&raw).then_some(raw)
}

/// Describes a stale slot for `reap_dead_if`, stamping when it was first found dead.
fn dead_slot(slot: &ProcessSlot, index: usize, now: u64) -> DeadSlot {
    let identity = ProcessIdentity {
        pid: slot.pid.load(Ordering::Relaxed),
        host_pid: slot.host_pid.load(Ordering::Relaxed),
        start_time: slot.start_time.load(Ordering::Relaxed),
        pid_ns: slot.pid_ns.load(Ordering::Relaxed),
    };
    let exit = if !identity.same_namespace_as_current() {
        ExitState::Unknown
    } else if identity.is_alive() {
        ExitState::Exiting
    } else {
        ExitState::Exited
    };
    // First sighting wins; a stamp from the future (another time namespace) restarts the
    // clock rather than counting as expired.
    let seen = match slot
        .dead_since
        .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => now,
        Err(stamp) if stamp > now => {
            slot.dead_since.store(now, Ordering::Relaxed);
            now
        }
        Err(stamp) => stamp,
    };
    DeadSlot {
        slot: SlotId(index as u16),
        pid: identity.pid,
        host_pid: identity.host_pid,
        used_bytes: std::array::from_fn(|d| slot.used[d].load(Ordering::Relaxed)),
        exit,
        dead_for: std::time::Duration::from_nanos(now - seen),
    }
}

/// CLOCK_MONOTONIC in nanoseconds, never 0 (0 marks "not seen dead").
fn monotonic_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid to be overwritten.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .max(1)
}

/// Subtracts up to `amount` from `counter` without going below zero; returns what was taken.
fn saturating_take(counter: &AtomicU64, amount: u64) -> u64 {
    match counter.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |held| {
        Some(held - held.min(amount))
    }) {
        Ok(previous) => previous.min(amount),
        Err(_) => 0, // unreachable: the closure always returns Some
    }
}

#[cfg(test)]
mod tests;
