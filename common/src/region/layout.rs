//! The bytes of a region file: `repr(C)` structs made only of atomics (every field may be read
//! by one process while another writes it, so plain fields would be data races), their sizes
//! and offsets, and typed access to a mapping of exactly [`REGION_SIZE`] bytes.
//!
//! ```text
//! offset  size                      what
//! 0       128                       Header (magic, layout version, sizes, init state)
//! 128     16 x 320 = 5120           DeviceEntry[MAX_DEVICES]   (limits, total, throttle)
//! 5248    1024 x 256 = 262144       ProcessSlot[MAX_PROCESSES] (never move once claimed)
//! 267392                            end (REGION_SIZE)
//! ```
//!
//! OFD lock bytes (locks only, the bytes' contents are unrelated; offsets past the end of the
//! file are fine for locks): byte 0 serialises the
//! in-place initialisation of an empty file (the only lock anyone ever waits for, and only
//! for a bounded time); the first byte of each slot is that slot's liveness lock, held by its
//! owner for its whole life; the second byte is the slot's reclaim lock, held by a reaper
//! for the few stores that free a dead owner's slot (it also makes the reaper the one writer
//! of the dead slot's ledger words); the bytes from [`MEASURING_TURNS`] on are the devices'
//! measuring turns; in [`MARKS`] every process that maps the file holds a write lock on a
//! byte of its own (its mark, found by a reader's probe of the whole range; the same range of
//! the region's guard file carries the same marks by name: `region::open`). Nothing a process
//! does with the ledger takes a lock.

use std::sync::atomic::{AtomicU32, AtomicU64};

pub use crate::MAX_DEVICES;

/// First 8 bytes of every region file.
pub const MAGIC: [u8; 8] = *b"GPUSLICE";
/// Bumped on any incompatible change of the structs below. 2: the device totals are derived
/// from the slots (no `used_bytes` word), entries are claimed by a UUID key, slot states carry
/// a generation, and the header records the slot high-water mark. 3: each device entry keeps
/// a tagged total that reservations compare-and-swap against the limit, slots' `used` words
/// carry a sequence number above their bytes, and each slot records its in-flight operation
/// (`intent`): see `region::ledger`. 4: the processes that map a region mark it, and its
/// name in the guard file beside it, with write locks in [`MARKS`] instead of read locks on
/// the directory (which any reader could take), so processes of versions 3 and 4 would not
/// see each other's marks.
pub const LAYOUT_VERSION: u32 = 4;
/// Process slots per region (all processes of all containers sharing the slice).
pub const MAX_PROCESSES: usize = 1024;
/// Bytes of the NUL-padded device UUID.
pub const UUID_BYTES: usize = 64;
/// Words reserved per device for the compute throttle.
pub const THROTTLE_WORDS: usize = 16;

pub const HEADER_SIZE: usize = 128;
pub const DEVICE_ENTRY_SIZE: usize = 320;
pub const SLOT_SIZE: usize = 256;
pub const DEVICES_OFFSET: usize = HEADER_SIZE;
pub const SLOTS_OFFSET: usize = DEVICES_OFFSET + MAX_DEVICES * DEVICE_ENTRY_SIZE;
/// Exact size of a region file; any other size is refused before mapping.
pub const REGION_SIZE: usize = SLOTS_OFFSET + MAX_PROCESSES * SLOT_SIZE;

/// Byte locked (OFD write lock) while an empty file is initialised in place.
pub const INIT_LOCK_OFFSET: u64 = 0;

/// File offset of slot `index`'s liveness-lock byte.
pub const fn slot_lock_offset(index: usize) -> u64 {
    (SLOTS_OFFSET + index * SLOT_SIZE) as u64
}

/// First of the devices' measuring-turn bytes, past the end of the file.
pub const MEASURING_TURNS: u64 = 1 << 40;

/// File offset of device entry `device`'s measuring-turn byte, past the end of the file.
pub const fn measuring_turn_offset(device: usize) -> u64 {
    MEASURING_TURNS + device as u64
}

