//! CUDA graph memory. An allocation node (`cuMemAllocAsync` during stream capture, or
//! `cuGraphAddMemAllocNode`) is "owned by the graph instead of the memory pool": its physical
//! memory lives in the device's graph memory pool, reserved when an executable graph is
//! uploaded (`cuGraphUpload`, or its first `cuGraphLaunch`), kept across launches, and given
//! back only by `cuDeviceGraphMemTrim` once no live exec uses it. None of those calls names a
//! size, so the ledger charges the graph pool like a memory pool: for what it REALLY holds,
//! `cuDeviceGetGraphMemAttribute(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)`, re-read after every
//! call that can change it and settled by [`GraphBook::settle`] (growth charged, shrink
//! refunded).
//!
//! The growth happens inside the driver's upload or launch, which cannot be undone (a graph's
//! memory is released only by destroying its exec and trimming, which the application owns).
//! So growth that does not fit is charged past the limit with one error line: the ledger
//! matches the card and every later allocation of the slice is refused until the graph
//! memory is given back.
//!
//! Cost on the launch path (`cuGraphLaunch` is `[hot]`): an exec's memory is reserved once,
//! at its upload or first launch, so only the first successful launch of each exec the shim
//! saw instantiated needs a reading. Instantiations put the exec in an "unsettled" set and
//! raise a process-wide count; a launch looks at that count (one relaxed load) and takes the
//! book's lock only while it is non-zero. Readings are also taken when memory is reported and
//! before an allocation is refused, which catches growth on any other path (an exec the shim
//! did not see instantiated, a driver that grows the pool on a later launch).
//!
//! The book these readings settle is `gpuslice_policy::GraphBook` (pure, below the ledger).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::*;

use super::limited_device;
use crate::ground::driver::real;
use crate::memory::{process, Process};
use gpuslice_policy::lock;
use gpuslice_policy::GraphBook;
use gpuslice_policy::Settle;

/// `CUgraphMem_attribute`: `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
pub(crate) const GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

crate::session::fork::per_process! {
    /// Execs instantiated through the shim whose memory has not been settled yet (a copy of
    /// the book's set size, read without its lock on the launch path; a fork child has none).
    static UNSETTLED: AtomicUsize = AtomicUsize::new(0);
}
crate::session::fork::per_process! {
    /// Set once this process instantiated a graph (reporting then re-reads the graph pools).
    static GRAPHS_SEEN: AtomicBool = AtomicBool::new(false);
}

/// `RESERVED_MEM_CURRENT` of `ordinal`'s graph pool; `None` when the driver cannot say (a
/// driver before 11.4, or an unknown device): the charge then stays as it is.
fn graph_reserved(ordinal: CUdevice) -> Option<u64> {
    let get = real::cuDeviceGetGraphMemAttribute()?;
    let mut value: u64 = 0;
    // SAFETY: RESERVED_MEM_CURRENT writes one cuuint64_t into `value`.
    let result = unsafe {
        get(
            ordinal,
            GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            (&mut value as *mut u64).cast(),
        )
    };
    (result == CUDA_SUCCESS).then_some(value)
}

/// Settles a graph pool's charge with what its re-read said ([`Process::settle`]). No call
/// can give graph memory back for the application: later allocations are refused until it
/// is trimmed.
fn apply(process: &Process, settle: Settle) {
    process.settle(settle, |bytes| {
        crate::log_error!(
            "CUDA graph memory grew by {bytes} bytes past the slice's limit; charged in full, later allocations are refused until it is trimmed"
        )
    });
}

/// Re-reads the graph pool of the current context's device, of `also`, and of every device
/// read before (the book locked by the caller); true if any charge went down.
fn reread_locked(process: &Process, book: &mut GraphBook, also: Option<CUdevice>) -> bool {
    let mut ordinals: Vec<CUdevice> = book.known().into_iter().map(|(o, _)| o).collect();
    for extra in [crate::ground::devices::current_cuda_device(), also]
        .into_iter()
        .flatten()
    {
        if !ordinals.contains(&extra) {
            ordinals.push(extra);
        }
    }
    let mut shrank = false;
    for ordinal in ordinals {
        let Some(device) = limited_device(ordinal) else {
            continue;
        };
        if let Some(reserved) = graph_reserved(ordinal) {
            let settle = book.settle(ordinal, device, reserved);
            shrank |= matches!(settle, Settle::Shrink { .. });
            apply(process, settle);
        }
    }
    shrank
}

/// Re-reads every graph pool this process may hold memory in; true if any charge went down.
/// Before a refusal and for reports; nothing to do before the first instantiation.
#[inline(always)]
pub(in crate::memory) fn reread_if_any(process: &Process) -> bool {
    GRAPHS_SEEN.load(Ordering::Relaxed) && reread_all(process)
}

/// [`reread_if_any`] once a graph was instantiated (out of line: the views stay short).
#[cold]
#[inline(never)]
fn reread_all(process: &Process) -> bool {
    reread_locked(process, &mut lock(&process.ledger.graphs), None)
}

/// After a successful call that can change graph memory: `exec` (if any) is settled now.
pub(crate) fn after(exec: Option<u64>, also: Option<CUdevice>) {
    let Some(process) = process() else { return };
    let mut book = lock(&process.ledger.graphs);
    if let Some(exec) = exec {
        let (_, left) = book.settled(exec);
        UNSETTLED.store(left, Ordering::Relaxed);
    }
    reread_locked(process, &mut book, also);
}

/// A graph was instantiated into `exec` (what the driver wrote to the caller): it is unsettled
/// until its upload or first launch.
/// (With `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the driver may reserve its memory right away:
/// read now as well.)
pub(crate) fn instantiated(result: CUresult, exec: Option<CUgraphExec>) -> CUresult {
    let (CUDA_SUCCESS, Some(exec)) = (result, exec) else {
        return result;
    };
    let Some(process) = process() else {
        return result;
    };
    GRAPHS_SEEN.store(true, Ordering::Relaxed);
    let mut book = lock(&process.ledger.graphs);
    let unsettled = book.instantiated(exec as u64);
    UNSETTLED.store(unsettled, Ordering::Relaxed);
    reread_locked(process, &mut book, None);
    result
}

/// After a successful `cuGraphLaunch[_ptsz]` (the launch path: one relaxed load unless an
/// exec instantiated through the shim is still unsettled).
#[inline]
pub(crate) fn launched(exec: CUgraphExec) {
    if UNSETTLED.load(Ordering::Relaxed) != 0 {
        launched_slow(exec as u64);
    }
}

#[cold]
fn launched_slow(exec: u64) {
    let Some(process) = process() else { return };
    let mut book = lock(&process.ledger.graphs);
    let (was_unsettled, left) = book.settled(exec);
    UNSETTLED.store(left, Ordering::Relaxed);
    if was_unsettled {
        reread_locked(process, &mut book, None);
    }
}
