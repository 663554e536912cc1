//! Compute share: kernel launches are throttled by a token bucket so the slice's GPU
//! utilisation follows its share (`docs/architecture.md`, "Compute share").
//!
//! * [`measure`]: NVML through the real library;
//! * [`watcher`]: the per-process thread (one process of the slice leads and steers);
//! * `device`: one throttled device ([`DeviceThrottle`]), its shared words' layout, and how
//!   it is built from the configuration and the region.
//!
//! The pure models it runs are the `gpuslice-policy` crate's (`shim/policy/`): the
//! lock-free shared token bucket (GCRA word in the region's throttle words) and the
//! process-local credit the common launch spends; the feedback law (learned per-launch cost,
//! integral correction in log space, `burst` bypass); the probe, the start-up estimate from
//! the process's own launch timing (an upper bound on the per-launch cost, before NVML's
//! first sample).
//!
//! This file is the launch path: the per-process table of device throttles and what a
//! launch does with them.
//!
//! Owns: `ACTIVE`, `DEVICE_STATE`, `DEVICES` (per process: a fork child builds its device
//! state again at its next launch). The visible devices are the ground's
//! (`ground::devices::current_context_device`). The region mapping, the slot, the host PID
//! and the clock are the session's (`crate::session`); the watcher reads the device state through
//! [`active_device`].
//!
//! Every launch path (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative, graph, each with its
//! `_ptsz` variant, the deprecated ones, whatever the lookup path) settles what is [`Due`]
//! of it with its stream ([`settle`]): the hot export the common case ([`bill_fast`]), the
//! cold shell the rest ([`before_launch_to`], [`before_launch`] for the legacy stream). It
//! never fails a launch: at worst the calling thread sleeps until its tokens are due. A
//! launch recorded by stream capture is not billed ([`capture`]): the graph is, when
//! launched.
//!
//! Shared words per device (`Region::throttle_words`), all atomics:
//! `VTIME` bucket clock · `INV_RATE` refill (32.32) · `COST` per-launch GPU-ns (bit 63: measured,
//! not just bounded) · `LAUNCHES`,
//! `WAITS` slice-wide counters flushed by every process · `LEADER` lease · `LOG_C` correction
//! (f64 bits) · `BYPASS` · `UNRESOLVED_UNTIL` (ms; some process could not find its host PID)
//! · words 9.. a cache of 14 of the slice's host PIDs on the device (two per word); the
//! region's process slots hold them all (`session::host_pid`).

pub mod capture;
mod device;
pub mod measure;
pub mod watcher;

use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::CUdevice;
use gpuslice_common::config::ComputePolicy;
use gpuslice_common::MAX_DEVICES;
use gpuslice_policy as policy;

use crate::ground::devices::{current_context_device, one_cuda_device};
use crate::session::clock::{now_ns, sleep_until};
use crate::session::fork::per_process;
use crate::session::mode::config_throttles;
use device::build_device;
pub use device::{
    effective_percent, DeviceThrottle, CHUNK_WALL_NS, MAX_LEAD_NS, RATE_CHECK_NS, TOLERANCE_NS,
    W_BYPASS, W_COST, W_INV_RATE, W_LAUNCHES, W_LEADER, W_LOG_C, W_PIDS, W_UNRESOLVED_UNTIL,
    W_VTIME, W_WAITS,
};

const UNINIT: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
const BUSY: u8 = 3;

per_process! {
    /// Whether any share may apply to this process (`OFF`: none, launches are free; `UNINIT`
    /// until the first launch): derived from the published configuration at the first launch.
    static ACTIVE: AtomicU8 = AtomicU8::new(UNINIT);
}

per_process! {
    /// Per device: `UNINIT`, `OFF` (no share), `BUSY` (being built), `ON` (`DEVICES` holds it).
    static DEVICE_STATE: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(UNINIT) }; MAX_DEVICES];
}
per_process! {
    /// The device throttles (leaked, never freed; the parent's are abandoned in a fork child).
    static DEVICES: [AtomicPtr<DeviceThrottle>; MAX_DEVICES] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES];
}

