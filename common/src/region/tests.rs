//! Single-process tests of the region: ledger arithmetic, device binding, validation of bad
//! files, reaping rules. Multi-process behaviour is in `tests/region_processes.rs`.

use super::devices::stricter_percent;
use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// A temp directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gpuslice-region-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn file(&self) -> PathBuf {
        self.0.join("slice.region")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn me() -> ProcessIdentity {
    ProcessIdentity::current().expect("/proc available")
}

fn limits(uuid: &str, memory: Option<u64>) -> DeviceLimits {
    DeviceLimits {
        uuid: uuid.into(),
        memory_limit: memory,
        compute_percent: None,
    }
}

/// A region with one device limited to `limit` and one registered slot.
fn region_with(dir: &TempDir, limit: Option<u64>) -> (Region, SlotId, DeviceId) {
    let region = Region::open_or_create(&dir.file()).unwrap();
    let device = region.bind_devices(&[limits("GPU-0", limit)]).unwrap().ids[0];
    let slot = region.register(&me()).unwrap();
    (region, slot, device)
}

#[test]
fn new_file_has_the_exact_size_and_a_valid_header() {
    let dir = TempDir::new("new");
    let region = Region::open_or_create(&dir.file()).unwrap();
    assert_eq!(
        std::fs::metadata(dir.file()).unwrap().len(),
        REGION_SIZE as u64
    );
    let bytes = std::fs::read(dir.file()).unwrap();
    assert_eq!(&bytes[..8], b"GPUSLICE");
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        LAYOUT_VERSION
    );
    let snapshot = region.snapshot();
    assert!(snapshot.devices.is_empty() && snapshot.processes.is_empty());
    // A second open validates instead of re-initialising.
    let generation = snapshot.generation;
    let again = Region::open_or_create(&dir.file()).unwrap();
    assert_eq!(again.snapshot().generation, generation);
}

#[test]
fn reserve_within_limit_and_refuse_past_it() {
    let dir = TempDir::new("reserve");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    assert_eq!(region.reserve(slot, device, 60 * MIB), Ok(()));
    assert_eq!(region.reserve(slot, device, 40 * MIB), Ok(()));
    assert_eq!(
        region.reserve(slot, device, 1),
        Err(OverLimit {
            limit: 100 * MIB,
            used: 100 * MIB,
            requested: 1
        })
    );
    assert_eq!(region.usage(device).used, 100 * MIB);
    assert_eq!(region.slot_used(slot, device), 100 * MIB);
    assert_eq!(region.release(slot, device, 60 * MIB), 60 * MIB);
    assert_eq!(
        region.usage(device),
        DeviceUsage {
            limit: Some(100 * MIB),
            used: 40 * MIB
        }
    );
    assert_eq!(region.reserve(slot, device, 60 * MIB), Ok(()));
    let message = region.reserve(slot, device, 1).unwrap_err().to_string();
    assert!(message.contains("exceed"), "{message}");
}

#[test]
fn refused_reservation_changes_nothing_and_overflow_is_refused() {
    let dir = TempDir::new("overflow");
    let (region, slot, device) = region_with(&dir, None);
    assert_eq!(region.usage(device).limit, None);
    // An unlimited device still counts, up to what a ledger word carries (256 TiB).
    let most = ledger::MAX_BYTES;
    assert!(region.reserve(slot, device, u64::MAX - 10).is_err());
    assert_eq!(region.reserve(slot, device, most - 10), Ok(()));
    assert!(region.reserve(slot, device, 11).is_err());
    assert_eq!(region.usage(device).used, most - 10);
    assert_eq!(region.slot_used(slot, device), most - 10);
    region.reserve_past_limit(slot, device, 11);
    assert_eq!(region.usage(device).used, most - 10, "never wraps");
}

#[test]
fn release_saturates_at_zero() {
    let dir = TempDir::new("saturate");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, 10 * MIB).unwrap();
    assert_eq!(region.release(slot, device, 25 * MIB), 10 * MIB);
    assert_eq!(region.usage(device).used, 0);
    assert_eq!(region.slot_used(slot, device), 0);
    assert_eq!(region.release(slot, device, 1), 0);
    assert_eq!(region.usage(device).used, 0);
}

#[test]
fn a_slot_releasing_more_than_it_holds_does_not_take_another_slots_bytes() {
    let dir = TempDir::new("two-slots");
    let (region, a, device) = region_with(&dir, Some(100 * MIB));
    let b = region.register(&me()).unwrap();
    assert_ne!(a, b, "one mapping may hold several registrations (fork)");
    region.reserve(a, device, 30 * MIB).unwrap();
    region.reserve(b, device, 5 * MIB).unwrap();
    assert_eq!(region.release(b, device, 50 * MIB), 5 * MIB);
    assert_eq!(region.usage(device).used, 30 * MIB);
}

#[test]
fn bind_devices_keys_by_uuid_and_the_configuration_wins_when_nobody_else_lives() {
    let dir = TempDir::new("bind");
    let region = Region::open_or_create(&dir.file()).unwrap();
    let first = region
        .bind_devices(&[limits("GPU-a", Some(8 * MIB)), limits("GPU-b", None)])
        .unwrap();
    assert_eq!(first.ids.len(), 2);
    assert_ne!(first.ids[0], first.ids[1]);
    assert!(first.changes.is_empty(), "new entries are not changes");

    // Another process sees the devices in the other order, with a looser memory limit and
    // a compute share for GPU-a. Nobody else is registered: its configuration wins.
    let other = Region::open_or_create(&dir.file()).unwrap();
    let second = other
        .bind_devices(&[
            limits("GPU-b", None),
            DeviceLimits {
                uuid: "GPU-a".into(),
                memory_limit: Some(16 * MIB),
                compute_percent: Some(30),
            },
        ])
        .unwrap();
    assert_eq!(second.ids, vec![first.ids[1], first.ids[0]]);
    assert_eq!(
        second.changes,
        vec![LimitChange {
            uuid: "GPU-a".into(),
            old_memory_limit: Some(8 * MIB),
            configured_memory_limit: Some(16 * MIB),
            new_memory_limit: Some(16 * MIB),
            old_compute_percent: None,
            configured_compute_percent: Some(30),
            new_compute_percent: Some(30),
        }]
    );
    assert_eq!(region.usage(first.ids[0]).limit, Some(16 * MIB));
    assert_eq!(region.compute_percent(first.ids[0]), Some(30));
    let snapshot = region.snapshot();
    assert_eq!(snapshot.devices.len(), 2);
    assert_eq!(snapshot.devices[0].uuid, "GPU-a");
    assert!(snapshot.generation > 1);
}

