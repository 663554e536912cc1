//! Starting a context in the slice: what is reserved before the driver makes it (the bound
//! for a start made alongside others, the slice's figure in its turn), the lock under which
//! one process of the slice at a time measures a new context, and the one line that says why
//! a context was refused.
//!
//! Why a lock: what a context costs, and which NVML process entry is ours, are read by
//! diffing NVML's process list around the creation (see `session::host_pid`). Processes of a slice
//! that start together made that diff ambiguous, so a context stayed charged at the
//! provisional bound for its life, and each starter's provisional reservation (the bound,
//! 512 MiB by default) could fill the slice so that others were refused although all the
//! real contexts fit. Under the lock the slice has at most one provisional reservation at a
//! time, the entry that appears is ours, and the next starter reserves the cost the previous
//! one measured and published in the region. The turn is the region's
//! (`Region::try_measuring_turn`: an OFD lock the kernel drops when the holder dies, whose
//! descriptor a forked child closes at once); a waiter does not wait for a holder it sees
//! stopped, gives up after [`MEASURING_WAIT`] otherwise, and then starts without it.
//!
//! Only what is not known yet is measured: the cost once per slice and device (kept in the
//! region), the host PID once per process unless the slice knows that NVML names the
//! processes of its PID namespace by their own PIDs (`session::host_pid`). A waiter sleeps on
//! the region's turn word (a futex: woken when the turn is given back) and stops waiting as
//! soon as what it needed is published, so a storm of starts makes one measurement, not one
//! per process in turn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuslice_common::config::{ConfigSource, HAMI_MEMORY_LIMIT_ENV};
use gpuslice_common::region::{MeasuringTurn, Region, MAX_DEVICES};
use gpuslice_common::size::format_size_approx;

use super::region_budget::device_id;
use super::{charge_or_refuse, Process, Shared, CONTEXT_BOUND_ENV};

/// How long a starting process waits for ONE holder's measurement before it goes ahead
/// unserialised: well above a context creation (tens to hundreds of ms), short enough that a
/// holder stopped where we cannot see it (another PID namespace, `docker pause` of another
/// container of the slice) delays a start by no more than this. A holder stopped in our own
/// namespace is seen (`Region::measuring_holder_stopped`) and not waited for at all. While
/// turns pass from holder to holder (a storm of starts queued behind each other) the wait
/// goes on: giving up then made hundreds of starters reserve the unmeasured bound at once,
/// filling the slice, when one more turn would have published the measured cost.
pub const MEASURING_WAIT: Duration = Duration::from_secs(5);

/// The longest sleep between two looks at the turn when no wake comes: what a holder killed
/// while holding (it wakes nobody) costs its waiters at most. A given-back turn wakes them at
/// once; a thousand waiters looking every few milliseconds would take the CPU from the holder.
const LONGEST_PAUSE: Duration = Duration::from_millis(200);

/// The first pause: a measurement takes milliseconds and a given-back turn wakes its waiters,
/// so looking sooner only takes the CPU from the holder (hundreds of waiters looking every
/// 100 us did, in a storm of starts).
const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// What waiting for the measuring turn came to.
pub enum Turn<'a> {
    /// Ours: measure, then drop it.
    Held(MeasuringTurn<'a>),
    /// What the caller needed was published meanwhile: nothing to measure.
    NotNeeded,
    /// Could not be had (then the caller goes ahead unserialised).
    GaveUp,
}

