//! How NVML's utilisation figures are sampled from the timeline: the clock of the sample
//! timestamps, and the two sampling modes.
//!
//! * Clock: `nvmlDeviceGetProcessUtilization`'s `timeStamp` and `lastSeenTimeStamp` are "CPU
//!   timestamp in microseconds" (NVML API reference, `nvmlProcessUtilizationSample_t` /
//!   `nvmlProcessesUtilizationInfo_v1_t`); the real driver uses the wall clock
//!   (`gettimeofday`), so peers ask for "now minus one second" that way. The fake converts
//!   with one wall-minus-monotonic offset taken once per process, so a timestamp it hands out
//!   is stable and can be passed back as `lastSeenTimeStamp`.
//! * `exact` (the default): one sample per process per call covering exactly
//!   `[lastSeen, now)`, device utilisation over the last `FAKEGPU_UTIL_WINDOW_MS`.
//! * `realistic` (`FAKEGPU_NVML_MODE=realistic`): what `nvmlUtilization_t` documents — "each
//!   sample period may be between 1 second and 1/6 second, depending on the product": samples
//!   exist only at period boundaries (`FAKEGPU_NVML_SAMPLE_MS`, default 167), device
//!   utilisation is the integer percent (truncated) of the last completed period, per-process
//!   samples appear `FAKEGPU_NVML_PROC_DELAY_MS` (default one period) after their period
//!   ends, only for processes with a non-zero figure, and `FAKEGPU_NVML_PROC_DROP_PERMILLE`
//!   (default 50) of them are missing (the same ones for every reader: a hash of PID and
//!   period).

use std::sync::OnceLock;

use crate::nvml_view;
use crate::timeline::{BUCKET_NS, HISTORY_NS};

/// The sampling knobs, read once per process from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    pub realistic: bool,
    /// Sample period (realistic mode), ns; a multiple of the timeline's 1 ms buckets.
    pub period_ns: u64,
    /// Device utilisation truncated to an integer percent (realistic) instead of rounded.
    pub truncate: bool,
    /// How long after its period ends a per-process sample becomes visible, ns.
    pub delay_ns: u64,
    /// Per-mille of per-process samples that are missing.
    pub drop_per_mille: u32,
}

/// The default sample period: 1/6 s, the fast end of NVIDIA's documented range.
pub const DEFAULT_PERIOD_MS: u64 = 167;
/// Default drop-out rate of per-process samples, per mille.
pub const DEFAULT_DROP_PER_MILLE: u32 = 50;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

impl Sampling {
    pub const EXACT: Sampling = Sampling {
        realistic: false,
        period_ns: BUCKET_NS,
        truncate: false,
        delay_ns: 0,
        drop_per_mille: 0,
    };

    /// The knobs from the environment (see the module doc); out-of-range values are clamped
    /// (period 1 ms..1 s, delay up to 2 s, drop up to 1000 per mille).
    pub fn from_env() -> Sampling {
        let realistic = std::env::var("FAKEGPU_NVML_MODE").is_ok_and(|m| m.trim() == "realistic");
        if !realistic {
            return Sampling::EXACT;
        }
        let period_ms = env_u64("FAKEGPU_NVML_SAMPLE_MS")
            .unwrap_or(DEFAULT_PERIOD_MS)
            .clamp(1, 1000);
        Sampling {
            realistic,
            period_ns: period_ms * 1_000_000,
            truncate: true,
            delay_ns: env_u64("FAKEGPU_NVML_PROC_DELAY_MS")
                .unwrap_or(period_ms)
                .min(2000)
                * 1_000_000,
            drop_per_mille: env_u64("FAKEGPU_NVML_PROC_DROP_PERMILLE")
                .unwrap_or(u64::from(DEFAULT_DROP_PER_MILLE))
                .min(1000) as u32,
        }
    }

    /// How far back the driver's sample buffer reaches: the utilisation window, at least
    /// four sample periods (plus the delay), within the timeline's history.
    pub fn buffer_ns(&self) -> u64 {
        nvml_view::util_window_ns()
            .max(4 * self.period_ns + self.delay_ns)
            .min(HISTORY_NS - 2 * BUCKET_NS)
    }

    /// The periods `[from, to)` (monotonic ns) whose per-process samples a call at `now`
    /// with `last_seen_us` (wall µs; 0 = the whole buffer) returns; empty = NOT_FOUND.
    pub fn periods(&self, last_seen_us: u64, now: u64, clock: &Clock) -> Vec<(u64, u64)> {
        let oldest = now.saturating_sub(self.buffer_ns());
        let from = if last_seen_us == 0 {
            oldest
        } else {
            clock.mono_ns(last_seen_us).max(oldest)
        };
        if !self.realistic {
            return if from < now {
                vec![(from, now)]
            } else {
                vec![]
            };
        }
        let mut out = Vec::new();
        // Period ends strictly after `from`, visible (end + delay <= now).
        let mut end = (from / self.period_ns + 1) * self.period_ns;
        while end + self.delay_ns <= now {
            if end >= self.period_ns {
                out.push((end - self.period_ns, end));
            }
            end += self.period_ns;
        }
        out
    }

