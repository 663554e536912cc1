//! Hook overhead of libgpuslice.so (criterion):
//! * `dlsym/*`: the exported dlsym trampoline vs glibc's dlsym for names the shim does not
//!   hook (a plain libc name, and a `cu`-prefixed non-CUDA name that reaches the table match);
//! * `passthrough/*`: a hooked pass-through CUDA call (`cuCtxGetCurrent`, no policy) through
//!   the shim's export vs the driver's function called directly.
//!
//! The shim is loaded into the bench process with dlopen (its exports are then reached by
//! pointer, the way dlsym / cuGetProcAddress answers are). The driver is the fake
//! (`libfakegpu_cuda.so`, SONAME libcuda.so.1, from the same target dir as this bench; build
//! it with `cargo build --release -p fakegpu-cuda -p gpuslice-shim`) unless
//! `GPUSLICE_BENCH_LIBCUDA` names another libcuda. It is loaded first by path, so the shim's
//! `dlopen("libcuda.so.1", RTLD_NOLOAD)` finds it by SONAME.

use std::ffi::{c_char, c_void};
use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use gpuslice_benches::{artifact_dir, open, symbol_address};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type CtxGetCurrentFn = unsafe extern "C" fn(*mut *mut c_void) -> u32;

fn hooks(c: &mut Criterion) {
    let dir = artifact_dir();
    let libcuda = std::env::var_os("GPUSLICE_BENCH_LIBCUDA")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("libfakegpu_cuda.so"));
    let driver = open(&libcuda, libc::RTLD_NOW | libc::RTLD_GLOBAL);
    let shim = open(
        &dir.join("libgpuslice.so"),
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    );

    // SAFETY: both pointers are dlsym implementations with the C signature of dlsym.
    let real_dlsym: DlsymFn =
        unsafe { std::mem::transmute(symbol_address(libc::RTLD_DEFAULT, c"dlsym")) };
    // SAFETY: as above.
    let shim_dlsym: DlsymFn = unsafe { std::mem::transmute(symbol_address(shim, c"dlsym")) };
    let libc_handle = open(
        std::path::Path::new("libc.so.6"),
        libc::RTLD_NOW | libc::RTLD_NOLOAD,
    );

    let mut group = c.benchmark_group("dlsym");
    for (label, name) in [("malloc", c"malloc"), ("cu-prefixed cuserid", c"cuserid")] {
        group.bench_function(format!("{label}/real"), |b| {
            // SAFETY: live handle, NUL-terminated name, real dlsym signature.
            b.iter(|| unsafe { real_dlsym(black_box(libc_handle), black_box(name.as_ptr())) })
        });
        group.bench_function(format!("{label}/shim"), |b| {
            // SAFETY: as for the real one; the shim's dlsym has its signature.
            b.iter(|| unsafe { shim_dlsym(black_box(libc_handle), black_box(name.as_ptr())) })
        });
    }
    group.finish();

    // SAFETY: cuCtxGetCurrent's C signature, from the driver and from the shim's export.
    let real_ctx: CtxGetCurrentFn =
        unsafe { std::mem::transmute(symbol_address(driver, c"cuCtxGetCurrent")) };
    // SAFETY: as above.
    let shim_ctx: CtxGetCurrentFn =
        unsafe { std::mem::transmute(symbol_address(shim, c"cuCtxGetCurrent")) };
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the first call initialises the shim (pass-through: no config).
    let (real_rc, shim_rc) = unsafe { (real_ctx(&mut ctx), shim_ctx(&mut ctx)) };
    assert_eq!(real_rc, shim_rc, "the wrapper answers like the driver");

    let mut group = c.benchmark_group("passthrough");
    group.bench_function("cuCtxGetCurrent/real", |b| {
        // SAFETY: valid out-pointer for cuCtxGetCurrent.
        b.iter(|| unsafe { real_ctx(black_box(&mut ctx)) })
    });
    group.bench_function("cuCtxGetCurrent/shim", |b| {
        // SAFETY: valid out-pointer for cuCtxGetCurrent.
        b.iter(|| unsafe { shim_ctx(black_box(&mut ctx)) })
    });
    group.finish();
}

criterion_group!(benches, hooks);
criterion_main!(benches);