/// `(start, length)` of the bytes in which each process that maps the region holds one
/// write lock (its mark), past the measuring turns. A write lock needs the file open for
/// writing, and probes look only for write locks, so a reader's read locks mark nothing.
pub const MARKS: (u64, u64) = (1 << 41, 1 << 40);

/// File offset of slot `index`'s reclaim-lock byte (excludes reapers from each other only).
pub const fn slot_reclaim_offset(index: usize) -> u64 {
    slot_lock_offset(index) + 1
}

/// `Header::init_state` values.
pub const INIT_EMPTY: u32 = 0;
pub const INIT_READY: u32 = 0x5245_4459; // "READ"-ish, unlikely in a foreign file

/// `DeviceEntry::memory_limit` meaning "no cap".
pub const UNLIMITED: u64 = u64::MAX;
/// `DeviceEntry::memory_limit` of an entry whose first binder has not written its limit yet.
/// Every binder writes a limit before it returns, and nothing reserves before binding, so a
/// reservation never meets it; if one did, it would be refused (read as a limit of 0).
pub const LIMIT_UNSET: u64 = u64::MAX - 1;
/// `DeviceEntry::compute_percent` of an entry nobody has bound yet.
pub const PERCENT_UNSET: u32 = u32::MAX;

/// `ProcessSlot::state`: the low bit says free (0) or claimed (1); the bits above count the
/// slot's claims, so a reaper that judged one owner dead can never free the slot of the next
/// (its compare-and-swap names the generation it judged).
pub const SLOT_CLAIMED_BIT: u32 = 1;

pub const fn slot_is_claimed(state: u32) -> bool {
    state & SLOT_CLAIMED_BIT != 0
}

/// The state of the next claim after `state` (a free slot's).
pub const fn slot_next_claim(state: u32) -> u32 {
    (state & !SLOT_CLAIMED_BIT).wrapping_add(2) | SLOT_CLAIMED_BIT
}

/// The free state that follows the claimed `state`.
pub const fn slot_freed(state: u32) -> u32 {
    state & !SLOT_CLAIMED_BIT
}

#[repr(C)]
pub struct Header {
    /// `MAGIC` as a little-endian u64.
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub header_size: AtomicU32,
    pub device_entry_size: AtomicU32,
    pub slot_size: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_processes: AtomicU32,
    /// `INIT_READY` (stored last, with Release) once every other header field is valid.
    pub init_state: AtomicU32,
    /// One past the highest slot index ever claimed: reaps and snapshots look at the slots
    /// below it (the ledger's hot paths never do).
    pub slot_high_water: AtomicU32,
    pub total_size: AtomicU64,
    /// Bumped whenever limits are rewritten or the region is reset; lets a reader notice.
    pub generation: AtomicU64,
    /// Processes of the slice that failed closed after opening the region (e.g. a limit-file
    /// entry that names no device): a counter for the node agent.
    pub fail_closed_events: AtomicU64,
    /// Moves whenever the slice's membership changes: a slot claimed or freed, a host PID
    /// recorded, a death noticed (`region::deaths`). Readers that index the members by PID
    /// rebuild their index only when it moved.
    pub members_epoch: AtomicU64,
    /// Sweeps for dead processes still wanted (0 = none; `region::deaths`).
    pub sweeps_wanted: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds of the slice's last sweep (one sweep for all processes).
    pub swept_at_ns: AtomicU64,
    /// Inode of the PID namespace whose PIDs NVML reports unchanged, as a process of the
    /// slice saw its own PID in NVML's list (0 = not learned): a process of that namespace
    /// knows its NVML PID without measuring it (`session::host_pid` in the shim).
    pub nvml_pid_namespace: AtomicU64,
    /// Where the next start's partial sweep begins: a slot index, modulo the high-water mark
    /// (`region::deaths`, [`crate::region::START_SWEEP_SLOTS`]).
    pub sweep_cursor: AtomicU64,
    /// Zero in files written before the five words above existed, which reads as "nothing
    /// yet", so the layout version did not change.
    _reserved: [AtomicU64; 3],
}

