//! Workload for counting the INSTRUCTIONS an alloc + free pair costs through the shim vs the
//! fake driver alone, at several thread counts (run under callgrind by
//! `benches/alloc-instructions.sh`, which differences two pair counts so start-up cancels
//! out). Instruction counts do not depend on the shared 2-core VM's scheduling, unlike the
//! wall-clock `alloc_free_16_threads` criterion bench.
//!
//! ```text
//! alloc-pairs (--shim | --driver) --threads N --pairs P --scratch DIR
//!             [--call pair|mem-get-info|device-total-mem|nvml-memory|nvml-memory-v2|
//!                     nvml-processes] [--others K] [--exited K]
//! ```
//! Each of N threads makes the process's primary context current and does P
//! `cuMemAlloc_v2(1 MiB)` + `cuMemFree_v2` pairs (or P calls of the named view:
//! `cuMemGetInfo_v2`, `cuDeviceTotalMem_v2`, `nvmlDeviceGetMemoryInfo`,
//! `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetComputeRunningProcesses_v3` into a buffer of
//! 1,024 entries). With
//! `--shim`, `libgpuslice.so` is loaded first (RTLD_GLOBAL) and its exports are called, under
//! a 30 GiB slice whose limit file and region live in DIR (shared by every process given the
//! same DIR, like the fake's state).
//!
//! `--others K` registers K more processes' slots in the slice's region before the shim loads
//! (held, so they count as live processes for the whole run); `--exited K` registers K slots
//! and gives them up again (processes that have exited: the region's high-water mark stays at
//! K). What a slice's history costs each call shows in the difference between these runs.
//! These slots are registered by this process itself; `slice-peers` provides real, separate
//! live processes in the same slice (`benches/views-instructions.sh`).
//! Expects the release cdylibs next to it (`cargo build --release -p fakegpu-cuda -p
//! fakegpu-nvml -p gpuslice-shim -p gpuslice-benches`).

use std::ffi::c_void;
use std::path::PathBuf;

use gpuslice_benches::{measured, open_global, symbol, use_scratch_slice};
use gpuslice_common::region::{ProcessIdentity, Region};

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> u32;
type FreeFn = unsafe extern "C" fn(u64) -> u32;
type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type ReleaseFn = unsafe extern "C" fn(i32) -> u32;
/// Calls each thread makes before the counted ones.
const WARM_UP: usize = 4;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> u32;
type NvmlInitFn = unsafe extern "C" fn() -> u32;
type NvmlHandleFn = unsafe extern "C" fn(u32, *mut *mut c_void) -> u32;
type NvmlMemFn = unsafe extern "C" fn(*mut c_void, *mut [u64; 5]) -> u32;
type TotalMemFn = unsafe extern "C" fn(*mut usize, i32) -> u32;
/// `nvmlProcessInfo_t`: pid, usedGpuMemory, gpuInstanceId, computeInstanceId.
type NvmlProcessInfo = [u64; 3];
type NvmlProcessesFn = unsafe extern "C" fn(*mut c_void, *mut u32, *mut NvmlProcessInfo) -> u32;
/// Entries of the process-list buffer: the most processes a slice has.
const LIST_CAPACITY: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Pair,
    MemGetInfo,
    DeviceTotalMem,
    NvmlMemory,
    NvmlMemoryV2,
    NvmlProcesses,
}

impl Call {
    fn is_nvml(self) -> bool {
        matches!(
            self,
            Call::NvmlMemory | Call::NvmlMemoryV2 | Call::NvmlProcesses
        )
    }
}

