//! Utilisation history: rings of 1 ms buckets recording how many ns of each bucket a device
//! (or one process on it) was busy, so busy time over any recent window can be computed.
//!
//! Each bucket is one `AtomicU64` packing `epoch << 24 | busy_ns`, where `epoch` is the bucket's
//! absolute index (`ns / BUCKET_NS`). Packing the epoch in makes reuse safe without clearing:
//! a reader only counts a bucket whose epoch is the one it asked for, and a writer replaces a
//! bucket that holds an older epoch. A bucket holds at most 1 ms = 1e6 ns < 2^24.
//!
//! Kernels are enqueued ahead of time (launches are asynchronous), so intervals may lie in the
//! future. Writes are accepted up to `FUTURE_BUCKETS` ahead of now; that keeps every future
//! bucket at least `HISTORY_BUCKETS` away from any bucket a query may still read. Work
//! enqueued further ahead than that is not recorded (a documented gap).

use std::sync::atomic::{AtomicU64, Ordering};

pub const BUCKET_NS: u64 = 1_000_000;
/// Buckets per ring (8.192 s).
pub const RING: usize = 8192;
/// How far back queries can see: 4.096 s.
pub const HISTORY_BUCKETS: u64 = 4096;
/// How far ahead writes are recorded.
pub const FUTURE_BUCKETS: u64 = RING as u64 - HISTORY_BUCKETS - 1;
pub const HISTORY_NS: u64 = HISTORY_BUCKETS * BUCKET_NS;

const BUSY_BITS: u32 = 24;
const BUSY_MASK: u64 = (1 << BUSY_BITS) - 1;

#[inline]
fn epoch_of(v: u64) -> u64 {
    v >> BUSY_BITS
}

/// Adds `busy` ns to bucket `epoch`, replacing an older epoch's content, dropping the write
/// if a newer epoch already owns the slot.
#[inline]
fn add_bucket(ring: &[AtomicU64], epoch: u64, busy: u64) {
    let slot = &ring[(epoch % RING as u64) as usize];
    let mut cur = slot.load(Ordering::Relaxed);
    loop {
        let next = match epoch_of(cur).cmp(&epoch) {
            std::cmp::Ordering::Equal => {
                (epoch << BUSY_BITS) | ((cur & BUSY_MASK) + busy).min(BUCKET_NS)
            }
            std::cmp::Ordering::Less => (epoch << BUSY_BITS) | busy.min(BUCKET_NS),
            std::cmp::Ordering::Greater => return,
        };
        match slot.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(v) => cur = v,
        }
    }
}

#[inline]
fn read_bucket(ring: &[AtomicU64], epoch: u64) -> u64 {
    let v = ring[(epoch % RING as u64) as usize].load(Ordering::Relaxed);
    if epoch_of(v) == epoch {
        v & BUSY_MASK
    } else {
        0
    }
}

/// Records the busy interval `[start, end)` into `ring`; `now` bounds how far ahead it writes.
pub fn record(ring: &[AtomicU64], start: u64, end: u64, now: u64) {
    debug_assert_eq!(ring.len(), RING);
    let limit = (now / BUCKET_NS + FUTURE_BUCKETS + 1) * BUCKET_NS;
    let end = end.min(limit);
    let mut t = start;
    while t < end {
        let epoch = t / BUCKET_NS;
        let bucket_end = (epoch + 1) * BUCKET_NS;
        let piece_end = end.min(bucket_end);
        add_bucket(ring, epoch, piece_end - t);
        t = piece_end;
    }
}

