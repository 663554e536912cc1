//! Memory the driver takes on a process's account without an allocation asking for it
//! (module images with their static data, local memory for a kernel's stack frame, the stack
//! limit), judged against the fake's truth: the slice charges what the card holds for its
//! processes, from the driver's own word, within the stated bound; a slice the driver's
//! growth took past its cap refuses further allocations and reports the truth.

use cuda_e2e::{live_ledger_bytes, wait_until, Client, ClientKind, FakeGpu, Running, Slice, MIB};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The fake's bytes for `pid` on device 0.
fn truth_of(gpu: &FakeGpu, pid: u32) -> u64 {
    gpu.truth()
        .processes(0)
        .iter()
        .filter(|p| p.pid == pid)
        .map(|p| p.used_memory)
        .sum()
}

fn grow(kind: ClientKind, args: &[&str], env: &cuda_e2e::Env) -> Running {
    let mut all = vec!["driver-growth"];
    all.extend_from_slice(args);
    Client::spawn(kind, &all, env)
}

#[test]
fn module_data_and_a_large_stack_frame_in_a_full_slice_are_charged_and_refuse_more() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    // 300 MiB context + 600 MiB fill fits the 1 GiB cap; the module's 64 MiB of static data
    // and the kernel's 3 KiB frame (2 KiB past the default stack, for 80 x 2048 resident
    // threads: 320 MiB) are placed by the driver at the first launch (lazy loading).
    for kind in [ClientKind::Linked, ClientKind::ProcAddr] {
        gpu.truth().reset_peak_memory(0);
        let running = grow(
            kind,
            &["600MiB", "--static", "64MiB", "--local", "3KiB"],
            &slice.env(&gpu),
        );
        let line = &running.first;
        assert_eq!(line["fill"], "CUDA_SUCCESS", "{line}");
        assert_eq!(line["load"], "CUDA_SUCCESS", "{line}");
        assert_eq!(
            line["launch"], "CUDA_SUCCESS",
            "the driver's growth is its own: {line}"
        );
        assert_eq!(
            line["after"], "CUDA_ERROR_OUT_OF_MEMORY",
            "the slice is past its cap by the driver's growth: {line}"
        );
        assert_eq!(line["mem_free"], 0, "cuMemGetInfo tells the truth: {line}");
        let truth = truth_of(&gpu, running.pid());
        assert!(truth > 1024 * MIB + 200 * MIB, "the driver grew: {truth}");
        // What the slice charged is what the card holds for the process, at its high-water
        // mark (the refused allocation never reached the card).
        assert_eq!(live_ledger_bytes(&slice.region_path()), truth);
        assert_eq!(gpu.truth().peak_memory(0), truth);
        // Another process of the slice is refused too: the slice is over its cap as a whole.
        let other = Client::run(kind, &["alloc", "2MiB"], &slice.env(&gpu));
        let refused = |v: &serde_json::Value| v == "CUDA_ERROR_OUT_OF_MEMORY";
        assert!(
            refused(&other["result"]) || refused(&other["error"]),
            "refused, at its context or its allocation: {other}"
        );
        let pid = running.pid();
        assert!(running.release().success());
        wait_until("the process's memory is back", TIMEOUT, || {
            truth_of(&gpu, pid) == 0
        });
    }
}

#[test]
fn the_stack_limit_is_counted() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    // A 4 KiB stack is 3 KiB per thread past the default: 480 MiB. 300 + 100 + 480 fit; the
    // next 200 MiB do not (they would if the stack were not counted).
    let running = grow(
        ClientKind::Linked,
        &["100MiB", "--stack", "4KiB", "--after", "200MiB"],
        &slice.env(&gpu),
    );
    let line = &running.first;
    assert_eq!(line["stack"], "CUDA_SUCCESS", "{line}");
    assert_eq!(line["after"], "CUDA_ERROR_OUT_OF_MEMORY", "{line}");
    let truth = truth_of(&gpu, running.pid());
    assert_eq!(live_ledger_bytes(&slice.region_path()), truth);
    assert!(running.release().success());
}

#[test]
fn an_eager_load_the_shim_never_sees_is_charged_within_the_bound() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("CUDA_MODULE_LOADING".into(), "EAGER".into()));
    let running = grow(
        ClientKind::Linked,
        &["100MiB", "--static", "256MiB", "--launch", "0"],
        &env,
    );
    let loaded = Instant::now();
    assert_eq!(running.first["load"], "CUDA_SUCCESS", "{}", running.first);
    let truth = truth_of(&gpu, running.pid());
    assert!(truth >= 300 * MIB + 100 * MIB + 248 * MIB, "{truth}");
    // No call after the load reaches the shim: the reconciliation thread charges it.
    wait_until("the slice charges the module", TIMEOUT, || {
        live_ledger_bytes(&slice.region_path()) == truth
    });
    eprintln!(
        "driver growth charged {:?} after the load (bound: 1.5 s)",
        loaded.elapsed()
    );
    assert!(running.release().success());
}