#[repr(C)]
pub struct DeviceEntry {
    /// NUL-padded UUID bytes, little-endian in 8 words; all zero = entry unused.
    pub uuid: [AtomicU64; UUID_BYTES / 8],
    /// Bytes; `UNLIMITED` = no cap.
    pub memory_limit: AtomicU64,
    /// 1..=100; 0 = not throttled.
    pub compute_percent: AtomicU32,
    /// Moves each time the measuring turn is given back (or a measurement published): the
    /// futex word a process waiting for the turn sleeps on (`region::turn_wait`); a context
    /// start that gave room back wakes two of them without moving it.
    pub turn_changes: AtomicU32,
    /// The slice's utilisation of this device as the compute throttle last measured it, in
    /// basis points plus one (0 = never measured), and when (CLOCK_MONOTONIC ns). Written by
    /// the throttle's leader each tick; read by `gpuslice status`.
    pub measured_utilization: AtomicU64,
    pub measured_at_ns: AtomicU64,
    /// Bytes one CUDA context costs on this device, the largest figure a process of the slice
    /// measured from NVML (0 = none yet). A new process reserves this instead of the upper
    /// bound before its first context. Was reserved (zero) in files written before it existed,
    /// which reads as "none yet", so the layout version did not change.
    pub context_cost: AtomicU64,
    /// PID (in its own namespace) of the process holding this device's measuring turn, 0 =
    /// none, and the inode of its PID namespace: lets a waiter see that the holder is
    /// stopped instead of waiting for it.
    pub measuring_pid: AtomicU64,
    pub measuring_pid_ns: AtomicU64,
    /// The slice's bytes on this device (low 48 bits) and the tag of the operation that last
    /// changed them (slot and sequence bits, above): what reservations compare-and-swap
    /// against the limit. See `region::ledger`.
    pub total: AtomicU64,
    /// Hash of the UUID (never 0; 0 = entry unused), claimed with one compare-and-swap so two
    /// processes binding the same new device at once always land on the same entry.
    pub key: AtomicU64,
    /// Allocations the slice refused on this device (the shim counts each refusal), and the
    /// nanoseconds its launches spent waiting for the compute share: counters that outlive
    /// the processes, for the node agent. Read as 0 in files that predate them.
    pub refused_allocations: AtomicU64,
    pub throttled_ns: AtomicU64,
    /// NVML's process list of this device, read once for every process of the slice that
    /// waits for it (`region::listing`): even = none being read, odd = one being read; each
    /// read moves it by two. The futex word its waiters sleep on.
    pub listing_seq: AtomicU32,
    /// Processes holding a ticket for a listing of this device (`region::listing`): a reader
    /// with nobody else waiting writes only its own word. Zero in files that predate it.
    pub listing_waiters: AtomicU32,
    /// CLOCK_MONOTONIC ns at which the listing being read began (a reader that stalls past
    /// `listing::TAKEOVER` is taken over).
    pub listing_since_ns: AtomicU64,
    /// The card's free bytes at a recent view of a process of the slice, per source (CUDA's
    /// figure, NVML's); 0 = none yet (`region::deaths`: a start's share).
    pub card_free_seen: [AtomicU64; 2],
    _reserved1: AtomicU64,
    /// Reserved for the compute throttle (token bucket state).
    pub throttle: [AtomicU64; THROTTLE_WORDS],
}

