//! The feedback law, as plain arithmetic (no FFI, no clock): one tick in, the bucket's new
//! refill rate, per-launch cost estimate and any re-debit out. Unit-tested against a simulated
//! plant with a launch queue and measurement noise.
//!
//! Control law (per device, once per tick, computed by the slice's leader process):
//!
//! ```text
//! B, L  <- B * d + busy,  L * d + launches                     (d = 0.9: ~500 ms memory)
//! cost   = B / L                       GPU-ns per launch (the first sample replaces the guess)
//! debit += (cost_new - cost_old) * launches_at_cost_old        (re-debit / refund)
//! U      = slice busy / span over the last WINDOW ticks
//! log c <- clamp(log c + clamp(k * (S - U) / S, ±MAX_STEP), ±ln 8)     (k = 0.3)
//! rate   = S * c   GPU-ns of tokens per wall-ns
//! ```
//!
//! `U` is the slice's measured utilisation of the device, `S` its share. `c` stays put:
//! * until the per-launch cost has been learned, and while the slice repays the re-debit of
//!   its start-up (launches debited at the 1 ms guess are charged their measured cost on the
//!   shared bucket, so a start-up overshoot is paid back in tokens, not by driving `c` down);
//! * on ticks where the slice launched nothing, or used less than its share without ever
//!   waiting for the bucket (it did not want more): no wind-up while idle.
//!
//! Why it is stable and SM-independent: tokens are GPU-time nanoseconds and the cost is
//! learned in the same unit from the measurement, so in steady state `U = min(demand,
//! S * c * g)` where `g = true cost / estimated cost` (≈ 1 once learned). In log space the
//! plant is `log U = log S + log c + log g`: gain 1, whatever the GPU. With
//! `(S - U)/S ≈ -(log U - log S)` and `U` averaged over the last `W` ticks (one tick of
//! measurement delay) the loop is `x' = x - k * mean(x[-1..-W])`; for k = 0.3 and W = 4 its
//! roots lie inside the unit circle (checked numerically in the tests) and a factor-2 error
//! settles to 5 % in about ten ticks (0.5 s). Nothing in the loop scales with the number of
//! SMs (the trap HAMi-core fell into, where the correction step grew with SMs²): a bigger GPU
//! only makes kernels shorter, which the learned cost absorbs.
//!
//! `burst`: when the rest of the device (device utilisation minus the slice's) was below
//! [`NEIGHBOUR_IDLE`] over the tick, the bucket is bypassed; as soon as a tick sees a
//! neighbour, the bucket (with the `c` it had) applies again. Give-back latency = one tick +
//! the work already queued.
//!
//! `burst` next to busy neighbours shares the device's idle time ([`IdleShare`]): the slice
//! steers to `m * S` instead of `S`, with one multiple `m >= 1` per slice that every bursting
//! slice moves by the same law from the same signal, the device's busy fraction `D`. Its
//! excess `x = m - 1` grows additively while the device has idle time and the slice waited
//! for tokens, `x += IDLE_GAIN * (1 - D - IDLE_MARGIN)`, the same step for every slice, so the
//! allocations `m * S` grow in proportion to the shares; and it shrinks multiplicatively by a
//! PRESSURE that rises continuously with `D`, `x *= 1 - BACKOFF * p(D)`, `p` going from 0 at
//! [`PRESSURE_FROM`] to 1 at [`PRESSURE_FULL`]. Additive increase and multiplicative decrease
//! pull the excesses of slices that all want more together (Chiu and Jain): at equilibrium
//! every slice has the same `x`, so they split the idle time in proportion to their shares,
//! and a capped neighbour that becomes busy raises `D` and the bursting slices shrink their
//! excess by a tenth a tick until it has room. Why continuous and not a halving on a
//! saturated tick (the first design): each slice's leader reads NVML over its own stretch and
//! its client may be short of CPU, so two leaders read a percent apart now and then (0.96 and
//! 0.97): a threshold made one halve and the other not, and a difference that AIMD only
//! halves per cycle skewed whole seconds (30 % and 20 % slices read from 1.04:1 to 2.05:1 on
//! the fake, one CI run failed on it); a pressure that differs by a percent's worth when the
//! readings do keeps the slices together (1.51-1.58:1). The leaders also tick on one grid of
//! the system-wide monotonic clock (the shim's `throttle::watcher::next_tick`), so they read
//! the same stretches of the device.
//! Priorities only change who gets more of the idle time: a high-priority slice backs off by
//! [`HIGH_BACKOFF`] and claims idle time [`HIGH_WEIGHT`] times as fast; a low-priority slice
//! claims it at [`LOW_WEIGHT`], only once the device has stayed idle for [`LOW_PATIENCE`]
//! ticks, and backs off by [`LOW_BACKOFF`], so it yields idle time first. No priority lowers
//! a share. `c` is held while `m > 1`: it corrects the cost estimate at the share, and the
//! idle loop closes on the device's own figure.

use gpuslice_common::config::{ComputePolicy, Priority};

