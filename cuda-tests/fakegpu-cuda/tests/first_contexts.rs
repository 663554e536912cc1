//! Many threads of one fresh process calling `cuInit` and creating their first contexts at the
//! same instant, through the built `libfakegpu_cuda.so` and no shim: every thread must get a
//! working context and allocation, and the card must hold exactly what the live contexts and
//! allocations hold. A race in the fake's own start-up (one thread's late `cuInit` wiping what
//! another thread already made) would fake or hide shim results in every multi-threaded test.
//!
//! The race can only happen at a process's first `cuInit`, so each trial is a fresh child
//! process: this test binary re-executes itself with `FAKEGPU_TEST_ROLE=first-contexts` and
//! `--ignored --exact child_role`, which runs the ignored `child_role` entry point as the trial.
//! A normal run lists `child_role` as ignored, never as a pass.

use libloading::{Library, Symbol};
use std::ffi::{c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;

const SUCCESS: u32 = 0;
const MIB: u64 = 1 << 20;
const THREADS: usize = 32;
const TRIALS: usize = 20;
/// Context overhead in the trials: small, so 32 contexts fit on the default card easily.
const CTX_OVERHEAD: u64 = 4 * MIB;

fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .unwrap()
        .join("libfakegpu_cuda.so")
}

fn sym<T: Copy>(lib: &'static Library, name: &str) -> T {
    // SAFETY: the caller names a symbol whose C signature matches T.
    let s: Symbol<T> =
        unsafe { lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"));
    *s
}

struct Api {
    init: unsafe extern "C" fn(c_uint) -> u32,
    ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> u32,
    ctx_destroy: unsafe extern "C" fn(*mut c_void) -> u32,
    retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32,
    release: unsafe extern "C" fn(c_int) -> u32,
    set_current: unsafe extern "C" fn(*mut c_void) -> u32,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> u32,
    free: unsafe extern "C" fn(u64) -> u32,
}

impl Api {
    fn new() -> Api {
        let p = lib_path();
        // SAFETY: loading our own cdylib; its initialisers are Rust statics only.
        let lib = unsafe { Library::new(&p) }.unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let lib: &'static Library = Box::leak(Box::new(lib));
        Api {
            init: sym(lib, "cuInit"),
            ctx_create: sym(lib, "cuCtxCreate_v2"),
            ctx_destroy: sym(lib, "cuCtxDestroy_v2"),
            retain: sym(lib, "cuDevicePrimaryCtxRetain"),
            release: sym(lib, "cuDevicePrimaryCtxRelease_v2"),
            set_current: sym(lib, "cuCtxSetCurrent"),
            alloc: sym(lib, "cuMemAlloc_v2"),
            free: sym(lib, "cuMemFree_v2"),
        }
    }
}

/// One thread's start: cuInit, then its first context (even threads create one, odd threads
/// retain the primary context), then 1 MiB in it. Returns the failures it saw.
fn first_context(api: &Api, i: usize, barrier: &Barrier, holding: &Barrier) -> Vec<String> {
    let mut bad = Vec::new();
    let mut check = |what: &str, r: u32| {
        if r != SUCCESS {
            bad.push(format!("thread {i}: {what} -> {r}"));
        }
        r == SUCCESS
    };
    barrier.wait();
    // SAFETY: plain calls with valid out-pointers, per the CUDA driver API.
    unsafe {
        if !check("cuInit", (api.init)(0)) {
            holding.wait();
            holding.wait();
            return bad;
        }
        let mut ctx = std::ptr::null_mut();
        let created = i.is_multiple_of(2);
        let ok = if created {
            check("cuCtxCreate_v2", (api.ctx_create)(&mut ctx, 0, 0))
        } else {
            check("cuDevicePrimaryCtxRetain", (api.retain)(&mut ctx, 0))
                && check("cuCtxSetCurrent", (api.set_current)(ctx))
        };
        let mut p = 0u64;
        let allocated = ok && check("cuMemAlloc_v2", (api.alloc)(&mut p, MIB as usize));
        // Everybody holds their context and allocation here, so the parent-side check below
        // sees them all at once.
        holding.wait();
        holding.wait();
        if allocated {
            check("cuMemFree_v2", (api.free)(p));
        }
        if ok && created {
            check("cuCtxDestroy_v2", (api.ctx_destroy)(ctx));
        } else if ok {
            check("cuDevicePrimaryCtxRelease_v2", (api.release)(0));
        }
    }
    bad
}

/// 32 threads at once: cuInit, a first context, 1 MiB; the card is checked while all hold,
/// and after all let go.
fn one_round(api: &Api, state: &fakegpu::SharedState) -> Vec<String> {
    let barrier = Barrier::new(THREADS);
    let holding = Barrier::new(THREADS + 1);
    let mut failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (barrier, holding) = (&barrier, &holding);
                s.spawn(move || first_context(api, i, barrier, holding))
            })
            .collect();
        holding.wait();
        // 16 created contexts, the one primary context, 32 allocations of 1 MiB charged as
        // 2 MiB (the allocation granularity).
        let contexts = (THREADS / 2 + 1) as u64;
        let expected = contexts * CTX_OVERHEAD + THREADS as u64 * 2 * MIB;
        let held = state.used_memory(0);
        let mut bad = Vec::new();
        if held != expected {
            bad.push(format!(
                "card holds {} MiB with every thread holding, expected {} MiB",
                held / MIB,
                expected / MIB
            ));
        }
        holding.wait();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .chain(bad)
            .collect()
    });
    let left = state.used_memory(0);
    if left != 0 {
        failures.push(format!(
            "{} MiB left on the card after teardown",
            left / MIB
        ));
    }
    failures
}