/// Called before each launch. Free when no share applies; otherwise debits the launch's
/// estimated GPU time and sleeps while the slice's bucket is empty.
#[inline]
pub fn before_launch() {
    match ACTIVE.load(Ordering::Relaxed) {
        OFF => {}
        ON => throttle_launch(std::ptr::null_mut()),
        _ => {
            if activate() {
                throttle_launch(std::ptr::null_mut())
            }
        }
    }
}

/// [`before_launch`] for a launch enqueued on `stream`, which is not billed while the stream
/// captures: it is recorded into a graph and billed when that graph is launched
/// ([`capture`]). The legacy stream, which cannot capture, may use [`before_launch`].
#[inline]
pub fn before_launch_to(stream: gpuslice_abi::cuda::CUstream) {
    match ACTIVE.load(Ordering::Relaxed) {
        OFF => {}
        ON => {
            if !capture::recording(stream) {
                throttle_launch(stream)
            }
        }
        _ => {
            if activate() && !capture::recording(stream) {
                throttle_launch(stream)
            }
        }
    }
}

/// [`before_launch_to`] billed on `stream`'s device (the multi-device cooperative launch,
/// whose entries run on other devices than the current one).
pub fn before_launch_on_stream(stream: gpuslice_abi::cuda::CUstream) {
    let on = match ACTIVE.load(Ordering::Relaxed) {
        OFF => false,
        ON => true,
        _ => activate(),
    };
    if on && !capture::recording(stream) {
        if let Some(ordinal) = stream_ordinal(stream) {
            throttle_launch_on(ordinal, stream);
        }
    }
}

/// The device `stream` runs on (its context's); the current one for the NULL, legacy and
/// per-thread streams, or when the driver cannot say.
fn stream_ordinal(stream: gpuslice_abi::cuda::CUstream) -> Option<CUdevice> {
    use crate::ground::driver::real;
    if stream as usize <= gpuslice_abi::cuda::flags::CU_STREAM_PER_THREAD {
        return current_context_device();
    }
    let mut ctx: gpuslice_abi::cuda::CUcontext = std::ptr::null_mut();
    let mut device: CUdevice = 0;
    // SAFETY: valid out-pointers; the driver validates the stream and the context.
    let known = unsafe {
        real::cuStreamGetCtx().is_some_and(|get| get(stream, &mut ctx) == CUDA_SUCCESS)
            && real::cuCtxGetDevice_v2().is_some_and(|get| get(&mut device, ctx) == CUDA_SUCCESS)
    };
    if known {
        Some(device)
    } else {
        current_context_device()
    }
}

#[inline]
fn throttle_launch(stream: gpuslice_abi::cuda::CUstream) {
    let Some(ordinal) = current_context_device() else {
        return;
    };
    throttle_launch_on(ordinal, stream);
}

#[inline]
fn throttle_launch_on(ordinal: CUdevice, stream: gpuslice_abi::cuda::CUstream) {
    let Some(device) = device_throttle(ordinal) else {
        return;
    };
    if !spend(device) {
        wait_for_tokens(device, stream);
    }
}

/// Counts the launch and debits its estimated cost from the local credit; `false` = the
/// credit was exhausted, the caller waits for a chunk ([`wait_for_tokens`]). Loads and
/// atomic read-modify-writes only: nothing here can panic (the launch fast path relies on it).
#[inline(always)]
fn spend(device: &DeviceThrottle) -> bool {
    device.launches.fetch_add(1, Ordering::Relaxed);
    device.bypass.load(Ordering::Relaxed) || device.credit.try_spend(device.cost.get())
}

/// What the throttle still asks of a launch where its handler runs (`hooks::launch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The common case only ([`bill_fast`]): billed here, or left for the whole check. A
    /// launch is never made on this step: it answers what is left.
    Fast,
    /// Nothing: [`bill_fast`] billed the launch.
    Billed,
    /// The whole check ([`before_launch_to`] / [`before_launch`]): nothing was billed yet.
    Check,
}

