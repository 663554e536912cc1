//! The application's memory pools as the ledger books them, in plain Rust (the driver calls that
//! read and settle them are `driver_sized::pool_reservations`). A pool holds RESERVED physical
//! memory, part of which is handed out; a free returns bytes to the pool, which may keep them
//! reserved (release threshold) and gives them back to the card at a synchronisation point or
//! `cuMemPoolTrimTo`, calls the shim does not all see. So the ledger charges a pool for what it
//! REALLY holds: after every pool operation the shim reads the driver's
//! `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and [`PoolBook::settle`] turns the difference from the
//! last reading into a charge or a refund. Pointers from pools carry no charge of their own.
//!
//! Between a synchronisation that shrank a pool and the next reading the ledger over-counts
//! (the safe direction); readings are also taken when memory is reported and before an
//! allocation is refused, so cached-but-released bytes never cause a false OOM.
//!
//! **Allocations.** The shim reserves an upper bound (the request, rounded) before the driver
//! allocates; the reading after it says what the pool really grew by, which [`cover`] turns
//! into a refund of the unused bound or the shortfall still to charge. A pool takes memory in
//! OS allocations of its own granularity, so it may grow by more than the request; when that
//! shortfall does not fit, the allocation is undone (by the caller) rather than kept past the
//! cap.
//!
//! **Destroyed pools.** "If any pointers obtained from this pool haven't been freed ...
//! cuMemPoolDestroy will return immediately and the resources associated with the pool will be
//! released automatically once there are no more outstanding allocations." After the destroy
//! the handle names nothing the caller may use, so the shim never reads it again: a pool
//! destroyed with allocations outstanding keeps its charge (the last reading) until the last
//! of them is freed (by a free, or with the context that owned it), then all of it is
//! refunded. A pool whose reading fails is refunded only when nothing is allocated from it.

use std::collections::HashMap;

use gpuslice_abi::cuda::vmm::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
};
use gpuslice_abi::cuda::CUdevice;

/// Where a pool's memory lives. "The pool may be from a device different than that of the
/// specified hStream" (cuMemAllocFromPoolAsync): a pool allocation is charged to the pool's
/// device, never to the current context's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolHome {
    /// Device memory of this CUDA device ordinal.
    Device(CUdevice),
    /// Host memory (`CU_MEM_LOCATION_TYPE_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`): never
    /// charged to a GPU.
    Host,
}

/// The home a pool created with `props.location` = (`location_type`, `id`) has; `None` for a
/// location type this shim does not know (the allocation's stream then decides).
pub fn home_of(location_type: u32, id: i32) -> Option<PoolHome> {
    match location_type {
        CU_MEM_LOCATION_TYPE_DEVICE => Some(PoolHome::Device(id)),
        CU_MEM_LOCATION_TYPE_HOST
        | CU_MEM_LOCATION_TYPE_HOST_NUMA
        | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Some(PoolHome::Host),
        _ => None,
    }
}

/// Pool handle -> home, as learned from `cuMemPoolCreate` (its props) and from the calls
/// that name a device's pools (`cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`,
/// `cuDeviceSetMemPool`). A destroyed pool is forgotten: its handle value may come back for
/// another pool, whose own creation then says where it lives.
#[derive(Debug, Default)]
pub struct PoolHomes {
    homes: HashMap<u64, PoolHome>,
}

impl PoolHomes {
    /// `pool` lives at `home` (`None`: somewhere this shim cannot name; forget any old entry).
    pub fn learned(&mut self, pool: u64, home: Option<PoolHome>) {
        match home {
            Some(home) if pool != 0 => {
                self.homes.insert(pool, home);
            }
            _ => {
                self.homes.remove(&pool);
            }
        }
    }

    pub fn forget(&mut self, pool: u64) {
        self.homes.remove(&pool);
    }

    pub fn home(&self, pool: u64) -> Option<PoolHome> {
        self.homes.get(&pool).copied()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolState {
    device: u8,
    /// What the ledger charged for the pool: its last reading.
    charged: u64,
    /// Allocations from the pool this process made and has not freed.
    outstanding: u64,
    /// `cuMemPoolDestroy` succeeded while allocations were outstanding: the handle is never
    /// read again; the charge goes when `outstanding` reaches 0.
    destroyed: bool,
}

impl PoolState {
    /// Whether the entry still carries anything worth keeping.
    fn needed(&self) -> bool {
        self.outstanding > 0 || (!self.destroyed && self.charged > 0)
    }
}

/// How the charge of a pool must change after a reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Unchanged,
    /// Charge this many more bytes on the device.
    Grow {
        device: u8,
        bytes: u64,
    },
    /// Give this many bytes back.
    Shrink {
        device: u8,
        bytes: u64,
    },
}

/// What a reservation of `bound` bytes, made before a pool allocation, becomes once the
/// pool's real change is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cover {
    /// The bound covered the change: give this much of it (and of any shrink) back.
    Refund(u64),
    /// The pool grew by more than the bound: this much more must be charged.
    Short(u64),
}

