//! The token bucket, as plain functions over atomics (no FFI, no clock: `now` is passed in).
//!
//! Tokens are GPU-time nanoseconds. The shared bucket is a GCRA ("virtual scheduling") word:
//! `vtime` is the wall-clock instant (CLOCK_MONOTONIC ns) up to which the refill has already
//! been promised to launches. Refill runs at `rate` GPU-ns per wall-ns, stored as its inverse
//! `inv_rate` (wall-ns per GPU-ns, 32.32 fixed point) so the launch path multiplies instead of
//! divides. A reservation of `gpu_ns` tokens at `now`:
//!
//! ```text
//! start = max(vtime, now - tolerance)     // an idle bucket holds at most `tolerance` of refill
//! vtime = start + gpu_ns * inv_rate       // one CAS; all processes of the slice share the word
//! ```
//!
//! The caller may go at `start` (at once when `start <= now`, else it sleeps until then), so
//! reservations are served in order, whoever makes them, with no lock and no polling. Over any
//! interval T the tokens handed out are at most `(T + tolerance) * rate`.
//!
//! When the leader changes the rate, the refill already promised beyond now is rescaled to the
//! new rate, in the word ([`rescale_lead`]) and in every sleeper's own reservation
//! ([`rescaled_due`]): a reservation is a number of tokens, not a wall-clock slot.
//!
//! Each process spends a small local credit (a "chunk" reserved from the shared word) so the
//! common launch touches only process-local memory; see [`Credit`].

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// 32.32 fixed point.
pub const FIXED_ONE: u64 = 1 << 32;

/// `rate` (GPU-ns per wall-ns, > 0) as the fixed-point inverse the bucket stores.
pub fn inv_rate_fixed(rate: f64) -> u64 {
    let rate = rate.clamp(1e-4, 1e4);
    ((1.0 / rate) * FIXED_ONE as f64).round().max(1.0) as u64
}

/// Wall nanoseconds of refill that `gpu_ns` tokens take at `inv_rate`.
#[inline]
pub fn wall_ns(gpu_ns: u64, inv_rate: u64) -> u64 {
    ((gpu_ns as u128 * inv_rate as u128) >> 32).min(u64::MAX as u128) as u64
}

/// GPU nanoseconds of tokens that `wall` ns of refill bring at `inv_rate`.
#[inline]
pub fn gpu_ns(wall: u64, inv_rate: u64) -> u64 {
    ((wall as u128) << 32)
        .checked_div(inv_rate.max(1) as u128)
        .unwrap_or(0)
        .min(u64::MAX as u128) as u64
}

/// Reserves `gpu_ns` tokens on the shared word at `now`; returns the instant the caller may
/// proceed (`<= now`: at once).
#[inline]
pub fn reserve(vtime: &AtomicU64, now: u64, gpu: u64, inv_rate: u64, tolerance: u64) -> u64 {
    let cost = wall_ns(gpu, inv_rate);
    let floor = now.saturating_sub(tolerance);
    let mut current = vtime.load(Ordering::Relaxed);
    loop {
        let start = current.max(floor);
        match vtime.compare_exchange_weak(
            current,
            start.saturating_add(cost),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return start,
            Err(seen) => current = seen,
        }
    }
}

/// `lead` wall-ns of refill promised at `old_inv`, as wall-ns at `new_inv` (the same tokens).
#[inline]
fn rescale(lead: u64, old_inv: u64, new_inv: u64) -> u64 {
    ((lead as u128 * new_inv as u128) / old_inv.max(1) as u128).min(u64::MAX as u128) as u64
}

/// The rate changed from `old_inv` to `new_inv` at `now`: the refill already promised beyond
/// `now` (reservations not yet due) is the same tokens at the new rate, so the word's lead is
/// scaled by `new_inv / old_inv`. Without this, a slice whose rate rose kept serving the
/// reservations made at the old rate: twenty processes that each reserved a chunk at a rate
/// eight times lower waited half a second for refill the new rate brings in 60 ms, and the
/// controller, seeing the slice idle, wound its correction up to the limit (the compute-only
/// slice of 20 processes swung between 4 % and 100 % of the device).
pub fn rescale_lead(vtime: &AtomicU64, now: u64, old_inv: u64, new_inv: u64) {
    if old_inv == new_inv {
        return;
    }
    let _ = vtime.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |current| {
        (current > now).then(|| now.saturating_add(rescale(current - now, old_inv, new_inv)))
    });
}

