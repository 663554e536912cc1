//! Helpers shared by the criterion benchmarks in `benches/benches/`: where cargo put the
//! release artifacts (the fake GPU's libraries, `libgpuslice.so`), and loading them with the
//! real `dlopen`/`dlsym` the way a client process does.
//!
//! The benches load libraries into their own process instead of running them under
//! `LD_PRELOAD`, so that one process can time the real function and the shim's wrapper side
//! by side.

use std::ffi::{c_char, c_uint, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// `target/<profile>`: the directory of the bench binary's `deps/` folder, where cargo puts
/// the cdylibs of the same profile (`cargo build --release -p ...` builds them; `cargo bench`
/// alone does not).
pub fn artifact_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("bench binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// `dlopen(path, flags)`, panicking with the loader's message when it fails (a bench without
/// its library has nothing to measure).
pub fn open(path: &Path, flags: i32) -> *mut c_void {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes()).expect("path without NUL");
    // SAFETY: NUL-terminated path; dlopen runs the library's initialisers.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), flags) };
    if handle.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message after a failed dlopen.
        let message = unsafe { CStr::from_ptr(libc::dlerror()) };
        panic!(
            "cannot load {}: {message:?} (build it first: see the bench's doc comment)",
            path.display()
        );
    }
    handle
}

/// `dlopen(path, RTLD_NOW | RTLD_GLOBAL)`: what the CUDA runtime and cudarc do.
pub fn open_global(path: &Path) -> *mut c_void {
    open(path, libc::RTLD_NOW | libc::RTLD_GLOBAL)
}

/// The address of `name` in `handle`, panicking when it is missing.
///
/// # Safety
/// `handle` must be a live `dlopen` handle or one of the pseudo-handles (`RTLD_DEFAULT`).
pub unsafe fn symbol_address(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: a live handle and a NUL-terminated name. The bench binary binds `dlsym` to glibc
    // at link time, before any shim is loaded, so this is the real lookup.
    let pointer = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!pointer.is_null(), "{name:?} not found");
    pointer
}

/// `name` in `handle` as the function-pointer type `T`.
///
/// # Safety
/// `handle` as for [`symbol_address`], and `T` must be the C signature of the symbol.
pub unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &CStr) -> T {
    // SAFETY: the caller vouches for the handle.
    let pointer = unsafe { symbol_address(handle, name) };
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller names the C signature; sizes checked above.
    unsafe { std::mem::transmute_copy(&pointer) }
}

/// `cuLaunchKernel`'s C signature.
pub type LaunchFn = unsafe extern "C" fn(
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

type InitFn = unsafe extern "C" fn(u32) -> u32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type ModuleLoadFn = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32;
type GetFunctionFn = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> u32;

/// The slice every bench process given `scratch` shares: `scratch/limits.json` (30 GiB on
/// device 0, `compute` percent when given, its region in `scratch`) and the fake's state file
/// there, named in `GPUSLICE_CONFIG` and `FAKEGPU_STATE` for the libraries loaded after this.
pub fn use_scratch_slice(scratch: &Path, compute: Option<u32>) {
    std::fs::create_dir_all(scratch).expect("create the scratch directory");
    let limits = scratch.join("limits.json");
    let compute = compute.map_or(String::new(), |c| format!(r#","compute":{c}"#));
    // Written beside and renamed into place: processes started together on one scratch
    // directory must never read a half-written file (one that did refused every call).
    let staged = scratch.join(format!("limits.json.{}", std::process::id()));
    std::fs::write(
        &staged,
        format!(
            r#"{{"version":1,"region":"{}","devices":[{{"index":0,"memory":"30GiB"{compute}}}]}}"#,
            scratch.join("region").display()
        ),
    )
    .expect("write the limit file");
    std::fs::rename(&staged, &limits).expect("put the limit file in place");
    std::env::set_var("FAKEGPU_STATE", scratch.join("state"));
    std::env::set_var("GPUSLICE_CONFIG", &limits);
}

/// A fake kernel's function handle, made by [`prepare_kernel`] only (so [`launch_once`] is
/// never handed a stray pointer).
#[derive(Clone, Copy)]
pub struct Kernel(*mut c_void);

impl Kernel {
    /// The `CUfunction` (for launch paths other than [`launch_once`], e.g. a capture).
    pub fn function(self) -> *mut c_void {
        self.0
    }
}

/// A kernel ready to launch: `cuInit` and the primary context through `shim` (so the shim
/// sees the context), the module and function straight from the fake `driver` (which accepts
/// any image).
///
/// # Safety
/// `shim` and `driver` must be live `dlopen` handles of `libgpuslice.so` and the fake driver.
pub unsafe fn prepare_kernel(shim: *mut c_void, driver: *mut c_void) -> Kernel {
    // SAFETY: cuInit's C signature; the caller vouches for `shim`.
    let init: InitFn = unsafe { symbol(shim, c"cuInit") };
    // SAFETY: cuDevicePrimaryCtxRetain's C signature; the caller vouches for `shim`.
    let retain: RetainFn = unsafe { symbol(shim, c"cuDevicePrimaryCtxRetain") };
    // SAFETY: cuCtxSetCurrent's C signature; the caller vouches for `driver`.
    let set_current: SetCurrentFn = unsafe { symbol(driver, c"cuCtxSetCurrent") };
    // SAFETY: cuModuleLoadData's C signature; the caller vouches for `driver`.
    let load: ModuleLoadFn = unsafe { symbol(driver, c"cuModuleLoadData") };
    // SAFETY: cuModuleGetFunction's C signature; the caller vouches for `driver`.
    let get_function: GetFunctionFn = unsafe { symbol(driver, c"cuModuleGetFunction") };
    let (mut context, mut module, mut function) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid out-pointers and NUL-terminated strings.
    unsafe {
        assert_eq!(init(0), 0, "cuInit");
        assert_eq!(retain(&mut context, 0), 0, "cuDevicePrimaryCtxRetain");
        assert_eq!(set_current(context), 0, "cuCtxSetCurrent");
        assert_eq!(load(&mut module, c"bench".as_ptr().cast()), 0);
        assert_eq!(get_function(&mut function, module, c"k".as_ptr()), 0);
    }
    Kernel(function)
}

/// One launch of `kernel` (grid 1x1x1 of 1 thread) on the legacy stream through `f`, whose
/// one parameter is the fake's nanoseconds per wave; asserts success.
pub fn launch_once(f: LaunchFn, kernel: Kernel, params: &mut [*mut c_void; 1]) {
    // SAFETY: a loaded function, grid 1x1x1 of 1 thread, kernelParams[0] -> u64.
    let rc = unsafe {
        f(
            kernel.0,
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
}

/// Runs `once` `times` times: the calls callgrind counts (the scripts'
/// `--toggle-collect=*measured*`), so that set-up and warm-up calls, whose number may depend on
/// the wall clock, stay out of the figures.
#[inline(never)]
pub fn measured(times: u64, once: &mut dyn FnMut()) {
    for _ in 0..times {
        once();
    }
}
