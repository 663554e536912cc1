//! Process slots: claiming one (registration), giving it back, judging whether a slot's owner
//! lives, and reaping the slots of dead owners once the driver has let go of their memory.
//! No step waits for anybody: claims and frees are compare-and-swaps on the slot's state word
//! under non-blocking OFD locks (module doc of `region`: "Liveness", "Reaping").

use std::sync::atomic::Ordering;

use super::deaths::membership_changed;
use super::layout::{
    slot_freed, slot_is_claimed, slot_lock_offset, slot_next_claim, slot_reclaim_offset,
    ProcessSlot, RegionLayout,
};
use super::ledger;
use super::lock::{self, OwnedFd};
use super::{
    monotonic_ns, DeadSlot, ExitState, Liveness, PendingSlot, ProcessIdentity, ReapReport,
    ReclaimedSlot, Region, RegionError, SlotId, MAX_DEVICES, MAX_PROCESSES,
};

impl Region {
    /// Claims a slot for `identity`: a free one, else one whose dead owner holds nothing.
    /// Call again in a forked child: it gets its own slot.
    pub fn register(&self, identity: &ProcessIdentity) -> Result<SlotId, RegionError> {
        self.register_with(identity, |_| {}, DeadSlot::holds_nothing)
    }

    /// `register`, running `after_claim` with the slot claimed and its liveness lock held
    /// (tests use it to stop or die at the worst moment). When every slot is claimed, the
    /// dead ones are offered to `released` (the driver's word, as for `reap_dead_if`) and
    /// the claim is tried once more.
    pub fn register_with(
        &self,
        identity: &ProcessIdentity,
        after_claim: impl FnOnce(SlotId),
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Result<SlotId, RegionError> {
        self.close_inherited_slot_locks();
        let mut released = Some(released);
        for attempt in 0..2 {
            if let Some(slot) = self.claim_free_slot(identity)? {
                after_claim(slot);
                return Ok(slot);
            }
            if attempt == 0 {
                if let Some(mut released) = released.take() {
                    // By the lock alone first (one system call a slot); /proc too, for owners
                    // whose lock a child inherited, only when that frees nothing.
                    let by_lock =
                        self.reap_with(&mut released, Scope::All, Judge::Lock, Slots::All)?;
                    if by_lock.reclaimed.is_empty() {
                        self.reap_dead_if(released)?;
                    }
                }
            }
        }
        Err(RegionError::Full {
            path: self.path.clone(),
        })
    }

    /// Gives back a slot this process registered; its bytes leave the ledger with it.
    pub fn unregister(&self, slot: SlotId) -> Result<(), RegionError> {
        let held = &self.held[slot.index()];
        if held.fd.load(Ordering::Relaxed) < 0
            || held.owner_pid.load(Ordering::Relaxed) != std::process::id()
        {
            return Err(RegionError::NotOwner {
                path: self.path.clone(),
                slot,
            });
        }
        let record = &self.map.layout().slots[slot.index()];
        let state = record.state.load(Ordering::Acquire);
        {
            let _turn = self.held[slot.index()].turn();
            free_slot(self.map.layout(), slot.index(), state, |_| true);
        }
        self.drop_held(slot.index());
        Ok(())
    }

    /// Frees every dead slot whose freeing returns no budget at all: those holding nothing.
    /// Dead slots holding memory wait for `reap_dead_if` with the driver's word, however
    /// long that takes (no timer here gives a dead process's budget back).
    pub fn reap_dead(&self) -> Result<ReapReport, RegionError> {
        self.reap_dead_if(DeadSlot::holds_nothing)
    }

    /// Two-phase reap: every slot whose owner is dead is offered to `released`, which says
    /// whether the driver no longer holds that process's memory. Only those slots are freed
    /// (their bytes leave the totals); the others stay claimed and charged (`pending`) until a
    /// later reap. Never waits: a slot another reaper is freeing is skipped. Owners are judged
    /// as `snapshot` judges them (the lock, and /proc where the slot is of our namespace); the
    /// shim reaps through [`Region::sweep_now`], which judges by the lock alone.
    pub fn reap_dead_if(
        &self,
        released: impl FnMut(&DeadSlot) -> bool,
    ) -> Result<ReapReport, RegionError> {
        self.reap_with(released, Scope::All, Judge::LockAndProc, Slots::All)
    }

    pub(super) fn reap_with(
        &self,
        mut released: impl FnMut(&DeadSlot) -> bool,
        scope: Scope,
        judge_by: Judge,
        slots: Slots,
    ) -> Result<ReapReport, RegionError> {
        let layout = self.map.layout();
        let mut report = ReapReport::default();
        let now = monotonic_ns();
        // Opened for the first slot to free only: the reclaim lock needs a description of
        // its own (liveness is probed through the mapped file's, which holds no lock).
        let mut reclaimer: Option<OwnedFd> = None;
        for (index, slot, state) in slots.claimed(layout) {
            let holds = || {
                slot.used
                    .iter()
                    .any(|word| ledger::bytes_of(word.load(Ordering::Relaxed)) != 0)
                    || ledger::in_flight(slot.intent.load(Ordering::Relaxed))
            };
            if scope == Scope::Holding && !holds() {
                continue;
            }
            if judge_with(slot, index, Some(&self.file), judge_by, true) != Liveness::Stale {
                continue;
            }
            let dead = dead_slot(layout, index, now);
            if !released(&dead) {
                report.pending.push(PendingSlot {
                    slot: dead.slot,
                    pid: dead.pid,
                    bytes: dead.bytes(),
                });
                continue;
            }
            let probe = match &reclaimer {
                Some(fd) => fd,
                None => reclaimer.insert(self.reopen(libc::O_RDWR)?),
            };
            let reclaim = slot_reclaim_offset(index);
            if !lock::try_lock(probe, reclaim).unwrap_or(false) {
                continue; // another reaper is freeing it
            }
            // Still the claim we judged? (Freed, or freed and claimed again, meanwhile.)
            if slot.state.load(Ordering::Acquire) == state {
                let bytes = free_slot(layout, index, state, |_| true);
                report.reclaimed.push(ReclaimedSlot {
                    slot: dead.slot,
                    pid: dead.pid,
                    bytes,
                });
                // One of ours judged dead (an inherited descriptor): close it.
                if self.held[index].owner_pid.load(Ordering::Relaxed) != std::process::id() {
                    self.drop_held(index);
                }
            }
            lock::unlock(probe, reclaim);
        }
        Ok(report)
    }

    /// Whether a live slot exists that this `Region` did not register.
    pub(super) fn others_live(&self) -> bool {
        let me = std::process::id();
        claimed_slots(self.map.layout()).any(|(index, slot, _)| {
            let held = &self.held[index];
            let ours = held.fd.load(Ordering::Relaxed) >= 0
                && held.owner_pid.load(Ordering::Relaxed) == me;
            !ours && judge(slot, index, Some(&self.file)) != Liveness::Stale
        })
    }

    fn claim_free_slot(&self, identity: &ProcessIdentity) -> Result<Option<SlotId>, RegionError> {
        let layout = self.map.layout();
        let fd = self.reopen(libc::O_RDWR)?;
        for (index, slot) in layout.slots.iter().enumerate() {
            let state = slot.state.load(Ordering::Acquire);
            if slot_is_claimed(state) {
                continue;
            }
            // Whoever holds a free slot's lock is claiming it, or is a descendant that
            // inherited a dead owner's descriptor: not ours to take either way.
            let offset = slot_lock_offset(index);
            if !lock::try_lock(&fd, offset)
                .map_err(|e| RegionError::io(&self.path, "lock a slot of", e))?
            {
                continue;
            }
            // The lock makes us the only claimant; the identity is in place before the
            // state says "claimed", so nobody judges a half-written slot.
            slot.pid.store(identity.pid, Ordering::Relaxed);
            slot.host_pid.store(identity.host_pid, Ordering::Relaxed);
            slot.start_time
                .store(identity.start_time, Ordering::Relaxed);
            slot.pid_ns.store(identity.pid_ns, Ordering::Relaxed);
            slot.alive_seen_ns.store(0, Ordering::Relaxed);
            slot.dead_since.store(0, Ordering::Relaxed);
            slot.listed.store(0, Ordering::Relaxed);
            slot.starting_contexts.store(0, Ordering::Relaxed);
            // A free slot holds no bytes and has nothing in flight (`free_slot`); its `used`
            // words keep their sequence numbers, which the devices' total tags may name.
            for contexts in &slot.contexts {
                contexts.store(0, Ordering::Relaxed);
            }
            if slot
                .state
                .compare_exchange(
                    state,
                    slot_next_claim(state),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                lock::unlock(&fd, offset);
                continue;
            }
            // Before this process can reserve anything: reaps and snapshots must see the slot.
            layout
                .header
                .slot_high_water
                .fetch_max(index as u32 + 1, Ordering::SeqCst);
            membership_changed(layout);
            let held = &self.held[index];
            held.owner_pid.store(std::process::id(), Ordering::Relaxed);
            held.fd.store(fd.into_raw(), Ordering::Relaxed);
            return Ok(Some(SlotId(index as u16)));
        }
        Ok(None)
    }

    /// Closes this process's descriptor for slot `index`, if it has one.
    fn drop_held(&self, index: usize) {
        let fd = self.held[index].fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            drop(OwnedFd::from_raw(fd));
        }
    }
}

