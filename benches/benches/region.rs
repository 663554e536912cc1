//! The shared ledger's hot path (criterion): one `Region::reserve` + `Region::release` pair,
//! as every allocation and free of the shim pays it.
//!
//! A reservation is one compare-and-swap of the device's total (plus the slot's intent and
//! count), whatever the number of processes the slice has or had; reading the use is one load:
//! * `pair/<n>`: the pair with `n` slots claimed (1: a one-process slice; 64, 1024: a slice
//!   with that many processes; the others hold nothing);
//! * `pair/exited-<n>`: one slot claimed after `n` others were claimed and given back (a slice
//!   whose processes exited: the slot high-water mark stays at `n`);
//! * `usage/<n>`: `Region::usage` (what every memory view reads) with `n` slots claimed;
//! * `pair_4_threads/<n>`: the same with 4 threads of this process reserving and releasing on
//!   their own slots at once (time per pair as each thread sees it, on 2 vCPU: includes
//!   waiting for a core).
//!
//! Run: `cargo bench -p gpuslice-benches --bench region`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpuslice_common::region::{DeviceId, DeviceLimits, ProcessIdentity, Region, SlotId};

fn region_with_slots(n: usize) -> (Region, DeviceId, Vec<SlotId>, std::path::PathBuf) {
    let dir =
        std::env::temp_dir().join(format!("gpuslice-bench-region-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let region = Region::open_or_create(&dir.join("slice.region")).expect("region");
    let device = region
        .bind_devices(&[DeviceLimits {
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            memory_limit: Some(1 << 40),
            compute_percent: None,
        }])
        .expect("bind")
        .ids[0];
    let me = ProcessIdentity::current().expect("/proc");
    let slots = (0..n)
        .map(|_| region.register(&me).expect("slot"))
        .collect();
    (region, device, slots, dir)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("pair");
    for n in [1usize, 64, 1024] {
        let (region, device, slots, dir) = region_with_slots(n);
        let slot = slots[0];
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                region
                    .reserve(slot, device, black_box(2 << 20))
                    .expect("within the limit");
                region.release(slot, device, black_box(2 << 20));
            })
        });
        drop(region);
        let _ = std::fs::remove_dir_all(dir);
    }
    for n in [64usize, 1024] {
        let (region, device, slots, dir) = region_with_slots(n);
        for slot in &slots[1..] {
            region.unregister(*slot).expect("own slot");
        }
        let slot = slots[0];
        group.bench_with_input(BenchmarkId::new("exited", n), &n, |b, _| {
            b.iter(|| {
                region
                    .reserve(slot, device, black_box(2 << 20))
                    .expect("within the limit");
                region.release(slot, device, black_box(2 << 20));
            })
        });
        drop(region);
        let _ = std::fs::remove_dir_all(dir);
    }
    group.finish();

    let mut group = c.benchmark_group("usage");
    for n in [1usize, 1024] {
        let (region, device, _slots, dir) = region_with_slots(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| black_box(region.usage(black_box(device))))
        });
        drop(region);
        let _ = std::fs::remove_dir_all(dir);
    }
    group.finish();

    let mut group = c.benchmark_group("pair_4_threads");
    for n in [4usize, 64] {
        let (region, device, slots, dir) = region_with_slots(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_custom(|iters| {
                let region = &region;
                std::thread::scope(|scope| {
                    let handles: Vec<_> = slots[..4]
                        .iter()
                        .map(|&slot| {
                            scope.spawn(move || {
                                let started = std::time::Instant::now();
                                for _ in 0..iters {
                                    region
                                        .reserve(slot, device, black_box(2 << 20))
                                        .expect("within the limit");
                                    region.release(slot, device, black_box(2 << 20));
                                }
                                started.elapsed()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("bench thread"))
                        .max()
                        .unwrap_or_default()
                })
            })
        });
        drop(region);
        let _ = std::fs::remove_dir_all(dir);
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
