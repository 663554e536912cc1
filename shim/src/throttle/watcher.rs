//! The watcher thread: one per process, started at the first throttled launch (never in a
//! process without a share below 100). Every tick it flushes this process's launch and wait
//! counts into the slice-wide words, refreshes the local copies launches read, and takes part
//! in the leader election; the leader (one process of the slice per device, by a lease in
//! the shared words) measures the slice's utilisation and runs the controller.
//!
//! Liveness: the lease names a random per-process token and expires `LEASE_MS` after the
//! last renewal, so a SIGKILLed leader is replaced within a few ticks. The thread never
//! holds a lock, sleeps between ticks, and is never joined: exit is never delayed by it.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    active_device, measure, DeviceThrottle, W_BYPASS, W_COST, W_INV_RATE, W_LAUNCHES, W_LEADER,
    W_LOG_C, W_UNRESOLVED_UNTIL, W_VTIME, W_WAITS,
};
use crate::session::clock::{now_ns, sleep_until};
use crate::session::fork::per_process;
use crate::session::host_pid;
use gpuslice_common::MAX_DEVICES;
use gpuslice_policy::{self as policy, Controller, Tick, INITIAL_COST_NS};

pub const TICK_NS: u64 = 50_000_000;
/// Set in the `COST` word once the cost was measured (not just bounded from above).
pub const COST_LEARNED: u64 = 1 << 63;
pub const LEASE_MS: u32 = 250;

per_process! {
    /// The watcher thread of this process was started (a fork child has none).
    static STARTED: AtomicBool = AtomicBool::new(false);
}

/// Starts the watcher once per process.
pub fn ensure_started() {
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("gpuslice-watch".into())
        .stack_size(256 << 10)
        .spawn(run);
    if let Err(error) = spawned {
        crate::log_error!(
            "cannot start the compute watcher ({error}): the share is enforced without feedback"
        );
    }
}

/// What the leader remembers between ticks for one device.
#[derive(Default)]
struct LeaderState {
    /// This process's launch count already added to the shared counter.
    flushed_launches: u64,
    handle: Option<measure::Handle>,
    last_seen_us: u64,
    last_launches: u64,
    last_waits: u64,
    leading: bool,
    warned_no_nvml: bool,
    /// The "neither the slice's region nor the throttle's table has room" line was logged.
    warned_table_full: bool,
    resolve_attempts: u32,
    slice_pids: Vec<u32>,
    ticks: u64,
    /// Ticks left during which this process does not stand for leader (it could not measure).
    stand_down: u32,
    /// The controller while this process leads (resumed from the shared words on election).
    controller: Option<Controller>,
    /// When (monotonic ns) the last per-process sample newer than `last_seen_us` arrived,
    /// or leadership began; with the slice launching, a long silence means fallback.
    last_sample_ns: u64,
    /// Steering on the device's utilisation because no per-process samples come.
    fallback: bool,
    /// Monotonic ns the current fallback step began, of the previous fallback reading,
    /// and the device-busy ns gathered since the step began.
    fallback_from_ns: u64,
    fallback_read_ns: u64,
    fallback_busy_ns: u64,
    /// Per-process figures of the newest stretch (drop-out hold, see `measure::Held`).
    held: measure::Held,
    /// The driver's sample period, once an answer showed it (`measure::Busy::min_gap_us`).
    period_us: Option<u64>,
    /// Monotonic ns this leader first saw the slice launch (0 = not yet).
    first_launch_ns: u64,
    /// Monotonic ns of the last controller step (or of leadership).
    last_step_ns: u64,
    /// (monotonic ns, slice launches so far) at each leader tick: the launches of the very
    /// stretch NVML measured, which a real driver reports a sample period or more late.
    launch_history: std::collections::VecDeque<(u64, u64)>,
}

