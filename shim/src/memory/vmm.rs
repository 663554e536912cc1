//! The VMM model (`cuMemCreate` & co.) in plain Rust: when does a physical allocation really
//! go back to the card? A handle's memory is charged at `cuMemCreate` and returned only when
//! it has neither references (create = 1, each `cuMemRetainAllocationHandle` + 1, each
//! `cuMemRelease` - 1) nor mappings (`cuMemMap` + 1; `cuMemUnmap` and `cuMemAddressFree` of a
//! range drop the mappings inside it) — releasing a mapped handle defers the free to the last
//! unmap, as the driver does. Handles imported from another process
//! (`cuMemImportFromShareableHandle`) were never created here, so they are never charged
//! (the exporter is) and mapping them changes nothing.

use std::collections::{BTreeMap, HashMap};

/// What the ledger must give back after an operation: (device entry, bytes).
pub type Freed = Option<(u8, u64)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle {
    device: u8,
    bytes: u64,
    refs: u32,
    maps: u32,
}

#[derive(Debug, Default)]
pub struct VmmBook {
    handles: HashMap<u64, Handle>,
    /// Mapped ranges of charged handles: start -> (size, handle).
    maps: BTreeMap<u64, (u64, u64)>,
    /// Releases of a previous handle with the same value, still to arrive (see `created`).
    late_releases: HashMap<u64, u32>,
}

impl VmmBook {
    /// `cuMemCreate` succeeded: `handle` holds `bytes` on `device`.
    pub fn created(&mut self, handle: u64, device: u8, bytes: u64) -> Freed {
        let stale = self.handles.insert(
            handle,
            Handle {
                device,
                bytes,
                refs: 1,
                maps: 0,
            },
        );
        // A reused handle value we still tracked: the old one is certainly gone. Its
        // outstanding references are `cuMemRelease` calls the driver already served whose
        // bookkeeping is still on its way (another thread): they must not count against the
        // new handle, which would free its charge while it lives.
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

    /// `cuMemMap(ptr, size, .., handle)` succeeded.
    pub fn mapped(&mut self, ptr: u64, size: u64, handle: u64) {
        if let Some(h) = self.handles.get_mut(&handle) {
            h.maps += 1;
            self.maps.insert(ptr, (size, handle));
        }
    }

    /// `cuMemUnmap(ptr, size)` or `cuMemAddressFree(ptr, size)` succeeded: every mapping that
    /// starts inside the range is gone.
    pub fn unmapped_range(&mut self, ptr: u64, size: u64) -> Vec<(u8, u64)> {
        let end = ptr.saturating_add(size);
        let starts: Vec<u64> = self.maps.range(ptr..end).map(|(&s, _)| s).collect();
        let mut freed = Vec::new();
        for start in starts {
            let (_, handle) = self.maps.remove(&start).expect("listed above");
            if let Some(h) = self.handles.get_mut(&handle) {
                h.maps = h.maps.saturating_sub(1);
            }
            freed.extend(self.free_if_unused(handle));
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
    pub fn charged(&self) -> u64 {
        self.handles.values().map(|h| h.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

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
        assert_eq!(book.unmapped_range(0x1000_0000, 2 * MIB), vec![]);
        assert_eq!(book.charged(), 4 * MIB);
        assert_eq!(
            book.unmapped_range(0x2000_0000, 2 * MIB),
            vec![(1, 4 * MIB)]
        );
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
        let freed = book.unmapped_range(0x4000_0000, 4 * MIB);
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
        assert_eq!(book.unmapped_range(0x1000, 2 * MIB), vec![]);
        assert_eq!(book.released(99), None);
    }
}
