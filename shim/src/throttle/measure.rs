//! The measurement side of the throttle: NVML through the REAL `libnvidia-ml` (the shim's
//! real-function slots, never our own filtered wrappers).
//!
//! * `process_busy`: `nvmlDeviceGetProcessUtilization` since the previous call's newest
//!   timestamp, turned into busy nanoseconds per PID (`smUtil` % of the span; several samples
//!   of one PID are averaged). Timestamps are NVML's own, never mixed with our clock.
//! * `running_pids`: `nvmlDeviceGetComputeRunningProcesses_v3` (v2 on older drivers).
//! * host-PID discovery takes `running_pids`' answer to `session::host_pid::discover` (the
//!   kernel's `NSpid`, the host PID the slot records, the one a context creation showed, or
//!   our own PID, whichever NVML lists; see `watcher::resolve`).

use gpuslice_abi::nvml::{nvmlDevice_t, nvmlProcessUtilizationSample_t};

use crate::ground::driver::real;

/// A device handle the real NVML gave us (valid for the process's life: the shim never shuts
/// NVML down). Only the functions below use it, so no caller can hand them a stray pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(nvmlDevice_t);

/// The real NVML handle of a device, by UUID first, else by index.
pub fn device_handle(uuid: &str, index: u32) -> Option<Handle> {
    crate::ground::devices::real_nvml_handle(uuid, Some(index)).map(Handle)
}

/// PIDs (as NVML reports them) of the processes holding a context on the device.
pub fn running_pids(Handle(handle): Handle) -> Option<Vec<u32>> {
    let list = crate::ground::devices::nvml_compute_processes(handle).ok()?;
    Some(list.iter().map(|p| p.pid).collect())
}

/// Busy time per PID since `last_seen_us` (NVML's clock), and the newest timestamp to pass
/// next time. `Ok((vec![], last_seen))` = no sample newer than `last_seen_us`.
pub struct Busy {
    /// (pid, busy ns) over `span_ns`.
    pub per_pid: Vec<(u32, u64)>,
    pub span_ns: u64,
    pub newest_us: u64,
    /// The smallest gap between two stamps of this one answer: a driver that buffers
    /// per-period samples shows its sample period so (the exact fake answers one stamp).
    pub min_gap_us: Option<u64>,
}

/// Per-PID busy ns from NVML process samples; `None` when NVML cannot answer.
pub fn process_busy(
    Handle(handle): Handle,
    last_seen_us: u64,
    held: &mut Held,
    period_us: Option<u64>,
) -> Option<Busy> {
    let get = real::nvmlDeviceGetProcessUtilization()?;
    match crate::ground::devices::read_utilization_samples(get, handle, last_seen_us) {
        Ok(samples) => Some(busy_from_samples(&samples, last_seen_us, held, period_us)),
        // NOT_FOUND: nothing newer than last_seen (or no process): an empty tick.
        Err(gpuslice_abi::nvml::ret::NVML_ERROR_NOT_FOUND) => Some(Busy {
            per_pid: Vec::new(),
            span_ns: 0,
            newest_us: last_seen_us,
            min_gap_us: None,
        }),
        Err(_) => None,
    }
}

/// The figures of the newest stretch, per PID: (pid, smUtil, already held once). A process
/// that had a sample in one stretch and none in the next, while others did, is taken to have
/// kept its figure for that one stretch: a real driver drops samples now and then, and an
/// undercounted slice would be let past its share. A process that really went idle is
/// over-counted for one stretch (errs towards the cap).
pub type Held = Vec<(u32, u32, bool)>;