fn main() {
    let mut shim = None;
    let (mut threads, mut pairs) = (1usize, 1000usize);
    let mut scratch = None;
    let mut call = Call::Pair;
    let (mut others, mut exited) = (0usize, 0usize);
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
            "--call" => {
                call = match value().as_str() {
                    "pair" => Call::Pair,
                    "mem-get-info" => Call::MemGetInfo,
                    "device-total-mem" => Call::DeviceTotalMem,
                    "nvml-memory" => Call::NvmlMemory,
                    "nvml-memory-v2" => Call::NvmlMemoryV2,
                    "nvml-processes" => Call::NvmlProcesses,
                    other => fail(&format!("unknown call {other}")),
                }
            }
            "--others" => others = value().parse().unwrap_or_else(|_| fail("--others K")),
            "--exited" => exited = value().parse().unwrap_or_else(|_| fail("--exited K")),
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let shim = shim.unwrap_or_else(|| fail("--shim or --driver"));
    let scratch = scratch.unwrap_or_else(|| fail("--scratch DIR"));
    use_scratch_slice(&scratch, None);
    // Held until the process ends: the others stay registered (live) for the whole run.
    let _others = register_others(&scratch.join("region"), others, exited);

    let dir = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("target/release")
        .to_path_buf();
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    // The driver's NVML, as on a real host (the shim measures a context's cost with it).
    let nvml = open_global(&dir.join("libfakegpu_nvml.so"));
    let handle = if shim {
        open_global(&dir.join("libgpuslice.so"))
    } else {
        driver
    };
    // SAFETY: cuInit's C signature; `handle` is a live handle.
    let init: InitFn = unsafe { symbol(handle, c"cuInit") };
    // SAFETY: cuDevicePrimaryCtxRetain's C signature; `handle` is a live handle.
    let retain: RetainFn = unsafe { symbol(handle, c"cuDevicePrimaryCtxRetain") };
    // SAFETY: cuDevicePrimaryCtxRelease's C signature; `handle` is a live handle.
    let release: ReleaseFn = unsafe { symbol(handle, c"cuDevicePrimaryCtxRelease") };
    // SAFETY: cuCtxSetCurrent's C signature; `driver` is a live handle.
    let set_current: SetCurrentFn = unsafe { symbol(driver, c"cuCtxSetCurrent") };
    // SAFETY: cuMemAlloc_v2's C signature; `handle` is a live handle.
    let alloc: AllocFn = unsafe { symbol(handle, c"cuMemAlloc_v2") };
    // SAFETY: cuMemFree_v2's C signature; `handle` is a live handle.
    let free: FreeFn = unsafe { symbol(handle, c"cuMemFree_v2") };
    // SAFETY: cuMemGetInfo_v2's C signature; `handle` is a live handle.
    let info: InfoFn = unsafe { symbol(handle, c"cuMemGetInfo_v2") };
    // SAFETY: cuDeviceTotalMem_v2's C signature; `handle` is a live handle.
    let total_mem: TotalMemFn = unsafe { symbol(handle, c"cuDeviceTotalMem_v2") };
    let mut context = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver is loaded.
    unsafe {
        assert_eq!(init(0), 0, "cuInit");
        assert_eq!(retain(&mut context, 0), 0, "cuDevicePrimaryCtxRetain");
    }
    let (nvml_memory, nvml_processes, nvml_device) = if call.is_nvml() {
        let nvml_handle = if shim { handle } else { nvml };
        let name = if call == Call::NvmlMemory {
            c"nvmlDeviceGetMemoryInfo"
        } else {
            c"nvmlDeviceGetMemoryInfo_v2"
        };
        // SAFETY: nvmlDeviceGetComputeRunningProcesses_v3's C signature; `nvml_handle` is live.
        let processes: NvmlProcessesFn =
            unsafe { symbol(nvml_handle, c"nvmlDeviceGetComputeRunningProcesses_v3") };
        // SAFETY: nvmlInit_v2's C signature; `nvml_handle` is a live handle.
        let nvml_init: NvmlInitFn = unsafe { symbol(nvml_handle, c"nvmlInit_v2") };
        // SAFETY: nvmlDeviceGetHandleByIndex_v2's C signature; `nvml` is a live handle.
        let by_index: NvmlHandleFn = unsafe { symbol(nvml, c"nvmlDeviceGetHandleByIndex_v2") };
        // SAFETY: the memory query's C signature (nvmlMemory_t is three u64s, nvmlMemory_v2_t
        // a version word and four u64s: five words hold either); `nvml_handle` is live.
        let memory: NvmlMemFn = unsafe { symbol(nvml_handle, name) };
        let mut device = std::ptr::null_mut();
        // SAFETY: valid out-pointer; NVML is loaded.
        unsafe {
            assert_eq!(nvml_init(), 0, "nvmlInit_v2");
            assert_eq!(by_index(0, &mut device), 0, "nvmlDeviceGetHandleByIndex_v2");
        }
        (Some(memory), Some(processes), device as usize)
    } else {
        (None, None, 0)
    };
    let context = context as usize;
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(move || {
                // SAFETY: a live context of this process.
                unsafe { assert_eq!(set_current(context as *mut c_void), 0) };
                let mut list = vec![[0u64; 3]; LIST_CAPACITY];
                let mut once = || {
                    match (call, nvml_memory) {
                        (Call::Pair, _) => {
                            let mut pointer = 0u64;
                            // SAFETY: valid out-pointer; the context is current on this thread.
                            unsafe {
                                assert_eq!(alloc(&mut pointer, 1 << 20), 0, "cuMemAlloc_v2");
                                assert_eq!(free(std::hint::black_box(pointer)), 0, "cuMemFree_v2");
                            }
                        }
                        (Call::MemGetInfo, _) => {
                            let (mut f, mut t) = (0usize, 0usize);
                            // SAFETY: valid out-pointers; the context is current.
                            unsafe { assert_eq!(info(&mut f, &mut t), 0, "cuMemGetInfo_v2") };
                            std::hint::black_box(f);
                        }
                        (Call::DeviceTotalMem, _) => {
                            let mut bytes = 0usize;
                            // SAFETY: a valid out-pointer and device 0.
                            unsafe {
                                assert_eq!(total_mem(&mut bytes, 0), 0, "cuDeviceTotalMem_v2")
                            };
                            std::hint::black_box(bytes);
                        }
                        (Call::NvmlProcesses, _) => {
                            let processes = nvml_processes.expect("NVML calls have their function");
                            let mut count = LIST_CAPACITY as u32;
                            // SAFETY: a buffer of `count` entries; the handle is NVML's.
                            let rc = unsafe {
                                processes(nvml_device as *mut c_void, &mut count, list.as_mut_ptr())
                            };
                            assert_eq!(rc, 0, "nvmlDeviceGetComputeRunningProcesses_v3");
                            std::hint::black_box(&list[..count as usize]);
                        }
                        (_, Some(memory)) => {
                            // The v2 struct's version word: sizeof(nvmlMemory_v2_t) | 2 << 24.
                            let mut words = [40 | (2 << 24), 0, 0, 0, 0];
                            // SAFETY: five words hold either struct; the handle is NVML's.
                            unsafe {
                                assert_eq!(memory(nvml_device as *mut c_void, &mut words), 0)
                            };
                            std::hint::black_box(words);
                        }
                        (_, None) => unreachable!("NVML calls have their function"),
                    }
                };
                // A few calls first (the first view runs the sweep a start asks for), then
                // the calls `views-instructions.sh` counts alone (`--toggle-collect`).
                for _ in 0..WARM_UP.min(pairs) {
                    once();
                }
                measured(pairs.saturating_sub(WARM_UP) as u64, &mut once);
            });
        }
    });
    // Leave no memory behind: the next run of a bench meets a slice without a dead holder.
    // SAFETY: the primary context this process retained above, released through `handle`.
    unsafe { assert_eq!(release(0), 0, "cuDevicePrimaryCtxRelease") };
}

