//! How the slice learns that one of its processes died: found once, by one process, and told
//! to all through the region; no process reads every peer's `/proc`, and no memory view walks
//! the slots.
//!
//! * **The notice.** A slot's `dead_since` stamp (set by whoever first finds its owner dead,
//!   see `slots::dead_slot`) is the death notice every process reads; setting it moves the
//!   header's `members_epoch`, as claiming and freeing a slot and recording a host PID do.
//! * **The sweep** ([`Region::sweep_if_due`]): one pass over the slots that hold bytes, judging
//!   each by its liveness lock alone (one `F_OFD_GETLK` each; the kernel drops the lock with
//!   its holder), noticing the dead and reaping those the caller's judge says the driver has
//!   released. At most one sweep per [`SWEEP_INTERVAL`] for the whole slice (the header's
//!   `swept_at_ns`, taken by compare-and-swap: whoever takes it sweeps, nobody waits), and only
//!   while one is wanted (`sweeps_wanted`): a caller that sees a reason ([`Region::want_sweep`]:
//!   the card's free memory went up since its last view, i.e. memory went back to the driver,
//!   asks for two, the second catching an owner whose lock closed after its memory went back;
//!   a member found dead asks for one), and a sweep that leaves dead slots the driver still
//!   holds asks for another. A slice where nothing was given back to the card never sweeps:
//!   its views cost the same whatever the number of live processes.
//! * **A start's share** ([`Region::sweep_start_share`]): a process's first view, unless a
//!   sweep began after the process started ([`Region::swept_since`]), judges the next
//!   [`START_SWEEP_SLOTS`] slots from the header's `sweep_cursor` (which moves past them), so
//!   a start costs the same beside 30 or 1,000 live processes and a storm of N starts judges
//!   N x 32 slots, not N x N; starts one after another walk the whole slice. Where the slots in
//!   use fit in the share (the high-water mark), the share is a whole sweep and counts as one.
//!   An owner that any probe found alive after the start began (the slot's `alive_seen_ns`)
//!   is not probed again by the share: a storm of N starts at one instant probes each slot
//!   about once, not N x 32 / (slots) times.
//!   The shim sweeps the whole slice instead when a sweep is wanted, and a first view wants
//!   one when the card has more free memory than the slice last saw
//!   ([`Region::card_free_seen`]): the first process after others exited sweeps them all. What
//!   may wait is a death whose memory went back while as much was taken again before that
//!   view: it stays charged until the next reason (a view that sees memory come back, a
//!   refused allocation, a share over its slot), the safe direction, never a budget given
//!   back early.
//! * **The members** ([`Region::with_members`], [`MemberLookup`]): the claimed,
//!   not-noticed-dead slots, indexed by the PID NVML knows them by, rebuilt in this process
//!   only when `members_epoch` moved. A process-list filter checks the liveness lock of a
//!   member it matches (at most once per [`SWEEP_INTERVAL`]), so a dead process's PID that
//!   another process reused is not shown; a death found that way is noticed for all.
//! * **Who NVML names how** ([`Region::learn_nvml_pid_namespace`]): once a process of the slice
//!   saw NVML list it under its own PID, every process of its PID namespace knows its NVML PID
//!   at registration, with no measuring (the shim's `session::host_pid`).
//!
//! What is not found by a sweep waits for the next reason to sweep, a refused allocation (the
//! shim sweeps at once, [`Region::sweep_now`]) or a full region (`register`): a dead slot
//! stays charged meanwhile, never the other way round.

use std::cell::UnsafeCell;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::layout::{slot_lock_offset, ProcessSlot, RegionLayout};
use super::lock;
use super::slots::{self, Judge, Scope, Slots};
use super::{DeadSlot, DeviceId, ReapReport, Region, RegionError, SlotId};
use crate::turn::Turn;

/// The slice sweeps at most this often, whoever asks.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// How many slots a process's start sweeps ([`Region::sweep_start_share`]): all of a slice
/// whose slots in use fit in it.
pub const START_SWEEP_SLOTS: usize = 32;