impl Due {
    /// [`settle`] for a call that enqueues nothing to bill (the driver will refuse it).
    #[inline(always)]
    pub fn unbilled(self) -> Result<(), Due> {
        match self {
            Due::Fast => Err(Due::Billed),
            Due::Billed | Due::Check => Ok(()),
        }
    }
}

/// Settles what is due of a launch enqueued on `stream`. `Err(rest)` only from
/// [`Due::Fast`], which never launches: `Billed` (launch now) or `Check`.
#[inline(always)]
pub fn settle(due: Due, stream: gpuslice_abi::cuda::CUstream) -> Result<(), Due> {
    settle_by(due, || before_launch_to(stream))
}

/// [`settle`] for the deprecated launches, which run on the legacy stream (it never
/// captures, and asking the driver about it during a global-mode capture is not allowed).
#[inline(always)]
pub fn settle_legacy(due: Due) -> Result<(), Due> {
    settle_by(due, before_launch)
}

#[inline(always)]
fn settle_by(due: Due, whole_check: impl FnOnce()) -> Result<(), Due> {
    match due {
        Due::Fast => Err(if bill_fast() { Due::Billed } else { Due::Check }),
        Due::Billed => Ok(()),
        Due::Check => {
            whole_check();
            Ok(())
        }
    }
}

/// The common launch's whole throttle check, when it needs no more than a few loads and
/// the launch need not wait: no share (one load), or one device whose throttle is built, no
/// capture open and credit left (what [`before_launch_to`] does then: count, debit the local
/// credit). `false`: nothing was billed, the whole check decides. Loads and atomic
/// read-modify-writes only, no call: nothing here can panic, so the hot export runs it
/// outside a panic boundary.
#[inline(always)]
pub fn bill_fast() -> bool {
    match ACTIVE.load(Ordering::Relaxed) {
        OFF => true,
        ON if one_cuda_device() && !capture::any_open() => {
            // One visible device: `current_ordinal` is 0. DEVICES[0] is non-null exactly when
            // DEVICE_STATE[0] is ON (stored before it, both reset together at fork).
            let device = DEVICES[0].load(Ordering::Acquire);
            if device.is_null() {
                return false;
            }
            // SAFETY: a non-null DEVICES entry is a leaked, never freed DeviceThrottle.
            let device = unsafe { &*device };
            let bypass = device.bypass.load(Ordering::Relaxed);
            if !bypass && device.credit.value() <= 0 {
                return false; // exhausted: the whole check counts, debits and waits
            }
            device.launches.fetch_add(1, Ordering::Relaxed);
            if !bypass {
                device.credit.debit(device.cost.get());
            }
            true
        }
        _ => false,
    }
}