#[test]
fn while_others_live_the_stricter_limit_stays_in_force() {
    let dir = TempDir::new("bind-live");
    let (region, _slot, device) = region_with(&dir, Some(8 * MIB));
    // A process with no limit configured (an ssh session without the env) cannot lift it.
    let loose = Region::open_or_create(&dir.file()).unwrap();
    let binding = loose.bind_devices(&[limits("GPU-0", None)]).unwrap();
    assert_eq!(binding.changes.len(), 1);
    assert_eq!(binding.changes[0].configured_memory_limit, None);
    assert_eq!(binding.changes[0].new_memory_limit, Some(8 * MIB));
    assert_eq!(region.usage(device).limit, Some(8 * MIB));
    // A tighter one applies at once, compute included.
    let tight = loose
        .bind_devices(&[DeviceLimits {
            uuid: "GPU-0".into(),
            memory_limit: Some(4 * MIB),
            compute_percent: Some(50),
        }])
        .unwrap();
    assert_eq!(tight.changes[0].new_memory_limit, Some(4 * MIB));
    assert_eq!(region.usage(device).limit, Some(4 * MIB));
    assert_eq!(region.compute_percent(device), Some(50));
    // Our own registration does not count as "others": the registering process's own
    // configuration replaces the limits.
    region
        .bind_devices(&[limits("GPU-0", Some(8 * MIB))])
        .unwrap();
    assert_eq!(region.usage(device).limit, Some(8 * MIB));
    assert_eq!(region.compute_percent(device), None);
}

#[test]
fn stricter_percent_treats_zero_as_unthrottled() {
    assert_eq!(stricter_percent(0, 0), 0);
    assert_eq!(stricter_percent(0, 30), 30);
    assert_eq!(stricter_percent(30, 0), 30);
    assert_eq!(stricter_percent(30, 20), 20);
}

#[test]
fn bind_devices_refuses_an_empty_uuid_and_a_seventeenth_device() {
    let dir = TempDir::new("bind-full");
    let region = Region::open_or_create(&dir.file()).unwrap();
    assert!(matches!(
        region.bind_devices(&[limits("", None)]),
        Err(RegionError::NoDeviceEntry { .. })
    ));
    let sixteen: Vec<DeviceLimits> = (0..MAX_DEVICES)
        .map(|i| limits(&format!("GPU-{i}"), None))
        .collect();
    region.bind_devices(&sixteen).unwrap();
    let err = region
        .bind_devices(&[limits("GPU-extra", None)])
        .unwrap_err();
    assert!(err.to_string().contains("GPU-extra"), "{err}");
}

#[test]
fn sixteen_threads_near_the_limit_never_exceed_it_and_end_at_zero() {
    let dir = TempDir::new("threads");
    // Below what one thread alone can hold (4 x up to 8 MiB), so refusals are certain even
    // if the threads happen to run one after another.
    let limit = 20 * MIB;
    let (region, _, device) = region_with(&dir, Some(limit));
    let region = Arc::new(region);
    let exceeded = Arc::new(AtomicBool::new(false));
    let wrongly_refused = Arc::new(AtomicU64::new(0));
    // What the threads hold, counted up after a reservation is kept and down before it is
    // released: never more than the ledger keeps.
    let kept = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let region = Arc::clone(&region);
            let exceeded = Arc::clone(&exceeded);
            let wrongly_refused = Arc::clone(&wrongly_refused);
            let kept = Arc::clone(&kept);
            std::thread::spawn(move || {
                let slot = region.register(&me()).unwrap();
                let mut held = Vec::new();
                let mut refusals = 0u32;
                for i in 0..4000u64 {
                    let size = MIB * (1 + (t * 7 + i * 13) % 8);
                    match region.reserve(slot, device, size) {
                        Ok(()) => {
                            held.push(size);
                            if kept.fetch_add(size, Ordering::SeqCst) + size > limit {
                                exceeded.store(true, Ordering::Relaxed);
                            }
                        }
                        Err(over) => {
                            refusals += 1;
                            if over.used + size <= over.limit {
                                wrongly_refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    if held.len() > 3 || (i % 5 == 0 && !held.is_empty()) {
                        let size = held.remove(0);
                        kept.fetch_sub(size, Ordering::SeqCst);
                        assert_eq!(region.release(slot, device, size), size);
                    }
                }
                for size in held {
                    kept.fetch_sub(size, Ordering::SeqCst);
                    assert_eq!(region.release(slot, device, size), size);
                }
                assert_eq!(region.slot_used(slot, device), 0);
                refusals
            })
        })
        .collect();
    let refusals: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(
        !exceeded.load(Ordering::Relaxed),
        "the total passed the limit"
    );
    assert_eq!(
        wrongly_refused.load(Ordering::Relaxed),
        0,
        "refusals whose own figures show room"
    );
    assert!(refusals > 0, "the test never reached the limit");
    assert_eq!(region.usage(device).used, 0);
}

#[test]
fn unregister_returns_the_bytes_and_frees_the_slot() {
    let dir = TempDir::new("unregister");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, 70 * MIB).unwrap();
    region.unregister(slot).unwrap();
    assert_eq!(region.usage(device).used, 0);
    assert!(region.snapshot().processes.is_empty());
    assert!(matches!(
        region.unregister(slot),
        Err(RegionError::NotOwner { .. })
    ));
    assert_eq!(
        region.register(&me()).unwrap(),
        slot,
        "the freed slot is reused"
    );
}

