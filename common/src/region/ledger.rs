//! The ledger's words and the one protocol that moves bytes (module doc of `region`: "The
//! ledger: one total per device, the slots for attribution").
//!
//! Three kinds of word, all in the mapping:
//! * a device's **total** (`DeviceEntry::total`): the bytes the slice holds on it (low 48 bits,
//!   256 TiB) and a tag naming the last operation that changed it: the slot (10 bits) and the
//!   low bits of that slot's per-device sequence number (6 bits);
//! * a slot's **held** word per device (`ProcessSlot::used`): the bytes the slot holds there
//!   (low 48 bits) and the sequence number of the slot's last operation there that landed;
//! * a slot's **intent** (`ProcessSlot::intent`): the operation the slot has in flight, if any:
//!   the held bytes it leads to, its sequence number, its device and a state (idle, pending,
//!   landed).
//!
//! An operation of slot `s` on device `d` (one at a time per slot: the caller serialises them)
//! 1. writes its intent, pending (sequence = held's + 1);
//! 2. compare-and-swaps the total from what it read to the new bytes with its own tag,
//!    refusing (intent back to idle, nothing changed) when the new bytes pass the limit;
//!    before it overwrites another slot's tag it *confirms* that slot's intent: a pending
//!    intent whose device and sequence match the tag moves to landed;
//! 3. stores its held word (new bytes, its sequence);
//! 4. stores its intent idle.
//!
//! Whatever instruction the owner dies at, [`resolve`] knows whether its operation landed:
//! the total still carries its tag, or somebody overwrote the tag and confirmed it first.
//! (The tag's sequence cannot match a pending operation by accident: while the tag names
//! `s`, `s` has landed nothing on `d` since, so its pending sequence there is the tag's + 1.)
//! A landed operation's held word is then written (the same value step 3 writes, so writing it
//! twice changes nothing); one that did not land changed no word but the intent. After that
//! the slot's held words are exactly its share of the totals, and a reaper gives them back
//! with ordinary operations in the dead slot's name.

use std::sync::atomic::Ordering::SeqCst;

use super::layout::RegionLayout;

/// Largest byte count a total or held word can carry (256 TiB).
pub const MAX_BYTES: u64 = (1 << BYTES_BITS) - 1;
const BYTES_BITS: u32 = 48;
const SEQ_BITS: u32 = 6;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Where a total's slot index starts (above bytes and sequence).
const TAG_SLOT_SHIFT: u32 = BYTES_BITS + SEQ_BITS;
const INTENT_DEVICE_SHIFT: u32 = BYTES_BITS + SEQ_BITS;
const INTENT_STATE_SHIFT: u32 = INTENT_DEVICE_SHIFT + 4;

const IDLE: u64 = 0;
const PENDING: u64 = 1;
const LANDED: u64 = 2;

/// The bytes of a total or held word.
#[inline]
pub fn bytes_of(word: u64) -> u64 {
    word & MAX_BYTES
}

#[inline]
fn seq_of(word: u64) -> u64 {
    (word >> BYTES_BITS) & SEQ_MASK
}

#[inline]
fn held_word(bytes: u64, seq: u64) -> u64 {
    bytes | (seq << BYTES_BITS)
}

#[inline]
fn total_word(bytes: u64, slot: usize, seq: u64) -> u64 {
    bytes | (seq << BYTES_BITS) | ((slot as u64) << TAG_SLOT_SHIFT)
}

#[inline]
fn tag_slot(total: u64) -> usize {
    (total >> TAG_SLOT_SHIFT) as usize
}

#[inline]
fn intent_word(to: u64, seq: u64, device: usize, state: u64) -> u64 {
    held_word(to, seq) | ((device as u64) << INTENT_DEVICE_SHIFT) | (state << INTENT_STATE_SHIFT)
}

#[inline]
fn intent_device(intent: u64) -> usize {
    ((intent >> INTENT_DEVICE_SHIFT) & 0xf) as usize
}

#[inline]
fn intent_state(intent: u64) -> u64 {
    (intent >> INTENT_STATE_SHIFT) & 3
}

#[inline]
fn with_state(intent: u64, state: u64) -> u64 {
    (intent & !(3 << INTENT_STATE_SHIFT)) | (state << INTENT_STATE_SHIFT)
}

/// What an operation does to its slot's share of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Add `bytes` unless the total would pass `limit`.
    Reserve { bytes: u64, limit: u64 },
    /// Add `bytes` whatever the limit (memory the driver already holds).
    PastLimit { bytes: u64 },
    /// Take back up to `bytes` of what the slot holds.
    Release { bytes: u64 },
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Bytes moved (what was added, or what was taken back).
    Done(u64),
    /// Nothing changed; the total was `used` when the limit refused the request.
    Refused { used: u64 },
    /// The step hook stopped the operation (a simulated death).
    Abandoned,
}

/// The points between an operation's writes where a death leaves something for [`resolve`]
/// to judge; a test's step hook stops the operation there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The intent is pending; the total is untouched.
    Intent,
    /// Another slot's intent was just confirmed; our compare-and-swap has not happened.
    Confirmed,
    /// The total carries the change; the held word does not yet.
    Landed,
    /// The held word carries it too; the intent is still pending (or confirmed).
    Applied,
}