/// Gives back everything slot `index` holds, then frees it if it is still in the claimed
/// `state`; returns the bytes it held. Its in-flight operation (its owner died in one) is
/// settled first, so exactly what the slot contributed to the totals leaves them; then one
/// release per device, in the slot's name, so a reaper killed here leaves a slot the next
/// reaper settles the same way. The bytes go first: a slot seen free never holds any. The
/// caller is the slot's only writer (its owner in its turn, or a reaper under the reclaim
/// lock). `go` is the step hook of `ledger::apply` (tests stop a reaper with it).
pub(super) fn free_slot(
    layout: &RegionLayout,
    index: usize,
    state: u32,
    mut go: impl FnMut(ledger::Step) -> bool,
) -> u64 {
    ledger::resolve(layout, index);
    let slot = &layout.slots[index];
    let mut total = 0u64;
    for device in 0..MAX_DEVICES {
        let held = ledger::held_bytes(layout, index, device);
        match ledger::apply(
            layout,
            index,
            device,
            ledger::Change::Release { bytes: held },
            &mut go,
        ) {
            ledger::Outcome::Done(taken) => total = total.saturating_add(taken),
            _ => return total, // stopped: the slot stays claimed for the next reaper
        }
        slot.contexts[device].store(0, Ordering::Relaxed);
    }
    if slot
        .state
        .compare_exchange(
            state,
            slot_freed(state),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    {
        membership_changed(layout);
    }
    total
}

/// Whether the owner of `slot` is stopped or traced, as far as our /proc can tell (false for
/// an owner in another PID namespace).
pub(super) fn owner_stopped(slot: &ProcessSlot) -> bool {
    let owner = ProcessIdentity {
        pid: slot.pid.load(Ordering::Relaxed),
        host_pid: 0,
        start_time: slot.start_time.load(Ordering::Relaxed),
        pid_ns: slot.pid_ns.load(Ordering::Relaxed),
    };
    owner.same_namespace_as_current() && super::proc::is_stopped(owner.pid)
}

/// The claimed slots with their state words.
pub(super) fn claimed_slots(
    layout: &RegionLayout,
) -> impl Iterator<Item = (usize, &ProcessSlot, u32)> {
    Slots::All.claimed(layout)
}

/// Which slots a reap walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slots {
    /// Every slot below the high-water mark.
    All,
    /// `len` slots from index `start`, wrapping at the high-water mark (each slot once).
    Window { start: usize, len: usize },
}

