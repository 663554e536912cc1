//! Workload for counting the INSTRUCTIONS the exported `dlsym` adds to a lookup of a name
//! outside the registry (run under callgrind by `benches/dlsym-instructions.sh`): the wall-clock
//! criterion bench (`--bench hooks`, `dlsym/*`) reads within its noise on the shared VM.
//!
//! ```text
//! dlsym-loop [--real] --name NAME --lookups N
//! ```
//! Loads `libgpuslice.so` (the front, RTLD_GLOBAL, as a preload would) and looks `NAME` up in
//! libc's handle N times inside `measured` (the only function callgrind collects in), through
//! the front's `dlsym`, or through glibc's with `--real`: the script's "added" figure is the
//! difference of the two counts divided by N.
//! Build: `cargo build --release -p gpuslice-shim -p gpuslice-benches`.

use std::ffi::{c_char, c_void, CString};
use std::hint::black_box;

use gpuslice_benches::{measured, open, open_global, symbol, symbol_address};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

fn main() {
    let mut real = false;
    let mut name = None;
    let mut lookups = 100_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--real" => real = true,
            "--name" => name = Some(CString::new(value()).unwrap_or_else(|_| fail("--name"))),
            "--lookups" => lookups = value().parse().unwrap_or_else(|_| fail("--lookups N")),
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let name = name.unwrap_or_else(|| fail("--name NAME"));
    let dir = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("target/release")
        .to_path_buf();
    let front = open_global(&dir.join("libgpuslice.so"));
    let libc_handle = open(
        std::path::Path::new("libc.so.6"),
        libc::RTLD_NOW | libc::RTLD_NOLOAD,
    );
    // SAFETY: dlsym's C signature; RTLD_DEFAULT is bound to glibc at link time.
    let glibc: DlsymFn = unsafe { symbol(libc::RTLD_DEFAULT, c"dlsym") };
    // SAFETY: dlsym's C signature, exported by the front.
    let shim: DlsymFn = unsafe { symbol(front, c"dlsym") };
    let lookup = if real { glibc } else { shim };
    // SAFETY: a live handle and a NUL-terminated name; the answer is compared, not called.
    let expected = unsafe { symbol_address(libc_handle, &name) };
    // SAFETY: as above.
    assert_eq!(unsafe { lookup(libc_handle, name.as_ptr()) }, expected);
    measured(lookups, &mut || {
        // SAFETY: as above.
        black_box(unsafe { lookup(black_box(libc_handle), black_box(name.as_ptr())) });
    });
}

fn fail(problem: &str) -> ! {
    eprintln!("dlsym-loop: {problem}");
    eprintln!("usage: dlsym-loop [--real] --name NAME --lookups N");
    std::process::exit(2);
}
