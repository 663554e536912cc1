//! The start-up estimate from the slice's own launch timing: an upper bound on
//! the per-launch GPU time, known after a few launches, long before NVML's first sample.
//!
//! Until the cost is learned, every launch is debited at the 1 ms guess, so the process
//! waits for the bucket at almost every launch. Each such wait (the cold path, never the
//! common launch) asks the driver whether the launch's stream is idle (`cuStreamQuery`).
//! When it is, every launch the process issued since its first wait has completed, and all
//! of them ran within the wall time since then, less the sleeps that began with the stream
//! idle (nothing of the process's was queued, and the only launching thread slept):
//!
//! ```text
//! upper = (now - first wait - idle sleeps) / launches issued        GPU-ns per launch
//! lower = (time waits saw the stream busy) / launches issued
//! ```
//!
//! (each sum decayed by [`DECAY`] at every bound, so recent launches weigh most; the busy
//! time also counts the probe's thread's own waits in `cuStreamSynchronize`,
//! `cuCtxSynchronize` and `cuEventSynchronize`, [`Probe::synced`]). A wait
//! that finds the stream busy sleeps towards its due time in growing steps, asking again
//! after each (the shim's `throttle::probe_poll`), so the busy time of longer kernels is seen too.
//!
//! The GPU time of those launches cannot exceed the upper bound (the kernels ran within that
//! time), so it errs the safe way: time spent behind a neighbour's kernels, or on the CPU
//! between launches, makes it larger, never smaller. The lower one is time the GPU worked
//! on launches already issued: alone on the device at most their GPU time, behind a
//! neighbour's kernels more (again towards the cap). Launches are debited at the
//! controller's guess held within the bounds ([`estimate_within`],
//! [`super::controller::Controller::debit_cost`]): a guess too large for short kernels comes
//! down to the upper bound, one too small for long kernels goes up to the lower one. Once
//! NVML has measured the cost (the `COST` word's learned bit), the probe stops: NVML is the
//! authority, and its first measurement re-bills the launches made at the estimate.
//!
//! The bound holds for one launching thread on one stream. A wait from another thread or on
//! another stream switches the probe off for the process (today's path: the guess, lowered
//! as NVML shows no trace), because the query says nothing about another stream's work.
//! What it cannot see: launches of other threads or on other streams between two waits of
//! the same thread and stream (the shared credit makes some thread wait within a few
//! launches at the guess, so a second launcher is usually caught at once).
//! A launcher that is CPU-bound (kernels shorter than the time between launches) is bounded
//! by that time: its estimate is the launch interval until NVML reports.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// No bound yet.
pub const NONE: u64 = u64::MAX;
/// Weight a bound keeps at each later one: each bound holds for the launches it covers, so
/// any weighting of them is still a bound on the weighted mean; recent ones weigh most (a
/// phase of longer kernels shows within a few waits, and one stall of the launching thread,
/// which counts as active time, is forgotten within a few dozen).
pub const DECAY: f64 = 0.5;

/// Pure: the debit while the cost is not learned: the guess, within the bounds.
pub fn estimate_within(guess: u64, lower: u64, upper: u64) -> u64 {
    guess.min(upper).max(lower).max(1)
}

/// One process's probe on one device (process-local; its atomics are touched only by waits).
#[derive(Debug)]
pub struct Probe {
    /// CLOCK_MONOTONIC ns of the first wait (0 = not yet).
    start_ns: AtomicU64,
    /// The process's launch count at the first wait (that launch included).
    start_launches: AtomicU64,
    /// Wall ns of sleeps that began with the stream idle and saw no other launch.
    idle_ns: AtomicU64,
    /// The stream and thread of the waits (a thread-local's address).
    stream: AtomicU64,
    thread: AtomicU64,
    off: AtomicBool,
    /// At the last bound: non-idle wall ns since the first wait, and launches issued.
    last_active_ns: AtomicU64,
    last_issued: AtomicU64,
    /// Decayed sums (f64 bits) over the bounds so far: non-idle wall ns, wall ns the stream
    /// was seen busy, launches issued.
    sum_active: AtomicU64,
    sum_busy: AtomicU64,
    sum_launches: AtomicU64,
    /// Wall ns the probe's thread waited in synchronisations since the last bounds.
    synced_ns: AtomicU64,
    /// The latest bounds, GPU-ns per launch ([`NONE`]: none; lower 0: none).
    upper: AtomicU64,
    lower: AtomicU64,
}

impl Default for Probe {
    fn default() -> Self {
        Probe::new()
    }
}

