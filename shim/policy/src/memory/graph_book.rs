//! CUDA graph memory as the ledger books it, in plain Rust: what the ledger charged for each
//! device's graph memory pool (its last reading), and the execs whose first upload or launch
//! is still to be read. The driver calls that read the pools and settle this book are
//! `driver_sized::graph_reservations`, whose doc says how graph memory is charged.
//!
//! This book sits below the ledger, which holds one per process (`Ledger::graphs`): it imports
//! nothing of the ledger, so the dependency runs one way, ledger -> book, like the pool and VMM
//! books. What needs the ledger and the driver together (reading a pool, charging or refunding
//! the difference) is the driver path's, above both.

use std::collections::HashSet;

use gpuslice_abi::cuda::CUdevice;

use super::pool_book::Settle;

/// Per process: what the ledger charged for each device's graph pool, and the execs whose
/// first upload or launch is still to be settled.
#[derive(Debug, Default)]
pub struct GraphBook {
    /// (CUDA ordinal, device entry, bytes charged: the last reading).
    devices: Vec<(CUdevice, u8, u64)>,
    unsettled: HashSet<u64>,
}

impl GraphBook {
    /// The driver says `ordinal`'s graph pool now reserves `reserved` bytes.
    pub fn settle(&mut self, ordinal: CUdevice, device: u8, reserved: u64) -> Settle {
        let before = match self.devices.iter_mut().find(|(o, _, _)| *o == ordinal) {
            Some(entry) => std::mem::replace(&mut entry.2, reserved),
            None => {
                self.devices.push((ordinal, device, reserved));
                0
            }
        };
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

    /// Devices whose graph pool this book has read.
    pub fn known(&self) -> Vec<(CUdevice, u8)> {
        self.devices.iter().map(|&(o, d, _)| (o, d)).collect()
    }

    #[cfg(test)]
    pub fn charged(&self, ordinal: CUdevice) -> u64 {
        self.devices
            .iter()
            .find(|(o, _, _)| *o == ordinal)
            .map_or(0, |e| e.2)
    }

    /// A new exec: its first upload or launch reserves its memory.
    pub fn instantiated(&mut self, exec: u64) -> usize {
        self.unsettled.insert(exec);
        self.unsettled.len()
    }

    /// The exec was uploaded, launched or destroyed: true when it was still unsettled.
    pub fn settled(&mut self, exec: u64) -> (bool, usize) {
        (self.unsettled.remove(&exec), self.unsettled.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn readings_become_charges_and_refunds_per_device() {
        let mut book = GraphBook::default();
        assert_eq!(
            book.settle(0, 3, 100 * MIB),
            Settle::Grow {
                device: 3,
                bytes: 100 * MIB
            }
        );
        assert_eq!(book.settle(0, 3, 100 * MIB), Settle::Unchanged);
        assert_eq!(book.settle(1, 4, 0), Settle::Unchanged);
        assert_eq!(book.known(), vec![(0, 3), (1, 4)]);
        assert_eq!(
            book.settle(0, 3, 40 * MIB),
            Settle::Shrink {
                device: 3,
                bytes: 60 * MIB
            }
        );
        assert_eq!(book.charged(0), 40 * MIB);
        assert_eq!(book.charged(1), 0);
    }

    #[test]
    fn an_exec_is_unsettled_from_instantiation_to_its_first_upload_launch_or_destroy() {
        let mut book = GraphBook::default();
        assert_eq!(book.instantiated(7), 1);
        assert_eq!(book.instantiated(8), 2);
        assert_eq!(book.settled(7), (true, 1));
        assert_eq!(book.settled(7), (false, 1), "settled once");
        assert_eq!(book.settled(9), (false, 1), "never seen");
        assert_eq!(book.settled(8), (true, 0));
    }
}
