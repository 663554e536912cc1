//! Memory-slice overhead of libgpuslice.so over the fake driver (criterion):
//! * `alloc_free/{driver,shim}`: one `cuMemAlloc_v2` + `cuMemFree_v2` pair (1 MiB) called on
//!   the fake directly vs through the shim's exports under a 30 GiB slice (reserve in the
//!   region, object table insert/remove, release);
//! * `alloc_free_16_threads/{driver,shim}`: the same pair, per thread, with 16 threads doing
//!   it at once (time per pair as each thread sees it);
//! * `mem_get_info/*` and `nvml_memory_info/*`: the reporting calls.
//!
//! Run: `cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim &&
//! cargo bench -p gpuslice-benches --bench memory`. The fake's state, the limit file and the
//! region live in a fresh temp directory.

use std::ffi::c_void;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use gpuslice_benches::{artifact_dir, open_global, symbol};

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> u32;
type FreeFn = unsafe extern "C" fn(u64) -> u32;
type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> u32;
type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type NvmlInitFn = unsafe extern "C" fn() -> u32;
type NvmlHandleFn = unsafe extern "C" fn(u32, *mut *mut c_void) -> u32;
type NvmlMemFn = unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> u32;

struct Api {
    alloc: AllocFn,
    free: FreeFn,
    info: InfoFn,
    set_current: SetCurrentFn,
    nvml_memory: NvmlMemFn,
}

/// `handle` answers the hooked names; `driver` the rest (cuCtxSetCurrent is not hooked).
fn api(handle: *mut c_void, nvml: *mut c_void, driver: *mut c_void) -> Api {
    Api {
        // SAFETY: cuMemAlloc_v2's C signature; `handle` is a live handle.
        alloc: unsafe { symbol(handle, c"cuMemAlloc_v2") },
        // SAFETY: cuMemFree_v2's C signature; `handle` is a live handle.
        free: unsafe { symbol(handle, c"cuMemFree_v2") },
        // SAFETY: cuMemGetInfo_v2's C signature; `handle` is a live handle.
        info: unsafe { symbol(handle, c"cuMemGetInfo_v2") },
        // SAFETY: cuCtxSetCurrent's C signature; `driver` is a live handle.
        set_current: unsafe { symbol(driver, c"cuCtxSetCurrent") },
        // SAFETY: nvmlDeviceGetMemoryInfo's C signature; `nvml` is a live handle.
        nvml_memory: unsafe { symbol(nvml, c"nvmlDeviceGetMemoryInfo") },
    }
}

fn pair(api: &Api) {
    let mut pointer = 0u64;
    // SAFETY: valid out-pointer; the context is current on this thread.
    unsafe {
        assert_eq!((api.alloc)(&mut pointer, 1 << 20), 0);
        assert_eq!((api.free)(black_box(pointer)), 0);
    }
}

fn memory(c: &mut Criterion) {
    let dir = artifact_dir();
    let scratch =
        std::env::temp_dir().join(format!("gpuslice-bench-memory-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let limits = scratch.join("limits.json");
    std::fs::write(
        &limits,
        format!(
            r#"{{"version":1,"region":"{}","devices":[{{"index":0,"memory":"30GiB"}}]}}"#,
            scratch.join("region").display()
        ),
    )
    .unwrap();
    std::env::set_var("FAKEGPU_STATE", scratch.join("state"));
    std::env::set_var("GPUSLICE_CONFIG", &limits);
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    let nvml = open_global(&dir.join("libfakegpu_nvml.so"));
    let shim = open_global(&dir.join("libgpuslice.so"));
    let direct = api(driver, nvml, driver);
    let sliced = api(shim, shim, driver);

    // SAFETY: cuInit's C signature; `shim` is a live handle.
    let init: InitFn = unsafe { symbol(shim, c"cuInit") };
    // SAFETY: cuDevicePrimaryCtxRetain's C signature; `shim` is a live handle.
    let retain: RetainFn = unsafe { symbol(shim, c"cuDevicePrimaryCtxRetain") };
    // SAFETY: nvmlInit_v2's C signature; `shim` is a live handle.
    let nvml_init: NvmlInitFn = unsafe { symbol(shim, c"nvmlInit_v2") };
    // SAFETY: nvmlDeviceGetHandleByIndex_v2's C signature; `nvml` is a live handle.
    let nvml_handle: NvmlHandleFn = unsafe { symbol(nvml, c"nvmlDeviceGetHandleByIndex_v2") };
    let mut context = std::ptr::null_mut();
    let mut device = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the fake driver and NVML are loaded.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&mut context, 0), 0);
        assert_eq!((sliced.set_current)(context), 0);
        assert_eq!(nvml_init(), 0);
        assert_eq!(nvml_handle(0, &mut device), 0);
    }
    let device = device as usize;

    let mut group = c.benchmark_group("alloc_free");
    group.bench_function("driver", |b| b.iter(|| pair(&direct)));
    group.bench_function("shim", |b| b.iter(|| pair(&sliced)));
    group.finish();

    let mut group = c.benchmark_group("alloc_free_16_threads");
    group.sample_size(20);
    for (name, api) in [("driver", &direct), ("shim", &sliced)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iterations| {
                let per_thread: Vec<Duration> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..16)
                        .map(|_| {
                            let context = context as usize;
                            s.spawn(move || {
                                // SAFETY: a live context of this process.
                                unsafe { (api.set_current)(context as *mut c_void) };
                                let start = Instant::now();
                                for _ in 0..iterations {
                                    pair(api);
                                }
                                start.elapsed()
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                per_thread.iter().sum::<Duration>() / 16
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("mem_get_info");
    for (name, api) in [("driver", &direct), ("shim", &sliced)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let (mut free, mut total) = (0, 0);
                // SAFETY: valid out-pointers.
                unsafe { assert_eq!((api.info)(&mut free, &mut total), 0) };
                black_box(free)
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("nvml_memory_info");
    for (name, api) in [("driver", &direct), ("shim", &sliced)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut memory = [0u64; 3];
                // SAFETY: nvmlMemory_t is three u64s; the handle came from NVML.
                unsafe { assert_eq!((api.nvml_memory)(device as *mut c_void, &mut memory), 0) };
                black_box(memory)
            })
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&scratch);
}

criterion_group!(benches, memory);
criterion_main!(benches);
