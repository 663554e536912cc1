//! Device enumeration and properties: cuDeviceGet*, attributes, PCI ids, UUIDs.

use super::{Cuda, R};
use crate::spec::{parse_pci, DeviceSpec};
use gpuslice_abi::cuda::attr::*;
use gpuslice_abi::cuda::flags::CU_DEVICE_ATTRIBUTE_MAX;
use gpuslice_abi::cuda::result::*;

/// CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK (cuda.h, CUDA 11.0 on).
pub const RESERVED_SHARED_MEMORY_PER_BLOCK: i32 = 111;

/// Shared memory of one SM, by compute capability (CUDA C++ Programming Guide,
/// "Technical Specifications per Compute Capability"; the 1 KiB the system reserves per
/// block from 8.0 on: its "Shared Memory" section of the 8.x and 9.0 architectures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedMemory {
    pub per_sm: u32,
    /// The most one block may have (dynamic, with the `cuFuncSetAttribute` opt-in).
    pub per_block_optin: u32,
    pub reserved_per_block: u32,
}

impl DeviceSpec {
    pub fn shared_memory(&self) -> SharedMemory {
        let (per_sm, per_block_optin, reserved_per_block) = match (self.cc_major, self.cc_minor) {
            (7, 5) => (64 << 10, 64 << 10, 0),
            (0..=7, _) => (96 << 10, 96 << 10, 0),
            (8, 0) => (164 << 10, 163 << 10, 1 << 10),
            (8, 7) => (164 << 10, 163 << 10, 1 << 10),
            (8, _) => (100 << 10, 99 << 10, 1 << 10),
            _ => (228 << 10, 227 << 10, 1 << 10),
        };
        SharedMemory {
            per_sm,
            per_block_optin,
            reserved_per_block,
        }
    }
}

impl Cuda {
    /// `cuOccupancyAvailableDynamicSMemPerBlock`: the dynamic shared memory each of
    /// `blocks` blocks of `threads` threads may have so that all of them fit on one SM at
    /// once: the SM's shared memory split between them, less what the system reserves per
    /// block, at most the per-block maximum; 0 when that many blocks cannot fit by threads
    /// (the fake's kernels have no static shared memory or register limits).
    pub fn available_dynamic_shared(&self, dev: i32, blocks: i32, threads: i32) -> R<u64> {
        let d = self.device_spec(dev)?;
        if blocks <= 0 || threads <= 0 || threads > 1024 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let fit = (d.max_threads_per_sm / threads as u32).min(32);
        if blocks as u32 > fit {
            return Ok(0);
        }
        let m = d.shared_memory();
        let share = (m.per_sm / blocks as u32).saturating_sub(m.reserved_per_block);
        Ok(share.min(m.per_block_optin) as u64)
    }