/// The bound stood in for the pool's growth: how it settles against the real `change`.
pub fn cover(bound: u64, change: Settle) -> Cover {
    match change {
        Settle::Unchanged => Cover::Refund(bound),
        Settle::Shrink { bytes, .. } => Cover::Refund(bound.saturating_add(bytes)),
        Settle::Grow { bytes, .. } if bytes <= bound => Cover::Refund(bound - bytes),
        Settle::Grow { bytes, .. } => Cover::Short(bytes - bound),
    }
}

/// What freeing one allocation of a pool means for its charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    /// A live pool: read it again (on `device`).
    Reread { device: u8 },
    /// A destroyed pool: apply this (all of it back after its last allocation).
    Settled(Settle),
    /// Not a pool this book knows.
    Unknown,
}

#[derive(Debug, Default)]
pub struct PoolBook {
    pools: HashMap<u64, PoolState>,
}

impl PoolBook {
    fn state(&mut self, pool: u64, device: u8) -> &mut PoolState {
        self.pools.entry(pool).or_insert(PoolState {
            device,
            charged: 0,
            outstanding: 0,
            destroyed: false,
        })
    }

    fn tidy(&mut self, pool: u64) {
        if self.pools.get(&pool).is_some_and(|s| !s.needed()) {
            self.pools.remove(&pool);
        }
    }

    /// The change a reading of `reserved` bytes would make (nothing recorded).
    pub fn change(&self, pool: u64, device: u8, reserved: u64) -> Settle {
        let (device, before) = self
            .pools
            .get(&pool)
            .map_or((device, 0), |s| (s.device, s.charged));
        match reserved.cmp(&before) {
            std::cmp::Ordering::Equal => Settle::Unchanged,
            std::cmp::Ordering::Greater => Settle::Grow {
                device,
                bytes: reserved - before,
            },
            std::cmp::Ordering::Less => Settle::Shrink {
                device,
                bytes: before - reserved,
            },
        }
    }

    /// Records a reading whose [`Self::change`] the caller has applied to the ledger.
    pub fn record(&mut self, pool: u64, device: u8, reserved: u64) {
        self.state(pool, device).charged = reserved;
        self.tidy(pool);
    }

    /// The driver says `pool` (on `device`) now reserves `reserved` bytes.
    pub fn settle(&mut self, pool: u64, device: u8, reserved: u64) -> Settle {
        let change = self.change(pool, device, reserved);
        self.record(pool, device, reserved);
        change
    }

    /// The driver allocated from `pool`. A pool this book has as destroyed that the driver
    /// allocates from is a new pool under a reused handle value: it starts afresh (its
    /// reading settles the charge).
    pub fn allocated(&mut self, pool: u64, device: u8) {
        let state = self.state(pool, device);
        if state.destroyed {
            state.destroyed = false;
            state.outstanding = 0;
        }
        state.outstanding += 1;
    }

    /// One allocation from `pool` was freed (by the caller, or with its context).
    pub fn freed(&mut self, pool: u64) -> Freed {
        let Some(state) = self.pools.get_mut(&pool) else {
            return Freed::Unknown;
        };
        state.outstanding = state.outstanding.saturating_sub(1);
        if !state.destroyed {
            let device = state.device;
            self.tidy(pool);
            return Freed::Reread { device };
        }
        if state.outstanding > 0 {
            return Freed::Settled(Settle::Unchanged);
        }
        let state = self.pools.remove(&pool).expect("present above");
        Freed::Settled(if state.charged > 0 {
            Settle::Shrink {
                device: state.device,
                bytes: state.charged,
            }
        } else {
            Settle::Unchanged
        })
    }

