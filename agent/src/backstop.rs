//! The backstop: the cap checked against the DRIVER's numbers, which a process that bypasses
//! the shim (a static binary, `dlmopen`, raw ioctls) cannot hide from.
//!
//! When the bytes the driver reports for a slice's processes on a device exceed the slice's
//! cap by more than the tolerance for longer than the grace time, that is one over-cap event:
//! a log line and `gpuslice_backstop_over_cap_events_total`. With `--enforce` the agent then
//! ends the slice's NEWEST process on that device (latest start time) with SIGKILL: the
//! newest arrival is the one whose allocations took the slice over, while the largest is
//! usually the long-running job the slice exists for. If the slice is still over after the
//! next grace period, the next newest goes. Without `--enforce` it only reports.
//!
//! On a device marked slices-only (`--slices-only INDEX|UUID`), a process that belongs to no
//! slice and holds more than the tolerance for longer than the grace time is an event too
//! (slice label empty), and with `--enforce` that process is ended: on such a device every
//! process must be some slice's.
//!
//! The tolerance absorbs what the ledger and the driver legitimately count differently
//! (allocation rounding, a context being created); the grace time absorbs a moment's
//! overshoot while a process frees memory.

use crate::collect::NodeView;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// (slice, device UUID, device index) — the labels of the backstop's counters.
pub type Key = (String, String, String);

/// The counters `/metrics` exports (they live as long as the agent).
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub over_cap: BTreeMap<Key, u64>,
    pub kills: BTreeMap<Key, u64>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub tolerance_bytes: u64,
    pub grace: Duration,
    pub enforce: bool,
    /// Devices (NVML index or UUID) where every process must belong to a slice.
    pub slices_only: Vec<String>,
}

/// What the backstop remembers between passes: since when each (slice, device) is over.
#[derive(Default)]
pub struct Backstop {
    over_since: HashMap<Key, Instant>,
}

/// One decision of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Over the cap past the grace time: report (and, enforcing, kill `victim`).
    OverCap {
        key: Key,
        driver_bytes: u64,
        limit: u64,
        victim: Option<u32>,
    },
    /// A process of no slice on a slices-only device past the grace time.
    Unsliced { key: Key, pid: u32, bytes: u64 },
}

impl Backstop {
    /// Judges one view of the node at `now`. `start_time` gives a process's start time (for
    /// "newest"); `None` for a process that is gone.
    pub fn judge(
        &mut self,
        view: &NodeView,
        settings: &Settings,
        now: Instant,
        start_time: &dyn Fn(u32) -> Option<u64>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut still_over = Vec::new();
        let Ok(cards) = &view.cards else {
            // No driver numbers: nothing to judge (and nothing to forget either).
            return actions;
        };
        for (index, slice) in view.slices.iter().enumerate() {
            let Some(snapshot) = &slice.snapshot else {
                continue;
            };
            for device in &snapshot.devices {
                let (Some(limit), Some(card)) = (
                    device.memory_limit,
                    cards.iter().find(|c| c.uuid == device.uuid),
                ) else {
                    continue;
                };
                let (bytes, _) = view.driver_usage(index, card);
                if bytes <= limit.saturating_add(settings.tolerance_bytes) {
                    continue;
                }
                let key = (
                    slice.found.name.clone(),
                    device.uuid.clone(),
                    card.index.to_string(),
                );
                still_over.push(key.clone());
                let since = *self.over_since.entry(key.clone()).or_insert(now);
                if now.duration_since(since) < settings.grace {
                    continue;
                }
                // One event per grace period while it stays over.
                self.over_since.insert(key.clone(), now);
                let victim = card
                    .processes
                    .iter()
                    .filter(|(pid, _)| view.owner.get(pid) == Some(&index))
                    .filter_map(|(pid, _)| start_time(*pid).map(|t| (t, *pid)))
                    .max()
                    .map(|(_, pid)| pid);
                actions.push(Action::OverCap {
                    key,
                    driver_bytes: bytes,
                    limit,
                    victim,
                });
            }
        }
        // Without every registered process verified, a slice's process may look like no
        // slice's: judging "strangers" then could end a slice's own processes.
        let strangers_judged = view.unverified == 0;
        for card in cards.iter().filter(|_| strangers_judged) {
            let marked = settings
                .slices_only
                .iter()
                .any(|d| *d == card.uuid || *d == card.index.to_string());
            if !marked {
                continue;
            }
            for (pid, bytes) in view.unsliced(card) {
                let bytes = bytes.unwrap_or(0);
                if bytes <= settings.tolerance_bytes {
                    continue;
                }
                // Keyed by PID in the slice label's place, so each stranger has its own clock.
                let clock = (
                    format!("pid:{pid}"),
                    card.uuid.clone(),
                    card.index.to_string(),
                );
                still_over.push(clock.clone());
                let since = *self.over_since.entry(clock.clone()).or_insert(now);
                if now.duration_since(since) < settings.grace {
                    continue;
                }
                self.over_since.insert(clock, now);
                actions.push(Action::Unsliced {
                    key: (String::new(), card.uuid.clone(), card.index.to_string()),
                    pid,
                    bytes,
                });
            }
        }
        self.over_since.retain(|k, _| still_over.contains(k));
        actions
    }
}

