//! Launch handlers: every kernel and graph launch (each `_ptsz` variant, the cooperative and
//! deprecated ones) passes the `throttle` seam before the real launch. What a first launch
//! makes the driver place (a kernel's local memory, a lazily loaded library) was priced when
//! the kernel's handle was obtained (`hooks::module`), so a launch asks the memory policy
//! nothing.
//!
//! The launch hooks are `[hot]` in the registry: their export first tries the FAST PATH here,
//! a few loads and branches before the real launch, and takes the usual shell (panic boundary,
//! the gate `lifecycle::admit`, the real slot, then the handler with `FAST = false`) only when
//! the fast path declines:
//! * [`OPEN`] holds the hook's real function once the shell found the gate open for good (a
//!   published mode that passes through, or enforces with every limit-file entry matched:
//!   neither changes until a fork, whose child starts with all closed: `OPEN` is per process);
//! * `throttle::bill_fast` decides the throttle in its common case (no share; one device with
//!   its throttle built and no capture open).
//!
//! The fast path has no panic boundary: it is loads, atomic read-modify-writes and the real
//! call, with no indexing that can fail, no arithmetic that can overflow-check and no
//! call into code that can panic. Everything that can (the throttle's first launch, a wait
//! for tokens, a graph's memory settling) runs in a cold function under its own boundary.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use gpuslice_abi::cuda::result::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};
use gpuslice_abi::cuda::*;

use crate::ground::driver::HOOK_COUNT;
use crate::hooks::registry::signature as sig;
use crate::memory;
use crate::session::mode::Mode;
use crate::throttle;
use crate::throttle::capture;
use crate::throttle::Bill;

crate::session::fork::per_process! {
    /// The real function of each `[hot]` hook whose gate is open for good (null: closed, the
    /// export takes its shell). Indexed by the registry's position. A fork child starts with
    /// all closed: it re-initialises its mode (`lifecycle`), and each fast path opens again
    /// once its shell has seen the gate.
    /// The x86-64 export of a `[launch]` hook reads it in machine code (see the registry).
    pub(crate) static OPEN: [AtomicPtr<c_void>; HOOK_COUNT] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; HOOK_COUNT];
}

/// The fast path's real function for `hook` (null: take the shell). One load: `hook` is the
/// registry's constant at every call site, so `get` folds away (and cannot panic).
#[inline(always)]
pub fn open_real(hook: usize) -> *mut c_void {
    OPEN.get(hook)
        .map_or(std::ptr::null_mut(), |real| real.load(Ordering::Acquire))
}

/// Called by a `[hot]` export's shell after the gate admitted the call: opens the fast path
/// of `hook` with its real function `real` when the gate will admit every later call of this
/// process too.
#[cold]
pub fn open(hook: usize, real: *mut c_void) {
    let for_good = match crate::session::mode::published() {
        Some(Mode::PassThrough) => true,
        Some(Mode::Enforcing(_)) => crate::hooks::device_check::matched(),
        // Failing closed, or the mode is being initialised (a re-entrant call passes then).
        _ => false,
    };
    let Some(slot) = OPEN.get(hook) else {
        return;
    };
    if !for_good || real.is_null() {
        return;
    }
    slot.store(real, Ordering::Release);
}

/// Which path a launch handler runs on (its `PATH` parameter). The export's fast path runs
/// the handler twice, each time followed by a jump rather than a call (so that the caller's
/// arguments need no copy): [`FAST`] decides and bills, then [`CALL`], [`WAITED`] or the
/// shell ([`SHELL`]) launches.
pub const FAST: u8 = 0;
/// After [`FAST`] answered [`Step::Go`]: the real launch and what follows it, nothing else.
pub const CALL: u8 = 1;
/// After [`FAST`] answered [`Step::Wait`] (billed, the credit is exhausted): the wait for
/// tokens, then the launch, under the boundary of the export's wait shell.
pub const WAITED: u8 = 2;
/// The shell: the full throttle path (`throttle::before_launch_to`), under the shell's boundary.
pub const SHELL: u8 = 3;

/// What a launch handler did or asks for next.
pub enum Step {
    /// The launch was made; the export returns this.
    Done(CUresult),
    /// ([`FAST`] only) billed: launch now ([`CALL`]).
    Go,
    /// ([`FAST`] only) billed, the credit is exhausted: wait, then launch ([`WAITED`]).
    Wait,
    /// ([`FAST`] only) nothing was done: the shell decides ([`SHELL`]).
    Shell,
}

impl Step {
    /// The result of a launch path (never anything but `Done` off [`FAST`]).
    pub fn result(self, otherwise: CUresult) -> CUresult {
        match self {
            Step::Done(result) => result,
            Step::Go | Step::Wait | Step::Shell => otherwise,
        }
    }
}