#[test]
fn reused_pid_with_another_start_time_is_reaped() {
    let dir = TempDir::new("pid-reuse");
    let (region, live, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(live, device, 10 * MIB).unwrap();
    // Same PID, same namespace, but a start time that is not ours: an earlier process whose
    // PID we reuse. Its slot lock is even held (by our descriptor), so only the start-time
    // check can tell.
    let ghost_identity = ProcessIdentity {
        start_time: me().start_time.wrapping_sub(1),
        ..me()
    };
    let ghost = region.register(&ghost_identity).unwrap();
    region.reserve(ghost, device, 30 * MIB).unwrap();
    let snapshot = region.snapshot();
    let liveness = |slot: SlotId| {
        snapshot
            .processes
            .iter()
            .find(|p| p.slot == slot)
            .unwrap()
            .liveness
    };
    assert_eq!(liveness(live), Liveness::Alive);
    assert_eq!(liveness(ghost), Liveness::Stale);

    let report = region.reap_dead_if(|_| true).unwrap();
    assert_eq!(
        report.reclaimed,
        vec![ReclaimedSlot {
            slot: ghost,
            pid: std::process::id(),
            bytes: 30 * MIB
        }]
    );
    assert_eq!(region.usage(device).used, 10 * MIB);
    assert_eq!(region.slot_used(live, device), 10 * MIB);
}

#[test]
fn a_reservation_cut_short_by_death_leaves_nothing_once_its_slot_is_reaped() {
    let dir = TempDir::new("cut-short");
    let path = dir.file();
    let (region, live, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(live, device, 10 * MIB).unwrap();
    // What a SIGKILL right after `reserve`'s compare-and-swap leaves: the total holds bytes
    // the dying process's slot does not show yet.
    let dying = Region::open_or_create(&path).unwrap();
    let dead = dying.register(&me()).unwrap();
    let change = ledger::Change::Reserve {
        bytes: 85 * MIB,
        limit: 100 * MIB,
    };
    let outcome = stop_at(&dying, dead, device, change, ledger::Step::Landed);
    assert_eq!(outcome, ledger::Outcome::Abandoned);
    assert_eq!(
        dying.slot_used(dead, device),
        0,
        "the slot shows nothing yet"
    );
    drop(dying);
    assert_eq!(region.usage(device).used, 95 * MIB, "charged until reaped");
    assert!(region.reserve(live, device, 6 * MIB).is_err());
    let report = region.reap_dead_if(|_| true).unwrap();
    assert_eq!(report.bytes_reclaimed(), 85 * MIB);
    assert_eq!(region.usage(device).used, 10 * MIB, "no drift left behind");
    region.reserve(live, device, 90 * MIB).unwrap();
}

/// Runs one ledger operation of `slot` and stops it at `at`, as a death there would.
fn stop_at(
    region: &Region,
    slot: SlotId,
    device: DeviceId,
    change: ledger::Change,
    at: ledger::Step,
) -> ledger::Outcome {
    ledger::apply(
        region.map.layout(),
        slot.index(),
        device.index(),
        change,
        |step| step != at,
    )
}

/// What every slot of the region holds on `device`, added up (the attribution the totals
/// must equal once nothing is in flight).
fn slots_sum(region: &Region, device: DeviceId) -> u64 {
    (0..MAX_PROCESSES)
        .map(|i| ledger::held_bytes(region.map.layout(), i, device.index()))
        .sum()
}

const STEPS: [ledger::Step; 4] = [
    ledger::Step::Intent,
    ledger::Step::Confirmed,
    ledger::Step::Landed,
    ledger::Step::Applied,
];

#[test]
fn a_death_at_any_step_of_any_operation_leaves_no_drift_once_reaped() {
    let limit = 100 * MIB;
    let changes = [
        ledger::Change::Reserve {
            bytes: 20 * MIB,
            limit,
        },
        ledger::Change::PastLimit { bytes: 20 * MIB },
        ledger::Change::Release { bytes: 5 * MIB },
    ];
    let mut cases = 0;
    for change in changes {
        for at in STEPS {
            // Whether a live process changes the total after the death (so the dying
            // operation's tag is overwritten, and must have been confirmed first).
            for neighbour_after in [false, true] {
                let dir = TempDir::new("death-steps");
                let path = dir.file();
                let (region, live, device) = region_with(&dir, Some(limit));
                region.reserve(live, device, 10 * MIB).unwrap();
                // A bystander that died right after its own compare-and-swap: its tag is in
                // the total with its intent pending, so the dying operation below confirms
                // it before overwriting (the `Confirmed` step exists).
                let bystanders = Region::open_or_create(&path).unwrap();
                let by = bystanders.register(&me()).unwrap();
                bystanders.reserve(by, device, 4 * MIB).unwrap();
                // The dying process holds 8 MiB, then dies inside one more operation.
                let dying = Region::open_or_create(&path).unwrap();
                let dead = dying.register(&me()).unwrap();
                dying.reserve(dead, device, 8 * MIB).unwrap();
                let by_change = ledger::Change::Reserve {
                    bytes: 3 * MIB,
                    limit,
                };
                let stopped = stop_at(&bystanders, by, device, by_change, ledger::Step::Landed);
                assert_eq!(stopped, ledger::Outcome::Abandoned);
                let outcome = stop_at(&dying, dead, device, change, at);
                assert_eq!(outcome, ledger::Outcome::Abandoned, "{change:?} at {at:?}");
                if neighbour_after {
                    region.reserve(live, device, MIB).unwrap();
                    assert_eq!(region.release(live, device, MIB), MIB);
                }
                drop(bystanders);
                drop(dying);
                let report = region.reap_dead_if(|_| true).unwrap();
                assert_eq!(report.reclaimed.len(), 2, "{report:?}");
                let what =
                    format!("{change:?} stopped at {at:?}, neighbour after: {neighbour_after}");
                assert_eq!(region.usage(device).used, 10 * MIB, "{what}");
                assert_eq!(slots_sum(&region, device), 10 * MIB, "{what}");
                // Exactly the live process's bytes: the rest of the limit is all there.
                region.reserve(live, device, limit - 10 * MIB).unwrap();
                assert!(region.reserve(live, device, 1).is_err(), "{what}");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 24);
}

#[test]
fn a_reaper_killed_at_any_step_leaves_the_next_reaper_an_exact_slot() {
    let limit = 100 * MIB;
    // Every step of every operation of the reaper's work, in order, until one run finishes
    // without being stopped.
    for stop_after in 0.. {
        let dir = TempDir::new("reaper-steps");
        let path = dir.file();
        let region = Region::open_or_create(&path).unwrap();
        let ids = region
            .bind_devices(&[limits("GPU-0", Some(limit)), limits("GPU-1", Some(limit))])
            .unwrap()
            .ids;
        let live = region.register(&me()).unwrap();
        region.reserve(live, ids[0], 10 * MIB).unwrap();
        region.reserve(live, ids[1], 2 * MIB).unwrap();
        let dying = Region::open_or_create(&path).unwrap();
        let dead = dying.register(&me()).unwrap();
        dying.reserve(dead, ids[0], 8 * MIB).unwrap();
        dying.reserve(dead, ids[1], 6 * MIB).unwrap();
        let change = ledger::Change::Reserve {
            bytes: 4 * MIB,
            limit,
        };
        stop_at(&dying, dead, ids[1], change, ledger::Step::Landed);
        let state = dying.map.layout().slots[dead.index()]
            .state
            .load(Ordering::Acquire);
        drop(dying);
        // The first reaper dies after `stop_after` steps of its work.
        let reaper = Region::open_or_create(&path).unwrap();
        let mut steps = 0;
        let freed = slots::free_slot(reaper.map.layout(), dead.index(), state, |_| {
            steps += 1;
            steps <= stop_after
        });
        let finished = steps <= stop_after;
        drop(reaper);
        let report = region.reap_dead_if(|_| true).unwrap();
        let what = format!("reaper stopped after {stop_after} steps");
        if finished {
            assert_eq!(freed, 18 * MIB, "{what}");
            assert!(report.reclaimed.is_empty(), "{what}: {report:?}");
        } else {
            assert_eq!(report.reclaimed.len(), 1, "{what}: {report:?}");
        }
        assert_eq!(region.usage(ids[0]).used, 10 * MIB, "{what}");
        assert_eq!(region.usage(ids[1]).used, 2 * MIB, "{what}");
        assert_eq!(slots_sum(&region, ids[0]), 10 * MIB, "{what}");
        assert_eq!(slots_sum(&region, ids[1]), 2 * MIB, "{what}");
        assert!(region.snapshot().processes.iter().all(|p| p.slot == live));
        if finished {
            assert!(stop_after > 4, "the reaper's work has steps to stop at");
            break;
        }
    }
}

#[test]
fn threads_sharing_one_slot_and_racing_other_slots_keep_the_totals_exact() {
    let dir = TempDir::new("shared-slot");
    let limit = 64 * MIB;
    let (region, shared_slot, device) = region_with(&dir, Some(limit));
    let other = region.register(&me()).unwrap();
    let kept = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (region, kept) = (&region, &kept);
            let slot = if t % 4 == 0 { other } else { shared_slot };
            s.spawn(move || {
                let mut held = Vec::new();
                for i in 0..3000u64 {
                    let size = MIB * (1 + (t + i) % 5);
                    if region.reserve(slot, device, size).is_ok() {
                        assert!(kept.fetch_add(size, Ordering::SeqCst) + size <= limit);
                        held.push(size);
                    }
                    if held.len() > 2 {
                        let size = held.remove(0);
                        kept.fetch_sub(size, Ordering::SeqCst);
                        assert_eq!(region.release(slot, device, size), size);
                    }
                }
                for size in held {
                    kept.fetch_sub(size, Ordering::SeqCst);
                    assert_eq!(region.release(slot, device, size), size);
                }
            });
        }
    });
    assert_eq!(region.usage(device).used, 0);
    assert_eq!(slots_sum(&region, device), 0);
}

/// Two slots of `path` whose mapping is gone (so both read as dead to the reaper): one holding
/// 30 MiB on `device`, one holding nothing.
fn dead_holding_and_empty(path: &Path, device: DeviceId) -> (SlotId, SlotId) {
    let gone = Region::open_or_create(path).unwrap();
    let holder = gone.register(&me()).unwrap();
    gone.reserve(holder, device, 30 * MIB).unwrap();
    let empty = gone.register(&me()).unwrap();
    drop(gone);
    (holder, empty)
}

#[test]
fn the_default_reap_frees_only_dead_slots_that_hold_nothing() {
    let dir = TempDir::new("default-reap");
    let path = dir.file();
    let (region, _live, device) = region_with(&dir, Some(100 * MIB));
    let (holder, empty) = dead_holding_and_empty(&path, device);
    // Both are dead; only the empty one can be freed without the driver's word.
    let report = region.reap_dead().unwrap();
    assert_eq!(report.reclaimed.len(), 1, "{report:?}");
    assert_eq!(report.reclaimed[0].slot, empty);
    assert_eq!(report.pending.len(), 1);
    assert_eq!(report.pending[0].slot, holder);
    assert_eq!(region.usage(device).used, 30 * MIB);
}

#[test]
fn slot_whose_lock_is_released_is_stale() {
    let dir = TempDir::new("released");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, 20 * MIB).unwrap();
    // Dropping the Region closes our slot descriptor: what the kernel does when we die.
    drop(region);
    let view = Region::open_existing(&dir.file()).unwrap();
    let snapshot = view.snapshot();
    assert_eq!(snapshot.processes.len(), 1);
    assert_eq!(snapshot.processes[0].liveness, Liveness::Stale);
    assert_eq!(snapshot.processes[0].used_bytes[device.index()], 20 * MIB);

    let region = Region::open_or_create(&dir.file()).unwrap();
    // We still run with the slot's identity: to the region that is an owner still closing its
    // descriptors (or one that exec'd), so by default its bytes stay charged...
    let report = region.reap_dead().unwrap();
    assert!(report.reclaimed.is_empty(), "{report:?}");
    assert_eq!(
        report.pending,
        vec![PendingSlot {
            slot,
            pid: std::process::id(),
            bytes: 20 * MIB
        }]
    );
    assert_eq!(region.usage(device).used, 20 * MIB);
    // ...until the caller knows the driver let go.
    let report = region.reap_dead_if(|_| true).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].bytes, 20 * MIB);
    assert_eq!(region.usage(device).used, 0);
}

