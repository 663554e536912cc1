//! Workload for counting the INSTRUCTIONS the shim adds to one `cuLaunchKernel` (run under
//! callgrind by `benches/launch-instructions.sh`). The wall-clock criterion bench
//! (`--bench throttle`, `launch_share` / `launch_no_share`) reads a few nanoseconds on a quiet
//! machine but tens either way on the shared 2-core VM; an instruction count does not depend
//! on the VM's scheduling, and at any plausible speed (>= 1 instruction per cycle, >= 2 GHz)
//! N instructions take at most N / 2 ns.
//!
//! ```text
//! launch-loop (--share | --no-share) [--driver] --launches N --scratch DIR
//! ```
//! Loads the fake driver, its NVML and `libgpuslice.so` (RTLD_GLOBAL, as a client does), under
//! a limit file in DIR with a 90 % share (`--share`) or none (`--no-share`), then launches 1 ns
//! kernels through the shim's `cuLaunchKernel`: with a share, for 2 s first so the watcher
//! learns their cost (the launches measured then find tokens, as the criterion bench's do),
//! then N more inside `measured` (the only function callgrind collects in). The script reads the inclusive counts of the shim's `cuLaunchKernel` and the
//! fake's (called from it) and divides the difference by the calls.
//! Build: `cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim -p
//! gpuslice-benches`.

use std::ffi::{c_uint, c_void};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuslice_benches::{open_global, symbol};

type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type ModuleLoadFn = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32;
type GetFunctionFn = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> u32;
type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;

fn main() {
    let mut share = None;
    let mut direct = false;
    let mut launches = 100_000u64;
    let mut scratch = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--share" => share = Some(true),
            "--no-share" => share = Some(false),
            "--driver" => direct = true,
            "--launches" => launches = value().parse().unwrap_or_else(|_| fail("--launches N")),
            "--scratch" => scratch = Some(PathBuf::from(value())),
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let share = share.unwrap_or_else(|| fail("--share or --no-share"));
    let scratch = scratch.unwrap_or_else(|| fail("--scratch DIR"));
    std::fs::create_dir_all(&scratch).expect("create the scratch directory");
    let limits = scratch.join("limits.json");
    let compute = if share { r#","compute":90"# } else { "" };
    std::fs::write(
        &limits,
        format!(
            r#"{{"version":1,"region":"{}","devices":[{{"index":0,"memory":"30GiB"{compute}}}]}}"#,
            scratch.join("region").display()
        ),
    )
    .expect("write the limit file");
    std::env::set_var("FAKEGPU_STATE", scratch.join("state"));
    std::env::set_var("GPUSLICE_CONFIG", &limits);

    let dir = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("target/release")
        .to_path_buf();
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    let _nvml = open_global(&dir.join("libfakegpu_nvml.so"));
    let shim = open_global(&dir.join("libgpuslice.so"));
    // SAFETY (all six): the C signatures of these driver entry points, from live handles.
    let init: InitFn = unsafe { symbol(shim, c"cuInit") };
    let retain: RetainFn = unsafe { symbol(shim, c"cuDevicePrimaryCtxRetain") };
    let set_current: SetCurrentFn = unsafe { symbol(driver, c"cuCtxSetCurrent") };
    let load: ModuleLoadFn = unsafe { symbol(driver, c"cuModuleLoadData") };
    let get_function: GetFunctionFn = unsafe { symbol(driver, c"cuModuleGetFunction") };
    let sliced: LaunchFn = unsafe { symbol(shim, c"cuLaunchKernel") };
    let real: LaunchFn = unsafe { symbol(driver, c"cuLaunchKernel") };
    let (mut context, mut module, mut function) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid out-pointers and NUL-terminated strings; the fake accepts any image.
    unsafe {
        assert_eq!(init(0), 0, "cuInit");
        assert_eq!(retain(&mut context, 0), 0, "cuDevicePrimaryCtxRetain");
        assert_eq!(set_current(context), 0, "cuCtxSetCurrent");
        assert_eq!(load(&mut module, c"bench".as_ptr().cast()), 0);
        assert_eq!(get_function(&mut function, module, c"k".as_ptr()), 0);
    }
    let mut ns_per_wave: u64 = 1;
    let mut params = [(&mut ns_per_wave as *mut u64).cast::<c_void>()];
    let mut launch = sliced;
    let mut once = |launch: LaunchFn| {
        // SAFETY: a loaded function, grid 1x1x1 of 1 thread, kernelParams[0] -> u64.
        let rc = unsafe {
            launch(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(std::hint::black_box(rc), 0, "cuLaunchKernel");
    };
    if share {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            once(sliced);
        }
    }
    if direct {
        launch = real;
    }
    measured(launches, &mut || once(launch));
}

/// The N launches callgrind counts (`--toggle-collect=*measured*`): the warm-up's launches,
/// whose number depends on the wall clock, stay out of the figures.
#[inline(never)]
fn measured(launches: u64, once: &mut dyn FnMut()) {
    for _ in 0..launches {
        once();
    }
}

fn fail(problem: &str) -> ! {
    eprintln!("launch-loop: {problem}");
    eprintln!("usage: launch-loop (--share | --no-share) [--driver] --launches N --scratch DIR");
    std::process::exit(2);
}
