//! Launch handlers: every kernel and graph launch (each `_ptsz` variant, the cooperative and
//! deprecated ones) settles what the `throttle` asks of it before the real launch. What a
//! first launch makes the driver place (a kernel's local memory, a lazily loaded library)
//! was priced when the kernel's handle was obtained (`hooks::module`), so a launch asks the
//! memory policy nothing (a graph's first launch excepted: its graph memory).
//!
//! ONE LAUNCH PATH. The launch hooks are `[hot]` in the registry, and each handler below is
//! written once, told by `due` ([`throttle::Due`]) what is left to settle before the launch.
//! The registry runs it in three places, all generated from the one line:
//! * the HOT EXPORT: once [`open_real`] finds the hook's real function (the process state
//!   admits every call for good) it runs the handler with `Due::Fast`, which only bills
//!   (`throttle::bill_fast`: no share, one load; one device, built, no capture open and
//!   credit left: count and debit) and never launches; it answers `Err(Due::Billed)` or
//!   `Err(Due::Check)`. The export then tail-calls, with the caller's arguments untouched,
//!   the hot launch or the cold shell;
//! * the HOT LAUNCH (`Due::Billed`): the real call (a jump to it, where nothing follows it;
//!   a graph's first launch reserves its memory after it);
//! * the COLD SHELL (a panic boundary, the gate `lifecycle::admit`, the real slot), with
//!   `Due::Check`: the throttle's whole path (the first launch, several devices, an open
//!   capture, an exhausted credit and its wait), then the launch.
//!
//! Why the export jumps rather than calls: a function that calls the driver with the caller's
//! stack arguments (the kernel and cooperative launches have five and four) and can also call
//! the shell has the arguments loaded into saved registers at entry, around 20 instructions
//! more per launch; one that only decides and jumps leaves them where they are. Costs, and
//! why this is Rust and not machine code: `docs/performance.md`.
//!
//! The hot export and the hot launch have no panic boundary: loads, atomic
//! read-modify-writes and the real call, with no indexing that can fail, no
//! arithmetic that can overflow-check and no call into code that can panic. What can panic
//! (the throttle's first launch, a wait for tokens) runs in the shell; a graph's memory
//! settling after its launch has its own boundary.

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

/// What a launch handler answers: the launch's result, or (from `Due::Fast` only, which never
/// launches) what is left: `Due::Billed` (the hot launch) or `Due::Check` (the cold shell).
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
    Ok(unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) })
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
    if config.is_null() {
        due.unbilled()?;
    } else {
        // SAFETY: non-null; the caller passes a valid config (the CUDA API's contract).
        let stream = unsafe { (*config).hStream };
        throttle::settle(due, stream)?;
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    Ok(unsafe { real(config, f, params, extra) })
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
    Ok(unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) })
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
    unsafe { real(list, n, flags) }
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
    if result == CUDA_SUCCESS {
        return Ok(graph_settled(exec, result));
    }
    Ok(result)
}

