//! The exported `dlsym`: how cudarc, ctypes, pynvml, nvidia-smi and the CUDA runtime (which
//! looks up `cuGetProcAddress_v2` this way) reach our wrappers. An explicit-handle `dlsym`
//! searches only that library's tree, so LD_PRELOAD interposition alone never sees them.
//!
//! Shape: a naked assembly trampoline (x86-64, aarch64) that
//! * for `RTLD_NEXT` TAIL-JUMPS to the real dlsym: glibc resolves RTLD_NEXT relative to its
//!   caller's return address, which a tail jump leaves untouched;
//! * otherwise asks [`decide_dlsym_answer`]; a non-null answer (our wrapper) is returned, a
//!   null one means "not ours" and the trampoline tail-jumps to the real dlsym with the
//!   original arguments, so every other lookup (including `RTLD_DEFAULT`, whose scope also
//!   depends on the caller) behaves exactly as without the shim.
//!
//! The real dlsym is resolved on first need (`real::resolve_real_dlsym`) with the argument
//! registers saved and the stack kept 16-byte aligned.
//!
//! Decision rules: only names in the registry are redirected, only for lookups in the global
//! scope (`RTLD_DEFAULT`) or in a handle whose link-map name is `libcuda.so*` /
//! `libnvidia-ml.so*` (cached lock-free), and only when the real lookup finds the function
//! (an older driver without it keeps getting NULL and its dlerror). No allocation, no lock,
//! no TLS: this runs before initialisation and inside hosts' malloc interposers.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::real::{real_dlsym, Library};
use crate::registry::{hook_by_name, Hook};

/// Quick pre-filter: every hooked name starts with one of these.
pub fn could_be_hooked(name: &[u8]) -> bool {
    name.starts_with(b"cu") || name.starts_with(b"nvml")
}

/// Whether a link-map file name is the given driver library (`/x/y/libcuda.so.1` etc.).
pub fn is_driver_library_path(path: &[u8], library: Library) -> bool {
    let basename = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    basename.starts_with(library.basename_prefix())
}

const KNOWN_HANDLES: usize = 8;
static KNOWN_CUDA_HANDLES: [AtomicPtr<c_void>; KNOWN_HANDLES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; KNOWN_HANDLES];
static KNOWN_NVML_HANDLES: [AtomicPtr<c_void>; KNOWN_HANDLES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; KNOWN_HANDLES];

/// Whether `handle` (from dlopen) is `library`. Positive answers are cached lock-free; a full
/// cache only means asking dlinfo again.
pub fn handle_is_library(handle: *mut c_void, library: Library) -> bool {
    let cache = match library {
        Library::Cuda => &KNOWN_CUDA_HANDLES,
        Library::Nvml => &KNOWN_NVML_HANDLES,
    };
    if cache
        .iter()
        .any(|slot| slot.load(Ordering::Acquire) == handle)
    {
        return true;
    }
    if !handle_path_is(handle, library) {
        return false;
    }
    for slot in cache {
        match slot.compare_exchange(
            std::ptr::null_mut(),
            handle,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(existing) if existing == handle => break,
            Err(_) => {}
        }
    }
    true
}

/// The first fields of glibc's `struct link_map` (public ABI in <link.h>).
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const c_char,
}

const RTLD_DI_LINKMAP: libc::c_int = 2;

fn handle_path_is(handle: *mut c_void, library: Library) -> bool {
    let mut map: *const LinkMapHead = std::ptr::null();
    // SAFETY: `handle` is what the caller passed to dlsym, i.e. a dlopen handle; dlinfo writes
    // one pointer into `map`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            RTLD_DI_LINKMAP,
            (&mut map as *mut *const LinkMapHead).cast(),
        )
    };
    if rc != 0 || map.is_null() {
        return false;
    }
    // SAFETY: glibc returned a live link_map whose l_name is a NUL-terminated string (possibly
    // empty for the main program).
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return false;
    }
    // SAFETY: as above.
    let path = unsafe { CStr::from_ptr(name) }.to_bytes();
    is_driver_library_path(path, library)
}

/// The wrapper to hand out for `dlsym(handle, name)`, NULL for "forward to the real dlsym
/// unchanged", or [`ANSWER_NULL`] for "answer NULL". Never called with `RTLD_NEXT` (the trampoline forwards that itself).
pub extern "C" fn decide_dlsym_answer(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::panic::catch_unwind(|| decide(handle, name)).unwrap_or(std::ptr::null_mut())
}

fn decide(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let name_bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !could_be_hooked(name_bytes) {
        return std::ptr::null_mut();
    }
    let Some(hook) = std::str::from_utf8(name_bytes).ok().and_then(hook_by_name) else {
        return std::ptr::null_mut();
    };
    answer_for_hook(handle, name, hook)
}

/// Returned by the decision function for "answer NULL" (the trampoline turns it into NULL).
pub const ANSWER_NULL: *mut c_void = std::ptr::dangling_mut::<c_void>();

