//! The backstop: the cap checked against the DRIVER's numbers, which a process that bypasses
//! the shim (a static binary, `dlmopen`, raw ioctls) cannot hide from.
//!
//! When the bytes the driver reports for a slice's processes on a device exceed the slice's
//! cap by more than the tolerance for longer than the grace time, the excess is attributed to
//! the processes whose driver bytes the slice's ledger does not account for: a process of the
//! slice's container that is not registered in its region (every byte of it), or a registered
//! one whose driver bytes exceed its ledger entry by more than the tolerance for longer than
//! [`DRIVER_GROWTH_BOUND`] (the shim charges what the driver takes on its own account within
//! that bound, so a well-behaved process is never such a process). That is one over-cap event:
//! a log line and `gpuslice_backstop_over_cap_events_total`; with `--enforce` the agent ends
//! the process with the most unaccounted bytes (SIGKILL), the next one after the next grace
//! period if the slice is still over. When the ledger accounts for all of it (the driver's
//! own growth took the slice past its cap: its shims refuse allocations until it is back
//! under), that is an accounted event (`gpuslice_backstop_accounted_over_cap_events_total`),
//! and no process is ended. Without `--enforce` it only reports.
//!
//! On a device marked slices-only (`--slices-only INDEX|UUID`), a process that belongs to no
//! slice and holds more than the tolerance for longer than the grace time is an event too
//! (slice label empty), and with `--enforce` that process is ended: on such a device every
//! process must be some slice's. A process that maps a slice's broken region is that slice's
//! (`collect`), never of no slice; a slice whose region cannot be read, or whose processes
//! map a region that is no longer its file, is not judged.
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
    /// Over the cap by bytes the ledger accounts for (no process to blame).
    pub accounted: BTreeMap<Key, u64>,
}

