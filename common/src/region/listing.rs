//! NVML's process list of a device, read once for every process of the slice that needs it:
//! what each process holds there by the driver's word, without each process reading the
//! whole list (a list of N processes read by N starting processes costs the driver N^2).
//!
//! A process that just made its first context on a device and knows its NVML PID needs the
//! driver's word on what it holds there (the context's real cost). It notes the device's
//! `listing_seq` right after its creation and waits for a listing that began after that:
//! whoever finds no listing being read begins one (one compare-and-swap makes the sequence
//! odd), reads NVML's list, writes each listed member's bytes into its slot's `listed` word
//! with the listing's sequence, and ends it (even again), waking the waiters on the futex
//! word. A reader that stalls (stopped, killed) is taken over after [`TAKEOVER`]; a waiter
//! gives up after its `wait`. So a storm of starts reads the list a few times, not once per
//! process, and nobody waits for a stopped process for longer than [`TAKEOVER`].
//!
//! A process that starts alone does not pay for the others: a waiter holds a
//! [`ListingTicket`] (the device's `listing_waiters` counts them) from before it reads the
//! sequence until it has its answer, and a reader that finds itself the only ticket holder
//! writes its own word only, with no walk of the slice's members. Why no waiter is missed:
//! a waiter counts itself before it reads the sequence, and a reader reads the count after
//! the compare-and-swap that begins its listing (all four sequentially consistent); a waiter
//! whose target is that listing read the sequence before the listing began, so its count
//! comes before the reader's read of it. A waiter killed with its ticket leaves the count
//! high: readers then write every member's word, as for a storm.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::layout::DeviceEntry;
use super::{futex, DeviceId, Member, Region, SlotId};

/// How long a listing may be read before another process takes it over.
pub const TAKEOVER: Duration = Duration::from_millis(250);
/// The longest sleep between two looks: an ended listing wakes its waiters at once; a
/// stalled reader wakes nobody, and is taken over after [`TAKEOVER`] anyway.
const LONGEST_SLEEP: Duration = Duration::from_millis(100);
/// The first sleep: a listing takes about a millisecond, and its end wakes the waiters, so a
/// waiter that woke sooner to look would only take the CPU from the reader (a storm of
/// hundreds of waiters, each looking every 100 us, did).
const FIRST_SLEEP: Duration = Duration::from_millis(2);

const BYTES_BITS: u32 = 44;
const DEVICE_SHIFT: u32 = BYTES_BITS;
const SEQ_SHIFT: u32 = BYTES_BITS + 4;

/// A slot's `listed` word: its bytes on `device` as listing `seq` (its low 16 bits) showed.
fn listed_word(bytes: u64, device: usize, seq: u32) -> u64 {
    bytes.min((1 << BYTES_BITS) - 1)
        | ((device as u64 & 0xf) << DEVICE_SHIFT)
        | (u64::from(seq as u16) << SEQ_SHIFT)
}

/// The smallest ended sequence of a listing that began after `seen` (an ended sequence is
/// even; a listing's begin is its end minus one).
fn first_end_after(seen: u32) -> u32 {
    if seen.is_multiple_of(2) {
        seen.wrapping_add(2)
    } else {
        seen.wrapping_add(3)
    }
}

/// Whether sequence `now` is at or past `target` (both move forward only; wrapping).
fn reached(now: u32, target: u32) -> bool {
    (now.wrapping_sub(target) as i32) >= 0
}

/// A process waiting for a listing of a device that begins after the ticket was taken
/// ([`Region::listing_ticket`]); counted among the device's waiters until dropped.
pub struct ListingTicket<'a> {
    entry: &'a DeviceEntry,
    device: DeviceId,
    seen: u32,
}

