//! Compute share on the fake GPU (serial binary: `test = false`, run by `cargo xtask test`).
//! Every figure comes from fakegpu's truth (the device timeline), never from the shim.
//!
//! Each case runs its clients for `RUN_S` seconds and measures the `WINDOW_NS` after
//! `SETTLE_NS` (the target: steady state within 2 s of start; 3 s on the fake's realistic
//! NVML, `REALISTIC_SETTLE_NS`). Independent cases run at the
//! same time on separate simulated GPUs (their timelines do not interact), which keeps the
//! binary at about a minute and loads the 2-core machine as CI does.
//!
//! Tolerance: ±5 percentage points around the target. Measured figures (unloaded
//! and with two `yes > /dev/null` hogs) are in `docs/performance.md`; the full matrix is
//! printed by `cargo test -p cuda-e2e --test throttle -- --ignored --nocapture print_table`.

use cuda_e2e::{Client, ClientKind, Env, FakeGpu, Slice};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SETTLE_NS: u64 = 2_000_000_000;
const WINDOW_NS: u64 = 2_000_000_000;
const RUN_S: f64 = 4.3;
/// On the fake's realistic NVML the settle is 3 s: the first per-process figure of tiny
/// kernels at the start-up guess can only be trusted once a slowest (1 s) sample period has
/// passed (see `watcher::NO_TRACE_AFTER_NS`).
const REALISTIC_SETTLE_NS: u64 = 3_000_000_000;
/// The steady-state tolerance the share promises, in percentage points.
const TOLERANCE: f64 = 5.0;
/// A slice of more processes than this is measured from when all of them run.
const MANY_PROCESSES: usize = 4;
/// How much longer the clients of such a slice run, for their starts (seconds).
const MANY_START_ALLOWANCE_S: f64 = 3.0;

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

/// Kernels per batch (the client synchronises after each): ~10-40 ms of work.
fn batch(ns: u64) -> u64 {
    (20_000_000 / ns).clamp(4, 200)
}

fn launch_args(ns: u64, path: &str, run_s: f64) -> Vec<String> {
    let args = [
        "launch".to_string(),
        "--kernels".into(),
        batch(ns).to_string(),
        "--ns-per-wave".into(),
        ns.to_string(),
        "--path".into(),
        path.into(),
        "--duration-s".into(),
        format!("{run_s}"),
    ];
    args.to_vec()
}

/// One client process started in the background.
fn start(kind: ClientKind, args: Vec<String>, env: Env) -> JoinHandle<serde_json::Value> {
    std::thread::spawn(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Client::run(kind, &refs, &env)
    })
}

/// Starts a client and waits until the fake GPU registers it; returns its PID.
fn start_awaited(
    gpu: &FakeGpu,
    kind: ClientKind,
    args: Vec<String>,
    env: Env,
) -> (JoinHandle<serde_json::Value>, u32) {
    let before: Vec<u32> = gpu.truth().processes(0).iter().map(|p| p.pid).collect();
    let handle = start(kind, args, env);
    let mut pid = None;
    cuda_e2e::wait_until("the client registered", cuda_e2e::DEFAULT_TIMEOUT, || {
        pid = gpu
            .truth()
            .processes(0)
            .iter()
            .map(|p| p.pid)
            .find(|p| !before.contains(p));
        pid.is_some()
    });
    (handle, pid.expect("awaited"))
}

/// Joins clients and checks every throttled launch returned the driver's success.
fn finish(handles: Vec<JoinHandle<serde_json::Value>>) {
    for h in handles {
        let out = h.join().expect("client thread");
        assert_eq!(
            out["ok"], out["launches"],
            "throttled launches keep their results: {out}"
        );
        assert!(out["launches"].as_u64().unwrap_or(0) > 0, "{out}");
    }
}

/// Percent of the window `[from, from + WINDOW_NS)` the device (or `pid`) was busy.
fn busy_percent(gpu: &FakeGpu, pid: Option<u32>, from: u64, window: u64) -> f64 {
    gpu.truth().busy_ns(0, pid, from, from + window) as f64 * 100.0 / window as f64
}

/// What runs in one case: processes of the slice (kernel ns each) and unthrottled neighbours.
#[derive(Clone)]
struct Case {
    name: String,
    target: u32,
    slice_kernels: Vec<u64>,
    neighbours: usize,
    path: &'static str,
    pid_offset: bool,
    /// The fake's realistic NVML sampling (see `fakegpu::nvml_sampling`), for every process.
    realistic: bool,
    /// The slice's file sets a share and no memory limit: no memory ledger learns or records
    /// the processes' host PIDs, the throttle alone does.
    compute_only: bool,
}

impl Case {
    fn new(target: u32, slice_kernels: &[u64]) -> Case {
        Case {
            name: format!("{target}% x{} {:?}", slice_kernels.len(), slice_kernels),
            target,
            slice_kernels: slice_kernels.to_vec(),
            neighbours: 0,
            path: "kernel",
            pid_offset: false,
            compute_only: false,
            realistic: std::env::var("THROTTLE_NVML").is_ok_and(|m| m == "realistic"),
        }
    }
    fn named(mut self, name: &str) -> Case {
        self.name = format!("{}% {name}", self.target);
        self
    }
    fn neighbour(mut self) -> Case {
        self.neighbours = 1;
        self
    }
    fn path(mut self, path: &'static str) -> Case {
        self.path = path;
        self
    }
    fn pid_offset(mut self) -> Case {
        self.pid_offset = true;
        self
    }
    fn compute_only(mut self) -> Case {
        self.compute_only = true;
        self.name.push_str(" compute only");
        self
    }
    fn realistic(mut self) -> Case {
        self.realistic = true;
        self.name.push_str(" realistic NVML");
        self
    }
}

/// The fake's realistic NVML, with the knobs of the test's own environment passed through
/// (`FAKEGPU_NVML_SAMPLE_MS=1000` measures the slowest documented sample period).
fn realistic_nvml() -> Env {
    let mut env: Env = vec![("FAKEGPU_NVML_MODE".into(), "realistic".into())];
    for knob in [
        "FAKEGPU_NVML_SAMPLE_MS",
        "FAKEGPU_NVML_PROC_DELAY_MS",
        "FAKEGPU_NVML_PROC_DROP_PERMILLE",
    ] {
        if let Ok(value) = std::env::var(knob) {
            env.push((knob.into(), value));
        }
    }
    env
}

/// The measured outcome of a case: the slice's busy percent, the device's.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    slice: f64,
    device: f64,
}

