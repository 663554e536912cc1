//! Compute share on the fake GPU (serial binary: `test = false`, run by `cargo xtask test`).
//! Every figure comes from fakegpu's truth (the device timeline), never from the shim. A
//! representative matrix; the full one is in `docs/performance.md`. Tolerance: the issue's
//! 5 percentage points around the target, measured over 2 s after 2 s of settling.

use cuda_e2e::{Client, ClientKind, FakeGpu, Slice};
use std::time::Duration;

const SETTLE_NS: u64 = 2_000_000_000;
const WINDOW_NS: u64 = 2_000_000_000;
const RUN_S: &str = "4.3";

fn now() -> u64 {
    fakegpu::state::now_ns()
}

/// Waits (the measurement window itself, not synchronisation) until `deadline`.
fn until(deadline: u64) {
    let now = now();
    if deadline > now {
        std::thread::sleep(Duration::from_nanos(deadline - now));
    }
}

fn launch_args(ns_per_wave: &str, kernels: &str, path: &str) -> Vec<String> {
    [
        "launch",
        "--kernels",
        kernels,
        "--ns-per-wave",
        ns_per_wave,
        "--path",
        path,
        "--duration-s",
        RUN_S,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Starts `n` clients in the background; returns their join handles.
fn start(
    n: usize,
    kind: ClientKind,
    args: Vec<String>,
    env: cuda_e2e::Env,
) -> Vec<std::thread::JoinHandle<serde_json::Value>> {
    (0..n)
        .map(|_| {
            let (args, env) = (args.clone(), env.clone());
            std::thread::spawn(move || {
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                Client::run(kind, &refs, &env)
            })
        })
        .collect()
}

/// Percent of the window the device (or `pid`) was busy.
fn busy_percent(gpu: &FakeGpu, pid: Option<u32>, from: u64) -> f64 {
    gpu.truth().busy_ns(0, pid, from, from + WINDOW_NS) as f64 * 100.0 / WINDOW_NS as f64
}

fn finish(handles: Vec<std::thread::JoinHandle<serde_json::Value>>) {
    for h in handles {
        let out = h.join().expect("client thread");
        assert_eq!(
            out["ok"], out["launches"],
            "throttled launches keep their results: {out}"
        );
    }
}

fn capped(target: u32, kind: ClientKind, processes: usize, ns: &str, kernels: &str, path: &str) {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", Some(target)).build();
    let t0 = now();
    let handles = start(
        processes,
        kind,
        launch_args(ns, kernels, path),
        slice.env(&gpu),
    );
    until(t0 + SETTLE_NS + WINDOW_NS);
    let used = busy_percent(&gpu, None, t0 + SETTLE_NS);
    finish(handles);
    eprintln!("target {target}% x{processes} {ns}ns/{path}: {used:.1}%");
    assert!(
        (used - f64::from(target)).abs() <= 5.0,
        "target {target}%, {processes} process(es), {ns} ns kernels, {path}: used {used:.1}%"
    );
}

#[test]
fn one_process_follows_its_share_for_small_and_large_kernels() {
    capped(25, ClientKind::Linked, 1, "1000000", "10", "kernel");
    capped(75, ClientKind::Cudarc, 1, "10000", "200", "kernel");
    // Known gap (docs/performance.md): 10 ms kernels at 10 % settle far below the share.
    capped(25, ClientKind::ProcAddr, 1, "1000000", "10", "ex");
}

#[test]
fn graph_launches_are_gated() {
    capped(50, ClientKind::Linked, 1, "1000000", "10", "graph");
}

#[test]
fn four_processes_share_one_share() {
    capped(50, ClientKind::Linked, 4, "1000000", "10", "kernel");
}

#[test]
fn a_throttled_slice_next_to_a_busy_neighbour_keeps_its_share() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", Some(30)).build();
    let t0 = now();
    let neighbour = start(
        1,
        ClientKind::Linked,
        launch_args("1000000", "10", "kernel"),
        gpu.env(),
    );
    let throttled = start(
        1,
        ClientKind::Cudarc,
        launch_args("1000000", "10", "kernel"),
        slice.env(&gpu),
    );
    until(t0 + SETTLE_NS + WINDOW_NS);
    let device = busy_percent(&gpu, None, t0 + SETTLE_NS);
    // The slice's own share: device minus the neighbour, found by PID in the truth.
    let procs = gpu.truth().processes(0);
    let shares: Vec<f64> = procs
        .iter()
        .map(|p| busy_percent(&gpu, Some(p.pid), t0 + SETTLE_NS))
        .collect();
    finish(neighbour);
    finish(throttled);
    eprintln!("device {device:.1}%, per process {shares:?}");
    assert!(device > 90.0, "the neighbour fills the rest: {device:.1}%");
    assert!(
        shares.iter().any(|s| (s - 30.0).abs() <= 5.0),
        "one process (the slice) at 30 % +- 5: {shares:?}"
    );
}

#[test]
fn burst_uses_an_idle_device_and_gives_it_back_when_a_neighbour_starts() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder()
        .device(0, "8GiB", Some(25))
        .policy("burst")
        .build();
    let t0 = now();
    let args = [
        "launch",
        "--kernels",
        "10",
        "--ns-per-wave",
        "1000000",
        "--duration-s",
        "5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let bursting = start(1, ClientKind::Linked, args, slice.env(&gpu));
    until(t0 + 1_500_000_000 + 1_000_000_000);
    let alone = gpu
        .truth()
        .busy_ns(0, None, t0 + 1_500_000_000, t0 + 2_500_000_000) as f64
        / 1e7;
    let t1 = now();
    let neighbour = start(
        1,
        ClientKind::Cudarc,
        launch_args("1000000", "10", "kernel"),
        gpu.env(),
    );
    until(t1 + 200_000_000 + 1_000_000_000);
    let procs = gpu.truth().processes(0);
    let shares: Vec<f64> = procs
        .iter()
        .map(|p| {
            gpu.truth()
                .busy_ns(0, Some(p.pid), t1 + 200_000_000, t1 + 1_200_000_000) as f64
                / 1e7
        })
        .collect();
    finish(bursting);
    finish(neighbour);
    eprintln!("alone {alone:.1}%, with neighbour {shares:?}");
    assert!(
        alone > 50.0,
        "alone, burst uses more than its 25 %: {alone:.1}%"
    );
    assert!(
        shares.iter().any(|s| (s - 25.0).abs() <= 7.0),
        "200 ms after the neighbour starts the slice is back near 25 %: {shares:?}"
    );
}
