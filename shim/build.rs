//! Builds the front, `libgpuslice.so`, and sets the link choices of the core,
//! `libgpuslice_core.so` (this crate).
//!
//! The FRONT (`front/lib.rs`) is what `/etc/ld.so.preload` maps into every process of a sliced
//! container (shells, compilers, Python workers that never touch a GPU), so its link settings
//! are chosen for what every exec pays (`build_front`, below; `docs/performance-history.md`, "Preload
//! cost"). It is a `no_std` library that must be `panic = "abort"`, which no profile of this
//! workspace can give one crate, so it is compiled here with `rustc` directly and copied beside
//! the core in the profile directory (`target/<profile>/`). Its exports are generated from the
//! registry (`src/hooks/registry.rs`), so the two lists cannot drift (checked again by e2e
//! `shim_isolation::the_front_exports_exactly_the_registry`). For another target than the
//! host it links with the linker cargo resolved for that target; with none configured (CI's
//! aarch64 check) it compiles the front to an object only and says so.
//!
//! The CORE is loaded by the front (`dlopen`) at a process's first CUDA or NVML call, so its
//! link choices cost only processes that use the GPU, once each:
//!
//! * `-Bsymbolic-functions`, for correctness: the core's references to its own exported
//!   wrappers (the registry's name -> wrapper table) bind inside the library at link time, so
//!   those pointers are OUR wrappers even if the main program defines a function of the same
//!   name (the dlsym rules compare against them), and cost no lookup by name at load.
//! * The unwinder linked statically (`libgcc_eh.a`, hidden symbols, whole archive so every
//!   `_Unwind_*` is defined before std's `-lgcc_s` is seen; `--as-needed` then drops
//!   `libgcc_s.so.1`), so the core names only libc and the loader. Panics are still caught at
//!   the FFI boundary (`panic = "unwind"` is unchanged). GCC 12+'s static unwinder calls
//!   `_dl_find_object` (GLIBC_2.35); `src/ground/find_object.rs` defines it, hidden, on top of
//!   `dl_iterate_phdr`, so nothing newer than GLIBC_2.34 is imported and the core still loads on
//!   RHEL 9 / UBI 9 (glibc 2.34; a core the front cannot load makes every CUDA/NVML call fail).
//!   Skipped, with a warning, where the C compiler has no `libgcc_eh.a` (the build then keeps
//!   libgcc_s). What a dependency of a preloaded library costs every exec (~100 us each for
//!   libgcc_s and libm: `docs/performance-history.md`, "Preload cost") is the front's concern; the core
//!   pays such a load once per GPU process, whose C++ runtime usually has `libgcc_s.so.1` and
//!   `libm.so.6` loaded already. So what this and `ground/math.rs`'s built-in `exp` save is
//!   small; they stay because they are tested and cost nothing at run time, and linking
//!   libgcc_s and libm again would be a simplification, not a loss.

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
    build_front();
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

/// The hooked names of the registry's `hooks { ... }` block, in order, with their library.
fn registry_hooks(registry: &str) -> Vec<(String, bool)> {
    let start = registry
        .find("        hooks {")
        .expect("registry.rs has a `hooks {` block");
    let end = registry[start..]
        .find("        helpers {")
        .map(|e| start + e)
        .expect("registry.rs has a `helpers {` block");
    let mut hooks = Vec::new();
    for line in registry[start..end].lines() {
        let line = line.trim_start();
        for (prefix, nvml) in [("Cuda fn ", false), ("Nvml fn ", true)] {
            if let Some(rest) = line.strip_prefix(prefix) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                hooks.push((name, nvml));
            }
        }
    }
    assert!(!hooks.is_empty(), "no hooks found in registry.rs");
    hooks
}

/// The front's generated part: the names and their lookup, which library each belongs to, one naked
/// trampoline per name (`jmp [SLOTS + 8 * index]`, with the index in a scratch register for
/// the lazy loader) and the table of their addresses.
fn front_exports(hooks: &[(String, bool)], arch: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let n = hooks.len();
    writeln!(out, "pub const HOOK_COUNT: usize = {n};").unwrap();
    writeln!(out, "pub struct Table<T>(pub [T; HOOK_COUNT]);").unwrap();
    writeln!(
        out,
        "// SAFETY: read-only tables of addresses of statics and functions.\n\
         unsafe impl<T> Sync for Table<T> {{}}"
    )
    .unwrap();
    writeln!(out, "pub static NAMES: Table<*const c_char> = Table([").unwrap();
    for (name, _) in hooks {
        writeln!(out, "    c\"{name}\".as_ptr(),").unwrap();
    }
    writeln!(out, "]);").unwrap();
    // The name -> index lookup of the dlsym path: a `match` on the bytes, which rustc
    // compiles to a dispatch on the length and a few comparisons (a linear scan cost ~370 ns
    // per `cu`-prefixed lookup such as `cuserid`).
    writeln!(
        out,
        "pub fn hook_index(name: &[u8]) -> Option<usize> {{ match name {{"
    )
    .unwrap();
    for (index, (name, _)) in hooks.iter().enumerate() {
        writeln!(out, "    b\"{name}\" => Some({index}),").unwrap();
    }
    writeln!(out, "    _ => None,\n}} }}").unwrap();
    writeln!(out, "pub static IS_NVML: [bool; HOOK_COUNT] = [").unwrap();
    for (_, nvml) in hooks {
        writeln!(out, "    {nvml},").unwrap();
    }
    writeln!(out, "];").unwrap();
    for (index, (name, _)) in hooks.iter().enumerate() {
        let body = if arch == "aarch64" {
            format!(
                "\"mov w9, #{index}\", \"adrp x16, {{slots}}\", \
                 \"add x16, x16, :lo12:{{slots}}\", \"ldr x16, [x16, #{}]\", \"br x16\"",
                8 * index
            )
        } else {
            format!(
                "\"mov r11d, {index}\", \"jmp qword ptr [rip + {{slots}} + {}]\"",
                8 * index
            )
        };
        writeln!(
            out,
            "#[unsafe(naked)] #[no_mangle] pub unsafe extern \"C\" fn {name}() {{ \
             core::arch::naked_asm!({body}, slots = sym SLOTS) }}"
        )
        .unwrap();
    }
    writeln!(out, "pub static EXPORTS: Table<*const c_void> = Table([").unwrap();
    for (name, _) in hooks {
        writeln!(out, "    {name} as *const c_void,").unwrap();
    }
    writeln!(out, "]);").unwrap();
    out
}

