//! The shared region: one mmap'd file per slice, shared by every process of the container
//! (and by every container sharing the slice). It holds the container-wide memory ledger per
//! device and one fixed slot per process. The shim reserves and releases on it on every
//! allocation; the CLI reads a snapshot of it.
//!
//! Submodules: `layout` (the bytes), `ledger` (the words that hold the bytes and the protocol
//! that moves them), `lock` (kernel-released OFD locks, opening without following links),
//! `proc` (process identity), `open` (creating, validating, resetting, and the guard against a
//! replaced file), `slots` (registration, liveness, reaping), `devices` (binding device
//! entries and reconciling limits). This file owns the rules and the API.
//!
//! ## No process can hold up another
//! Nothing a process does with the region takes a lock that anyone waits for: registration,
//! binding, reserving, releasing and reaping are compare-and-swaps on the mapping plus
//! non-blocking OFD locks. So a process stopped anywhere (SIGSTOP, `docker pause`, a debugger
//! breakpoint, inside the shim included) or a child forked at any instant delays nobody.
//! The one wait left is for the in-place initialisation of an EMPTY file that somebody other
//! than gpuslice created (gpuslice itself never exposes an uninitialised file), bounded by
//! [`INIT_WAIT`].
//!
//! ## The ledger: one total per device, the slots for attribution
//! Each device entry holds the slice's bytes on it in one `total` word; each slot holds what
//! its process has reserved, per device. `reserve` is one compare-and-swap of the total from
//! what it read to that plus the request, made only while the result is within the limit, so
//! of two racing reservations the second is judged against the first's total and no two can
//! both be kept past the limit; a refused request changes nothing anyone can see. Reading the
//! slice's use (`usage`, every memory view) is one load. Neither depends on how many processes
//! the slice has or ever had: no operation on the hot paths walks the slots.
//!
//! The total and the slot are two words, so the one hard part is a process killed between
//! them: the total would then carry bytes no slot accounts for (or the other way round), and
//! the dead process's reaper would give back too much or too little. Submodule `ledger` makes
//! that impossible: a slot's operations run one at a time (a process-local turn: one process
//! has one slot), each records its intent in the slot before it touches the total, the total
//! carries a tag naming the slot and operation that last changed it, and whoever overwrites
//! another slot's tag first confirms that slot's intent. A reaper of a dead slot therefore
//! knows whether the operation it died in landed (the tag is still its own, or it was
//! confirmed), settles the slot to exactly its share of the totals, and gives that back with
//! ordinary operations in the slot's name; a reaper killed in turn leaves the same situation
//! for the next one. After a dead slot is reaped the totals equal what live slots hold,
//! exactly, whatever instruction the process died at: **drift is impossible by construction**,
//! and `reset` is never needed to repair counts. Nobody waits for a stopped process: a process
//! stopped in the middle of an operation holds only its own turn, and its neighbours'
//! compare-and-swaps go ahead (confirming its intent costs them one more compare-and-swap).
//!
//! ## Creation and validation
//! `Region::open_or_create` opens the file relative to its directory with `O_NOFOLLOW` (a
//! symbolic link at the region's name is refused, never followed or created through). A
//! missing file is created fully initialised and only then given its name (`O_TMPFILE` +
//! `linkat`, which never replaces anything), mode 0666 set with fchmod; the loser of a race
//! opens the winner's file. A file of any size but [`REGION_SIZE`] is refused *before* mapping
//! it, so a truncated file can never be touched past its end by a new process. A right-sized
//! file is validated (magic, layout version, struct sizes, counts).
//!
//! **Corrupt-file rule:** a foreign, truncated or incompatible file is never repaired
//! implicitly: every open returns a `RegionError` naming the path and what is wrong, and the
//! shim fails closed. `Region::reset(path)` (for `gpuslice`) replaces it with a fresh file by
//! rename (never writing through the old file or a link), and refuses while any process maps
//! the region or a live process holds a slot.
//!
//! **Replaced or deleted file:** every process that maps the region marks it with two OFD
//! WRITE locks (module `open`, "Marks"): one on the region file it mapped, one on the guard
//! file beside it (`.NAME.guard`), which outlives any replacement of the region file. A
//! process opening a region whose name is marked by others while nobody marks the file it
//! opened knows the slice's live ledger is another (deleted or renamed-over) file: it refuses
//! with [`RegionError::Replaced`] (the shim fails closed with one line naming the file)
//! instead of starting a second ledger. Processes already running keep the one ledger they
//! share. Only write locks count, and they need write access: a reader of the directory or
//! the files (which can take any read lock) can make no process refuse. Truncating the file under running processes cannot be survived by any
//! mapping (Linux cannot seal a regular file; pages past the new end fault with SIGBUS): it
//! only harms the slice's own processes, and new processes refuse the wrong-sized file.
//!
//! **Limits rule:** the header's device entries hold the limits in force, keyed by device UUID
//! (indices differ between processes with different `CUDA_VISIBLE_DEVICES`; UUIDs do not).
//! `Region::bind_devices` reconciles the caller's configured limits with them:
//! * when no other live process holds a slot, the configuration replaces the entry's limits (a
//!   changed limit file takes effect with the first process of the next run);
//! * while other processes live, the stricter of the two stays in force (lower memory limit,
//!   lower compute share): a tighter limit file applies at once, but one process started with
//!   a missing or looser configuration (an `ssh` session without the env, an old file) can
//!   never lift the cap for everyone. A looser limit applies once the others have exited, or
//!   after `gpuslice` resets the region.
//!
//! Each limit word is changed by compare-and-swap from the value the decision was made on, so
//! a binder that decided "nobody else lives" cannot overwrite a stricter limit another binder
//! stored meanwhile. Every difference between configuration and entry is returned as a
//! `LimitChange` for the shim to log. Lowering a limit below current use evicts nobody: new
//! reservations fail until use drops under it.
//!
//! ## Liveness: who owns a slot
//! The owner of a slot holds an OFD write lock on that slot's first byte, through a descriptor
//! opened for that registration (close-on-exec). The kernel drops the lock when the owner dies
//! (SIGKILL included) or execs, so "nobody holds the slot lock" means dead, across PID
//! namespaces too. The lock can outlive its owner in one case: a child forked while the parent
//! was registered inherits the descriptor (the shim closes it in its fork handler). So a held
//! lock is additionally checked against the slot's PID and start time when the slot is from
//! our own PID namespace: a missing PID, a zombie, or a different start time (PID reuse) is
//! dead. Claiming takes the free slot's lock first, then moves its state word from free to
//! claimed (one CAS that also counts the claim), so two claimants never share a slot.
//!
//! ## Reaping: a dead slot's bytes return only once the driver has let go
//! The slot lock is one descriptor among the process's others: the kernel closes them one by
//! one as the process exits, and the driver frees the process's device memory when ITS
//! descriptors close (a real driver may even defer that teardown). So "the slot lock is free"
//! can be seen while the driver still holds the dead process's memory; giving its budget back
//! then would let another process allocate it while it is still physically in use. Reaping is
//! therefore two-phase ([`Region::reap_dead_if`]): each stale slot is described as a
//! [`DeadSlot`] (its bytes, host PID, how far its owner has got in exiting per /proc, how long
//! it has been seen dead) and the caller decides whether the driver has released it (the shim
//! asks NVML's process list). Undecided slots stay claimed and charged (`ReapReport::pending`).
//! [`Region::reap_dead`] frees only what returns no budget: dead slots holding nothing. No
//! timer of the region gives a dead slot's bytes back: a slow driver keeps them charged for
//! as long as it holds the memory ([`RELEASE_TIMEOUT`] is for the caller's judge, when
//! nothing at all can tell).
//! A reaper frees a slot under the slot's reclaim lock (its second byte, non-blocking: a
//! second reaper skips the slot) with a CAS naming the claim generation it judged, so a slot
//! re-claimed meanwhile is never freed.