/// A process's start time from `/proc/<pid>/stat` (clock ticks since boot).
pub fn proc_start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    gpuslice_common::region::parse_stat(&text).map(|s| s.start_time)
}

/// Carries out the actions: log lines, counters, and with `enforce` the SIGKILLs.
pub fn act(actions: &[Action], settings: &Settings, counters: &mut Counters) {
    for action in actions {
        let (key, mut line, victim) = match action {
            Action::OverCap {
                key,
                driver_bytes,
                limit,
                victim,
            } => {
                let (slice, uuid, index) = key;
                let line = format!(
                    "backstop: slice {slice} holds {driver_bytes} bytes on device {index} ({uuid}) by the driver's count, over its cap of {limit} bytes"
                );
                (key, line, *victim)
            }
            Action::Unsliced { key, pid, bytes } => {
                let (_, uuid, index) = key;
                let line = format!(
                    "backstop: process {pid} belongs to no slice and holds {bytes} bytes on slices-only device {index} ({uuid})"
                );
                (key, line, Some(*pid))
            }
        };
        *counters.over_cap.entry(key.clone()).or_default() += 1;
        match (settings.enforce, victim) {
            (true, Some(pid)) => {
                // SAFETY: kill(2) with a PID the driver reported on this device and a valid
                // signal number; it touches no memory of this process.
                let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                if rc == 0 {
                    *counters.kills.entry(key.clone()).or_default() += 1;
                    line.push_str(&format!("; killed process {pid} (SIGKILL)"));
                } else {
                    let e = std::io::Error::last_os_error();
                    line.push_str(&format!("; could not kill process {pid}: {e}"));
                }
            }
            (true, None) => line.push_str("; no process of it to end"),
            (false, _) => line.push_str(" (report only; --enforce would end it)"),
        }
        eprintln!("gpuslice-node: {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::SliceState;
    use crate::discovery::FoundSlice;
    use crate::driver::Card;
    use gpuslice_common::region::{DeviceId, DeviceSnapshot, RegionSnapshot};

    const MIB: u64 = 1 << 20;

    fn view(processes: Vec<(u32, Option<u64>)>) -> NodeView {
        let slice = SliceState {
            counters: None,
            found: FoundSlice::named("a"),
            snapshot: Some(RegionSnapshot {
                generation: 1,
                devices: vec![DeviceSnapshot {
                    id: DeviceId::from_index(0).unwrap(),
                    uuid: "GPU-1".into(),
                    memory_limit: Some(1024 * MIB),
                    compute_percent: None,
                    used_bytes: 0,
                    measured_utilization: None,
                    context_cost: None,
                }],
                processes: Vec::new(),
            }),
        };
        let owner = [(10, 0), (11, 0)].into_iter().collect();
        NodeView {
            slices: vec![slice],
            cards: Ok(vec![Card {
                index: 0,
                uuid: "GPU-1".into(),
                total: 16384 * MIB,
                used: 0,
                free: 0,
                utilization: None,
                processes,
            }]),
            owner,
            unverified: 0,
        }
    }

    #[test]
    fn over_the_cap_past_tolerance_and_grace_names_the_newest_member() {
        let settings = Settings {
            tolerance_bytes: 16 * MIB,
            grace: Duration::from_secs(2),
            enforce: true,
            slices_only: Vec::new(),
        };
        let starts = |pid: u32| Some(u64::from(pid) * 100);
        let mut backstop = Backstop::default();
        let t0 = Instant::now();
        // Within the tolerance: nothing, ever.
        let within = view(vec![(10, Some(1000 * MIB)), (11, Some(30 * MIB))]);
        assert!(backstop.judge(&within, &settings, t0, &starts).is_empty());
        // Over (and a stranger, 12, that belongs to no slice is not counted or chosen).
        let over = view(vec![
            (10, Some(1000 * MIB)),
            (11, Some(100 * MIB)),
            (12, Some(4000 * MIB)),
        ]);
        assert!(backstop.judge(&over, &settings, t0, &starts).is_empty());
        let t1 = t0 + Duration::from_secs(1);
        assert!(
            backstop.judge(&over, &settings, t1, &starts).is_empty(),
            "within grace"
        );
        let t2 = t0 + Duration::from_secs(2);
        let actions = backstop.judge(&over, &settings, t2, &starts);
        assert_eq!(
            actions,
            [Action::OverCap {
                key: ("a".into(), "GPU-1".into(), "0".into()),
                driver_bytes: 1100 * MIB,
                limit: 1024 * MIB,
                victim: Some(11),
            }]
        );
        // The next event only after another grace period.
        assert!(backstop
            .judge(&over, &settings, t2 + Duration::from_secs(1), &starts)
            .is_empty());
        // Back under: forgotten, so a new overshoot waits a full grace again.
        assert!(backstop
            .judge(&within, &settings, t2 + Duration::from_secs(3), &starts)
            .is_empty());
        assert!(backstop
            .judge(&over, &settings, t2 + Duration::from_secs(4), &starts)
            .is_empty());
    }

    #[test]
    fn report_only_counts_without_killing() {
        let settings = Settings {
            tolerance_bytes: 0,
            grace: Duration::ZERO,
            enforce: false,
            slices_only: Vec::new(),
        };
        let mut backstop = Backstop::default();
        let over = view(vec![(10, Some(2000 * MIB))]);
        let actions = backstop.judge(&over, &settings, Instant::now(), &|_| Some(1));
        assert_eq!(actions.len(), 1);
        let mut counters = Counters::default();
        act(&actions, &settings, &mut counters);
        assert_eq!(counters.over_cap.values().sum::<u64>(), 1);
        assert!(counters.kills.is_empty());
    }

    #[test]
    fn strangers_on_a_slices_only_device_are_events_there_only() {
        let mut settings = Settings {
            tolerance_bytes: 16 * MIB,
            grace: Duration::from_secs(1),
            enforce: true,
            slices_only: Vec::new(),
        };
        let node = view(vec![
            (10, Some(100 * MIB)),
            (12, Some(400 * MIB)),
            (13, Some(MIB)),
        ]);
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut backstop = Backstop::default();
        assert!(backstop
            .judge(&node, &settings, t0, &|_| Some(1))
            .is_empty());
        assert!(
            backstop
                .judge(&node, &settings, later, &|_| Some(1))
                .is_empty(),
            "not marked"
        );
        let mut unsure = view(vec![(12, Some(400 * MIB))]);
        unsure.unverified = 1;
        settings.slices_only = vec!["0".into()];
        let mut careful = Backstop::default();
        assert!(careful
            .judge(&unsure, &settings, t0, &|_| Some(1))
            .is_empty());
        assert!(
            careful
                .judge(&unsure, &settings, later, &|_| Some(1))
                .is_empty(),
            "an unverified registered process makes 'no slice' unsure"
        );
        for mark in ["0", "GPU-1"] {
            settings.slices_only = vec![mark.into()];
            let mut backstop = Backstop::default();
            assert!(
                backstop
                    .judge(&node, &settings, t0, &|_| Some(1))
                    .is_empty(),
                "grace"
            );
            // 12 only: 10 is the slice's, 13 holds less than the tolerance.
            assert_eq!(
                backstop.judge(&node, &settings, later, &|_| Some(1)),
                [Action::Unsliced {
                    key: (String::new(), "GPU-1".into(), "0".into()),
                    pid: 12,
                    bytes: 400 * MIB,
                }]
            );
        }
    }
}