/// Reserves a chunk from the shared bucket and sleeps until it is due. No lock is held.
/// Until the cost is learned, the wait also feeds the start-up probe ([`probe`]).
#[cold]
#[inline(never)]
fn wait_for_tokens(device: &DeviceThrottle, stream: gpuslice_abi::cuda::CUstream) {
    let wait = probe_begin(device, stream);
    // When (monotonic ns) the stream was found idle during this wait.
    let mut idle_from = None;
    // When it was first seen busy (0: not probed).
    let mut busy_from = 0;
    if let Some(wait) = &wait {
        let idle = stream_idle(stream);
        let t = now_ns();
        if idle {
            probe_idle_at(device, wait, t, 0);
            idle_from = Some(t);
        } else {
            busy_from = t;
        }
    }
    let inv_rate = device.inv_rate();
    let chunk = policy::gpu_ns(CHUNK_WALL_NS, inv_rate).max(1);
    let amount = device.credit.refill_amount(chunk);
    let now = now_ns();
    policy::repair_lead(&device.words[W_VTIME], now, MAX_LEAD_NS);
    let start = policy::reserve(&device.words[W_VTIME], now, amount, inv_rate, TOLERANCE_NS);
    if start > now {
        device.waits.fetch_add(1, Ordering::Relaxed);
        device.sleeping.fetch_add(1, Ordering::Relaxed);
        // Until the reservation is due (crediting it earlier let long kernels at a small
        // share run past it), but never past the plausible lead.
        let mut due = start.min(now.saturating_add(MAX_LEAD_NS));
        let mut seen_inv = inv_rate;
        if let (Some(wait), None) = (&wait, idle_from) {
            if device.probe.polling(now) {
                idle_from = probe_poll(device, wait, stream, busy_from, due);
            }
        }
        loop {
            let t = now_ns();
            if t >= due {
                break;
            }
            // A new rate (the leader's tick) moves the reservation with the word
            // (`policy::rescale_lead`): wake at least once a tick to see it.
            let current_inv = device.inv_rate();
            if current_inv != seen_inv {
                due = policy::rescaled_due(due, t, seen_inv, current_inv);
                seen_inv = current_inv;
                continue;
            }
            sleep_until(due.min(t + RATE_CHECK_NS));
        }
        device.sleeping.fetch_sub(1, Ordering::Relaxed);
        if let (Some(wait), Some(from)) = (&wait, idle_from) {
            let launches = device.launches.load(Ordering::Relaxed);
            device
                .probe
                .slept_idle(wait, now_ns().saturating_sub(from), launches);
        }
        // The slice's launch-wait counter (in the region, for the node agent).
        if let Some((region, id)) = device.region_entry {
            region.add_throttled_ns(id, now_ns().saturating_sub(now));
        }
    }
    device.credit.add(amount);
}

/// First poll of a busy stream during a probing wait, and the most polls per wait: the
/// sleep is cut into steps growing by half, so the stream's completion is seen within about
/// a third of its time (the bound errs by that much, upwards), at a few wake-ups per wait
/// and only until the cost is learned.
const PROBE_POLL_FIRST_NS: u64 = 20_000;
const PROBE_POLLS: u32 = 16;

/// The probe's part in a wait: only until NVML has measured the cost, and never while a
/// capture may be open (a query of the legacy stream would break a global-mode capture).
fn probe_begin(
    device: &DeviceThrottle,
    stream: gpuslice_abi::cuda::CUstream,
) -> Option<policy::ProbeWait> {
    let learned = device.words[W_COST].load(Ordering::Relaxed) & watcher::COST_LEARNED != 0;
    if device.probe.is_off() || learned || capture::any_open() {
        return None;
    }
    device.probe.begin(
        now_ns(),
        stream as u64,
        thread_key(),
        device.launches.load(Ordering::Relaxed),
        device.sleeping.load(Ordering::Relaxed),
    )
}

/// The stream was idle at `t` after `busy_ns` seen busy: the new bounds apply to this
/// process at once (the watcher keeps them applied, and the leader hands them to the
/// controller, until NVML has measured the cost). The launches issued since the last bounds
/// were debited at the old estimate: the shared bucket is charged or refunded the
/// difference (at the 1 ms guess, the first few launches of 10 us kernels at 10 % held the
/// process asleep for 20 ms), the waiting launch's on the local credit.
fn probe_idle_at(device: &DeviceThrottle, wait: &policy::ProbeWait, t: u64, busy_ns: u64) {
    let Some(bounds) = device.probe.idle_at(wait, t, busy_ns) else {
        return;
    };
    let old = device.cost.get();
    let guess = match device.words[W_COST].load(Ordering::Relaxed) & !watcher::COST_LEARNED {
        0 => policy::INITIAL_COST_NS as u64,
        guess => guess,
    };
    let new = policy::estimate_within(guess, bounds.lower, bounds.upper);
    device.cost.set(new);
    let delta = new as i64 - old as i64;
    let issued = i64::try_from(bounds.launches).unwrap_or(i64::MAX);
    if delta != 0 && issued > 0 {
        policy::adjust(
            &device.words[W_VTIME],
            now_ns(),
            delta.saturating_mul(issued),
            device.inv_rate(),
            TOLERANCE_NS,
        );
    }
    if delta < 0 {
        device.credit.add(delta.unsigned_abs());
    } else {
        let _ = device.credit.try_spend(delta as u64);
    }
}

