//! Limit-file parsing cost (criterion): what every process of a slice pays at its first
//! CUDA call. A quadratic duplicate check once took 7.2 s for 40,000 device entries;
//! parsing is linear and bounded:
//! * `parse/<n>`: a valid file with `n` UUID entries (up to the 128-entry limit): time per
//!   parse should grow in proportion to `n`;
//! * `refuse_oversized`: a 1 MiB + 1 byte file, refused before JSON parsing;
//! * `refuse_too_many_entries`: a file just under 1 MiB with ~20,000 entries, parsed as JSON
//!   and refused at the entry limit (the worst case a file under the size limit can cost).
//!
//! Run: `cargo bench -p gpuslice-benches --bench config`.

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpuslice_common::config::{parse_limit_file, MAX_DEVICE_ENTRIES, MAX_FILE_BYTES};

fn file_with(entries: usize) -> String {
    let list: Vec<String> = (0..entries)
        .map(|i| {
            format!(r#"{{"uuid": "GPU-{i:08x}-0000-0000-0000-000000000000", "memory": "1GiB"}}"#)
        })
        .collect();
    format!(r#"{{"version": 1, "devices": [{}]}}"#, list.join(","))
}

fn bench(c: &mut Criterion) {
    let path = Path::new("/etc/gpuslice/limits.json");
    let mut group = c.benchmark_group("parse");
    for n in [1, 16, 64, MAX_DEVICE_ENTRIES] {
        let text = file_with(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| parse_limit_file(path, black_box(text)).expect("valid"))
        });
    }
    group.finish();

    let oversized = " ".repeat(MAX_FILE_BYTES + 1);
    c.bench_function("refuse_oversized", |b| {
        b.iter(|| parse_limit_file(path, black_box(&oversized)).unwrap_err())
    });
    // Entries are the same length ("GPU-%08x..."), so the count that fills 1 MiB is exact.
    let per_entry = file_with(2).len() - file_with(1).len();
    let many = file_with((MAX_FILE_BYTES - 64) / per_entry);
    assert!(many.len() <= MAX_FILE_BYTES);
    c.bench_function("refuse_too_many_entries", |b| {
        b.iter(|| parse_limit_file(path, black_box(&many)).unwrap_err())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