/// The first launch of an exec reserves its graph memory
/// ([`memory::driver_sized::graph_reservations::launched`]; one relaxed load otherwise). The
/// reservation can panic: under its own boundary (`CUDA_ERROR_UNKNOWN` after a panic, as the
/// shell's boundary would answer), since the hot export has none.
#[inline(always)]
fn graph_settled(exec: CUgraphExec, result: CUresult) -> CUresult {
    crate::ffi_panic_boundary!(CUDA_ERROR_UNKNOWN, {
        memory::driver_sized::graph_reservations::launched(exec);
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
    Ok(unsafe { real(f) })
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
    Ok(unsafe { real(f, grid_width, grid_height) })
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
    Ok(unsafe { real(f, grid_width, grid_height, stream) })
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use gpuslice_abi::cuda::result::CUDA_ERROR_NOT_INITIALIZED;
    use gpuslice_common::config::ConfigError;

    use super::*;
    use crate::ground::driver::{SlotId, SLOTS};
    use crate::hooks::registry::exports;
    use crate::session::mode::Mode;

    /// Calls of the fake driver's launches, and the sum of the arguments they saw.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    static SEEN: AtomicU64 = AtomicU64::new(0);

    #[allow(clippy::too_many_arguments)]
    extern "C" fn fake_launch_kernel(
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
    ) -> CUresult {
        CALLS.fetch_add(1, Ordering::Relaxed);
        let sum = [gx, gy, gz, bx, by, bz, shared]
            .iter()
            .map(|&v| u64::from(v))
            .sum::<u64>()
            + f as u64
            + stream as u64
            + params as u64
            + extra as u64;
        SEEN.store(sum, Ordering::Relaxed);
        700 + gx
    }

    extern "C" fn fake_launch_kernel_ex(
        config: *const CUlaunchConfig,
        _f: CUfunction,
        _params: *mut *mut c_void,
        _extra: *mut *mut c_void,
    ) -> CUresult {
        CALLS.fetch_add(1, Ordering::Relaxed);
        if config.is_null() {
            1 // CUDA_ERROR_INVALID_VALUE
        } else {
            0
        }
    }

    /// One `cuLaunchKernel` through the export with eleven distinct arguments: its result, and
    /// whether the fake saw every argument.
    fn launch(gx: c_uint) -> (CUresult, bool) {
        let ptr = |n: usize| n as *mut *mut c_void;
        // SAFETY: the export with arbitrary handles: the fake driver only reads the values.
        let result = unsafe {
            exports::cuLaunchKernel(
                1 as CUfunction,
                gx,
                3,
                4,
                5,
                6,
                7,
                8,
                9 as CUstream,
                ptr(10),
                ptr(11),
            )
        };
        let expected = 1 + u64::from(gx) + (3..=11).sum::<u64>();
        (result, SEEN.load(Ordering::Relaxed) == expected)
    }

    /// Through the export, in a fork child (the process state and the throttle are this
    /// process's): the first launch of a process that passes through goes to the cold shell
    /// (where the throttle finds it has nothing to do), every later one is billed by the hot
    /// export alone; each reaches the driver once with its arguments untouched and returns
    /// its result, a `cuLaunchKernelEx` without a config too. A fail-closed process never
    /// reaches the driver. A fork child starts with the hot path closed.
    #[test]
    fn every_launch_reaches_the_driver_once_with_its_arguments_on_either_path() {
        SLOTS[SlotId::cuLaunchKernel as usize].plant(fake_launch_kernel as *mut c_void);
        SLOTS[SlotId::cuLaunchKernelEx as usize].plant(fake_launch_kernel_ex as *mut c_void);
        let slot = &SLOTS[SlotId::cuLaunchKernel as usize];
        let passing = crate::session::fork::in_fork_child(|| {
            let before = open_real(slot).is_null();
            STATE.loaded(1, || Mode::PassThrough, |_| true);
            let mut all = before && !open_real(slot).is_null();
            let stream = std::ptr::null_mut();
            all &= throttle::settle(Due::Fast, stream) == Err(Due::Check);
            for (n, gx) in (0..5).zip(20..) {
                let (result, seen) = launch(gx);
                all &= result == 700 + gx && seen && CALLS.load(Ordering::Relaxed) == n + 1;
                all &= throttle::settle(Due::Fast, stream) == Err(Due::Billed);
            }
            // SAFETY: a NULL config (the driver's error to return) and NULL handles.
            let ex = unsafe {
                exports::cuLaunchKernelEx(
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            all && ex == 1 && CALLS.load(Ordering::Relaxed) == 6
        });
        assert!(passing, "launches of a pass-through process");
        let reason = ConfigError {
            origin: "test".into(),
            field: String::new(),
            problem: "bad".into(),
        };
        let refused = crate::session::fork::in_fork_child(move || {
            STATE.loaded(1, || Mode::FailClosed(reason), |_| true);
            let (result, _) = launch(20);
            result == CUDA_ERROR_NOT_INITIALIZED && CALLS.load(Ordering::Relaxed) == 0
        });
        assert!(refused, "a fail-closed process reaches no driver");
    }
}