/// Why a process asks the slice for a sweep ([`Region::want_sweep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepReason {
    /// Memory went back to the card (a dead process's, maybe): two sweeps, a period apart,
    /// since the owner's liveness lock may close just after its memory went back.
    CardGotMemoryBack,
    /// A member was found dead: one sweep.
    Look,
}

/// A live process of the slice, as the member index holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub slot: SlotId,
    /// PID in its own namespace (what the container sees).
    pub pid: u32,
    /// PID as NVML reports it; 0 = not known.
    pub host_pid: u32,
}

impl Member {
    /// The member held in slot `index` (`record`), as it reads now.
    pub(super) fn of(index: usize, record: &ProcessSlot) -> Member {
        Member {
            slot: SlotId(index as u16),
            pid: record.pid.load(Ordering::Relaxed),
            host_pid: record.host_pid.load(Ordering::Relaxed),
        }
    }

    /// The PID NVML lists it under: its host PID when known, else its own (right where NVML
    /// and the process share a PID namespace).
    pub fn driver_pid(&self) -> u32 {
        if self.host_pid != 0 {
            self.host_pid
        } else {
            self.pid
        }
    }
}

/// The slice's members at one `members_epoch`, by [`Member::driver_pid`] (an open-addressing
/// table holding each key beside its position: a lookup is a multiply and a probe or two),
/// with when this process is next to check each one's liveness lock.
#[derive(Debug, Default)]
pub(super) struct MemberIndex {
    epoch: u64,
    members: Vec<Member>,
    /// When each member's liveness lock is next to be checked (CLOCK_MONOTONIC ns; 0: at
    /// its first lookup).
    check_due_ns: Vec<u64>,
    /// A power of two long, at least twice the members (so a probe always meets an empty
    /// bucket).
    table: Vec<Bucket>,
}

/// One place of [`MemberIndex`]'s table: a member's driver PID and its position in
/// `members` (`driver_pid` 0: empty; no process has PID 0).
#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    driver_pid: u32,
    position: u32,
}

impl MemberIndex {
    fn rebuild(&mut self, epoch: u64, members: impl Iterator<Item = Member>) {
        self.members.clear();
        self.members.extend(members);
        self.check_due_ns.clear();
        self.check_due_ns.resize(self.members.len(), 0);
        let size = (self.members.len() * 2).next_power_of_two().max(16);
        self.table.clear();
        self.table.resize(size, Bucket::default());
        for (i, member) in self.members.iter().enumerate() {
            let driver_pid = member.driver_pid();
            if driver_pid == 0 {
                continue; // not yet written: nothing NVML lists can be it
            }
            let mut at = Self::home(driver_pid, size);
            while self.table[at].driver_pid != 0 {
                at = (at + 1) & (size - 1);
            }
            self.table[at] = Bucket {
                driver_pid,
                position: i as u32,
            };
        }
        self.epoch = epoch;
    }

    fn home(driver_pid: u32, size: usize) -> usize {
        (u64::from(driver_pid).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & (size - 1)
    }

    /// The member NVML lists as `driver_pid`, its liveness unchecked.
    pub(super) fn member(&self, driver_pid: u32) -> Option<Member> {
        self.members.get(self.position(driver_pid)?).copied()
    }

    /// Position in `members` of the member NVML lists as `driver_pid`.
    #[inline(always)]
    fn position(&self, driver_pid: u32) -> Option<usize> {
        let size = self.table.len();
        if size == 0 || driver_pid == 0 {
            return None;
        }
        let mut at = Self::home(driver_pid, size);
        loop {
            let bucket = self.table[at];
            if bucket.driver_pid == driver_pid {
                return Some(bucket.position as usize);
            }
            if bucket.driver_pid == 0 {
                return None;
            }
            at = (at + 1) & (size - 1);
        }
    }
}

/// The member index of one [`Region::with_members`] call: the look-up from NVML's PIDs to
/// the slice's live members.
pub struct MemberLookup<'a> {
    region: &'a Region,
    index: &'a mut MemberIndex,
    /// CLOCK_MONOTONIC ns of the first look-up that needed it (0: not read yet).
    now: u64,
}