/// Busy ns within `[from, to)`. Buckets only partly inside the window count pro rata (the
/// position of busy time inside a bucket is not kept). Only the last `HISTORY_NS` before `now`
/// (and the recorded future) can be seen; earlier parts of the window count as idle.
pub fn busy_between(ring: &[AtomicU64], from: u64, to: u64, now: u64) -> u64 {
    let oldest = (now / BUCKET_NS).saturating_sub(HISTORY_BUCKETS - 1) * BUCKET_NS;
    let newest = (now / BUCKET_NS + FUTURE_BUCKETS + 1) * BUCKET_NS;
    let from = from.max(oldest);
    let to = to.min(newest);
    if from >= to {
        return 0;
    }
    let mut total = 0u64;
    let mut epoch = from / BUCKET_NS;
    while epoch * BUCKET_NS < to {
        let b_start = epoch * BUCKET_NS;
        let b_end = b_start + BUCKET_NS;
        let overlap = to.min(b_end) - from.max(b_start);
        let busy = read_bucket(ring, epoch);
        total += if overlap == BUCKET_NS {
            busy
        } else {
            busy * overlap / BUCKET_NS
        };
        epoch += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Vec<AtomicU64> {
        (0..RING).map(|_| AtomicU64::new(0)).collect()
    }

    const T0: u64 = 1_000_000 * BUCKET_NS; // an arbitrary "boot + 1000 s"

    #[test]
    fn whole_and_partial_buckets() {
        let r = ring();
        // 2.5 ms of work starting exactly on a bucket edge.
        record(&r, T0, T0 + 2_500_000, T0);
        assert_eq!(busy_between(&r, T0, T0 + 3 * BUCKET_NS, T0), 2_500_000);
        assert_eq!(busy_between(&r, T0, T0 + BUCKET_NS, T0), BUCKET_NS);
        // Half of the third bucket's window: pro rata of its 0.5 ms.
        assert_eq!(
            busy_between(&r, T0 + 2 * BUCKET_NS, T0 + 2 * BUCKET_NS + 500_000, T0),
            250_000
        );
        assert_eq!(
            busy_between(&r, T0 + 3 * BUCKET_NS, T0 + 9 * BUCKET_NS, T0),
            0
        );
    }

    #[test]
    fn adds_up_and_saturates_per_bucket() {
        let r = ring();
        for i in 0..10 {
            record(&r, T0 + i * 100_000, T0 + i * 100_000 + 50_000, T0);
        }
        assert_eq!(busy_between(&r, T0, T0 + BUCKET_NS, T0), 500_000);
        record(&r, T0, T0 + BUCKET_NS, T0);
        assert_eq!(busy_between(&r, T0, T0 + BUCKET_NS, T0), BUCKET_NS);
    }

    #[test]
    fn reused_buckets_do_not_leak_stale_data() {
        let r = ring();
        record(&r, T0, T0 + 10 * BUCKET_NS, T0);
        let later = T0 + RING as u64 * BUCKET_NS; // same slots, one lap later
        assert_eq!(busy_between(&r, later, later + 10 * BUCKET_NS, later), 0);
        record(&r, later, later + BUCKET_NS / 2, later);
        assert_eq!(
            busy_between(&r, later, later + BUCKET_NS, later),
            BUCKET_NS / 2
        );
        // A stale writer for the old epoch cannot clobber the newer bucket.
        record(&r, T0, T0 + BUCKET_NS, later);
        assert_eq!(
            busy_between(&r, later, later + BUCKET_NS, later),
            BUCKET_NS / 2
        );
    }

    #[test]
    fn history_and_future_are_bounded() {
        let r = ring();
        record(&r, T0, T0 + 20 * BUCKET_NS, T0);
        let now = T0 + 10 * BUCKET_NS;
        // Only the last HISTORY_BUCKETS are visible; a window older than that reads idle.
        assert_eq!(
            busy_between(&r, T0, T0 + 20 * BUCKET_NS, now),
            20 * BUCKET_NS
        );
        let much_later = T0 + (HISTORY_BUCKETS + 30) * BUCKET_NS;
        assert_eq!(busy_between(&r, T0, much_later, much_later), 0);
        // A far-future interval is clipped at the write horizon.
        let r = ring();
        record(&r, T0, T0 + 100 * HISTORY_NS, T0);
        let seen = busy_between(&r, T0, T0 + 100 * HISTORY_NS, T0);
        assert_eq!(seen, (FUTURE_BUCKETS + 1) * BUCKET_NS);
    }
}