/// Takes the measuring turn of region device entry `device`, waiting at most `wait` for
/// its holder, while `needed` says something is still to be measured.
pub fn lock_for_measuring(
    region: &Region,
    device: u8,
    wait: Duration,
    needed: impl Fn() -> bool,
) -> Turn<'_> {
    let id = device_id(device);
    let mut deadline = Instant::now() + wait;
    let mut holder = region.measuring_holder(id);
    let mut pause = FIRST_PAUSE;
    let mut looks = 0u32;
    loop {
        looks = looks.wrapping_add(1);
        // Read before looking: a turn given back after this wakes the sleep below.
        let changes = region.turn_changes(id);
        if !needed() {
            return Turn::NotNeeded;
        }
        // A turn visibly held is not tried (each try opens the file): a storm of waiters must
        // leave the CPU to the holder. Whether it is held is one probe of its lock (a holder
        // killed while holding has lost it to the kernel).
        let attempt = if region.measuring_turn_free(id) {
            region.try_measuring_turn(id)
        } else {
            Ok(None)
        };
        match attempt {
            Ok(Some(turn)) => return Turn::Held(turn),
            Ok(None) => {}
            Err(e) => {
                crate::log_debug!("measuring turn: {e}");
                return Turn::GaveUp;
            }
        }
        // Awaiting the holder's context creation, polled: a kernel lock wait has no
        // timeout, and a signal-based one would need a handler, which the shim never installs.
        // Whether the holder is stopped costs two /proc reads: every 4th look only (a
        // thousand waiters reading /proc at every look starve the holder they wait for).
        if looks % 4 == 1 && region.measuring_holder_stopped(id) {
            crate::log_info!(
                "the process of the slice measuring its context is stopped; starting without waiting for it"
            );
            return Turn::GaveUp;
        }
        let now_holding = region.measuring_holder(id);
        if now_holding != holder {
            // The turn passed on: the wait is for the new holder.
            holder = now_holding;
            deadline = Instant::now() + wait;
        }
        if Instant::now() >= deadline {
            crate::log_info!(
                "one process of the slice held the context measuring turn for {wait:?}; starting without it"
            );
            return Turn::GaveUp;
        }
        region.wait_for_turn_change(id, changes, pause);
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// What a context on the device is believed to cost before this one exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Measured by this process or another of the slice (the region's `context_cost`).
    Measured(u64),
    /// Nobody has measured it: the configured bound ([`CONTEXT_BOUND_ENV`]).
    Bound(u64),
}

/// Reserves for a new context on limited device entry `device`. A measured cost is reserved
/// whole. The bound is reserved up to the room the slice has (`provisional`: only when the
/// real cost will be measured and settled right after the creation, undoing the context if
/// it does not fit), so a slice smaller than the bound is not refused because of the bound
/// alone. Returns the bytes reserved, or `None` (nothing reserved) when not even that fits.
pub fn reserve(
    process: &Process,
    shared: &Shared,
    device: u8,
    expected: Expected,
    provisional: bool,
) -> Option<u64> {
    let wanted = match expected {
        Expected::Measured(bytes) | Expected::Bound(bytes) => bytes,
    };
    if charge_or_refuse(process, device, wanted).is_ok() {
        return Some(wanted);
    }
    if !provisional || matches!(expected, Expected::Measured(_)) {
        return None;
    }
    // The room may shrink between the read and the reservation (another process charged):
    // read again, a few times.
    for _ in 0..8 {
        let usage = shared.region.usage(device_id(device));
        let room = usage
            .limit
            .map_or(wanted, |limit| limit.saturating_sub(usage.used))
            .min(wanted);
        if room == 0 {
            return None;
        }
        if process.ledger.charge(device, room).is_ok() {
            return Some(room);
        }
    }
    None
}

/// How long a process short of room waits for other processes' context starts to bring
/// their reservations down to what their contexts cost: normally a creation and a listing
/// (milliseconds); a starter stopped or killed mid-way costs a refusal no more than this.
pub const STARTS_SETTLE_WAIT: Duration = MEASURING_WAIT;

/// The longest sleep between two looks at the room while other starts settle.
const SETTLE_PAUSE: Duration = Duration::from_millis(20);

/// A first context being made under a reservation that may stand above its cost: marked
/// in the process's slot (`Region::context_start_begun`) until dropped, so that a process of
/// the slice short of room waits for it to settle instead of being refused.
pub struct StartMark<'a> {
    shared: &'a Shared,
    process: &'a Process,
    device: u8,
    /// Whether the reservation was made (then its end gives room back).
    reserved: bool,
}

impl Drop for StartMark<'_> {
    fn drop(&mut self) {
        self.shared.region.context_start_ended(
            self.process.slot,
            device_id(self.device),
            self.reserved,
        );
    }
}