#[test]
fn a_dead_slot_stays_charged_until_the_caller_says_the_driver_released_it() {
    let dir = TempDir::new("two-phase");
    let path = dir.file();
    let (region, live, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(live, device, 10 * MIB).unwrap();
    // A second Region object of ours plays the dead process: dropping it frees its lock.
    let dying = Region::open_or_create(&path).unwrap();
    let dead = dying.register(&me()).unwrap();
    dying.set_host_pid(dead, 4242);
    dying.reserve(dead, device, 60 * MIB).unwrap();
    drop(dying);

    let mut offered = Vec::new();
    let report = region
        .reap_dead_if(|d| {
            offered.push(d.clone());
            false
        })
        .unwrap();
    assert_eq!(offered.len(), 1);
    let first = &offered[0];
    assert_eq!((first.slot, first.host_pid), (dead, 4242));
    assert_eq!(first.used_bytes[device.index()], 60 * MIB);
    assert_eq!(first.bytes(), 60 * MIB);
    assert_eq!(
        first.exit,
        ExitState::Exiting,
        "same identity, still running"
    );
    assert!(report.reclaimed.is_empty());
    assert_eq!(report.pending.len(), 1);
    // Still charged: the 30 MiB of room left is all another reservation can get.
    assert!(region.reserve(live, device, 30 * MIB).is_ok());
    assert!(region.reserve(live, device, MIB).is_err());
    region.release(live, device, 30 * MIB);
    // A slot that stays pending is not handed to a new process either.
    let other = Region::open_or_create(&path).unwrap();
    assert_ne!(other.register(&me()).unwrap(), dead);

    // The clock of "dead for" runs from the first sighting.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut later = None;
    region
        .reap_dead_if(|d| {
            later = Some(d.dead_for);
            false
        })
        .unwrap();
    assert!(
        later.unwrap() >= std::time::Duration::from_millis(20),
        "{later:?}"
    );
    let timed_out = DeadSlot {
        dead_for: RELEASE_TIMEOUT,
        ..first.clone()
    };
    assert!(timed_out.exited_or_timed_out());
    assert!(!first.exited_or_timed_out());

    let report = region.reap_dead_if(|d| d.slot == dead).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].bytes, 60 * MIB);
    assert_eq!(region.usage(device).used, 10 * MIB);
}

#[test]
fn snapshot_reports_processes_and_devices() {
    let dir = TempDir::new("snapshot");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, 3 * MIB).unwrap();
    region.context_created(slot, device);
    region.context_created(slot, device);
    region.context_destroyed(slot, device);
    region.set_host_pid(slot, 777_777);
    let view = Region::open_existing(&dir.file()).unwrap();
    assert_eq!(
        view.snapshot().devices[0].measured_utilization,
        None,
        "never measured"
    );
    region.publish_utilization(device, 2_475, 123_456_789);
    assert_eq!(region.context_cost(device), None, "never measured");
    region.record_context_cost(device, 300 * MIB);
    region.record_context_cost(device, 290 * MIB);
    assert_eq!(
        region.context_cost(device),
        Some(300 * MIB),
        "the largest measurement stays"
    );
    let snapshot = view.snapshot();
    assert_eq!(
        snapshot.devices,
        vec![DeviceSnapshot {
            id: device,
            uuid: "GPU-0".into(),
            memory_limit: Some(100 * MIB),
            compute_percent: None,
            used_bytes: 3 * MIB,
            measured_utilization: Some(MeasuredUtilization {
                basis_points: 2_475,
                at_ns: 123_456_789,
            }),
            context_cost: Some(300 * MIB),
        }]
    );
    let process = &snapshot.processes[0];
    assert_eq!(process.slot, slot);
    assert_eq!(process.pid, std::process::id());
    assert_eq!(process.host_pid, 777_777);
    assert_eq!(process.start_time, me().start_time);
    assert_eq!(process.used_bytes[device.index()], 3 * MIB);
    assert_eq!(process.contexts[device.index()], 1);
    assert_eq!(process.liveness, Liveness::Alive);
}