/// How long a registered process's driver bytes may exceed its ledger entry before they are
/// taken for bytes the shim does not see: the shim reconciles the driver's own growth within
/// 1.5 s (`memory::driver_growth::BOUND`); the rest is margin for a loaded machine.
pub const DRIVER_GROWTH_BOUND: Duration = Duration::from_secs(3);

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
    /// Since when a registered process's driver bytes exceed its ledger entry (PID, UUID).
    unaccounted_since: HashMap<(u32, String), Instant>,
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
    /// Over the cap past the grace time, every byte accounted for by the ledger.
    Accounted {
        key: Key,
        driver_bytes: u64,
        limit: u64,
    },
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
        let mut still_unaccounted = Vec::new();
        let Ok(cards) = &view.cards else {
            // No driver numbers: nothing to judge (and nothing to forget either).
            return actions;
        };
        for (index, slice) in view.slices.iter().enumerate() {
            let Some(snapshot) = &slice.snapshot else {
                continue;
            };
            // Processes still map a region that is no longer the slice's file: what they
            // hold is in a ledger the agent cannot read, so the slice is not judged.
            if view.broken.iter().any(|(i, _, _)| *i == index) {
                continue;
            }
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
                let blamed =
                    self.unaccounted(view, index, card, settings, now, &mut still_unaccounted);
                let victim = blamed
                    .into_iter()
                    .map(|(pid, bytes)| (bytes, start_time(pid).unwrap_or(0), pid))
                    .max()
                    .map(|(_, _, pid)| pid);
                actions.push(match victim {
                    Some(pid) => Action::OverCap {
                        key,
                        driver_bytes: bytes,
                        limit,
                        victim: Some(pid),
                    },
                    None => Action::Accounted {
                        key,
                        driver_bytes: bytes,
                        limit,
                    },
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
        self.unaccounted_since
            .retain(|k, _| still_unaccounted.contains(k));
        actions
    }

    /// The slice's processes on `card` whose driver bytes the ledger does not account for,
    /// with those bytes: unregistered ones at once, registered ones once their surplus over
    /// the tolerance has lasted [`DRIVER_GROWTH_BOUND`] (clocks kept in `still`).
    fn unaccounted(
        &mut self,
        view: &NodeView,
        slice: usize,
        card: &crate::driver::Card,
        settings: &Settings,
        now: Instant,
        still: &mut Vec<(u32, String)>,
    ) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for &(pid, bytes) in &card.processes {
            if view.owner.get(&pid) != Some(&slice) {
                continue;
            }
            let driver = bytes.unwrap_or(0);
            match view.ledger_bytes(pid, card) {
                None if driver > settings.tolerance_bytes => out.push((pid, driver)),
                None => {}
                Some(ledger) => {
                    let surplus = driver.saturating_sub(ledger);
                    if surplus <= settings.tolerance_bytes {
                        continue;
                    }
                    let clock = (pid, card.uuid.clone());
                    still.push(clock.clone());
                    let since = *self.unaccounted_since.entry(clock).or_insert(now);
                    if now.duration_since(since) >= DRIVER_GROWTH_BOUND {
                        out.push((pid, surplus));
                    }
                }
            }
        }
        out
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
        if let Action::Accounted {
            key,
            driver_bytes,
            limit,
        } = action
        {
            let (slice, uuid, index) = key;
            *counters.accounted.entry(key.clone()).or_default() += 1;
            eprintln!(
                "gpuslice-node: backstop: slice {slice} holds {driver_bytes} bytes on device {index} ({uuid}) by the driver's count, over its cap of {limit} bytes, all of them in its ledger (memory the driver took on its processes' account): its allocations are refused until it is back under; no process ended"
            );
            continue;
        }
        let (key, mut line, victim) = match action {
            Action::OverCap {
                key,
                driver_bytes,
                limit,
                victim,
            } => {
                let (slice, uuid, index) = key;
                let mut line = format!(
                    "backstop: slice {slice} holds {driver_bytes} bytes on device {index} ({uuid}) by the driver's count, over its cap of {limit} bytes"
                );
                if let Some(pid) = victim {
                    line.push_str(&format!(
                        "; process {pid} holds the most bytes the slice's ledger does not account for"
                    ));
                }
                (key, line, *victim)
            }
            Action::Unsliced { key, pid, bytes } => {
                let (_, uuid, index) = key;
                let line = format!(
                    "backstop: process {pid} belongs to no slice and holds {bytes} bytes on slices-only device {index} ({uuid})"
                );
                (key, line, Some(*pid))
            }
            Action::Accounted { .. } => continue,
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
    use crate::collect::fixtures::{self, one_device_region};
    use crate::collect::SliceState;
    use crate::discovery::FoundSlice;
    use crate::driver::Card;

    const MIB: u64 = 1 << 20;

    fn view(processes: Vec<(u32, Option<u64>)>) -> NodeView {
        let slice = SliceState {
            counters: None,
            found: FoundSlice::named("a"),
            snapshot: Some(one_device_region("GPU-1", 1024 * MIB, Vec::new())),
        };
        let card = Card {
            index: 0,
            uuid: "GPU-1".into(),
            total: 16384 * MIB,
            used: 0,
            free: 0,
            utilization: None,
            processes,
        };
        NodeView {
            owner: [(10, 0), (11, 0)].into_iter().collect(),
            ..fixtures::view(vec![slice], Ok(vec![card]))
        }
    }

    /// `view` with `pid` registered in the slice's ledger with `bytes` on device entry 0.
    fn with_ledger(mut view: NodeView, entries: &[(u32, u64)]) -> NodeView {
        for &(pid, bytes) in entries {
            let mut used = [0; gpuslice_common::region::MAX_DEVICES];
            used[0] = bytes;
            view.ledger.insert(pid, (0, used));
        }
        view
    }

    #[test]
    fn the_excess_is_blamed_on_bytes_the_ledger_does_not_account_for() {
        let settings = Settings {
            tolerance_bytes: 16 * MIB,
            grace: Duration::from_secs(1),
            enforce: true,
            slices_only: Vec::new(),
        };
        // 10 is registered and accounted for; 11, newer and registered, grew by 200 MiB the
        // shim has not charged yet; 12 bypasses (in the slice's container, not registered).
        let starts = |pid: u32| Some(u64::from(pid) * 100);
        let mut owner_of_12 = with_ledger(
            view(vec![
                (10, Some(900 * MIB)),
                (11, Some(300 * MIB)),
                (12, Some(200 * MIB)),
            ]),
            &[(10, 900 * MIB), (11, 100 * MIB)],
        );
        owner_of_12.owner.insert(12, 0);
        let mut backstop = Backstop::default();
        let t0 = Instant::now();
        assert!(backstop
            .judge(&owner_of_12, &settings, t0, &starts)
            .is_empty());
        let t1 = t0 + Duration::from_secs(1);
        let victim = |actions: Vec<Action>| match actions.as_slice() {
            [Action::OverCap { victim, .. }] => *victim,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            victim(backstop.judge(&owner_of_12, &settings, t1, &starts)),
            Some(12),
            "the bypasser, not the newest nor the largest"
        );
        // Without the bypasser: 11's surplus is the driver's own growth within the bound.
        let mut growth = owner_of_12.clone();
        if let Ok(cards) = &mut growth.cards {
            cards[0].processes.retain(|(pid, _)| *pid != 12);
        }
        growth.owner.remove(&12);
        let t2 = t1 + Duration::from_secs(1);
        match backstop.judge(&growth, &settings, t2, &starts).as_slice() {
            [] => {}
            [Action::Accounted { .. }] => {}
            other => panic!("within the bound no process is blamed: {other:?}"),
        }
        // Past the bound it is bytes the shim did not see.
        let late = t1 + DRIVER_GROWTH_BOUND + Duration::from_secs(2);
        assert_eq!(
            victim(backstop.judge(&growth, &settings, late, &starts)),
            Some(11)
        );
        // A holder of a replaced region (its ledger unreadable): the slice is not judged.
        let mut replaced = owner_of_12.clone();
        replaced.broken.push((0, 12, "/r (deleted)".into()));
        let mut careful = Backstop::default();
        assert!(careful.judge(&replaced, &settings, t0, &starts).is_empty());
        assert!(careful
            .judge(&replaced, &settings, late, &starts)
            .is_empty());
        // Everything in the ledger (the ledger itself past the cap): accounted, no victim.
        let charged = with_ledger(growth.clone(), &[(11, 300 * MIB)]);
        let mut fresh = Backstop::default();
        assert!(fresh.judge(&charged, &settings, t0, &starts).is_empty());
        let actions = fresh.judge(&charged, &settings, t1, &starts);
        assert!(
            matches!(actions.as_slice(), [Action::Accounted { driver_bytes, .. }] if *driver_bytes == 1200 * MIB),
            "{actions:?}"
        );
        let mut counters = Counters::default();
        act(&actions, &settings, &mut counters);
        assert!(counters.kills.is_empty() && counters.over_cap.is_empty());
        assert_eq!(counters.accounted.values().sum::<u64>(), 1);
    }

    #[test]
    fn over_the_cap_past_tolerance_and_grace_names_an_unaccounted_member() {
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
        // Over (and a stranger, 12, that belongs to no slice is not counted or chosen); 10
        // is in the ledger, 11 is not.
        let over = with_ledger(
            view(vec![
                (10, Some(1000 * MIB)),
                (11, Some(100 * MIB)),
                (12, Some(4000 * MIB)),
            ]),
            &[(10, 1000 * MIB)],
        );
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
