//! The backstop: the cap checked against the DRIVER's numbers, which a process that bypasses
//! the shim (a static binary, `dlmopen`, the real driver reached behind the shim, raw ioctls)
//! cannot hide from, and against the caps of the limit files, which no tenant can write
//! (`collect`: a region's words are the slice's own processes' to write, so none is taken on
//! its word). Three rules, each on a clock of its own that measures how long what it judges
//! has lasted, never how passes happen to fall: the watch loop wakes when a clock is due
//! ([`Backstop::wake_by`]), so `--interval` only bounds how late a condition is first seen.
//!
//! * **Unaccounted bytes of a registered process.** A registered process's slot holds what
//!   the shim priced for it, the memory the driver places by itself included; the driver may
//!   hold up to [`UNPRICED_BOUND_BYTES`] more for it on a device (what the shim's model
//!   cannot know exactly). Bytes beyond that are unaccounted: the process reached the driver
//!   behind the shim. Once a process has held unaccounted bytes on a device for
//!   [`UNACCOUNTED_FOR`], that is an unaccounted event (a log line,
//!   `gpuslice_backstop_unaccounted_events_total`), whether or not its slice is over its cap,
//!   and with `--enforce` the process is ended (SIGKILL); one event per [`UNACCOUNTED_FOR`]
//!   while it lasts. A process whose bytes the ledger accounts for never is one.
//! * **Over the cap.** When the bytes the driver reports for a slice's processes on a card
//!   exceed the slice's cap by more than the tolerance for longer than the grace time, that
//!   is an over-cap event (`gpuslice_backstop_over_cap_events_total`); with `--enforce` the
//!   agent ends the process with the most bytes the ledger does not account for (all of an
//!   unregistered process's), or, where the ledger accounts for them all (then the ledger
//!   itself holds more than the limit file allows: a process of the slice wrote its region's
//!   limit or total words, or memory the driver placed was charged past the cap; counted in
//!   `gpuslice_backstop_accounted_over_cap_events_total` too), the process holding the most;
//!   the next after the next grace period if the slice is still over.
//! * **Processes of no slice.** On a device marked slices-only (`--slices-only INDEX|UUID`),
//!   a process that belongs to no slice and holds more than the tolerance for longer than the
//!   grace time is an event too (slice label empty), and with `--enforce` it is ended. Judged
//!   only where the agent sees the host's PIDs, and never a process a registered slot names
//!   that the agent may not examine (`NodeView::unknowable`).
//!
//! The tolerance absorbs what the ledger and the driver legitimately count differently for a
//! slice (allocation rounding, a context being created, the unpriced bytes of its
//! processes); the grace time absorbs a moment's overshoot while a process frees memory.

use crate::collect::{CapSource, Ledger, Member, NodeView};
use crate::driver::Card;
use gpuslice_common::unpriced::UNPRICED_BOUND_BYTES;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// (slice, device UUID, device index) — the labels of the backstop's counters.
pub type Key = (String, String, String);

/// The counters `/metrics` exports (they live as long as the agent).
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub over_cap: BTreeMap<Key, u64>,
    pub kills: BTreeMap<Key, u64>,
    /// Of the over-cap events, those in which the ledger accounted for every byte.
    pub accounted: BTreeMap<Key, u64>,
    /// Registered processes holding unaccounted bytes for [`UNACCOUNTED_FOR`].
    pub unaccounted: BTreeMap<Key, u64>,
}

/// How long a registered process may hold more than its ledger entry plus
/// [`UNPRICED_BOUND_BYTES`] on a device before it is an unaccounted event (and, enforcing,
/// ended): long enough that a read of the ledger and the driver that straddles an
/// allocation or a free is never taken for one (each look keeps the larger of two ledger
/// reads around the driver's, and a suspected process is looked at every
/// [`SUSPECT_INTERVAL`] until then).
pub const UNACCOUNTED_FOR: Duration = Duration::from_secs(3);

/// How often a process with unaccounted bytes is looked at again, at least, while its clock
/// runs.
pub const SUSPECT_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct Settings {
    pub tolerance_bytes: u64,
    pub grace: Duration,
    pub enforce: bool,
    /// Devices (NVML index or UUID) where every process must belong to a slice.
    pub slices_only: Vec<String>,
}