/// Looks for this process in NVML's running list (see `session::host_pid::discover`); logs one line when it
/// is still not found after a second.
fn resolve(device: &DeviceThrottle, state: &mut LeaderState) {
    state.resolve_attempts += 1;
    let listed = measure::device_handle(&device.uuid, device.ordinal as u32)
        .and_then(measure::running_pids)
        .unwrap_or_default();
    let found = host_pid::discover(&listed);
    if let Some(pid) = found {
        // The region's slots hold every process of the slice (the memory ledger's record,
        // else a slot of our own); the throttle words are a small cache beside them.
        let recorded = host_pid::offer(pid);
        let table = device.pid_table();
        if !table.insert(pid) {
            table.retain(|p| listed.contains(&p));
        }
        let inserted = table.insert(pid);
        let region_pids = if recorded {
            vec![pid]
        } else {
            host_pid::slice_host_pids()
        };
        match known_by_leader(inserted, pid, &region_pids) {
            Some(how) => {
                device.unresolved.store(false, Ordering::Relaxed);
                crate::log_debug!(
                    "device {}: this process is NVML PID {pid} ({how})",
                    device.ordinal
                );
                return;
            }
            None if !state.warned_table_full => {
                state.warned_table_full = true;
                crate::log_error!(
                    "device {}: this process is NVML PID {pid}, but neither the slice's region nor the throttle's table of {} PIDs has room for it; the compute share is steered by the whole device's utilisation while it runs (errs towards the cap)",
                    device.ordinal,
                    table.capacity()
                );
            }
            None => {}
        }
    }
    if state.resolve_attempts == 20 && !state.warned_table_full {
        crate::log_error!(
            "cannot tell this process's host PID on device {}; the compute share is steered by the whole device's utilisation until it is known",
            device.ordinal
        );
    }
}

/// The next tick: the next multiple of [`TICK_NS`] on the system-wide monotonic clock, so
/// every slice's leader on the node measures the same stretches of the device and sees the
/// same saturation (leaders at their own phases read different figures for one device, and
/// `burst`'s idle-time shares drifted apart on that). A leader that fell behind (stopped,
/// overloaded) skips the ticks it missed: no catch-up burst.
pub fn next_tick(now: u64) -> u64 {
    (now / TICK_NS + 1) * TICK_NS
}

fn run() {
    let token = process_token();
    let mut leaders: Vec<LeaderState> = (0..MAX_DEVICES).map(|_| LeaderState::default()).collect();
    loop {
        sleep_until(next_tick(now_ns()));
        for (index, state) in leaders.iter_mut().enumerate() {
            let Some(device) = active_device(index) else {
                continue;
            };
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tick(device, state, token)
            }));
        }
    }
}

fn process_token() -> u32 {
    let seed = now_ns() ^ (u64::from(std::process::id()) << 20);
    let mixed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) as u32).max(1)
}

fn now_ms() -> u32 {
    now_ms_u64() as u32
}

fn now_ms_u64() -> u64 {
    now_ns() / 1_000_000
}

/// How long a process still unresolved keeps the slice steering on the whole device.
const UNRESOLVED_HOLD_MS: u64 = 4 * LEASE_MS as u64;

/// Pure: whether the W_UNRESOLVED_UNTIL word (milliseconds of CLOCK_MONOTONIC) still holds
/// at `now_ms`. A value further ahead than any process could have written was written
/// against another clock (the region file outlived a reboot) and no longer holds.
pub fn unresolved_holds(until_ms: u64, now_ms: u64) -> bool {
    until_ms > now_ms && until_ms - now_ms <= UNRESOLVED_HOLD_MS
}

/// Pure: the lease word after `token` tries to lead at `now_ms` (`None` = someone else leads).
/// A lease is held only while its expiry lies within `LEASE_MS` ahead of now (wrapping
/// arithmetic): one further ahead was written against another clock (the region file
/// outlived a reboot) and counts as expired.
pub fn lease_step(current: u64, token: u32, now_ms: u32) -> Option<u64> {
    let holder = (current >> 32) as u32;
    let remaining = (current as u32).wrapping_sub(now_ms);
    let expired = current == 0 || remaining == 0 || remaining > LEASE_MS;
    (holder == token || expired)
        .then_some((u64::from(token) << 32) | u64::from(now_ms.wrapping_add(LEASE_MS)))
}

