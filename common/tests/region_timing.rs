//! Timing targets of the shared region (declared `test = false`: run serially, on purpose,
//! with `cargo test -p gpuslice-common --test region_timing -- --test-threads=1`):
//! an uncontended reserve+release pair well under 100 ns (optimised builds), and 64
//! registrations arriving at once done within 1 s.

use gpuslice_common::region::{DeviceLimits, ProcessIdentity, Region};
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn temp_region(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuslice-timing-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("slice.region")
}

#[test]
fn reserve_release_pair_is_fast() {
    let path = temp_region("hot");
    let region = Region::open_or_create(&path).unwrap();
    let device = region
        .bind_devices(&[DeviceLimits {
            uuid: "GPU-0".into(),
            memory_limit: Some(1 << 30),
            compute_percent: None,
        }])
        .unwrap()
        .ids[0];
    let slot = region
        .register(&ProcessIdentity::current().unwrap())
        .unwrap();
    const PAIRS: u32 = 2_000_000;
    let started = Instant::now();
    for _ in 0..PAIRS {
        region
            .reserve(slot, device, std::hint::black_box(4096))
            .unwrap();
        region.release(slot, device, std::hint::black_box(4096));
    }
    let per_pair = started.elapsed() / PAIRS;
    eprintln!("reserve+release: {per_pair:?} per pair");
    let target = if cfg!(debug_assertions) {
        Duration::from_micros(2)
    } else {
        Duration::from_nanos(100)
    };
    assert!(
        per_pair < target,
        "{per_pair:?} per pair, target {target:?}"
    );
    assert_eq!(region.usage(device).used, 0);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn sixty_four_registrations_at_once_finish_within_a_second() {
    let path = temp_region("register");
    Region::open_or_create(&path).unwrap();
    let barrier = Arc::new(Barrier::new(64));
    let identity = ProcessIdentity::current().unwrap();
    let started = Instant::now();
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let path = path.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                // Each its own Region: its own descriptions, as separate processes would have.
                let region = Region::open_or_create(&path).unwrap();
                barrier.wait();
                let slot = region.register(&identity).unwrap();
                (region, slot.index())
            })
        })
        .collect();
    let mut held: Vec<(Region, usize)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let elapsed = started.elapsed();
    eprintln!("64 concurrent registrations: {elapsed:?}");
    let mut slots: Vec<usize> = held.iter().map(|(_, s)| *s).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 64);
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    held.clear();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