/// How a process's first context on a device whose cost the slice has measured is reserved
/// ([`reserve_measured_cost`]).
pub enum MeasuredReservation<'a> {
    /// The configured bound (or the figure, if dearer) is reserved: the context is made
    /// alongside other starts, and passes its reservation only if it costs more than the bound.
    Alongside(u64, StartMark<'a>),
    /// Only the figure is reserved, under the slice's turn (`None`: the turn could not be
    /// had within its bounded wait): one such context at a time may pass its reservation
    /// by what it costs beyond the figure.
    InTurn(u64, Option<MeasuringTurn<'a>>),
    /// Not even the figure fits, once other starts settled.
    Refused,
}

/// Reserves for a process's first context on limited device entry `device`, whose cost
/// another process of the slice measured as `cost`. Another process's context may cost
/// more (the driver places more for some flags and environments, and a tenant chooses
/// both), and nothing is known of it until it exists. So a context made alongside others
/// reserves what the operator bounds a context at, `max(cost, bound)`, while it fits; where
/// only `cost` fits, the context waits for the slice's turn, so at most one context of the
/// slice at a time stands above its reservation by more than the bound allows. Either is
/// settled to the context's real cost right after its creation.
pub fn reserve_measured_cost<'a>(
    process: &'a Process,
    shared: &'a Shared,
    device: u8,
    cost: u64,
) -> MeasuredReservation<'a> {
    let id = device_id(device);
    let wide = cost.max(shared.context_bound);
    // Starts made alongside leave the slice room for one more bound: an allocation, or the
    // start in the turn, is not starved by a stream of starts taking each byte that settles.
    // Marked before the charge: whoever sees the reservation also sees why it may shrink.
    let try_alongside = || {
        let usage = shared.region.usage(id);
        let room = usage
            .limit
            .map_or(u64::MAX, |limit| limit.saturating_sub(usage.used));
        if room < wide.saturating_mul(2) {
            return None;
        }
        shared.region.context_start_begun(process.slot, id);
        let mut mark = StartMark {
            shared,
            process,
            device,
            reserved: false,
        };
        mark.reserved = process.ledger.charge(device, wide).is_ok();
        mark.reserved.then_some(mark)
    };
    if let Some(mark) = try_alongside() {
        return MeasuredReservation::Alongside(wide, mark);
    }
    // While waiting for the turn, room for the bound may come back (other starts settle).
    let alongside = std::cell::Cell::new(None);
    let turn = lock_for_measuring(shared.region, device, MEASURING_WAIT, || {
        let mark = alongside.take().or_else(try_alongside);
        let still_needed = mark.is_none();
        alongside.set(mark);
        still_needed
    });
    if let Some(mark) = alongside.take() {
        return MeasuredReservation::Alongside(wide, mark);
    }
    let turn = match turn {
        Turn::Held(turn) => Some(turn),
        Turn::NotNeeded | Turn::GaveUp => None,
    };
    // Waits while other starts settle; a refusal is counted.
    if charge_or_refuse(process, device, cost).is_ok() {
        MeasuredReservation::InTurn(cost, turn)
    } else {
        MeasuredReservation::Refused
    }
}

/// Charges `bytes` on limited device entry `device`, waiting while it does not fit and
/// another process of the slice is starting a context under a reservation that may shrink
/// (at most [`STARTS_SETTLE_WAIT`]). False: it does not fit, and no start is settling that
/// might make room (nothing charged).
pub fn wait_for_starts_to_settle(
    process: &Process,
    shared: &Shared,
    device: u8,
    bytes: u64,
) -> bool {
    let id = device_id(device);
    let deadline = Instant::now() + STARTS_SETTLE_WAIT;
    let mut pause = Duration::from_micros(500);
    loop {
        if process.ledger.charge(device, bytes).is_ok() {
            return true;
        }
        if !shared.region.context_starts_elsewhere(process.slot, id) || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(SETTLE_PAUSE);
    }
}

/// Why a context was refused, for [`refusal_line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A context costs this much here (measured) and it does not fit.
    Measured(u64),
    /// The cost could not be measured and the configured bound does not fit.
    Unmeasured { bound: u64 },
    /// The slice has no room at all (the cost is not known yet).
    Full,
}

/// The one line that says why a context was refused: what a context costs on this card,
/// what the slice holds, and the setting to change only where changing it is the way out
/// (the limit when the context is bigger than the whole slice; the bound when the cost
/// could not be measured).
pub fn refusal_line(
    device: &str,
    why: Refused,
    limit: u64,
    used: u64,
    limit_origin: &str,
    bound_setting: &str,
) -> String {
    let size = format_size_approx;
    let holds = format!(
        "the slice's limit is {}, {} of it in use",
        size(limit),
        size(used)
    );
    match why {
        Refused::Measured(cost) if cost > limit => format!(
            "refusing a context on device {device}: a context costs {} on this card, more than the slice's whole limit of {}; raise the device's memory limit ({limit_origin})",
            size(cost),
            size(limit)
        ),
        Refused::Measured(cost) => format!(
            "refusing a context on device {device}: a context costs {} on this card and {holds}",
            size(cost)
        ),
        Refused::Unmeasured { bound } => format!(
            "refusing a context on device {device}: what a context costs on this card could not be measured (NVML could not tell), so the {} bound is charged and {holds}; set {bound_setting} to the card's per-context cost",
            size(bound)
        ),
        Refused::Full => format!("refusing a context on device {device}: {holds}"),
    }
}