/// What the backstop remembers between passes: since when each condition has held.
#[derive(Default)]
pub struct Backstop {
    /// Since when each (slice, device) is over its cap, and each stranger (slice label
    /// `pid:N`) on a slices-only device holds more than the tolerance.
    over_since: HashMap<Key, Instant>,
    /// Since when a registered process (PID, device UUID) holds unaccounted bytes.
    unaccounted_since: HashMap<(u32, String), Instant>,
}

/// One decision of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A registered process held unaccounted bytes for [`UNACCOUNTED_FOR`]: report (and,
    /// enforcing, end it).
    Unaccounted {
        key: Key,
        pid: u32,
        driver_bytes: u64,
        ledger_bytes: u64,
    },
    /// Over the cap past the grace time: report (and, enforcing, end `victim`).
    OverCap {
        key: Key,
        driver_bytes: u64,
        limit: u64,
        source: CapSource,
        victim: Option<u32>,
        /// The ledger accounts for every byte: `victim` is the process holding the most.
        accounted: bool,
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
        let Ok(cards) = &view.cards else {
            // No driver numbers: nothing to judge (and nothing to forget either).
            return actions;
        };
        let mut still_over = HashSet::new();
        let mut still_unaccounted = HashSet::new();
        for card in cards {
            self.judge_processes(view, card, now, &mut still_unaccounted, &mut actions);
            for slice in 0..view.slices.len() {
                actions.extend(self.judge_cap(
                    view,
                    settings,
                    slice,
                    card,
                    now,
                    start_time,
                    &mut still_over,
                ));
            }
            self.judge_strangers(view, settings, card, now, &mut still_over, &mut actions);
        }
        self.over_since.retain(|k, _| still_over.contains(k));
        self.unaccounted_since
            .retain(|k, _| still_unaccounted.contains(k));
        actions
    }

    /// When the next pass should be, at the latest: when a clock is due, and every
    /// [`SUSPECT_INTERVAL`] from `now` while a process is suspected of unaccounted bytes.
    pub fn wake_by(&self, settings: &Settings, now: Instant) -> Option<Instant> {
        let over = self
            .over_since
            .values()
            .map(|since| *since + settings.grace);
        let unaccounted = self
            .unaccounted_since
            .values()
            .map(|since| (*since + UNACCOUNTED_FOR).min(now + SUSPECT_INTERVAL));
        over.chain(unaccounted).min()
    }

    /// The registered processes on `card` holding unaccounted bytes (module doc).
    fn judge_processes(
        &mut self,
        view: &NodeView,
        card: &Card,
        now: Instant,
        still: &mut HashSet<(u32, String)>,
        actions: &mut Vec<Action>,
    ) {
        for &(pid, bytes) in &card.processes {
            let Some(&slice) = view.owner.get(&pid) else {
                continue;
            };
            // Only where the slice is limited (on a card it does not cap it charges nothing)
            // and for a registered process whose ledger can be read.
            if view.cap(slice, &card.uuid).is_none() || view.is_broken(pid) {
                continue;
            }
            let Some(ledger) = view.ledger_bytes(pid, card) else {
                continue;
            };
            let driver = bytes.unwrap_or(0);
            if driver <= ledger.saturating_add(UNPRICED_BOUND_BYTES) {
                continue;
            }
            let clock = (pid, card.uuid.clone());
            still.insert(clock.clone());
            let since = self.unaccounted_since.entry(clock).or_insert(now);
            if now.duration_since(*since) < UNACCOUNTED_FOR {
                continue;
            }
            // One event per UNACCOUNTED_FOR while it lasts.
            *since = now;
            actions.push(Action::Unaccounted {
                key: key(view, slice, card),
                pid,
                driver_bytes: driver,
                ledger_bytes: ledger,
            });
        }
    }

    /// `slice` on `card` against its cap (module doc).
    #[allow(clippy::too_many_arguments)]
    fn judge_cap(
        &mut self,
        view: &NodeView,
        settings: &Settings,
        slice: usize,
        card: &Card,
        now: Instant,
        start_time: &dyn Fn(u32) -> Option<u64>,
        still: &mut HashSet<Key>,
    ) -> Option<Action> {
        let (limit, source) = view.cap(slice, &card.uuid)?;
        let (bytes, _) = view.driver_usage(slice, card);
        if bytes <= limit.saturating_add(settings.tolerance_bytes) {
            return None;
        }
        let key = key(view, slice, card);
        still.insert(key.clone());
        let since = self.over_since.entry(key.clone()).or_insert(now);
        if now.duration_since(*since) < settings.grace {
            return None;
        }
        // One event per grace period while it stays over.
        *since = now;
        let members = view.members(slice, card);
        let newest = |pid: u32| start_time(pid).unwrap_or(0);
        let blamed = members
            .iter()
            .filter(|m| blameable(m, settings))
            .map(|m| (m.unaccounted(), newest(m.pid), m.pid))
            .max();
        let (victim, accounted) = match blamed {
            Some((_, _, pid)) => (Some(pid), false),
            None => (
                members
                    .iter()
                    .map(|m| (m.driver, newest(m.pid), m.pid))
                    .max()
                    .map(|(_, _, pid)| pid),
                true,
            ),
        };
        Some(Action::OverCap {
            key,
            driver_bytes: bytes,
            limit,
            source,
            victim,
            accounted,
        })
    }

    /// Processes of no slice on `card` when it is marked slices-only (module doc).
    fn judge_strangers(
        &mut self,
        view: &NodeView,
        settings: &Settings,
        card: &Card,
        now: Instant,
        still: &mut HashSet<Key>,
        actions: &mut Vec<Action>,
    ) {
        let marked = settings
            .slices_only
            .iter()
            .any(|d| *d == card.uuid || *d == card.index.to_string());
        // Without the host's PIDs every process looks like no slice's.
        if !marked || !view.host_view {
            return;
        }
        for (pid, bytes) in view.unsliced(card) {
            let bytes = bytes.unwrap_or(0);
            if bytes <= settings.tolerance_bytes || view.unknowable.contains(&pid) {
                continue;
            }
            // Keyed by PID in the slice label's place, so each stranger has its own clock.
            let clock = (
                format!("pid:{pid}"),
                card.uuid.clone(),
                card.index.to_string(),
            );
            still.insert(clock.clone());
            let since = self.over_since.entry(clock).or_insert(now);
            if now.duration_since(*since) < settings.grace {
                continue;
            }
            *since = now;
            actions.push(Action::Unsliced {
                key: (String::new(), card.uuid.clone(), card.index.to_string()),
                pid,
                bytes,
            });
        }
    }
}

