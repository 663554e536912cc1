//! Launch handlers: every kernel and graph launch (each `_ptsz` variant, the cooperative and
//! deprecated ones) settles what the `throttle` asks of it before the real launch, and tells
//! the memory policy, after the launch call, that the driver may have grown (lazy loading,
//! local memory: `driver_growth`; after, so that a reconciliation during the call cannot
//! miss the growth).
//!
//! ONE LAUNCH PATH. The launch hooks are `[hot]` in the registry: each has a hot export and
//! one cold shell, and runs its handler below in both, told by `due`
//! ([`throttle::Due`]) what is left to settle:
//! * the hot export, once [`open_real`] has the hook's real function (the process state
//!   admits every call for good), runs the handler with `Due::Fast`: `throttle::bill_fast`, the real call,
//!   `driver_growth::launched` (one store). When the throttle's common case does not apply
//!   (first launch, several devices, an open capture) or the local credit ran out, the
//!   handler returns `Err(rest)` before the real call and the export hands the call over;
//! * the cold shell (a panic boundary, the gate `lifecycle::admit`, the real slot) runs the
//!   handler with `Due::Check` (the full throttle path) or `Due::Wait` (billed by the hot
//!   export, waiting for tokens).
//!
//! The hot export has no panic boundary: loads, atomic read-modify-writes, the real call and
//! a store, with no indexing that can fail, no arithmetic that can overflow-check and no
//! call into code that can panic. What can panic (the throttle's first launch, a wait for
//! tokens) runs in the shell; a graph's memory settling after its launch has its own
//! boundary. Costs, and why this is Rust and not machine code: `docs/performance.md`.

use std::ffi::{c_int, c_uint, c_void};

use gpuslice_abi::cuda::result::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use crate::ground::real::RealSlot;
use crate::hooks::registry::signature as sig;
use crate::memory;
use crate::session::state::STATE;
use crate::throttle;
use crate::throttle::capture;
pub use crate::throttle::Due;

/// The hot export's real function (null: take the shell): the process state admits every
/// call for good (`session::state`, `[open]`: one load and a bit test) and `slot` holds the
/// resolved function (one load and a compare; its shell resolved it at its first call). A
/// fork child starts Uninitialised, so every hot export starts closed there.
#[inline(always)]
pub fn open_real(slot: &RealSlot) -> *mut c_void {
    if STATE.open() {
        slot.resolved()
    } else {
        std::ptr::null_mut()
    }
}

/// What a launch handler answers: the launch's result, or (on the hot export only) what the
/// cold shell must settle before it launches; nothing was launched then.
pub type Launched = Result<CUresult, Due>;

/// `cuLaunchKernel[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn launch_kernel(
    real: sig::cuLaunchKernel,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    due: Due,
) -> Launched {
    throttle::settle(due, stream)?;
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
    memory::driver_growth::launched();
    Ok(result)
}

/// `cuLaunchKernelEx[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch_kernel_ex(
    real: sig::cuLaunchKernelEx,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    due: Due,
) -> Launched {
    // A NULL config is the driver's INVALID_VALUE to return; it enqueues nothing to bill.
    if !config.is_null() {
        // SAFETY: non-null; the caller passes a valid config (the CUDA API's contract).
        let stream = unsafe { (*config).hStream };
        throttle::settle(due, stream)?;
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(config, f, params, extra) };
    memory::driver_growth::launched();
    Ok(result)
}

/// `cuLaunchCooperativeKernel[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn launch_cooperative_kernel(
    real: sig::cuLaunchCooperativeKernel,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    due: Due,
) -> Launched {
    throttle::settle(due, stream)?;
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
    memory::driver_growth::launched();
    Ok(result)
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported): one launch per
/// entry, each billed on its stream's device. A list the driver will refuse (null, empty,
/// more entries than devices can exist) is passed through ungated.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn launch_cooperative_kernel_multi_device(
    real: sig::cuLaunchCooperativeKernelMultiDevice,
    list: *mut CUDA_LAUNCH_PARAMS,
    n: c_uint,
    flags: c_uint,
) -> CUresult {
    if !list.is_null() && (1..=gpuslice_common::MAX_DEVICES as c_uint).contains(&n) {
        for i in 0..n as usize {
            // SAFETY: the caller passes `n` valid entries (the CUDA API's contract).
            let stream = unsafe { (*list.add(i)).hStream };
            throttle::before_launch_on_stream(stream);
        }
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(list, n, flags) };
    memory::driver_growth::launched();
    result
}