/// Integral gain in log space.
pub const GAIN: f64 = 0.3;
/// `c` stays within [1/8, 8].
pub const LOG_C_LIMIT: f64 = 2.079_441_541_679_835_7; // ln 8
/// Largest change of log c in one tick.
pub const MAX_STEP: f64 = 0.25;
/// Per-tick decay of the cost estimator's sums.
pub const COST_DECAY: f64 = 0.9;
/// Fewest ticks the utilisation fed to the integral is averaged over.
pub const WINDOW: usize = 4;
/// Most ticks of that window (2 s at 50 ms ticks).
pub const MAX_WINDOW: usize = 40;
/// Launches the window should hold at the share: long kernels at a small share launch a few
/// times a second, and a window shorter than that sees only bursts and gaps.
pub const WINDOW_LAUNCHES: f64 = 8.0;
/// The first estimate before anything was measured: conservative (1 ms of GPU time).
pub const INITIAL_COST_NS: f64 = 1_000_000.0;
/// The smallest per-launch cost: 1 ns, so no floor caps short kernels below their share
/// (it was 100 ns, which held 1 ns kernels at 1 M launches/s at a 10 % share for good).
pub const MIN_COST_NS: f64 = 1.0;
/// Below this share of the device, the neighbours are taken to be idle (burst).
pub const NEIGHBOUR_IDLE: f64 = 0.02;
/// Idle time below this fraction of the device counts as none (the device is saturated):
/// gaps between a client's batches and NVML's whole percent leave a few percent unused.
pub const IDLE_MARGIN: f64 = 0.04;
/// Ticks of idle device a low-priority slice waits before it takes any of it (a busy
/// high-priority slice takes it within a tick or two).
pub const LOW_PATIENCE: u32 = 4;
/// The device's busy fraction at which bursting slices start to give back their excess, and
/// the one at which they give back [`BACKOFF`] of it per tick. A wide ramp: two leaders whose
/// readings differ by a percent back off by amounts an eighth of that apart. Below the ramp's
/// top the device still has idle time, so the buckets (in proportion to the shares), not the
/// device's time-slicing of oversubscribed queues (in proportion to their lengths), decide.
pub const PRESSURE_FROM: f64 = 0.90;
pub const PRESSURE_FULL: f64 = 0.98;
/// The part of its excess over the share (`m - 1`) a slice gives back per tick at full
/// pressure: normal, high and low priority. The normal rate was chosen in the phased model
/// (`tests::Shared::phased`): 0.05 left the device oversubscribed (its time-slicing then evens
/// the split towards 1:1), 0.25 made the excesses swing (1.12-1.94:1).
pub const BACKOFF: f64 = 0.1;
pub const HIGH_BACKOFF: f64 = 0.05;
pub const LOW_BACKOFF: f64 = 0.3;
/// An excess below this is none: the slice is back at its share, and `c` (held while the
/// multiple is above 1) corrects the cost estimate again.
pub const NO_EXCESS: f64 = 0.02;
/// Share of the idle time (beyond the margin) a normal slice's multiple grows by per tick.
pub const IDLE_GAIN: f64 = 1.0;
/// How much faster than a normal slice a high-priority one claims idle time (and how much
/// slower a low-priority one does): additive increase in proportion to this weight gives the
/// heavier slice the larger part of the idle time at equilibrium.
pub const HIGH_WEIGHT: f64 = 1.5;
pub const LOW_WEIGHT: f64 = 0.5;

/// `burst`'s share of the device's idle time next to busy neighbours (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct IdleShare {
    /// The slice steers to `multiple * share` (>= 1; at most the whole device).
    pub multiple: f64,
    pub priority: Priority,
    idle_ticks: u32,
}

impl IdleShare {
    pub fn new(priority: Priority) -> IdleShare {
        IdleShare {
            multiple: 1.0,
            priority,
            idle_ticks: 0,
        }
    }

    /// Back to the share (no measurement of the neighbours, or the bucket is bypassed).
    pub fn reset(&mut self) {
        *self = IdleShare::new(self.priority);
    }

    /// One tick: `load` = the device's busy fraction, `waited` = the slice wanted more,
    /// `full` = the multiple at which the slice's bucket hands out the whole device.
    pub fn step(&mut self, load: f64, waited: bool, full: f64) {
        let load = load.clamp(0.0, 1.0);
        let idle = 1.0 - load;
        let (patience, weight, backoff) = match self.priority {
            Priority::High => (1, HIGH_WEIGHT, HIGH_BACKOFF),
            Priority::Normal => (1, 1.0, BACKOFF),
            Priority::Low => (LOW_PATIENCE, LOW_WEIGHT, LOW_BACKOFF),
        };
        if idle > IDLE_MARGIN {
            self.idle_ticks = self.idle_ticks.saturating_add(1);
            // Only a slice that waited for tokens wants more. One that did not keeps its
            // multiple (its client may just have been short of CPU: decaying it then made two
            // slices' multiples drift apart on a loaded machine); the pressure takes it down.
            if waited && self.idle_ticks >= patience {
                self.multiple += IDLE_GAIN * weight * (idle - IDLE_MARGIN);
            }
        } else {
            self.idle_ticks = 0;
        }
        let pressure = ((load - PRESSURE_FROM) / (PRESSURE_FULL - PRESSURE_FROM)).clamp(0.0, 1.0);
        let excess = (self.multiple - 1.0) * (1.0 - backoff * pressure);
        let excess = if excess < NO_EXCESS { 0.0 } else { excess };
        self.multiple = (1.0 + excess).clamp(1.0, full.max(1.0));
    }
}

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
    /// Launches the slice made since it started (all debited at the guess until learned).
    pub launches_total: u64,
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
    /// GPU-ns to charge (> 0) or refund (< 0) on the shared bucket: launches debited at a
    /// cost estimate that has since changed.
    pub redebit_ns: i64,
}

