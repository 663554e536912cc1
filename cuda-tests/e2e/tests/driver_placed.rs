//! Memory the driver places by itself (the stack and printf FIFO limits, a module's or a
//! library's static data, a kernel's local memory), provoked as a hostile tenant would, on the
//! simulated V100 (32 GiB, 80 SMs x 2048 resident threads) under a 1 GiB slice: the shim prices
//! each before the call that places it and refuses what does not fit with OUT_OF_MEMORY (the
//! process goes on), reserves what fits (a peer never gets those bytes) and settles to what
//! the driver holds. Judged by the card's own high-water mark: never a byte above the cap.

use cuda_e2e::{live_ledger_bytes, Client, ClientKind, Env, FakeGpu, Running, Slice, GIB, MIB};

const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
const OK: &str = "CUDA_SUCCESS";

/// The fake's bytes for `pid` on device 0.
fn truth_of(gpu: &FakeGpu, pid: u32) -> u64 {
    gpu.truth()
        .processes(0)
        .iter()
        .filter(|p| p.pid == pid)
        .map(|p| p.used_memory)
        .sum()
}

fn grow(args: &[&str], env: &Env) -> Running {
    let mut all = vec!["driver-growth"];
    all.extend_from_slice(args);
    Client::spawn(ClientKind::Linked, &all, env)
}

/// A V100 and a 1 GiB slice of it, its high-water mark restarted.
fn one_gib_slice() -> (FakeGpu, Slice) {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    gpu.truth().reset_peak_memory(0);
    (gpu, slice)
}

/// The card never held more than the slice.
fn assert_never_above_the_cap(gpu: &FakeGpu, what: &str) {
    let peak = gpu.truth().peak_memory(0);
    eprintln!("{what}: card high-water mark {} MiB", peak / MIB);
    assert!(
        peak <= GIB,
        "{what}: the card held {} MiB for a 1 GiB slice ({} MiB above the cap)",
        peak / MIB,
        (peak - GIB) / MIB
    );
}

/// The driver placed something refused: the call answered OUT_OF_MEMORY and the process went
/// on (its next allocation succeeded).
fn assert_refused_and_going_on(line: &serde_json::Value, step: &str) {
    assert_eq!(line[step], OOM, "{step} refused: {line}");
    assert_eq!(line["after"], OK, "the process goes on: {line}");
}

#[test]
fn a_stack_limit_past_the_slice_is_refused_before_the_driver_places_it() {
    // 8 KiB x 163,840 resident threads is 1.1 GiB past the default stack; 64 KiB and 192 KiB
    // would take 9.8 GiB and 30 GiB of the card.
    for stack in ["8192", "65536", "196608"] {
        let (gpu, slice) = one_gib_slice();
        let running = grow(
            &["100MiB", "--stack", stack, "--load", "0"],
            &slice.env(&gpu),
        );
        assert_refused_and_going_on(&running.first, "stack");
        assert_eq!(
            live_ledger_bytes(&slice.region_path()),
            truth_of(&gpu, running.pid())
        );
        assert!(running.release().success());
        assert_never_above_the_cap(&gpu, &format!("stack {stack}"));
    }
}

#[test]
fn a_stack_limit_within_the_slice_is_charged_as_the_driver_holds_it() {
    let (gpu, slice) = one_gib_slice();
    // 2 KiB is 1 KiB per thread past the default: 160 MiB. 300 + 100 + 160 fit, and 400 MiB
    // more would not have if the stack were not counted... but here they fit: 960 MiB.
    let running = grow(
        &[
            "100MiB", "--stack", "2048", "--load", "0", "--after", "400MiB",
        ],
        &slice.env(&gpu),
    );
    let line = &running.first;
    assert_eq!(line["stack"], OK, "{line}");
    assert_eq!(line["after"], OK, "{line}");
    let truth = truth_of(&gpu, running.pid());
    assert_eq!(
        live_ledger_bytes(&slice.region_path()),
        truth,
        "charged as held"
    );
    assert!(running.release().success());
    // Past the room left by the stack, the next allocation is refused.
    let running = grow(
        &[
            "100MiB", "--stack", "2048", "--load", "0", "--after", "500MiB",
        ],
        &slice.env(&gpu),
    );
    assert_eq!(running.first["stack"], OK, "{}", running.first);
    assert_eq!(running.first["after"], OOM, "{}", running.first);
    assert!(running.release().success());
    assert_never_above_the_cap(&gpu, "stack 2048");
}

#[test]
fn a_printf_fifo_past_the_slice_is_refused_and_one_within_it_charged() {
    let (gpu, slice) = one_gib_slice();
    let running = grow(
        &["100MiB", "--fifo", "2GiB", "--load", "0"],
        &slice.env(&gpu),
    );
    assert_refused_and_going_on(&running.first, "fifo");
    assert!(running.release().success());
    // 65 MiB is 64 MiB past the 1 MiB default.
    let running = grow(
        &["100MiB", "--fifo", "65MiB", "--load", "0"],
        &slice.env(&gpu),
    );
    assert_eq!(running.first["fifo"], OK, "{}", running.first);
    let truth = truth_of(&gpu, running.pid());
    assert_eq!(
        live_ledger_bytes(&slice.region_path()),
        truth,
        "charged as held"
    );
    assert!(running.release().success());
    assert_never_above_the_cap(&gpu, "printf FIFO");
}