/// A sleeper's own reservation under the same change, seen at `now`: due at `due` at
/// `seen_inv`, due when the new rate brings the same tokens at `new_inv`.
pub fn rescaled_due(due: u64, now: u64, seen_inv: u64, new_inv: u64) -> u64 {
    if due <= now || seen_inv == new_inv {
        return due;
    }
    now.saturating_add(rescale(due - now, seen_inv, new_inv))
}

/// Puts the word back to `now` when it lies more than `max_lead` ahead of it: no share and
/// cost the throttle uses promises that much refill, so the word is from another clock (the
/// region file outlived a reboot, and CLOCK_MONOTONIC restarted) or corrupt. Without this
/// every launch of the slice would sleep until the old clock's instant. `true` = repaired.
pub fn repair_lead(vtime: &AtomicU64, now: u64, max_lead: u64) -> bool {
    let current = vtime.load(Ordering::Relaxed);
    current > now.saturating_add(max_lead)
        && vtime
            .compare_exchange(current, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
}

/// Charges (`gpu > 0`) or refunds (`gpu < 0`) tokens on the shared word after the fact: the
/// launches they concern were debited at a cost estimate that has since changed. A charge
/// starts from `now - tolerance` at the earliest (an idle bucket's refill pays first); a
/// refund never moves the word below that floor (it could not be spent anyway).
pub fn adjust(vtime: &AtomicU64, now: u64, gpu: i64, inv_rate: u64, tolerance: u64) {
    let wall = wall_ns(gpu.unsigned_abs(), inv_rate);
    let floor = now.saturating_sub(tolerance);
    let _ = vtime.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |current| {
        Some(if gpu >= 0 {
            current.max(floor).saturating_add(wall)
        } else {
            current.saturating_sub(wall).max(floor.min(current))
        })
    });
}

/// A process's local credit on one device, in GPU-ns. A launch debits its estimated cost; it
/// goes ahead while the credit before the debit was positive (so one launch may overdraw, the
/// debt is repaid by the next chunk). When the credit is exhausted the caller reserves a chunk
/// from the shared bucket ([`Credit::refill_amount`]) and adds it back once its time came.
#[derive(Debug, Default)]
pub struct Credit {
    credit: AtomicI64,
}

impl Credit {
    pub const fn new() -> Credit {
        Credit {
            credit: AtomicI64::new(0),
        }
    }

    /// Debits `cost`; `true` = covered by the credit (fast path, no clock, no shared memory).
    #[inline]
    pub fn try_spend(&self, cost: u64) -> bool {
        let cost = cost.min(i64::MAX as u64) as i64;
        self.credit.fetch_sub(cost, Ordering::Relaxed) > 0
    }

    /// Debits `cost` (the caller saw the credit positive just before).
    #[inline]
    pub fn debit(&self, cost: u64) {
        let cost = cost.min(i64::MAX as u64) as i64;
        self.credit.fetch_sub(cost, Ordering::Relaxed);
    }

    /// How much to reserve after a failed `try_spend`: one chunk plus whatever is owed.
    #[inline]
    pub fn refill_amount(&self, chunk: u64) -> u64 {
        let owed = (-self.credit.load(Ordering::Relaxed)).max(0) as u64;
        chunk.saturating_add(owed)
    }

    /// Adds tokens whose time has come.
    #[inline]
    pub fn add(&self, gpu: u64) {
        self.credit
            .fetch_add(gpu.min(i64::MAX as u64) as i64, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        self.credit.store(0, Ordering::Relaxed);
    }

    pub fn value(&self) -> i64 {
        self.credit.load(Ordering::Relaxed)
    }
}

/// The GPU-ns one launch debits from a [`Credit`], kept at most `i64::MAX` (the credit is
/// signed) by every store, so the launch's debit needs no clamp of its own.
#[derive(Debug, Default)]
pub struct LaunchCost(AtomicU64);

impl LaunchCost {
    pub const fn new(gpu: u64) -> LaunchCost {
        LaunchCost(AtomicU64::new(at_most_i64(gpu)))
    }

    #[inline]
    pub fn set(&self, gpu: u64) {
        self.0.store(at_most_i64(gpu), Ordering::Relaxed);
    }

    /// The cost, at most `i64::MAX`: the mask removes nothing any store left, it tells the
    /// compiler so (the debit's own clamp then costs nothing).
    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed) & i64::MAX as u64
    }
}

const fn at_most_i64(gpu: u64) -> u64 {
    if gpu > i64::MAX as u64 {
        i64::MAX as u64
    } else {
        gpu
    }
}