const KINDS: [ClientKind; 3] = [ClientKind::Linked, ClientKind::Cudarc, ClientKind::ProcAddr];

fn run_case(case: &Case) -> Outcome {
    let gpu = FakeGpu::start("v100");
    let slice = if case.compute_only {
        Slice::builder()
            .raw(&format!(
                r#"{{"version":1,"region":"{{region}}","policy":"cap","devices":[{{"index":0,"compute":{}}}]}}"#,
                case.target
            ))
            .build()
    } else {
        Slice::builder()
            .device(0, "8GiB", Some(case.target))
            .build()
    };
    let offset = |mut env: Env| {
        if case.pid_offset {
            env.push(("FAKEGPU_PID_OFFSET".into(), "100000".into()));
        }
        if case.realistic {
            env.extend(realistic_nvml());
        }
        if let Ok(level) = std::env::var("DBG_LOG") {
            env.push(("GPUSLICE_LOG".into(), level));
        }
        env
    };
    let (settle, run_s) = if case.realistic {
        // `THROTTLE_SETTLE_S` (print_table only) measures a later window, e.g. at the slowest
        // sample period.
        match std::env::var("THROTTLE_SETTLE_S")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
        {
            Some(settle) => ((settle * 1e9) as u64, settle + WINDOW_NS as f64 / 1e9 + 0.3),
            None => (REALISTIC_SETTLE_NS, RUN_S + 1.0),
        }
    } else {
        (SETTLE_NS, RUN_S)
    };
    // A slice of many processes is measured from when all of them run: on a cold machine
    // (a CI's fresh clone) twenty starts can take seconds, and the last ones would still be
    // in their first launches (the start-up estimate) inside the window. Their clients run
    // long enough for any start-up time within the margin.
    let many = case.slice_kernels.len() > MANY_PROCESSES;
    let run_s = if many {
        run_s + MANY_START_ALLOWANCE_S
    } else {
        run_s
    };
    let mut neighbour_pids = Vec::new();
    let mut neighbours = Vec::new();
    for _ in 0..case.neighbours {
        let (handle, pid) = start_awaited(
            &gpu,
            ClientKind::Linked,
            launch_args(1_000_000, "kernel", run_s + 0.5),
            offset(gpu.env()),
        );
        neighbours.push(handle);
        neighbour_pids.push(pid);
    }
    let mut t0 = now();
    let throttled: Vec<_> = case
        .slice_kernels
        .iter()
        .enumerate()
        .map(|(i, &ns)| {
            start(
                KINDS[i % KINDS.len()],
                launch_args(ns, case.path, run_s),
                offset(slice.env(&gpu)),
            )
        })
        .collect();
    if many {
        let all = case.neighbours + case.slice_kernels.len();
        cuda_e2e::wait_until(
            "every process of the slice started",
            cuda_e2e::DEFAULT_TIMEOUT,
            || gpu.truth().processes(0).len() >= all,
        );
        t0 = now();
    }
    until(t0 + settle + WINDOW_NS);
    let from = t0 + settle;
    let device = busy_percent(&gpu, None, from, WINDOW_NS);
    let neighbour_busy: f64 = neighbour_pids
        .iter()
        .map(|&pid| busy_percent(&gpu, Some(pid), from, WINDOW_NS))
        .sum();
    finish(neighbours);
    finish(throttled);
    Outcome {
        slice: device - neighbour_busy,
        device,
    }
}