impl Slots {
    /// The claimed slots of the walk, with their state words.
    fn claimed(self, layout: &RegionLayout) -> impl Iterator<Item = (usize, &ProcessSlot, u32)> {
        let high_water =
            (layout.header.slot_high_water.load(Ordering::Acquire) as usize).min(MAX_PROCESSES);
        let (start, len) = match self {
            Slots::All => (0, high_water),
            Slots::Window { start, len } => (start % high_water.max(1), len.min(high_water)),
        };
        (start..start + len).filter_map(move |at| {
            let index = if at < high_water { at } else { at - high_water };
            let slot = &layout.slots[index];
            let state = slot.state.load(Ordering::Acquire);
            slot_is_claimed(state).then_some((index, slot, state))
        })
    }
}

/// Which slots a reap looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    All,
    /// Those holding bytes (or with an operation in flight): freeing another changes no figure.
    Holding,
}

/// How a claimed slot's owner is judged (module doc, "Liveness").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judge {
    /// The liveness lock alone: one system call. A lock a child inherited without the shim's
    /// fork handler (a raw `clone`) keeps a dead owner's slot looking alive while that child
    /// lives: its bytes stay charged longer, never shorter.
    Lock,
    /// The lock, and for a held lock of a slot of our PID namespace the owner's /proc entry
    /// (missing, a zombie or a reused PID is dead): what readers (`snapshot`) use.
    LockAndProc,
    /// [`Judge::Lock`], but an owner some probe found alive at or after this instant
    /// (CLOCK_MONOTONIC ns; the slot's `alive_seen_ns`) is alive without another probe: a
    /// start's share, which must only not count processes that died before the start began.
    /// Only a probe stamps, never a belief, so no owner is believed alive on belief alone.
    LockUnlessAliveSince(u64),
}

