//! The VMM model (`cuMemCreate` & co.) in plain Rust (the driver calls that feed it are
//! `driver_sized::vmm_calls`): when does a physical allocation really go back to the card? A
//! handle's memory is charged at `cuMemCreate` and returned only when it has neither references
//! (create = 1, each `cuMemRetainAllocationHandle` + 1, each `cuMemRelease` - 1) nor mappings
//! (`cuMemMap` + 1; `cuMemUnmap` and `cuMemAddressFree` of a range drop the mappings inside it) —
//! releasing a mapped handle defers the free to the last unmap, as the driver does. Handles
//! imported from another process (`cuMemImportFromShareableHandle`) were never created here, so
//! they are never charged (the exporter is) and mapping them changes nothing.
//!
//! **Address reuse between threads.** The book learns of an unmap only AFTER the driver has
//! done it, and by then the range is free in the driver: another thread may map its own
//! handle there and record that first. Keyed by address alone, the new mapping would
//! overwrite the old one (which then never ends: budget lost for good) and the late unmap
//! would end the NEW one (whose handle, once released, is refunded while still mapped: the
//! card past the cap). So every mapping is recorded under (address, sequence number), and an
//! unmap takes a ticket from the same counter BEFORE it calls the driver: it ends exactly the
//! mappings in its range recorded before its ticket. A mapping recorded after the ticket was
//! made by a `cuMemMap` that returned after the unmap was issued, so it is not one the unmap
//! removed: it was either made in the freed range after the unmap (and lives), or it is an
//! application race on the same range that the driver itself cannot order. (A mapping is
//! always recorded before `cuMemMap` returns, so nobody can unmap it before it is recorded.)
//! Mappings also name their handle's generation: a handle value the driver hands out again
//! is a new generation, and a late unmap of the old one's mapping leaves the new one alone.

use std::collections::{BTreeMap, HashMap};