/// Controller state. `log_c` and the cost are also kept in the shared words so a new leader
/// continues from them; the sums and the window are the leader's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Controller {
    pub log_c: f64,
    pub cost_ns: f64,
    pub learned: bool,
    pub bypass: bool,
    /// `burst` next to busy neighbours: the multiple of the share steered to.
    pub idle_share: IdleShare,
    busy_sum: f64,
    launch_sum: f64,
    /// Busy measured on ticks without launches, not yet in the sums.
    pending_busy: f64,
    /// (busy, span) of the last ticks, newest last.
    window: Vec<(u64, u64)>,
    /// Wall ns during which `c` is held (start-up debt being repaid).
    hold_ns: u64,
    /// The start-up probe's (lower, upper) bounds on the per-launch cost
    /// (the probe, `probe.rs`), used while the cost is not learned.
    launch_bounds: Option<(f64, f64)>,
}

impl Default for Controller {
    fn default() -> Self {
        Controller::resume(0.0, None, false)
    }
}

impl Controller {
    /// A controller continuing from the shared words (`cost` = `None`: not learned yet).
    pub fn resume(log_c: f64, cost: Option<f64>, bypass: bool) -> Controller {
        let log_c = if log_c.is_finite() {
            log_c.clamp(-LOG_C_LIMIT, LOG_C_LIMIT)
        } else {
            0.0
        };
        let (cost_ns, learned) = match cost {
            Some(c) if c.is_finite() && c > 0.0 => (c, true),
            _ => (INITIAL_COST_NS, false),
        };
        Controller {
            log_c,
            cost_ns,
            learned,
            bypass,
            idle_share: IdleShare::new(Priority::Normal),
            // A resumed estimate weighs like one tick of launches.
            busy_sum: if learned { cost_ns } else { 0.0 },
            launch_sum: if learned { 1.0 } else { 0.0 },
            pending_busy: 0.0,
            window: Vec::with_capacity(WINDOW + 1),
            hold_ns: 0,
            launch_bounds: None,
        }
    }

    /// The start-up probe's latest (lower, upper) bounds on the per-launch cost (`None`:
    /// none). They only matter until NVML has measured the cost.
    pub fn set_launch_bounds(&mut self, bounds: Option<(u64, u64)>) {
        self.launch_bounds = bounds.map(|(lower, upper)| (lower as f64, upper.max(1) as f64));
    }

    /// What launches are debited: the learned cost, or until it is learned the guess held
    /// within the probe's bounds: never above the upper one (the wall time the launches took,
    /// which the kernels' own time cannot exceed), never below the time the slice's stream
    /// was seen busy per launch (more than the kernels' time only behind a neighbour's).
    pub fn debit_cost(&self) -> f64 {
        match self.launch_bounds {
            Some((lower, upper)) if !self.learned => {
                self.cost_ns.min(upper).max(lower).max(MIN_COST_NS)
            }
            _ => self.cost_ns,
        }
    }

    pub fn output(&self, share: f64, redebit_ns: i64) -> Output {
        Output {
            rate: share * self.idle_share.multiple * self.log_c.exp(),
            cost_ns: self.debit_cost().round().max(1.0) as u64,
            bypass: self.bypass,
            redebit_ns,
        }
    }

    /// One control step.
    pub fn step(&mut self, tick: &Tick, policy: ComputePolicy) -> Output {
        let share = tick.share.clamp(0.001, 1.0);
        let (Some(busy), true) = (tick.slice_busy_ns, tick.span_ns > 0) else {
            return self.output(share, 0);
        };
        let was_bypassing = self.bypass;
        let mut redebit = self.learn_cost(tick, busy, share);
        if policy == ComputePolicy::Burst {
            let neighbours = tick
                .device_busy_ns
                .map(|d| d.saturating_sub(busy) as f64 / tick.span_ns as f64);
            self.bypass = matches!(neighbours, Some(n) if n < NEIGHBOUR_IDLE);
            if self.bypass || was_bypassing {
                // Launches skipped the bucket: nothing was debited at the old estimate.
                redebit = 0;
            }
            if self.bypass {
                // What the slice did alone says nothing about its share next to others.
                self.window.clear();
                self.idle_share.reset();
                return self.output(share, redebit);
            }
            let above = was_bypassing || self.idle_share.multiple > 1.0;
            match tick.device_busy_ns {
                Some(device) => self.idle_share.step(
                    device as f64 / tick.span_ns as f64,
                    tick.waited,
                    1.0 / (share * self.log_c.exp()),
                ),
                // Neighbours unknown: never taken for idle.
                None => self.idle_share.reset(),
            }
            if self.idle_share.multiple > 1.0 {
                // Above the share by the idle loop's doing: `c` (the estimate's correction
                // at the share) is left where it was.
                self.window.clear();
                return self.output(share, redebit);
            }
            if above {
                // Back at the share: the work queued above it drains first, and would drive
                // `c` down (to 0.37 in the model, after which two bursting slices could
                // never fill the device): `c` waits a window.
                self.hold_ns = self.hold_ns.max(WINDOW as u64 * tick.span_ns);
            }
        } else {
            self.bypass = false;
            self.idle_share.reset();
        }
        if self.hold_ns > 0 || !self.learned {
            self.hold_ns = self.hold_ns.saturating_sub(tick.span_ns);
            self.window.clear();
            return self.output(share, redebit);
        }
        let window = self.window_ticks(share, tick.span_ns);
        self.window.push((busy, tick.span_ns));
        while self.window.len() > window {
            self.window.remove(0);
        }
        let (window_busy, window_span) = self
            .window
            .iter()
            .fold((0u64, 0u64), |(b, s), &(wb, ws)| (b + wb, s + ws));
        let used = window_busy as f64 / window_span.max(1) as f64;
        // A tick without launches is idle only if nobody waited: a slice of long kernels at a
        // small share spends most ticks asleep on the bucket, and those ticks are demand.
        let idle = tick.launches == 0 && busy == 0 && !tick.waited;
        let satisfied = used < share && !tick.waited;
        if !idle && !satisfied {
            // The gain shrinks as the window grows: k * W stays constant, so the loop keeps
            // the same shape (and margin) on the slower time scale.
            let gain = GAIN * WINDOW as f64 / window as f64;
            let mut step = (gain * (share - used) / share).clamp(-MAX_STEP, MAX_STEP);
            let saturated = tick
                .device_busy_ns
                .is_some_and(|d| d as f64 >= (1.0 - IDLE_MARGIN) * tick.span_ns as f64);
            if policy == ComputePolicy::Burst && saturated && step < 0.0 {
                // On a saturated device a bursting slice above its share is mostly draining
                // what it queued above it (in the model this drove `c` to 0.3 and left a
                // low-priority slice at a third of its share): it may come back down to
                // `c = 1`, not below; a bias below 1 is corrected on unsaturated ticks.
                step = step.max(-self.log_c.max(0.0));
            }
            self.log_c = (self.log_c + step).clamp(-LOG_C_LIMIT, LOG_C_LIMIT);
        }
        self.output(share, redebit)
    }