/// Liveness of a claimed slot as readers judge it ([`Judge::LockAndProc`]).
pub(super) fn judge(slot: &ProcessSlot, index: usize, probe: Option<&OwnedFd>) -> Liveness {
    judge_with(slot, index, probe, Judge::LockAndProc, false)
}

/// Liveness of a claimed slot. `probe` is any descriptor of the file that does not itself
/// hold the slot's lock; without one, liveness is unknown. With `stamp` (a writable mapping:
/// readers map the file read-only) a probe that finds the owner alive records when it looked
/// in the slot's `alive_seen_ns`.
pub(super) fn judge_with(
    slot: &ProcessSlot,
    index: usize,
    probe: Option<&OwnedFd>,
    judge_by: Judge,
    stamp: bool,
) -> Liveness {
    let Some(probe) = probe else {
        return Liveness::Unknown;
    };
    if let Judge::LockUnlessAliveSince(since) = judge_by {
        if slot.alive_seen_ns.load(Ordering::Relaxed) >= since.max(1) {
            return Liveness::Alive;
        }
    }
    // Read before the probe: the stamp never claims more than the probe saw.
    let probed_at = monotonic_ns();
    let liveness = match lock::is_locked_by_other(probe, slot_lock_offset(index)) {
        Err(_) => Liveness::Unknown,
        Ok(false) => Liveness::Stale,
        Ok(true) if judge_by != Judge::LockAndProc => Liveness::Alive,
        Ok(true) => {
            let identity = identity_of(slot);
            if identity.same_namespace_as_current() && !identity.is_alive() {
                Liveness::Stale
            } else {
                Liveness::Alive
            }
        }
    };
    if stamp && liveness == Liveness::Alive {
        slot.alive_seen_ns.fetch_max(probed_at, Ordering::Relaxed);
    }
    liveness
}

/// Stamps slot `index` as found dead at `now` (the death notice every process reads) unless
/// it already is; returns the stamp it carries. The first notice moves the members' epoch. A
/// stamp from the future (another time namespace) restarts the clock rather than counting as
/// expired.
pub(super) fn notice_dead(layout: &RegionLayout, index: usize, now: u64) -> u64 {
    let slot = &layout.slots[index];
    match slot
        .dead_since
        .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => {
            membership_changed(layout);
            now
        }
        Err(stamp) if stamp > now => {
            slot.dead_since.store(now, Ordering::Relaxed);
            now
        }
        Err(stamp) => stamp,
    }
}

fn identity_of(slot: &ProcessSlot) -> ProcessIdentity {
    ProcessIdentity {
        pid: slot.pid.load(Ordering::Relaxed),
        host_pid: slot.host_pid.load(Ordering::Relaxed),
        start_time: slot.start_time.load(Ordering::Relaxed),
        pid_ns: slot.pid_ns.load(Ordering::Relaxed),
    }
}

/// Describes a stale slot for a reap, noticing its death (see [`notice_dead`]).
fn dead_slot(layout: &RegionLayout, index: usize, now: u64) -> DeadSlot {
    let slot = &layout.slots[index];
    let seen = notice_dead(layout, index, now);
    let identity = identity_of(slot);
    let same_namespace = identity.same_namespace_as_current();
    let exit = if !same_namespace {
        ExitState::Unknown
    } else if identity.is_alive() {
        ExitState::Exiting
    } else {
        ExitState::Exited
    };
    DeadSlot {
        slot: SlotId(index as u16),
        pid: identity.pid,
        host_pid: identity.host_pid,
        used_bytes: std::array::from_fn(|d| ledger::bytes_of(slot.used[d].load(Ordering::Relaxed))),
        exit,
        host_pid_reused: same_namespace
            && identity.host_pid == identity.pid
            && identity.pid_reused(),
        dead_for: std::time::Duration::from_nanos(now - seen),
    }
}