/// Sleeps in growing steps towards `due` until the stream, seen busy at `busy_from`, is
/// idle; returns when it was found so (`None`: still busy when the steps reached `due`, or a
/// capture began). The busy time passed on is up to the last poll that saw it busy.
fn probe_poll(
    device: &DeviceThrottle,
    wait: &policy::ProbeWait,
    stream: gpuslice_abi::cuda::CUstream,
    busy_from: u64,
    due: u64,
) -> Option<u64> {
    let mut step = PROBE_POLL_FIRST_NS;
    let mut busy_until = busy_from;
    for _ in 0..PROBE_POLLS {
        let t = now_ns();
        if t.saturating_add(step) >= due || capture::any_open() {
            return None;
        }
        sleep_until(t + step);
        let t = now_ns();
        if stream_idle(stream) {
            probe_idle_at(device, wait, t, busy_until.saturating_sub(busy_from));
            return Some(t);
        }
        busy_until = t;
        step += step / 2;
    }
    None
}

/// Runs a synchronisation of the calling thread. While this process's start-up probe runs
/// on the current device, the time it waited counts as time the GPU was busy with the
/// launches issued before it (`probe::Probe::synced`): a client that synchronises after each
/// batch leaves no busy stream for the waits to see, and its long kernels ran at the 1 ms
/// guess (10 ms kernels at 10 % read 4.8x of the share in their first 250 ms).
pub fn synchronized(
    sync: impl FnOnce() -> gpuslice_abi::cuda::CUresult,
) -> gpuslice_abi::cuda::CUresult {
    if ACTIVE.load(Ordering::Relaxed) != ON {
        return sync();
    }
    let device = current_context_device()
        .and_then(|o| usize::try_from(o).ok())
        .filter(|&i| i < MAX_DEVICES && DEVICE_STATE[i].load(Ordering::Acquire) == ON)
        // SAFETY: ON is published (Release) after DEVICES[i] holds a leaked, never freed Box.
        .map(|i| unsafe { &*DEVICES[i].load(Ordering::Acquire) });
    let probing = device.filter(|d| {
        !d.probe.is_off() && d.words[W_COST].load(Ordering::Relaxed) & watcher::COST_LEARNED == 0
    });
    let Some(device) = probing else {
        return sync();
    };
    let from = now_ns();
    let result = sync();
    if result == CUDA_SUCCESS {
        device
            .probe
            .synced(thread_key(), now_ns().saturating_sub(from));
    }
    result
}

/// This thread, as the probe tells launchers apart: a thread-local's address (no syscall).
fn thread_key() -> u64 {
    thread_local! {
        static KEY: u8 = const { 0 };
    }
    KEY.with(|k| k as *const u8 as u64)
}

/// Whether the driver reports `stream` idle (every launch on it completed). A `_ptsz` launch
/// passes stream 0 for its thread's per-thread stream and the others for the legacy one:
/// both must be idle. `false` when the driver cannot say.
fn stream_idle(stream: gpuslice_abi::cuda::CUstream) -> bool {
    use gpuslice_abi::cuda::flags::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
    let Some(query) = crate::ground::driver::real::cuStreamQuery() else {
        return false;
    };
    // SAFETY: the driver validates the handle (the launch's own stream or a special one).
    let idle = |s: gpuslice_abi::cuda::CUstream| unsafe { query(s) } == CUDA_SUCCESS;
    if stream.is_null() {
        idle(CU_STREAM_LEGACY as gpuslice_abi::cuda::CUstream)
            && idle(CU_STREAM_PER_THREAD as gpuslice_abi::cuda::CUstream)
    } else {
        idle(stream)
    }
}

