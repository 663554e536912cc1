//! Load-cost prototype of a front library (x86-64 only): exported trampolines and a loader
//! that imports only `dlopen`, `dlvsym` and `dladdr`. Never preload it into a real workload:
//! the loader is a stand-in that resolves nothing.

#![no_std]

use core::ffi::{c_char, c_int, c_void};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void;
    fn dladdr(address: *const c_void, info: *mut [usize; 4]) -> c_int;
}

include!(concat!(env!("OUT_DIR"), "/exports.rs"));

/// Where each export jumps; all start at the (non-exported, so relative-relocated) loader.
static mut SLOTS: [unsafe extern "C" fn(); EXPORTS] = [load; EXPORTS];

/// Stand-in for "find the Rust library beside this one, dlopen it, fill SLOTS": it makes the
/// same imports a real loader would, so their load-time cost is in the measurement.
unsafe extern "C" fn load() {
    let mut info = [0usize; 4];
    // SAFETY: any address is accepted; `info` has Dl_info's size.
    unsafe { dladdr(load as *const c_void, &mut info) };
    // SAFETY: NUL-terminated names.
    let handle = unsafe { dlopen(c"libgpuslice-core.so".as_ptr(), 2) };
    // SAFETY: as above.
    unsafe { dlvsym(handle, c"dlsym".as_ptr(), c"GLIBC_2.34".as_ptr()) };
}