/// The throttle step of a launch on `stream` for `PATH`; `Some` = the handler returns it.
#[inline(always)]
fn bill<const PATH: u8>(stream: CUstream) -> Option<Step> {
    match PATH {
        FAST => Some(match throttle::bill_fast() {
            Bill::Go => Step::Go,
            Bill::Wait => Step::Wait,
            Bill::Slow => Step::Shell,
        }),
        CALL => None,
        WAITED => {
            throttle::wait_after_spend(stream);
            None
        }
        _ => {
            throttle::before_launch_to(stream);
            None
        }
    }
}

/// The launch hooks' handlers, one per signature; `PATH` says which path runs them.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn launch_kernel<const PATH: u8>(
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
) -> Step {
    if let Some(step) = bill::<PATH>(stream) {
        return step;
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
    Step::Done(result)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch_kernel_ex<const PATH: u8>(
    real: sig::cuLaunchKernelEx,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Step {
    // A NULL config is the driver's INVALID_VALUE to return; it enqueues nothing to gate.
    if !config.is_null() {
        // SAFETY: non-null; the caller passes a valid config (the CUDA API's contract).
        let stream = unsafe { (*config).hStream };
        if let Some(step) = bill::<PATH>(stream) {
            return step;
        }
    }
    if PATH == FAST {
        return Step::Go; // nothing to bill for a NULL config
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(config, f, params, extra) };
    Step::Done(result)
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn launch_cooperative_kernel<const PATH: u8>(
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
) -> Step {
    if let Some(step) = bill::<PATH>(stream) {
        return step;
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
    Step::Done(result)
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

/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn graph_launch<const PATH: u8>(
    real: sig::cuGraphLaunch,
    exec: CUgraphExec,
    stream: CUstream,
) -> Step {
    if let Some(step) = bill::<PATH>(stream) {
        return step;
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(exec, stream) };
    if result == CUDA_SUCCESS {
        // The first launch of an exec reserves its graph memory (one relaxed load otherwise;
        // the reservation can panic, so the fast path contains it as the shell would).
        if PATH != SHELL {
            // CALL and WAITED: this is still the export's fast path (or its wait shell).
            return Step::Done(graph_settled(exec, result));
        }
        memory::graphs::launched(exec);
    }
    Step::Done(result)
}

/// [`memory::graphs::launched`] under a panic boundary (`CUDA_ERROR_UNKNOWN` after a panic,
/// as the shell's boundary answered).
#[inline(always)]
fn graph_settled(exec: CUgraphExec, result: CUresult) -> CUresult {
    crate::ffi_panic_boundary!(CUDA_ERROR_UNKNOWN, {
        memory::graphs::launched(exec);
        result
    })
}

/// `cuLaunch` (deprecated): a 1x1 grid of the function's block shape, on the legacy stream.
/// The deprecated launches always take the shell (their fast path declines).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch<const PATH: u8>(real: sig::cuLaunch, f: CUfunction) -> Step {
    if PATH == FAST {
        return Step::Shell;
    }
    throttle::before_launch();
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f) };
    Step::Done(result)
}

/// `cuLaunchGrid` (deprecated).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch_grid<const PATH: u8>(
    real: sig::cuLaunchGrid,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
) -> Step {
    if PATH == FAST {
        return Step::Shell;
    }
    throttle::before_launch();
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, grid_width, grid_height) };
    Step::Done(result)
}

/// `cuLaunchGridAsync` (deprecated).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[inline(always)]
pub unsafe fn launch_grid_async<const PATH: u8>(
    real: sig::cuLaunchGridAsync,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    stream: CUstream,
) -> Step {
    if let Some(step) = bill::<PATH>(stream) {
        return step;
    }
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    let result = unsafe { real(f, grid_width, grid_height, stream) };
    Step::Done(result)
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
    use super::*;

    #[test]
    fn a_fast_path_opens_only_when_the_gate_admits_for_good_and_a_fork_child_closes_it() {
        let hook = crate::ground::driver::SlotId::cuLaunchKernel as usize;
        let real = 0x1234 as *mut c_void;
        OPEN[hook].store(std::ptr::null_mut(), Ordering::Relaxed);
        assert!(open_real(hook).is_null());
        // The unit-test process has no configuration: once its mode is published it passes
        // through for good.
        let mode = crate::lifecycle::mode();
        let expect_open = matches!(crate::session::mode::published(), Some(Mode::PassThrough));
        assert!(matches!(mode, Mode::PassThrough), "no configuration here");
        let expected = if expect_open {
            real
        } else {
            std::ptr::null_mut()
        };
        open(hook, real);
        assert_eq!(open_real(hook), expected);
        // A null real function never closes (nor opens) a slot.
        open(hook, std::ptr::null_mut());
        assert_eq!(open_real(hook), expected);
        assert!(
            crate::session::fork::in_fork_child(|| open_real(hook).is_null()),
            "a fork child starts closed"
        );
        assert!(open_real(HOOK_COUNT).is_null(), "no slot past the table");
    }
}