fn answer_for_hook(handle: *mut c_void, name: *const c_char, hook: &'static Hook) -> *mut c_void {
    let global_scope = handle == libc::RTLD_DEFAULT;
    if !global_scope && !handle_is_library(handle, hook.library()) {
        return std::ptr::null_mut();
    }
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    if global_scope {
        // Our own export sits in the global scope, so forwarding would always find it. When the
        // driver is loaded but lacks the function (older driver), answer as the process would
        // without the shim: NULL, with the driver's own dlerror text for this thread.
        let library = hook.library().loaded_handle();
        if !library.is_null() && hook.slot.get().is_none() {
            // SAFETY: a live handle and the caller's NUL-terminated name; the call fails and
            // leaves its message for the caller's dlerror().
            unsafe { dlsym(library, name) };
            return ANSWER_NULL;
        }
    }
    // SAFETY: the caller's own handle and name, passed to the real dlsym.
    let real = unsafe { dlsym(handle, name) };
    if real.is_null() {
        // The real library lacks it: forwarding reproduces NULL and its dlerror text.
        return std::ptr::null_mut();
    }
    if !global_scope {
        hook.slot.seed(real, hook.wrapper);
    }
    hook.wrapper as *mut c_void
}

#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // RTLD_NEXT == (void*)-1: never look, tail-jump with the caller's return address.
        "cmp rdi, -1",
        "je 2f",
        // Entry rsp = 8 mod 16; two pushes + 8 make it 0 mod 16 at the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        // ANSWER_NULL (1): the answer is NULL.
        "cmp rax, 1",
        "jne 5f",
        "xor eax, eax",
        "5:",
        "ret",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "ret",
        decide = sym decide_dlsym_answer,
        real = sym crate::real::REAL_DLSYM,
        resolve = sym crate::real::resolve_real_dlsym_for_trampoline,
    )
}

#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // RTLD_NEXT == (void*)-1: tail-branch with x30 (the caller's return address) intact.
        "cmn x0, #1",
        "b.eq 2f",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 2f",
        // ANSWER_NULL (1): the answer is NULL.
        "mov x0, x16",
        "cmp x16, #1",
        "b.ne 5f",
        "mov x0, #0",
        "5:",
        "ret",
        "2:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        "br x16",
        "3:",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {resolve}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 4f",
        "br x16",
        "4:",
        "mov x0, #0",
        "ret",
        decide = sym decide_dlsym_answer,
        real = sym crate::real::REAL_DLSYM,
        resolve = sym crate::real::resolve_real_dlsym_for_trampoline,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefilter_admits_cuda_and_nvml_names_only() {
        assert!(could_be_hooked(b"cuMemAlloc_v2"));
        assert!(could_be_hooked(b"nvmlInit_v2"));
        assert!(
            could_be_hooked(b"curl_easy_init"),
            "prefilter only; the table decides"
        );
        assert!(!could_be_hooked(b"malloc"));
        assert!(!could_be_hooked(b"c"));
        assert!(!could_be_hooked(b""));
    }

    #[test]
    fn driver_libraries_are_recognised_by_basename() {
        assert!(is_driver_library_path(
            b"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            Library::Cuda
        ));
        assert!(is_driver_library_path(
            b"libcuda.so.570.86.10",
            Library::Cuda
        ));
        assert!(is_driver_library_path(
            b"/tmp/fake/libcuda.so",
            Library::Cuda
        ));
        assert!(is_driver_library_path(
            b"/lib/libnvidia-ml.so.1",
            Library::Nvml
        ));
        assert!(!is_driver_library_path(
            b"/lib/libcudart.so.12",
            Library::Cuda
        ));
        assert!(!is_driver_library_path(
            b"/lib/libcudnn.so.9",
            Library::Cuda
        ));
        assert!(!is_driver_library_path(
            b"/opt/libcuda.so.1/libfoo.so",
            Library::Cuda
        ));
        assert!(!is_driver_library_path(
            b"/lib/libnvidia-ml.so.1",
            Library::Cuda
        ));
        assert!(!is_driver_library_path(b"", Library::Cuda));
    }

    #[test]
    fn non_hooked_names_and_non_driver_handles_are_forwarded() {
        // SAFETY: NUL-terminated literal; NOLOAD only returns the already loaded libc.
        let libc_handle =
            unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(!libc_handle.is_null());
        for name in [
            &b"malloc\0"[..],
            b"curl_easy_init\0",
            b"cudnnCreate\0",
            b"cuMemAlloc\0",
        ] {
            assert!(decide(libc::RTLD_DEFAULT, name.as_ptr().cast()).is_null());
        }
        // A hooked name looked up in a library that is not the driver: not ours.
        assert!(decide(libc_handle, c"cuMemAlloc_v2".as_ptr()).is_null());
        assert!(!handle_is_library(libc_handle, Library::Cuda));
        assert!(decide(libc_handle, std::ptr::null()).is_null());
    }

    #[test]
    fn a_hooked_name_the_real_library_lacks_is_not_handed_out() {
        // No libcuda in scope in the unit-test process: the real RTLD_DEFAULT lookup is NULL,
        // so the answer is "forward" (NULL with the real dlerror), never our wrapper.
        // SAFETY: NUL-terminated literal; NOLOAD never loads anything.
        if unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
            .is_null()
        {
            assert!(decide(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()).is_null());
        }
    }
}