#[repr(C)]
pub struct ProcessSlot {
    /// Free or claimed, and a claim generation (see [`SLOT_CLAIMED_BIT`]).
    pub state: AtomicU32,
    /// PID in the owner's PID namespace.
    pub pid: AtomicU32,
    /// PID as the host (and NVML) sees it; 0 = not known yet.
    pub host_pid: AtomicU32,
    /// Bit `d`: this process is making its first context on device entry `d` under a
    /// reservation that may stand above what the context costs (the bound), until it settles.
    /// A process short of room waits for such reservations before it is refused
    /// (`Region::context_starts_elsewhere`). Zeroed when the slot is claimed; zero in files
    /// written before it existed, which reads as "none", so the layout version did not change.
    pub starting_contexts: AtomicU32,
    /// Process start time, clock ticks after boot (/proc/<pid>/stat field 22).
    pub start_time: AtomicU64,
    /// Inode of the owner's PID namespace (/proc/self/ns/pid); 0 = unknown.
    pub pid_ns: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds just before a probe last found the owner's liveness lock
    /// held (0 = never; zeroed when the slot is claimed): a start's share does not probe again
    /// an owner found alive after the start began (`slots::Judge::LockUnlessAliveSince`).
    pub alive_seen_ns: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds at which a reap first found the owner dead while the
    /// driver may still hold its memory (0 = not seen dead). Zeroed when the slot is claimed.
    pub dead_since: AtomicU64,
    /// The ledger operation this slot has in flight (target bytes, sequence, device, state);
    /// see `region::ledger`.
    pub intent: AtomicU64,
    /// What NVML's last listing of a device showed this process holding there (bytes, device
    /// entry and the listing's sequence; `region::listing`).
    pub listed: AtomicU64,
    /// Bytes this process holds (low 48 bits) and the sequence number of its last ledger
    /// operation that landed (above), per device entry.
    pub used: [AtomicU64; MAX_DEVICES],
    /// Live CUDA contexts of this process, per device entry.
    pub contexts: [AtomicU32; MAX_DEVICES],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<DeviceEntry>() == DEVICE_ENTRY_SIZE);
const _: () = assert!(std::mem::size_of::<ProcessSlot>() == SLOT_SIZE);
const _: () = assert!(std::mem::align_of::<Header>() == 8);
const _: () = assert!(std::mem::align_of::<DeviceEntry>() == 8);
const _: () = assert!(std::mem::align_of::<ProcessSlot>() == 8);

/// The whole file as one struct; the mapping is page-aligned, so this is well aligned.
#[repr(C)]
pub struct RegionLayout {
    pub header: Header,
    pub devices: [DeviceEntry; MAX_DEVICES],
    pub slots: [ProcessSlot; MAX_PROCESSES],
}

const _: () = assert!(std::mem::size_of::<RegionLayout>() == REGION_SIZE);

pub fn magic_word() -> u64 {
    u64::from_le_bytes(MAGIC)
}

/// Packs a UUID (at most `UUID_BYTES - 1` bytes; longer is cut) into NUL-padded words.
pub fn uuid_to_words(uuid: &str) -> [u64; UUID_BYTES / 8] {
    let mut bytes = [0u8; UUID_BYTES];
    let len = uuid.len().min(UUID_BYTES - 1);
    bytes[..len].copy_from_slice(&uuid.as_bytes()[..len]);
    let mut words = [0u64; UUID_BYTES / 8];
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(chunk);
        *word = u64::from_le_bytes(eight);
    }
    words
}