/// Whether any device of this process's configuration has a share to enforce, or may have
/// one through the slice's region (a process attached to it by the memory ledger follows the
/// share another process's limit file put there: stricter wins).
#[cold]
fn activate() -> bool {
    let on = crate::session::state::slice_config().is_some_and(|config| {
        config_throttles(config)
            || (config.policy != ComputePolicy::Off
                && crate::session::slice::registered().is_some())
    });
    let _ = ACTIVE.compare_exchange(
        UNINIT,
        if on { ON } else { OFF },
        Ordering::AcqRel,
        Ordering::Relaxed,
    );
    on
}

/// The throttle of device `index` when it is on (for the watcher's ticks).
pub fn active_device(index: usize) -> Option<&'static DeviceThrottle> {
    if DEVICE_STATE.get(index)?.load(Ordering::Acquire) != ON {
        return None;
    }
    // SAFETY: ON is published (Release) after DEVICES[index] holds a leaked, never freed Box.
    Some(unsafe { &*DEVICES[index].load(Ordering::Acquire) })
}

/// The throttle of device `ordinal`, initialising it on first use; `None` = not throttled
/// (or being initialised by another thread right now: that launch passes).
#[inline]
pub fn device_throttle(ordinal: CUdevice) -> Option<&'static DeviceThrottle> {
    let index = usize::try_from(ordinal).ok().filter(|&i| i < MAX_DEVICES)?;
    match DEVICE_STATE[index].load(Ordering::Acquire) {
        ON => {
            // SAFETY: ON is published (Release) after DEVICES[index] holds a leaked Box.
            Some(unsafe { &*DEVICES[index].load(Ordering::Acquire) })
        }
        UNINIT => init_device(index, ordinal),
        _ => None,
    }
}

