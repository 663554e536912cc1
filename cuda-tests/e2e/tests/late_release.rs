//! A driver that frees a dead process's memory late (`FAKEGPU_RELEASE_DELAY_MS`): the slice
//! must not hand a dead member's budget to another process before the card has the memory
//! back, or both hold it at once and the card passes the cap. Judged by the fake's
//! high-water mark, which catches however short an overlap.

use cuda_e2e::{wait_until, Client, ClientKind, FakeGpu, Slice, DEFAULT_TIMEOUT, MIB};

/// Contexts of 100 MiB, so the holder (100 + 700 MiB) and the waiting process's context fit
/// the 1 GiB slice together and only the waiter's 700 MiB has to wait for the holder's.
const CONTEXT: u64 = 100 * MIB;
const DELAY_MS: u64 = 1500;
/// The region's release timeout (`gpuslice_common::region::RELEASE_TIMEOUT`): the stated
/// bound after which a dead member's budget returns when the driver cannot be asked.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[test]
fn a_dead_members_budget_returns_only_after_the_driver_released_its_memory() {
    let gpu = FakeGpu::start("v100");
    gpu.truth().set_release_delay_ms(DELAY_MS);
    let limit = 1024 * MIB;
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), CONTEXT.to_string()));
    let holder = Client::spawn(ClientKind::Linked, &["hold", "700MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            Client::spawn(
                ClientKind::Cudarc,
                &["alloc-retry", "700MiB", "--max-ms", "30000"],
                &env,
            )
        });
        // The waiter's context is on the card (so its retries have begun, refused), then the
        // holder dies without freeing anything.
        wait_until("the waiter's context", DEFAULT_TIMEOUT, || {
            gpu.truth().used_memory(0) >= CONTEXT + 700 * MIB + CONTEXT
        });
        holder.kill();
        let first_look = std::time::Instant::now();
        let waiter = waiter.join().unwrap();
        let out = &waiter.first;
        eprintln!(
            "late release: waiter {out}; physical peak {} MiB (cap {} MiB); waited {:?}",
            gpu.truth().peak_memory(0) / MIB,
            limit / MIB,
            first_look.elapsed()
        );
        assert_eq!(out["result"], "CUDA_SUCCESS", "{out}");
        assert!(
            out["refused"].as_u64().unwrap() > 0,
            "never had to wait: {out}"
        );
        // The truth: never more on the card than the slice allows (no other process uses it).
        let peak = gpu.truth().peak_memory(0);
        assert!(
            peak <= limit,
            "physical peak {} MiB passed the {} MiB cap: the dead holder's budget came back \
             before the driver released its memory",
            peak / MIB,
            limit / MIB
        );
        assert_eq!(gpu.truth().used_memory(0), CONTEXT + 700 * MIB);
        waiter.release();
    });
}