/// Pure: samples -> busy ns per PID over `[last_seen, newest]`.
///
/// A real driver answers one sample per process per sample period (1/6 s to 1 s), stamped
/// with the period's end; the fake in exact mode answers one covering `[last_seen, now]`.
/// Both read the same way: each distinct timestamp covers the time since the previous one
/// (the first, since `last_seen`), and a process's `smUtil` is its percent of that stretch.
/// A process without a sample for a stretch was idle in it (the driver lists only processes
/// with a non-zero figure). `last_seen_us` 0 (the first read): the first stretch is unknown
/// (counted as empty); the caller discards that read anyway.
///
/// With the driver's sample period known (`period_us`, learned from [`Busy::min_gap_us`]),
/// a stamp's figure covers one period, not a longer stretch: a stretch of several periods
/// means periods in which no process had a sample (all idle, or the only busy process's
/// sample dropped). Those count as idle, except that a process held over (see [`Held`]) keeps
/// its figure for one of them.
pub fn busy_from_samples(
    samples: &[nvmlProcessUtilizationSample_t],
    last_seen_us: u64,
    held: &mut Held,
    period_us: Option<u64>,
) -> Busy {
    let mut stamps: Vec<u64> = samples
        .iter()
        .map(|s| s.timeStamp)
        .filter(|&t| t > last_seen_us)
        .collect();
    stamps.sort_unstable();
    stamps.dedup();
    let Some(&newest_us) = stamps.last() else {
        return Busy {
            per_pid: Vec::new(),
            span_ns: 0,
            newest_us: last_seen_us,
            min_gap_us: None,
        };
    };
    let min_gap_us = stamps.windows(2).map(|w| w[1] - w[0]).min();
    let first_from = if last_seen_us == 0 {
        stamps[0]
    } else {
        last_seen_us
    };
    let mut per_pid: Vec<(u32, u64)> = Vec::new();
    let mut add = |pid: u32, busy: u64| match per_pid.iter_mut().find(|(p, _)| *p == pid) {
        Some(entry) => entry.1 += busy,
        None => per_pid.push((pid, busy)),
    };
    let mut previous = first_from;
    for &stamp in &stamps {
        let stretch_us = stamp - previous;
        previous = stamp;
        // A stamp covers one period; the rest of a longer stretch had no samples at all.
        let (stretch_us, skipped) = match period_us {
            Some(p) if p > 0 && stretch_us > p + p / 2 => (p, true),
            _ => (stretch_us, false),
        };
        let mut now_held: Held = Vec::new();
        if skipped {
            // The held figures cover one of the empty periods (a single busy process's
            // dropped sample); they are then spent.
            for &(pid, sm, was_held) in held.iter() {
                if !was_held {
                    add(pid, stretch_us * 10 * u64::from(sm));
                }
            }
            held.iter_mut().for_each(|h| h.2 = true);
        }
        for sample in samples.iter().filter(|s| s.timeStamp == stamp) {
            let sm = sample.smUtil.min(100);
            // pct % of a stretch of µs, in ns: us * 1000 * pct / 100.
            add(sample.pid, stretch_us * 10 * u64::from(sm));
            if !now_held.iter().any(|h| h.0 == sample.pid) {
                now_held.push((sample.pid, sm, false));
            }
        }
        for &(pid, sm, was_held) in held.iter() {
            if !was_held && !now_held.iter().any(|h| h.0 == pid) {
                add(pid, stretch_us * 10 * u64::from(sm));
                now_held.push((pid, sm, true));
            }
        }
        *held = now_held;
    }
    Busy {
        per_pid,
        span_ns: newest_us.saturating_sub(first_from).saturating_mul(1000),
        newest_us,
        min_gap_us,
    }
}

