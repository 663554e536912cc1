//! Compute-share overhead of libgpuslice.so on the launch path (criterion):
//! * `launch_share/{driver,shim}`: `cuLaunchKernel` on the fake directly vs through the
//!   shim's export under a 90 % share, with tokens available (the common launch: one local
//!   atomic debit; a chunk refill from the shared bucket every ~2 ms of refill);
//! * `launch_no_share/{driver,shim}`: the same with a memory-only slice (no share: one
//!   relaxed load decides nothing is to be done).
//!
//! * `graph_launch_{no_share,share}/{driver,shim}`: `cuGraphLaunch` of a captured one-kernel
//!   graph (instantiated through the shim when it exports `cuGraphInstantiateWithFlags`, so
//!   the first launch settles graph memory and the measured ones take the steady path).
//!
//! The shim reads its configuration once per process, so the bench re-runs itself once per
//! scenario (`GPUSLICE_BENCH_THROTTLE=share|none`), passing criterion's arguments on.
//! Kernels take 1 ns on the fake (`ns_per_wave` = 1), so its timeline never backs up.
//!
//! Run: `cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim &&
//! cargo bench -p gpuslice-benches --bench throttle`.

use std::ffi::{c_uint, c_void};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use gpuslice_benches::{
    artifact_dir, launch_once, open_global, prepare_kernel, symbol, use_scratch_slice, LaunchFn,
};

type StreamCreateFn = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> u32;
type BeginCaptureFn = unsafe extern "C" fn(*mut c_void, c_uint) -> u32;
type EndCaptureFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> u32;
type InstantiateFn = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> u32;
type GraphLaunchFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32;

const SCENARIO_ENV: &str = "GPUSLICE_BENCH_THROTTLE";

fn scenario(c: &mut Criterion, share: bool) {
    let dir = artifact_dir();
    let scratch = std::env::temp_dir().join(format!(
        "gpuslice-bench-throttle-{}-{}",
        std::process::id(),
        share
    ));
    use_scratch_slice(&scratch, share.then_some(90));
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    let _nvml = open_global(&dir.join("libfakegpu_nvml.so"));
    let shim = open_global(&dir.join("libgpuslice.so"));
    // SAFETY: live handles of the shim and the fake driver, just opened.
    let kernel = unsafe { prepare_kernel(shim, driver) };
    // SAFETY: cuLaunchKernel's C signature; `driver` is a live handle.
    let direct: LaunchFn = unsafe { symbol(driver, c"cuLaunchKernel") };
    // SAFETY: cuLaunchKernel's C signature; `shim` is a live handle.
    let sliced: LaunchFn = unsafe { symbol(shim, c"cuLaunchKernel") };
    let mut ns_per_wave: u64 = 1;
    let mut params = [(&mut ns_per_wave as *mut u64).cast::<c_void>()];
    if share {
        // Let the watcher learn the cost of these kernels (from the 1 ms guess) so the bench
        // measures the launch with tokens available, not the start-up.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            launch_once(sliced, kernel, &mut params);
        }
    }

    let name = if share {
        "launch_share"
    } else {
        "launch_no_share"
    };
    let mut group = c.benchmark_group(name);
    group.bench_function("driver", |b| {
        b.iter(|| launch_once(direct, kernel, &mut params))
    });
    group.bench_function("shim", |b| {
        b.iter(|| launch_once(sliced, kernel, &mut params))
    });
    group.finish();

    // A captured graph of one 1 ns kernel, launched on its stream.
    // SAFETY: cuStreamCreate's C signature; `driver` is a live handle.
    let stream_create: StreamCreateFn = unsafe { symbol(driver, c"cuStreamCreate") };
    // SAFETY: cuStreamBeginCapture_v2's C signature; `driver` is a live handle.
    let begin: BeginCaptureFn = unsafe { symbol(driver, c"cuStreamBeginCapture_v2") };
    // SAFETY: cuStreamEndCapture's C signature; `driver` is a live handle.
    let end: EndCaptureFn = unsafe { symbol(driver, c"cuStreamEndCapture") };
    // SAFETY: a live handle and a NUL-terminated name.
    let through_shim =
        !unsafe { libc::dlsym(shim, c"cuGraphInstantiateWithFlags".as_ptr()) }.is_null();
    // SAFETY: cuGraphInstantiateWithFlags's C signature; both handles are live.
    let instantiate: InstantiateFn = unsafe {
        symbol(
            if through_shim { shim } else { driver },
            c"cuGraphInstantiateWithFlags",
        )
    };
    // SAFETY: cuGraphLaunch's C signature; `driver` is a live handle.
    let graph_direct: GraphLaunchFn = unsafe { symbol(driver, c"cuGraphLaunch") };
    // SAFETY: cuGraphLaunch's C signature; `shim` is a live handle.
    let graph_sliced: GraphLaunchFn = unsafe { symbol(shim, c"cuGraphLaunch") };
    let (mut stream, mut graph, mut exec) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid out-pointers; the kernel is captured on a created stream, not run.
    unsafe {
        assert_eq!(stream_create(&mut stream, 1), 0);
        assert_eq!(begin(stream, 0), 0);
        let rc = direct(
            kernel.function(),
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        assert_eq!(rc, 0);
        assert_eq!(end(stream, &mut graph), 0);
        assert_eq!(instantiate(&mut exec, graph, 0), 0);
    }
    let graph_launch = |f: GraphLaunchFn| {
        // SAFETY: a live executable graph and its stream.
        assert_eq!(black_box(unsafe { f(exec, stream) }), 0);
    };
    let mut group = c.benchmark_group(format!("graph_{name}"));
    group.bench_function("driver", |b| b.iter(|| graph_launch(graph_direct)));
    group.bench_function("shim", |b| b.iter(|| graph_launch(graph_sliced)));
    group.finish();
}

fn throttle(c: &mut Criterion) {
    match std::env::var(SCENARIO_ENV).as_deref() {
        Ok("share") => scenario(c, true),
        Ok("none") => scenario(c, false),
        _ => {
            // One child per scenario: each loads the shim under its own configuration.
            let exe = std::env::current_exe().expect("bench path");
            for which in ["none", "share"] {
                let status = std::process::Command::new(&exe)
                    .args(std::env::args_os().skip(1))
                    .env(SCENARIO_ENV, which)
                    .status()
                    .expect("run the scenario");
                assert!(status.success(), "scenario {which} failed: {status}");
            }
        }
    }
}

criterion_group!(benches, throttle);
criterion_main!(benches);
