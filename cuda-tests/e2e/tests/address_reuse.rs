//! Address ranges that pass from one thread to another while the first thread's free is still
//! on its way back through the shim: the slice must hold whatever the driver does with them.
//! Judged by the fake's PHYSICAL truth: its high-water mark never passes the cap, and once
//! everything is unmapped the card and the slice's ledger hold exactly the context (no drift
//! either way: a lost mapping refunded early is memory past the cap, a mapping never dropped is
//! budget lost for good).

use cuda_e2e::{unexpected_results, Client, ClientKind, FakeGpu, Slice, GIB, MIB};

/// The fake's context cost (its default).
const CONTEXT: u64 = 300 * MIB;

fn region_used(slice: &Slice) -> u64 {
    cuda_e2e::live_ledger_bytes(&slice.region_path())
}

/// The card's and the ledger's bytes after a run, printed with the card's high-water mark;
/// the third value starts the run's list of problems (the peak past the cap).
fn judge(
    gpu: &FakeGpu,
    slice: &Slice,
    limit: u64,
    what: &str,
    detail: &str,
) -> (u64, u64, Vec<String>) {
    let peak = gpu.truth().peak_memory(0);
    let card = gpu.truth().used_memory(0);
    let region = region_used(slice);
    eprintln!(
        "{what}: physical peak {} MiB (cap {}), card {} MiB, ledger {} MiB; {detail}",
        peak / MIB,
        limit / MIB,
        card / MIB,
        region / MIB
    );
    let mut bad = Vec::new();
    if peak > limit {
        bad.push(format!("physical peak {} MiB passed the cap", peak / MIB));
    }
    (card, region, bad)
}

/// 16 (churn: 32) threads x `cuMemCreate(60 MiB)` / `cuMemMap` / `cuMemRelease` / `cuMemUnmap` in a
/// 1 GiB slice (300 MiB context: 12 allocations fit, so creates meet the cap all the time),
/// with address ranges reused across threads: a shared pool of ranges where a thread maps
/// the first free one (it can be free in the driver before the unmapping thread's
/// bookkeeping ran), and reserve/address-free churn (the driver hands a freed range to the
/// next reserve). Every client path: linked, cudarc (dlsym), cuGetProcAddress.
#[test]
fn vmm_threads_reusing_address_ranges_never_pass_the_cap_or_drift() {
    let limit = GIB;
    let mut failures = Vec::new();
    for kind in ClientKind::ALL {
        for churn in [false, true] {
            let what = format!("{kind:?} churn={churn}");
            let gpu = FakeGpu::start("v100");
            let slice = Slice::builder().device(0, "1GiB", None).build();
            let env = slice.env(&gpu);
            let client = Client::spawn(
                kind,
                &[
                    "vmm-reuse",
                    "--threads",
                    // Churning threads spend longer between creates: more of them keep the
                    // slice at its cap.
                    if churn { "32" } else { "16" },
                    "--iterations",
                    "150",
                    "--churn",
                    if churn { "true" } else { "false" },
                    // 12 shared ranges (all the 724 MiB the context leaves can hold) for 16
                    // threads, each starting its search one range further every iteration:
                    // ranges pass between threads, and threads holding a handle while they
                    // look for a range push creates past the cap.
                    "--slots",
                    "12",
                    // Each mapping held a moment, so that many are held at once on 2 cores:
                    // while all 12 ranges are held, the next create is refused (contention).
                    // 200 us saw no refusal in 1 of 4 runs at load average 14; 1 ms keeps the
                    // ranges full for most of a run.
                    "--hold-us",
                    "1000",
                ],
                &env,
            );
            let out = client.first.clone();
            let (card, region, mut bad) = judge(&gpu, &slice, limit, &what, &out.to_string());
            if card != CONTEXT || region != CONTEXT {
                bad.push(format!(
                    "after the last unmap the card holds {} MiB and the ledger {} MiB (the \
                     context is {} MiB)",
                    card / MIB,
                    region / MIB,
                    CONTEXT / MIB
                ));
            }
            let created = out["create_results"]["CUDA_SUCCESS"].as_u64().unwrap_or(0);
            let refused = out["create_results"]["CUDA_ERROR_OUT_OF_MEMORY"]
                .as_u64()
                .unwrap_or(0);
            if created == 0 || refused == 0 {
                bad.push(format!(
                    "no contention at the cap: {created} created, {refused} refused"
                ));
            }
            let checks: [(&str, &[&str]); 6] = [
                (
                    "create_results",
                    &["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"],
                ),
                (
                    "map_results",
                    &["CUDA_SUCCESS", "CUDA_ERROR_ALREADY_MAPPED"],
                ),
                ("set_access_results", &["CUDA_SUCCESS"]),
                ("release_results", &["CUDA_SUCCESS"]),
                ("unmap_results", &["CUDA_SUCCESS"]),
                ("address_free_results", &["CUDA_SUCCESS"]),
            ];
            for (key, allowed) in checks {
                if key == "address_free_results" && !churn {
                    continue;
                }
                for u in unexpected_results(&out[key], allowed) {
                    bad.push(format!("{key}: {u}"));
                }
            }
            client.release();
            if !bad.is_empty() {
                failures.push(format!("{what}: {}", bad.join("; ")));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 6 runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The other paths whose objects the ledger keys by address or handle (plain, pitched and
/// managed pointers, arrays, mipmapped arrays, VMM, pools): 16 threads allocating and freeing
/// 100 MiB in a 1 GiB slice, each holding its allocation 2 ms so that the cap is contended
/// even when a loaded machine runs the threads in turns (200 us was not always enough), and the driver handing a freed address (or handle value) to the next thread
/// while the freeing thread's bookkeeping may still be on its way.
#[test]
fn threads_reusing_addresses_on_every_path_never_pass_the_cap_or_drift() {
    let limit = GIB;
    let paths = [
        "alloc", "pitch", "managed", "array", "array3d", "mipmap", "vmm", "async", "pool",
    ];
    let mut failures = Vec::new();
    for (i, path) in paths.into_iter().enumerate() {
        let kind = ClientKind::ALL[i % ClientKind::ALL.len()];
        let what = format!("{kind:?} {path}");
        let gpu = FakeGpu::start("v100");
        let slice = Slice::builder().device(0, "1GiB", None).build();
        let env = slice.env(&gpu);
        let client = Client::spawn(
            kind,
            &[
                "threads",
                "--threads",
                "16",
                "--size",
                "100MiB",
                "--iterations",
                "60",
                "--path",
                path,
                "--hold-us",
                "2000",
                "--keep-alive",
                "true",
            ],
            &env,
        );
        let out = client.first.clone();
        let allocs = format!("allocs {}", out["alloc_results"]);
        let (card, region, mut bad) = judge(&gpu, &slice, limit, &what, &allocs);
        if card != region {
            bad.push(format!(
                "after the last free the card holds {} MiB and the ledger {} MiB",
                card / MIB,
                region / MIB
            ));
        }
        if out["alloc_results"]["CUDA_ERROR_OUT_OF_MEMORY"]
            .as_u64()
            .unwrap_or(0)
            == 0
        {
            bad.push(format!("no contention at the cap: {out}"));
        }
        for u in unexpected_results(
            &out["alloc_results"],
            &["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"],
        ) {
            bad.push(format!("alloc_results: {u}"));
        }
        for u in unexpected_results(&out["free_results"], &["CUDA_SUCCESS"]) {
            bad.push(format!("free_results: {u}"));
        }
        client.release();
        if !bad.is_empty() {
            failures.push(format!("{what}: {}", bad.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} paths failed:\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}