    /// `cuOccupancyMaxActiveClusters`: how many clusters of `cluster` blocks (each of
    /// `threads` threads and `dynamic_shared` bytes) fit on the device at once. Clusters
    /// exist from compute capability 9.0 (NOT_SUPPORTED before); a cluster has 1 to 16
    /// blocks (8 portable, 16 with the non-portable opt-in, which the fake does not track).
    /// The device is counted as one pool of SMs: a real one places each cluster inside one
    /// GPC, so it may report a few fewer.
    pub fn max_active_clusters(
        &self,
        dev: i32,
        threads: u32,
        dynamic_shared: u32,
        cluster: u32,
    ) -> R<u32> {
        const CUDA_ERROR_INVALID_CLUSTER_SIZE: u32 = 912;
        let d = self.device_spec(dev)?;
        if d.cc_major < 9 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if threads == 0 || threads > 1024 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !(1..=16).contains(&cluster) {
            return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
        }
        let m = d.shared_memory();
        if dynamic_shared > m.per_block_optin {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let by_threads = (d.max_threads_per_sm / threads).min(32);
        let by_shared = m.per_sm / (dynamic_shared + m.reserved_per_block).max(1);
        let per_sm = by_threads.min(by_shared);
        Ok(d.sm_count * per_sm / cluster)
    }

    pub fn device_count(&self) -> R<i32> {
        Ok(self.check()?.device_count() as i32)
    }

    /// Validates an ordinal (INVALID_DEVICE when out of range).
    pub fn device_index(&self, dev: i32) -> R<u32> {
        let st = self.check()?;
        if dev < 0 || dev as u32 >= st.device_count() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        Ok(dev as u32)
    }

    pub fn device_spec(&self, dev: i32) -> R<DeviceSpec> {
        let i = self.device_index(dev)?;
        self.check()?.device(i).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// `cuDeviceGetPCIBusId` spelling: `0000:3B:00.0`.
    pub fn pci_bus_id(&self, dev: i32) -> R<String> {
        let (domain, bus, device) = self.device_spec(dev)?.pci_parts();
        Ok(format!("{domain:04X}:{bus:02X}:{device:02X}.0"))
    }

    pub fn device_by_pci_bus_id(&self, id: &str) -> R<i32> {
        let st = self.check()?;
        let want = parse_pci(id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        (0..st.device_count())
            .find(|&i| st.device(i).is_some_and(|d| d.pci_parts() == want))
            .map(|i| i as i32)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    pub fn device_attribute(&self, attrib: i32, dev: i32) -> R<i32> {
        let d = self.device_spec(dev)?;
        if attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (domain, bus, device) = d.pci_parts();
        let hopper = d.cc_major >= 9;
        Ok(match attrib {
            MAX_THREADS_PER_BLOCK => 1024,
            MAX_BLOCK_DIM_X | MAX_BLOCK_DIM_Y => 1024,
            MAX_BLOCK_DIM_Z => 64,
            MAX_GRID_DIM_X => i32::MAX,
            MAX_GRID_DIM_Y | MAX_GRID_DIM_Z => 65535,
            MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
            TOTAL_CONSTANT_MEMORY => 64 << 10,
            WARP_SIZE => 32,
            MAX_REGISTERS_PER_BLOCK => 64 << 10,
            CLOCK_RATE => {
                if hopper {
                    1_980_000
                } else {
                    1_380_000
                }
            }
            MULTIPROCESSOR_COUNT => d.sm_count as i32,
            INTEGRATED => 0,
            CAN_MAP_HOST_MEMORY => 1,
            COMPUTE_MODE => 0,
            CONCURRENT_KERNELS => 1,
            ECC_ENABLED => 1,
            PCI_BUS_ID => bus as i32,
            PCI_DEVICE_ID => device as i32,
            PCI_DOMAIN_ID => domain as i32,
            MEMORY_CLOCK_RATE => {
                if hopper {
                    2_619_000
                } else {
                    877_000
                }
            }
            GLOBAL_MEMORY_BUS_WIDTH => {
                if hopper {
                    6144
                } else {
                    4096
                }
            }
            L2_CACHE_SIZE => {
                if hopper {
                    50 << 20
                } else {
                    6 << 20
                }
            }
            MAX_THREADS_PER_MULTIPROCESSOR => d.max_threads_per_sm as i32,
            UNIFIED_ADDRESSING => 1,
            COMPUTE_CAPABILITY_MAJOR => d.cc_major as i32,
            COMPUTE_CAPABILITY_MINOR => d.cc_minor as i32,
            MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => d.shared_memory().per_sm as i32,
            MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => d.shared_memory().per_block_optin as i32,
            RESERVED_SHARED_MEMORY_PER_BLOCK => d.shared_memory().reserved_per_block as i32,
            // Concurrent managed access is what on-demand paging gives (see `managed`).
            CONCURRENT_MANAGED_ACCESS => i32::from(self.managed_on_demand()),
            MANAGED_MEMORY
            | COOPERATIVE_LAUNCH
            | VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
            | MEMORY_POOLS_SUPPORTED => 1,
            MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
            14 /* GPU_OVERLAP */ | 40 /* ASYNC_ENGINE_COUNT */ => if attrib == 40 { 2 } else { 1 },
            // Other capability flags and limits the fake does not model: report "absent".
            _ => 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn devices_and_attributes() {
        let c = driver(Config::default());
        assert_eq!(c.device_count().unwrap(), 2);
        assert_eq!(c.device_index(2), Err(CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(c.device_index(-1), Err(CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(c.device_attribute(MULTIPROCESSOR_COUNT, 1).unwrap(), 132);
        assert_eq!(c.device_attribute(COMPUTE_CAPABILITY_MAJOR, 0).unwrap(), 7);
        assert_eq!(c.device_attribute(0, 0), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(c.device_attribute(500, 0), Err(CUDA_ERROR_INVALID_VALUE));
        let id = c.pci_bus_id(1).unwrap();
        assert_eq!(id, "0000:3B:00.0");
        assert_eq!(c.device_by_pci_bus_id(&id).unwrap(), 1);
        assert_eq!(c.device_by_pci_bus_id("00000000:3b:00.0").unwrap(), 1);
        assert_eq!(
            c.device_by_pci_bus_id("0000:99:00.0"),
            Err(CUDA_ERROR_INVALID_DEVICE)
        );
    }

    #[test]
    fn shared_memory_follows_the_architecture() {
        let c = driver(Config::default());
        // Device 0 is a V100 (7.0), device 1 an H200 (9.0).
        assert_eq!(
            c.device_attribute(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 0),
            Ok(96 << 10)
        );
        assert_eq!(
            c.device_attribute(RESERVED_SHARED_MEMORY_PER_BLOCK, 0),
            Ok(0)
        );
        assert_eq!(
            c.device_attribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 1),
            Ok(227 << 10)
        );
        assert_eq!(
            c.device_attribute(RESERVED_SHARED_MEMORY_PER_BLOCK, 1),
            Ok(1 << 10)
        );
        let a100 = crate::spec::preset("a100", 0).unwrap().shared_memory();
        assert_eq!((a100.per_sm, a100.per_block_optin), (164 << 10, 163 << 10));
        // One block: all of the SM less the reservation, capped at the per-block maximum.
        assert_eq!(c.available_dynamic_shared(1, 1, 256), Ok(227 << 10));
        assert_eq!(c.available_dynamic_shared(1, 2, 256), Ok((114 - 1) << 10));
        assert_eq!(c.available_dynamic_shared(0, 4, 128), Ok(24 << 10));
        // 2048 threads per SM: nine blocks of 256 never fit at once.
        assert_eq!(c.available_dynamic_shared(0, 9, 256), Ok(0));
        assert_eq!(
            c.available_dynamic_shared(0, 0, 256),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            c.available_dynamic_shared(0, 1, 2048),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn clusters_fit_by_threads_and_shared_memory() {
        let c = driver(Config::default());
        assert_eq!(
            c.max_active_clusters(0, 256, 0, 2),
            Err(CUDA_ERROR_NOT_SUPPORTED),
            "no clusters before 9.0"
        );
        // H200: 132 SMs x 2048 threads; 256-thread blocks, 8 per SM, in pairs.
        assert_eq!(c.max_active_clusters(1, 256, 0, 2), Ok(132 * 8 / 2));
        // 100 KiB each: two blocks per SM (228 KiB, 1 KiB reserved per block).
        assert_eq!(c.max_active_clusters(1, 128, 100 << 10, 4), Ok(132 * 2 / 4));
        assert_eq!(c.max_active_clusters(1, 128, 0, 17), Err(912));
        assert_eq!(c.max_active_clusters(1, 128, 0, 0), Err(912));
        assert_eq!(
            c.max_active_clusters(1, 128, 228 << 10, 1),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }
}