mod deaths;
mod devices;
mod futex;
mod layout;
mod ledger;
mod listing;
mod lock;
mod open;
mod proc;
mod slots;

pub use deaths::{Member, MemberLookup, SweepReason, START_SWEEP_SLOTS, SWEEP_INTERVAL};
pub use layout::{
    measuring_turn_offset, slot_lock_offset, slot_reclaim_offset, DEVICE_ENTRY_SIZE, HEADER_SIZE,
    INIT_LOCK_OFFSET, LAYOUT_VERSION, MAGIC, MAX_DEVICES, MAX_PROCESSES, REGION_SIZE, SLOTS_OFFSET,
    SLOT_SIZE, THROTTLE_WORDS, UUID_BYTES,
};
pub use listing::ListingTicket;
pub use open::INIT_WAIT;
pub use proc::{own_pid_namespace, parse_stat, ProcessIdentity, StatFields};

use crate::turn::{Turn, TurnGuard};
use layout::{uuid_from_words, DeviceEntry, RegionLayout, LIMIT_UNSET, UNLIMITED};
use lock::OwnedFd;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

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
    /// The path now names a different file than the one this process mapped, or the slice's
    /// live processes use another file (deleted or renamed over) than the one at the path.
    Replaced { path: PathBuf },
    /// The file is empty or blank (truncated or zeroed) while processes of the slice map
    /// it: initialising it afresh would start a second ledger.
    Emptied { path: PathBuf },
    /// A symbolic link is at the region's name: never followed.
    Symlink { path: PathBuf },
    /// Something other than a regular file is at the region's name.
    NotAFile { path: PathBuf },
    /// An empty file somebody else created is being initialised by a process that has not
    /// finished within [`INIT_WAIT`] (stopped, or killed: then retrying succeeds).
    InitTimeout { path: PathBuf },
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
                "shared region {}: the slice's running processes use another file than the one now at this path (it was deleted or replaced while they run); refusing to start a second ledger: stop the slice's processes, or put the file back",
                path.display()
            ),
            RegionError::Emptied { path } => write!(
                f,
                "shared region {}: the file was emptied (truncated or zeroed) while processes of the slice map it; refusing to start a second ledger in it: stop the slice's processes, then `gpuslice reset --region {}`",
                path.display(),
                path.display()
            ),
            RegionError::Symlink { path } => write!(
                f,
                "shared region {}: is a symbolic link; a region is never opened through one (remove the link)",
                path.display()
            ),
            RegionError::NotAFile { path } => write!(
                f,
                "shared region {}: is not a regular file",
                path.display()
            ),
            RegionError::InitTimeout { path } => write!(
                f,
                "shared region {}: the empty file is being initialised by another process that has not finished within {} ms",
                path.display(),
                INIT_WAIT.as_millis()
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
            RegionError::InUse { path, pids } if pids.is_empty() => write!(
                f,
                "shared region {}: still mapped by running processes (in another PID namespace); stop them first",
                path.display()
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
    /// Its host PID is our PID namespace's and now names another running process: an NVML
    /// entry under that PID may be the newcomer's, not the dead process's.
    pub host_pid_reused: bool,
    /// Time since a reap first found it dead (0 on that first reap).
    pub dead_for: std::time::Duration,
}

/// How long a dead slot stays charged, after a process of the slice first found it dead, when
/// the driver cannot be asked whether it released its memory (no NVML answer, or no host PID),
/// so that a dead process's budget is never lost for good; the kernel's word that the owner
/// exited does not shorten it (a driver may free the memory later). A judge that has the
/// driver's word (NVML lists the host PID) never uses it: a slow driver keeps the budget
/// charged for as long as it holds the memory.
pub const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl DeadSlot {
    /// The region's own evidence: the owner has finished exiting (every descriptor closed,
    /// the driver's included), or [`RELEASE_TIMEOUT`] has passed. Not proof that the driver
    /// has freed the memory (a real driver may tear down later); the shim asks NVML.
    pub fn exited_or_timed_out(&self) -> bool {
        self.exit == ExitState::Exited || self.dead_for >= RELEASE_TIMEOUT
    }

    /// Freeing it returns no budget: it holds nothing. What `reap_dead` and `register` use.
    pub fn holds_nothing(&self) -> bool {
        self.bytes() == 0
    }

    pub fn bytes(&self) -> u64 {
        self.used_bytes
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(*b))
    }
}