#[cold]
fn init_device(index: usize, ordinal: CUdevice) -> Option<&'static DeviceThrottle> {
    if DEVICE_STATE[index]
        .compare_exchange(UNINIT, BUSY, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return None;
    }
    let built = crate::session::state::slice_config().and_then(|c| build_device(c, ordinal));
    match built {
        Some(device) => {
            let leaked: &'static DeviceThrottle = Box::leak(Box::new(device));
            DEVICES[index].store(leaked as *const _ as *mut _, Ordering::Release);
            DEVICE_STATE[index].store(ON, Ordering::Release);
            watcher::ensure_started();
            Some(leaked)
        }
        None => {
            DEVICE_STATE[index].store(OFF, Ordering::Release);
            // The process's only device has no share (and an OFF device never looks again):
            // no launch needs the throttle's check any more. It was ~25 of the ~93
            // instructions a launch of a memory-only slice costs (docs/performance.md).
            if one_cuda_device() {
                let _ = ACTIVE.compare_exchange(ON, OFF, Ordering::AcqRel, Ordering::Relaxed);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    use gpuslice_abi::cuda::CUstream;
    use gpuslice_common::region::THROTTLE_WORDS;

    /// One state a launch can find the throttle in.
    #[derive(Debug, Clone, Copy)]
    struct Case {
        active: u8,
        devices: u8,
        built: bool,
        credit: i64,
        bypass: bool,
        capture: bool,
    }

    fn cases() -> Vec<Case> {
        let mut cases = Vec::new();
        for active in [UNINIT, OFF, ON] {
            for devices in [1, 2] {
                for built in [false, true] {
                    for credit in [5_000_000, 0, -3_000] {
                        for bypass in [false, true] {
                            for capture in [false, true] {
                                cases.push(Case {
                                    active,
                                    devices,
                                    built,
                                    credit,
                                    bypass,
                                    capture,
                                });
                            }
                        }
                    }
                }
            }
        }
        cases
    }

    /// Whether the hot export should bill `case` alone (never handing it to the shell).
    fn billed_hot(case: &Case) -> bool {
        case.active == OFF
            || (case.active == ON
                && case.devices == 1
                && case.built
                && !case.capture
                && (case.bypass || case.credit > 0))
    }

    fn device() -> &'static DeviceThrottle {
        let words: &'static [AtomicU64; THROTTLE_WORDS] =
            Box::leak(Box::new([const { AtomicU64::new(0) }; THROTTLE_WORDS]));
        Box::leak(Box::new(DeviceThrottle::for_test(
            50,
            ComputePolicy::Cap,
            words,
            None,
        )))
    }

    /// Puts the throttle (this process's statics, and `device`) in `case`'s state.
    fn prepare(case: &Case, device: &'static DeviceThrottle) {
        ACTIVE.store(case.active, Ordering::Relaxed);
        crate::ground::devices::set_device_count_kind(case.devices);
        let (state, pointer) = if case.built {
            (ON, device as *const DeviceThrottle as *mut DeviceThrottle)
        } else {
            (UNINIT, std::ptr::null_mut())
        };
        DEVICES[0].store(pointer, Ordering::Relaxed);
        DEVICE_STATE[0].store(state, Ordering::Relaxed);
        capture::began(if case.capture { CUDA_SUCCESS } else { 1 });
        device.credit.reset();
        device.credit.add(case.credit.max(0) as u64);
        if case.credit < 0 {
            device.credit.debit(case.credit.unsigned_abs());
        }
        device.bypass.store(case.bypass, Ordering::Relaxed);
        device.cost.set(1_000_000);
        device.launches.store(0, Ordering::Relaxed);
        device.waits.store(0, Ordering::Relaxed);
        // A learned cost (no start-up probe: it would ask the driver about the stream) and a
        // rate high enough that a reservation is due at once.
        device.words[W_COST].store(1_000_000 | watcher::COST_LEARNED, Ordering::Relaxed);
        device.words[W_INV_RATE].store(policy::inv_rate_fixed(0.5), Ordering::Relaxed);
        device.words[W_VTIME].store(0, Ordering::Relaxed);
    }

    /// What a launch left behind: launches counted, the credit, waits, whether a chunk was
    /// reserved, the process's `ACTIVE` and the device's state.
    fn outcome(device: &DeviceThrottle) -> (u64, i64, u64, bool, u8, u8) {
        (
            device.launches.load(Ordering::Relaxed),
            device.credit.value(),
            device.waits.load(Ordering::Relaxed),
            device.words[W_VTIME].load(Ordering::Relaxed) != 0,
            ACTIVE.load(Ordering::Relaxed),
            DEVICE_STATE[0].load(Ordering::Relaxed),
        )
    }

    /// The hot export's two steps (`Due::Fast`, then what it leaves) bill every state of the
    /// matrix exactly as the cold shell's whole check (`Due::Check`) does, and the hot export
    /// bills alone exactly the common cases. Each state is set in a fork child (the statics
    /// are this process's).
    #[test]
    fn the_hot_steps_bill_every_state_as_the_whole_check_does() {
        // Resolve the driver functions the whole check may ask before forking (a child must
        // not dlopen): the unit-test process has no driver, they resolve to "missing".
        for _ in [
            crate::ground::driver::real::cuStreamIsCapturing().is_some(),
            crate::ground::driver::real::cuCtxGetDevice().is_some(),
            crate::ground::driver::real::cuDeviceGetCount().is_some(),
            crate::ground::driver::real::cuStreamQuery().is_some(),
        ] {}
        let cases = cases();
        let device = device();
        let stream = 0x10 as CUstream;
        for (index, case) in cases.iter().enumerate() {
            let same = crate::session::fork::in_fork_child(|| {
                prepare(case, device);
                let step = settle(Due::Fast, stream);
                let hot_alone = step == Err(Due::Billed);
                let rest = match step {
                    Err(rest) => rest,
                    Ok(()) => return false,
                };
                if settle(rest, stream).is_err() {
                    return false;
                }
                let hot = outcome(device);
                prepare(case, device);
                if settle(Due::Check, stream).is_err() {
                    return false;
                }
                hot == outcome(device) && hot_alone == billed_hot(case)
            });
            assert!(same, "case {index}: {case:?}");
        }
        assert_eq!(cases.len(), 144);
        // All 48 without a share, and 4 with one: one device, built, no capture, credit or bypass.
        assert_eq!(cases.iter().filter(|c| billed_hot(c)).count(), 48 + 4);
    }
}
