//! Device enumeration and properties: cuDeviceGet*, attributes, PCI ids, UUIDs.

use super::{Cuda, R};
use crate::spec::{parse_pci, DeviceSpec};
use gpuslice_abi::cuda::attr::*;
use gpuslice_abi::cuda::flags::CU_DEVICE_ATTRIBUTE_MAX;
use gpuslice_abi::cuda::result::*;

impl Cuda {
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
            MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => {
                if hopper {
                    228 << 10
                } else {
                    96 << 10
                }
            }
            MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => {
                if hopper {
                    227 << 10
                } else {
                    96 << 10
                }
            }
            MANAGED_MEMORY
            | CONCURRENT_MANAGED_ACCESS
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
}
