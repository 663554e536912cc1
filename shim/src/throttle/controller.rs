//! The feedback law, as plain arithmetic (no FFI, no clock): one tick in, the bucket's new
//! refill rate and per-launch cost estimate out. Unit-tested against a simulated plant.
//!
//! Control law (per device, once per tick, computed by the slice's leader process):
//!
//! ```text
//! cost  <- cost + a * (busy_container / launches - cost)        (EMA, a = 0.5)
//! log c <- clamp(log c + clamp(k * (S - U) / S, ±0.5), log 1/8, log 8)   (k = 0.3)
//! rate   = S * c   GPU-ns of tokens per wall-ns
//! ```
//!
//! `U` is the slice's measured utilisation of the device over the tick, `S` its share. A tick
//! where the slice launched nothing, or used less than its share without ever waiting for the
//! bucket (it did not want more), leaves `c` alone (no wind-up while idle).
//!
//! Why it is stable and SM-independent: tokens are GPU-time nanoseconds and the cost is
//! learned in the same unit from the measurement, so in steady state `U = min(demand,
//! S * c * g)` where `g = true cost / estimated cost` (≈ 1 once learned). In log space the
//! plant is `log U = log S + log c + log g`: gain 1, whatever the GPU. With
//! `(S - U)/S ≈ -(log U - log S)` the loop is `x' = x - k x_delayed` (one tick of measurement
//! delay), characteristic `z² - z + k = 0`, whose roots have modulus `sqrt(k) < 1` for any
//! `k < 1`; k = 0.3 settles a factor-2 error to 5 % in about five ticks. Nothing in the loop
//! scales with the number of SMs (the trap HAMi-core fell into, where the correction step grew
//! with SMs²).
//!
//! `burst`: when the rest of the device (device utilisation minus the slice's) was below
//! [`NEIGHBOUR_IDLE`] over the tick, the bucket is bypassed; as soon as a tick sees a
//! neighbour, the bucket (with the `c` it had) applies again. Give-back latency = one tick +
//! the work already queued.

use gpuslice_common::config::ComputePolicy;

/// Integral gain in log space.
pub const GAIN: f64 = 0.3;
/// `c` stays within [1/8, 8].
pub const LOG_C_LIMIT: f64 = 2.079_441_541_679_835_7; // ln 8
/// Largest change of log c in one tick.
pub const MAX_STEP: f64 = 0.5;
/// Weight of a new cost sample.
pub const COST_ALPHA: f64 = 0.5;
/// The first estimate before anything was measured: conservative (1 ms of GPU time).
pub const INITIAL_COST_NS: f64 = 1_000_000.0;
/// Below this share of the device, the neighbours are taken to be idle (burst).
pub const NEIGHBOUR_IDLE: f64 = 0.02;

/// What one tick measured on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    /// The share, 0 < share < 1.
    pub share: f64,
    /// Measured span of the tick (ns).
    pub span_ns: u64,
    /// GPU-busy ns of the slice's processes within the span; `None` = no measurement.
    pub slice_busy_ns: Option<u64>,
    /// GPU-busy ns of the whole device within the span (`None` = unknown).
    pub device_busy_ns: Option<u64>,
    /// Launches the slice made during the tick.
    pub launches: u64,
    /// Whether any launch of the slice had to wait for the bucket during the tick.
    pub waited: bool,
}

/// The bucket's settings after a tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Output {
    /// Refill rate, GPU-ns per wall-ns.
    pub rate: f64,
    /// Per-launch debit, GPU-ns.
    pub cost_ns: u64,
    /// `burst` with idle neighbours: launches skip the bucket.
    pub bypass: bool,
}

/// Controller state (persisted in the shared words so a new leader continues).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Controller {
    pub log_c: f64,
    pub cost_ns: f64,
    pub bypass: bool,
}

impl Default for Controller {
    fn default() -> Self {
        Controller {
            log_c: 0.0,
            cost_ns: INITIAL_COST_NS,
            bypass: false,
        }
    }
}

impl Controller {
    pub fn output(&self, share: f64) -> Output {
        Output {
            rate: share * self.log_c.exp(),
            cost_ns: self.cost_ns.round().max(1.0) as u64,
            bypass: self.bypass,
        }
    }