/// How long after its first wait the probe may poll a busy stream during a wait's sleep (a
/// few wake-ups per wait): NVML's first figure comes within a slowest sample period (1 s)
/// and its delay; without one, the waits' own queries and the synchronisations go on.
pub const POLL_FOR_NS: u64 = 2_000_000_000;

/// What one idle stream taught: the bounds, and the launches issued since the last ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub lower: u64,
    pub upper: u64,
    pub launches: u64,
}

/// A wait the probe takes part in (see [`Probe::begin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeWait {
    /// The process's launch count at the wait (the waiting launch included).
    pub launches: u64,
    /// Other launches of the process asleep on the bucket then (counted, not issued).
    pub asleep: u64,
    /// The process's first wait: nothing was issued through the throttle before it.
    pub first: bool,
}

impl Probe {
    pub const fn new() -> Probe {
        Probe {
            start_ns: AtomicU64::new(0),
            start_launches: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            stream: AtomicU64::new(0),
            thread: AtomicU64::new(0),
            off: AtomicBool::new(false),
            last_active_ns: AtomicU64::new(0),
            last_issued: AtomicU64::new(0),
            sum_active: AtomicU64::new(0),
            sum_busy: AtomicU64::new(0),
            sum_launches: AtomicU64::new(0),
            synced_ns: AtomicU64::new(0),
            upper: AtomicU64::new(NONE),
            lower: AtomicU64::new(0),
        }
    }

