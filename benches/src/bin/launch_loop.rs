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
//! then N more inside `measured` (the only function callgrind collects in). `--driver` makes
//! the N measured launches call the fake's own `cuLaunchKernel` instead (the shim still loaded
//! and configured the same way): the script's "added" figure is the difference of the two
//! counts divided by N, so the loop and the fake's work cancel out.
//! Build: `cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim -p
//! gpuslice-benches`.

use std::ffi::c_void;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuslice_benches::{
    launch_once, measured, open_global, prepare_kernel, symbol, use_scratch_slice, LaunchFn,
};

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
    use_scratch_slice(&scratch, share.then_some(90));
    let dir = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("target/release")
        .to_path_buf();
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    let _nvml = open_global(&dir.join("libfakegpu_nvml.so"));
    let shim = open_global(&dir.join("libgpuslice.so"));
    // SAFETY: live handles of the shim and the fake driver, just opened.
    let kernel = unsafe { prepare_kernel(shim, driver) };
    // SAFETY: cuLaunchKernel's C signature; `shim` is a live handle.
    let sliced: LaunchFn = unsafe { symbol(shim, c"cuLaunchKernel") };
    // SAFETY: cuLaunchKernel's C signature; `driver` is a live handle.
    let real: LaunchFn = unsafe { symbol(driver, c"cuLaunchKernel") };
    let mut launch = sliced;
    let mut ns_per_wave: u64 = 1;
    let mut params = [(&mut ns_per_wave as *mut u64).cast::<c_void>()];
    let mut once = |f: LaunchFn| launch_once(f, kernel, &mut params);
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

fn fail(problem: &str) -> ! {
    eprintln!("launch-loop: {problem}");
    eprintln!("usage: launch-loop (--share | --no-share) [--driver] --launches N --scratch DIR");
    std::process::exit(2);
}
