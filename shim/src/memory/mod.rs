//! Memory policy seam: PASS-THROUGH for now. The memory ledger (container-wide accounting in
//! the shared region) replaces these bodies; the wrappers in `hooks::cuda` already call them at
//! the right points, with the right sizes, on every allocation path (plain, pitch, managed,
//! async, pool, VMM `cuMemCreate`, arrays, mipmapped arrays, contexts).
//!
//! Contract for the ledger:
//! * `before_alloc` reserves `bytes` on the target device atomically (check-and-reserve in one
//!   step, so two processes cannot pass the check together) and returns the reservation, or
//!   `Err(CUDA_ERROR_OUT_OF_MEMORY)`; it must never return -1-style codes.
//! * `after_alloc` commits the reservation under the created object when the driver succeeded,
//!   and releases it when the driver failed.
//! * `on_free` forgets an object after the driver freed it successfully; an object the ledger
//!   never saw is ignored (and still freed by the driver).
//! * `slice_used` returns the bytes the whole slice uses on a device, for reporting.
//! * `after_fork_in_child` drops per-process bookkeeping inherited from the parent.

use gpuslice_abi::cuda::{
    CUarray, CUcontext, CUdevice, CUdeviceptr, CUmemGenericAllocationHandle, CUmipmappedArray,
    CUresult,
};

/// Where an allocation lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocTarget {
    /// The device of the calling thread's current context.
    CurrentContext,
    /// An explicit device (context creation, `cuMemCreate` location).
    Device(CUdevice),
}

/// An object that holds device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceObject {
    Pointer(CUdeviceptr),
    Handle(CUmemGenericAllocationHandle),
    Array(CUarray),
    MipmappedArray(CUmipmappedArray),
    Context(CUcontext),
    /// A primary context, identified by its device (retain/release/reset are by device).
    PrimaryContext(CUdevice),
}

/// A reservation taken before the driver allocates; consumed by `after_alloc`.
#[derive(Debug)]
#[must_use]
pub struct Reservation {
    pub target: AllocTarget,
    pub bytes: u64,
}

/// Reserve `bytes` on `target` before the driver allocates. Pass-through: always granted.
#[inline]
pub fn before_alloc(target: AllocTarget, bytes: u64) -> Result<Reservation, CUresult> {
    Ok(Reservation { target, bytes })
}

/// Commit (`result == CUDA_SUCCESS`) or release the reservation. Pass-through: nothing.
#[inline]
pub fn after_alloc(reservation: Reservation, result: CUresult, object: DeviceObject) {
    let _ = (reservation, result, object);
}

/// The driver freed `object` with `result`. Pass-through: nothing.
#[inline]
pub fn on_free(object: DeviceObject, result: CUresult) {
    let _ = (object, result);
}

/// Bytes the slice uses on `device`; `None` = unknown (reporting then uses the physical free).
#[inline]
pub fn slice_used(device: CUdevice) -> Option<u64> {
    let _ = device;
    None
}

/// Child side of fork: per-process state must not be inherited. Pass-through: nothing.
pub fn after_fork_in_child() {}
