//! The memory slice: a hard per-device cap for all processes of a container together, kept
//! in the shared region (`gpuslice_common::region`), and the numbers every view reports.
//!
//! An allocation's bytes, top-down: a handler in `hooks::memory` calls [`allocation`]
//! (`allocate`: reserve, call the driver, commit or release), which finds the device's region
//! entry in [`bindings`] and charges the ledger (`gpuslice_policy::Ledger`), whose budget
//! ([`region_budget`]) reserves them in this process's slot of the region; a free goes the same
//! way back.
//!
//! Parts:
//! * [`attach`]: attaching this process to its slice (builds the state below), and what a
//!   context is charged before its real cost is measured;
//! * [`bindings`]: which devices the slice limits, under which region entry (cached per CUDA
//!   ordinal and NVML handle);
//! * [`allocation`]: the seam the plain allocation handlers call (`allocate`, over
//!   `before_alloc` and `after_alloc`; `on_free`);
//! * [`views`]: the slice's (limit, use) of a device for the views and placement decisions
//!   (`cuda_slice`, `nvml_slice`, `cuda_limit`);
//! * [`arrays`]: what an array or mipmapped array of a descriptor costs;
//! * [`region_budget`]: the ledger's budget in production, this process's slot of the region;
//! * the ledger (sizes as the device spends them, reserve-before-allocate against a budget),
//!   the object table, the pool, VMM and graph books (when the application's pool, VMM and
//!   graph memory really returns to the card) and the reporting math are pure models of the
//!   `gpuslice-policy` crate (`shim/policy/`), unit-tested there; their driver calls are
//!   `driver_sized`'s `pool_reservations`, `vmm_calls`, `graph_reservations`, and `placed`,
//!   whose book the ledger keeps (`PlacedCharges`);
//! * [`released`]: when a dead process's memory has really gone back to the card;
//! * [`context_start`]: what a new context reserves, the slice's measuring lock, and the
//!   line that says why a context was refused;
//! * [`driver_sized`]: what the paths whose size the driver decides (pools, VMM, graph memory,
//!   contexts)
//!   charge; what the driver places by itself (the stack, printf FIFO and heap limits, module
//!   data, local memory), priced before the call that places it; and which NVML process
//!   entries are the slice's;
//! * [`sweep`]: when this process asks the slice to look for its dead processes;
//! * [`oversubscribe`]: opt-in oversubscription, the bytes past the physical share placed in
//!   the container's host memory;
//! * this file: the memory policy's process-wide state.
//!
//! Owns: `SHARED` (the device bindings and the measured context costs over the session's
//! region mapping; survives fork, like the mapping), `PROCESS` (the ledger of this process's
//! slot; per process, a fork child has none until it attaches again). The region mapping,
//! the slot and the host PID are the session's (`crate::session`).

mod allocation;
pub mod arrays;
mod attach;
mod bindings;
mod context_start;
pub mod driver_sized;
pub mod oversubscribe;
mod region_budget;
mod released;
pub mod sweep;
mod views;

pub use allocation::{
    after_alloc, allocate, before_alloc, charge_or_refuse, current_context, current_device,
    learn_pointer_owners, on_free, AllocTarget, DeviceObject, Reservation,
};
pub use attach::{attach, count_fail_closed, CONTEXT_BOUND_ENV, DEFAULT_CONTEXT_BOUND};
pub use bindings::{cuda_binding, Binding};
pub use region_budget::RegionBudget;
pub use views::{cuda_limit, cuda_slice, cuda_slice_settled, nvml_slice};

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use gpuslice_common::config::SliceConfig;
use gpuslice_common::region::{Region, SlotId, MAX_DEVICES};
use gpuslice_policy::{Ledger, Settle};

use crate::session::fork::per_process;

use bindings::DeviceBindings;
use driver_sized::placed::PlacedBook;

/// Process-wide state that survives fork (over the session's region mapping, which must be
/// the same object in the child, which re-registers through it).
pub struct Shared {
    region: &'static Region,
    config: SliceConfig,
    bindings: DeviceBindings,
    context_bound: u64,
    /// Measured per-context cost per device entry (0 = not measured yet).
    context_cost: [AtomicU64; MAX_DEVICES],
}

/// Per-process state; replaced in a forked child.
pub struct Process {
    pub ledger: Ledger<RegionBudget, PlacedBook>,
    /// The session's slot (`session::slice`), kept beside the ledger that charges it.
    pub slot: SlotId,
}

impl Process {
    /// Applies what a re-read of memory the driver sizes itself (a pool, a device's graph
    /// pool) says: a shrink is refunded; a growth is charged even past the cap, since the
    /// driver holds it already and a later shrink must never refund bytes that were not
    /// charged (the slice then refuses allocations until it shrinks). `past_cap` writes the
    /// one line saying what grew by how many bytes.
    pub fn settle(&self, settle: Settle, past_cap: impl FnOnce(u64)) {
        match settle {
            Settle::Unchanged => {}
            Settle::Shrink { device, bytes } => self.ledger.refund(device, bytes),
            Settle::Grow { device, bytes } => {
                if !self.ledger.charge_held(device, bytes) {
                    past_cap(bytes);
                }
            }
        }
    }
}

/// Survives fork (see [`Shared`]).
static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
per_process! {
    /// This process's ledger; a fork child has none until `attach` runs again (the parent's
    /// objects, pools and contexts are not the child's; its leaked `Process` is abandoned).
    static PROCESS: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());
}

#[inline]
pub fn shared() -> Option<&'static Shared> {
    // SAFETY: SHARED holds null or a leaked, never freed Box published with Release.
    unsafe { SHARED.load(Ordering::Acquire).as_ref() }
}

#[inline]
pub fn process() -> Option<&'static Process> {
    // SAFETY: PROCESS holds null or a leaked, never freed Box published with Release.
    unsafe { PROCESS.load(Ordering::Acquire).as_ref() }
}
