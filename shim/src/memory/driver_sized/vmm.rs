//! The VMM unmap paths: the mappings a range held end with it.

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use crate::memory::ledger::lock;
use crate::memory::process;

/// `cuMemUnmap` / `cuMemAddressFree` through `call`: the VMM book's ticket is taken BEFORE
/// the driver makes the range reusable, so the bookkeeping after it ends exactly the
/// mappings that existed then, never one another thread made in the freed range meanwhile
/// (see `vmm`).
pub fn unmapping(ptr: CUdeviceptr, size: usize, call: impl FnOnce() -> CUresult) -> CUresult {
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
