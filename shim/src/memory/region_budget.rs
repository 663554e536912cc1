//! The ledger's budget in production: this process's slot of the shared region. What the
//! ledger reserves and releases lands here, device entry by device entry.

use gpuslice_common::region::{DeviceId, Region, SlotId};

use super::{shared, sweep};
use gpuslice_policy::{Budget, OutOfMemory};

/// The region as the ledger's budget: this process's slot.
pub struct RegionBudget {
    pub(super) region: &'static Region,
    pub(super) slot: SlotId,
}

/// The region's id of a device entry of the ledger.
pub(super) fn device_id(device: u8) -> DeviceId {
    DeviceId::from_index(device as usize).expect("device entries come from the region")
}

impl Budget for RegionBudget {
    #[inline(always)]
    fn reserve(&self, device: u8, bytes: u64) -> Result<(), OutOfMemory> {
        self.region
            .reserve(self.slot, device_id(device), bytes)
            .map_err(|_| OutOfMemory)
    }
    #[inline(always)]
    fn release(&self, device: u8, bytes: u64) {
        self.region.release(self.slot, device_id(device), bytes);
    }
    fn reserve_past_limit(&self, device: u8, bytes: u64) {
        self.region
            .reserve_past_limit(self.slot, device_id(device), bytes);
    }
    fn reap_dead(&self) {
        // A dead process's budget returns only once the driver has freed its memory.
        if let Some(shared) = shared() {
            sweep::now(shared);
        }
    }
}
