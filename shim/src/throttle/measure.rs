//! The measurement side of the throttle: NVML through the REAL `libnvidia-ml` (the shim's
//! real-function slots, never our own filtered wrappers), and discovery of this process's
//! host PID as NVML reports it.
//!
//! * `process_busy`: `nvmlDeviceGetProcessUtilization` since the previous call's newest
//!   timestamp, turned into busy nanoseconds per PID (`smUtil` % of the span; several samples
//!   of one PID are averaged). Timestamps are NVML's own, never mixed with our clock.
//! * `running_pids`: `nvmlDeviceGetComputeRunningProcesses_v3` (v2 on older drivers).
//! * host-PID discovery uses `running_pids` (see `throttle::discover_pid` and
//!   `watcher::resolve`): the kernel's `NSpid`, the host PID the memory ledger recorded in the
//!   region, or our own PID, whichever NVML lists.

use gpuslice_abi::nvml::{nvmlDevice_t, nvmlProcessUtilizationSample_t};

use crate::registry::real;

/// A device handle the real NVML gave us (valid for the process's life: the shim never shuts
/// NVML down). Only the functions below use it, so no caller can hand them a stray pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(nvmlDevice_t);

/// The real NVML handle of a device, by UUID first, else by index.
pub fn device_handle(uuid: &str, index: u32) -> Option<Handle> {
    crate::devices::real_nvml_handle(uuid, Some(index)).map(Handle)
}

/// PIDs (as NVML reports them) of the processes holding a context on the device.
pub fn running_pids(Handle(handle): Handle) -> Option<Vec<u32>> {
    let list = crate::devices::nvml_compute_processes(handle).ok()?;
    Some(list.iter().map(|p| p.pid).collect())
}

/// Busy time per PID since `last_seen_us` (NVML's clock), and the newest timestamp to pass
/// next time. `Ok((vec![], last_seen))` = no sample newer than `last_seen_us`.
pub struct Busy {
    /// (pid, busy ns) over `span_ns`.
    pub per_pid: Vec<(u32, u64)>,
    pub span_ns: u64,
    pub newest_us: u64,
}

/// Per-PID busy ns from NVML process samples; `None` when NVML cannot answer.
pub fn process_busy(Handle(handle): Handle, last_seen_us: u64) -> Option<Busy> {
    let get = real::nvmlDeviceGetProcessUtilization()?;
    match crate::devices::read_utilization_samples(get, handle, last_seen_us) {
        Ok(samples) => Some(busy_from_samples(&samples, last_seen_us)),
        // NOT_FOUND: nothing newer than last_seen (or no process): an empty tick.
        Err(gpuslice_abi::nvml::ret::NVML_ERROR_NOT_FOUND) => Some(Busy {
            per_pid: Vec::new(),
            span_ns: 0,
            newest_us: last_seen_us,
        }),
        Err(_) => None,
    }
}

/// Pure: samples -> busy ns per PID over `[last_seen, newest]`.
pub fn busy_from_samples(samples: &[nvmlProcessUtilizationSample_t], last_seen_us: u64) -> Busy {
    let newest_us = samples
        .iter()
        .map(|s| s.timeStamp)
        .max()
        .unwrap_or(last_seen_us);
    let span_ns = newest_us.saturating_sub(last_seen_us).saturating_mul(1000);
    let mut sums: Vec<(u32, u64, u64)> = Vec::new(); // pid, sum of smUtil, samples
    for sample in samples {
        match sums.iter_mut().find(|(pid, _, _)| *pid == sample.pid) {
            Some(entry) => {
                entry.1 += u64::from(sample.smUtil.min(100));
                entry.2 += 1;
            }
            None => sums.push((sample.pid, u64::from(sample.smUtil.min(100)), 1)),
        }
    }
    Busy {
        per_pid: sums
            .into_iter()
            .map(|(pid, sum, n)| {
                (
                    pid,
                    (span_ns as u128 * sum as u128 / (100 * n as u128)) as u64,
                )
            })
            .collect(),
        span_ns,
        newest_us,
    }
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
        );
        assert_eq!(busy.span_ns, 100_000_000);
        assert_eq!(busy.newest_us, 1_100_000);
        assert_eq!(busy.per_pid, vec![(7, 25_000_000), (8, 50_000_000)]);
        // Several samples of one process average; out-of-range values are clipped.
        let busy = busy_from_samples(
            &[sample(7, 1_050_000, 20), sample(7, 1_100_000, 400)],
            1_000_000,
        );
        assert_eq!(busy.per_pid, vec![(7, 60_000_000)]);
        let none = busy_from_samples(&[], 5);
        assert_eq!((none.span_ns, none.newest_us), (0, 5));
    }
}
