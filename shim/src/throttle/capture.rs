//! Stream capture: a launch on a capturing stream runs nothing, it records a node of the
//! graph being captured, and the GPU time comes when that graph is launched (and on every
//! launch of it). Billing both used to take the slice's tokens twice for one execution and
//! made the capturing thread sleep inside the capture, where CUDA's global capture mode
//! forbids other threads' unsafe calls for as long as it lasts. Captured launches are
//! therefore not billed at all: `cuGraphLaunch` bills the graph at the cost the controller
//! learns for it (its measured busy time per graph launch).
//!
//! Telling a captured launch apart costs one driver call (`cuStreamIsCapturing`), so the
//! launch path only asks while some capture this process began may still be open:
//! [`OPEN`] counts the captures begun successfully and not seen ended. It only over-counts
//! (a stream destroyed mid-capture, a capture ended on another path), which costs that query
//! per launch, never a missed bill outside capture.

use std::ffi::c_uint;
use std::sync::atomic::{AtomicU32, Ordering};

use gpuslice_abi::cuda::flags::CU_STREAM_CAPTURE_STATUS_NONE;
use gpuslice_abi::cuda::result::{
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_UNJOINED, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::{CUresult, CUstream};

use crate::ground::driver::real;

crate::session::fork::per_process! {
    /// Captures begun by this process and not seen ended (a fork child has none open: a
    /// capture is the parent's streams', and a child that kept the count would query the
    /// driver at every launch, take no launch fast path and never probe).
    static OPEN: AtomicU32 = AtomicU32::new(0);
}

/// Whether a launch on `stream` is being recorded into a graph (not run now). One relaxed
/// load when no capture is open.
#[inline]
pub fn recording(stream: CUstream) -> bool {
    OPEN.load(Ordering::Relaxed) != 0 && stream_capturing(stream)
}

/// Whether some capture this process began may still be open (CUDA's global capture mode
/// then forbids calls such as a query of the legacy stream from any thread).
pub fn any_open() -> bool {
    OPEN.load(Ordering::Relaxed) != 0
}

/// The driver's answer for `stream`: capturing (active, or invalidated: nothing runs either);
/// `false` when it cannot say (the launch is billed, as before).
#[cold]
fn stream_capturing(stream: CUstream) -> bool {
    let mut status: c_uint = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a valid out-pointer; the driver validates the stream.
    real::cuStreamIsCapturing().is_some_and(|is| unsafe { is(stream, &mut status) } == CUDA_SUCCESS)
        && status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// A `cuStreamBeginCapture*` call returned `result` (its handler is in `hooks::launch`).
pub fn began(result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        OPEN.fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// `cuStreamEndCapture` ends a capture when it succeeds and when it reports the capture
/// invalidated or unjoined (the driver's documented outcomes); not when the stream was not
/// capturing, the handle was bad or the call came from the wrong thread. The stream's status
/// afterwards confirms it.
pub fn ended(stream: CUstream, result: CUresult) -> CUresult {
    if capture_ended(result) && !stream_capturing(stream) {
        let _ = OPEN.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
    result
}

/// Pure: whether `cuStreamEndCapture`'s result says a capture was ended.
pub fn capture_ended(result: CUresult) -> bool {
    matches!(
        result,
        CUDA_SUCCESS | CUDA_ERROR_STREAM_CAPTURE_INVALIDATED | CUDA_ERROR_STREAM_CAPTURE_UNJOINED
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_abi::cuda::result::{
        CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    };

    #[test]
    fn only_the_end_results_that_end_a_capture_count_it_down() {
        assert!(capture_ended(CUDA_SUCCESS));
        assert!(capture_ended(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        assert!(capture_ended(CUDA_ERROR_STREAM_CAPTURE_UNJOINED));
        assert!(
            !capture_ended(CUDA_ERROR_ILLEGAL_STATE),
            "was not capturing"
        );
        assert!(
            !capture_ended(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
            "still capturing"
        );
        assert!(!capture_ended(CUDA_ERROR_INVALID_HANDLE));
    }

    /// A fork while a capture is open: the child starts with none open (launches billed,
    /// the probe allowed), the parent keeps its own.
    #[test]
    fn a_fork_child_of_a_process_with_an_open_capture_has_none_open() {
        assert_eq!(began(CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(any_open());
        let child_clean = crate::session::fork::in_fork_child(|| !any_open());
        assert!(any_open(), "the parent's capture is still open");
        // Close it again without a driver: the count only, as `ended` does.
        let _ = OPEN.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        assert!(child_clean, "the child inherited the parent's open capture");
    }
}
