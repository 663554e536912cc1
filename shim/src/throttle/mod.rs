//! Compute policy seam: PASS-THROUGH for now. The token-bucket throttle replaces
//! `before_launch`; every launch path (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative, graph,
//! and their `_ptsz` variants) already calls it before the driver enqueues work.
//!
//! Contract for the throttle: `before_launch` may block the calling thread until the slice's
//! share allows the launch (cost from the launch shape, not the block count alone), and must
//! never fail the launch; it learns the device from the current context itself so a
//! pass-through build pays nothing for it.

use gpuslice_abi::cuda::CUstream;

/// The shape of one launch, as far as the wrapper knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub stream: CUstream,
    /// Grid blocks (x*y*z); 0 for graph launches (the graph's own shape is not visible here).
    pub blocks: u64,
    pub threads_per_block: u32,
}

/// Called before each launch. Pass-through: returns at once.
#[inline]
pub fn before_launch(launch: &Launch) {
    let _ = launch;
}

/// Child side of fork: the bucket and watcher are per process. Pass-through: nothing.
pub fn after_fork_in_child() {}