/// Runs cases at the same time (each on its own GPU) and returns their outcomes in order.
fn run_all(cases: &[Case]) -> Vec<Outcome> {
    let handles: Vec<_> = cases
        .iter()
        .cloned()
        .map(|c| std::thread::spawn(move || run_case(&c)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("case thread"))
        .collect()
}

fn check(cases: &[Case], margin: f64) {
    let outcomes = run_all(cases);
    let mut failures = Vec::new();
    for (case, out) in cases.iter().zip(&outcomes) {
        eprintln!(
            "{:<40} target {:>3}%  slice {:>5.1}%  device {:>5.1}%",
            case.name, case.target, out.slice, out.device
        );
        if (out.slice - f64::from(case.target)).abs() > margin {
            failures.push(format!("{}: {:.1}%", case.name, out.slice));
        }
        if case.neighbours > 0 {
            // Unloaded 98.6-100 %, loaded as low as 90.8 % (the neighbour's own launch loop
            // competes for the 2 cores): a margin below that measurement.
            assert!(
                out.device > 85.0,
                "{}: the neighbour fills the rest: {:.1}%",
                case.name,
                out.device
            );
        }
    }
    assert!(
        failures.is_empty(),
        "off target by more than {margin}: {failures:?}"
    );
}

const US10: u64 = 10_000;
const MS1: u64 = 1_000_000;
const MS10: u64 = 10_000_000;

#[test]
fn one_process_follows_its_share_for_small_and_large_kernels() {
    check(
        &[
            // The case that once settled at 1 %: 10 ms kernels at 10 %.
            Case::new(10, &[MS10]),
            Case::new(25, &[MS1]).path("ex"),
            Case::new(75, &[US10]),
            Case::new(90, &[MS1]),
        ],
        TOLERANCE,
    );
}

#[test]
fn graph_mixed_and_four_process_slices_follow_their_share() {
    check(
        &[
            Case::new(50, &[MS1]).path("graph"),
            Case::new(40, &[US10, MS1, MS10]).named("mixed 10us+1ms+10ms"),
            Case::new(50, &[MS1, MS1, MS1, MS1]),
        ],
        TOLERANCE,
    );
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported) is gated like every
/// other launch, through the linked, dlsym and cuGetProcAddress clients (it was not hooked:
/// the slice ran unthrottled through it).
#[test]
fn multi_device_cooperative_launches_follow_their_share() {
    check(
        &[Case::new(25, &[MS1, MS1, MS1])
            .path("cooperative-multi")
            .named("cooperative multi-device, 3 clients")],
        TOLERANCE,
    );
}

/// Launches recorded by stream capture run when the graph is launched, not at capture: they
/// are billed once, at `cuGraphLaunch`, at the graph's measured cost. Each batch of twenty
/// 1 ms kernels is captured and its graph launched once, at 25 %, through the linked, dlsym
/// and cuGetProcAddress clients (each on its own GPU). On the device's timeline the slice
/// runs at its share, and the clients' own clocks show where the throttle made them wait:
/// not inside the capture. Billed at capture too, the captured launches carried 20 of every
/// 21 debits and the clients spent about 70 % of their time capturing (asleep in
/// `cuLaunchKernel` while the global capture mode forbids other threads' unsafe calls).
#[test]
fn launches_recorded_by_stream_capture_are_billed_once_when_the_graph_runs() {
    let target = 25.0;
    let runs: Vec<_> = KINDS
        .into_iter()
        .map(|kind| {
            std::thread::spawn(move || {
                let gpu = FakeGpu::start("v100");
                let slice = Slice::builder().device(0, "8GiB", Some(25)).build();
                let env = slice.env(&gpu);
                let t0 = now();
                let client = start(kind, launch_args(MS1, "capture", RUN_S), env);
                until(t0 + SETTLE_NS + WINDOW_NS);
                let busy = busy_percent(&gpu, None, t0 + SETTLE_NS, WINDOW_NS);
                (kind, busy, client.join().expect("client thread"))
            })
        })
        .collect();
    for run in runs {
        let (kind, busy, out) = run.join().expect("case thread");
        let capturing = out["capture_ns"].as_u64().expect("capture_ns") as f64 * 100.0
            / out["elapsed_ns"].as_u64().expect("elapsed_ns") as f64;
        eprintln!(
            "capture {kind:?}: target {target}%  device {busy:>5.1}%  capturing {capturing:.1}% of the run"
        );
        assert_eq!(out["ok"], out["launches"], "driver codes kept: {out}");
        assert!(
            out["launches"].as_u64().unwrap_or(0) > 21,
            "several captured batches ran: {out}"
        );
        assert!(
            (busy - target).abs() <= TOLERANCE,
            "{kind:?}: {busy:.1}% for a {target}% share"
        );
        // Measured unloaded 0.1-0.5 % (billed at capture: ~70 %); the margin is for a loaded
        // 2-core machine where the capture's own 20 calls may wait for a core.
        assert!(
            capturing < CAPTURE_SLEEPS_PERCENT,
            "{kind:?}: {capturing:.1}% of the run inside captures: captured launches were billed"
        );
    }
}

/// Far below the ~70 % a capture that sleeps for its launches' tokens takes, far above the
/// capture's own call time.
const CAPTURE_SLEEPS_PERCENT: f64 = 25.0;

/// A real driver's NVML (the fake's realistic mode: 1/6 s sample periods published a period
/// late, 5 % of per-process samples missing, idle processes unlisted, integer percent): the
/// share still holds for short-kernel, many-process and graph slices. (10 ms kernels read
/// within 5 points in most runs but not all, see docs/performance.md: not asserted here.)
#[test]
fn the_share_holds_on_a_real_drivers_coarse_late_and_gappy_samples() {
    check(
        &[
            Case::new(50, &[US10]).realistic(),
            Case::new(25, &[MS1, MS1, MS1, MS1]).realistic(),
            Case::new(75, &[MS1]).realistic(),
            Case::new(50, &[MS1]).path("graph").realistic(),
        ],
        TOLERANCE,
    );
}

/// NVML reports host PIDs (`FAKEGPU_PID_OFFSET`): the throttle must find the slice's own
/// samples among them. Were discovery to fail, it would steer on the whole device (the
/// neighbour included) and the slice would sink far below its share.
#[test]
fn a_slice_next_to_a_busy_neighbour_keeps_its_share_with_host_pids() {
    check(
        &[
            Case::new(30, &[MS1]).neighbour().pid_offset(),
            Case::new(10, &[MS10]).neighbour(),
        ],
        TOLERANCE,
    );
}

/// A compute-only slice (no memory limit: no ledger records its processes) of 20 processes,
/// more than the 14 PIDs the throttle's shared words hold, next to a busy neighbour: every
/// process records its host PID in a region slot of its own, so the leader matches all 20
/// processes' samples. It used to steer on the whole device once the 15th process found the
/// table full (the neighbour counted as the slice's): the slice starved (0.1 %, its clients'
/// runs did not end).
///
/// Measured from when all 20 run: 29.9-30.2 % at a 30 % share. It used to swing (27.6-48 %,
/// one CI run 43 %): twenty processes each held a reservation made at the rate of its time,
/// so a raised rate reached them only after half a second and the controller wound its
/// correction up to the limit; reservations are now rescaled when the rate changes
/// (`bucket::rescale_lead`). Also 29.8-30.0 % with two CPU hogs running. Asserted: within the
/// issue's 5 points (unthrottled, 20 processes next to one neighbour take ~95 %; starving,
/// 0.1 %).
#[test]
fn a_compute_only_slice_of_20_processes_keeps_its_share_next_to_a_neighbour() {
    let case = Case::new(30, &[MS1; 20])
        .named("x20 1ms")
        .compute_only()
        .neighbour();
    let out = run_all(std::slice::from_ref(&case)).remove(0);
    eprintln!(
        "{:<40} target {:>3}%  slice {:>5.1}%  device {:>5.1}%",
        case.name, case.target, out.slice, out.device
    );
    let target = f64::from(case.target);
    assert!(
        out.slice >= target - TOLERANCE,
        "the slice starves next to its neighbour: {:.1}% of a {target}% share",
        out.slice
    );
    assert!(
        out.slice <= target + TOLERANCE,
        "the slice overshoots: {:.1}% of a {target}% share",
        out.slice
    );
    assert!(
        out.device > 85.0,
        "the neighbour fills the rest: {:.1}%",
        out.device
    );
}

/// A compute-only slice whose processes NVML names by host PIDs (`FAKEGPU_PID_OFFSET`: as in
/// a container with its own PID namespace, `getpid()` is not what NVML lists, and there is
/// no memory ledger to learn it): the throttle learns its host PID from NVML's list around
/// the first context creation and steers on its own samples, not the neighbour's. It used to
/// steer on the whole device (the neighbour included) and sink far below its share.
#[test]
fn a_compute_only_slice_with_host_pids_keeps_its_share_next_to_a_neighbour() {
    check(
        &[Case::new(30, &[MS1])
            .compute_only()
            .neighbour()
            .pid_offset()],
        TOLERANCE,
    );
}

/// The deprecated launches (`cuLaunchGrid`, `cuLaunchGridAsync`: the legacy C client,
/// tests/shim_c/legacy.c) follow the share like every launch path: 1 ms grid kernels in
/// batches of 20 at 25 %, each path on its own GPU at the same time. Margin: twice the
/// issue's tolerance (unthrottled, the device would be ~100 % busy).
#[test]
fn deprecated_grid_launches_follow_their_share() {
    let program = cuda_e2e::legacy_client(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let target = 25.0;
    let handles: Vec<_> = ["grid", "grid-async"]
        .into_iter()
        .map(|path| {
            let program = program.clone();
            std::thread::spawn(move || {
                let gpu = FakeGpu::start("v100");
                let slice = Slice::builder().device(0, "8GiB", Some(25)).build();
                let env = slice.env(&gpu);
                let t0 = now();
                let client = std::thread::spawn(move || {
                    let run_s = format!("{RUN_S}");
                    let args = ["launch", path, "20", run_s.as_str()];
                    let cmd = cuda_e2e::command(&program, &args, &env);
                    cuda_e2e::run_with_timeout(cmd, None, cuda_e2e::DEFAULT_TIMEOUT)
                });
                until(t0 + SETTLE_NS + WINDOW_NS);
                let busy = busy_percent(&gpu, None, t0 + SETTLE_NS, WINDOW_NS);
                let out = client.join().expect("client thread");
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(
                    out.status.success(),
                    "{path}: {stdout}{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                (path, busy, stdout)
            })
        })
        .collect();
    for handle in handles {
        let (path, busy, stdout) = handle.join().expect("case thread");
        eprintln!("deprecated {path:<12} target {target:>3}%  device {busy:>5.1}%");
        let line = stdout
            .lines()
            .find(|l| l.starts_with("launch "))
            .unwrap_or_else(|| panic!("{path}: no launch line: {stdout}"));
        let count = |key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{path}: no {key} in {line}"))
        };
        assert!(count("launches=") > 0, "{path}: {line}");
        assert_eq!(
            count("ok="),
            count("launches="),
            "{path}: driver codes kept"
        );
        assert!(
            (busy - target).abs() <= 2.0 * TOLERANCE,
            "{path}: {busy:.1}% for a {target}% share"
        );
    }
}

/// Two containers on one GPU with shares 30 and 70: throughput 3:7 within 10 %.
#[test]
fn two_containers_at_30_and_70_split_the_device_3_to_7() {
    let gpu = FakeGpu::start("v100");
    let small = Slice::builder().device(0, "8GiB", Some(30)).build();
    let large = Slice::builder().device(0, "8GiB", Some(70)).build();
    let (a, pid_a) = start_awaited(
        &gpu,
        ClientKind::Linked,
        launch_args(MS1, "kernel", RUN_S),
        small.env(&gpu),
    );
    let (b, pid_b) = start_awaited(
        &gpu,
        ClientKind::Cudarc,
        launch_args(MS1, "kernel", RUN_S),
        large.env(&gpu),
    );
    let t0 = now();
    until(t0 + SETTLE_NS + WINDOW_NS);
    let x = busy_percent(&gpu, Some(pid_a), t0 + SETTLE_NS, WINDOW_NS);
    let y = busy_percent(&gpu, Some(pid_b), t0 + SETTLE_NS, WINDOW_NS);
    finish(vec![a, b]);
    let ratio = x / y;
    eprintln!("30:70 -> {x:.1}% : {y:.1}% (ratio {ratio:.3}, target 0.429)");
    assert!(
        (ratio / (3.0 / 7.0) - 1.0).abs() <= 0.10,
        "3:7 within 10 %: {x:.1}% : {y:.1}%"
    );
}

/// Stricter wins in the region, and the throttle follows it: a leader started at 50 % steers
/// at 25 % once a process with a tighter file joins, and a process of the slice whose own file
/// sets no share (memory only) is throttled by the share the region holds.
#[test]
fn the_region_share_binds_every_process_of_the_slice() {
    let gpu = FakeGpu::start("v100");
    let first = Slice::builder().device(0, "8GiB", Some(50)).build();
    let region = first.region_path().display().to_string();
    let joining = |devices: &str| {
        Slice::builder()
            .raw(&format!(
                r#"{{"version":1,"region":"{region}","policy":"cap","devices":[{devices}]}}"#
            ))
            .build()
    };
    let tighter = joining(r#"{"index":0,"memory":"8GiB","compute":25}"#);
    let memory_only = joining(r#"{"index":0,"memory":"8GiB"}"#);
    let (a, _) = start_awaited(
        &gpu,
        ClientKind::Linked,
        launch_args(MS1, "kernel", RUN_S + 1.0),
        first.env(&gpu),
    );
    let (b, _) = start_awaited(
        &gpu,
        ClientKind::Cudarc,
        launch_args(MS1, "kernel", RUN_S + 0.5),
        tighter.env(&gpu),
    );
    let (c, _) = start_awaited(
        &gpu,
        ClientKind::ProcAddr,
        launch_args(MS1, "kernel", RUN_S),
        memory_only.env(&gpu),
    );
    let t0 = now();
    until(t0 + SETTLE_NS + WINDOW_NS);
    let used = busy_percent(&gpu, None, t0 + SETTLE_NS, WINDOW_NS);
    finish(vec![a, b, c]);
    eprintln!("50 % then 25 % then memory only: {used:.1}% of the device");
    assert!(
        (used - 25.0).abs() <= TOLERANCE,
        "the whole slice runs at the region's 25 %: {used:.1}%"
    );
}

#[test]
fn burst_uses_an_idle_device_and_gives_it_back_within_200_ms() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder()
        .device(0, "8GiB", Some(25))
        .policy("burst")
        .build();
    let t0 = now();
    let (bursting, slice_pid) = start_awaited(
        &gpu,
        ClientKind::Linked,
        launch_args(MS1, "kernel", 5.0),
        slice.env(&gpu),
    );
    until(t0 + 2_500_000_000);
    let alone = busy_percent(&gpu, None, t0 + 1_500_000_000, 1_000_000_000);
    let (neighbour, neighbour_pid) = start_awaited(
        &gpu,
        ClientKind::Cudarc,
        launch_args(MS1, "kernel", 2.0),
        gpu.env(),
    );
    // The neighbour's start is its first kernel on the timeline, not when we spawned it.
    let mut first_kernel = 0;
    cuda_e2e::wait_until("the neighbour runs", cuda_e2e::DEFAULT_TIMEOUT, || {
        let t = now();
        let ran = gpu
            .truth()
            .busy_ns(0, Some(neighbour_pid), t - 20_000_000, t)
            > 0;
        if ran {
            first_kernel = t - 20_000_000;
        }
        ran
    });
    let from = first_kernel + 200_000_000;
    until(from + 1_000_000_000);
    let shared = busy_percent(&gpu, Some(slice_pid), from, 1_000_000_000);
    finish(vec![bursting, neighbour]);
    eprintln!("burst: alone {alone:.1}%, 200 ms after a neighbour started {shared:.1}%");
    assert!(
        alone > 90.0,
        "alone, burst uses the idle device: {alone:.1}%"
    );
    assert!(
        (shared - 25.0).abs() <= TOLERANCE,
        "200 ms after the neighbour starts the slice is back at 25 % +- 5: {shared:.1}%"
    );
}

/// A `burst` slice at `percent` with `priority` (its own region).
fn burst_slice(percent: u32, priority: &str) -> Slice {
    Slice::builder()
        .raw(&format!(
            r#"{{"version":1,"region":"{{region}}","policy":"burst","priority":"{priority}","devices":[{{"index":0,"compute":{percent}}}]}}"#
        ))
        .build()
}

/// A burst test's client environment: with `THROTTLE_NVML=realistic`, the fake's realistic
/// NVML sampling too (as the accuracy matrix does), so the idle-time sharing can be measured on
/// a real driver's coarse, late samples.
fn burst_env(mut env: Env) -> Env {
    if std::env::var("THROTTLE_NVML").is_ok_and(|m| m == "realistic") {
        env.extend(realistic_nvml());
    }
    env
}

/// How long after a capped neighbour's first kernel it runs at its share (less the 5 points
/// of tolerance) next to slices that were bursting into the idle time: the stated give-back time.
const GIVE_BACK_NS: u64 = 300_000_000;

/// Two `burst` slices at 30 % and 20 % that both want the whole device split it 3:2 (the idle
/// time in proportion to their shares, not all-or-nothing: each used to take all of it while
/// the other looked idle and drop to its share when not), and a capped neighbour at 40 % that
/// becomes busy runs at its share within `GIVE_BACK_NS`, with neither bursting slice below
/// its own share. Measured on the device's timeline (docs/performance-history.md, "Idle time").
#[test]
fn bursting_slices_split_idle_time_by_share_and_give_it_back_to_a_capped_neighbour() {
    let gpu = FakeGpu::start("v100");
    let (a, b) = (burst_slice(30, "normal"), burst_slice(20, "normal"));
    let (run_a, pid_a) = start_awaited(
        &gpu,
        ClientKind::Linked,
        launch_args(MS1, "kernel", 9.0),
        burst_env(a.env(&gpu)),
    );
    let (run_b, pid_b) = start_awaited(
        &gpu,
        ClientKind::Cudarc,
        launch_args(MS1, "kernel", 9.0),
        burst_env(b.env(&gpu)),
    );
    // A 3 s window: the excesses settle within about a second and readings a percent apart
    // move them a little now and then.
    let t0 = now();
    let window = 3_000_000_000;
    until(t0 + SETTLE_NS + window);
    let from = t0 + SETTLE_NS;
    let x = busy_percent(&gpu, Some(pid_a), from, window);
    let y = busy_percent(&gpu, Some(pid_b), from, window);
    eprintln!(
        "burst 30 % + 20 %: {x:.1}% + {y:.1}% (ratio {:.2}, target 1.5)",
        x / y
    );

    let capped = Slice::builder().device(0, "8GiB", Some(40)).build();
    let (run_c, pid_c) = start_awaited(
        &gpu,
        ClientKind::ProcAddr,
        launch_args(MS1, "kernel", 2.5),
        burst_env(capped.env(&gpu)),
    );
    let mut first_kernel = 0;
    cuda_e2e::wait_until(
        "the capped neighbour runs",
        cuda_e2e::DEFAULT_TIMEOUT,
        || {
            let t = now();
            let ran = gpu.truth().busy_ns(0, Some(pid_c), t - 20_000_000, t) > 0;
            if ran {
                first_kernel = t - 20_000_000;
            }
            ran
        },
    );
    let from = first_kernel + GIVE_BACK_NS;
    until(from + 1_000_000_000);
    let c = busy_percent(&gpu, Some(pid_c), from, 1_000_000_000);
    let x2 = busy_percent(&gpu, Some(pid_a), from, 1_000_000_000);
    let y2 = busy_percent(&gpu, Some(pid_b), from, 1_000_000_000);
    finish(vec![run_a, run_b, run_c]);
    eprintln!(
        "a capped 40 % neighbour, from {} ms after its start: {c:.1}%; the bursting 30 % and 20 %: {x2:.1}% and {y2:.1}%",
        GIVE_BACK_NS / 1_000_000
    );
    // Measured (docs/performance.md): 92-93 % together, ratio 1.48-1.54 (load average 3-5,
    // and with two CPU hogs). The halving this replaced read 1.04-2.05 (CI failed on 2.05);
    // all-or-nothing burst gave 50 % (each capped while the other was busy); an even split
    // of the idle time gives a ratio near 1.
    assert!(x + y > 75.0, "the idle time is used: {x:.1}% + {y:.1}%");
    assert!(
        ((x / y) / 1.5 - 1.0).abs() <= 0.2,
        "split 3:2 within 20 %: {x:.1}% : {y:.1}%"
    );
    // Measured: the neighbour 40.0-41.0 %, the bursting slices 35.1-35.7 and 23.7-24.6 %; at
    // load average 12 (the neighbour's launcher short of CPU, so the device had idle time
    // the bursting slices took) the halving gave 34.0 %, 36.0 % and 25.0 %. Twice the
    // issue's tolerance on each side.
    assert!(
        c >= 40.0 - 2.0 * TOLERANCE,
        "the capped neighbour has its share {} ms after it started: {c:.1}%",
        GIVE_BACK_NS / 1_000_000
    );
    assert!(
        x2 <= 30.0 + 2.0 * TOLERANCE && y2 <= 20.0 + 2.0 * TOLERANCE,
        "the bursting slices gave the idle time back: {x2:.1}%, {y2:.1}%"
    );
    assert!(
        x2 >= 30.0 - TOLERANCE && y2 >= 20.0 - TOLERANCE,
        "nobody below its share: {x2:.1}%, {y2:.1}%"
    );
}

/// Priorities order who gets the idle time: two `burst` slices at 30 % that both want the
/// whole device split it evenly at the same priority; marked high and low, the high one gets
/// most of the idle time and the low one keeps its share.
#[test]
fn a_low_priority_bursting_slice_yields_idle_time_to_a_high_priority_one() {
    let split = |first: &'static str, second: &'static str| {
        std::thread::spawn(move || {
            let gpu = FakeGpu::start("v100");
            let (a, b) = (burst_slice(30, first), burst_slice(30, second));
            let (run_a, pid_a) = start_awaited(
                &gpu,
                ClientKind::Linked,
                launch_args(MS1, "kernel", RUN_S + 1.0),
                burst_env(burst_env(a.env(&gpu))),
            );
            let (run_b, pid_b) = start_awaited(
                &gpu,
                ClientKind::Cudarc,
                launch_args(MS1, "kernel", RUN_S + 1.0),
                burst_env(burst_env(b.env(&gpu))),
            );
            // 3 s: the idle loop saws around saturation.
            let (t0, window) = (now(), 3_000_000_000);
            until(t0 + SETTLE_NS + window);
            let x = busy_percent(&gpu, Some(pid_a), t0 + SETTLE_NS, window);
            let y = busy_percent(&gpu, Some(pid_b), t0 + SETTLE_NS, window);
            finish(vec![run_a, run_b]);
            (x, y)
        })
    };
    let even = split("normal", "normal");
    let ranked = split("high", "low");
    let (even, (high, low)) = (
        even.join().expect("case thread"),
        ranked.join().expect("case thread"),
    );
    eprintln!(
        "burst 30 % + 30 %: normal/normal {:.1}% / {:.1}%, high/low {high:.1}% / {low:.1}%",
        even.0, even.1
    );
    // Measured (load average 5 on 2 cores) 0.2-14 points apart at the same priority (the
    // idle loop's saw-tooth), 29-34 points apart marked high and low.
    assert!(
        (even.0 - even.1).abs() <= 3.0 * TOLERANCE,
        "the same priority splits evenly: {even:?}"
    );
    assert!(
        high >= low + 2.0 * TOLERANCE,
        "the high-priority slice gets the idle time first: {high:.1}% vs {low:.1}%"
    );
    assert!(
        low >= 30.0 - TOLERANCE,
        "the low-priority slice keeps its share: {low:.1}%"
    );
}

/// No share: the shim must not change what the device does (within noise), and a throttled
/// process exits as soon as its work is done (the watcher never delays exit).
#[test]
fn no_share_is_free_throttled_processes_exit_promptly_and_keep_driver_codes() {
    let gpu = FakeGpu::start("v100");
    // 10 us kernels: launch-bound, so a per-launch cost would show. Throughput is the
    // client's kernels per second; runs alternate and the best of five counts on each side.
    // Margin, measured: unloaded and with two `yes` hogs the two sides were within 0.7 %;
    // with three hogs plus a parallel cargo build on the 2-core machine, up to 13 % apart,
    // either way (the launch loop waits for a core), so the test allows 15 %. The per-launch cost itself is the criterion
    // bench's (`launch_no_share`: ~0 ns added, docs/performance.md).
    let throughput = |env: &Env| {
        let out = Client::run(
            ClientKind::Linked,
            &launch_args(US10, "kernel", 0.4)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            env,
        );
        let launches = out["launches"].as_u64().expect("launches") as f64;
        launches * 1e9 / out["elapsed_ns"].as_u64().expect("elapsed") as f64
    };
    let no_share = Slice::builder().device(0, "8GiB", None).build();
    let (mut plain, mut shimmed) = (0.0f64, 0.0f64);
    for _ in 0..5 {
        plain = plain.max(throughput(&gpu.env()));
        shimmed = shimmed.max(throughput(&no_share.env(&gpu)));
    }
    let ratio = shimmed / plain;
    eprintln!("no share: {plain:.0} kernels/s without the shim, {shimmed:.0} with it ({ratio:.3})");
    assert!(
        (ratio - 1.0).abs() <= 0.15,
        "no share, same throughput: {plain:.0} vs {shimmed:.0} kernels/s"
    );

    // A throttled process whose work is done exits at once, although its watcher thread is
    // asleep and one launch may still be waiting for tokens.
    let slice = Slice::builder().device(0, "8GiB", Some(10)).build();
    let started = Instant::now();
    let out = Client::run(
        ClientKind::Cudarc,
        &[
            "launch",
            "--kernels",
            "2",
            "--ns-per-wave",
            "10000000",
            "--duration-s",
            "0.5",
        ],
        &slice.env(&gpu),
    );
    let wall = started.elapsed();
    let elapsed = Duration::from_nanos(out["elapsed_ns"].as_u64().expect("elapsed"));
    eprintln!("throttled client: scenario {elapsed:?}, process {wall:?}");
    assert!(
        wall < elapsed + Duration::from_millis(1500),
        "exit is not delayed: scenario {elapsed:?}, process {wall:?}"
    );

    // Launch errors pass through the throttle unchanged.
    let out = Client::run(
        ClientKind::Linked,
        &[
            "launch",
            "--path",
            "cooperative",
            "--grid",
            "100000",
            "--kernels",
            "3",
        ],
        &slice.env(&gpu),
    );
    assert_eq!(
        out["codes"]["CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"], out["launches"],
        "the driver's code, not the throttle's: {out}"
    );
}

/// The watcher thread's CPU time, from /proc: under 1 % of a core.
#[test]
fn the_watcher_uses_under_one_percent_of_a_core_and_status_shows_its_measurement() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", Some(25)).build();
    let (client, pid) = start_awaited(
        &gpu,
        ClientKind::Linked,
        launch_args(MS1, "kernel", 4.0),
        slice.env(&gpu),
    );
    let mut found = None;
    cuda_e2e::wait_until(
        "the watcher thread exists",
        cuda_e2e::DEFAULT_TIMEOUT,
        || {
            found = watcher_tid(pid);
            found.is_some()
        },
    );
    let tid = found.expect("found");
    let (cpu0, t0) = (thread_cpu_ns(pid, tid), Instant::now());
    std::thread::sleep(Duration::from_secs(3)); // the measurement window
    let (cpu1, t1) = (thread_cpu_ns(pid, tid), Instant::now());

    // While the slice still runs, `gpuslice status` shows the utilisation the throttle
    // measured: near the share, and near what the device's own timeline says.
    let status = std::process::Command::new(cuda_e2e::gpuslice_binary())
        .args(["status", "--json", "--region"])
        .arg(slice.region_path())
        .output()
        .expect("run gpuslice status");
    let truth = busy_percent(&gpu, None, now() - 1_000_000_000, 1_000_000_000);
    finish(vec![client]);
    assert!(status.status.success(), "{status:?}");
    let view: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    let shown = view["devices"][0]["utilization"]
        .as_f64()
        .unwrap_or_else(|| panic!("status shows no utilisation: {view}"));
    eprintln!("status: {shown:.1} %, device timeline over the last second: {truth:.1} %");
    assert!(
        (shown - 25.0).abs() <= 2.0 * TOLERANCE,
        "status {shown} vs share 25"
    );
    assert!(
        (shown - truth).abs() <= 2.0 * TOLERANCE,
        "status {shown} vs truth {truth}"
    );
    let cpu_s = (cpu1 - cpu0) as f64 / 1e9;
    let percent = cpu_s * 100.0 / (t1 - t0).as_secs_f64();
    eprintln!(
        "watcher CPU: {:.2} ms over {:?} = {percent:.3} % of a core",
        cpu_s * 1e3,
        t1 - t0
    );
    // The target is < 1 %; the figure is recorded in docs/performance.md. The test
    // guards against a watcher that spins or polls hot (tens of percent), with room for a
    // loaded 2-core CI machine where every wake-up costs more.
    assert!(percent < SPINNING_WATCHER_PERCENT, "{percent:.3} %");
}

/// Far above the measured ~0.1 % and far below any busy loop.
const SPINNING_WATCHER_PERCENT: f64 = 5.0;

fn watcher_tid(pid: u32) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .find_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            (comm.trim() == "gpuslice-watch")
                .then(|| task.file_name().to_str()?.parse().ok())
                .flatten()
        })
}

