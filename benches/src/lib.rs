//! Helpers shared by the criterion benchmarks in `benches/benches/`: where cargo put the
//! release artifacts (the fake GPU's libraries, `libgpuslice.so`), and loading them with the
//! real `dlopen`/`dlsym` the way a client process does.
//!
//! The benches load libraries into their own process instead of running them under
//! `LD_PRELOAD`, so that one process can time the real function and the shim's wrapper side
//! by side.

use std::ffi::{c_void, CStr, CString};
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