    /// `cuMemPoolDestroy(pool)` succeeded: with nothing allocated from it the pool is gone (all
    /// of it back); otherwise it keeps its charge until its last allocation is freed.
    pub fn destroyed(&mut self, pool: u64) -> Settle {
        let Some(state) = self.pools.get_mut(&pool) else {
            return Settle::Unchanged;
        };
        if state.outstanding > 0 {
            state.destroyed = true;
            return Settle::Unchanged;
        }
        let state = self.pools.remove(&pool).expect("present above");
        if state.charged > 0 {
            Settle::Shrink {
                device: state.device,
                bytes: state.charged,
            }
        } else {
            Settle::Unchanged
        }
    }

    /// A live pool's attribute cannot be read. With allocations outstanding its memory is
    /// certainly still held: the charge stays; otherwise the pool is taken as gone.
    pub fn unreadable(&mut self, pool: u64) -> Settle {
        match self.pools.get(&pool) {
            Some(state) if state.outstanding == 0 && !state.destroyed => {
                let state = self.pools.remove(&pool).expect("present above");
                if state.charged > 0 {
                    Settle::Shrink {
                        device: state.device,
                        bytes: state.charged,
                    }
                } else {
                    Settle::Unchanged
                }
            }
            _ => Settle::Unchanged,
        }
    }

    /// Live pools this book charges or holds allocations of (to re-read them all). Destroyed
    /// pools are not among them: their handles may not be used.
    pub fn known(&self) -> Vec<(u64, u8)> {
        self.pools
            .iter()
            .filter(|(_, s)| !s.destroyed)
            .map(|(&p, s)| (p, s.device))
            .collect()
    }

    /// The device entry of a live pool this book knows.
    pub fn device_of(&self, pool: u64) -> Option<u8> {
        self.pools
            .get(&pool)
            .filter(|s| !s.destroyed)
            .map(|s| s.device)
    }

    /// Whether `pool` was destroyed with allocations outstanding (its handle must not be read).
    pub fn is_destroyed(&self, pool: u64) -> bool {
        self.pools.get(&pool).is_some_and(|s| s.destroyed)
    }