/// What the ledger must give back after an operation: (device entry, bytes).
pub type Freed = Option<(u8, u64)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle {
    device: u8,
    bytes: u64,
    refs: u32,
    maps: u32,
    /// Which of the handles that had this value it is (see the module doc).
    generation: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mapping {
    size: u64,
    handle: u64,
    generation: u64,
}

/// Taken before a `cuMemUnmap` / `cuMemAddressFree` calls the driver; ends the mappings
/// recorded before it ([`VmmBook::unmapped_range`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

#[derive(Debug, Default)]
pub struct VmmBook {
    handles: HashMap<u64, Handle>,
    /// Mapped ranges of charged handles: (start, sequence number) -> mapping.
    maps: BTreeMap<(u64, u64), Mapping>,
    /// Releases of a previous handle with the same value, still to arrive (see `created`).
    late_releases: HashMap<u64, u32>,
    /// The one counter behind sequence numbers, tickets and generations.
    clock: u64,
}

impl VmmBook {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// `cuMemCreate` succeeded: `handle` holds `bytes` on `device`.
    pub fn created(&mut self, handle: u64, device: u8, bytes: u64) -> Freed {
        let generation = self.tick();
        let stale = self.handles.insert(
            handle,
            Handle {
                device,
                bytes,
                refs: 1,
                maps: 0,
                generation,
            },
        );
        // A reused handle value we still tracked: the old one is certainly gone (the driver
        // frees a handle's memory before it hands the value out again). Its outstanding
        // references are `cuMemRelease` calls the driver already served whose bookkeeping is
        // still on its way (another thread): they must not count against the new handle,
        // which would free its charge while it lives. Its mappings' late unmaps are told apart
        // by the generation.
        let stale = stale?;
        if stale.refs > 0 {
            *self.late_releases.entry(handle).or_insert(0) += stale.refs;
        }
        Some((stale.device, stale.bytes))
    }

    pub fn retained(&mut self, handle: u64) {
        if let Some(h) = self.handles.get_mut(&handle) {
            h.refs += 1;
        }
    }

    /// `cuMemRelease` succeeded.
    pub fn released(&mut self, handle: u64) -> Freed {
        if let Some(late) = self.late_releases.get_mut(&handle) {
            *late -= 1;
            if *late == 0 {
                self.late_releases.remove(&handle);
            }
            return None;
        }
        let h = self.handles.get_mut(&handle)?;
        h.refs = h.refs.saturating_sub(1);
        self.free_if_unused(handle)
    }

    /// `cuMemMap(ptr, size, .., handle)` succeeded (recorded before it returns to the caller).
    pub fn mapped(&mut self, ptr: u64, size: u64, handle: u64) {
        let seq = self.tick();
        if let Some(h) = self.handles.get_mut(&handle) {
            h.maps += 1;
            let generation = h.generation;
            self.maps.insert(
                (ptr, seq),
                Mapping {
                    size,
                    handle,
                    generation,
                },
            );
        }
    }

    /// To be taken right BEFORE `cuMemUnmap` / `cuMemAddressFree` calls the driver.
    pub fn ticket(&mut self) -> Ticket {
        Ticket(self.tick())
    }

    /// `cuMemUnmap(ptr, size)` or `cuMemAddressFree(ptr, size)`, ticketed `ticket`,
    /// succeeded: every mapping that starts inside the range and was recorded before the
    /// ticket is gone. Returns what goes back to the card.
    pub fn unmapped_range(&mut self, ptr: u64, size: u64, ticket: Ticket) -> Vec<(u8, u64)> {
        let end = ptr.saturating_add(size);
        let ended: Vec<(u64, u64)> = self
            .maps
            .range((ptr, 0)..(end, 0))
            .map(|(&key, _)| key)
            .filter(|&(_, seq)| seq < ticket.0)
            .collect();
        let mut freed = Vec::new();
        for key in ended {
            let m = self.maps.remove(&key).expect("listed above");
            match self.handles.get_mut(&m.handle) {
                Some(h) if h.generation == m.generation => {
                    h.maps = h.maps.saturating_sub(1);
                    freed.extend(self.free_if_unused(m.handle));
                }
                // A previous handle with this value: refunded when the value came back.
                _ => {}
            }
        }
        freed
    }

    fn free_if_unused(&mut self, handle: u64) -> Freed {
        let h = *self.handles.get(&handle)?;
        if h.refs == 0 && h.maps == 0 {
            self.handles.remove(&handle);
            Some((h.device, h.bytes))
        } else {
            None
        }
    }

    /// Bytes still charged for handles (tests, diagnostics).
    #[cfg(test)]
    pub fn charged(&self) -> u64 {
        self.handles.values().map(|h| h.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    /// An unmap with its ticket taken now (no race).
    fn unmap(book: &mut VmmBook, ptr: u64, size: u64) -> Vec<(u8, u64)> {
        let t = book.ticket();
        book.unmapped_range(ptr, size, t)
    }

    #[test]
    fn a_late_release_of_a_reused_handle_value_does_not_free_the_new_one() {
        let mut book = VmmBook::default();
        assert_eq!(book.created(7, 0, 4 * MIB), None);
        // The driver served cuMemRelease(7) and handed 7 out again before the releasing
        // thread's bookkeeping arrived.
        assert_eq!(book.created(7, 0, 6 * MIB), Some((0, 4 * MIB)));
        assert_eq!(
            book.released(7),
            None,
            "the late release is the old handle's"
        );
        assert_eq!(book.released(7), Some((0, 6 * MIB)));
    }

    #[test]
    fn release_of_an_unmapped_handle_frees_at_once() {
        let mut book = VmmBook::default();
        book.created(7, 0, 4 * MIB);
        assert_eq!(book.released(7), Some((0, 4 * MIB)));
        assert_eq!(book.charged(), 0);
        assert_eq!(
            book.released(7),
            None,
            "second release is the driver's error"
        );
    }

    #[test]
    fn release_while_mapped_defers_until_the_last_unmap() {
        let mut book = VmmBook::default();
        book.created(7, 1, 4 * MIB);
        book.mapped(0x1000_0000, 2 * MIB, 7);
        book.mapped(0x2000_0000, 2 * MIB, 7);
        assert_eq!(book.released(7), None);
        assert_eq!(unmap(&mut book, 0x1000_0000, 2 * MIB), vec![]);
        assert_eq!(book.charged(), 4 * MIB);
        assert_eq!(unmap(&mut book, 0x2000_0000, 2 * MIB), vec![(1, 4 * MIB)]);
    }

    #[test]
    fn address_free_drops_every_mapping_inside_and_retain_adds_a_reference() {
        let mut book = VmmBook::default();
        book.created(1, 0, 2 * MIB);
        book.created(2, 0, 2 * MIB);
        book.mapped(0x4000_0000, 2 * MIB, 1);
        book.mapped(0x4020_0000, 2 * MIB, 2);
        book.retained(2);
        assert_eq!(book.released(1), None);
        assert_eq!(book.released(2), None);
        let freed = unmap(&mut book, 0x4000_0000, 4 * MIB);
        assert_eq!(
            freed,
            vec![(0, 2 * MIB)],
            "handle 2 still has the retained ref"
        );
        assert_eq!(book.released(2), Some((0, 2 * MIB)));
    }

    #[test]
    fn imported_handles_are_never_charged() {
        let mut book = VmmBook::default();
        book.mapped(0x1000, 2 * MIB, 99);
        assert_eq!(unmap(&mut book, 0x1000, 2 * MIB), vec![]);
        assert_eq!(book.released(99), None);
    }

    /// Thread A unmaps its handle 1 at `va`; before A's bookkeeping arrives, thread B maps its
    /// handle 2 in the freed range and releases it (the mapping keeps it).
    #[test]
    fn a_range_remapped_before_the_unmap_is_booked_keeps_the_new_mapping() {
        let va = 0x7000_0000;
        let mut book = VmmBook::default();
        book.created(1, 0, 60 * MIB);
        book.mapped(va, 60 * MIB, 1);
        assert_eq!(book.released(1), None);
        let a = book.ticket(); // A: cuMemUnmap(va) is called, the driver unmaps
        book.created(2, 0, 60 * MIB); // B: cuMemCreate, cuMemMap(va), cuMemRelease
        book.mapped(va, 60 * MIB, 2);
        assert_eq!(book.released(2), None, "mapped: nothing goes back yet");
        // A's bookkeeping: handle 1's memory went back; handle 2 is still mapped.
        assert_eq!(book.unmapped_range(va, 60 * MIB, a), vec![(0, 60 * MIB)]);
        assert_eq!(book.charged(), 60 * MIB);
        // B's own unmap ends handle 2.
        assert_eq!(unmap(&mut book, va, 60 * MIB), vec![(0, 60 * MIB)]);
        assert_eq!(book.charged(), 0);
    }

    /// The same with reserve/free churn: A's `cuMemAddressFree` (its mapping already unmapped)
    /// arrives after B reserved the same range and mapped into it.
    #[test]
    fn a_late_address_free_leaves_a_mapping_made_after_it_alone() {
        let va = 0x7000_0000;
        let mut book = VmmBook::default();
        book.created(1, 0, 60 * MIB);
        book.mapped(va, 60 * MIB, 1);
        assert_eq!(book.released(1), None);
        assert_eq!(unmap(&mut book, va, 60 * MIB), vec![(0, 60 * MIB)]);
        let a = book.ticket(); // A: cuMemAddressFree(va) is called
        book.created(2, 0, 60 * MIB); // B: reserve (same range), create, map, release
        book.mapped(va, 60 * MIB, 2);
        assert_eq!(book.released(2), None);
        assert_eq!(
            book.unmapped_range(va, 60 * MIB, a),
            vec![],
            "not B's mapping"
        );
        assert_eq!(book.charged(), 60 * MIB);
        assert_eq!(unmap(&mut book, va, 60 * MIB), vec![(0, 60 * MIB)]);
    }

    /// A handle value handed out again while a mapping of the old handle's is still booked:
    /// the old mapping's late unmap does not end the new handle's mapping.
    #[test]
    fn a_late_unmap_of_an_old_handle_value_leaves_the_new_handle_alone() {
        let mut book = VmmBook::default();
        book.created(7, 0, 4 * MIB);
        book.mapped(0x1000_0000, 4 * MIB, 7);
        let a = book.ticket(); // unmap of the old 7 called; its cuMemRelease follows at once
        assert_eq!(
            book.created(7, 0, 4 * MIB),
            Some((0, 4 * MIB)),
            "old 7 is gone"
        );
        book.mapped(0x2000_0000, 4 * MIB, 7);
        assert_eq!(book.released(7), None, "the old 7's late release");
        assert_eq!(book.unmapped_range(0x1000_0000, 4 * MIB, a), vec![]);
        assert_eq!(book.released(7), None, "new 7: still mapped");
        assert_eq!(book.charged(), 4 * MIB);
        assert_eq!(unmap(&mut book, 0x2000_0000, 4 * MIB), vec![(0, 4 * MIB)]);
    }
}