/// Once per device and process the refusal goes out at the default level (error); repeats
/// (a program retrying in a loop) only at debug, so the line stays bounded. Survives fork (a
/// fork child refused again says it at debug).
static SAID: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// Logs why a context on limited device entry `device` was refused.
pub fn log_refusal(shared: &Shared, device: u8, why: Refused) {
    let id = device_id(device);
    let usage = shared.region.usage(id);
    let (origin, bound_setting) = match &shared.config.source {
        ConfigSource::File(path) if crate::session::mode::anchored() => (
            format!("limit file {}", path.display()),
            format!("\"context_overhead\" in the limit file {}", path.display()),
        ),
        ConfigSource::File(path) => (
            format!("limit file {}", path.display()),
            format!(
                "{CONTEXT_BOUND_ENV} (or \"context_overhead\" in the limit file {})",
                path.display()
            ),
        ),
        ConfigSource::Env => (
            HAMI_MEMORY_LIMIT_ENV.to_string(),
            CONTEXT_BOUND_ENV.to_string(),
        ),
    };
    let line = refusal_line(
        &shared.region.device_uuid(id),
        why,
        usage.limit.unwrap_or(u64::MAX),
        usage.used,
        &origin,
        &bound_setting,
    );
    let first = SAID
        .get(device as usize)
        .is_some_and(|said| !said.swap(true, Ordering::Relaxed));
    if first {
        crate::log_error!("{line}");
    } else {
        crate::log_debug!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn one_measurer_per_device_and_the_turn_goes_with_its_holder() {
        let dir = std::env::temp_dir().join(format!("gpuslice-measuring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("slice.region");
        let region = Region::open_or_create(&path).unwrap();
        let other = Region::open_or_create(&path).unwrap();
        let short = Duration::from_millis(30);
        let take = |region, device| match lock_for_measuring(region, device, short, || true) {
            Turn::Held(turn) => Some(turn),
            Turn::GaveUp => None,
            Turn::NotNeeded => unreachable!("always needed"),
        };
        let held = take(&region, 3).expect("a free turn is taken");
        // Another open region (another process) must wait, and gives up after the wait; a
        // second thread of the holder is not given it either; devices are independent.
        assert!(take(&other, 3).is_none());
        assert!(take(&region, 3).is_none());
        assert!(take(&other, 4).is_some());
        // A waiter stops waiting as soon as what it needed is published (by the holder,
        // before it gives the turn back), without taking the turn.
        let published = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let needed = || !published.load(std::sync::atomic::Ordering::SeqCst);
                matches!(
                    lock_for_measuring(&other, 3, Duration::from_secs(600), needed),
                    Turn::NotNeeded
                )
            });
            published.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(held);
            assert!(
                waiter.join().unwrap(),
                "the waiter took the turn or gave up"
            );
        });
        assert!(take(&other, 3).is_some());
        drop((region, other));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_context_bigger_than_the_slice_points_at_the_limit_only() {
        let line = refusal_line(
            "GPU-1",
            Refused::Measured(300 * MIB),
            256 * MIB,
            0,
            "limit file /etc/l.json",
            CONTEXT_BOUND_ENV,
        );
        assert!(
            line.contains("300 MiB") && line.contains("256 MiB"),
            "{line}"
        );
        assert!(line.contains("/etc/l.json"), "{line}");
        assert!(!line.contains(CONTEXT_BOUND_ENV), "{line}");
    }

    #[test]
    fn a_full_slice_says_what_it_holds_and_names_no_setting() {
        let line = refusal_line(
            "GPU-1",
            Refused::Measured(300 * MIB),
            1024 * MIB,
            900 * MIB,
            "limit file /etc/l.json",
            CONTEXT_BOUND_ENV,
        );
        assert!(
            line.contains("300 MiB") && line.contains("900 MiB"),
            "{line}"
        );
        assert!(line.contains("1 GiB"), "{line}");
        assert!(!line.contains("/etc/l.json") && !line.contains(CONTEXT_BOUND_ENV));
        let full = refusal_line(
            "GPU-1",
            Refused::Full,
            1024 * MIB,
            1024 * MIB,
            "x",
            CONTEXT_BOUND_ENV,
        );
        assert!(
            !full.contains(CONTEXT_BOUND_ENV) && !full.contains(" x"),
            "{full}"
        );
    }

    #[test]
    fn an_unmeasured_cost_points_at_the_bound() {
        let line = refusal_line(
            "GPU-1",
            Refused::Unmeasured { bound: 512 * MIB },
            400 * MIB,
            0,
            "limit file /etc/l.json",
            CONTEXT_BOUND_ENV,
        );
        assert!(
            line.contains(CONTEXT_BOUND_ENV) && line.contains("512 MiB"),
            "{line}"
        );
    }
}