    /// The latest (lower, upper) bounds; `None` when there are none or the probe is off.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let upper = self.upper.load(Ordering::Relaxed);
        (!self.off.load(Ordering::Relaxed) && upper != NONE)
            .then(|| (self.lower.load(Ordering::Relaxed).min(upper), upper))
    }

    /// The debit for a `guess` of the controller's: the guess within the bounds.
    pub fn estimate(&self, guess: u64) -> u64 {
        self.bounds()
            .map_or(guess, |(lower, upper)| estimate_within(guess, lower, upper))
    }

    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::Relaxed)
    }

    /// Whether a wait at `now` may poll a busy stream ([`POLL_FOR_NS`]).
    pub fn polling(&self, now: u64) -> bool {
        let start = self.start_ns.load(Ordering::Relaxed);
        start != 0 && now.saturating_sub(start) < POLL_FOR_NS
    }

    /// A wait begins at `now` on `stream` from `thread`, with `launches` counted so far and
    /// `asleep` other launches asleep; `None` = the probe does not take part (off, or it just
    /// switched off: another stream or thread).
    pub fn begin(
        &self,
        now: u64,
        stream: u64,
        thread: u64,
        launches: u64,
        asleep: u64,
    ) -> Option<ProbeWait> {
        if self.off.load(Ordering::Relaxed) {
            return None;
        }
        let wait = ProbeWait {
            launches,
            asleep,
            first: false,
        };
        if self.start_ns.load(Ordering::Relaxed) == 0 {
            if asleep > 0 {
                // Another thread's first wait is under way.
                return None;
            }
            self.stream.store(stream, Ordering::Relaxed);
            self.thread.store(thread, Ordering::Relaxed);
            self.start_launches.store(launches, Ordering::Relaxed);
            self.start_ns.store(now.max(1), Ordering::Relaxed);
            return Some(ProbeWait {
                first: true,
                ..wait
            });
        }
        if self.stream.load(Ordering::Relaxed) != stream
            || self.thread.load(Ordering::Relaxed) != thread
        {
            // The query no longer covers everything that was issued.
            self.off.store(true, Ordering::Relaxed);
            return None;
        }
        Some(wait)
    }

    /// The stream was found idle at `t` during `wait`, after it was seen busy for `busy_ns`
    /// since the wait began (0: idle at once): every launch issued before the wait completed
    /// by `t`. Returns the new (lower, upper) bounds (none at the first wait) and how many
    /// launches were issued since the previous ones (debited at the estimate before).
    pub fn idle_at(&self, wait: &ProbeWait, t: u64, busy_ns: u64) -> Option<Bounds> {
        if wait.first || self.off.load(Ordering::Relaxed) {
            return None;
        }
        // Issued since the first wait: that one and every later launch counted, less the
        // waiting one (not issued yet) and those asleep.
        let issued = wait
            .launches
            .saturating_sub(self.start_launches.load(Ordering::Relaxed))
            .saturating_sub(wait.asleep);
        let elapsed = t.saturating_sub(self.start_ns.load(Ordering::Relaxed));
        let active = elapsed.saturating_sub(self.idle_ns.load(Ordering::Relaxed));
        // Since the last bound: the launches issued after it ran within the active time
        // after it (the stream was idle then, so everything issued before had completed).
        let new_launches = issued.saturating_sub(self.last_issued.swap(issued, Ordering::Relaxed));
        let new_active = active.saturating_sub(self.last_active_ns.swap(active, Ordering::Relaxed));
        if new_launches == 0 {
            // Nothing issued since the stream was last seen idle: that time was idle.
            return None;
        }
        let decayed = |sum: &AtomicU64, add: f64| {
            let value = f64::from_bits(sum.load(Ordering::Relaxed)) * DECAY + add;
            sum.store(value.to_bits(), Ordering::Relaxed);
            value
        };
        let launches = decayed(&self.sum_launches, new_launches as f64);
        let active = decayed(&self.sum_active, new_active as f64);
        // Time the stream was seen busy with launches already issued: alone on the device,
        // at most their GPU time; behind a neighbour's kernels more (towards the cap).
        let synced = self.synced_ns.swap(0, Ordering::Relaxed);
        let busy = decayed(&self.sum_busy, busy_ns.saturating_add(synced) as f64);
        let upper = ((active / launches).round() as u64).max(1);
        let lower = ((busy / launches).round() as u64).min(upper);
        self.upper.store(upper, Ordering::Relaxed);
        self.lower.store(lower, Ordering::Relaxed);
        Some(Bounds {
            lower,
            upper,
            launches: new_launches,
        })
    }

    /// The probe's thread (`thread`) waited `ns` in a synchronisation: the GPU worked on
    /// what was issued (alone on the device, at most its GPU time), so it counts towards the
    /// lower bound at the next bounds. Another thread's wait is not counted (it may overlap
    /// the probe's own view of the stream).
    pub fn synced(&self, thread: u64, ns: u64) {
        if !self.off.load(Ordering::Relaxed)
            && self.start_ns.load(Ordering::Relaxed) != 0
            && self.thread.load(Ordering::Relaxed) == thread
        {
            self.synced_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// `idle_ns` of `wait`'s sleep passed with the stream idle; they count as idle time when
    /// no other launch was asleep at the wait and none was counted since (`launches` now).
    pub fn slept_idle(&self, wait: &ProbeWait, idle_ns: u64, launches: u64) {
        if wait.asleep == 0 && launches == wait.launches && !self.off.load(Ordering::Relaxed) {
            self.idle_ns.fetch_add(idle_ns, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    /// One thread, one stream, 10 us of GPU time per launch issued 1 ms of sleep apart: the
    /// bound follows the launches' own time, not the sleeps.
    #[test]
    fn sleeps_with_an_idle_stream_do_not_count_and_busy_ones_do() {
        let probe = Probe::new();
        let mut now = 1_000 * MS;
        let mut launches = 1;
        let mut wait = probe.begin(now, 7, 1, launches, 0).unwrap();
        assert!(wait.first);
        assert_eq!(probe.idle_at(&wait, now, 0), None, "nothing issued yet");
        for _ in 0..10 {
            // Sleep 1 ms with the stream idle, then issue one 10 us launch; the next waits.
            now += MS;
            probe.slept_idle(&wait, MS, launches);
            now += 10 * US;
            launches += 1;
            wait = probe.begin(now, 7, 1, launches, 0).unwrap();
            assert_eq!(
                probe.idle_at(&wait, now, 0).map(|b| (b.lower, b.upper)),
                Some((0, 10 * US))
            );
        }
        assert_eq!(probe.bounds(), Some((0, 10 * US)));
        assert_eq!(probe.estimate(1_000 * US), 10 * US, "the guess comes down");
        // A launch of 200 us: the next wait sees the stream busy for 190 us of its 1 ms
        // sleep; only the rest is idle. Both bounds go up, the lower one to what was seen.
        launches += 1;
        now += 10 * US;
        wait = probe.begin(now, 7, 1, launches, 0).unwrap();
        now += 195 * US;
        let Bounds { lower, upper, .. } = probe.idle_at(&wait, now, 190 * US).unwrap();
        assert!(
            lower > 0 && lower < upper && upper > 10 * US,
            "{lower} {upper}"
        );
        probe.slept_idle(&wait, 805 * US, launches);
        // Short launches again: the bounds come back down.
        for _ in 0..40 {
            now += 10 * US;
            launches += 1;
            wait = probe.begin(now, 7, 1, launches, 0).unwrap();
            probe.idle_at(&wait, now, 0).unwrap();
            now += MS;
            probe.slept_idle(&wait, MS, launches);
        }
        let (lower, upper) = probe.bounds().unwrap();
        assert!(lower < US && upper < 11 * US, "{lower} {upper}");
    }

    /// 10 ms kernels: each wait sees the stream busy with the last one; the time it stays
    /// busy raises the debit above a guess that is too small, never above the upper bound.
    #[test]
    fn long_kernels_seen_busy_raise_the_estimate_within_the_bounds() {
        assert_eq!(estimate_within(1_000, 9_000, 12_000), 9_000);
        assert_eq!(estimate_within(1_000_000, 9_000, 12_000), 12_000);
        assert_eq!(estimate_within(10_000, 9_000, 12_000), 10_000);
        let probe = Probe::new();
        let wait = probe.begin(MS, 7, 1, 1, 0).unwrap();
        probe.slept_idle(&wait, 0, 1);
        // One 10 ms kernel issued at 1 ms; the next launch waits at 1.01 ms, sees the stream
        // busy until 10.9 ms, idle at 11.2 ms.
        let wait = probe.begin(MS + 10 * US, 7, 1, 2, 0).unwrap();
        let Bounds {
            lower,
            upper,
            launches,
        } = probe.idle_at(&wait, 11_200 * US, 9_890 * US).unwrap();
        assert_eq!(launches, 1);
        assert_eq!((lower, upper), (9_890 * US, 10_200 * US));
        assert_eq!(probe.estimate(MS), lower, "the 1 ms guess is raised");
    }

    /// A client that synchronises after each batch: the waits find the stream idle, the
    /// synchronisation's own wait is the busy time.
    #[test]
    fn time_waited_in_synchronisations_raises_the_lower_bound() {
        let probe = Probe::new();
        probe.synced(1, 5 * MS);
        assert!(probe.begin(MS, 7, 1, 1, 0).unwrap().first);
        // Four 10 ms kernels issued in 40 us, then 40 ms in cuStreamSynchronize.
        probe.synced(2, 40 * MS);
        probe.synced(1, 40 * MS);
        let wait = probe.begin(41 * MS + 40 * US, 7, 1, 5, 0).unwrap();
        let Bounds { lower, upper, .. } = probe.idle_at(&wait, 41 * MS + 50 * US, 0).unwrap();
        assert_eq!(
            lower,
            10 * MS,
            "only this thread's wait, since the first one"
        );
        assert_eq!(upper, 40 * MS / 4 + 50 * US / 4);
        assert_eq!(probe.estimate(MS), 10 * MS);
    }

    #[test]
    fn another_stream_or_thread_switches_the_probe_off() {
        let probe = Probe::new();
        probe.begin(MS, 7, 1, 1, 0).unwrap();
        let wait = probe.begin(2 * MS, 7, 1, 3, 0).unwrap();
        assert!(probe.idle_at(&wait, 2 * MS, 0).is_some());
        assert_eq!(probe.begin(3 * MS, 8, 1, 5, 0), None);
        assert!(probe.is_off());
        assert_eq!(probe.bounds(), None, "off: no bound is used");
        assert_eq!(probe.estimate(7), 7);
        assert_eq!(probe.idle_at(&wait, 4 * MS, 0), None);
        let probe = Probe::new();
        probe.begin(MS, 7, 1, 1, 0).unwrap();
        assert_eq!(probe.begin(2 * MS, 7, 2, 3, 0), None);
        assert!(probe.is_off(), "a second launching thread");
    }

    #[test]
    fn polling_is_for_the_first_two_seconds_only() {
        let probe = Probe::new();
        assert!(!probe.polling(MS), "not started");
        probe.begin(MS, 7, 1, 1, 0).unwrap();
        assert!(probe.polling(MS + POLL_FOR_NS - 1));
        assert!(!probe.polling(MS + POLL_FOR_NS));
    }

    #[test]
    fn a_sleep_during_which_something_else_launched_is_not_idle() {
        let probe = Probe::new();
        let wait = probe.begin(MS, 7, 1, 1, 0).unwrap();
        probe.slept_idle(&wait, 5 * MS, 2);
        let wait = probe.begin(6 * MS, 7, 1, 2, 1).unwrap();
        probe.slept_idle(&wait, 5 * MS, 2);
        // Launches asleep on the bucket were counted but not issued.
        let wait = probe.begin(11 * MS, 7, 1, 4, 1).unwrap();
        assert_eq!(
            probe.idle_at(&wait, 11 * MS, 0),
            Some(Bounds {
                lower: 0,
                upper: 5 * MS,
                launches: 2
            }),
            "neither sleep counted as idle; two launches issued"
        );
    }
}
