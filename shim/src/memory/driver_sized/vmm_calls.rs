//! The VMM paths: what a handle maps where (a mapping keeps its handle's memory alive), and the
//! mappings a range held ending with it, in the book `gpuslice_policy::VmmBook`.

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::memory::process;
use gpuslice_policy::lock;

/// `cuMemUnmap` / `cuMemAddressFree` through `call`: the VMM book's ticket is taken BEFORE
/// the driver makes the range reusable, so the bookkeeping after it ends exactly the
/// mappings that existed then, never one another thread made in the freed range meanwhile
/// (see `vmm_book`).
pub(crate) fn unmapping(
    ptr: CUdeviceptr,
    size: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(process) = process() else {
        return call();
    };
    let ticket = lock(&process.ledger.vmm).ticket();
    let result = call();
    if result == CUDA_SUCCESS {
        let freed = lock(&process.ledger.vmm).unmapped_range(ptr, size as u64, ticket);
        for (device, bytes) in freed {
            process.ledger.refund(device, bytes);
        }
    }
    result
}

/// `cuMemMap` succeeded: `handle` is mapped at `ptr` for `size` bytes.
pub(crate) fn mapped(ptr: CUdeviceptr, size: u64, handle: CUmemGenericAllocationHandle) {
    if let Some(process) = process() {
        lock(&process.ledger.vmm).mapped(ptr, size, handle);
    }
}

/// `cuMemRetainAllocationHandle` gave the caller one more reference to `handle`.
pub(crate) fn retained(handle: CUmemGenericAllocationHandle) {
    if let Some(process) = process() {
        lock(&process.ledger.vmm).retained(handle);
    }
}
