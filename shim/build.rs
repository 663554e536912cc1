//! Link settings of libgpuslice.so that decide what EVERY process of a sliced container pays at
//! exec (`/etc/ld.so.preload` loads the shim into shells, compilers and Python workers that
//! never touch a GPU). Each was measured; see `docs/performance.md`, "Preload cost".
//!
//! * `-Bsymbolic-functions`: the shim's references to its own exported wrappers (the
//!   registry's name -> wrapper table, ~90 entries) bind inside the library at link time
//!   instead of being looked up by name in the global scope at every exec. It also makes
//!   those pointers what the registry means: OUR wrapper, even if the main program happens to
//!   define a function of the same name (the dlsym rules compare against them).
//! * (libm is avoided in the source: `src/math.rs`.)
//! * NOT done: linking the unwinder statically (`libgcc_eh.a`) to drop `libgcc_s.so.1` was
//!   measured (one fewer library per exec), but GCC 12's static unwinder imports
//!   `_dl_find_object@GLIBC_2.35`, which raises the shim's glibc floor from 2.34 to 2.35 and
//!   so would leave RHEL 9 / UBI 9 based CUDA images (glibc 2.34) running WITHOUT the shim,
//!   unlimited (the loader skips a preload it cannot load). A floor is a cap that fails open;
//!   an exec's few tens of microseconds are not worth that.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || env != "gnu" {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
