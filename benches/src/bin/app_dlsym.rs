//! Workload for counting the instructions of `dlsym` AS AN APPLICATION SEES IT (run under
//! callgrind by `benches/dlsym-instructions.sh`): the process's own `dlsym` (bound by the
//! loader: the front's export when `libgpuslice.so` is preloaded, glibc's otherwise), called
//! after the application did what a CUDA application does first (the driver loaded into the
//! global scope, `cuInit`, a context, an allocation and its free, all found through `dlsym`),
//! so that whatever the shim set up by then (its core, its region, any thread) is there.
//!
//! ```text
//! app-dlsym --scratch DIR --handle default|libc --name NAME --lookups N
//! ```
//! Looks `NAME` up N times inside `measured` (the only function callgrind collects in) in
//! `RTLD_DEFAULT` or libc's handle. The slice (limit file, region, fake state) lives in DIR;
//! the script runs it with and without `LD_PRELOAD`, the fake driver on `LD_LIBRARY_PATH`.

use std::ffi::{c_char, c_void, CStr, CString};
use std::hint::black_box;
use std::path::PathBuf;

use gpuslice_benches::{measured, use_scratch_slice};

type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> u32;
type FreeFn = unsafe extern "C" fn(u64) -> u32;

fn main() {
    let (mut scratch, mut handle, mut name, mut lookups) = (None, None, None, 100_000u64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--scratch" => scratch = Some(PathBuf::from(value())),
            "--handle" => handle = Some(value()),
            "--name" => name = Some(CString::new(value()).unwrap_or_else(|_| fail("--name"))),
            "--lookups" => lookups = value().parse().unwrap_or_else(|_| fail("--lookups N")),
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let scratch = scratch.unwrap_or_else(|| fail("--scratch DIR"));
    let name = name.unwrap_or_else(|| fail("--name NAME"));
    use_scratch_slice(&scratch, None);
    // What a CUDA application does first, every lookup through its own dlsym.
    // SAFETY: NUL-terminated names; the driver's C signatures; the answers are checked.
    unsafe {
        let driver = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(
            !driver.is_null(),
            "libcuda.so.1 (the fake) not on LD_LIBRARY_PATH"
        );
        let init: InitFn = lookup(c"cuInit");
        let retain: RetainFn = lookup(c"cuDevicePrimaryCtxRetain");
        let set_current: SetCurrentFn = lookup(c"cuCtxSetCurrent");
        let alloc: AllocFn = lookup(c"cuMemAlloc_v2");
        let free: FreeFn = lookup(c"cuMemFree_v2");
        let mut context = std::ptr::null_mut();
        let mut pointer = 0u64;
        assert_eq!(init(0), 0, "cuInit");
        assert_eq!(retain(&mut context, 0), 0, "cuDevicePrimaryCtxRetain");
        assert_eq!(set_current(context), 0, "cuCtxSetCurrent");
        assert_eq!(alloc(&mut pointer, 1 << 20), 0, "cuMemAlloc_v2");
        assert_eq!(free(pointer), 0, "cuMemFree_v2");
    }
    let target = match handle.as_deref() {
        Some("default") => libc::RTLD_DEFAULT,
        // SAFETY: a NUL-terminated name; libc is loaded.
        Some("libc") => unsafe {
            libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD)
        },
        _ => fail("--handle default|libc"),
    };
    assert!(
        handle.as_deref() == Some("default") || !target.is_null(),
        "libc's handle"
    );
    // SAFETY: a live handle and a NUL-terminated name; the answer is compared, not called.
    let found = unsafe { libc::dlsym(target, name.as_ptr()) };
    assert!(!found.is_null(), "{name:?} not found");
    measured(lookups, &mut || {
        // SAFETY: as above.
        black_box(unsafe { libc::dlsym(black_box(target), black_box(name.as_ptr())) });
    });
}

/// `name` as the application finds it: its own `dlsym` in the global scope.
///
/// # Safety
/// `T` must be the C signature of `name`.
unsafe fn lookup<T: Copy>(name: &CStr) -> T {
    // SAFETY: a NUL-terminated name; RTLD_DEFAULT is the global scope.
    let pointer = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr() as *const c_char) };
    assert!(!pointer.is_null(), "{name:?} not found");
    // SAFETY: the caller names the C signature; a function pointer is pointer-sized.
    unsafe { std::mem::transmute_copy(&pointer) }
}

fn fail(problem: &str) -> ! {
    eprintln!("app-dlsym: {problem}");
    eprintln!("usage: app-dlsym --scratch DIR --handle default|libc --name NAME --lookups N");
    std::process::exit(2);
}
