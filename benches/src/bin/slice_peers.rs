//! Live peers for the benchmarks that measure a call with other processes alive in the slice
//! (`benches/views-instructions.sh`): real, separate processes, each registered in the slice
//! through `libgpuslice.so`, with a context on the fake card and an allocation, as the other
//! processes of a PyTorch or vLLM job hold them.
//!
//! ```text
//! slice-peers --scratch DIR --peers K [--hold BYTES]
//! ```
//! Uses the slice of `alloc-pairs --scratch DIR` (limit file, region and fake card in DIR).
//! Loads the fake driver, its NVML and the shim, then forks K children one after another; each calls
//! `cuInit`, retains the primary context and allocates BYTES (default 2 MiB) through the shim,
//! reports that it holds them, and then waits. Prints `ready K` once all K hold their memory,
//! and keeps them alive until its standard input closes; then they exit and it reaps them.
//! The children are forks of one process that has not touched CUDA yet (each initialises the
//! shim and the fake on its own), so a thousand of them cost little memory.
//! Expects the release cdylibs next to it (`cargo build --release -p fakegpu-cuda -p
//! fakegpu-nvml -p gpuslice-shim -p gpuslice-benches`).

use std::ffi::c_void;
use std::io::Read;
use std::path::PathBuf;

use gpuslice_benches::{open_global, symbol, use_scratch_slice};

type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> u32;

fn main() {
    let mut scratch = None;
    let mut peers = 0usize;
    let mut hold = 2usize << 20;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--scratch" => scratch = Some(PathBuf::from(value())),
            "--peers" => peers = value().parse().unwrap_or_else(|_| fail("--peers K")),
            "--hold" => hold = value().parse().unwrap_or_else(|_| fail("--hold BYTES")),
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let scratch = scratch.unwrap_or_else(|| fail("--scratch DIR"));
    use_scratch_slice(&scratch, None);
    let dir = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("target/release")
        .to_path_buf();
    let driver = open_global(&dir.join("libfakegpu_cuda.so"));
    // The driver's NVML (its SONAME is libnvidia-ml.so.1, which the shim opens by that name).
    open_global(&dir.join("libfakegpu_nvml.so"));
    let shim = open_global(&dir.join("libgpuslice.so"));
    // SAFETY: the C signatures of these driver functions; both handles are live.
    let (init, retain, set_current, alloc): (InitFn, RetainFn, SetCurrentFn, AllocFn) = unsafe {
        (
            symbol(shim, c"cuInit"),
            symbol(shim, c"cuDevicePrimaryCtxRetain"),
            symbol(driver, c"cuCtxSetCurrent"),
            symbol(shim, c"cuMemAlloc_v2"),
        )
    };
    // Children report on `ready`; they hold until `hold_open` is closed (this process ends or
    // its standard input closes).
    let (ready_read, ready_write) = pipe();
    let (hold_read, hold_write) = pipe();
    let mut children = Vec::with_capacity(peers);
    for i in 0..peers {
        // SAFETY: fork in a single-threaded process; the child only calls the driver through
        // the libraries loaded above, writes and reads pipes, and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            fail(&format!(
                "fork of peer {i}: {}",
                std::io::Error::last_os_error()
            ));
        }
        if pid == 0 {
            // SAFETY: closing this child's copies of the ends it does not use.
            unsafe {
                libc::close(ready_read);
                libc::close(hold_write);
            }
            let mut context = std::ptr::null_mut();
            let mut pointer = 0u64;
            // SAFETY: valid out-pointers; the driver and the shim are loaded.
            let ok = unsafe {
                init(0) == 0
                    && retain(&mut context, 0) == 0
                    && set_current(context) == 0
                    && alloc(&mut pointer, hold) == 0
            };
            let byte = [u8::from(ok)];
            let mut rest = [0u8; 1];
            // SAFETY: plain writes and reads of this child's pipe ends, then _exit (no
            // destructors of the parent's state run in the child).
            unsafe {
                libc::write(ready_write, byte.as_ptr().cast(), 1);
                libc::read(hold_read, rest.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        children.push(pid);
        // One at a time: the bench measures a slice of live processes, not their start.
        let mut byte = [0u8; 1];
        // SAFETY: reading the parent's end of the ready pipe into a one-byte buffer.
        let got = unsafe { libc::read(ready_read, byte.as_mut_ptr().cast(), 1) };
        if got != 1 || byte[0] != 1 {
            fail(&format!("peer {i} did not get its context and memory"));
        }
    }
    println!("ready {peers}");
    // Until the caller closes our standard input.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    // SAFETY: closing the write end lets every child's read return; then they are reaped.
    unsafe { libc::close(hold_write) };
    for pid in children {
        // SAFETY: waiting for a child of this process.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
}

/// A pipe's (read, write) ends, close-on-exec.
fn pipe() -> (i32, i32) {
    let mut ends = [0i32; 2];
    // SAFETY: a two-element array for pipe2's out-parameter.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        fail(&format!("pipe: {}", std::io::Error::last_os_error()));
    }
    (ends[0], ends[1])
}

fn fail(problem: &str) -> ! {
    eprintln!("slice-peers: {problem}");
    eprintln!("usage: slice-peers --scratch DIR --peers K [--hold BYTES]");
    std::process::exit(2);
}