fn tick(device: &DeviceThrottle, state: &mut LeaderState, token: u32) {
    let words = device.words;
    // The process's count only grows (the start-up probe reads it): the growth is flushed.
    let count = device.launches.load(Ordering::Relaxed);
    let launches = count.wrapping_sub(state.flushed_launches);
    state.flushed_launches = count;
    if launches > 0 {
        words[W_LAUNCHES].fetch_add(launches, Ordering::Relaxed);
    }
    let waits = device.waits.swap(0, Ordering::Relaxed)
        + u64::from(device.sleeping.load(Ordering::Relaxed) > 0);
    if waits > 0 {
        words[W_WAITS].fetch_add(waits, Ordering::Relaxed);
    }
    if device.unresolved.load(Ordering::Relaxed) {
        resolve(device, state);
    }
    if device.unresolved.load(Ordering::Relaxed) {
        // Until this process is found in NVML's list, the leader measures the whole device
        // (over-counts neighbours: errs on the side of the cap).
        // A store, not a max: a stale value from before a reboot must not outlive us.
        words[W_UNRESOLVED_UNTIL].store(now_ms_u64() + UNRESOLVED_HOLD_MS, Ordering::Relaxed);
    }
    if let Some(percent) = device.refresh_share() {
        crate::log_info!(
            "compute share on device {} now {percent}% (the slice's region entry)",
            device.ordinal
        );
    }
    let cost_word = words[W_COST].load(Ordering::Relaxed);
    let cost = match cost_word & !COST_LEARNED {
        0 => INITIAL_COST_NS as u64,
        cost => cost,
    };
    // Until NVML has measured the cost, this process's own start-up bounds hold the guess.
    let cost = if cost_word & COST_LEARNED == 0 {
        device.probe.estimate(cost)
    } else {
        cost
    };
    device.cost.set(cost);
    device.bypass.store(
        words[W_BYPASS].load(Ordering::Relaxed) == 1,
        Ordering::Relaxed,
    );

    let current = words[W_LEADER].load(Ordering::Acquire);
    if state.stand_down > 0 {
        state.stand_down -= 1;
        state.leading = false;
        state.controller = None;
        return;
    }
    let leading = match lease_step(current, token, now_ms()) {
        Some(next) => words[W_LEADER]
            .compare_exchange(current, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok(),
        None => false,
    };
    if !leading {
        state.leading = false;
        state.controller = None;
        return;
    }
    if !state.leading {
        // Newly elected: start the measurement afresh.
        state.leading = true;
        state.last_seen_us = 0;
        state.last_sample_ns = now_ns();
        state.last_step_ns = now_ns();
        state.held.clear();
        state.launch_history.clear();
        state.period_us = None;
        state.first_launch_ns = 0;
        state.last_launches = words[W_LAUNCHES].load(Ordering::Relaxed);
        state.last_waits = words[W_WAITS].load(Ordering::Relaxed);
    }
    if !lead(device, state) {
        // Cannot measure: no bypass without a measurement, and the lease goes back so a
        // process that can measure may lead (this one stands down for a second).
        words[W_BYPASS].store(0, Ordering::Relaxed);
        device.bypass.store(false, Ordering::Relaxed);
        let held = words[W_LEADER].load(Ordering::Acquire);
        if (held >> 32) as u32 == token {
            let _ = words[W_LEADER].compare_exchange(held, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
        state.leading = false;
        state.controller = None;
        state.stand_down = STAND_DOWN_TICKS;
    }
}

/// Pure: how the leader will know NVML PID `pid` as the slice's: through the shared PID table
/// (`inserted`), or through the host PIDs the region records (the leader reads those every
/// tenth tick), so a full table does not matter to a process recorded in its region slot
/// (by the memory ledger, or by `host_pid::offer`); `None` = not at all (the process stays
/// unresolved and says so).
pub fn known_by_leader(inserted: bool, pid: u32, region_pids: &[u32]) -> Option<&'static str> {
    if inserted {
        Some("PID table")
    } else if region_pids.contains(&pid) {
        Some("region")
    } else {
        None
    }
}

/// Ticks a leader that could not measure leaves the election to others.
pub const STAND_DOWN_TICKS: u32 = 20;

/// How long a launching slice may go without a new per-process sample before the leader
/// steers on the device's utilisation instead: longer than the slowest documented sample
/// period (1 s) plus one period of publication delay.
pub const SAMPLE_SILENCE_NS: u64 = 2_500_000_000;
/// Leader ticks of launch history kept (3.2 s: a 1 s sample period published a period late).
pub const HISTORY_TICKS: usize = 64;

/// CLOCK_REALTIME, ns: the clock of NVML's sample timestamps.
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pure: the monotonic instant of NVML stamp `stamp_us` (wall-clock µs), given both clocks
/// now; `None` when it does not fall within the last 4 s (up to 0.1 s ahead): a driver on
/// another clock, whose stamps cannot be placed.
pub fn wall_to_monotonic(stamp_us: u64, wall_now_ns: u64, mono_now_ns: u64) -> Option<u64> {
    let stamp_ns = stamp_us.checked_mul(1000)?;
    let mono = if stamp_ns <= wall_now_ns {
        mono_now_ns.checked_sub(wall_now_ns - stamp_ns)?
    } else {
        mono_now_ns.checked_add(stamp_ns - wall_now_ns)?
    };
    (mono + 4_000_000_000 >= mono_now_ns && mono <= mono_now_ns + 100_000_000).then_some(mono)
}

/// Pure: launches made within `[from, to]` (monotonic ns), interpolated between the ticks of
/// `history` ((time, launches so far), oldest first); `None` when `from` precedes it.
pub fn launches_between(
    history: &std::collections::VecDeque<(u64, u64)>,
    from: u64,
    to: u64,
) -> Option<u64> {
    let at = |t: u64| -> Option<f64> {
        let first = history.front()?;
        if t < first.0 {
            return None;
        }
        let i = history.partition_point(|&(time, _)| time <= t);
        let (t0, n0) = history[i - 1];
        Some(match history.get(i) {
            Some(&(t1, n1)) if t1 > t0 => {
                n0 as f64 + (n1.wrapping_sub(n0)) as f64 * (t - t0) as f64 / (t1 - t0) as f64
            }
            _ => n0 as f64,
        })
    };
    Some((at(to)? - at(from)?).max(0.0).round() as u64)
}

/// Shortest stretch without samples that counts as "no trace" for the start-up guess.
pub const NO_TRACE_NS: u64 = 100_000_000;
/// How long after the slice's first launch a 0 % device reading can be trusted to cover it:
/// the slowest documented sample period (1 s) and a margin.
pub const NO_TRACE_AFTER_NS: u64 = 1_200_000_000;
/// How often the controller steps while steering on the device's utilisation.
pub const FALLBACK_STEP_NS: u64 = 500_000_000;

/// Pure: whether the leader should steer on the device's utilisation. Samples that stop
/// coming while the slice launches (per-process accounting off, a driver whose timestamps
/// the throttle never finds newer) must not leave the share unsteered; an idle slice
/// simply has no samples.
pub fn sample_silence(now_ns: u64, last_sample_ns: u64, launched_since: bool) -> bool {
    launched_since && now_ns.saturating_sub(last_sample_ns) >= SAMPLE_SILENCE_NS
}

/// Pure: the slice's busy ns from the per-PID figures, and whether the rest of the device
/// (the neighbours) is known. While some process of the slice is unresolved its busy time
/// cannot be told from a neighbour's: the slice is charged the whole device (errs towards the
/// cap) and the neighbours are unknown, so `burst` never takes them for idle (which would
/// switch throttling off for as long as discovery fails).
pub fn split_busy(per_pid: &[(u32, u64)], slice_pids: &[u32], unresolved: bool) -> (u64, bool) {
    if unresolved {
        return (per_pid.iter().map(|(_, b)| b).sum(), false);
    }
    let slice = per_pid
        .iter()
        .filter(|(pid, _)| slice_pids.contains(pid))
        .map(|(_, b)| b)
        .sum();
    (slice, true)
}

/// One leader tick; `false` = NVML could not measure.
fn lead(device: &DeviceThrottle, state: &mut LeaderState) -> bool {
    let words = device.words;
    if state.handle.is_none() {
        state.handle = measure::device_handle(&device.uuid, device.ordinal as u32);
    }
    let busy = state.handle.and_then(|h| {
        measure::process_busy(h, state.last_seen_us, &mut state.held, state.period_us)
    });
    if let Some(gap) = busy.as_ref().and_then(|b| b.min_gap_us) {
        state.period_us = Some(state.period_us.map_or(gap, |p| p.min(gap)));
    }
    let Some(busy) = busy else {
        if !state.warned_no_nvml {
            state.warned_no_nvml = true;
            crate::log_error!(
                "NVML cannot report utilisation on device {}: the compute share cannot be measured; launches are billed at an estimated GPU time per kernel (1 ms until measured), so the achieved share depends on kernel length",
                device.ordinal
            );
        }
        return false;
    };
    // The first samples since election only set the mark to read from (a read from 0 is the
    // driver's whole buffer, not one stretch).
    let first = state.last_seen_us == 0 && busy.newest_us != 0;
    let now = now_ns();
    if busy.newest_us > state.last_seen_us {
        state.last_seen_us = busy.newest_us;
        state.last_sample_ns = now;
        if state.fallback {
            state.fallback = false;
            crate::log_info!(
                "device {}: NVML's per-process samples are back; the compute share steers on the slice's own processes again",
                device.ordinal
            );
        }
    }
    let launches_total = words[W_LAUNCHES].load(Ordering::Relaxed);
    let waits_total = words[W_WAITS].load(Ordering::Relaxed);
    let launches = launches_total.wrapping_sub(state.last_launches);
    let waited = waits_total != state.last_waits;
    state.launch_history.push_back((now, launches_total));
    while state.launch_history.len() > HISTORY_TICKS {
        state.launch_history.pop_front();
    }
    if !state.fallback && sample_silence(now, state.last_sample_ns, launches > 0) {
        state.fallback = true;
        state.fallback_from_ns = now;
        state.fallback_read_ns = now;
        state.fallback_busy_ns = 0;
        crate::log_error!(
            "device {}: NVML gave no per-process utilisation sample for {:.1} s while the slice launched kernels; the compute share now steers on the whole device's utilisation (nvmlDeviceGetUtilizationRates), which counts any neighbour against the slice",
            device.ordinal,
            now.saturating_sub(state.last_sample_ns) as f64 / 1e9
        );
    }
    let busy = if state.fallback {
        let Some(percent) = state.handle.and_then(measure::device_percent) else {
            return false;
        };
        // The reading is the last sample period's (up to 1 s, published late): summed over
        // FALLBACK_STEP_NS and fed to the controller once per step, so its lag stays within
        // about one step, the delay the control law is designed for.
        state.fallback_busy_ns +=
            now.saturating_sub(state.fallback_read_ns) * u64::from(percent) / 100;
        state.fallback_read_ns = now;
        let span_ns = now.saturating_sub(state.fallback_from_ns);
        if span_ns < FALLBACK_STEP_NS {
            return true;
        }
        state.fallback_from_ns = now;
        // The whole device as one pseudo-process (PID 0, never a slice member); the slice is
        // charged all of it and the neighbours are unknown (see `split_busy`).
        measure::Busy {
            per_pid: vec![(0, std::mem::take(&mut state.fallback_busy_ns))],
            span_ns,
            newest_us: state.last_seen_us,
            min_gap_us: None,
        }
    } else if first {
        state.last_launches = launches_total;
        state.last_waits = waits_total;
        state.last_step_ns = now;
        return true;
    } else if busy.span_ns == 0 {
        // No new sample. A driver lists only processes with a non-zero figure, so launches
        // at the start-up guess that leave no trace give no sample at all: while the cost is
        // not learned, a launching slice on a device whose last period read 0 % lowers the
        // guess as a zero sample would (the controller's `busy == 0` bound).
        let unlearned = state.controller.as_ref().is_none_or(|c| !c.learned)
            && words[W_COST].load(Ordering::Relaxed) & COST_LEARNED == 0;
        let span_ns = now.saturating_sub(state.last_step_ns);
        if launches > 0 && state.first_launch_ns == 0 {
            state.first_launch_ns = now;
        }
        // The device's figure is its last completed sample period's (up to 1 s): only once
        // a whole slowest period has passed since the launches began can 0 % mean they left
        // no trace (at 1 s periods it read 0 for the idle period before them, and the guess
        // fell 4x a tick under 1 ms kernels that were costed right).
        let covered = state.first_launch_ns != 0
            && now.saturating_sub(state.first_launch_ns) >= NO_TRACE_AFTER_NS;
        if !(unlearned && launches > 0 && span_ns >= NO_TRACE_NS && covered) {
            return true;
        }
        if state.handle.and_then(measure::device_percent) != Some(0) {
            return true;
        }
        measure::Busy {
            per_pid: Vec::new(),
            span_ns,
            newest_us: state.last_seen_us,
            min_gap_us: None,
        }
    } else {
        busy
    };
    state.last_step_ns = now;
    state.last_launches = launches_total;
    state.last_waits = waits_total;

    let device_busy: u64 = busy.per_pid.iter().map(|(_, b)| b).sum();
    let unresolved = unresolved_holds(
        words[W_UNRESOLVED_UNTIL].load(Ordering::Relaxed),
        now_ms_u64(),
    );
    state.ticks += 1;
    if state.ticks % 10 == 1 {
        state.slice_pids = host_pid::slice_host_pids();
    }
    let mut pids = device.pid_table().pids();
    pids.extend_from_slice(&state.slice_pids);
    let (slice_busy, neighbours_known) =
        split_busy(&busy.per_pid, &pids, unresolved || state.fallback);
    let cost_word = words[W_COST].load(Ordering::Relaxed);
    let controller = state.controller.get_or_insert_with(|| {
        Controller::resume(
            f64::from_bits(words[W_LOG_C].load(Ordering::Relaxed)),
            (cost_word & COST_LEARNED != 0).then_some((cost_word & !COST_LEARNED) as f64),
            words[W_BYPASS].load(Ordering::Relaxed) == 1,
        )
    });
    // The launches of the measured stretch itself (NVML's wall-clock stamps mapped onto our
    // clock); the launches since the last step when the stamps do not map (another clock).
    let aligned = if state.fallback {
        None
    } else {
        let to = wall_to_monotonic(busy.newest_us, realtime_ns(), now);
        to.and_then(|to| {
            launches_between(&state.launch_history, to.saturating_sub(busy.span_ns), to)
        })
    };
    controller.idle_share.priority = device.priority;
    let tick = Tick {
        share: device.share(),
        span_ns: busy.span_ns,
        slice_busy_ns: Some(slice_busy),
        device_busy_ns: neighbours_known.then_some(device_busy),
        launches: aligned.unwrap_or(launches),
        launches_total,
        waited,
    };
    // This process's start-up bound (the leader's own launches), until the cost is learned.
    controller.set_launch_bounds(device.probe.bounds());
    let out = controller.step(&tick, device.policy);
    words[W_LOG_C].store(controller.log_c.to_bits(), Ordering::Relaxed);
    // Published learned or not: a guess lowered by a measurement must reach the launches.
    let learned = if controller.learned { COST_LEARNED } else { 0 };
    words[W_COST].store(out.cost_ns | learned, Ordering::Relaxed);
    device.cost.set(out.cost_ns);
    words[W_BYPASS].store(u64::from(out.bypass), Ordering::Relaxed);
    device.bypass.store(out.bypass, Ordering::Relaxed);
    let inv_rate = policy::inv_rate_fixed(out.rate);
    // The rate launches reserved at (the share's until a first tick published one); only
    // the leader writes the word.
    let old_inv = device.inv_rate();
    words[W_INV_RATE].store(inv_rate, Ordering::Relaxed);
    policy::rescale_lead(&words[W_VTIME], now_ns(), old_inv, inv_rate);
    if out.redebit_ns != 0 {
        policy::adjust(
            &words[W_VTIME],
            now_ns(),
            out.redebit_ns,
            inv_rate,
            super::TOLERANCE_NS,
        );
    }
    if let Some((region, entry)) = device.region_entry {
        let basis_points = (slice_busy as f64 / busy.span_ns as f64 * 10_000.0).round();
        region.publish_utilization(entry, basis_points.min(10_000.0) as u32, now_ns());
    }
    crate::log_debug!(
        "device {}: U={:.3} S={:.2} D={:.3} launches={launches} waited={waited} c={:.3} cost={}ns bypass={} m={:.2}",
        device.ordinal,
        slice_busy as f64 / busy.span_ns as f64,
        device.share(),
        device_busy as f64 / busy.span_ns as f64,
        controller.log_c.exp(),
        out.cost_ns,
        out.bypass,
        controller.idle_share.multiple
    );
    true
}

#[cfg(test)]
mod tests {

    #[test]
    fn every_leader_ticks_on_one_grid_and_a_late_one_skips_what_it_missed() {
        use super::TICK_NS;
        assert_eq!(super::next_tick(0), TICK_NS);
        assert_eq!(super::next_tick(TICK_NS - 1), TICK_NS);
        // Woken exactly on the grid: the next point, not the same one again.
        assert_eq!(super::next_tick(TICK_NS), 2 * TICK_NS);
        // Two processes started 17 ms apart tick together.
        let (a, b) = (5 * TICK_NS + 3_000_000, 5 * TICK_NS + 20_000_000);
        assert_eq!(super::next_tick(a), super::next_tick(b));
        // Stopped for 3.5 ticks: the next point after now, none of the missed ones.
        assert_eq!(super::next_tick(9 * TICK_NS + TICK_NS / 2), 10 * TICK_NS);
    }

    #[test]
    fn an_unresolved_mark_holds_for_its_hold_and_a_stale_one_not_at_all() {
        let now = 5_000_000;
        assert!(unresolved_holds(now + UNRESOLVED_HOLD_MS, now));
        assert!(unresolved_holds(now + 1, now));
        assert!(!unresolved_holds(now, now), "expired");
        assert!(!unresolved_holds(0, now), "never set");
        // Written before a reboot (a far larger monotonic clock), or past the u32 wrap the
        // old code compared against: not ours, does not hold.
        assert!(!unresolved_holds(now + UNRESOLVED_HOLD_MS + 1, now));
        assert!(!unresolved_holds(u64::MAX, now));
    }

    use super::*;
    use gpuslice_common::config::ComputePolicy;
    use gpuslice_policy::Tick;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn an_unresolved_slice_is_charged_the_device_and_burst_never_bypasses() {
        let per_pid = [(100_005, 10_000_000), (7, 1_000_000)];
        assert_eq!(split_busy(&per_pid, &[100_005], false), (10_000_000, true));
        assert_eq!(split_busy(&per_pid, &[100_005], true), (11_000_000, false));
        // Before the fix the leader passed the device figure as both: neighbours = 0, and
        // burst bypassed the bucket for as long as discovery failed.
        let (slice, known) = split_busy(&per_pid, &[], true);
        let device: u64 = per_pid.iter().map(|(_, b)| b).sum();
        let mut ctl = Controller::default();
        for _ in 0..20 {
            let out = ctl.step(
                &Tick {
                    share: 0.3,
                    span_ns: TICK_NS,
                    slice_busy_ns: Some(slice),
                    device_busy_ns: known.then_some(device),
                    launches: 10,
                    launches_total: 10,
                    waited: true,
                },
                ComputePolicy::Burst,
            );
            assert!(
                !out.bypass,
                "burst with an unresolved slice keeps the bucket"
            );
        }
    }

    #[test]
    fn a_leader_that_cannot_measure_clears_the_bypass_and_hands_the_lease_back() {
        // No real NVML in the unit tests: `lead` cannot measure.
        let words: &'static [AtomicU64; gpuslice_common::region::THROTTLE_WORDS] = Box::leak(
            Box::new([const { AtomicU64::new(0) }; gpuslice_common::region::THROTTLE_WORDS]),
        );
        words[W_BYPASS].store(1, Ordering::Relaxed);
        let device =
            crate::throttle::DeviceThrottle::for_test(30, ComputePolicy::Burst, words, None);
        device.bypass.store(true, Ordering::Relaxed);
        let mut state = LeaderState::default();
        tick(&device, &mut state, 7);
        assert_eq!(words[W_BYPASS].load(Ordering::Relaxed), 0, "bypass cleared");
        assert!(!device.bypass.load(Ordering::Relaxed));
        assert_eq!(
            words[W_LEADER].load(Ordering::Relaxed),
            0,
            "lease handed back"
        );
        // It stands down: another process (token 9) takes the lease and keeps it.
        for _ in 0..STAND_DOWN_TICKS {
            let current = words[W_LEADER].load(Ordering::Relaxed);
            words[W_LEADER].store(lease_step(current, 9, now_ms()).unwrap(), Ordering::Relaxed);
            tick(&device, &mut state, 7);
            assert_eq!(words[W_LEADER].load(Ordering::Relaxed) >> 32, 9);
        }
    }

    #[test]
    fn a_full_pid_table_falls_back_to_the_region_and_otherwise_says_so() {
        assert_eq!(known_by_leader(true, 7, &[]), Some("PID table"));
        assert_eq!(known_by_leader(false, 7, &[3, 7]), Some("region"));
        assert_eq!(known_by_leader(false, 7, &[3]), None);
    }

    #[test]
    fn launches_are_taken_from_the_stretch_nvml_measured() {
        let history: std::collections::VecDeque<(u64, u64)> =
            [(1_000, 0), (1_050, 100), (1_100, 100), (1_150, 300)].into();
        assert_eq!(launches_between(&history, 1_000, 1_050), Some(100));
        assert_eq!(launches_between(&history, 1_025, 1_125), Some(150));
        assert_eq!(launches_between(&history, 1_100, 2_000), Some(200));
        assert_eq!(
            launches_between(&history, 999, 1_050),
            None,
            "before the history"
        );
        let wall = 1_700_000_000_000_000_000;
        let mono = 50_000_000_000;
        assert_eq!(
            wall_to_monotonic((wall - 200_000_000) / 1000, wall, mono),
            Some(mono - 200_000_000)
        );
        // A CLOCK_MONOTONIC stamp (another driver's clock) cannot be placed.
        assert_eq!(wall_to_monotonic(mono / 1000, wall, mono), None);
    }

    #[test]
    fn a_launching_slice_without_samples_falls_back_and_an_idle_one_does_not() {
        let t = 10_000_000_000;
        assert!(!sample_silence(t + SAMPLE_SILENCE_NS - 1, t, true));
        assert!(sample_silence(t + SAMPLE_SILENCE_NS, t, true));
        assert!(
            !sample_silence(t + 10 * SAMPLE_SILENCE_NS, t, false),
            "idle: no samples"
        );
    }

    #[test]
    fn the_lease_is_kept_by_its_holder_and_taken_over_only_when_expired() {
        let mine = lease_step(0, 7, 1_000).expect("free lease");
        assert_eq!(mine, (7u64 << 32) | u64::from(1_000 + LEASE_MS));
        assert!(lease_step(mine, 7, 1_100).is_some(), "renewal");
        assert!(lease_step(mine, 9, 1_100).is_none(), "held by 7");
        assert!(lease_step(mine, 9, 1_000 + LEASE_MS).is_some(), "expired");
        // Wrap-around of the millisecond clock.
        let near_wrap = lease_step(0, 7, u32::MAX - 10).unwrap();
        assert!(lease_step(near_wrap, 9, 5).is_none());
        assert!(lease_step(near_wrap, 9, LEASE_MS).is_some());
        // A lease from before a reboot: its expiry lies far ahead of the restarted clock.
        let stale = (9u64 << 32) | u64::from(1_000_020_000u32);
        assert!(lease_step(stale, 7, 20_000).is_some(), "implausible expiry");
        assert!(lease_step(stale, 7, 1_000_020_000 - LEASE_MS).is_none());
    }
}