/// Host PIDs of the slice's processes on one device, packed two per word in the shared
/// throttle words (0 = empty). Lock-free insert; eviction drops PIDs the driver no longer lists.
pub struct PidTable<'a> {
    words: &'a [AtomicU64],
}

impl<'a> PidTable<'a> {
    pub fn new(words: &'a [AtomicU64]) -> PidTable<'a> {
        PidTable { words }
    }

    pub fn capacity(&self) -> usize {
        self.words.len() * 2
    }

    pub fn pids(&self) -> Vec<u32> {
        self.words
            .iter()
            .flat_map(|w| {
                let v = w.load(Ordering::Acquire);
                [v as u32, (v >> 32) as u32]
            })
            .filter(|&p| p != 0)
            .collect()
    }

    pub fn contains(&self, pid: u32) -> bool {
        self.pids().contains(&pid)
    }

    /// Inserts `pid` (no-op when present). `false` = the table is full.
    pub fn insert(&self, pid: u32) -> bool {
        if pid == 0 || self.contains(pid) {
            return true;
        }
        for word in self.words {
            let mut current = word.load(Ordering::Acquire);
            loop {
                let (low, high) = (current as u32, (current >> 32) as u32);
                if low == pid || high == pid {
                    return true;
                }
                let next = if low == 0 {
                    current | u64::from(pid)
                } else if high == 0 {
                    current | (u64::from(pid) << 32)
                } else {
                    break;
                };
                match word.compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return true,
                    Err(seen) => current = seen,
                }
            }
        }
        false
    }

