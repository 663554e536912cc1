//! The device-malloc heap (`CU_LIMIT_MALLOC_HEAP_SIZE`): device memory from the moment it is set.

use std::sync::Mutex;

use gpuslice_abi::cuda::limit::MALLOC_HEAP_SIZE;
use gpuslice_abi::cuda::result::CUDA_SUCCESS;

use crate::ground::driver::real;

/// Serialises this process's heap-limit changes: read, reserve, set and record are one step.
pub static HEAP_LIMIT: Mutex<()> = Mutex::new(());

/// The current context's device-malloc heap size, `None` when the driver does not say.
pub fn heap_limit() -> Option<u64> {
    let get_limit = real::cuCtxGetLimit()?;
    let mut value: usize = 0;
    // SAFETY: cuCtxGetLimit writes one size_t into `value`.
    let result = unsafe { get_limit(&mut value, MALLOC_HEAP_SIZE) };
    (result == CUDA_SUCCESS).then_some(value as u64)
}