impl ReapReport {
    pub fn bytes_reclaimed(&self) -> u64 {
        self.reclaimed.iter().map(|r| r.bytes).sum::<u64>()
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

impl ProcessSnapshot {
    /// Whether this slot's process has exited and the driver no longer holds its memory, by
    /// the evidence the shim itself reaps on: with its host PID known, the driver's word
    /// (`listed`: whether the driver lists a host PID, `None`: it cannot be asked); without
    /// one (a process that never had to ask NVML who it is), the kernel's, where the slot is
    /// of the reader's PID namespace: gone or a zombie, every descriptor closed, the
    /// driver's included. What readers (`gpuslice status`, the node agent) leave out of the
    /// slice's use before a starting process reaps the slot; otherwise the bytes stay
    /// counted (the driver may hold them still).
    pub fn exited_and_released(&self, listed: &dyn Fn(u32) -> Option<bool>) -> bool {
        if self.liveness != Liveness::Stale {
            return false;
        }
        if self.host_pid != 0 {
            return listed(self.host_pid) == Some(false);
        }
        let identity = ProcessIdentity {
            pid: self.pid,
            host_pid: 0,
            start_time: self.start_time,
            pid_ns: self.pid_ns,
        };
        identity.same_namespace_as_current() && !identity.is_alive()
    }
}

impl RegionSnapshot {
    /// Bytes on device entry `entry` of slots whose process exited and whose memory the
    /// driver has released ([`ProcessSnapshot::exited_and_released`]): counted by the ledger
    /// until a process of the slice reaps them, used by nobody.
    pub fn released_bytes(&self, entry: usize, listed: &dyn Fn(u32) -> Option<bool>) -> u64 {
        self.processes
            .iter()
            .filter(|p| p.exited_and_released(listed))
            .map(|p| p.used_bytes.get(entry).copied().unwrap_or(0))
            .fold(0u64, u64::saturating_add)
    }
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

/// Counters the slice's processes keep in the region (they survive the processes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceCounters {
    /// Processes that failed closed after opening the region.
    pub fail_closed_events: u64,
    /// Per bound device entry: (entry, allocations refused, launch wait in nanoseconds).
    pub devices: Vec<(DeviceId, u64, u64)>,
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
    /// Maps `fd` if it is a regular file of exactly `REGION_SIZE` bytes (checked here, before
    /// mapping, so a short file is never touched past its end).
    fn map(path: &Path, fd: &OwnedFd, writable: bool) -> Result<Mapping, RegionError> {
        let facts = lock::fstat(fd).map_err(|e| RegionError::io(path, "stat", e))?;
        if !facts.regular {
            return Err(RegionError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        if facts.size != REGION_SIZE as u64 {
            return Err(RegionError::WrongSize {
                path: path.to_path_buf(),
                found: facts.size,
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
            dev: facts.dev,
            ino: facts.ino,
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

/// This process's descriptor holding one lock (a slot's liveness, a measuring turn), and for
/// a slot, the process-local turn that serialises the ledger operations of its threads.
struct HeldSlot {
    fd: AtomicI32,
    owner_pid: AtomicU32,
    busy: Turn,
}

impl HeldSlot {
    fn none() -> HeldSlot {
        HeldSlot {
            fd: AtomicI32::new(-1),
            owner_pid: AtomicU32::new(0),
            busy: Turn::new(),
        }
    }

    /// Waits for the slot's turn among this process's threads: held for the few dozen
    /// instructions of one ledger operation, by nobody outside this process (a stopped
    /// process stops its own threads only).
    #[inline(always)]
    fn turn(&self) -> TurnGuard<'_> {
        self.busy.take()
    }
}

/// A region opened for reading and writing (the shim).
pub struct Region {
    map: Mapping,
    path: PathBuf,
    /// The mapped file itself (fresh descriptions for locks are opened through it, so they
    /// always name the file this process maps, whatever happens to its name).
    file: OwnedFd,
    /// The region's directory and the file's name in it.
    dir: OwnedFd,
    name: CString,
    /// The guard file's description holding this process's mark on the region's name
    /// (`open`), kept only for its lock; `None` where the guard file cannot be opened for
    /// writing (then a replaced file cannot be detected). The mark on the file itself is on
    /// `file`.
    _guard: Option<OwnedFd>,
    held: Box<[HeldSlot]>,
    /// This process's descriptors holding a device's measuring turn.
    turns: Box<[HeldSlot]>,
    /// This process's index of the slice's members (`deaths`).
    members: deaths::MemberCache,
}

/// A region opened read-only (the CLI): snapshots only, no locks taken, no write access needed.
pub struct RegionView {
    map: Mapping,
    path: PathBuf,
}

impl Region {
    /// Opens the region at `path`, creating it (initialised) if it does not exist. See the
    /// module doc for what is refused.
    pub fn open_or_create(path: &Path) -> Result<Region, RegionError> {
        open::open_or_create(path)
    }

    /// Opens an existing, initialised region read-only (the CLI; needs only read permission).
    pub fn open_existing(path: &Path) -> Result<RegionView, RegionError> {
        RegionView::open(path)
    }

    /// Replaces the region at `path` with a fresh, empty one (creating it if missing),
    /// whatever it held: the way out of a corrupt, truncated or foreign file. Refused while a
    /// process maps the region or a live process holds a slot, and for a symbolic link.
    pub fn reset(path: &Path) -> Result<(), RegionError> {
        open::reset(path)
    }

    /// `Ok` when no process maps the region at `path` and no live process holds a slot of it
    /// (a missing file counts as unused); [`RegionError::InUse`] with the live PIDs otherwise.
    pub fn check_unused(path: &Path) -> Result<(), RegionError> {
        open::check_unused(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The UUID a device entry is bound to (empty for an unused entry).
    pub fn device_uuid(&self, device: DeviceId) -> String {
        uuid_from_words(&load_uuid(&self.map.layout().devices[device.index()]))
    }

    /// The entry bound to `uuid` (compared without regard to case), if one is.
    pub fn device_named(&self, uuid: &str) -> Option<DeviceId> {
        self.map
            .layout()
            .devices
            .iter()
            .position(|entry| {
                entry.key.load(Ordering::Acquire) != 0
                    && uuid_from_words(&load_uuid(entry)).eq_ignore_ascii_case(uuid)
            })
            .map(|index| DeviceId(index as u8))
    }

    /// Reserves `bytes` on `device` for `slot`, or refuses without keeping anything when the
    /// container-wide use would pass the limit. Lock-free and O(1); see "The ledger".
    #[inline(always)]
    pub fn reserve(&self, slot: SlotId, device: DeviceId, bytes: u64) -> Result<(), OverLimit> {
        let limit = stored_limit(
            self.map.layout().devices[device.index()]
                .memory_limit
                .load(Ordering::Relaxed),
        );
        match self.operate(slot, device, ledger::Change::Reserve { bytes, limit }) {
            ledger::Outcome::Refused { used } => Err(OverLimit {
                limit,
                used,
                requested: bytes,
            }),
            _ => Ok(()),
        }
    }

    /// Adds `bytes` on `device` for `slot` even past the limit: for memory the driver already
    /// holds and could not be made to give back, so the total matches the card and later
    /// reservations are refused. Lock-free. (Nothing is added past 256 TiB, the most a
    /// ledger word carries and more than any device holds.)
    #[inline]
    pub fn reserve_past_limit(&self, slot: SlotId, device: DeviceId, bytes: u64) {
        self.operate(slot, device, ledger::Change::PastLimit { bytes });
    }

    /// Returns up to `bytes` of `slot`'s reservation on `device` (never below zero). Returns
    /// the bytes actually released.
    #[inline(always)]
    pub fn release(&self, slot: SlotId, device: DeviceId, bytes: u64) -> u64 {
        match self.operate(slot, device, ledger::Change::Release { bytes }) {
            ledger::Outcome::Done(taken) => taken,
            _ => 0,
        }
    }

    /// One ledger operation in `slot`'s name, serialised with this process's other operations
    /// on the slot (the protocol needs one at a time per slot; a slot is one process's, so the
    /// turn is process-local and uncontended unless two of its threads meet).
    #[inline(always)]
    fn operate(&self, slot: SlotId, device: DeviceId, change: ledger::Change) -> ledger::Outcome {
        let _turn = self.held[slot.index()].turn();
        ledger::apply(
            self.map.layout(),
            slot.index(),
            device.index(),
            change,
            |_| true,
        )
    }

    /// Limit and container-wide use of `device` (for cuMemGetInfo-style answers): two loads.
    #[inline]
    pub fn usage(&self, device: DeviceId) -> DeviceUsage {
        let entry = &self.map.layout().devices[device.index()];
        DeviceUsage {
            limit: limit_option(stored_limit(entry.memory_limit.load(Ordering::Relaxed))),
            used: ledger::total_bytes(self.map.layout(), device.index()),
        }
    }

    /// Bytes `slot` holds on `device`.
    pub fn slot_used(&self, slot: SlotId, device: DeviceId) -> u64 {
        ledger::held_bytes(self.map.layout(), slot.index(), device.index())
    }

    /// Compute share of `device`; `None` = not throttled.
    pub fn compute_percent(&self, device: DeviceId) -> Option<u32> {
        percent_option(
            self.map.layout().devices[device.index()]
                .compute_percent
                .load(Ordering::Relaxed),
        )
    }

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

    /// One past the highest slot index any process of the slice ever claimed: at least as
    /// many as the slice's live processes.
    pub fn slot_high_water(&self) -> u32 {
        self.map
            .layout()
            .header
            .slot_high_water
            .load(Ordering::Acquire)
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

    /// Counts an allocation the slice refused on `device`.
    pub fn count_refusal(&self, device: DeviceId) {
        self.map.layout().devices[device.index()]
            .refused_allocations
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `ns` nanoseconds that a launch on `device` waited for the compute share.
    pub fn add_throttled_ns(&self, device: DeviceId, ns: u64) {
        saturating_add(&self.map.layout().devices[device.index()].throttled_ns, ns);
    }

    /// Counts a process of the slice that failed closed after opening the region.
    pub fn count_fail_closed(&self) {
        self.map
            .layout()
            .header
            .fail_closed_events
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn counters(&self) -> SliceCounters {
        counters(&self.map)
    }

    /// The words reserved for the compute throttle of `device`.
    pub fn throttle_words(&self, device: DeviceId) -> &[AtomicU64; THROTTLE_WORDS] {
        &self.map.layout().devices[device.index()].throttle
    }

    /// Records the host PID of `slot` once the shim learns it (e.g. from NVML).
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) {
        let layout = self.map.layout();
        if layout.slots[slot.index()]
            .host_pid
            .swap(host_pid, Ordering::AcqRel)
            != host_pid
        {
            deaths::membership_changed(layout);
        }
    }

    pub fn context_created(&self, slot: SlotId, device: DeviceId) {
        self.map.layout().slots[slot.index()].contexts[device.index()]
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Marks that `slot` is making its first context on `device` under a reservation that may
    /// stand above the context's cost (the bound), until [`Region::context_start_ended`].
    pub fn context_start_begun(&self, slot: SlotId, device: DeviceId) {
        self.map.layout().slots[slot.index()]
            .starting_contexts
            .fetch_or(1 << device.index(), Ordering::AcqRel);
    }

    /// `slot`'s first context on `device` settled (or was not made): its reservation is what
    /// the context costs. With `room_came_back` (a reservation above the cost was settled
    /// or given back) that room may let a process waiting for the turn start alongside: a
    /// few of them are woken (waking all would wake a storm's every waiter for each start
    /// that settles; a start that never reserved wakes nobody, or failed tries would wake
    /// each other in a chain).
    pub fn context_start_ended(&self, slot: SlotId, device: DeviceId, room_came_back: bool) {
        self.map.layout().slots[slot.index()]
            .starting_contexts
            .fetch_and(!(1 << device.index()), Ordering::AcqRel);
        if room_came_back {
            // The word is not moved: a waiter about to sleep would look again at once, and a
            // storm's waiters would spin instead of sleeping. One that misses this wake looks
            // again at its next pause.
            futex::wake(&self.map.layout().devices[device.index()].turn_changes, 2);
        }
    }

    /// Whether a running process of the slice other than `slot` is making its first context
    /// on `device` under a reservation that may stand above its cost: room it holds now may
    /// come back within moments. A dead owner's mark does not count, nor a stopped one's
    /// where its PID namespace is ours (it will not settle while stopped). One lock probe per
    /// marked slot, so only a short-of-room caller asks.
    pub fn context_starts_elsewhere(&self, slot: SlotId, device: DeviceId) -> bool {
        let bit = 1 << device.index();
        slots::claimed_slots(self.map.layout()).any(|(index, other, _)| {
            index != slot.index()
                && other.starting_contexts.load(Ordering::Acquire) & bit != 0
                && slots::judge(other, index, Some(&self.file)) != Liveness::Stale
                && !slots::owner_stopped(other)
        })
    }

    pub fn context_destroyed(&self, slot: SlotId, device: DeviceId) {
        let counter = &self.map.layout().slots[slot.index()].contexts[device.index()];
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    pub fn snapshot(&self) -> RegionSnapshot {
        let probe = self.reopen(libc::O_RDONLY).ok();
        snapshot(&self.map, probe.as_ref())
    }

    /// A new open file description of the file this process maps (OFD locks belong to a
    /// description, so every lock holder needs its own). Through /proc/self/fd, which names
    /// the mapped file whatever has happened to its name; else by name, checked to be it.
    fn reopen(&self, flags: libc::c_int) -> Result<OwnedFd, RegionError> {
        let fresh = lock::open(
            Path::new(&format!("/proc/self/fd/{}", self.file.raw())),
            flags,
        )
        .or_else(|_| lock::open_at_nofollow(&self.dir, &self.name, flags))
        .map_err(|e| RegionError::io(&self.path, "open", e))?;
        let facts = lock::fstat(&fresh).map_err(|e| RegionError::io(&self.path, "stat", e))?;
        if (facts.dev, facts.ino) != (self.map.dev, self.map.ino) {
            return Err(RegionError::Replaced {
                path: self.path.clone(),
            });
        }
        Ok(fresh)
    }

    /// Closes, in a forked child, the parent's slot descriptors it inherited (they would keep
    /// the parent's slots looking alive after the parent dies). Only atomics and close(2):
    /// safe to call from a fork handler.
    pub fn close_inherited_slot_locks(&self) {
        let me = std::process::id();
        for held in self.held.iter().chain(self.turns.iter()) {
            let fd = held.fd.load(Ordering::Relaxed);
            if fd >= 0 && held.owner_pid.load(Ordering::Relaxed) != me {
                held.fd.store(-1, Ordering::Relaxed);
                drop(OwnedFd::from_raw(fd));
                // A parent's thread may have been mid-operation at the fork; it does not
                // exist here.
                held.busy.reset();
            }
        }
        self.members.reset_turn();
    }
}

/// A device's measuring turn, held until dropped (see [`Region::try_measuring_turn`]).
pub struct MeasuringTurn<'a> {
    region: &'a Region,
    device: DeviceId,
}

impl Drop for MeasuringTurn<'_> {
    fn drop(&mut self) {
        let entry = &self.region.map.layout().devices[self.device.index()];
        entry.measuring_pid.store(0, Ordering::Release);
        let fd = self.region.turns[self.device.index()]
            .fd
            .swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            drop(OwnedFd::from_raw(fd));
        }
        // The waiters wake to what the holder published (and to a free turn).
        entry.turn_changes.fetch_add(1, Ordering::AcqRel);
        futex::wake_all(&entry.turn_changes);
    }
}

impl Region {
    /// Takes `device`'s measuring turn if nobody holds it: one process of the slice at a
    /// time creates and measures a first context there. Never waits; a kernel-released OFD
    /// lock (a holder that dies drops it) whose descriptor a forked child closes at once.
    /// `Ok(None)` = another process holds it.
    pub fn try_measuring_turn(
        &self,
        device: DeviceId,
    ) -> Result<Option<MeasuringTurn<'_>>, RegionError> {
        let held = &self.turns[device.index()];
        if held.fd.load(Ordering::Relaxed) >= 0
            && held.owner_pid.load(Ordering::Relaxed) == std::process::id()
        {
            return Ok(None); // another thread of ours holds it
        }
        let fd = self.reopen(libc::O_RDWR)?;
        let offset = layout::measuring_turn_offset(device.index());
        if !lock::try_lock(&fd, offset).map_err(|e| RegionError::io(&self.path, "lock", e))? {
            return Ok(None);
        }
        let me = ProcessIdentity::current();
        let entry = &self.map.layout().devices[device.index()];
        entry
            .measuring_pid_ns
            .store(me.map_or(0, |m| m.pid_ns), Ordering::Relaxed);
        entry
            .measuring_pid
            .store(u64::from(std::process::id()), Ordering::Release);
        held.owner_pid.store(std::process::id(), Ordering::Relaxed);
        held.fd.store(fd.into_raw(), Ordering::Relaxed);
        Ok(Some(MeasuringTurn {
            region: self,
            device,
        }))
    }

    /// Whether nobody holds `device`'s measuring turn (one probe of its lock, through the
    /// mapped file's description, which holds none).
    pub fn measuring_turn_free(&self, device: DeviceId) -> bool {
        !lock::is_locked_by_other(&self.file, layout::measuring_turn_offset(device.index()))
            .unwrap_or(true)
    }

    /// How many times `device`'s measuring turn was given back: read it, check what the
    /// holder publishes, then [`Region::wait_for_turn_change`] with it.
    pub fn turn_changes(&self, device: DeviceId) -> u32 {
        self.map.layout().devices[device.index()]
            .turn_changes
            .load(Ordering::Acquire)
    }

    /// Sleeps until `device`'s measuring turn is given back after `seen`
    /// ([`Region::turn_changes`]), at most `timeout` (a holder killed while holding wakes
    /// nobody: its waiters notice at their timeout).
    pub fn wait_for_turn_change(&self, device: DeviceId, seen: u32, timeout: Duration) {
        futex::wait_while(
            &self.map.layout().devices[device.index()].turn_changes,
            seen,
            timeout,
        );
    }

    /// The PID (in its own namespace) that last took the measuring turn of `device` (0 =
    /// none yet): a waiter sees turns pass by its changes.
    pub fn measuring_holder(&self, device: DeviceId) -> u64 {
        self.map.layout().devices[device.index()]
            .measuring_pid
            .load(Ordering::Acquire)
    }

    /// Whether the holder of `device`'s measuring turn is stopped or traced (SIGSTOP, a
    /// debugger, `docker pause`): waiting for it is then pointless. False when unknown
    /// (no holder recorded, or one in another PID namespace).
    pub fn measuring_holder_stopped(&self, device: DeviceId) -> bool {
        let entry = &self.map.layout().devices[device.index()];
        let pid = entry.measuring_pid.load(Ordering::Acquire);
        let ns = entry.measuring_pid_ns.load(Ordering::Relaxed);
        if pid == 0 || ns == 0 {
            return false;
        }
        let holder = ProcessIdentity {
            pid: pid as u32,
            host_pid: 0,
            start_time: 0,
            pid_ns: ns,
        };
        holder.same_namespace_as_current() && proc::is_stopped(holder.pid)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        for held in self.held.iter().chain(self.turns.iter()) {
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
        let fd = open::open_file_readonly(path)?;
        // A file nobody has initialised (an empty file somebody else created).
        if lock::fstat(&fd)
            .map_err(|e| RegionError::io(path, "stat", e))?
            .size
            == 0
        {
            return Err(RegionError::NotInitialised {
                path: path.to_path_buf(),
            });
        }
        let map = Mapping::map(path, &fd, false)?;
        open::validate(&map, path)?;
        Ok(RegionView {
            map,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (device, inode) of the file this view maps: what `/proc/PID/maps` names it by.
    pub fn file_id(&self) -> (u64, u64) {
        (self.map.dev, self.map.ino)
    }

    pub fn counters(&self) -> SliceCounters {
        counters(&self.map)
    }

    pub fn snapshot(&self) -> RegionSnapshot {
        let probe = open::open_file_readonly(&self.path).ok().filter(|fd| {
            lock::fstat(fd)
                .map(|f| (f.dev, f.ino) == (self.map.dev, self.map.ino))
                .unwrap_or(false)
        });
        snapshot(&self.map, probe.as_ref())
    }
}

fn counters(map: &Mapping) -> SliceCounters {
    let layout = map.layout();
    SliceCounters {
        fail_closed_events: layout.header.fail_closed_events.load(Ordering::Relaxed),
        devices: layout
            .devices
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.key.load(Ordering::Acquire) != 0)
            .map(|(index, entry)| {
                (
                    DeviceId(index as u8),
                    entry.refused_allocations.load(Ordering::Relaxed),
                    entry.throttled_ns.load(Ordering::Relaxed),
                )
            })
            .collect(),
    }
}

fn snapshot(map: &Mapping, probe: Option<&OwnedFd>) -> RegionSnapshot {
    let layout = map.layout();
    let devices = layout
        .devices
        .iter()
        .enumerate()
        .filter(|(_, entry)| entry.key.load(Ordering::Acquire) != 0)
        .map(|(index, entry)| DeviceSnapshot {
            id: DeviceId(index as u8),
            uuid: uuid_from_words(&load_uuid(entry)),
            memory_limit: limit_option(stored_limit(entry.memory_limit.load(Ordering::Relaxed))),
            compute_percent: percent_option(entry.compute_percent.load(Ordering::Relaxed)),
            used_bytes: ledger::total_bytes(layout, index),
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
        .collect();
    let processes = slots::claimed_slots(layout)
        .map(|(index, slot, _)| ProcessSnapshot {
            slot: SlotId(index as u16),
            pid: slot.pid.load(Ordering::Relaxed),
            host_pid: slot.host_pid.load(Ordering::Relaxed),
            start_time: slot.start_time.load(Ordering::Relaxed),
            pid_ns: slot.pid_ns.load(Ordering::Relaxed),
            used_bytes: std::array::from_fn(|d| {
                ledger::bytes_of(slot.used[d].load(Ordering::Relaxed))
            }),
            contexts: std::array::from_fn(|d| slot.contexts[d].load(Ordering::Relaxed)),
            liveness: slots::judge(slot, index, probe),
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

/// A stored memory limit as the ledger applies it: an entry whose limit nobody has written
/// yet allows nothing (see `LIMIT_UNSET`).
fn stored_limit(raw: u64) -> u64 {
    if raw == LIMIT_UNSET {
        0
    } else {
        raw
    }
}

fn limit_option(raw: u64) -> Option<u64> {
    (raw != UNLIMITED).then_some(raw)
}

fn percent_option(raw: u32) -> Option<u32> {
    (1..=99).contains(&raw).then_some(raw)
}

/// CLOCK_MONOTONIC in nanoseconds, never 0 (0 marks "not seen dead").
fn monotonic_ns() -> u64 {
    crate::clock::now_ns().max(1)
}

/// Adds `amount` to `counter`, saturating.
fn saturating_add(counter: &AtomicU64, amount: u64) {
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::Relaxed, |held| {
        Some(held.saturating_add(amount))
    });
}

#[cfg(test)]
mod tests;