impl MemberLookup<'_> {
    /// The live member NVML lists under `driver_pid` (`None`: a stranger, or a member found
    /// dead). A member's liveness lock is checked at its first lookup in each
    /// [`SWEEP_INTERVAL`] (one system call), so a dead member's PID, which the host may give
    /// to another process, is shown for at most that long after its death (far less than the
    /// host takes to hand a PID out again).
    #[inline(always)]
    pub fn get(&mut self, driver_pid: u32) -> Option<Member> {
        let i = self.index.position(driver_pid)?;
        let member = self.index.members[i];
        if self.now == 0 {
            self.now = super::monotonic_ns();
        }
        let due = &mut self.index.check_due_ns[i];
        if self.now >= *due {
            if !self.region.check_member(&member) {
                return None;
            }
            *due = self.now.saturating_add(SWEEP_INTERVAL.as_nanos() as u64);
        }
        Some(member)
    }
}

/// This process's copy of the member index, behind a process-local turn (reset in a fork
/// child with the other turns).
pub(super) struct MemberCache {
    turn: Turn,
    index: UnsafeCell<MemberIndex>,
}

// SAFETY: `index` is only touched while `turn` is held (`Region::with_members`).
unsafe impl Sync for MemberCache {}
// SAFETY: as above; the index is plain owned data.
unsafe impl Send for MemberCache {}

impl MemberCache {
    pub(super) fn new() -> MemberCache {
        MemberCache {
            turn: Turn::new(),
            index: UnsafeCell::new(MemberIndex {
                epoch: u64::MAX,
                ..MemberIndex::default()
            }),
        }
    }

    /// For a fork child: a parent's thread may have held the turn.
    pub(super) fn reset_turn(&self) {
        self.turn.reset();
    }
}

/// The slice's membership changed (a claim, a free, a host PID, a death noticed).
pub(super) fn membership_changed(layout: &RegionLayout) {
    layout.header.members_epoch.fetch_add(1, Ordering::AcqRel);
}

impl Region {
    /// Something may have died: the slice's next sweeps look (paced: see the module doc).
    pub fn want_sweep(&self, reason: SweepReason) {
        let sweeps = match reason {
            SweepReason::CardGotMemoryBack => 2,
            SweepReason::Look => 1,
        };
        self.map
            .layout()
            .header
            .sweeps_wanted
            .fetch_max(sweeps, Ordering::AcqRel);
    }