/// `cuGraphLaunch[_ptsz]`: billed as one launch (captured launches were not, see
/// `throttle::capture`).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn graph_launch(
    real: sig::cuGraphLaunch,
    exec: CUgraphExec,
    stream: CUstream,
    due: Due,
) -> Launched {
    throttle::settle(due, stream)?;
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(exec, stream) };
    memory::driver_growth::launched();
    if result == CUDA_SUCCESS {
        return Ok(graph_settled(exec, result));
    }
    Ok(result)
}

/// The first launch of an exec reserves its graph memory ([`memory::graphs::launched`]; one
/// relaxed load otherwise). The reservation can panic: under its own boundary
/// (`CUDA_ERROR_UNKNOWN` after a panic, as the shell's boundary would answer), since the hot
/// export has none.
#[inline(always)]
fn graph_settled(exec: CUgraphExec, result: CUresult) -> CUresult {
    crate::ffi_panic_boundary!(CUDA_ERROR_UNKNOWN, {
        memory::graphs::launched(exec);
        result
    })
}

/// `cuLaunch` (deprecated): a 1x1 grid of the function's block shape, on the legacy stream.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch(real: sig::cuLaunch, f: CUfunction, due: Due) -> Launched {
    throttle::settle_legacy(due)?;
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f) };
    memory::driver_growth::launched();
    Ok(result)
}

/// `cuLaunchGrid` (deprecated), on the legacy stream.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch_grid(
    real: sig::cuLaunchGrid,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    due: Due,
) -> Launched {
    throttle::settle_legacy(due)?;
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, grid_width, grid_height) };
    memory::driver_growth::launched();
    Ok(result)
}

/// `cuLaunchGridAsync` (deprecated).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch_grid_async(
    real: sig::cuLaunchGridAsync,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    stream: CUstream,
    due: Due,
) -> Launched {
    throttle::settle(due, stream)?;
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, grid_width, grid_height, stream) };
    memory::driver_growth::launched();
    Ok(result)
}

// ---------------------------------------------------------------- stream capture
// Launches recorded into a graph are billed when the graph runs (`throttle::capture`).

/// `cuStreamBeginCapture[_ptsz]` (the 10.0 ABI, global mode).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn capture_begin(real: sig::cuStreamBeginCapture, stream: CUstream) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    capture::began(unsafe { real(stream) })
}

/// `cuStreamBeginCapture_v2[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn capture_begin_v2(
    real: sig::cuStreamBeginCapture_v2,
    stream: CUstream,
    mode: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    capture::began(unsafe { real(stream, mode) })
}

/// `cuStreamBeginCaptureToGraph[_ptsz]` (12.3): captures into an existing graph.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn capture_begin_to_graph(
    real: sig::cuStreamBeginCaptureToGraph,
    stream: CUstream,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edge_data: *const std::ffi::c_void,
    count: usize,
    mode: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    capture::began(unsafe { real(stream, graph, dependencies, edge_data, count, mode) })
}

/// `cuStreamEndCapture[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn capture_end(
    real: sig::cuStreamEndCapture,
    stream: CUstream,
    graph: *mut CUgraph,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    capture::ended(stream, unsafe { real(stream, graph) })
}

// ---------------------------------------------------------------- synchronisation
// The time a synchronisation waits is time the GPU worked on what the process queued (or
// on a neighbour's kernels): the start-up probe's lower bound (`throttle::synchronized`).

/// `cuStreamSynchronize[_ptsz]`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn stream_synchronize(real: sig::cuStreamSynchronize, stream: CUstream) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    throttle::synchronized(|| unsafe { real(stream) })
}

/// `cuCtxSynchronize`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn ctx_synchronize(real: sig::cuCtxSynchronize) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    throttle::synchronized(|| unsafe { real() })
}

/// `cuEventSynchronize`.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub unsafe fn event_synchronize(real: sig::cuEventSynchronize, event: CUevent) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    throttle::synchronized(|| unsafe { real(event) })
}