/// The exact time one thread has run, in nanoseconds (`schedstat`'s first field). utime and
/// stime are sampled at the scheduler tick (10 ms), which mis-charges a thread that wakes
/// briefly 20 times a second by whole ticks.
fn thread_cpu_ns(pid: u32, tid: u32) -> u64 {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).expect("schedstat");
    stat.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .expect("run time in ns")
}

/// The full matrix for `docs/performance.md` (about a minute and a half).
#[test]
#[ignore]
fn print_table() {
    let mut cases = Vec::new();
    for target in [10, 25, 50, 75, 90] {
        cases.push(Case::new(target, &[MS1]).named("1 process, 1 ms"));
        cases.push(Case::new(target, &[MS1, MS1, MS1, MS1]).named("4 processes, 1 ms"));
        cases.push(
            Case::new(target, &[MS1])
                .neighbour()
                .named("next to a neighbour, 1 ms"),
        );
        cases.push(Case::new(target, &[US10]).named("10 us"));
        cases.push(Case::new(target, &[MS10]).named("10 ms"));
        cases.push(Case::new(target, &[US10, MS1, MS10]).named("mixed 10us+1ms+10ms"));
        cases.push(
            Case::new(target, &[MS1])
                .path("graph")
                .named("graph launches, 1 ms"),
        );
    }
    // `THROTTLE_CASES=10 ms,mixed` keeps the cases whose name contains one of the words.
    if let Ok(only) = std::env::var("THROTTLE_CASES") {
        let words: Vec<&str> = only.split(',').map(str::trim).collect();
        cases.retain(|c| words.iter().any(|w| c.name.contains(w)));
    }
    println!("| case | target | achieved (slice busy, fake GPU truth) |");
    println!("|---|---|---|");
    for group in cases.chunks(3) {
        for (case, out) in group.iter().zip(run_all(group)) {
            println!("| {} | {}% | {:.1}% |", case.name, case.target, out.slice);
        }
    }
}

