//! Device entries: finding or claiming a device's entry by UUID, and reconciling the limits a
//! process's configuration gives it with the ones in force (module doc of `region`: "Limits
//! rule"). Lock-free: an entry is claimed with one compare-and-swap of its UUID key, and each
//! limit word moves by compare-and-swap from the value the decision was made on.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::layout::{uuid_to_words, DeviceEntry, LIMIT_UNSET, PERCENT_UNSET, UNLIMITED};
use super::open::Fnv;
use super::{
    limit_option, percent_option, DeviceBinding, DeviceId, DeviceLimits, LimitChange, Region,
    RegionError,
};

impl Region {
    /// Finds or creates the entry for each device (by UUID) and writes its configured limits
    /// into it (the configuration wins unless others live; see the module doc).
    pub fn bind_devices(&self, devices: &[DeviceLimits]) -> Result<DeviceBinding, RegionError> {
        let layout = self.map.layout();
        // Asked lazily (it probes every claimed slot's lock), and again after a limit word
        // changed under us: whoever changed it may have just registered.
        let others_live: Cell<Option<bool>> = Cell::new(None);
        let others = |retried: bool| {
            if retried {
                others_live.set(None);
            }
            let live = others_live.get().unwrap_or_else(|| self.others_live());
            others_live.set(Some(live));
            live
        };
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
            let index = find_or_claim(&layout.devices, &wanted.uuid).ok_or_else(no_entry)?;
            let entry = &layout.devices[index];
            let configured_memory = wanted.memory_limit.unwrap_or(UNLIMITED);
            // 100 and above mean "not throttled", stored as 0.
            let configured_compute = wanted
                .compute_percent
                .filter(|p| (1..=99).contains(p))
                .unwrap_or(0);
            let (old_memory, new_memory) = reconcile(
                &entry.memory_limit,
                LIMIT_UNSET,
                configured_memory,
                |old, retried| {
                    if others(retried) {
                        old.min(configured_memory)
                    } else {
                        configured_memory
                    }
                },
            );
            let (old_compute, new_compute) = reconcile(
                &entry.compute_percent,
                PERCENT_UNSET,
                configured_compute,
                |old, retried| {
                    if others(retried) {
                        stricter_percent(old, configured_compute)
                    } else {
                        configured_compute
                    }
                },
            );
            // A fresh entry (nobody had written limits) is no change.
            let fresh = old_memory == LIMIT_UNSET && old_compute == PERCENT_UNSET;
            let old_memory = if old_memory == LIMIT_UNSET {
                configured_memory
            } else {
                old_memory
            };
            let old_compute = if old_compute == PERCENT_UNSET {
                configured_compute
            } else {
                old_compute
            };
            if !fresh && (old_memory, old_compute) != (configured_memory, configured_compute) {
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
}

/// The key of a UUID: a hash that is never 0 (0 marks an unused entry).
fn uuid_key(uuid: &str) -> u64 {
    let mut hash = Fnv::new();
    hash.write(uuid.as_bytes());
    hash.finish().max(1)
}

/// The entry whose key is `uuid`'s, claiming the first unused one if none is. Entries are
/// claimed in order and never given up (until a reset), and every binder scans from the
/// first entry and never passes an unused one without trying to claim it, so two processes
/// binding the same new UUID at once both end on the entry the first of them claimed.
fn find_or_claim(entries: &[DeviceEntry], uuid: &str) -> Option<usize> {
    let key = uuid_key(uuid);
    for (index, entry) in entries.iter().enumerate() {
        let found = match entry.key.load(Ordering::Acquire) {
            0 => match entry
                .key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => true,
                Err(other) => other == key,
            },
            other => other == key,
        };
        if found {
            // Idempotent: every binder of the entry writes the same words (for display).
            for (slot_word, word) in entry.uuid.iter().zip(uuid_to_words(uuid)) {
                slot_word.store(word, Ordering::Relaxed);
            }
            return Some(index);
        }
    }
    None
}

/// A limit word of a device entry (memory bytes, compute percent).
trait LimitWord {
    type Value: Copy + PartialEq;
    fn load(&self) -> Self::Value;
    fn swap_if(&self, old: Self::Value, new: Self::Value) -> Result<(), Self::Value>;
}

macro_rules! limit_word {
    ($atomic:ty, $value:ty) => {
        impl LimitWord for $atomic {
            type Value = $value;
            fn load(&self) -> $value {
                <$atomic>::load(self, Ordering::Acquire)
            }
            fn swap_if(&self, old: $value, new: $value) -> Result<(), $value> {
                self.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                    .map(|_| ())
            }
        }
    };
}
limit_word!(AtomicU64, u64);
limit_word!(AtomicU32, u32);

/// Moves `word` to what `decide` makes of its current value (`configured` where it is still
/// `unset` or already `configured`), by compare-and-swap from the value decided on; returns (old, new). `decide`'s
/// second argument says the word changed under a previous decision.
fn reconcile<W: LimitWord>(
    word: &W,
    unset: W::Value,
    configured: W::Value,
    mut decide: impl FnMut(W::Value, bool) -> W::Value,
) -> (W::Value, W::Value) {
    let mut old = word.load();
    let mut retried = false;
    loop {
        // A word already at the configured value stays there whoever else lives: a start into
        // a slice whose processes share one configuration judges no other slot.
        let new = if old == unset || old == configured {
            configured
        } else {
            decide(old, retried)
        };
        if new == old {
            return (old, new);
        }
        match word.swap_if(old, new) {
            Ok(()) => return (old, new),
            Err(current) => {
                old = current;
                retried = true;
            }
        }
    }
}

/// The lower of two stored compute shares, where 0 means 100 (not throttled).
pub(super) fn stricter_percent(a: u32, b: u32) -> u32 {
    let effective = |p: u32| if p == 0 { 100 } else { p };
    let lower = effective(a).min(effective(b));
    if lower >= 100 {
        0
    } else {
        lower
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_at_the_configured_value_is_decided_without_asking_who_lives() {
        let word = AtomicU64::new(5);
        let asked = Cell::new(0);
        // The decision of a binder that sees others live: the stricter value.
        let stricter = |configured: u64| {
            let asked = &asked;
            move |old: u64, _| {
                asked.set(asked.get() + 1);
                old.min(configured)
            }
        };
        assert_eq!(reconcile(&word, LIMIT_UNSET, 5, stricter(5)), (5, 5));
        assert_eq!(asked.get(), 0, "whoever lives, the configured value stays");
        // A different value is decided.
        assert_eq!(reconcile(&word, LIMIT_UNSET, 9, stricter(9)), (5, 5));
        assert_eq!(reconcile(&word, LIMIT_UNSET, 3, stricter(3)), (5, 3));
        assert_eq!(asked.get(), 2);
    }
}
