//! Cost of the fake GPU's hot paths through its C ABI: an enqueue-only `cuLaunchKernel`
//! (1 ns kernels, so the per-process queue never fills and nothing sleeps) and a
//! `cuMemAlloc_v2` + `cuMemFree_v2` pair. Both must stay well under a microsecond, or the
//! fake would distort the shim overheads measured on top of it.
//!
//! Loads `libfakegpu_cuda.so` from the bench binary's target directory; build it first:
//! `cargo build --release -p fakegpu-cuda` (`cargo bench` does not build cdylibs of other
//! packages).

use criterion::{criterion_group, criterion_main, Criterion};
use libloading::Library;
use std::ffi::{c_int, c_uint, c_void};
use std::hint::black_box;
use std::path::PathBuf;

type Launch = unsafe extern "C" fn(
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

fn lib_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FAKEGPU_CUDA_LIB") {
        return p.into();
    }
    gpuslice_benches::artifact_dir().join("libfakegpu_cuda.so")
}

fn sym<T: Copy>(lib: &'static Library, name: &[u8]) -> T {
    // SAFETY: each name below is a libcuda function whose C signature matches T.
    *unsafe { lib.get::<T>(name) }.expect("symbol exported by the fake")
}

fn bench(c: &mut Criterion) {
    let state = std::env::temp_dir().join(format!("fakegpu-bench-{}.state", std::process::id()));
    let _ = std::fs::remove_file(&state);
    // Before the library reads its environment (first call below); no other threads yet.
    std::env::set_var("FAKEGPU_STATE", &state);
    std::env::set_var("FAKEGPU_DEVICES", "h200");
    let path = lib_path();
    // SAFETY: loading the fake driver; its initialisers are plain Rust statics.
    let lib: &'static Library = Box::leak(Box::new(unsafe { Library::new(&path) }.unwrap_or_else(
        |e| {
            panic!(
                "{}: {e} (run `cargo build --release -p fakegpu-cuda` first)",
                path.display()
            )
        },
    )));
    let init: unsafe extern "C" fn(c_uint) -> u32 = sym(lib, b"cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32 =
        sym(lib, b"cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(*mut c_void) -> u32 = sym(lib, b"cuCtxSetCurrent");
    let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32 =
        sym(lib, b"cuModuleLoadData");
    let get_fn: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> u32 =
        sym(lib, b"cuModuleGetFunction");
    let launch: Launch = sym(lib, b"cuLaunchKernel");
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> u32 = sym(lib, b"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(u64) -> u32 = sym(lib, b"cuMemFree_v2");
    let (mut ctx, mut module, mut f) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid out-pointers, a non-null image and a C string name.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        assert_eq!(load(&mut module, c"x".as_ptr().cast()), 0);
        assert_eq!(get_fn(&mut f, module, c"k".as_ptr()), 0);
    }
    let mut ns_per_wave: u64 = 1;
    let mut params = [&mut ns_per_wave as *mut u64 as *mut c_void];
    c.bench_function("fake cuLaunchKernel (enqueue only)", |b| {
        b.iter(|| {
            // SAFETY: kernelParams[0] points to the u64 ns_per_wave.
            let r = unsafe {
                launch(
                    f,
                    1,
                    1,
                    1,
                    128,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            black_box(r)
        })
    });
    c.bench_function("fake cuMemAlloc_v2 + cuMemFree_v2 (1 MiB)", |b| {
        b.iter(|| {
            let mut p = 0u64;
            // SAFETY: valid out-pointer; p is freed once.
            unsafe {
                assert_eq!(alloc(&mut p, black_box(1 << 20)), 0);
                assert_eq!(free(p), 0);
            }
        })
    });
    let _ = std::fs::remove_file(&state);
}

criterion_group!(benches, bench);
criterion_main!(benches);