fn key(view: &NodeView, slice: usize, card: &Card) -> Key {
    (
        view.slices[slice].found.name.clone(),
        card.uuid.clone(),
        card.index.to_string(),
    )
}

/// Whether the ledger fails to account for `member` by more than may be: beyond its entry
/// plus the bound (registered), beyond the tolerance (unregistered). A process of a broken
/// region never is (its ledger is unreadable, not bypassed).
pub fn blameable(member: &Member, settings: &Settings) -> bool {
    match member.ledger {
        Ledger::Entry(_) => member.unaccounted() > 0,
        Ledger::Unregistered => member.driver > settings.tolerance_bytes,
        Ledger::Unreadable => false,
    }
}

/// Carries out the actions: log lines, counters, and with `enforce` the SIGKILLs (each
/// process once, when two rules name it in one pass).
pub fn act(actions: &[Action], settings: &Settings, counters: &mut Counters) {
    let mut ended = HashSet::new();
    for action in actions {
        let (key, mut line, victim) = match action {
            Action::Unaccounted {
                key,
                pid,
                driver_bytes,
                ledger_bytes,
            } => {
                *counters.unaccounted.entry(key.clone()).or_default() += 1;
                let (slice, uuid, index) = key;
                let line = format!(
                    "backstop: slice {slice}: process {pid} has held {driver_bytes} bytes on device {index} ({uuid}) for {} s, {} more than its ledger entry of {ledger_bytes} bytes, beyond the {UNPRICED_BOUND_BYTES}-byte bound on memory the driver places by itself: bytes that bypass the shim",
                    UNACCOUNTED_FOR.as_secs(),
                    driver_bytes - ledger_bytes
                );
                (key, line, Some(*pid))
            }
            Action::OverCap {
                key,
                driver_bytes,
                limit,
                source,
                victim,
                accounted,
            } => {
                *counters.over_cap.entry(key.clone()).or_default() += 1;
                if *accounted {
                    *counters.accounted.entry(key.clone()).or_default() += 1;
                }
                let (slice, uuid, index) = key;
                let from = match source {
                    CapSource::LimitFile => "its limit file's",
                    CapSource::Region => "as bound in its region (no limit file found)",
                };
                let mut line = format!(
                    "backstop: slice {slice} holds {driver_bytes} bytes on device {index} ({uuid}) by the driver's count, over its cap of {limit} bytes ({from})"
                );
                match (victim, accounted) {
                    (Some(pid), false) => line.push_str(&format!(
                        "; process {pid} holds the most bytes the slice's ledger does not account for"
                    )),
                    (Some(pid), true) => line.push_str(&format!(
                        "; its ledger accounts for every byte, so it holds more than its cap allows (a process of the slice wrote its region, or memory the driver placed was charged past the cap); process {pid} holds the most"
                    )),
                    (None, _) => {}
                }
                (key, line, *victim)
            }
            Action::Unsliced { key, pid, bytes } => {
                *counters.over_cap.entry(key.clone()).or_default() += 1;
                let (_, uuid, index) = key;
                let line = format!(
                    "backstop: process {pid} belongs to no slice and holds {bytes} bytes on slices-only device {index} ({uuid})"
                );
                (key, line, Some(*pid))
            }
        };
        match (settings.enforce, victim) {
            (true, Some(pid)) if !ended.insert(pid) => {
                line.push_str(&format!("; process {pid} was ended in this pass"));
            }
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
    use crate::discovery::FoundSlice;

    const MIB: u64 = 1 << 20;
    const UUID: &str = "GPU-12345678-1234-1234-1234-123456789abc";
    const GIB: u64 = 1 << 30;

    /// Slice "a" (its limit file caps GPU-1 at `cap`; its region's word says `region_limit`)
    /// with processes 10 and 11 registered, holding `ledger` in its ledger, and `processes`
    /// on the card.
    fn node(
        cap: u64,
        region_limit: u64,
        ledger: &[(u32, u64)],
        processes: Vec<(u32, Option<u64>)>,
    ) -> NodeView {
        let config = gpuslice_common::config::parse_limit_file(
            std::path::Path::new("a.json"),
            &format!(
                r#"{{"version": 1, "region": "/r/a.region", "devices": [{{"uuid": "{UUID}", "memory": {cap}}}]}}"#
            ),
        )
        .unwrap();
        let found = FoundSlice {
            config: Some(config),
            ..FoundSlice::named("a")
        };
        let slice = fixtures::slice(
            found,
            Some(one_device_region(UUID, region_limit, Vec::new())),
        );
        let card = Card {
            index: 0,
            uuid: UUID.into(),
            total: 32 * GIB,
            used: 0,
            free: 0,
            utilization: None,
            processes,
        };
        let mut view = NodeView {
            owner: [(10, 0), (11, 0), (12, 0)].into_iter().collect(),
            ..fixtures::view(vec![slice], Ok(vec![card]))
        };
        for &(pid, bytes) in ledger {
            let mut used = [0; gpuslice_common::region::MAX_DEVICES];
            used[0] = bytes;
            view.ledger.insert(pid, (0, used));
        }
        view
    }

    fn settings(grace: f64, enforce: bool) -> Settings {
        Settings {
            tolerance_bytes: 64 * MIB,
            grace: Duration::from_secs_f64(grace),
            enforce,
            slices_only: Vec::new(),
        }
    }

    /// The watch loop's timing over `view` for `span` from `t0`: a pass every `interval`, or
    /// earlier when the backstop asks (`wake_by`). The actions, with when they came.
    fn watch(
        backstop: &mut Backstop,
        view: &NodeView,
        settings: &Settings,
        interval: Duration,
        t0: Instant,
        span: Duration,
    ) -> Vec<(Duration, Action)> {
        let mut out = Vec::new();
        let mut now = t0;
        while now <= t0 + span {
            for action in backstop.judge(view, settings, now, &|pid| Some(u64::from(pid))) {
                out.push((now - t0, action));
            }
            let next = now + interval;
            now = backstop
                .wake_by(settings, now)
                .map_or(next, |due| due.min(next));
        }
        out
    }

    #[test]
    fn a_registered_surplus_is_ended_after_three_seconds_whatever_interval_and_grace() {
        // 10 holds 2 GiB beyond its 100 MiB ledger entry; the slice's 4 GiB cap is not
        // passed (only the surplus can end it) or it is (1 GiB cap: both rules run).
        for cap in [4 * GIB, GIB] {
            let view = node(
                cap,
                cap,
                &[(10, 100 * MIB)],
                vec![(10, Some(2 * GIB + 100 * MIB))],
            );
            for (interval, grace) in [(1.0, 5.0), (0.7, 2.3), (2.5, 0.5), (5.0, 5.0), (0.05, 30.0)]
            {
                let mut backstop = Backstop::default();
                let t0 = Instant::now();
                let actions = watch(
                    &mut backstop,
                    &view,
                    &settings(grace, true),
                    Duration::from_secs_f64(interval),
                    t0,
                    Duration::from_secs(10),
                );
                let first = actions
                    .iter()
                    .find(|(_, a)| matches!(a, Action::Unaccounted { pid: 10, .. }))
                    .unwrap_or_else(|| panic!("never ended: {interval}/{grace}: {actions:?}"));
                assert_eq!(first.0, UNACCOUNTED_FOR, "{interval}/{grace}: {actions:?}");
                let early_over_cap = actions
                    .iter()
                    .any(|(at, a)| matches!(a, Action::OverCap { .. }) && *at < first.0);
                assert_eq!(
                    early_over_cap,
                    cap == GIB && grace < 3.0,
                    "{interval}/{grace}"
                );
            }
        }
    }

    #[test]
    fn a_surplus_that_comes_and_goes_is_timed_from_each_appearance() {
        let with = node(
            4 * GIB,
            4 * GIB,
            &[(10, 100 * MIB)],
            vec![(10, Some(2 * GIB))],
        );
        let without = node(
            4 * GIB,
            4 * GIB,
            &[(10, 100 * MIB)],
            vec![(10, Some(100 * MIB))],
        );
        let s = settings(5.0, true);
        let mut backstop = Backstop::default();
        let t0 = Instant::now();
        let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
        assert!(backstop.judge(&with, &s, at(0.0), &|_| None).is_empty());
        assert_eq!(
            backstop.wake_by(&s, at(0.0)),
            Some(at(0.5)),
            "looked at again soon"
        );
        assert!(backstop.judge(&with, &s, at(2.0), &|_| None).is_empty());
        // Gone on one look: forgotten.
        assert!(backstop.judge(&without, &s, at(2.5), &|_| None).is_empty());
        assert_eq!(backstop.wake_by(&s, at(2.5)), None);
        assert!(backstop.judge(&with, &s, at(3.5), &|_| None).is_empty());
        assert!(backstop.judge(&with, &s, at(6.4), &|_| None).is_empty());
        assert_eq!(backstop.judge(&with, &s, at(6.5), &|_| None).len(), 1);
        // Report only: again after another UNACCOUNTED_FOR while it lasts.
        assert!(backstop.judge(&with, &s, at(9.4), &|_| None).is_empty());
        assert_eq!(backstop.judge(&with, &s, at(9.5), &|_| None).len(), 1);
    }

    #[test]
    fn bytes_the_ledger_accounts_for_within_the_cap_are_never_ended() {
        // 10 holds exactly its ledger entry, 11 its entry plus the bound (the shim's model
        // error), 12 is an unregistered process within the tolerance: all under the cap.
        let view = node(
            2 * GIB,
            2 * GIB,
            &[(10, GIB), (11, 500 * MIB)],
            vec![
                (10, Some(GIB)),
                (11, Some(500 * MIB + UNPRICED_BOUND_BYTES)),
                (12, Some(64 * MIB)),
            ],
        );
        for (interval, grace) in [(1.0, 5.0), (0.05, 0.0)] {
            let mut backstop = Backstop::default();
            let actions = watch(
                &mut backstop,
                &view,
                &settings(grace, true),
                Duration::from_secs_f64(interval),
                Instant::now(),
                Duration::from_secs(60),
            );
            assert!(actions.is_empty(), "{actions:?}");
        }
    }

    #[test]
    fn over_the_limit_files_cap_a_process_is_ended_even_when_the_ledger_accounts_for_it() {
        // A process of the slice wrote the region's limit word (1 GiB -> 8 GiB): the shims
        // let the slice take 3 GiB, every byte in the ledger. The file's 1 GiB is the cap.
        let view = node(
            GIB,
            8 * GIB,
            &[(10, 2 * GIB), (11, GIB)],
            vec![(10, Some(2 * GIB)), (11, Some(GIB))],
        );
        assert_eq!(view.cap(0, UUID), Some((GIB, CapSource::LimitFile)));
        let s = settings(1.0, true);
        let mut backstop = Backstop::default();
        let t0 = Instant::now();
        assert!(backstop.judge(&view, &s, t0, &|_| None).is_empty());
        let actions = backstop.judge(&view, &s, t0 + s.grace, &|pid| Some(pid.into()));
        assert_eq!(
            actions,
            [Action::OverCap {
                key: ("a".into(), UUID.into(), "0".into()),
                driver_bytes: 3 * GIB,
                limit: GIB,
                source: CapSource::LimitFile,
                victim: Some(10),
                accounted: true,
            }],
            "the process holding the most"
        );
        let mut counters = Counters::default();
        act(&actions[..0], &s, &mut counters);
        let report = Settings {
            enforce: false,
            ..s.clone()
        };
        act(&actions, &report, &mut counters);
        assert_eq!(counters.over_cap.values().sum::<u64>(), 1);
        assert_eq!(counters.accounted.values().sum::<u64>(), 1);
        assert!(counters.kills.is_empty(), "report only");
    }

    #[test]
    fn the_excess_is_blamed_on_bytes_the_ledger_does_not_account_for() {
        let s = settings(1.0, true);
        // 10 is registered and accounted for; 11, newer and registered, holds 200 MiB more
        // than its entry; 12 bypasses (in the slice's container, not registered). 1 GiB cap.
        let node_with_12 = node(
            GIB,
            GIB,
            &[(10, 900 * MIB), (11, 100 * MIB)],
            vec![
                (10, Some(900 * MIB)),
                (11, Some(300 * MIB)),
                (12, Some(250 * MIB)),
            ],
        );
        let starts = |pid: u32| Some(u64::from(pid) * 100);
        let mut backstop = Backstop::default();
        let t0 = Instant::now();
        assert!(backstop.judge(&node_with_12, &s, t0, &starts).is_empty());
        let victim = |actions: Vec<Action>| {
            actions
                .into_iter()
                .find_map(|a| match a {
                    Action::OverCap {
                        victim, accounted, ..
                    } => Some((victim, accounted)),
                    _ => None,
                })
                .expect("an over-cap event")
        };
        assert_eq!(
            victim(backstop.judge(&node_with_12, &s, t0 + s.grace, &starts)),
            (Some(12), false),
            "the bypasser, not the newest nor the largest"
        );
        // A holder of a replaced region (its ledger unreadable) is never blamed as a
        // bypasser, but the slice is still judged against its cap.
        let mut broken = node_with_12.clone();
        broken.broken.push((0, 12, "/r (deleted)".into()));
        let mut careful = Backstop::default();
        assert!(careful.judge(&broken, &s, t0, &starts).is_empty());
        assert_eq!(
            victim(careful.judge(&broken, &s, t0 + s.grace, &starts)),
            (Some(11), false),
            "11 holds more than its entry plus the bound"
        );
    }

    #[test]
    fn over_the_cap_past_tolerance_and_grace_names_an_unaccounted_member() {
        let s = settings(2.0, true);
        let starts = |pid: u32| Some(u64::from(pid) * 100);
        let mut backstop = Backstop::default();
        let t0 = Instant::now();
        // Within the tolerance: nothing, ever.
        let within = node(
            GIB,
            GIB,
            &[(10, 1000 * MIB)],
            vec![(10, Some(1000 * MIB)), (11, Some(30 * MIB))],
        );
        assert!(backstop.judge(&within, &s, t0, &starts).is_empty());
        // Over (and a stranger, 13, that belongs to no slice is not counted or chosen); 10
        // is in the ledger, 11 is not.
        let over = node(
            GIB,
            GIB,
            &[(10, 1000 * MIB)],
            vec![
                (10, Some(1000 * MIB)),
                (11, Some(100 * MIB)),
                (13, Some(4000 * MIB)),
            ],
        );
        assert!(backstop.judge(&over, &s, t0, &starts).is_empty());
        let t1 = t0 + Duration::from_secs(1);
        assert!(backstop.judge(&over, &s, t1, &starts).is_empty(), "grace");
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(
            backstop.judge(&over, &s, t2, &starts),
            [Action::OverCap {
                key: ("a".into(), UUID.into(), "0".into()),
                driver_bytes: 1100 * MIB,
                limit: GIB,
                source: CapSource::LimitFile,
                victim: Some(11),
                accounted: false,
            }]
        );
        // The next event only after another grace period.
        assert!(backstop
            .judge(&over, &s, t2 + Duration::from_secs(1), &starts)
            .is_empty());
        // Back under: forgotten, so a new overshoot waits a full grace again.
        assert!(backstop
            .judge(&within, &s, t2 + Duration::from_secs(3), &starts)
            .is_empty());
        assert!(backstop
            .judge(&over, &s, t2 + Duration::from_secs(4), &starts)
            .is_empty());
    }

    #[test]
    fn report_only_counts_without_killing() {
        let s = settings(0.0, false);
        let mut backstop = Backstop::default();
        let over = node(GIB, GIB, &[], vec![(11, Some(2000 * MIB))]);
        let actions = backstop.judge(&over, &s, Instant::now(), &|_| Some(1));
        assert_eq!(actions.len(), 1);
        let mut counters = Counters::default();
        act(&actions, &s, &mut counters);
        assert_eq!(counters.over_cap.values().sum::<u64>(), 1);
        assert!(counters.kills.is_empty());
    }

    #[test]
    fn strangers_on_a_slices_only_device_are_events_there_only() {
        let mut s = settings(1.0, true);
        s.tolerance_bytes = 16 * MIB;
        // 10 is the slice's; 13 holds 400 MiB and belongs to no slice; 14 holds less than
        // the tolerance.
        let node = node(
            GIB,
            GIB,
            &[(10, 100 * MIB)],
            vec![
                (10, Some(100 * MIB)),
                (13, Some(400 * MIB)),
                (14, Some(MIB)),
            ],
        );
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut backstop = Backstop::default();
        assert!(backstop.judge(&node, &s, t0, &|_| Some(1)).is_empty());
        assert!(
            backstop.judge(&node, &s, later, &|_| Some(1)).is_empty(),
            "not marked"
        );
        s.slices_only = vec!["0".into()];
        // Without the host's PIDs, or for a process a slot names that the agent may not
        // examine, "no slice" is not a safe judgment.
        for unsure in [
            NodeView {
                host_view: false,
                ..node.clone()
            },
            NodeView {
                unknowable: [13].into_iter().collect(),
                ..node.clone()
            },
        ] {
            let mut careful = Backstop::default();
            assert!(careful.judge(&unsure, &s, t0, &|_| Some(1)).is_empty());
            assert!(careful.judge(&unsure, &s, later, &|_| Some(1)).is_empty());
        }
        for mark in ["0", UUID] {
            s.slices_only = vec![mark.into()];
            let mut backstop = Backstop::default();
            assert!(
                backstop.judge(&node, &s, t0, &|_| Some(1)).is_empty(),
                "grace"
            );
            assert_eq!(
                backstop.judge(&node, &s, later, &|_| Some(1)),
                [Action::Unsliced {
                    key: (String::new(), UUID.into(), "0".into()),
                    pid: 13,
                    bytes: 400 * MIB,
                }]
            );
        }
    }
}
