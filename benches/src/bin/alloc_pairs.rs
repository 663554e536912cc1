//! Workload for counting the INSTRUCTIONS an alloc + free pair costs through the shim vs the
//! fake driver alone, at several thread counts (run under callgrind by
//! `benches/alloc-instructions.sh`, which differences two pair counts so start-up cancels
//! out). Instruction counts do not depend on the shared 2-core VM's scheduling, unlike the
//! wall-clock `alloc_free_16_threads` criterion bench.
//!
//! ```text
//! alloc-pairs (--shim | --driver) --threads N --pairs P --scratch DIR
//! ```
//! Each of N threads makes the process's primary context current and does P
//! `cuMemAlloc_v2(1 MiB)` + `cuMemFree_v2` pairs. With `--shim`, `libgpuslice.so` is loaded
//! first (RTLD_GLOBAL) and its exports are called, under a 30 GiB slice whose limit file and
//! region live in DIR (shared by every process given the same DIR, like the fake's state).
//! Expects the release cdylibs next to it (`cargo build --release -p fakegpu-cuda -p
//! fakegpu-nvml -p gpuslice-shim -p gpuslice-benches`).

use std::ffi::c_void;
use std::path::PathBuf;

use gpuslice_benches::{open_global, symbol, use_scratch_slice};

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> u32;
type FreeFn = unsafe extern "C" fn(u64) -> u32;
type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;

fn main() {
    let mut shim = None;
    let (mut threads, mut pairs) = (1usize, 1000usize);
    let mut scratch = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--shim" => shim = Some(true),
            "--driver" => shim = Some(false),
            "--threads" => threads = value().parse().unwrap_or_else(|_| fail("--threads N")),
            "--pairs" => pairs = value().parse().unwrap_or_else(|_| fail("--pairs P")),
            "--scratch" => scratch = Some(PathBuf::from(value())),
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let shim = shim.unwrap_or_else(|| fail("--shim or --driver"));
    let scratch = scratch.unwrap_or_else(|| fail("--scratch DIR"));
    use_scratch_slice(&scratch, None);

    let dir = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("target/release")
        .to_path_buf();
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    let handle = if shim {
        open_global(&dir.join("libgpuslice.so"))
    } else {
        driver
    };
    // SAFETY: cuInit's C signature; `handle` is a live handle.
    let init: InitFn = unsafe { symbol(handle, c"cuInit") };
    // SAFETY: cuDevicePrimaryCtxRetain's C signature; `handle` is a live handle.
    let retain: RetainFn = unsafe { symbol(handle, c"cuDevicePrimaryCtxRetain") };
    // SAFETY: cuCtxSetCurrent's C signature; `driver` is a live handle.
    let set_current: SetCurrentFn = unsafe { symbol(driver, c"cuCtxSetCurrent") };
    // SAFETY: cuMemAlloc_v2's C signature; `handle` is a live handle.
    let alloc: AllocFn = unsafe { symbol(handle, c"cuMemAlloc_v2") };
    // SAFETY: cuMemFree_v2's C signature; `handle` is a live handle.
    let free: FreeFn = unsafe { symbol(handle, c"cuMemFree_v2") };
    let mut context = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver is loaded.
    unsafe {
        assert_eq!(init(0), 0, "cuInit");
        assert_eq!(retain(&mut context, 0), 0, "cuDevicePrimaryCtxRetain");
    }
    let context = context as usize;
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(move || {
                // SAFETY: a live context of this process.
                unsafe { assert_eq!(set_current(context as *mut c_void), 0) };
                for _ in 0..pairs {
                    let mut pointer = 0u64;
                    // SAFETY: valid out-pointer; the context is current on this thread.
                    unsafe {
                        assert_eq!(alloc(&mut pointer, 1 << 20), 0, "cuMemAlloc_v2");
                        assert_eq!(free(std::hint::black_box(pointer)), 0, "cuMemFree_v2");
                    }
                }
            });
        }
    });
}

fn fail(problem: &str) -> ! {
    eprintln!("alloc-pairs: {problem}");
    eprintln!("usage: alloc-pairs (--shim | --driver) --threads N --pairs P --scratch DIR");
    std::process::exit(2);
}