    /// Ticks to average over: enough for [`WINDOW_LAUNCHES`] launches at the share.
    pub fn window_ticks(&self, share: f64, span_ns: u64) -> usize {
        let per_launch = self.cost_ns / share.max(1e-3);
        let ticks = (WINDOW_LAUNCHES * per_launch / span_ns.max(1) as f64).ceil();
        (ticks as usize).clamp(WINDOW, MAX_WINDOW)
    }

    /// Updates the per-launch cost from the tick; returns the GPU-ns to re-debit (> 0) or
    /// refund (< 0) for launches already debited at the previous estimate.
    fn learn_cost(&mut self, tick: &Tick, busy: u64, share: f64) -> i64 {
        let old = self.cost_ns;
        if !self.learned {
            if tick.launches == 0 {
                return 0;
            }
            if busy == 0 {
                // NVML reports whole percent: launches that left no trace cost less than half
                // a percent of the span between them. Lower the guess to that bound (without
                // calling it learned), or tiny kernels at a small share would stay starved.
                // At most a factor 4 a tick: work launched late in a tick runs in the next,
                // so one empty tick does not prove the bound (dropping to it at once took
                // 1 ms kernels down to a few microseconds in the model).
                let bound = 0.005 * tick.span_ns as f64 / tick.launches as f64;
                self.cost_ns = self
                    .cost_ns
                    .min(bound)
                    .max(self.cost_ns / 4.0)
                    .max(MIN_COST_NS);
                return 0;
            }
            // The first measurement replaces the conservative guess outright, and every
            // launch so far was debited at the guess (or the probe's bound): charge (or
            // refund) the difference, at most half a second of the share, so the start-up
            // overshoot is repaid in tokens.
            let old = self.debit_cost();
            self.cost_ns = (busy as f64 / tick.launches as f64).clamp(MIN_COST_NS, 1e9);
            self.busy_sum = busy as f64;
            self.launch_sum = tick.launches as f64;
            self.learned = true;
            // With the start-up probe's bounds, launches were debited near their cost all
            // along (the probe re-bills its own as it goes): only the measured stretch's are
            // re-billed, as later measurements do. Re-billing them all multiplied a first
            // figure skewed by queued work by thousands of launches: 10 us kernels at 50 %
            // then slept up to half a second on the fake.
            let billed = if self.launch_bounds.is_some() {
                tick.launches
            } else {
                tick.launches_total.max(tick.launches)
            };
            let owed = (self.cost_ns - old) * billed as f64;
            let owed = owed.min(share * 0.5e9);
            // Hold c while the debt is repaid (its measurements still show the overshoot)
            // and for one window after.
            let debt_wall = owed.max(0.0) / (share * self.log_c.exp());
            self.hold_ns = debt_wall as u64 + WINDOW as u64 * tick.span_ns;
            return owed as i64;
        }
        if tick.launches == 0 {
            // Busy without launches is queued work draining: it is carried to the next tick
            // with launches (a sample of zero launches would only decay the sums, and an
            // estimate could then never come down again).
            self.pending_busy += busy as f64;
            return 0;
        }
        let busy = busy as f64 + std::mem::take(&mut self.pending_busy);
        self.busy_sum = self.busy_sum * COST_DECAY + busy;
        self.launch_sum = self.launch_sum * COST_DECAY + tick.launches as f64;
        if self.busy_sum <= 0.0 {
            return 0;
        }
        // At most a factor 2 per tick: a draining queue skews single ticks.
        self.cost_ns = (self.busy_sum / self.launch_sum).clamp(old / 2.0, old * 2.0);
        self.cost_ns = self.cost_ns.clamp(MIN_COST_NS, 1e9);
        ((self.cost_ns - old) * tick.launches as f64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 50_000_000;

    /// A slice with unlimited demand: each tick the bucket hands out `rate * span` tokens
    /// (minus re-debits), the slice launches `tokens / estimated cost` kernels that really cost
    /// `true_cost` (no more than ~100 ms of work queued: the client synchronises), and the
    /// device runs them one tick later, at most `span` per tick. The measurement is NVML's:
    /// whole percent of the span.
    struct Plant {
        share: f64,
        true_cost: f64,
        tokens: f64,
        queue: f64,
        total: u64,
    }

    impl Plant {
        fn new(share: f64, true_cost: f64, tokens: f64) -> Plant {
            Plant {
                share,
                true_cost,
                tokens,
                queue: 0.0,
                total: 0,
            }
        }

        /// One tick under the controller's output `out`: its next output and the tick's
        /// utilisation.
        fn tick(&mut self, ctl: &mut Controller, out: &Output) -> (Output, f64) {
            let span = TICK as f64;
            // An idle bucket banks at most its tolerance (30 ms of refill).
            self.tokens =
                self.tokens.min(0.03e9 * self.share) + out.rate * span - out.redebit_ns as f64;
            let mut launches = 0u64;
            // The client synchronises after ~100 ms of queued work (a batch).
            while self.tokens > 0.0 && self.queue + launches as f64 * self.true_cost < 0.1e9 {
                self.tokens -= out.cost_ns as f64;
                launches += 1;
            }
            self.total += launches;
            let run = self.queue.min(span);
            self.queue = self.queue - run + launches as f64 * self.true_cost;
            let busy = ((run / span * 100.0).round() / 100.0 * span) as u64;
            let next = ctl.step(
                &Tick {
                    share: self.share,
                    span_ns: TICK,
                    slice_busy_ns: Some(busy),
                    device_busy_ns: Some(busy),
                    launches,
                    launches_total: self.total,
                    waited: true,
                },
                ComputePolicy::Cap,
            );
            (next, run / span)
        }
    }

    /// [`Plant`] for `ticks` ticks from a bucket holding 60 % of a tick's share. Returns the
    /// utilisation per tick.
    fn simulate(share: f64, true_cost: f64, ticks: usize) -> (Vec<f64>, Controller) {
        let mut ctl = Controller::default();
        let mut out = ctl.output(share, 0);
        let mut plant = Plant::new(share, true_cost, TICK as f64 * share * 0.6);
        let mut used = Vec::new();
        for _ in 0..ticks {
            let (next, utilisation) = plant.tick(&mut ctl, &out);
            out = next;
            used.push(utilisation);
        }
        (used, ctl)
    }

    /// Ticks until the cost estimate is within a factor 1.5 of `true_cost` (the plant of
    /// [`simulate`]; NVML's whole percent, the launches of one tick measured the next).
    fn start_up_ticks(share: f64, true_cost: f64) -> usize {
        let mut ctl = Controller::default();
        let mut out = ctl.output(share, 0);
        let mut plant = Plant::new(share, true_cost, 0.03e9 * share);
        for tick in 1..=40 {
            out = plant.tick(&mut ctl, &out).0;
            let ratio = ctl.cost_ns / true_cost;
            if (1.0 / 1.5..=1.5).contains(&ratio) {
                return tick;
            }
        }
        usize::MAX
    }

    /// The start-up table of `docs/performance.md` (`-- --nocapture` prints it): ticks of
    /// 50 ms until the model's estimate is within 1.5x, for kernels from 1 ns to 100 ms.
    #[test]
    fn the_start_up_estimate_converges_within_a_few_ticks_for_1_ns_to_100_ms_kernels() {
        for share in [0.1, 0.5, 0.9] {
            let mut row = Vec::new();
            for cost in [1.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8] {
                let ticks = start_up_ticks(share, cost);
                row.push((cost, ticks));
            }
            eprintln!("share {share}: {row:?}");
            for (cost, ticks) in row {
                // Measured (docs/performance.md): within 2 s for every kernel length; with the
                // old 100 ns floor 1 ns kernels never converged.
                assert!(
                    ticks <= 40,
                    "share {share}, {cost} ns kernels: {ticks} ticks"
                );
            }
        }
    }

    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len() as f64
    }

    #[test]
    fn converges_to_the_share_for_small_and_large_kernels() {
        for share in [0.1, 0.25, 0.5, 0.75, 0.9] {
            for cost in [10_000.0, 1_000_000.0, 10_000_000.0] {
                let (used, ctl) = simulate(share, cost, 120);
                // From 2 s (40 ticks) on, averaged over 2 s as the e2e test does: within the
                // issue's 5 points; later within 2.
                let early = mean(&used[40..80]);
                assert!(
                    (early - share).abs() < 0.05,
                    "share {share} cost {cost}: {early} {used:?}"
                );
                let late = mean(&used[80..]);
                assert!((late - share).abs() < 0.02, "{share} {cost}: {late}");
                assert!(ctl.log_c > -1.0, "c is not driven to its floor: {ctl:?}");
            }
        }
    }

    #[test]
    fn the_start_up_guess_is_repaid_in_tokens_not_by_the_correction() {
        // 10 ms kernels at 10 %: the 1 ms guess lets ten times too much through at first.
        let (_, ctl) = simulate(0.1, 10_000_000.0, 8);
        assert!(ctl.learned);
        assert_eq!(ctl.log_c, 0.0, "held while the start-up debt is repaid");
        let (_, ctl) = simulate(0.1, 10_000_000.0, 100);
        assert!((ctl.cost_ns - 10e6).abs() < 3e6, "{ctl:?}");
    }

    #[test]
    fn first_measurement_rebills_launches_made_at_the_guess() {
        let mut ctl = Controller::default();
        let tick = Tick {
            share: 0.5,
            span_ns: TICK,
            slice_busy_ns: Some(10_000_000),
            device_busy_ns: Some(10_000_000),
            launches: 5,
            launches_total: 8,
            waited: true,
        };
        let out = ctl.step(&tick, ComputePolicy::Cap);
        assert_eq!(out.cost_ns, 2_000_000);
        assert_eq!(out.redebit_ns, 8 * 1_000_000);
        // A later estimate change re-bills only the tick's launches.
        let out = ctl.step(
            &Tick {
                slice_busy_ns: Some(5_000_000),
                launches: 5,
                ..tick
            },
            ComputePolicy::Cap,
        );
        assert!(out.cost_ns < 2_000_000);
        let expected = (out.cost_ns as f64 - 2e6) * 5.0;
        assert!((out.redebit_ns as f64 - expected).abs() < 10.0, "{out:?}");
    }

    #[test]
    fn the_start_up_probe_holds_the_debit_within_its_bounds_until_nvml_measures() {
        let mut ctl = Controller::default();
        assert_eq!(
            ctl.output(0.5, 0).cost_ns,
            1_000_000,
            "no bounds: the guess"
        );
        // Short kernels: the upper bound brings the guess down; long ones: the lower one
        // (time the stream was seen busy per launch) raises it.
        ctl.set_launch_bounds(Some((0, 20_000)));
        assert_eq!(ctl.output(0.5, 0).cost_ns, 20_000);
        ctl.set_launch_bounds(Some((9_000_000, 12_000_000)));
        assert_eq!(ctl.output(0.5, 0).cost_ns, 9_000_000);
        // NVML's first measurement replaces it, and re-bills only the measured stretch's
        // launches, against what they were debited (the probe re-billed the others).
        ctl.set_launch_bounds(Some((0, 20_000)));
        let out = ctl.step(
            &Tick {
                share: 0.5,
                span_ns: TICK,
                slice_busy_ns: Some(25_000_000),
                device_busy_ns: Some(25_000_000),
                launches: 2_500,
                launches_total: 10_000,
                waited: true,
            },
            ComputePolicy::Cap,
        );
        assert_eq!(out.cost_ns, 10_000);
        assert_eq!(out.redebit_ns, -10_000 * 2_500);
        ctl.set_launch_bounds(Some((0, 1_000)));
        assert_eq!(
            ctl.output(0.5, 0).cost_ns,
            10_000,
            "learned: bounds ignored"
        );
    }

    #[test]
    fn a_biased_measurement_is_absorbed_by_the_integral() {
        // The bucket over-delivers by 30% (e.g. sleeps overshoot): c must settle below 1.
        let mut ctl = Controller::resume(0.0, Some(1e6), false);
        let share = 0.5;
        let mut out = ctl.output(share, 0);
        let mut used = 0.0;
        for _ in 0..80 {
            used = (out.rate * 1.3).min(1.0);
            let busy = (used * TICK as f64) as u64;
            out = ctl.step(
                &Tick {
                    share,
                    span_ns: TICK,
                    slice_busy_ns: Some(busy),
                    device_busy_ns: Some(busy),
                    launches: 100,
                    launches_total: 0,
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
        let mut ctl = Controller::resume(0.0, Some(1e6), false);
        for _ in 0..100 {
            ctl.step(
                &Tick {
                    share: 0.5,
                    span_ns: TICK,
                    slice_busy_ns: Some(TICK / 10),
                    device_busy_ns: Some(TICK / 10),
                    launches: 5,
                    launches_total: 0,
                    waited: false,
                },
                ComputePolicy::Cap,
            );
        }
        assert_eq!(ctl.log_c, 0.0);
        // Idle ticks (no launches, nothing busy) change nothing either.
        let before = ctl.log_c;
        ctl.step(
            &Tick {
                share: 0.5,
                span_ns: TICK,
                slice_busy_ns: Some(0),
                device_busy_ns: Some(0),
                launches: 0,
                launches_total: 0,
                waited: false,
            },
            ComputePolicy::Cap,
        );
        assert_eq!(ctl.log_c, before);
    }

    #[test]
    fn correction_is_bounded_per_tick_and_overall_and_missing_measurements_change_nothing() {
        let mut ctl = Controller::resume(0.0, Some(1e6), false);
        let full = Tick {
            share: 0.5,
            span_ns: TICK,
            slice_busy_ns: Some(TICK),
            device_busy_ns: Some(TICK),
            launches: 50,
            launches_total: 0,
            waited: true,
        };
        ctl.step(&full, ComputePolicy::Cap);
        assert_eq!(ctl.log_c, -MAX_STEP);
        for _ in 0..200 {
            ctl.step(&full, ComputePolicy::Cap);
        }
        assert_eq!(ctl.log_c, -LOG_C_LIMIT);
        let before = ctl.clone();
        ctl.step(
            &Tick {
                slice_busy_ns: None,
                device_busy_ns: None,
                ..full
            },
            ComputePolicy::Cap,
        );
        assert_eq!(ctl, before);
    }

    #[test]
    fn the_windowed_loop_is_stable() {
        // x' = x - k * mean(x[-1..-W]): iterate from a unit error, it must decay.
        let mut history = vec![1.0f64; WINDOW + 1];
        for _ in 0..200 {
            let n = history.len();
            let avg: f64 = history[n - 1 - WINDOW..n - 1].iter().sum::<f64>() / WINDOW as f64;
            let next = history[n - 1] - GAIN * avg;
            history.push(next);
        }
        let tail = history[history.len() - 20..]
            .iter()
            .fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(tail < 1e-3, "{tail}");
        let ten = history[WINDOW + 10..WINDOW + 30]
            .iter()
            .fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(ten < 0.5, "settles quickly: {ten}");
    }

    #[test]
    fn burst_bypasses_while_neighbours_are_idle_and_caps_when_one_appears() {
        // A `c` above 1 (the slice had been held below its share by a busy device).
        let mut ctl = Controller::resume(0.5, Some(1e6), false);
        let rate = 0.25 * 0.5f64.exp();
        let alone = Tick {
            share: 0.25,
            span_ns: TICK,
            slice_busy_ns: Some(TICK * 9 / 10),
            device_busy_ns: Some(TICK * 9 / 10),
            launches: 45,
            launches_total: 0,
            waited: false,
        };
        let out = ctl.step(&alone, ComputePolicy::Burst);
        assert!(out.bypass);
        assert_eq!(ctl.log_c, 0.5, "bursting does not move c");
        let neighbour = Tick {
            device_busy_ns: Some(TICK),
            slice_busy_ns: Some(TICK / 2),
            launches: 25,
            ..alone
        };
        let out = ctl.step(&neighbour, ComputePolicy::Burst);
        assert!(!out.bypass);
        assert_eq!(out.redebit_ns, 0, "bypassed launches were never debited");
        // The work queued while bypassing drains first: `c` waits a window, then follows.
        for _ in 1..WINDOW {
            let out = ctl.step(&neighbour, ComputePolicy::Burst);
            assert_eq!(out.rate, rate, "held while the bypass's queue drains");
        }
        let out = ctl.step(&neighbour, ComputePolicy::Burst);
        assert!(out.rate < rate, "above its share: c goes down");
        for _ in 0..40 {
            ctl.step(&neighbour, ComputePolicy::Burst);
        }
        assert_eq!(
            ctl.log_c, 0.0,
            "on a saturated device, down to 1 and not below (the drain of a burst)"
        );
        // `cap` never bypasses.
        assert!(
            !Controller::default()
                .step(&alone, ComputePolicy::Cap)
                .bypass
        );
    }

    /// Slices sharing one device, each with unlimited demand and its own controller: the
    /// bucket hands out `rate * span` tokens, the slice queues 1 ms kernels while it has
    /// tokens (at most 100 ms queued), the device serves the queues in proportion to their
    /// lengths (time-slicing), at most one span per tick. The measurement is one tick late,
    /// and each slice's leader reads NVML at its own phase (`Shared::phased`): its stretch
    /// covers the end of one tick and the start of the next, a fraction that moves from tick
    /// to tick with the CPU the leader gets, so two slices see different figures for the same
    /// device.
    struct Shared {
        slices: Vec<(Controller, Output, ComputePolicy, f64, f64, f64)>,
        shares: Vec<f64>,
        /// Per slice: its busy fraction and the device's over the last two ticks (newest
        /// first).
        history: Vec<[(f64, f64); 2]>,
        /// Per slice: the part of its measured stretch in the older of the two ticks.
        phases: Vec<f64>,
        /// How far a leader's phase moves at random per tick (0: fixed phases).
        jitter: f64,
        rng: u64,
    }

    const KERNEL: f64 = 1e6;

    impl Shared {
        fn new() -> Shared {
            Shared {
                slices: Vec::new(),
                shares: Vec::new(),
                history: Vec::new(),
                phases: Vec::new(),
                jitter: 0.0,
                rng: 1,
            }
        }

        /// Leaders at random phases that wander by up to `jitter` of a tick per tick.
        fn phased(seed: u64, jitter: f64) -> Shared {
            Shared {
                jitter,
                rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                ..Shared::new()
            }
        }

        /// Uniform in [0, 1) (xorshift: deterministic per seed).
        fn random(&mut self) -> f64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            (self.rng >> 11) as f64 / (1u64 << 53) as f64
        }

        fn add(&mut self, share: f64, policy: ComputePolicy, priority: Priority) {
            let mut ctl = Controller::resume(0.0, Some(KERNEL), false);
            ctl.idle_share.priority = priority;
            let out = ctl.output(share, 0);
            self.slices.push((ctl, out, policy, 0.0, 0.0, 0.0));
            self.shares.push(share);
            self.history.push([(0.0, 0.0); 2]);
            let phase = if self.jitter > 0.0 {
                self.random()
            } else {
                0.0
            };
            self.phases.push(phase);
        }

        /// One tick; returns each slice's utilisation.
        fn tick(&mut self) -> Vec<f64> {
            let span = TICK as f64;
            let mut launches = Vec::new();
            for (i, (_, out, _, tokens, queue, _)) in self.slices.iter_mut().enumerate() {
                *tokens = tokens.min(0.03e9 * self.shares[i]) + out.rate * span;
                let mut n = 0u64;
                while *tokens > 0.0 && *queue + n as f64 * KERNEL < 0.1e9 {
                    *tokens -= out.cost_ns as f64;
                    n += 1;
                }
                *queue += n as f64 * KERNEL;
                // It waited for the bucket if tokens, not its full queue, stopped it.
                launches.push((n, *tokens <= 0.0));
            }
            let total: f64 = self.slices.iter().map(|s| s.4).sum();
            let run = total.min(span);
            let mut used = Vec::new();
            for s in self.slices.iter_mut() {
                let mine = if total > 0.0 { run * s.4 / total } else { 0.0 };
                s.4 -= mine;
                s.5 = mine;
                used.push(mine / span);
            }
            let device = run / span;
            let whole_percent = |x: f64| (x * 100.0).round() / 100.0;
            for i in 0..self.slices.len() {
                if self.jitter > 0.0 {
                    let step = (self.random() - 0.5) * 2.0 * self.jitter;
                    self.phases[i] = (self.phases[i] + step).clamp(0.0, 1.0);
                }
                let [newer, older] = self.history[i];
                let phase = self.phases[i];
                let seen = |pick: fn((f64, f64)) -> f64| {
                    whole_percent(pick(older) * phase + pick(newer) * (1.0 - phase)) * span
                };
                let (prev_busy, prev_device) = (seen(|h| h.0), seen(|h| h.1));
                self.history[i] = [(used[i], device), newer];
                let s = &mut self.slices[i];
                let tick = Tick {
                    share: self.shares[i],
                    span_ns: TICK,
                    slice_busy_ns: Some(prev_busy as u64),
                    device_busy_ns: Some(prev_device as u64),
                    launches: launches[i].0,
                    launches_total: 0,
                    waited: launches[i].1,
                };
                s.1 = s.0.step(&tick, s.2);
            }
            used
        }

        /// Mean utilisation of each slice over `ticks` ticks.
        fn run(&mut self, ticks: usize) -> Vec<f64> {
            let mut sum = vec![0.0; self.slices.len()];
            for _ in 0..ticks {
                for (s, u) in sum.iter_mut().zip(self.tick()) {
                    *s += u / ticks as f64;
                }
            }
            sum
        }
    }

    #[test]
    fn two_bursting_slices_split_the_idle_time_in_proportion_to_their_shares() {
        let mut device = Shared::new();
        device.add(0.3, ComputePolicy::Burst, Priority::Normal);
        device.add(0.2, ComputePolicy::Burst, Priority::Normal);
        device.run(40);
        let used = device.run(40);
        eprintln!("30 % and 20 % bursting: {used:?}");
        let (a, b) = (used[0], used[1]);
        assert!(a + b > 0.85, "the idle time is used: {used:?}");
        assert!(
            ((a / b) / 1.5 - 1.0).abs() < 0.15,
            "3:2 within 15 %: {used:?}"
        );
    }

    #[test]
    fn bursting_slices_give_idle_time_back_when_a_capped_neighbour_becomes_busy() {
        let mut device = Shared::new();
        device.add(0.3, ComputePolicy::Burst, Priority::Normal);
        device.add(0.2, ComputePolicy::Burst, Priority::Normal);
        device.run(40);
        device.add(0.4, ComputePolicy::Cap, Priority::Normal);
        // Ticks until the capped neighbour runs at its share less 5 points.
        let back = (1..=40)
            .find(|_| device.tick()[2] >= 0.35)
            .unwrap_or(usize::MAX);
        let used = device.run(40);
        eprintln!("a 40 % capped neighbour: back in {back} ticks, then {used:?}");
        assert!(back <= 6, "given back within 300 ms: {back} ticks");
        assert!(
            used[2] > 0.35,
            "the capped neighbour keeps its share: {used:?}"
        );
        assert!(
            used[0] >= 0.28 && used[1] >= 0.18,
            "nobody below its share: {used:?}"
        );
    }

    #[test]
    fn a_low_priority_slice_yields_idle_time_to_a_high_priority_one_first() {
        let split = |first: Priority, second: Priority| {
            let mut device = Shared::new();
            device.add(0.3, ComputePolicy::Burst, first);
            device.add(0.3, ComputePolicy::Burst, second);
            device.run(40);
            device.run(80)
        };
        let even = split(Priority::Normal, Priority::Normal);
        let ranked = split(Priority::High, Priority::Low);
        eprintln!("normal/normal {even:?}, high/low {ranked:?}");
        assert!(
            (even[0] - even[1]).abs() < 0.08,
            "equal priorities split evenly: {even:?}"
        );
        assert!(
            ranked[0] > ranked[1] + 0.15,
            "high takes the idle time first: {ranked:?}"
        );
        assert!(ranked[1] >= 0.28, "low keeps its share: {ranked:?}");
    }

    #[test]
    fn bursting_slices_keep_the_split_when_their_leaders_read_the_device_at_their_own_phases() {
        // Forty devices, each with two leaders at random phases that wander by a quarter of
        // a tick per tick (`Shared::phased`). The halving on a saturated tick that this law
        // replaced read 1.19:1 to 1.72:1 here (one leader halved, the other read a percent
        // less and did not); the continuous pressure reads 1.41:1 to 1.58:1.
        let mut ratios = Vec::new();
        for seed in 1..=40 {
            let mut device = Shared::phased(seed, 0.25);
            device.add(0.3, ComputePolicy::Burst, Priority::Normal);
            device.add(0.2, ComputePolicy::Burst, Priority::Normal);
            device.run(40);
            let used = device.run(60);
            assert!(
                used[0] + used[1] > 0.85,
                "seed {seed}: idle time unused: {used:?}"
            );
            ratios.push(used[0] / used[1]);
        }
        let (low, high) = ratios
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
        eprintln!("30 % and 20 % at their own phases: {low:.2}:1 to {high:.2}:1");
        assert!(
            low >= 1.5 * 0.9 && high <= 1.5 * 1.1,
            "3:2 within 10 % on every device: {low:.2} to {high:.2}"
        );
    }
}