/// The device's utilisation percent from the real `nvmlDeviceGetUtilizationRates` (the
/// fallback measurement when no per-process sample comes); `None` when NVML cannot answer.
pub fn device_percent(Handle(handle): Handle) -> Option<u32> {
    let get = real::nvmlDeviceGetUtilizationRates()?;
    let mut util = gpuslice_abi::nvml::nvmlUtilization_t { gpu: 0, memory: 0 };
    // SAFETY: `util` is a valid out-pointer; NVML rejects a handle it did not give out.
    let rc = unsafe { get(handle, &mut util) };
    (rc == gpuslice_abi::nvml::ret::NVML_SUCCESS).then_some(util.gpu.min(100))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, ts: u64, sm: u32) -> nvmlProcessUtilizationSample_t {
        nvmlProcessUtilizationSample_t {
            pid,
            timeStamp: ts,
            smUtil: sm,
            ..Default::default()
        }
    }

    #[test]
    fn samples_become_busy_nanoseconds_over_the_span() {
        let busy = busy_from_samples(
            &[sample(7, 1_100_000, 25), sample(8, 1_100_000, 50)],
            1_000_000,
            &mut Held::new(),
            None,
        );
        assert_eq!(busy.span_ns, 100_000_000);
        assert_eq!(busy.newest_us, 1_100_000);
        assert_eq!(busy.per_pid, vec![(7, 25_000_000), (8, 50_000_000)]);
        // Several samples of one process average; out-of-range values are clipped.
        let busy = busy_from_samples(
            &[sample(7, 1_050_000, 20), sample(7, 1_100_000, 400)],
            1_000_000,
            &mut Held::new(),
            None,
        );
        // Two samples of one process at two period ends: each covers its own stretch.
        assert_eq!(busy.per_pid, vec![(7, 10_000_000 + 50_000_000)]);
        let none = busy_from_samples(&[], 5, &mut Held::new(), None);
        assert_eq!((none.span_ns, none.newest_us), (0, 5));
    }

    #[test]
    fn period_samples_from_a_real_driver_add_up_over_the_span() {
        // Three 1/6 s periods after last_seen; process 7 busy 50 % in each, process 8 only in
        // the last (absent = idle), an old sample (at last_seen) ignored.
        let p = 166_667;
        let t0 = 1_700_000_000_000_000; // wall-clock µs
        let busy = busy_from_samples(
            &[
                sample(7, t0, 100),
                sample(7, t0 + p, 50),
                sample(7, t0 + 2 * p, 50),
                sample(7, t0 + 3 * p, 50),
                sample(8, t0 + 3 * p, 30),
            ],
            t0,
            &mut Held::new(),
            None,
        );
        assert_eq!(busy.newest_us, t0 + 3 * p);
        assert_eq!(busy.span_ns, 3 * p * 1000);
        assert_eq!(
            busy.per_pid,
            vec![(7, 3 * p * 1000 / 2), (8, p * 1000 * 30 / 100)]
        );
    }

    #[test]
    fn a_dropped_sample_keeps_the_process_figure_for_one_stretch_only() {
        let p = 100_000;
        let t0 = 1_700_000_000_000_000;
        let mut held = Held::new();
        // 7 and 8 at 40 %; 8's sample of the second period is missing, then 8 is idle.
        let busy = busy_from_samples(
            &[
                sample(7, t0 + p, 40),
                sample(8, t0 + p, 40),
                sample(7, t0 + 2 * p, 40),
                sample(7, t0 + 3 * p, 40),
                sample(7, t0 + 4 * p, 40),
            ],
            t0,
            &mut held,
            None,
        );
        let stretch = p * 1000 * 40 / 100;
        assert_eq!(busy.per_pid, vec![(7, 4 * stretch), (8, 2 * stretch)]);
        // The hold carries across calls: 7 missing at the next stamp is held once.
        let busy = busy_from_samples(&[sample(9, t0 + 5 * p, 10)], t0 + 4 * p, &mut held, None);
        assert_eq!(busy.per_pid, vec![(9, p * 1000 * 10 / 100), (7, stretch)]);
    }

    #[test]
    fn with_the_period_known_empty_periods_are_idle_and_a_held_figure_fills_one() {
        let p = 100_000;
        let t0 = 1_700_000_000_000_000;
        // The first read shows the period (two stamps in one answer).
        let mut held = Held::new();
        let busy = busy_from_samples(
            &[sample(7, t0 - p, 50), sample(7, t0, 50)],
            t0 - 2 * p,
            &mut held,
            None,
        );
        assert_eq!(busy.min_gap_us, Some(p));
        // Next: three periods later, one sample; 7 idle in between (or its sample dropped
        // once): the stamp's figure covers one period, the held 50 % fills one more.
        let busy = busy_from_samples(&[sample(7, t0 + 3 * p, 20)], t0, &mut held, Some(p));
        assert_eq!(busy.span_ns, 3 * p * 1000);
        assert_eq!(
            busy.per_pid,
            vec![(7, p * 1000 * 50 / 100 + p * 1000 * 20 / 100)]
        );
        // Without the period (exact fake): the stamp covers the whole stretch.
        let busy = busy_from_samples(
            &[sample(7, t0 + 6 * p, 20)],
            t0 + 3 * p,
            &mut Held::new(),
            None,
        );
        assert_eq!(busy.per_pid, vec![(7, 3 * p * 1000 * 20 / 100)]);
    }
}