/// The UUID stored in `words` (lossy for non-UTF-8 garbage).
pub fn uuid_from_words(words: &[u64; UUID_BYTES / 8]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn sizes_and_offsets_are_stable() {
        // These numbers are the on-disk contract: changing any means bumping LAYOUT_VERSION.
        assert_eq!(HEADER_SIZE, 128);
        assert_eq!(DEVICE_ENTRY_SIZE, 320);
        assert_eq!(SLOT_SIZE, 256);
        assert_eq!(SLOTS_OFFSET, 5248);
        assert_eq!(REGION_SIZE, 267_392);
        assert_eq!(offset_of!(RegionLayout, devices), DEVICES_OFFSET);
        assert_eq!(offset_of!(RegionLayout, slots), SLOTS_OFFSET);

        assert_eq!(offset_of!(Header, magic), 0);
        assert_eq!(offset_of!(Header, layout_version), 8);
        assert_eq!(offset_of!(Header, header_size), 12);
        assert_eq!(offset_of!(Header, device_entry_size), 16);
        assert_eq!(offset_of!(Header, slot_size), 20);
        assert_eq!(offset_of!(Header, max_devices), 24);
        assert_eq!(offset_of!(Header, max_processes), 28);
        assert_eq!(offset_of!(Header, init_state), 32);
        assert_eq!(offset_of!(Header, slot_high_water), 36);
        assert_eq!(offset_of!(Header, total_size), 40);
        assert_eq!(offset_of!(Header, generation), 48);
        assert_eq!(offset_of!(Header, fail_closed_events), 56);
        assert_eq!(offset_of!(Header, members_epoch), 64);
        assert_eq!(offset_of!(Header, sweeps_wanted), 72);
        assert_eq!(offset_of!(Header, swept_at_ns), 80);
        assert_eq!(offset_of!(Header, nvml_pid_namespace), 88);

        assert_eq!(offset_of!(DeviceEntry, uuid), 0);
        assert_eq!(offset_of!(DeviceEntry, memory_limit), 64);
        assert_eq!(offset_of!(DeviceEntry, compute_percent), 72);
        assert_eq!(offset_of!(DeviceEntry, turn_changes), 76);
        assert_eq!(offset_of!(DeviceEntry, context_cost), 96);
        assert_eq!(offset_of!(DeviceEntry, measuring_pid), 104);
        assert_eq!(offset_of!(DeviceEntry, measuring_pid_ns), 112);
        assert_eq!(offset_of!(DeviceEntry, total), 120);
        assert_eq!(offset_of!(DeviceEntry, key), 128);
        assert_eq!(offset_of!(DeviceEntry, listing_seq), 152);
        assert_eq!(offset_of!(DeviceEntry, listing_since_ns), 160);
        assert_eq!(offset_of!(DeviceEntry, throttle), 192);

        assert_eq!(offset_of!(ProcessSlot, state), 0);
        assert_eq!(offset_of!(ProcessSlot, pid), 4);
        assert_eq!(offset_of!(ProcessSlot, host_pid), 8);
        assert_eq!(offset_of!(ProcessSlot, starting_contexts), 12);
        assert_eq!(offset_of!(ProcessSlot, start_time), 16);
        assert_eq!(offset_of!(ProcessSlot, pid_ns), 24);
        assert_eq!(offset_of!(ProcessSlot, alive_seen_ns), 32);
        assert_eq!(offset_of!(ProcessSlot, dead_since), 40);
        assert_eq!(offset_of!(ProcessSlot, intent), 48);
        assert_eq!(offset_of!(ProcessSlot, listed), 56);
        assert_eq!(offset_of!(ProcessSlot, used), 64);
        assert_eq!(offset_of!(ProcessSlot, contexts), 192);
    }

    #[test]
    fn marks_touch_no_other_lock_byte() {
        let (start, len) = MARKS;
        assert!(start > measuring_turn_offset(MAX_DEVICES - 1));
        assert!(start > REGION_SIZE as u64);
        assert!(start + len < i64::MAX as u64, "fcntl offsets are signed");
    }

    #[test]
    fn slot_lock_bytes_do_not_touch_the_init_lock() {
        assert!(slot_lock_offset(0) > INIT_LOCK_OFFSET);
        assert_eq!(slot_reclaim_offset(0), slot_lock_offset(0) + 1);
        assert_eq!(slot_lock_offset(1) - slot_lock_offset(0), SLOT_SIZE as u64);
        assert!(slot_lock_offset(MAX_PROCESSES - 1) < REGION_SIZE as u64);
    }

    #[test]
    fn slot_states_count_claims() {
        let free = 0;
        assert!(!slot_is_claimed(free));
        let first = slot_next_claim(free);
        assert!(slot_is_claimed(first));
        let freed = slot_freed(first);
        assert!(!slot_is_claimed(freed));
        let second = slot_next_claim(freed);
        assert!(slot_is_claimed(second));
        assert_ne!(first, second, "a second claim has another generation");
        assert!(slot_is_claimed(slot_next_claim(slot_freed(u32::MAX))));
    }

    #[test]
    fn uuid_words_round_trip() {
        let uuid = "GPU-8a5d1c2e-0000-1111-2222-333344445555";
        assert_eq!(uuid_from_words(&uuid_to_words(uuid)), uuid);
        assert_eq!(uuid_from_words(&uuid_to_words("")), "");
        let long = "x".repeat(100);
        assert_eq!(uuid_from_words(&uuid_to_words(&long)).len(), UUID_BYTES - 1);
    }
}