#[test]
fn truncated_and_empty_files_are_refused_without_mapping() {
    let dir = TempDir::new("truncated");
    let path = dir.file();
    Region::open_or_create(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..4096]).unwrap();
    let err = Region::open_or_create(&path)
        .err()
        .expect("truncated file accepted");
    assert!(
        matches!(err, RegionError::WrongSize { found: 4096, .. }),
        "{err}"
    );
    assert!(err.to_string().contains(path.to_str().unwrap()));
    assert!(matches!(
        Region::open_existing(&path).err(),
        Some(RegionError::WrongSize { .. })
    ));
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 8]);
    std::fs::write(&path, &longer).unwrap();
    assert!(matches!(
        Region::open_or_create(&path).err(),
        Some(RegionError::WrongSize { .. })
    ));
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        Region::open_existing(&path).err(),
        Some(RegionError::NotInitialised { .. })
    ));
    assert!(matches!(
        Region::open_existing(&dir.0.join("missing")).err(),
        Some(RegionError::Io { .. })
    ));
}

#[test]
fn foreign_and_incompatible_files_are_refused_and_reset_repairs_them() {
    let dir = TempDir::new("foreign");
    let path = dir.file();
    let mut foreign = vec![0u8; REGION_SIZE];
    foreign[..8].copy_from_slice(b"NOTOURS!");
    std::fs::write(&path, &foreign).unwrap();
    let err = Region::open_or_create(&path)
        .err()
        .expect("foreign accepted");
    assert!(matches!(err, RegionError::Foreign { .. }), "{err}");
    assert!(err.to_string().contains("not a gpuslice region"), "{err}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        foreign,
        "a foreign file is never overwritten"
    );

    // Ours, ready, but from another layout version.
    Region::reset(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = Region::open_or_create(&path)
        .err()
        .expect("incompatible accepted");
    assert!(
        matches!(
            err,
            RegionError::Incompatible {
                what: "layout version",
                found: 99,
                ..
            }
        ),
        "{err}"
    );
    assert!(Region::open_existing(&path).is_err());

    // A wrong-size file too.
    std::fs::write(&path, b"garbage").unwrap();
    Region::reset(&path).unwrap();
    let region = Region::open_or_create(&path).unwrap();
    assert!(region.snapshot().processes.is_empty());
}

#[test]
fn interrupted_initialisation_is_redone() {
    let dir = TempDir::new("interrupted");
    let path = dir.file();
    // Right size, blank: a creator died after sizing the file, before publishing the header.
    std::fs::write(&path, vec![0u8; REGION_SIZE]).unwrap();
    assert!(matches!(
        Region::open_existing(&path).err(),
        Some(RegionError::NotInitialised { .. })
    ));
    Region::open_or_create(&path).unwrap();
    Region::open_existing(&path).unwrap();
}

#[test]
fn reset_refuses_while_a_live_process_holds_a_slot() {
    let dir = TempDir::new("reset-live");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, MIB).unwrap();
    let err = Region::reset(&dir.file()).unwrap_err();
    assert!(
        matches!(&err, RegionError::InUse { pids, .. } if pids == &vec![std::process::id()]),
        "{err}"
    );
    assert_eq!(region.usage(device).used, MIB);
    region.unregister(slot).unwrap();
    // No slot left, but the region is still mapped by this process.
    let err = Region::reset(&dir.file()).unwrap_err();
    assert!(
        matches!(&err, RegionError::InUse { pids, .. } if pids.is_empty()),
        "{err}"
    );
    drop(region);
    Region::reset(&dir.file()).unwrap();
    let fresh = Region::open_existing(&dir.file()).unwrap();
    assert!(fresh.snapshot().devices.is_empty());
}

#[test]
fn reset_replaces_a_symlink_target_never_and_refuses_the_link() {
    let dir = TempDir::new("reset-link");
    let victim = dir.0.join("precious");
    std::fs::write(&victim, b"do not overwrite").unwrap();
    std::os::unix::fs::symlink(&victim, dir.file()).unwrap();
    assert!(matches!(
        Region::reset(&dir.file()),
        Err(RegionError::Symlink { .. })
    ));
    assert!(matches!(
        Region::open_or_create(&dir.file()),
        Err(RegionError::Symlink { .. })
    ));
    assert!(matches!(
        Region::open_existing(&dir.file()),
        Err(RegionError::Symlink { .. })
    ));
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not overwrite");
    // A dangling link: never created through.
    std::fs::remove_file(&victim).unwrap();
    assert!(matches!(
        Region::open_or_create(&dir.file()),
        Err(RegionError::Symlink { .. })
    ));
    assert!(!victim.exists(), "the link's target was created");
}

#[test]
fn a_fifo_at_the_region_path_is_refused_not_waited_on() {
    let dir = TempDir::new("fifo");
    let path = lock::c_path(&dir.file()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o666) }, 0);
    assert!(matches!(
        Region::open_existing(&dir.file()),
        Err(RegionError::NotAFile { .. })
    ));
    assert!(matches!(
        Region::open_or_create(&dir.file()),
        Err(RegionError::NotAFile { .. })
    ));
}

#[test]
fn a_new_region_file_is_open_to_every_user_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("mode");
    // SAFETY: umask only changes this process's file-creation mask.
    let old = unsafe { libc::umask(0o077) };
    let opened = Region::open_or_create(&dir.file());
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    opened.unwrap();
    let mode = std::fs::metadata(dir.file()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666);
}

#[test]
fn a_deleted_or_replaced_file_never_starts_a_second_ledger() {
    let dir = TempDir::new("replaced");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, 60 * MIB).unwrap();
    // Deleted under a live process: a newcomer refuses instead of creating a fresh ledger.
    std::fs::remove_file(dir.file()).unwrap();
    let err = Region::open_or_create(&dir.file())
        .err()
        .expect("second ledger");
    assert!(matches!(err, RegionError::Replaced { .. }), "{err}");
    assert!(
        err.to_string().contains(dir.file().to_str().unwrap()),
        "{err}"
    );
    // Replaced by another valid region (renamed over): refused the same way.
    let elsewhere = dir.0.join("other.region");
    drop(Region::open_or_create(&elsewhere).unwrap());
    std::fs::rename(&elsewhere, dir.file()).unwrap();
    assert!(matches!(
        Region::open_or_create(&dir.file()),
        Err(RegionError::Replaced { .. })
    ));
    // The running process keeps its one ledger, registration included.
    let second = region.register(&me()).unwrap();
    assert!(region.reserve(second, device, 50 * MIB).is_err());
    region.reserve(second, device, 40 * MIB).unwrap();
    // Once nobody maps the old file, the one at the path is the slice's.
    drop(region);
    Region::open_or_create(&dir.file()).unwrap();
}

/// Read locks on `bytes` (start, length; length 0 = to the end) of `path` (a file or a
/// directory), held by a description of their own until dropped: what anyone who may open it
/// for reading can take.
fn read_locks(path: &Path, bytes: &[(u64, u64)]) -> lock::OwnedFd {
    let fd = lock::open(path, libc::O_RDONLY).unwrap();
    for &(start, len) in bytes {
        // SAFETY: flock is plain data; zero is valid for every field.
        let mut range: libc::flock = unsafe { std::mem::zeroed() };
        range.l_type = libc::F_RDLCK as libc::c_short;
        range.l_whence = libc::SEEK_SET as libc::c_short;
        range.l_start = start as libc::off_t;
        range.l_len = len as libc::off_t;
        // SAFETY: fd is open; `range` is a valid flock for the call.
        let rc = unsafe { libc::fcntl(fd.raw(), libc::F_OFD_SETLK, &mut range) };
        assert_eq!(rc, 0);
    }
    fd
}

