//! Link settings of libgpuslice.so that decide what EVERY process of a sliced container pays at
//! exec (`/etc/ld.so.preload` loads the shim into shells, compilers and Python workers that
//! never touch a GPU). Each was measured; see `docs/performance.md`, "Preload cost".
//!
//! * `-Bsymbolic-functions`: the shim's references to its own exported wrappers (the
//!   registry's name -> wrapper table, ~90 entries) bind inside the library at link time
//!   instead of being looked up by name in the global scope at every exec. It also makes
//!   those pointers what the registry means: OUR wrapper, even if the main program happens to
//!   define a function of the same name (the dlsym rules compare against them).
//! * The unwinder linked statically (`libgcc_eh.a`, hidden symbols, whole archive so every
//!   `_Unwind_*` is defined before std's `-lgcc_s` is seen; `--as-needed` then drops
//!   `libgcc_s.so.1`): one fewer library to open, map, relocate and protect per exec (~100 us).
//!   Panics are still caught at the FFI boundary (`panic = "unwind"` is unchanged). GCC 12+'s
//!   static unwinder calls `_dl_find_object` (GLIBC_2.35); `src/ground/find_object.rs` defines it,
//!   hidden, on top of `dl_iterate_phdr`, so nothing newer than GLIBC_2.34 is imported and the
//!   shim still loads on RHEL 9 / UBI 9 (glibc 2.34; a preload the loader cannot load is
//!   skipped, and the container would run unlimited). Skipped, with a warning, where the C
//!   compiler has no `libgcc_eh.a` (the build then keeps libgcc_s).
//! * (libm is avoided in the source: `src/math.rs`.)

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || env != "gnu" {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    match static_unwinder_dir() {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=static:+whole-archive=gcc_eh");
        }
        None => println!(
            "cargo:warning=libgcc_eh.a not found by the C compiler: libgpuslice.so keeps \
             libgcc_s.so.1 as a dependency (costs every exec of a sliced container)"
        ),
    }
}

/// The directory of the C compiler's `libgcc_eh.a` (what `gcc -static-libgcc` links).
fn static_unwinder_dir() -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    // gcc prints the bare name back when it has no such file.
    let path = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    if !path.is_absolute() || !path.is_file() {
        return None;
    }
    path.parent().map(PathBuf::from)
}
