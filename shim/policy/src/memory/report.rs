//! The reporting math: what a slice looks like from inside. Pure functions, unit-tested.
//!
//! Rules (from the field notes): the reported total is the limit but never above the physical
//! total (a total above physical broke cuDNN plans); free never exceeds the physical free nor
//! the slice's headroom; nothing wraps below zero (`limit - used` with used > limit showed
//! 17592186044134MiB in nvidia-smi for a peer).

/// Memory numbers of one device: what the driver reported, or what we report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryView {
    pub total: u64,
    pub free: u64,
}

/// The slice's view of a device with `limit` bytes, given the physical numbers and, when
/// known, the bytes the slice already uses (`None` until the memory ledger provides it).
pub fn slice_view(physical: MemoryView, limit: u64, slice_used: Option<u64>) -> MemoryView {
    let total = limit.min(physical.total);
    let headroom = match slice_used {
        Some(used) => total.saturating_sub(used),
        None => total,
    };
    MemoryView {
        total,
        free: physical.free.min(physical.total).min(headroom),
    }
}

/// NVML's v2 numbers (`reserved` is driver-reserved memory, outside `used`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlView {
    pub total: u64,
    pub reserved: u64,
    pub used: u64,
    pub free: u64,
}

/// NVML's numbers for a slice: total/free as [`slice_view`]; with the ledger's figure `used`
/// is the slice's usage (nvidia-smi in the container shows "N MiB / limit"), without it the
/// driver's reservation is clamped into what is not free; `reserved + used + free == total`
/// always holds.
pub fn nvml_slice_view(physical: NvmlView, limit: u64, slice_used: Option<u64>) -> NvmlView {
    let view = slice_view(
        MemoryView {
            total: physical.total,
            free: physical.free,
        },
        limit,
        slice_used,
    );
    let not_free = view.total - view.free;
    let (used, reserved) = match slice_used {
        // The slice's own use is `used`; what else keeps the slice from its headroom (other
        // tenants filling the card) shows as `reserved`.
        Some(used) => {
            let used = used.min(not_free);
            (used, not_free - used)
        }
        None => {
            let reserved = physical.reserved.min(not_free);
            (not_free - reserved, reserved)
        }
    };
    NvmlView {
        total: view.total,
        reserved,
        used,
        free: view.free,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn total_is_the_limit_and_free_is_capped_by_it() {
        let physical = MemoryView {
            total: 32 * GIB,
            free: 30 * GIB,
        };
        assert_eq!(
            slice_view(physical, GIB, None),
            MemoryView {
                total: GIB,
                free: GIB
            }
        );
    }

    #[test]
    fn free_never_exceeds_physical_free() {
        let physical = MemoryView {
            total: 32 * GIB,
            free: GIB / 2,
        };
        assert_eq!(slice_view(physical, 8 * GIB, None).free, GIB / 2);
    }

    #[test]
    fn a_limit_above_physical_reports_physical() {
        let physical = MemoryView {
            total: 32 * GIB,
            free: 20 * GIB,
        };
        assert_eq!(
            slice_view(physical, 64 * GIB, None),
            MemoryView {
                total: 32 * GIB,
                free: 20 * GIB
            }
        );
    }

    #[test]
    fn used_above_limit_does_not_wrap() {
        let physical = MemoryView {
            total: 32 * GIB,
            free: 20 * GIB,
        };
        let view = slice_view(physical, GIB, Some(3 * GIB));
        assert_eq!(
            view,
            MemoryView {
                total: GIB,
                free: 0
            }
        );
        let view = slice_view(physical, 4 * GIB, Some(3 * GIB));
        assert_eq!(view.free, GIB);
    }

    #[test]
    fn inconsistent_driver_numbers_are_clamped() {
        let physical = MemoryView {
            total: GIB,
            free: 2 * GIB,
        };
        assert_eq!(slice_view(physical, 8 * GIB, None).free, GIB);
    }

    #[test]
    fn nvml_parts_always_add_up_to_total() {
        for (reserved, used, free, limit, ledger) in [
            (300 << 20, 10 * GIB, 21 * GIB, GIB, None),
            (0, 0, 32 * GIB, GIB, None),
            (300 << 20, 31 * GIB, GIB / 4, 2 * GIB, Some(5 * GIB)),
            (300 << 20, 2 * GIB, 30 * GIB, 64 * GIB, None),
        ] {
            let physical = NvmlView {
                total: reserved + used + free,
                reserved,
                used,
                free,
            };
            let view = nvml_slice_view(physical, limit, ledger);
            assert_eq!(
                view.reserved + view.used + view.free,
                view.total,
                "{view:?}"
            );
            assert!(view.total <= physical.total && view.total <= limit);
            assert!(view.free <= physical.free);
        }
    }

    #[test]
    fn nvml_used_is_the_slice_usage_when_known() {
        let physical = NvmlView {
            total: 32 * GIB,
            reserved: 256 << 20,
            used: 3 * GIB,
            free: 32 * GIB - 3 * GIB - (256 << 20),
        };
        let view = nvml_slice_view(physical, 8 * GIB, Some(GIB));
        assert_eq!((view.total, view.used, view.free), (8 * GIB, GIB, 7 * GIB));
        assert_eq!(view.reserved, 0);
        // Over the limit (limit lowered): no wrap, used clamped to total.
        let view = nvml_slice_view(physical, GIB, Some(3 * GIB));
        assert_eq!((view.used, view.free, view.reserved), (GIB, 0, 0));
    }
}

/// The slice's part of an NVML process list: only entries whose PID (as the driver reports
/// it: the host PID where the container has its own PID namespace) belongs to a live process
/// of the slice, with that PID translated to the one the container sees (`member`: driver
/// PID -> container PID, `None` for a stranger). Order is kept.
pub fn slice_process_list<T: Copy>(
    mut entries: Vec<T>,
    mut member: impl FnMut(u32) -> Option<u32>,
    pid_of: impl Fn(&T) -> u32,
    with_pid: impl Fn(T, u32) -> T,
) -> Vec<T> {
    // In place: the kept entries move to the front.
    let mut kept = 0;
    for i in 0..entries.len() {
        let entry = entries[i];
        if let Some(pid) = member(pid_of(&entry)) {
            entries[kept] = with_pid(entry, pid);
            kept += 1;
        }
    }
    entries.truncate(kept);
    entries
}

/// NVML's list protocol: `Ok(n)` = copy `n` entries and return SUCCESS; `Err(n)` = set
/// `*count = n` and return INSUFFICIENT_SIZE (the caller's buffer is too small or null).
pub fn list_fits(entries: usize, capacity: u32, buffer_is_null: bool) -> Result<usize, u32> {
    if entries == 0 {
        return Ok(0);
    }
    if buffer_is_null || (capacity as usize) < entries {
        return Err(entries as u32);
    }
    Ok(entries)
}

#[cfg(test)]
mod process_list_tests {
    use super::*;

    #[test]
    fn only_members_remain_with_container_pids() {
        let entries = [(100_001u32, 5u64), (100_002, 6), (100_003, 7)];
        let members = [(100_003, 3), (100_001, 1)];
        let member = |pid| members.iter().find(|m| m.0 == pid).map(|m| m.1);
        let list = slice_process_list(entries.to_vec(), member, |e| e.0, |e, pid| (pid, e.1));
        assert_eq!(list, vec![(1, 5), (3, 7)]);
    }

    #[test]
    fn the_count_protocol_matches_nvml() {
        assert_eq!(list_fits(0, 0, true), Ok(0));
        assert_eq!(list_fits(2, 0, true), Err(2));
        assert_eq!(list_fits(2, 1, false), Err(2));
        assert_eq!(list_fits(2, 5, false), Ok(2));
    }
}