#[test]
fn a_reader_holding_read_locks_changes_no_verdict() {
    let dir = TempDir::new("reader-locks");
    let path = dir.file();
    let (first, slot, device) = region_with(&dir, Some(100 * MIB));
    drop(first);
    let guard = dir.0.join(".slice.region.guard");
    assert!(guard.is_file(), "the guard file is made with the region");
    // A reader's locks: all of the directory and the guard file; on the region file, the
    // marks and the liveness byte of the (now dead) slot.
    let everything = [(0, 0)];
    let _on_dir = read_locks(&dir.0, &everything);
    let _on_guard = read_locks(&guard, &everything);
    let _on_region = read_locks(
        &path,
        &[layout::MARKS, (layout::slot_lock_offset(slot.index()), 1)],
    );
    // The dead slot still reads as dead.
    let view = Region::open_existing(&path).unwrap();
    assert_eq!(view.snapshot().processes[0].liveness, Liveness::Stale);
    // An idle slice: a newcomer opens it, and so does a second one (one ledger).
    let (first, slot, device2) = region_with(&dir, Some(100 * MIB));
    assert_eq!(device, device2);
    first.reserve(slot, device, 60 * MIB).unwrap();
    let second = Region::open_or_create(&path).expect("no false 'replaced'");
    let other = second.register(&me()).unwrap();
    assert!(
        second.reserve(other, device, 50 * MIB).is_err(),
        "one ledger"
    );
    drop((first, second));
    // Emptied, with the reader's locks on it: nobody maps it, so it is initialised afresh.
    std::fs::write(&path, b"").unwrap();
    drop(Region::open_or_create(&path).expect("no false 'emptied'"));
    // Nobody maps it now: neither a reset nor the clean-up's check sees the reader.
    Region::check_unused(&path).unwrap();
    Region::reset(&path).unwrap();
}

#[test]
fn a_process_that_can_write_the_guard_file_can_still_mark_the_name() {
    // What a process of the slice (able to write its files) does when it maps the region:
    // a newcomer opening a replacement then refuses. The marks are write locks.
    let dir = TempDir::new("writer-mark");
    drop(Region::open_or_create(&dir.file()).unwrap());
    let guard = lock::open(&dir.0.join(".slice.region.guard"), libc::O_RDWR).unwrap();
    assert!(lock::try_lock(&guard, layout::MARKS.0 + 7).unwrap());
    assert!(matches!(
        Region::open_or_create(&dir.file()),
        Err(RegionError::Replaced { .. })
    ));
    drop(guard);
    Region::open_or_create(&dir.file()).unwrap();
}

#[test]
fn a_file_zeroed_under_a_live_process_is_never_initialised_afresh() {
    let dir = TempDir::new("zeroed");
    let (region, slot, device) = region_with(&dir, Some(100 * MIB));
    region.reserve(slot, device, 60 * MIB).unwrap();
    let len = std::fs::metadata(dir.file()).unwrap().len() as usize;
    std::fs::write(dir.file(), vec![0u8; len]).unwrap();
    let err = Region::open_or_create(&dir.file())
        .err()
        .expect("second ledger");
    assert!(matches!(err, RegionError::Emptied { .. }), "{err}");
    assert!(
        err.to_string().contains(dir.file().to_str().unwrap()),
        "{err}"
    );
    // The live process's own view is wiped with the file: its limit reads 0 and it refuses.
    assert!(region.reserve(slot, device, MIB).is_err());
    // Once nobody maps it, an opener may initialise it again.
    drop(region);
    Region::open_or_create(&dir.file()).unwrap();
}

#[test]
fn registering_more_than_max_processes_live_is_full() {
    let dir = TempDir::new("full");
    let region = Region::open_or_create(&dir.file()).unwrap();
    let slots: Vec<SlotId> = (0..MAX_PROCESSES)
        .map(|_| region.register(&me()).unwrap())
        .collect();
    let mut distinct = slots.clone();
    distinct.sort_by_key(|s| s.index());
    distinct.dedup();
    assert_eq!(distinct.len(), MAX_PROCESSES);
    assert!(matches!(
        region.register(&me()),
        Err(RegionError::Full { .. })
    ));
    region.unregister(slots[7]).unwrap();
    assert_eq!(region.register(&me()).unwrap(), slots[7]);
}

#[test]
fn counters_outlive_the_processes_that_kept_them() {
    let dir = TempDir::new("counters");
    let (region, _slot, device) = region_with(&dir, Some(100 * MIB));
    region.count_refusal(device);
    region.count_refusal(device);
    region.add_throttled_ns(device, 1_500);
    region.count_fail_closed();
    drop(region);
    let view = Region::open_existing(&dir.file()).unwrap();
    assert_eq!(
        view.counters(),
        SliceCounters {
            fail_closed_events: 1,
            devices: vec![(device, 2, 1_500)],
        }
    );
}

#[test]
fn the_sweep_judges_only_slots_that_hold_bytes() {
    let dir = TempDir::new("holding-reap");
    let path = dir.file();
    let (region, _live, device) = region_with(&dir, Some(100 * MIB));
    let (holder, empty) = dead_holding_and_empty(&path, device);
    let mut judged = Vec::new();
    let report = region
        .sweep_now(|dead| {
            judged.push(dead.slot);
            true
        })
        .unwrap();
    assert_eq!(
        judged,
        vec![holder],
        "the empty dead slot changes no figure"
    );
    assert_eq!(report.bytes_reclaimed(), 30 * MIB);
    assert_eq!(region.usage(device).used, 0);
    // The empty one is left for the reap that frees slots holding nothing.
    let report = region.reap_dead().unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].slot, empty);
}

#[test]
fn a_sweep_runs_only_when_wanted_and_once_per_interval_for_the_whole_slice() {
    let dir = TempDir::new("sweep-pace");
    let path = dir.file();
    let (region, _live, device) = region_with(&dir, Some(100 * MIB));
    let other = Region::open_or_create(&path).unwrap();
    let (holder, _empty) = dead_holding_and_empty(&path, device);
    // Nobody saw a reason: no process sweeps, and the dead holder stays charged.
    assert!(region.sweep_if_due(|_| true).is_none());
    assert!(other.sweep_if_due(|_| true).is_none());
    assert_eq!(region.usage(device).used, 30 * MIB);
    // One process sees a reason; the first process to look sweeps for all...
    other.want_sweep(SweepReason::Look);
    let report = region
        .sweep_if_due(|_| true)
        .expect("a sweep was wanted")
        .unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].slot, holder);
    assert_eq!(other.usage(device).used, 0);
    // ...and nobody sweeps again within the interval, though one more sweep is wanted.
    assert!(other.sweep_if_due(|_| true).is_none());
    assert!(region.sweep_if_due(|_| true).is_none());
}