/// Host-PID discovery that fails logs one line and falls back to steering on the whole
/// device: throttling stays on, under `burst` too (the neighbours are unknown, never taken
/// for idle). NVML shows offset PIDs, and the process learns nothing at its context creation:
/// its own file sets neither a memory limit (no ledger measures the context) nor a share (the
/// throttle does not diff NVML's list there); the share is the one an earlier process of the
/// slice put in the region. (A compute-only process diffs the list and is found:
/// `a_compute_only_slice_with_host_pids_keeps_its_share_next_to_a_neighbour`.)
#[test]
fn failed_host_pid_discovery_logs_once_and_still_throttles() {
    let runs: Vec<_> = ["cap", "burst"]
        .into_iter()
        .map(|policy| std::thread::spawn(move || (policy, discovery_fails(policy))))
        .collect();
    for run in runs {
        let (policy, (lines, used, stderr)) = run.join().expect("case thread");
        eprintln!("{policy}: discovery failed: {lines} line(s), {used:.1}% at a 30 % share");
        assert_eq!(lines, 1, "{policy}: one line, once: {stderr}");
        assert!(
            (used - 30.0).abs() <= TOLERANCE,
            "{policy}: still throttled: {used:.1}%"
        );
    }
}

/// One slice at 30 % under `policy` whose host PID cannot be found: (lines logged about it,
/// device busy percent in the steady-state window, stderr).
fn discovery_fails(policy: &str) -> (usize, f64, String) {
    let gpu = FakeGpu::start("v100");
    let first = Slice::builder()
        .raw(&format!(
            r#"{{"version":1,"region":"{{region}}","policy":"{policy}","devices":[{{"index":0,"compute":30}}]}}"#
        ))
        .build();
    // The first process binds the region entry's 30 % and exits.
    let bind = [
        "launch",
        "--kernels",
        "1",
        "--ns-per-wave",
        "1000",
        "--duration-s",
        "0",
    ];
    let out = Client::run(ClientKind::Linked, &bind, &first.env(&gpu));
    assert_eq!(out["ok"], out["launches"], "{out}");
    let region = first.region_path().display().to_string();
    let slice = Slice::builder()
        .raw(&format!(
            r#"{{"version":1,"region":"{region}","policy":"{policy}","devices":[{{"index":0}}]}}"#
        ))
        .build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_PID_OFFSET".into(), "100000".into()));
    let t0 = now();
    let client = std::thread::spawn(move || {
        let args = launch_args(MS1, "kernel", RUN_S);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Client::output(ClientKind::Linked, &refs, &env)
    });
    until(t0 + SETTLE_NS + WINDOW_NS);
    let used = busy_percent(&gpu, None, t0 + SETTLE_NS, WINDOW_NS);
    let output = client.join().expect("client thread");
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines = stderr
        .lines()
        .filter(|l| l.contains("cannot tell this process's host PID"))
        .count();
    (lines, used, stderr)
}