/// A driver much slower than any timer of the shim (20 s; the region's release timeout is
/// 10 s, the time the shim gave a dead slot before): a newcomer that starts after that timeout and asks for the dead member's budget is
/// refused, and sees the dead member's bytes as used, for as long as the driver lists the dead
/// process; the budget comes back only when the driver has released the memory.
#[test]
fn a_slow_driver_keeps_a_dead_members_budget_charged_however_long_it_takes() {
    const SLOW_MS: u64 = 20_000;
    let gpu = FakeGpu::start("v100");
    gpu.truth().set_release_delay_ms(SLOW_MS);
    // The fake holds every dead process's memory that long, the newcomers' contexts too:
    // room for the holder (100 + 700 MiB) and three 100 MiB contexts, not for a second 700.
    let limit = 1300 * MIB;
    let slice = Slice::builder().device(0, "1300MiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), CONTEXT.to_string()));
    let holder = Client::spawn(ClientKind::Linked, &["hold", "700MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    holder.kill();
    let died = std::time::Instant::now();
    // A first newcomer right away: its start sees the dead slot (the clock of every timer
    // of the region starts there) and its allocation is refused.
    let early = Client::run(ClientKind::Cudarc, &["alloc", "700MiB"], &env);
    assert_eq!(
        early["results"][0], "CUDA_ERROR_OUT_OF_MEMORY",
        "right after the death: {early}"
    );
    // Past the region's release timeout (10 s), while the driver still holds the memory. A
    // sleep, not a wait: what is tested is that time alone changes nothing.
    let past_timeout = std::time::Duration::from_secs(11);
    std::thread::sleep(past_timeout.saturating_sub(died.elapsed()));
    assert!(
        gpu.truth().used_memory(0) >= CONTEXT + 700 * MIB,
        "the fake released the dead holder early: the test needs a slower driver"
    );
    let info = Client::run(ClientKind::Linked, &["meminfo"], &env);
    let late = Client::run(ClientKind::ProcAddr, &["alloc", "700MiB"], &env);
    let still_held = gpu.truth().used_memory(0) >= CONTEXT + 700 * MIB;
    eprintln!(
        "slow driver: {:?} after the death: meminfo {info}, alloc {late}; physical peak {} MiB",
        died.elapsed(),
        gpu.truth().peak_memory(0) / MIB
    );
    assert!(
        still_held,
        "the fake released the dead holder during the check"
    );
    assert_eq!(
        late["results"][0],
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{:?} after the death the dead holder's budget came back without the driver: {late}",
        died.elapsed()
    );
    // What the newcomer sees meanwhile: the dead holder's 700 MiB (and context) as used.
    assert!(
        info["free"].as_u64().unwrap_or(u64::MAX) <= limit - CONTEXT - (CONTEXT + 700 * MIB),
        "a newcomer's free memory while the driver holds the dead member's: {info}"
    );
    // Once the driver lets go, the budget comes back.
    let waiter = Client::spawn(
        ClientKind::Cudarc,
        &["alloc-retry", "700MiB", "--max-ms", "30000"],
        &env,
    );
    let out = &waiter.first;
    eprintln!(
        "slow driver: waiter {out} {:?} after the death",
        died.elapsed()
    );
    assert_eq!(out["result"], "CUDA_SUCCESS", "{out}");
    assert!(
        died.elapsed() >= std::time::Duration::from_millis(SLOW_MS),
        "the budget came back before the driver released the memory"
    );
    let peak = gpu.truth().peak_memory(0);
    assert!(
        peak <= limit,
        "physical peak {} MiB passed the {} MiB cap",
        peak / MIB,
        limit / MIB
    );
    waiter.release();
}

/// Without NVML (a container given only the `compute` driver capability), nothing can say
/// when the driver let go of a dead member's memory: its budget returns only after the
/// region's release timeout (10 s), never at once on the kernel's word that the process is
/// gone, while a driver that frees late still holds it (1.5 s here).
#[test]
fn without_nvml_a_dead_members_budget_returns_only_after_the_stated_bound() {
    let gpu = FakeGpu::start("v100");
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        std::fs::remove_file(gpu.lib_dir().join(name)).expect("remove the fake NVML");
    }
    gpu.truth().set_release_delay_ms(DELAY_MS);
    let limit = 1024 * MIB;
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), CONTEXT.to_string()));
    // Nothing can measure a context here: the bound is set to what one costs.
    env.push(("GPUSLICE_CONTEXT_OVERHEAD".into(), CONTEXT.to_string()));
    gpu.truth().reset_peak_memory(0);
    // cudarc-client opens the driver only (linked-client links NVML and could not start).
    let holder = Client::spawn(ClientKind::Cudarc, &["hold", "700MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // The fake tears a dead process down when its memory is next read, where a real
        // driver does on its own: a reader every 20 ms stands for that (nothing else reads
        // here, NVML being absent).
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                gpu.truth().used_memory(0);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        let waiter = s.spawn(|| {
            Client::spawn(
                ClientKind::Cudarc,
                &["alloc-retry", "700MiB", "--max-ms", "30000"],
                &env,
            )
        });
        wait_until("the waiter's context", DEFAULT_TIMEOUT, || {
            gpu.truth().used_memory(0) >= CONTEXT + 700 * MIB + CONTEXT
        });
        // Timed from before the kill: the waiter may find the holder dead (and the bound's
        // clock start) before `kill` has reaped it.
        let died = std::time::Instant::now();
        holder.kill();
        let waiter = waiter.join().unwrap();
        let waited = died.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let out = &waiter.first;
        eprintln!(
            "no NVML: waiter {out} {waited:?} after the death; physical peak {} MiB (cap {} MiB)",
            gpu.truth().peak_memory(0) / MIB,
            limit / MIB
        );
        assert_eq!(out["result"], "CUDA_SUCCESS", "{out}");
        let peak = gpu.truth().peak_memory(0);
        assert!(
            peak <= limit,
            "physical peak {} MiB passed the {} MiB cap: the dead holder's budget came back \
             while the driver still held its memory",
            peak / MIB,
            limit / MIB
        );
        assert!(
            waited >= RELEASE_TIMEOUT,
            "the budget came back {waited:?} after the death, before the stated bound"
        );
        waiter.release();
    });
}
