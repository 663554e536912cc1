//! When this process asks the slice to look for its dead (the region's sweep: a death found
//! once, by one process, and told to all; `gpuslice_common::region`, module `deaths`), and
//! the one line a reap writes.
//!
//! The reason a memory view gives: the card's free memory went up since this process's last
//! view of that device by more than this process gave back itself meanwhile (memory went back
//! to the driver: a dead process's, maybe), per source (CUDA's and NVML's figures differ by
//! NVML's reservation). The sweep then runs in the first view of any process of the slice
//! that finds it due (at most one per `SWEEP_INTERVAL` for the whole slice). A process's
//! first view, unless a sweep began after the process started ([`started`]), sweeps the whole
//! slice when a sweep is wanted (its first look at a device found more free memory than the
//! slice last saw: the region's `card_free_seen`), else its start's share (the whole of a
//! small slice). A view where nothing was given back costs
//! three loads and a compare: the same whatever the number of processes in the slice. A
//! refused allocation sweeps at once ([`now`]).

use std::sync::atomic::{AtomicU64, Ordering};

use gpuslice_common::region::{ReapReport, RegionError, SweepReason, MAX_DEVICES};

use super::region_budget::device_id;
use super::{driver_sized, Shared};
use crate::session::fork::per_process;

/// Where a view's figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Cuda = 0,
    Nvml = 1,
}

/// No view of the device yet in this process.
const UNSEEN: u64 = u64::MAX;

per_process! {
    /// The card's free bytes at this process's last view, per source and device entry.
    static CARD_FREE: [[AtomicU64; MAX_DEVICES]; 2] =
        [const { [const { AtomicU64::new(UNSEEN) }; MAX_DEVICES] }; 2];
}
per_process! {
    /// This process's own bytes on the device entry at its last view that found the card's
    /// free bytes changed, per source: what its own frees gave back since is no reason to sweep.
    static OWN_USED: [[AtomicU64; MAX_DEVICES]; 2] =
        [const { [const { AtomicU64::new(0) }; MAX_DEVICES] }; 2];
}
per_process! {
    /// When this process attached, until its first view found a sweep that began after it
    /// (0 = found).
    static STARTED_AT_NS: AtomicU64 = AtomicU64::new(0);
}

/// This process attached to the slice now: its first view must not count processes that
/// died before.
pub fn started() {
    STARTED_AT_NS.store(crate::session::clock::now_ns(), Ordering::Relaxed);
}

/// A view of limited device entry `device` read the card's `free` bytes from `source`: more
/// than at this process's last view, by more than this process gave back itself meanwhile,
/// asks the slice for a sweep; a due sweep runs.
#[inline]
pub fn card_seen(shared: &Shared, source: Source, device: u8, free: u64) {
    if let Some(cell) = CARD_FREE[source as usize].get(device as usize) {
        let before = cell.load(Ordering::Relaxed);
        if before != free {
            cell.store(free, Ordering::Relaxed);
            card_changed(shared, source, device, before, free);
        }
    }
    if_due(shared);
}

/// The card's free bytes moved from `before` to `free` since this process's last view (or
/// this is its first view of the device: the slice's last figure stands for its own). Out of
/// line: a view that finds the card as it was stays a few instructions.
#[inline(never)]
fn card_changed(shared: &Shared, source: Source, device: u8, before: u64, free: u64) {
    let slice_before = shared
        .region
        .card_free_seen(device_id(device), source as usize, free);
    let own = super::process().map_or(0, |p| shared.region.slot_used(p.slot, device_id(device)));
    let own_before = OWN_USED[source as usize]
        .get(device as usize)
        .map_or(own, |cell| cell.swap(own, Ordering::Relaxed));
    let went_back = if before == UNSEEN {
        slice_before != 0 && free > slice_before
    } else {
        free > before && free - before > own_before.saturating_sub(own)
    };
    if went_back {
        shared.region.want_sweep(SweepReason::CardGotMemoryBack);
    }
}

/// Runs the slice's sweep if one is due (this process's first look, or one wanted and
/// `SWEEP_INTERVAL` past the last), with no card reading of its own.
#[inline]
pub fn if_due(shared: &Shared) {
    let started = STARTED_AT_NS.load(Ordering::Relaxed);
    if started != 0 {
        first_view(shared, started);
    }
    if let Some(report) = shared
        .region
        .sweep_if_due(|dead| driver_sized::driver_released(shared, dead))
    {
        log_reap(report);
    }
}

/// The first view of this process: unless a sweep began after it started (one that saw every
/// death before it), sweeps the whole slice when a sweep is wanted (the card has more free
/// memory than the slice last saw, say), else its start's share (all of a small slice).
#[cold]
fn first_view(shared: &Shared, started: u64) {
    if !shared.region.swept_since(started) {
        if shared.region.sweep_wanted() {
            now(shared);
        } else {
            log_reap(
                shared
                    .region
                    .sweep_start_share(started, |dead| driver_sized::driver_released(shared, dead)),
            );
        }
    }
    STARTED_AT_NS.store(0, Ordering::Relaxed);
}

/// Sweeps now (before refusing an allocation: a dead process's budget may be what stands in
/// the way).
pub fn now(shared: &Shared) {
    log_reap(
        shared
            .region
            .sweep_now(|dead| driver_sized::driver_released(shared, dead)),
    );
}

/// One line per reap that gave bytes back; the dead still held at debug level.
pub fn log_reap(report: Result<ReapReport, RegionError>) {
    match report {
        Ok(report) => {
            if !report.reclaimed.is_empty() {
                crate::log_info!(
                    "reclaimed {} bytes of dead processes {:?}",
                    report.bytes_reclaimed(),
                    report.reclaimed.iter().map(|r| r.pid).collect::<Vec<_>>()
                );
            }
            if !report.pending.is_empty() {
                crate::log_debug!(
                    "dead processes whose memory the driver still holds: {:?}",
                    report.pending
                );
            }
        }
        Err(e) => crate::log_error!("{e}"),
    }
}