/// Compiles `front/lib.rs` into `libgpuslice.so` and puts it in the profile directory.
fn build_front() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let registry_path = manifest.join("src/hooks/registry.rs");
    let front_source = manifest.join("front/lib.rs");
    println!("cargo:rerun-if-changed={}", registry_path.display());
    println!("cargo:rerun-if-changed={}", front_source.display());
    // The exported dlsym's machine code, which the front includes from the core's sources.
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("src/hooks/dlsym_asm.rs").display()
    );
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" && arch != "aarch64" {
        println!("cargo:warning=no gpuslice front library for {arch}: libgpuslice.so not built");
        return;
    }
    let registry = std::fs::read_to_string(&registry_path).expect("read registry.rs");
    let exports = out_dir.join("front_exports.rs");
    std::fs::write(&exports, front_exports(&registry_hooks(&registry), &arch))
        .expect("write front_exports.rs");
    let built = out_dir.join("libgpuslice.so");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let target = std::env::var("TARGET").unwrap();
    // Cross-compiling (CI checks aarch64 on x86-64): the linker cargo resolved for the
    // target, if one is configured; without one the front is compiled to an object only
    // (its code, machine code included, is still generated and assembled) and not installed.
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let linker = std::env::var("RUSTC_LINKER").ok().filter(|l| !l.is_empty());
    let link = linker.is_some() || std::env::var("HOST").ok().as_deref() == Some(target.as_str());
    // Under `cargo clippy` the workspace's wrapper is clippy-driver: compiling the front
    // through it lints the front with the same flags (and `CLIPPY_ARGS`, so `-D warnings`)
    // as every crate of the workspace, although cargo never sees the front as a crate.
    let wrapper = std::env::var("RUSTC_WORKSPACE_WRAPPER")
        .ok()
        .filter(|w| !w.is_empty());
    println!("cargo:rerun-if-env-changed=RUSTC_WORKSPACE_WRAPPER");
    let mut command = match &wrapper {
        Some(wrapper) => {
            let mut c = Command::new(wrapper);
            c.arg(&rustc);
            c
        }
        None => Command::new(&rustc),
    };
    if let Some(linker) = &linker {
        command.arg("-C").arg(format!("linker={linker}"));
    }
    if !link {
        command.arg("--emit=obj");
    }
    command
        .env("GPUSLICE_FRONT_EXPORTS", &exports)
        .args(["--edition", "2021", "--crate-type", "cdylib"])
        .args(["--crate-name", "gpuslice"])
        .args(["--target", &target])
        // Optimised in every profile: it is what every exec of a container pays for.
        .args([
            "-C",
            "opt-level=2",
            "-C",
            "panic=abort",
            "-C",
            "debuginfo=0",
        ])
        .args(["-C", "lto=fat", "-C", "codegen-units=1"])
        // Its own references to its exports (the EXPORTS table) bind at link time: relative
        // relocations, no symbol lookups at exec.
        .args(["-C", "link-arg=-Wl,-Bsymbolic-functions"])
        // No crt start files: the front has no constructor or destructor, and crtbeginS.o's
        // weak references (`__cxa_finalize`, `_ITM_*`, `__gmon_start__`) are each a failed
        // search of every loaded object at every exec (~4,400 instructions in all).
        .args(["-C", "link-arg=-nostartfiles"])
        .arg("-o")
        .arg(&built)
        .arg(&front_source);
    let status = command.status().expect("run rustc for the front library");
    assert!(
        status.success(),
        "building the front library (shim/front/lib.rs) failed"
    );
    if !link {
        println!(
            "cargo:warning=libgpuslice.so for {target} compiled, not linked: no linker is \
             configured for the target (CARGO_TARGET_<TRIPLE>_LINKER)"
        );
        return;
    }
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out: the core lands in <profile>.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is inside the profile directory");
    let dest = profile_dir.join("libgpuslice.so");
    // Replace, never write into, a library a running process may have mapped.
    let tmp = profile_dir.join(".libgpuslice.so.tmp");
    std::fs::copy(&built, &tmp).expect("copy the front library");
    std::fs::rename(&tmp, &dest).expect("install the front library");
}