    /// Removes every PID for which `keep` is false.
    pub fn retain(&self, keep: impl Fn(u32) -> bool) {
        for word in self.words {
            let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                let low = v as u32;
                let high = (v >> 32) as u32;
                let low = if low != 0 && keep(low) { low } else { 0 };
                let high = if high != 0 && keep(high) { high } else { 0 };
                Some(u64::from(low) | (u64::from(high) << 32))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_rate_change_rescales_the_refill_already_promised_and_only_that() {
        let one = FIXED_ONE; // rate 1
        let eighth = 8 * FIXED_ONE; // rate 1/8
        let word = AtomicU64::new(1_000 + 800);
        // The rate rises eightfold at 1_000: 800 ns of promised refill are now 100.
        rescale_lead(&word, 1_000, eighth, one);
        assert_eq!(word.load(Ordering::Relaxed), 1_100);
        // And falls back: 100 ns become 800 again.
        rescale_lead(&word, 1_000, one, eighth);
        assert_eq!(word.load(Ordering::Relaxed), 1_800);
        // A word in the past promises nothing; it stays.
        let idle = AtomicU64::new(500);
        rescale_lead(&idle, 1_000, eighth, one);
        assert_eq!(idle.load(Ordering::Relaxed), 500);
        // A sleeper's own reservation moves the same way; a due one does not move.
        assert_eq!(rescaled_due(1_800, 1_000, eighth, one), 1_100);
        assert_eq!(rescaled_due(900, 1_000, eighth, one), 900);
        assert_eq!(rescaled_due(1_800, 1_000, one, one), 1_800);
        // Extreme values saturate instead of wrapping.
        assert_eq!(rescaled_due(u64::MAX, 0, 1, u64::MAX), u64::MAX);
    }

    #[test]
    fn fixed_point_round_trips() {
        let inv = inv_rate_fixed(0.25);
        assert_eq!(wall_ns(1_000, inv), 4_000);
        assert_eq!(gpu_ns(4_000, inv), 1_000);
        let inv = inv_rate_fixed(1.0);
        assert_eq!(inv, FIXED_ONE);
        assert_eq!(wall_ns(7, inv), 7);
    }

    #[test]
    fn an_idle_bucket_grants_at_most_its_tolerance_then_paces_at_the_rate() {
        let vtime = AtomicU64::new(0);
        let inv = inv_rate_fixed(0.5); // 50 %: 1 ms of GPU time per 2 ms of wall time
        let now = 1_000 * MS;
        // 20 ms of tolerance at 50 % = 10 ms of GPU time available at once.
        let mut granted_now = 0;
        let mut start = 0;
        for _ in 0..30 {
            start = reserve(&vtime, now, MS, inv, 20 * MS);
            if start <= now {
                granted_now += 1;
            }
        }
        assert_eq!(granted_now, 11, "starts at now-20ms, now-18ms, ..., now");
        // The 30th launch (20 beyond the burst) may start 20 x 2 ms after `now`... minus the
        // first slot's lead: the schedule is contiguous from now - tolerance.
        assert_eq!(start, now - 20 * MS + 29 * 2 * MS);
        // Long-run rate: 1000 reservations of 1 ms each span 2000 ms of wall time.
        let vtime = AtomicU64::new(0);
        let first = reserve(&vtime, now, MS, inv, 0);
        let mut last = first;
        for _ in 1..1000 {
            last = reserve(&vtime, now, MS, inv, 0);
        }
        assert_eq!(last - first, 999 * 2 * MS);
    }

    #[test]
    fn time_passing_refills_up_to_the_tolerance_only() {
        let vtime = AtomicU64::new(0);
        let inv = inv_rate_fixed(1.0);
        let t0 = 10_000 * MS;
        assert!(reserve(&vtime, t0, 5 * MS, inv, 5 * MS) <= t0);
        assert!(reserve(&vtime, t0, 5 * MS, inv, 5 * MS) <= t0);
        assert!(reserve(&vtime, t0, MS, inv, 5 * MS) > t0, "bucket empty");
        // A long idle period does not bank more than the tolerance.
        let later = t0 + 10_000 * MS;
        assert!(reserve(&vtime, later, 5 * MS, inv, 5 * MS) <= later);
        assert!(reserve(&vtime, later, MS, inv, 5 * MS) == later);
        assert!(reserve(&vtime, later, MS, inv, 5 * MS) > later);
    }

    #[test]
    fn adjust_charges_from_the_floor_and_refunds_no_further_than_it() {
        let inv = inv_rate_fixed(0.5);
        let now = 1_000 * MS;
        let vtime = AtomicU64::new(0);
        adjust(&vtime, now, MS as i64, inv, 10 * MS);
        assert_eq!(vtime.load(Ordering::Relaxed), now - 10 * MS + 2 * MS);
        adjust(&vtime, now, 4 * MS as i64, inv, 10 * MS);
        assert_eq!(vtime.load(Ordering::Relaxed), now);
        adjust(&vtime, now, -(MS as i64), inv, 10 * MS);
        assert_eq!(vtime.load(Ordering::Relaxed), now - 2 * MS);
        adjust(&vtime, now, -(100 * MS as i64), inv, 10 * MS);
        assert_eq!(vtime.load(Ordering::Relaxed), now - 10 * MS);
    }

    #[test]
    fn a_lead_beyond_the_plausible_is_put_back_to_now_and_a_normal_one_is_kept() {
        let now = 5_000 * MS;
        let vtime = AtomicU64::new(now + 59_000 * MS);
        assert!(!repair_lead(&vtime, now, 60_000 * MS));
        assert_eq!(vtime.load(Ordering::Relaxed), now + 59_000 * MS);
        // A region written before a reboot: the old clock's instant, days ahead of now.
        let vtime = AtomicU64::new(now + 3 * 86_400_000 * MS);
        assert!(repair_lead(&vtime, now, 60_000 * MS));
        assert_eq!(vtime.load(Ordering::Relaxed), now);
        assert!(reserve(&vtime, now, MS, inv_rate_fixed(0.5), 0) <= now);
    }

    #[test]
    fn credit_overdraws_by_one_launch_and_refill_repays_the_debt() {
        let credit = Credit::new();
        assert!(!credit.try_spend(100), "starts empty");
        assert_eq!(credit.refill_amount(1_000), 1_100);
        credit.add(1_100);
        assert!(credit.try_spend(600));
        assert!(credit.try_spend(600), "positive before the debit: goes");
        assert_eq!(credit.value(), -200);
        assert!(!credit.try_spend(10));
        assert_eq!(credit.refill_amount(1_000), 1_210);
    }

    #[test]
    fn pid_table_inserts_dedups_fills_and_evicts() {
        let words: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        let table = PidTable::new(&words);
        assert_eq!(table.capacity(), 4);
        assert!(table.insert(10));
        assert!(table.insert(10));
        assert!(table.insert(11));
        assert!(table.insert(12));
        assert!(table.insert(13));
        assert!(!table.insert(14), "full");
        let mut pids = table.pids();
        pids.sort_unstable();
        assert_eq!(pids, vec![10, 11, 12, 13]);
        table.retain(|p| p % 2 == 0);
        let mut pids = table.pids();
        pids.sort_unstable();
        assert_eq!(pids, vec![10, 12]);
        assert!(table.insert(14));
        assert!(table.contains(14));
    }
}
