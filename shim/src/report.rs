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

/// NVML's numbers for a slice: total/free as [`slice_view`], reserved clamped into what is not
/// free, used the rest, so `reserved + used + free == total` always holds.
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
    let reserved = physical.reserved.min(not_free);
    NvmlView {
        total: view.total,
        reserved,
        used: not_free - reserved,
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
}