/// A driver whose per-process samples never come (here: the fake's realistic NVML with every
/// per-process sample dropped; on a real host, per-process accounting off, or timestamps the
/// throttle never finds newer than its last one). The throttle must not silently keep its
/// 1 ms-per-kernel start-up guess, which lets 3 ms kernels at a 20 % share take 60 % of the
/// card: it says so once and steers on the device's utilisation.
#[test]
fn a_slice_that_never_gets_process_samples_says_so_and_still_follows_its_share() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", Some(20)).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_NVML_MODE".into(), "realistic".into()));
    env.push(("FAKEGPU_NVML_PROC_DROP_PERMILLE".into(), "1000".into()));
    // Fallback after 2.5 s of silence, then at most 0.5 s of start-up debt and a settle at
    // the fallback's 500 ms steps.
    let (settle, run_s) = (6_000_000_000, 8.5);
    let t0 = now();
    let client = std::thread::spawn(move || {
        let args = launch_args(3 * MS1, "kernel", run_s);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Client::output(ClientKind::Linked, &refs, &env)
    });
    until(t0 + settle + WINDOW_NS);
    let used = busy_percent(&gpu, None, t0 + settle, WINDOW_NS);
    let output = client.join().expect("client thread");
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines = stderr
        .lines()
        .filter(|l| l.contains("no per-process utilisation sample"))
        .count();
    eprintln!("no process samples: {lines} line(s), {used:.1}% at a 20 % share");
    assert_eq!(lines, 1, "said once: {stderr}");
    assert!(
        (used - 20.0).abs() <= TOLERANCE,
        "still steered: {used:.1}% at a 20 % share"
    );
}