/// A module (or library) with `static` bytes of static data, in each way the driver places
/// it: (label, extra env, client arguments).
fn placements() -> Vec<(&'static str, Option<&'static str>, Vec<&'static str>)> {
    vec![
        ("module, lazy (data at the load)", None, vec![]),
        ("module, eager", Some("EAGER"), vec![]),
        (
            "library, lazy, at its first launch",
            None,
            vec!["--library", "1"],
        ),
        (
            "library, lazy, at its global's lookup",
            None,
            vec!["--library", "1", "--global", "1", "--lookup", "0"],
        ),
        ("library, eager", Some("EAGER"), vec!["--library", "1"]),
    ]
}

fn env_with(slice: &Slice, gpu: &FakeGpu, loading: Option<&str>) -> Env {
    let mut env = slice.env(gpu);
    if let Some(mode) = loading {
        env.push(("CUDA_MODULE_LOADING".into(), mode.into()));
    }
    env
}

#[test]
fn a_module_with_static_data_past_the_slice_is_refused_however_it_is_placed() {
    for (what, loading, extra) in placements() {
        let (gpu, slice) = one_gib_slice();
        let mut args = vec!["100MiB", "--static", "2GiB"];
        args.extend(&extra);
        let running = grow(&args, &env_with(&slice, &gpu, loading));
        assert_refused_and_going_on(&running.first, "load");
        assert!(running.release().success());
        assert_never_above_the_cap(&gpu, &format!("2 GiB of static data, {what}"));
    }
}

#[test]
fn a_module_within_the_slice_is_reserved_before_it_is_placed_and_settles_to_the_card() {
    for (what, loading, extra) in placements() {
        let (gpu, slice) = one_gib_slice();
        let mut args = vec!["100MiB", "--static", "200MiB"];
        args.extend(&extra);
        let running = grow(&args, &env_with(&slice, &gpu, loading));
        let line = &running.first;
        assert_eq!(line["load"], OK, "{what}: {line}");
        assert_eq!(line["after"], OK, "{what}: {line}");
        let truth = truth_of(&gpu, running.pid());
        let ledger = live_ledger_bytes(&slice.region_path());
        assert!(
            truth >= 300 * MIB + 100 * MIB + 190 * MIB,
            "{what}: the driver placed the module: {truth}"
        );
        assert_eq!(ledger, truth, "{what}: the ledger holds the card's bytes");
        assert!(running.release().success());
        assert_never_above_the_cap(&gpu, &format!("200 MiB of static data, {what}"));
    }
}

#[test]
fn a_kernel_whose_local_memory_does_not_fit_is_refused_at_its_lookup() {
    for (what, extra) in [("module", vec![]), ("library", vec!["--library", "1"])] {
        let (gpu, slice) = one_gib_slice();
        // 16 KiB per thread x 163,840 threads: 2.3 GiB past the default stack.
        let mut args = vec!["100MiB", "--local", "16KiB"];
        args.extend(&extra);
        let running = grow(&args, &slice.env(&gpu));
        assert_eq!(running.first["load"], OK, "{what}: {}", running.first);
        assert_refused_and_going_on(&running.first, "lookup");
        assert!(running.release().success());
        assert_never_above_the_cap(&gpu, &format!("16 KiB of local memory, {what}"));
    }
}

#[test]
fn a_kernels_local_memory_within_the_slice_is_reserved_at_its_lookup_and_held_after_its_launch() {
    let (gpu, slice) = one_gib_slice();
    // 3 KiB per thread: 2 KiB past the default stack, 320 MiB; with 300 + 100 it fits.
    let running = grow(&["100MiB", "--local", "3KiB"], &slice.env(&gpu));
    let line = &running.first;
    assert_eq!(line["lookup"], OK, "{line}");
    assert_eq!(line["launch"], OK, "{line}");
    let truth = truth_of(&gpu, running.pid());
    assert!(truth >= 300 * MIB + 100 * MIB + 320 * MIB, "{truth}");
    assert_eq!(
        live_ledger_bytes(&slice.region_path()),
        truth,
        "charged as held"
    );
    assert!(running.release().success());
    assert_never_above_the_cap(&gpu, "3 KiB of local memory");
}

#[test]
fn a_peer_starting_beside_a_module_being_placed_never_gets_its_bytes() {
    let (gpu, slice) = one_gib_slice();
    let env = slice.env(&gpu);
    // 300 + 100 + 400 MiB of module: the slice has 224 MiB left, less than a context (300).
    let loader = grow(&["100MiB", "--static", "400MiB", "--lookup", "0"], &env);
    assert_eq!(loader.first["load"], OK, "{}", loader.first);
    let peer = Client::run(ClientKind::Linked, &["alloc", "2MiB"], &env);
    let refused = |v: &serde_json::Value| v == OOM;
    assert!(
        refused(&peer["result"]) || refused(&peer["error"]),
        "the peer is refused, at its context or its allocation: {peer}"
    );
    assert!(loader.release().success());
    assert_never_above_the_cap(&gpu, "a peer after a 400 MiB module");
    // Both at once, three times: whichever is first, the card never holds both.
    for round in 0..3 {
        gpu.truth().reset_peak_memory(0);
        let peer = std::thread::spawn({
            let env = env.clone();
            move || Client::run(ClientKind::Linked, &["alloc", "2MiB"], &env)
        });
        let loader = grow(&["100MiB", "--static", "400MiB", "--lookup", "0"], &env);
        let peer = peer.join().expect("peer thread");
        let peer_ok = peer["result"] == OK;
        let loaded = loader.first["load"] == OK && loader.first["fill"] == OK;
        assert!(
            !(peer_ok && loaded),
            "round {round}: both got their bytes: {peer} / {}",
            loader.first
        );
        assert!(loader.release().success());
        assert_never_above_the_cap(
            &gpu,
            &format!("a peer beside a 400 MiB module, round {round}"),
        );
    }
}
