//! Threads and processes that mix allocation paths (stream-ordered, plain, pitched, managed,
//! pool, VMM, arrays) in one slice, where the driver hands an address one path freed to
//! another path's next allocation while the freeing thread's bookkeeping is still on its way.
//! A free must refund only the object it freed, whichever path made it and whichever path
//! frees it. Judged by the fake's PHYSICAL truth: the card's high-water mark never passes
//! the cap, and after the last free the card and the ledger agree.

use cuda_e2e::{unexpected_results, Client, ClientKind, FakeGpu, Slice, GIB, MIB};

/// Every path that keys its object by address or handle; `async` (the stream-ordered
/// allocator) appears between each pair so that a late `cuMemFreeAsync` meets every other
/// path at the same address.
const MIXED: &str = "async,alloc,async,pitch,async,managed,async,pool,async,vmm,async,array";

/// Allocations per thread.
const ITERATIONS: &str = "150";

/// `processes` x `threads [--threads 16]` mixing [`MIXED`] in a 1 GiB slice: the problems
/// seen (peak past the cap, drift, unexpected results), empty when all is well.
fn mixed_race(
    kind: ClientKind,
    processes: usize,
    threads: &str,
    size: &str,
    hold_us: &str,
) -> Vec<String> {
    // Room for every process's 300 MiB context and a few allocations each.
    let limit = if processes == 1 { GIB } else { 2 * GIB };
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder()
        .device(0, &format!("{}MiB", limit / MIB), None)
        .build();
    let env = slice.env(&gpu);
    let clients: Vec<_> = (0..processes)
        .map(|p| {
            let kind = if processes == 1 {
                kind
            } else {
                ClientKind::ALL[p % ClientKind::ALL.len()]
            };
            Client::spawn(
                kind,
                &[
                    "threads",
                    "--threads",
                    threads,
                    "--size",
                    size,
                    "--iterations",
                    ITERATIONS,
                    "--path",
                    MIXED,
                    "--hold-us",
                    hold_us,
                    "--keep-alive",
                    "true",
                ],
                &env,
            )
        })
        .collect();
    let mut bad = Vec::new();
    let peak = gpu.truth().peak_memory(0);
    let card = gpu.truth().used_memory(0);
    let ledger = cuda_e2e::live_ledger_bytes(&slice.region_path());
    let mut refused = 0;
    for client in &clients {
        let out = &client.first;
        refused += out["alloc_results"]["CUDA_ERROR_OUT_OF_MEMORY"]
            .as_u64()
            .unwrap_or(0);
        for u in unexpected_results(
            &out["alloc_results"],
            &["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"],
        ) {
            bad.push(format!("alloc_results: {u} in {out}"));
        }
        for u in unexpected_results(&out["free_results"], &["CUDA_SUCCESS"]) {
            bad.push(format!("free_results: {u} in {out}"));
        }
    }
    eprintln!(
        "{processes} x {kind:?}: physical peak {} MiB (cap {}), card {} MiB, ledger {} MiB, {refused} refused",
        peak / MIB,
        limit / MIB,
        card / MIB,
        ledger / MIB
    );
    if peak > limit {
        bad.push(format!(
            "physical peak {} MiB passed the {} MiB cap",
            peak / MIB,
            limit / MIB
        ));
    }
    if card != ledger {
        bad.push(format!(
            "after the last free the card holds {} MiB and the ledger {} MiB",
            card / MIB,
            ledger / MIB
        ));
    }
    if refused == 0 {
        bad.push("no contention at the cap".into());
    }
    for client in clients {
        client.release();
    }
    bad
}

/// One process, 16 threads, every path mixed, 6 trials (one failing trial fails the test):
/// a free on one path never takes the charge of a live object another path placed at the
/// same address.
#[test]
fn one_process_mixing_free_paths_never_passes_the_cap_or_drifts() {
    let mut failures = Vec::new();
    for trial in 0..6 {
        let kind = ClientKind::ALL[trial % ClientKind::ALL.len()];
        let bad = mixed_race(kind, 1, "32", "32MiB", "1000");
        if !bad.is_empty() {
            failures.push(format!("trial {trial} ({kind:?}): {}", bad.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 6 trials failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Four processes (one per client kind, and one more) x 16 threads, every path mixed, in one
/// slice.
#[test]
fn four_processes_mixing_free_paths_never_pass_the_cap_or_drift() {
    let mut failures = Vec::new();
    for trial in 0..2 {
        let bad = mixed_race(ClientKind::Linked, 4, "16", "64MiB", "500");
        if !bad.is_empty() {
            failures.push(format!("trial {trial}: {}", bad.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 2 trials failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