/// One process of a slice at `share` % launching `ns` kernels (batches, as `print_table`)
/// for `run_s` seconds, from a fresh fake GPU: its NVML PID, the instant of its first
/// kernel on the device's timeline, and the end of the run.
fn start_up_run(share: u32, ns: u64, run_s: f64) -> (FakeGpu, u32, u64, u64) {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", Some(share)).build();
    let (client, pid) = start_awaited(
        &gpu,
        ClientKind::Linked,
        launch_args(ns, "kernel", run_s),
        slice.env(&gpu),
    );
    let out = client.join().expect("client");
    assert_eq!(out["ok"], out["launches"], "{out}");
    let end = now();
    // The first kernel: scan forward in 1 ms steps from before the run began.
    let truth = gpu.truth();
    let run_ns = (run_s * 1e9) as u64;
    let mut first = end.saturating_sub(run_ns + 1_000_000_000);
    while first < end && truth.busy_ns(0, Some(pid), first, first + 1_000_000) == 0 {
        first += 1_000_000;
    }
    (gpu, pid, first, end)
}

/// A process's first moments under a share are not punished. Kernels of 10 us
/// under the 1 ms start-up guess got 0.29x of a 10 % share in their first 250 ms (0.01x in
/// the first 100 ms: the guess fell 4x per 50 ms tick while NVML showed nothing); the
/// start-up probe bounds the cost from the process's own launches within a millisecond (on
/// the fake, to the launch interval, ~20 us: NVML's first measurement does the rest). It
/// must not loosen the cap either: no more than 1.5x the share over the first 100 ms or
/// 250 ms. Margins measured on the 2-core machine: `docs/performance-history.md`, "Start-up".
#[test]
fn short_kernels_get_their_share_from_their_first_250_ms_without_overshooting() {
    for share in [10u32, 50] {
        let (gpu, pid, first, _) = start_up_run(share, 10_000, 1.0);
        let target = f64::from(share) / 100.0;
        let truth = gpu.truth();
        let busy =
            |len: u64| truth.busy_ns(0, Some(pid), first, first + len) as f64 / len as f64 / target;
        let (first_100, first_250) = (busy(100_000_000), busy(250_000_000));
        eprintln!(
            "10 us kernels at {share} %: {first_100:.2}x of the share in the first 100 ms, {first_250:.2}x in 250 ms"
        );
        assert!(
            first_100 >= START_UP_FLOOR_100 && first_250 >= START_UP_FLOOR_250,
            "{share} %: {first_100:.2}x of the share in the first 100 ms, {first_250:.2}x in 250 ms"
        );
        assert!(
            first_100 <= 1.5 && first_250 <= 1.5,
            "{share} %: the start-up estimate loosened the cap: {first_100:.2}x, {first_250:.2}x"
        );
    }
}