impl Drop for ListingTicket<'_> {
    fn drop(&mut self) {
        self.entry.listing_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Region {
    /// A ticket for the next listing of `device`: taken right after the event a listing must
    /// follow (for a context's cost: its creation).
    pub fn listing_ticket(&self, device: DeviceId) -> ListingTicket<'_> {
        let entry = self.entry(device);
        entry.listing_waiters.fetch_add(1, Ordering::SeqCst);
        ListingTicket {
            entry,
            device,
            seen: entry.listing_seq.load(Ordering::SeqCst),
        }
    }

    /// What a listing of the ticket's device that began after the ticket showed `slot`
    /// holding there, waiting at most `wait`; `read` is NVML's list of the device as (NVML
    /// PID, bytes), called when this process is the one to read it (`None`: NVML could not
    /// answer). `None`: the listing did not show the slot, or none came in time.
    pub fn listed_bytes(
        &self,
        slot: SlotId,
        ticket: &ListingTicket<'_>,
        wait: Duration,
        mut read: impl FnMut() -> Option<Vec<(u32, u64)>>,
    ) -> Option<u64> {
        let device = ticket.device;
        let entry = self.entry(device);
        let target = first_end_after(ticket.seen);
        let deadline = Instant::now() + wait;
        let mut sleep = FIRST_SLEEP;
        loop {
            let now = entry.listing_seq.load(Ordering::Acquire);
            if reached(now, target) {
                let word = self.map.layout().slots[slot.index()]
                    .listed
                    .load(Ordering::Acquire);
                // Written by a listing of this device that ended at the target or later (the
                // word keeps the sequence's low 16 bits).
                let on_device = (word >> DEVICE_SHIFT) & 0xf == device.index() as u64;
                let seq = (word >> SEQ_SHIFT) as u16;
                let fresh = (seq.wrapping_sub(target as u16) as i16) >= 0;
                let bytes = word & ((1 << BYTES_BITS) - 1);
                return (on_device && fresh && bytes != 0).then_some(bytes);
            }
            if let Some(begun) = self.begin_listing(entry, now) {
                match read() {
                    // Nobody else holds a ticket: only our own word is wanted.
                    Some(listed) if entry.listing_waiters.load(Ordering::SeqCst) <= 1 => {
                        self.end_listing_alone(entry, device, begun, slot, &listed)
                    }
                    Some(listed) => self.end_listing(entry, device, begun, &listed),
                    None => {
                        // NVML cannot answer: end it, showing nobody.
                        self.end_listing(entry, device, begun, &[]);
                        return None;
                    }
                }
                continue;
            }
            if Instant::now() >= deadline {
                return None;
            }
            futex::wait_while(&entry.listing_seq, now, sleep);
            sleep = (sleep * 2).min(LONGEST_SLEEP);
        }
    }

    fn entry(&self, device: DeviceId) -> &DeviceEntry {
        &self.map.layout().devices[device.index()]
    }

    /// Begins a listing when none is being read (or the one being read stalled past
    /// [`TAKEOVER`]); returns its begin sequence.
    fn begin_listing(&self, entry: &DeviceEntry, now: u32) -> Option<u32> {
        let at = super::monotonic_ns();
        let begun = if now.is_multiple_of(2) {
            now.wrapping_add(1)
        } else {
            let since = entry.listing_since_ns.load(Ordering::Acquire);
            if since <= at && at - since < TAKEOVER.as_nanos() as u64 {
                return None;
            }
            now.wrapping_add(2)
        };
        entry
            .listing_seq
            .compare_exchange(now, begun, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        entry.listing_since_ns.store(at, Ordering::Release);
        Some(begun)
    }

    /// Writes what listing `begun` showed into the members' slots, ends it and wakes the
    /// waiters. A listing taken over meanwhile writes what it read all the same (it began
    /// after every waiter whose target it meets) and leaves the sequence to its successor.
    fn end_listing(
        &self,
        entry: &DeviceEntry,
        device: DeviceId,
        begun: u32,
        listed: &[(u32, u64)],
    ) {
        let ended = begun.wrapping_add(1);
        let slots = &self.map.layout().slots;
        // By the member index alone: a dead member's word (its PID reused by a stranger) is
        // read by nobody.
        self.with_index(|index| {
            for &(driver_pid, bytes) in listed {
                if let Some(m) = index.member(driver_pid) {
                    slots[m.slot.index()]
                        .listed
                        .store(listed_word(bytes, device.index(), ended), Ordering::Release);
                }
            }
        });
        Self::finish_listing(entry, begun);
    }

    /// [`Region::end_listing`] for a reader with no other waiter: writes `slot`'s own word
    /// (under the PID NVML lists it by) and nobody else's.
    fn end_listing_alone(
        &self,
        entry: &DeviceEntry,
        device: DeviceId,
        begun: u32,
        slot: SlotId,
        listed: &[(u32, u64)],
    ) {
        let record = &self.map.layout().slots[slot.index()];
        let me = Member::of(slot.index(), record).driver_pid();
        if let Some(&(_, bytes)) = listed.iter().find(|(pid, _)| *pid == me) {
            record.listed.store(
                listed_word(bytes, device.index(), begun.wrapping_add(1)),
                Ordering::Release,
            );
        }
        Self::finish_listing(entry, begun);
    }

    /// Ends listing `begun` (unless it was taken over) and wakes its waiters.
    fn finish_listing(entry: &DeviceEntry, begun: u32) {
        let _ = entry.listing_seq.compare_exchange(
            begun,
            begun.wrapping_add(1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        futex::wake_all(&entry.listing_seq);
    }
}