    pub fn charged(&self, pool: u64) -> u64 {
        self.pools.get(&pool).map_or(0, |s| s.charged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_pool_lives_on_the_device_its_props_name_and_host_pools_on_no_gpu() {
        assert_eq!(home_of(1, 3), Some(PoolHome::Device(3)));
        for host in [2, 3, 4] {
            assert_eq!(home_of(host, 0), Some(PoolHome::Host), "type {host}");
        }
        assert_eq!(home_of(0, 0), None, "INVALID");
        assert_eq!(home_of(0x7fff_ffff, 1), None, "MAX / unknown");
    }

    #[test]
    fn pool_homes_are_learned_replaced_and_forgotten() {
        let mut homes = PoolHomes::default();
        assert_eq!(homes.home(7), None);
        homes.learned(7, Some(PoolHome::Device(1)));
        assert_eq!(homes.home(7), Some(PoolHome::Device(1)));
        // A reused handle value: its creation says where the new pool lives.
        homes.learned(7, Some(PoolHome::Host));
        assert_eq!(homes.home(7), Some(PoolHome::Host));
        homes.learned(7, None);
        assert_eq!(
            homes.home(7),
            None,
            "an unknown location forgets the old home"
        );
        homes.learned(0, Some(PoolHome::Device(0)));
        assert_eq!(homes.home(0), None, "NULL is no pool");
        homes.learned(9, Some(PoolHome::Device(0)));
        homes.forget(9);
        assert_eq!(homes.home(9), None);
    }

    #[test]
    fn readings_become_charges_and_refunds() {
        let mut book = PoolBook::default();
        assert_eq!(
            book.settle(1, 0, 4 * MIB),
            Settle::Grow {
                device: 0,
                bytes: 4 * MIB
            }
        );
        assert_eq!(book.settle(1, 0, 4 * MIB), Settle::Unchanged);
        assert_eq!(
            book.settle(1, 0, 2 * MIB),
            Settle::Shrink {
                device: 0,
                bytes: 2 * MIB
            }
        );
        assert_eq!(book.charged(1), 2 * MIB);
        assert_eq!(
            book.settle(1, 0, 0),
            Settle::Shrink {
                device: 0,
                bytes: 2 * MIB
            }
        );
        assert!(book.known().is_empty());
    }

    #[test]
    fn a_change_is_only_recorded_when_asked() {
        let mut book = PoolBook::default();
        book.settle(1, 0, 4 * MIB);
        assert_eq!(
            book.change(1, 0, 70 * MIB),
            Settle::Grow {
                device: 0,
                bytes: 66 * MIB
            }
        );
        assert_eq!(book.charged(1), 4 * MIB, "a refused growth leaves no trace");
        book.record(1, 0, 70 * MIB);
        assert_eq!(book.charged(1), 70 * MIB);
    }

    #[test]
    fn the_bound_covers_the_growth_or_says_what_is_short() {
        let grow = |bytes| Settle::Grow { device: 0, bytes };
        assert_eq!(cover(4 * MIB, Settle::Unchanged), Cover::Refund(4 * MIB));
        assert_eq!(cover(4 * MIB, grow(2 * MIB)), Cover::Refund(2 * MIB));
        assert_eq!(cover(4 * MIB, grow(4 * MIB)), Cover::Refund(0));
        // OS allocations coarser than the request: a 2 MiB request grew the pool 64 MiB.
        assert_eq!(cover(2 * MIB, grow(64 * MIB)), Cover::Short(62 * MIB));
        let shrink = Settle::Shrink {
            device: 0,
            bytes: 6 * MIB,
        };
        assert_eq!(cover(4 * MIB, shrink), Cover::Refund(10 * MIB));
    }

    #[test]
    fn a_pool_with_nothing_allocated_is_refunded_when_destroyed_or_unreadable() {
        let mut book = PoolBook::default();
        book.settle(9, 3, 6 * MIB);
        assert_eq!(
            book.destroyed(9),
            Settle::Shrink {
                device: 3,
                bytes: 6 * MIB
            }
        );
        assert_eq!(book.destroyed(9), Settle::Unchanged, "refunded once");
        book.settle(9, 3, 6 * MIB);
        assert_eq!(
            book.unreadable(9),
            Settle::Shrink {
                device: 3,
                bytes: 6 * MIB
            }
        );
        assert_eq!(book.unreadable(9), Settle::Unchanged, "refunded once");
    }

    #[test]
    fn a_pool_destroyed_with_allocations_outstanding_is_charged_until_the_last_is_freed() {
        let mut book = PoolBook::default();
        book.settle(7, 1, 1024 * MIB);
        book.allocated(7, 1);
        book.allocated(7, 1);
        assert_eq!(book.destroyed(7), Settle::Unchanged, "its memory stays");
        assert!(book.is_destroyed(7));
        assert!(book.known().is_empty(), "its handle is never read again");
        assert_eq!(book.device_of(7), None);
        assert_eq!(book.unreadable(7), Settle::Unchanged);
        assert_eq!(book.charged(7), 1024 * MIB);
        assert_eq!(book.freed(7), Freed::Settled(Settle::Unchanged));
        assert_eq!(
            book.freed(7),
            Freed::Settled(Settle::Shrink {
                device: 1,
                bytes: 1024 * MIB
            }),
            "the last free releases the pool"
        );
        assert_eq!(book.freed(7), Freed::Unknown, "refunded once");
        assert!(!book.is_destroyed(7));
    }

    #[test]
    fn a_live_pool_with_allocations_keeps_its_charge_when_unreadable() {
        let mut book = PoolBook::default();
        book.settle(5, 0, 8 * MIB);
        book.allocated(5, 0);
        assert_eq!(book.unreadable(5), Settle::Unchanged);
        assert_eq!(book.charged(5), 8 * MIB);
        assert_eq!(book.freed(5), Freed::Reread { device: 0 });
        // Reading 0 with nothing allocated: the entry goes.
        assert_eq!(
            book.settle(5, 0, 0),
            Settle::Shrink {
                device: 0,
                bytes: 8 * MIB
            }
        );
        assert!(book.known().is_empty());
    }

    #[test]
    fn a_reading_of_zero_keeps_the_count_of_outstanding_allocations() {
        let mut book = PoolBook::default();
        book.allocated(4, 0);
        book.settle(4, 0, 0);
        assert_eq!(book.known(), vec![(4, 0)]);
        assert_eq!(book.freed(4), Freed::Reread { device: 0 });
        assert!(book.known().is_empty());
    }

    #[test]
    fn a_reused_handle_of_a_destroyed_pool_starts_afresh() {
        let mut book = PoolBook::default();
        book.settle(3, 0, 10 * MIB);
        book.allocated(3, 0);
        book.destroyed(3);
        // The driver allocated from the handle: a new pool has it now.
        book.allocated(3, 0);
        assert!(!book.is_destroyed(3));
        assert_eq!(
            book.settle(3, 0, 2 * MIB),
            Settle::Shrink {
                device: 0,
                bytes: 8 * MIB
            }
        );
        assert_eq!(book.freed(3), Freed::Reread { device: 0 });
    }
}