/// One trial in this (fresh) process; prints "@@ ok" or "@@ <what failed>".
fn trial() {
    let api = Api::new();
    let state = fakegpu::open_state_at(Path::new(&std::env::var("FAKEGPU_STATE").unwrap()))
        .expect("state file");
    // Round 0 races through the process's first cuInit; round 1 creates contexts at once in
    // an initialised process.
    let mut failures = Vec::new();
    for round in 0..2 {
        failures.extend(
            one_round(&api, &state)
                .into_iter()
                .map(|f| format!("round {round}: {f}")),
        );
    }
    if failures.is_empty() {
        println!("@@ ok");
    } else {
        // The card's figures come last; the first few calls that failed say where.
        let n = failures.len();
        let shown: Vec<&String> = failures
            .iter()
            .take(3)
            .chain(failures.iter().skip(n.max(5) - 2))
            .collect();
        println!(
            "@@ {n} failures: {}",
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}

/// The program of a child process. Ignored in a normal run, so that it never counts as a pass;
/// run alone (`--ignored`) without its parent's role, it fails saying so.
#[test]
#[ignore = "child process entry of thirty_two_threads_create_their_first_contexts_at_once"]
fn child_role() {
    let role = std::env::var("FAKEGPU_TEST_ROLE");
    assert_eq!(
        role.as_deref(),
        Ok("first-contexts"),
        "child_role is the child program of thirty_two_threads_create_their_first_contexts_at_once, \
         which runs it with FAKEGPU_TEST_ROLE=first-contexts; it tests nothing alone"
    );
    trial();
}

#[test]
fn thirty_two_threads_create_their_first_contexts_at_once() {
    let mut failed = Vec::new();
    for t in 0..TRIALS {
        let state = std::env::temp_dir().join(format!(
            "fakegpu-first-contexts-{}-{t}-{}",
            std::process::id(),
            fakegpu::now_ns()
        ));
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_role",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env("FAKEGPU_TEST_ROLE", "first-contexts")
            .env("FAKEGPU_STATE", &state)
            .env("FAKEGPU_CTX_OVERHEAD", CTX_OVERHEAD.to_string())
            .env_remove("FAKEGPU_CONFIG")
            .env_remove("FAKEGPU_DEVICES")
            .env_remove("FAKEGPU_RELEASE_DELAY_MS")
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&state);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let answer = stdout
            .lines()
            .find_map(|l| l.strip_prefix("@@ "))
            .unwrap_or("no answer")
            .to_string();
        if !out.status.success() || answer != "ok" {
            failed.push(format!(
                "trial {t}: {answer} ({}; stderr: {})",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {TRIALS} trials failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