#[test]
fn a_sweep_that_leaves_a_dead_slot_charged_keeps_a_sweep_wanted() {
    let dir = TempDir::new("sweep-pending");
    let path = dir.file();
    let (region, _live, device) = region_with(&dir, Some(100 * MIB));
    let (holder, _empty) = dead_holding_and_empty(&path, device);
    let report = region.sweep_now(|_| false).unwrap();
    assert_eq!(report.pending.len(), 1);
    assert_eq!(report.pending[0].slot, holder);
    // Wanted now, though nobody asked: only the pace holds it back.
    let header = &region.map.layout().header;
    assert!(
        header
            .sweeps_wanted
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    let report = region.sweep_now(|_| true).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(region.usage(device).used, 0);
}

#[test]
fn a_death_found_once_is_known_to_every_process_without_judging() {
    let dir = TempDir::new("notice");
    let path = dir.file();
    let (region, live, device) = region_with(&dir, Some(100 * MIB));
    let other = Region::open_or_create(&path).unwrap();
    let (holder, _empty) = dead_holding_and_empty(&path, device);
    let members_of = |r: &Region| r.members().iter().map(|m| m.slot).collect::<Vec<_>>();
    // Unnoticed, the dead holder is still a member for everybody (nobody judged it)...
    assert!(members_of(&other).contains(&holder));
    // ...until one process finds it dead; the driver still holds its memory.
    region.sweep_now(|_| false).unwrap();
    assert!(!members_of(&other).contains(&holder), "told to all");
    assert!(members_of(&other).contains(&live));
    assert_eq!(other.usage(device).used, 30 * MIB, "still charged");
}

#[test]
fn a_member_matched_in_a_list_is_checked_and_its_death_noticed() {
    let dir = TempDir::new("check-member");
    let path = dir.file();
    let (region, live, _device) = region_with(&dir, Some(100 * MIB));
    let gone = Region::open_or_create(&path).unwrap();
    let dead = gone.register(&me()).unwrap();
    gone.set_host_pid(dead, 4_000_123);
    drop(gone);
    let other = Region::open_or_create(&path).unwrap();
    assert!(
        other.members().iter().any(|m| m.slot == dead),
        "not noticed yet"
    );
    // Listed under its host PID: checked, found dead (its lock is free), not shown...
    assert_eq!(region.with_members(|members| members.get(4_000_123)), None);
    // ...and noticed for every process of the slice.
    assert!(!other.members().iter().any(|m| m.slot == dead));
    // A live member without a host PID is found under its own PID.
    let mine = region.with_members(|members| members.get(std::process::id()));
    assert_eq!(mine.map(|m| m.slot), Some(live));
    assert_eq!(
        region.with_members(|members| members.get(4_000_124)),
        None,
        "a stranger"
    );
}

#[test]
fn the_pid_namespace_nvml_names_by_its_own_pids_is_learnt_once() {
    let dir = TempDir::new("pid-namespace");
    let (region, _live, _device) = region_with(&dir, None);
    assert_eq!(region.nvml_pid_namespace(), 0);
    region.learn_nvml_pid_namespace(0);
    assert_eq!(region.nvml_pid_namespace(), 0, "unknown is not a namespace");
    region.learn_nvml_pid_namespace(4_026_531_836);
    region.learn_nvml_pid_namespace(4_026_532_999);
    let other = Region::open_or_create(&dir.file()).unwrap();
    assert_eq!(other.nvml_pid_namespace(), 4_026_531_836);
}

#[test]
fn one_listing_tells_every_waiter_what_the_driver_shows_it_holding() {
    let dir = TempDir::new("listing");
    let path = dir.file();
    let (a, slot_a, device) = region_with(&dir, Some(1024 * MIB));
    a.set_host_pid(slot_a, 4_100_001);
    let b = Region::open_or_create(&path).unwrap();
    let slot_b = b.register(&me()).unwrap();
    b.set_host_pid(slot_b, 4_100_002);
    let listed = vec![
        (4_100_001, 64 * MIB),
        (4_100_002, 32 * MIB),
        (4_100_003, 7 * MIB),
    ];
    // Both made their context before any listing began.
    let (ticket_a, ticket_b) = (a.listing_ticket(device), b.listing_ticket(device));
    let wait = std::time::Duration::from_secs(5);
    let mut reads = 0;
    let got_a = a.listed_bytes(slot_a, &ticket_a, wait, || {
        reads += 1;
        Some(listed.clone())
    });
    assert_eq!(got_a, Some(64 * MIB));
    // B's answer is in A's listing: B does not read the list again.
    let got_b = b.listed_bytes(slot_b, &ticket_b, wait, || {
        reads += 1;
        Some(listed.clone())
    });
    assert_eq!(got_b, Some(32 * MIB));
    assert_eq!(reads, 1, "one listing for both");
    drop((ticket_a, ticket_b));
    // A process whose context came after that listing needs a new one, which shows it
    // holding more now; one the list does not show gets no figure.
    let ticket = b.listing_ticket(device);
    let again = b.listed_bytes(slot_b, &ticket, wait, || {
        reads += 1;
        Some(vec![(4_100_002, 96 * MIB)])
    });
    assert_eq!((again, reads), (Some(96 * MIB), 2));
    drop(ticket);
    let ticket = a.listing_ticket(device);
    assert_eq!(a.listed_bytes(slot_a, &ticket, wait, || Some(vec![])), None);
}

#[test]
fn a_reader_alone_writes_only_its_own_word() {
    let dir = TempDir::new("listing-alone");
    let path = dir.file();
    let (a, slot_a, device) = region_with(&dir, Some(1024 * MIB));
    a.set_host_pid(slot_a, 4_300_001);
    let b = Region::open_or_create(&path).unwrap();
    let slot_b = b.register(&me()).unwrap();
    b.set_host_pid(slot_b, 4_300_002);
    let listed = vec![(4_300_001, 64 * MIB), (4_300_002, 32 * MIB)];
    let wait = std::time::Duration::from_secs(5);
    let word = |slot: SlotId| {
        a.map.layout().slots[slot.index()]
            .listed
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    // A alone: its answer, and B's word untouched (B waits for nothing).
    let ticket = a.listing_ticket(device);
    assert_eq!(
        a.listed_bytes(slot_a, &ticket, wait, || Some(listed.clone())),
        Some(64 * MIB)
    );
    drop(ticket);
    assert_eq!(word(slot_b), 0, "written for nobody");
    // With B waiting, A's listing writes B's word too, and B reads no list.
    let (ticket_a, ticket_b) = (a.listing_ticket(device), b.listing_ticket(device));
    assert_eq!(
        a.listed_bytes(slot_a, &ticket_a, wait, || Some(listed.clone())),
        Some(64 * MIB)
    );
    assert_ne!(word(slot_b), 0);
    assert_eq!(
        b.listed_bytes(slot_b, &ticket_b, wait, || panic!("B read the list")),
        Some(32 * MIB)
    );
}

#[test]
fn a_stalled_listing_is_taken_over() {
    let dir = TempDir::new("listing-stall");
    let (region, slot, device) = region_with(&dir, Some(1024 * MIB));
    region.set_host_pid(slot, 4_200_001);
    // A reader began a listing long ago and never ended it (stopped, or killed).
    let entry = &region.map.layout().devices[device.index()];
    entry
        .listing_seq
        .store(7, std::sync::atomic::Ordering::SeqCst);
    entry
        .listing_since_ns
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let ticket = region.listing_ticket(device);
    let got = region.listed_bytes(slot, &ticket, std::time::Duration::from_secs(5), || {
        Some(vec![(4_200_001, 64 * MIB)])
    });
    assert_eq!(got, Some(64 * MIB));
}

#[test]
fn a_start_sweeps_its_share_and_starts_one_after_another_sweep_the_whole_slice() {
    let dir = TempDir::new("start-share");
    let path = dir.file();
    let (region, _live, device) = region_with(&dir, Some(1024 * MIB));
    // A slice of 3 windows' worth of slots in use: dead holders spread through it.
    let gone = Region::open_or_create(&path).unwrap();
    let live = Region::open_or_create(&path).unwrap();
    let mut dead = Vec::new();
    for i in 1..3 * START_SWEEP_SLOTS {
        let (owner, list) = if i % 10 == 0 {
            (&gone, Some(&mut dead))
        } else {
            (&live, None)
        };
        let slot = owner.register(&me()).unwrap();
        owner.reserve(slot, device, 2 * MIB).unwrap();
        if let Some(list) = list {
            list.push(slot);
        }
    }
    drop(gone);
    let held = region.usage(device).used;
    let mut judged = Vec::new();
    let mut reaped = Vec::new();
    let mut starts = 0;
    while reaped.len() < dead.len() {
        assert!(
            starts < 3,
            "three starts walk the slice: {reaped:?} of {dead:?}"
        );
        let report = region
            .sweep_start_share(u64::MAX, |d| {
                judged.push(d.slot);
                true
            })
            .unwrap();
        reaped.extend(report.reclaimed.iter().map(|r| r.slot));
        starts += 1;
    }
    reaped.sort_by_key(|s| s.index());
    assert_eq!(reaped, dead, "each dead slot found once");
    assert_eq!(judged.len(), dead.len());
    assert_eq!(
        region.usage(device).used,
        held - dead.len() as u64 * 2 * MIB
    );
    // A share is no sweep of the whole slice: a process that needs one still runs one.
    assert!(!region.swept_since(1));
    // A small slice is swept whole, and that counts as a sweep.
    let small = TempDir::new("start-share-small");
    let (region, _live, device) = region_with(&small, Some(1024 * MIB));
    let (holder, _empty) = dead_holding_and_empty(&small.file(), device);
    let report = region.sweep_start_share(u64::MAX, |_| true).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].slot, holder);
    assert!(region.swept_since(1));
}