/// Registers `others` slots (kept: live processes) and `exited` slots given up again (exited
/// processes) in the region at `path`, as other processes of the slice would have.
fn register_others(path: &std::path::Path, others: usize, exited: usize) -> Option<Region> {
    if others == 0 && exited == 0 {
        return None;
    }
    let region = Region::open_or_create(path).unwrap_or_else(|e| fail(&e.to_string()));
    let me = ProcessIdentity::current().unwrap_or_else(|| fail("no /proc/self"));
    let gone: Vec<_> = (0..exited)
        .map(|_| {
            region
                .register(&me)
                .unwrap_or_else(|e| fail(&e.to_string()))
        })
        .collect();
    for slot in gone {
        region
            .unregister(slot)
            .unwrap_or_else(|e| fail(&e.to_string()));
    }
    for _ in 0..others {
        region
            .register(&me)
            .unwrap_or_else(|e| fail(&e.to_string()));
    }
    Some(region)
}

fn fail(problem: &str) -> ! {
    eprintln!("alloc-pairs: {problem}");
    eprintln!(
        "usage: alloc-pairs (--shim | --driver) --threads N --pairs P --scratch DIR \\\n  [--call pair|mem-get-info|device-total-mem|nvml-memory|nvml-memory-v2|nvml-processes] \\\n  [--others K] [--exited K]"
    );
    std::process::exit(2);
}