/// Runs one operation of `slot` on `device`. The caller guarantees no other operation of
/// `slot` runs meanwhile. `go` is asked at each [`Step`]; false stops the operation there,
/// as a death would (production passes `|_| true`, which compiles away).
#[inline(always)]
pub fn apply(
    layout: &RegionLayout,
    slot: usize,
    device: usize,
    change: Change,
    mut go: impl FnMut(Step) -> bool,
) -> Outcome {
    let record = &layout.slots[slot];
    let held = &record.used[device];
    let total = &layout.devices[device].total;
    let before = held.load(SeqCst);
    let from = bytes_of(before);
    let seq = (seq_of(before) + 1) & SEQ_MASK;
    let (to, moved) = match change {
        Change::Reserve { bytes, .. } | Change::PastLimit { bytes } => {
            match from.checked_add(bytes).filter(|to| *to <= MAX_BYTES) {
                Some(to) => (to, bytes),
                None => {
                    return Outcome::Refused {
                        used: bytes_of(total.load(SeqCst)),
                    }
                }
            }
        }
        Change::Release { bytes } => {
            let taken = bytes.min(from);
            (from - taken, taken)
        }
    };
    if moved == 0 {
        return Outcome::Done(0);
    }
    record
        .intent
        .store(intent_word(to, seq, device, PENDING), SeqCst);
    if !go(Step::Intent) {
        return Outcome::Abandoned;
    }
    let mut current = total.load(SeqCst);
    loop {
        let used = bytes_of(current);
        let next = match change {
            Change::Reserve { limit, .. } => used
                .checked_add(moved)
                .filter(|next| *next <= limit.min(MAX_BYTES)),
            Change::PastLimit { .. } => used.checked_add(moved).filter(|n| *n <= MAX_BYTES),
            Change::Release { .. } => Some(used.saturating_sub(moved)),
        };
        let Some(next) = next else {
            record
                .intent
                .store(intent_word(from, seq, device, IDLE), SeqCst);
            return Outcome::Refused { used };
        };
        if confirm(layout, current, device, slot) && !go(Step::Confirmed) {
            return Outcome::Abandoned;
        }
        match total.compare_exchange_weak(current, total_word(next, slot, seq), SeqCst, SeqCst) {
            Ok(_) => break,
            Err(seen) => current = seen,
        }
    }
    if !go(Step::Landed) {
        return Outcome::Abandoned;
    }
    held.store(held_word(to, seq), SeqCst);
    if !go(Step::Applied) {
        return Outcome::Abandoned;
    }
    record
        .intent
        .store(intent_word(to, seq, device, IDLE), SeqCst);
    Outcome::Done(moved)
}

/// Before a writer overwrites the tag in `total` (of `device`): if it names another slot
/// whose intent is the pending operation that wrote it, marks that intent landed, so a reaper
/// of that slot still knows it landed once the tag is gone. True when it confirmed one.
#[inline]
fn confirm(layout: &RegionLayout, total: u64, device: usize, me: usize) -> bool {
    let owner = tag_slot(total);
    if owner == me {
        // Our own earlier operation: finished (operations of a slot are serialised, and a
        // slot's in-flight operation is resolved before anyone operates in its name).
        return false;
    }
    let Some(other) = layout.slots.get(owner) else {
        return false;
    };
    let intent = other.intent.load(SeqCst);
    intent_state(intent) == PENDING
        && intent_device(intent) == device
        && seq_of(intent) == seq_of(total)
        && other
            .intent
            .compare_exchange(intent, with_state(intent, LANDED), SeqCst, SeqCst)
            .is_ok()
}

/// Settles the in-flight operation of `slot`, whose owner is dead (or who is the caller
/// itself): a landed one is written into the held word, one that did not land is dropped.
/// Afterwards the slot's held words are exactly its share of the totals. The caller excludes
/// every other writer of the slot (the reclaim lock); confirmers of other slots may still
/// run, which the order of the reads below allows for.
pub fn resolve(layout: &RegionLayout, slot: usize) {
    let record = &layout.slots[slot];
    let intent = record.intent.load(SeqCst);
    if intent_state(intent) == IDLE {
        return;
    }
    let device = intent_device(intent);
    // The total first: if its tag is gone, whoever replaced it confirmed the intent before,
    // so the intent read after it shows that.
    let total = layout.devices[device].total.load(SeqCst);
    let confirmed = intent_state(record.intent.load(SeqCst)) == LANDED;
    let tagged = tag_slot(total) == slot && seq_of(total) == seq_of(intent);
    if confirmed || tagged {
        record.used[device].store(held_word(bytes_of(intent), seq_of(intent)), SeqCst);
    }
    record.intent.store(with_state(intent, IDLE), SeqCst);
}

/// Whether an intent word names an operation in flight (its owner died in it, or is in it).
#[inline]
pub fn in_flight(intent: u64) -> bool {
    intent_state(intent) != IDLE
}

/// Bytes `slot` holds on `device` (its share, with no operation in flight).
#[inline]
pub fn held_bytes(layout: &RegionLayout, slot: usize, device: usize) -> u64 {
    bytes_of(layout.slots[slot].used[device].load(SeqCst))
}

/// The slice's bytes on `device`: one load, whatever the number of processes.
#[inline]
pub fn total_bytes(layout: &RegionLayout, device: usize) -> u64 {
    bytes_of(layout.devices[device].total.load(SeqCst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pack_and_unpack() {
        let t = total_word(MAX_BYTES, 1023, SEQ_MASK);
        assert_eq!(bytes_of(t), MAX_BYTES);
        assert_eq!(tag_slot(t), 1023);
        assert_eq!(seq_of(t), SEQ_MASK);
        let i = intent_word(5, 3, 15, PENDING);
        assert_eq!(
            (bytes_of(i), seq_of(i), intent_device(i), intent_state(i)),
            (5, 3, 15, PENDING)
        );
        let l = with_state(i, LANDED);
        assert_eq!((bytes_of(l), intent_state(l)), (5, LANDED));
        assert_eq!(intent_state(with_state(l, IDLE)), IDLE);
    }
}