    /// Runs the slice's sweep when one is wanted and none ran in the last [`SWEEP_INTERVAL`]
    /// (by any process); `None` when not (one load when none is wanted). `released` is the
    /// driver's word on a dead slot's memory, as for [`Region::reap_dead_if`].
    #[inline]
    pub fn sweep_if_due(
        &self,
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Option<Result<ReapReport, RegionError>> {
        let header = &self.map.layout().header;
        if header.sweeps_wanted.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.sweep_paced(released)
    }

    #[cold]
    fn sweep_paced(
        &self,
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Option<Result<ReapReport, RegionError>> {
        let header = &self.map.layout().header;
        let now = super::monotonic_ns();
        let last = header.swept_at_ns.load(Ordering::Acquire);
        // A stamp from the future (another time namespace) does not hold sweeps back.
        if last <= now && now - last < SWEEP_INTERVAL.as_nanos() as u64 {
            return None;
        }
        header
            .swept_at_ns
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        let _ = header
            .sweeps_wanted
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| w.checked_sub(1));
        Some(self.sweep_now(released))
    }

    /// The sweep, now: every slot holding bytes judged by its liveness lock, the dead
    /// noticed, those `released` says the driver let go of reaped. Dead slots left charged
    /// keep a sweep wanted.
    pub fn sweep_now(
        &self,
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Result<ReapReport, RegionError> {
        self.map
            .layout()
            .header
            .swept_at_ns
            .fetch_max(super::monotonic_ns(), Ordering::AcqRel);
        let report = self.reap_with(released, Scope::Holding, Judge::Lock, Slots::All)?;
        if !report.pending.is_empty() {
            self.map
                .layout()
                .header
                .sweeps_wanted
                .fetch_max(1, Ordering::AcqRel);
        }
        Ok(report)
    }

    /// A start's share of the sweep, for a process that started at `started`
    /// (CLOCK_MONOTONIC ns): the next [`START_SWEEP_SLOTS`] slots from the slice's cursor
    /// (which moves past them, so starts one after another walk the whole slice), judged and
    /// reaped as [`Region::sweep_now`] does, except that an owner some probe found alive after
    /// `started` is not probed again (it cannot have died before the start); the whole slice,
    /// and counted as a sweep, where its slots in use fit in that many. A dead slot it leaves
    /// charged keeps a sweep wanted.
    pub fn sweep_start_share(
        &self,
        started: u64,
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Result<ReapReport, RegionError> {
        let header = &self.map.layout().header;
        let high_water = header.slot_high_water.load(Ordering::Acquire) as usize;
        if high_water <= START_SWEEP_SLOTS {
            return self.sweep_now(released);
        }
        let start = header
            .sweep_cursor
            .fetch_add(START_SWEEP_SLOTS as u64, Ordering::Relaxed);
        let window = Slots::Window {
            start: (start % high_water as u64) as usize,
            len: START_SWEEP_SLOTS,
        };
        let report = self.reap_with(
            released,
            Scope::Holding,
            Judge::LockUnlessAliveSince(started),
            window,
        )?;
        if !report.pending.is_empty() {
            self.want_sweep(SweepReason::Look);
        }
        Ok(report)
    }

    /// A view of `device` read the card's `free` bytes from `source` (0: CUDA's figure, 1:
    /// NVML's): kept for the slice; returns what the slice saw before (0 = nothing yet).
    pub fn card_free_seen(&self, device: DeviceId, source: usize, free: u64) -> u64 {
        self.map.layout().devices[device.index()]
            .card_free_seen
            .get(source)
            .map_or(0, |seen| seen.swap(free, Ordering::AcqRel))
    }

    /// Whether a sweep is wanted (a reason was seen and no sweep has run since).
    pub fn sweep_wanted(&self) -> bool {
        self.map
            .layout()
            .header
            .sweeps_wanted
            .load(Ordering::Acquire)
            != 0
    }

    /// Whether a sweep of the slice began at or after `instant` (CLOCK_MONOTONIC ns): one
    /// that saw every death before it.
    pub fn swept_since(&self, instant: u64) -> bool {
        self.map.layout().header.swept_at_ns.load(Ordering::Acquire) >= instant
    }

    /// Runs `read` with a lookup from the PID NVML lists a process under to the live member
    /// of the slice it is ([`MemberLookup::get`]). The index is rebuilt first if the
    /// membership moved since this process last looked. The lookup is a concrete type, not a
    /// `dyn` closure, so a process list's filter compiles to one loop with the look-up inlined.
    pub fn with_members<R>(&self, read: impl FnOnce(&mut MemberLookup<'_>) -> R) -> R {
        self.with_index(|index| {
            read(&mut MemberLookup {
                region: self,
                index,
                now: 0,
            })
        })
    }

    /// Runs `read` on this process's member index, rebuilt first if the membership moved
    /// since this process last looked.
    pub(super) fn with_index<R>(&self, read: impl FnOnce(&mut MemberIndex) -> R) -> R {
        let layout = self.map.layout();
        let _turn = self.members.turn.take();
        // SAFETY: the turn is held: no other thread of this process touches the index.
        let index = unsafe { &mut *self.members.index.get() };
        let epoch = layout.header.members_epoch.load(Ordering::Acquire);
        if index.epoch != epoch {
            index.rebuild(
                epoch,
                slots::claimed_slots(layout)
                    .filter(|(_, slot, _)| slot.dead_since.load(Ordering::Acquire) == 0)
                    .map(|(i, slot, _)| Member::of(i, slot)),
            );
        }
        read(index)
    }

    /// The slice's members as this process's index holds them now.
    pub fn members(&self) -> Vec<Member> {
        self.with_index(|index| index.members.clone())
    }

    /// Whether `member` still lives, by its slot's liveness lock (one system call). A member
    /// found dead is noticed for the whole slice, and a sweep is wanted. Kept out of line: a
    /// process list's filter calls it at most once per member and sweep interval.
    #[inline(never)]
    fn check_member(&self, member: &Member) -> bool {
        let layout = self.map.layout();
        let slot = &layout.slots[member.slot.index()];
        let alive = lock::is_locked_by_other(&self.file, slot_lock_offset(member.slot.index()))
            .unwrap_or(true);
        if !alive {
            slots::notice_dead(layout, member.slot.index(), super::monotonic_ns());
            self.want_sweep(SweepReason::Look);
            return false;
        }
        slot.dead_since.load(Ordering::Acquire) == 0
    }

    /// The host PIDs the slots record (every claimed slot, dead or alive, `except` left out):
    /// plain loads, no judging.
    pub fn recorded_host_pids(&self, except: Option<SlotId>) -> Vec<u32> {
        slots::claimed_slots(self.map.layout())
            .filter(|(i, _, _)| Some(SlotId(*i as u16)) != except)
            .map(|(_, slot, _)| slot.host_pid.load(Ordering::Relaxed))
            .filter(|&pid| pid != 0)
            .collect()
    }

    /// The PID namespace whose processes NVML lists under their own PIDs (0 = not known).
    pub fn nvml_pid_namespace(&self) -> u64 {
        self.map
            .layout()
            .header
            .nvml_pid_namespace
            .load(Ordering::Acquire)
    }

    /// A process of PID namespace `namespace` saw NVML list it under its own PID. The first
    /// namespace learned stays.
    pub fn learn_nvml_pid_namespace(&self, namespace: u64) {
        if namespace == 0 {
            return;
        }
        let _ = self
            .map
            .layout()
            .header
            .nvml_pid_namespace
            .compare_exchange(0, namespace, Ordering::AcqRel, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;

    fn member(slot: u16, pid: u32, host_pid: u32) -> Member {
        Member {
            slot: SlotId(slot),
            pid,
            host_pid,
        }
    }

    #[test]
    fn every_member_is_found_by_its_driver_pid_and_nothing_else_is() {
        let mut index = MemberIndex::default();
        // PIDs a stride apart collide in the table's home buckets: probing must walk past them.
        let members: Vec<Member> = (0..700u16)
            .map(|i| {
                let pid = 1_000 + u32::from(i) * 4_096;
                // Every third one is listed by NVML under a host PID.
                let host = if i % 3 == 0 {
                    3_000_000 + u32::from(i)
                } else {
                    0
                };
                member(i, pid, host)
            })
            .collect();
        index.rebuild(7, members.iter().copied());
        for m in &members {
            assert_eq!(index.member(m.driver_pid()), Some(*m), "{m:?}");
        }
        // A member listed under its host PID is not found under its own.
        assert_eq!(index.member(1_000), None);
        // Strangers, and PID 0 (an empty bucket's mark), are nobody.
        for stranger in [0, 1, 999, 2_999_999, 4_000_000, u32::MAX] {
            assert_eq!(index.member(stranger), None, "{stranger}");
        }
        // An empty index finds nobody, PID 0 included.
        index.rebuild(8, std::iter::empty());
        assert_eq!(index.member(0), None);
        assert_eq!(index.member(1_000), None);
    }
}
