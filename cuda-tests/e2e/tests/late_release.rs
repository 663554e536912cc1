//! A driver that frees a dead process's memory late (`FAKEGPU_RELEASE_DELAY_MS`): the slice
//! must not hand a dead member's budget to another process before the card has the memory
//! back, or both hold it at once and the card passes the cap. Judged by the fake's
//! high-water mark, which catches however short an overlap.

use cuda_e2e::{wait_until, Client, ClientKind, FakeGpu, Slice, DEFAULT_TIMEOUT, MIB};

/// Contexts of 100 MiB, so the holder (100 + 700 MiB) and the waiting process's context fit
/// the 1 GiB slice together and only the waiter's 700 MiB has to wait for the holder's.
const CONTEXT: u64 = 100 * MIB;
const DELAY_MS: u64 = 1500;

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