/// The least part of its share a process of 10 us kernels gets in its first 100 ms and
/// 250 ms: measured 0.36-1.09x and 0.84-1.08x with the probe (24 runs), 0.01x and 0.29x
/// without it at 10 %.
const START_UP_FLOOR_100: f64 = 0.2;
const START_UP_FLOOR_250: f64 = 0.6;

/// The start-up table of `docs/performance.md` (about a minute): on the device's timeline,
/// from the slice's first kernel, what it got in its first 100 ms and 250 ms, and how long
/// until its busy share over a window (50 ms, or four kernels at the share when longer) is
/// within 1.5x of its share and stays there the next window. `START_UP_NS=10000` runs one
/// kernel length only.
#[test]
#[ignore]
fn print_start_up() {
    let only: Option<u64> = std::env::var("START_UP_NS")
        .ok()
        .and_then(|v| v.parse().ok());
    println!("| share | kernel | first 100 ms (x share) | first 250 ms (x share) | window | within 1.5x after |");
    println!("|---|---|---|---|---|---|");
    for share in [10u32, 50] {
        for ns in [
            1_000u64,
            10_000,
            100_000,
            1_000_000,
            10_000_000,
            100_000_000,
        ] {
            if only.is_some_and(|o| o != ns) {
                continue;
            }
            let step = (4 * ns * 100 / u64::from(share)).max(50_000_000);
            let (gpu, pid, first, end) = start_up_run(share, ns, 3.0);
            let truth = gpu.truth();
            let busy = |from: u64, len: u64| {
                truth.busy_ns(0, Some(pid), from, from + len) as f64 / len as f64
            };
            let target = f64::from(share) / 100.0;
            let within = |u: f64| u >= target / 1.5 && u <= target * 1.5;
            let converged = (0..)
                .map(|i| i * step)
                .take_while(|&at| first + at + 2 * step <= end)
                .find(|&at| within(busy(first + at, step)) && within(busy(first + at + step, step)))
                .map_or("not in the run".to_string(), |at| {
                    format!("{} ms", at / 1_000_000)
                });
            let (early, quarter) = (busy(first, 100_000_000), busy(first, 250_000_000));
            println!(
                "| {share}% | {} | {:.1}% ({:.2}x) | {:.1}% ({:.2}x) | {} ms | {converged} |",
                if ns >= 1_000_000 {
                    format!("{} ms", ns / 1_000_000)
                } else if ns >= 1_000 {
                    format!("{} us", ns / 1_000)
                } else {
                    format!("{ns} ns")
                },
                early * 100.0,
                early / target,
                quarter * 100.0,
                quarter / target,
                step / 1_000_000
            );
        }
    }
}