    /// One control step.
    pub fn step(&mut self, tick: &Tick, policy: ComputePolicy) -> Output {
        let share = tick.share.clamp(0.001, 1.0);
        let (Some(busy), true) = (tick.slice_busy_ns, tick.span_ns > 0) else {
            return self.output(share);
        };
        if tick.launches > 0 && busy > 0 {
            let sample = busy as f64 / tick.launches as f64;
            if self.cost_ns == INITIAL_COST_NS {
                // The first measurement replaces the conservative guess outright.
                self.cost_ns = sample;
            } else {
                self.cost_ns += COST_ALPHA * (sample - self.cost_ns);
            }
            self.cost_ns = self.cost_ns.clamp(100.0, 10e9);
        }
        let used = busy as f64 / tick.span_ns as f64;
        if policy == ComputePolicy::Burst {
            let neighbours = tick
                .device_busy_ns
                .map(|d| d.saturating_sub(busy) as f64 / tick.span_ns as f64);
            self.bypass = matches!(neighbours, Some(n) if n < NEIGHBOUR_IDLE);
            if self.bypass {
                return self.output(share);
            }
        } else {
            self.bypass = false;
        }
        let idle = tick.launches == 0 && busy == 0;
        let satisfied = used < share && !tick.waited;
        if !idle && !satisfied {
            self.log_c =
                (self.log_c + GAIN * (share - used) / share).clamp(-LOG_C_LIMIT, LOG_C_LIMIT);
        }
        self.output(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long simulated ticks so a 10 ms kernel at 10 % is not quantised to whole launches.
    const TICK: u64 = 1_000_000_000;

    /// A slice with unlimited demand whose real kernels cost `true_cost`: over a tick it gets
    /// `rate * span` tokens, i.e. `rate * span / est` launches, busy = launches * true_cost.
    fn simulate(share: f64, true_cost: f64, ticks: usize) -> Vec<f64> {
        let mut ctl = Controller::default();
        let mut out = ctl.output(share);
        let mut used = Vec::new();
        for _ in 0..ticks {
            let launches = (out.rate * TICK as f64 / out.cost_ns as f64).max(1.0);
            let busy = (launches * true_cost).min(TICK as f64);
            used.push(busy / TICK as f64);
            out = ctl.step(
                &Tick {
                    share,
                    span_ns: TICK,
                    slice_busy_ns: Some(busy as u64),
                    device_busy_ns: Some(busy as u64),
                    launches: launches as u64,
                    waited: true,
                },
                ComputePolicy::Cap,
            );
        }
        used
    }

    #[test]
    fn converges_to_the_share_for_small_and_large_kernels() {
        for share in [0.1, 0.25, 0.5, 0.75, 0.9] {
            for cost in [10_000.0, 1_000_000.0, 10_000_000.0] {
                let used = simulate(share, cost, 40);
                let last = used[used.len() - 1];
                assert!(
                    (last - share).abs() < 0.01,
                    "share {share} cost {cost}: {used:?}"
                );
                // Settled within 20 ticks even when the first ticks saturate the device.
                assert!((used[20] - share).abs() < 0.05, "{share} {cost}: {used:?}");
            }
        }
    }

    #[test]
    fn a_biased_measurement_is_absorbed_by_the_integral() {
        // The bucket over-delivers by 30% (e.g. sleeps overshoot): c must settle below 1.
        let mut ctl = Controller::default();
        let share = 0.5;
        let mut out = ctl.output(share);
        let mut used = 0.0;
        for _ in 0..60 {
            used = (out.rate * 1.3).min(1.0);
            let busy = (used * TICK as f64) as u64;
            out = ctl.step(
                &Tick {
                    share,
                    span_ns: TICK,
                    slice_busy_ns: Some(busy),
                    device_busy_ns: Some(busy),
                    launches: 100,
                    waited: true,
                },
                ComputePolicy::Cap,
            );
        }
        assert!((used - share).abs() < 0.01, "{used}");
        assert!(ctl.log_c < 0.0);
    }

    #[test]
    fn no_wind_up_while_the_slice_wants_less_than_its_share() {
        let mut ctl = Controller::default();
        for _ in 0..100 {
            ctl.step(
                &Tick {
                    share: 0.5,
                    span_ns: TICK,
                    slice_busy_ns: Some(TICK / 10),
                    device_busy_ns: Some(TICK / 10),
                    launches: 10,
                    waited: false,
                },
                ComputePolicy::Cap,
            );
        }
        assert_eq!(ctl.log_c, 0.0);
        // Idle ticks (no launches, nothing busy) change nothing either.
        let before = ctl;
        ctl.step(
            &Tick {
                share: 0.5,
                span_ns: TICK,
                slice_busy_ns: Some(0),
                device_busy_ns: Some(0),
                launches: 0,
                waited: false,
            },
            ComputePolicy::Cap,
        );
        assert_eq!(ctl, before);
    }

    #[test]
    fn correction_is_clamped_and_missing_measurements_change_nothing() {
        let mut ctl = Controller::default();
        for _ in 0..200 {
            ctl.step(
                &Tick {
                    share: 0.5,
                    span_ns: TICK,
                    slice_busy_ns: Some(TICK),
                    device_busy_ns: Some(TICK),
                    launches: 1,
                    waited: true,
                },
                ComputePolicy::Cap,
            );
        }
        assert_eq!(ctl.log_c, -LOG_C_LIMIT);
        let before = ctl;
        ctl.step(
            &Tick {
                share: 0.5,
                span_ns: TICK,
                slice_busy_ns: None,
                device_busy_ns: None,
                launches: 5,
                waited: true,
            },
            ComputePolicy::Cap,
        );
        assert_eq!(ctl, before);
    }

    #[test]
    fn burst_bypasses_while_neighbours_are_idle_and_caps_when_one_appears() {
        let mut ctl = Controller::default();
        let alone = Tick {
            share: 0.25,
            span_ns: TICK,
            slice_busy_ns: Some(TICK * 9 / 10),
            device_busy_ns: Some(TICK * 9 / 10),
            launches: 90,
            waited: false,
        };
        assert!(ctl.step(&alone, ComputePolicy::Burst).bypass);
        assert_eq!(ctl.log_c, 0.0, "bursting does not move c");
        let neighbour = Tick {
            device_busy_ns: Some(TICK),
            slice_busy_ns: Some(TICK / 2),
            ..alone
        };
        let out = ctl.step(&neighbour, ComputePolicy::Burst);
        assert!(!out.bypass);
        assert!(out.rate < 0.25, "above its share: c goes down");
        // `cap` never bypasses.
        assert!(
            !Controller::default()
                .step(&alone, ComputePolicy::Cap)
                .bypass
        );
    }
}
