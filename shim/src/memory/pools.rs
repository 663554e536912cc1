//! Memory pools in plain Rust. A pool holds RESERVED physical memory, part of which is handed
//! out; a free returns bytes to the pool, which may keep them reserved (release threshold) and
//! gives them back to the card at a synchronisation point or `cuMemPoolTrimTo`, calls the shim
//! does not all see. So the ledger charges a pool for what it REALLY holds: after every pool
//! operation the shim reads the driver's `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and
//! [`PoolBook::settle`] turns the difference from the last reading into a charge or a refund.
//! Pointers from pools carry no charge of their own.
//!
//! Between a synchronisation that shrank a pool and the next reading the ledger over-counts
//! (the safe direction); readings are also taken when memory is reported and before an
//! allocation is refused, so cached-but-released bytes never cause a false OOM.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolState {
    device: u8,
    charged: u64,
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

#[derive(Debug, Default)]
pub struct PoolBook {
    pools: HashMap<u64, PoolState>,
}

impl PoolBook {
    /// The driver says `pool` (on `device`) now reserves `reserved` bytes.
    pub fn settle(&mut self, pool: u64, device: u8, reserved: u64) -> Settle {
        let state = self
            .pools
            .entry(pool)
            .or_insert(PoolState { device, charged: 0 });
        let before = state.charged;
        state.charged = reserved;
        let device = state.device;
        if reserved == 0 {
            self.pools.remove(&pool);
        }
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

    /// The pool no longer exists (its attribute cannot be read): refund all of it.
    pub fn forget(&mut self, pool: u64) -> Settle {
        match self.pools.remove(&pool) {
            Some(state) if state.charged > 0 => Settle::Shrink {
                device: state.device,
                bytes: state.charged,
            },
            _ => Settle::Unchanged,
        }
    }

    /// Pools currently charged (to re-read them all).
    pub fn known(&self) -> Vec<(u64, u8)> {
        self.pools.iter().map(|(&p, s)| (p, s.device)).collect()
    }

    /// The device entry of a charged pool.
    pub fn device_of(&self, pool: u64) -> Option<u8> {
        self.pools.get(&pool).map(|s| s.device)
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
    fn a_vanished_pool_is_refunded_once() {
        let mut book = PoolBook::default();
        book.settle(9, 3, 6 * MIB);
        assert_eq!(
            book.forget(9),
            Settle::Shrink {
                device: 3,
                bytes: 6 * MIB
            }
        );
        assert_eq!(book.forget(9), Settle::Unchanged);
    }
}