#[test]
fn a_start_believes_an_owner_a_probe_found_alive_after_it_began_and_probes_the_others() {
    let dir = TempDir::new("alive-seen");
    let path = dir.file();
    let (region, _live, device) = region_with(&dir, Some(1024 * MIB));
    let gone = Region::open_or_create(&path).unwrap();
    let slot = gone.register(&me()).unwrap();
    gone.reserve(slot, device, 2 * MIB).unwrap();
    let layout = region.map.layout();
    let record = &layout.slots[slot.index()];
    let judge =
        |judge_by| slots::judge_with(record, slot.index(), Some(&region.file), judge_by, true);
    let before = monotonic_ns();
    // A probe that finds the owner alive stamps when it looked.
    assert_eq!(judge(slots::Judge::Lock), Liveness::Alive);
    let seen = record.alive_seen_ns.load(Ordering::Relaxed);
    assert!(
        seen >= before && seen <= monotonic_ns(),
        "{seen} vs {before}"
    );
    drop(gone); // the owner dies
                // A start that began before that probe believes it: the owner cannot have died before
                // the start, so nothing of the start's business is missed...
    assert_eq!(
        judge(slots::Judge::LockUnlessAliveSince(before)),
        Liveness::Alive
    );
    // ...and a belief stamps nothing.
    assert_eq!(record.alive_seen_ns.load(Ordering::Relaxed), seen);
    // A start that began after it probes, and finds the death.
    let later = monotonic_ns();
    assert_eq!(
        judge(slots::Judge::LockUnlessAliveSince(later)),
        Liveness::Stale
    );
    assert_eq!(judge(slots::Judge::Lock), Liveness::Stale);
    assert_eq!(
        record.alive_seen_ns.load(Ordering::Relaxed),
        seen,
        "no stamp for a death"
    );
    // A share started after the probe reaps it; one started before would have left it.
    let report = region.sweep_start_share(later, |_| true).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].slot, slot);
}

#[test]
fn a_context_start_counts_for_others_only_while_its_live_owner_has_it_marked() {
    let dir = TempDir::new("starting");
    let (region, live, device) = region_with(&dir, Some(1024 * MIB));
    let other_device = region
        .bind_devices(&[limits("GPU-0", Some(1024 * MIB)), limits("GPU-1", None)])
        .unwrap()
        .ids[1];
    // A dead process's slot (same PID, another start time: a PID reused).
    let ghost = region
        .register(&ProcessIdentity {
            start_time: me().start_time.wrapping_sub(1),
            ..me()
        })
        .unwrap();
    assert!(
        !region.context_starts_elsewhere(ghost, device),
        "nothing marked"
    );
    region.context_start_begun(live, device);
    assert!(
        !region.context_starts_elsewhere(live, device),
        "its own mark"
    );
    assert!(region.context_starts_elsewhere(ghost, device));
    assert!(!region.context_starts_elsewhere(ghost, other_device));
    region.context_start_ended(live, device, true);
    assert!(!region.context_starts_elsewhere(ghost, device), "ended");
    // A dead owner's mark is no reason to wait.
    region.context_start_begun(ghost, device);
    assert!(
        !region.context_starts_elsewhere(live, device),
        "a dead owner's mark"
    );
    // A slot claimed again starts unmarked.
    region.unregister(ghost).unwrap();
    let again = region.register(&me()).unwrap();
    assert_eq!(again, ghost, "the freed slot is claimed again");
    let words = region.map.layout().slots[again.index()]
        .starting_contexts
        .load(Ordering::Relaxed);
    assert_eq!(words, 0, "a claimed slot carries no old mark");
}

#[test]
fn a_stopped_owners_context_start_is_no_reason_to_wait() {
    let dir = TempDir::new("starting-stopped");
    let (region, live, device) = region_with(&dir, Some(1024 * MIB));
    // A slot for another running process of our namespace (its lock held by our descriptor,
    // its identity the child's), marked as making its first context.
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    let other = region
        .register(&ProcessIdentity {
            pid: child.id(),
            host_pid: 0,
            start_time: parse_stat(&stat).unwrap().start_time,
            pid_ns: own_pid_namespace(),
        })
        .unwrap();
    region.context_start_begun(other, device);
    assert!(region.context_starts_elsewhere(live, device), "running");
    // SAFETY: signals our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    let stopped = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(1));
        proc::is_stopped(child.id())
    });
    assert!(stopped, "the child never showed as stopped");
    assert!(!region.context_starts_elsewhere(live, device), "stopped");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGCONT) }, 0);
    let running = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(1));
        !proc::is_stopped(child.id())
    });
    assert!(
        running && region.context_starts_elsewhere(live, device),
        "running again"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