    /// Whether the sample of `pid` for the period ending at `end` is one of the dropped ones.
    pub fn dropped(&self, pid: u32, end: u64) -> bool {
        if self.drop_per_mille == 0 {
            return false;
        }
        let mut x = (u64::from(pid) << 40) ^ (end / self.period_ns);
        // splitmix64 finaliser: every reader in every process draws the same drops.
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        (x % 1000) < u64::from(self.drop_per_mille)
    }

    /// The window device utilisation covers at `now`: the last `window_ns` (exact) or the
    /// last completed sample period (realistic).
    pub fn device_window(&self, now: u64, window_ns: u64) -> (u64, u64) {
        if self.realistic {
            let end = now / self.period_ns * self.period_ns;
            (end.saturating_sub(self.period_ns), end)
        } else {
            (now.saturating_sub(window_ns), now)
        }
    }

    /// `busy` ns of `span` as NVML's integer percent.
    pub fn percent(&self, busy: u64, span: u64) -> u32 {
        if span == 0 {
            return 0;
        }
        let busy = busy.min(span) as u128;
        let span = span as u128;
        let p = if self.truncate {
            busy * 100 / span
        } else {
            (busy * 100 + span / 2) / span
        };
        p as u32
    }
}

/// The process's sampling knobs.
pub fn sampling() -> &'static Sampling {
    static S: OnceLock<Sampling> = OnceLock::new();
    S.get_or_init(Sampling::from_env)
}

/// Wall-clock microseconds against the monotonic clock: `wall_us = mono_ns / 1000 + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub offset_us: u64,
}

impl Clock {
    /// The wall-clock µs of monotonic instant `mono_ns`.
    pub fn wall_us(&self, mono_ns: u64) -> u64 {
        mono_ns / 1000 + self.offset_us
    }
    /// The monotonic ns of wall-clock µs `wall_us` (0 for instants before boot).
    pub fn mono_ns(&self, wall_us: u64) -> u64 {
        wall_us.saturating_sub(self.offset_us).saturating_mul(1000)
    }
}

/// CLOCK_REALTIME now, µs.
pub fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// This process's clock conversion, fixed at first use.
pub fn clock() -> &'static Clock {
    static C: OnceLock<Clock> = OnceLock::new();
    C.get_or_init(|| {
        let mono = crate::state::now_ns();
        Clock {
            offset_us: realtime_us().saturating_sub(mono / 1000),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn realistic() -> Sampling {
        Sampling {
            realistic: true,
            period_ns: 100 * MS,
            truncate: true,
            delay_ns: 100 * MS,
            drop_per_mille: 0,
        }
    }

    #[test]
    fn timestamps_are_wall_clock_microseconds_and_round_trip() {
        let c = clock();
        let now = crate::state::now_ns();
        let wall = c.wall_us(now);
        assert!(wall.abs_diff(realtime_us()) < 1_000_000, "wall clock");
        assert!(wall > now / 1000 + 1_000_000_000_000, "not CLOCK_MONOTONIC");
        assert_eq!(c.mono_ns(wall), now / 1000 * 1000);
    }

    #[test]
    fn exact_mode_answers_one_period_since_last_seen() {
        let c = Clock {
            offset_us: 1_000_000_000,
        };
        let now = 50_000 * MS;
        let s = Sampling::EXACT;
        assert_eq!(
            s.periods(c.wall_us(now - 40 * MS), now, &c),
            vec![(now - 40 * MS, now)]
        );
        assert!(
            s.periods(c.wall_us(now), now, &c).is_empty(),
            "nothing newer"
        );
        // A monotonic-clock lastSeen (a peer tuned on the old fake) is older than the
        // buffer: the whole buffer, like lastSeen 0.
        assert_eq!(s.periods(now / 1000, now, &c), s.periods(0, now, &c));
    }

    #[test]
    fn realistic_samples_sit_on_period_boundaries_after_the_delay() {
        let c = Clock {
            offset_us: 1_000_000_000,
        };
        let s = realistic();
        let now = 50_050 * MS; // boundaries every 100 ms; visible 100 ms after
        let got = s.periods(c.wall_us(49_700 * MS), now, &c);
        assert_eq!(
            got,
            vec![(49_700 * MS, 49_800 * MS), (49_800 * MS, 49_900 * MS)]
        );
        // Passing the newest timestamp back: nothing new until the next one is visible.
        let newest = c.wall_us(49_900 * MS);
        assert!(s.periods(newest, now, &c).is_empty());
        assert_eq!(
            s.periods(newest, 50_100 * MS, &c),
            vec![(49_900 * MS, 50_000 * MS)]
        );
        assert_eq!(s.device_window(now, 0), (49_900 * MS, 50_000 * MS));
        assert_eq!(s.percent(999, 1000), 99, "truncated");
        assert_eq!(Sampling::EXACT.percent(999, 1000), 100, "rounded");
    }

    #[test]
    fn drops_hit_the_configured_fraction_the_same_way_every_time() {
        let s = Sampling {
            drop_per_mille: 100,
            ..realistic()
        };
        let dropped = (0..10_000u64)
            .filter(|k| s.dropped(4242, k * s.period_ns))
            .count();
        assert!((800..1200).contains(&dropped), "{dropped}");
        assert_eq!(s.dropped(7, 300 * MS), s.dropped(7, 300 * MS));
        assert!(!realistic().dropped(7, 300 * MS));
    }
}
