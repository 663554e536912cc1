//! The exported `dlsym`: how cudarc, ctypes, pynvml, nvidia-smi and the CUDA runtime (which
//! looks up `cuGetProcAddress_v2` this way) reach our wrappers. An explicit-handle `dlsym`
//! searches only that library's tree, so LD_PRELOAD interposition alone never sees them.
//!
//! Shape: a naked assembly trampoline (x86-64, aarch64) that
//! * for `RTLD_NEXT` TAIL-JUMPS to the real dlsym: glibc resolves RTLD_NEXT relative to its
//!   caller's return address, which a tail jump leaves untouched;
//! * otherwise asks [`decide_dlsym_answer`] (passing the caller's return address); a non-null
//!   answer is returned, a null one means "not ours" and the trampoline tail-jumps to the real
//!   dlsym with the original arguments, so every other lookup behaves exactly as without the
//!   shim.
//!
//! The real dlsym is resolved on first need (`real::resolve_real_dlsym`) with the argument
//! registers saved and the stack kept 16-byte aligned.
//!
//! Decision rules: only names in the registry are considered.
//! * A handle whose link-map name is `libcuda.so*` / `libnvidia-ml.so*` (cached lock-free):
//!   our wrapper when the real lookup finds the function (an older driver without it keeps
//!   getting NULL and its dlerror).
//! * `RTLD_DEFAULT` and the main program's handle (`dlopen(NULL)`, `ctypes.CDLL(None)`):
//!   the global scope, where our own exports sit. Answered as glibc would answer without the
//!   shim ([`answer_in_global_scope`]): the definition after ours (`RTLD_NEXT` from the shim),
//!   else, for `RTLD_DEFAULT`, the caller's own dependency tree, else NULL. So a process with
//!   no driver in scope finds no `cuInit`; the driver's function, once in scope, comes out as
//!   our wrapper. (A weak reference or any other ELF binding to the name still binds to our
//!   export: that is how the shim interposes on programs linked with `-lcuda`.)
//! * Everything else is forwarded.
//!
//! The fast path (names that are not ours) uses no allocation, no lock and no TLS: this runs
//! before initialisation and inside hosts' malloc interposers. The global-scope rules, only
//! for registry names, call glibc's dlsym/dladdr/dlinfo (which take the loader's lock).

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::ground::real::{real_dlsym, Library};
use crate::hooks::registry::{hook_by_name, Hook};

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
/// `dladdr1`'s flag for "also return the `struct link_map *`" (<dlfcn.h>).
const RTLD_DL_LINKMAP: libc::c_int = 2;

/// `judge` applied to the name glibc's link map gives the object behind dlopen handle
/// `handle` (the path it was loaded from; empty for the main program); `false` when it has
/// none or glibc cannot say. The name is only borrowed for the call: the object may be
/// unloaded later.
fn handle_name_is(handle: *mut c_void, judge: impl FnOnce(&CStr) -> bool) -> bool {
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
    // empty for the main program), valid while the object is loaded, i.e. during this call.
    let name = unsafe { (*map).l_name };
    // SAFETY: as above, when not null.
    !name.is_null() && judge(unsafe { CStr::from_ptr(name) })
}

fn handle_path_is(handle: *mut c_void, library: Library) -> bool {
    handle_name_is(handle, |path| {
        is_driver_library_path(path.to_bytes(), library)
    })
}

/// The wrapper (or other function) to hand out for `dlsym(handle, name)` called from
/// `caller` (the return address), NULL for "forward to the real dlsym unchanged", or
/// [`ANSWER_NULL`] for "answer NULL". Never called with `RTLD_NEXT` (the trampoline forwards
/// that itself).
pub extern "C" fn decide_dlsym_answer(
    handle: *mut c_void,
    name: *const c_char,
    caller: *const c_void,
) -> *mut c_void {
    std::panic::catch_unwind(|| decide(handle, name, caller)).unwrap_or(std::ptr::null_mut())
}

fn decide(handle: *mut c_void, name: *const c_char, caller: *const c_void) -> *mut c_void {
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
    answer_for_hook(handle, name, hook, caller)
}

/// Returned by the decision function for "answer NULL" (the trampoline turns it into NULL).
pub const ANSWER_NULL: *mut c_void = std::ptr::dangling_mut::<c_void>();

fn answer_for_hook(
    handle: *mut c_void,
    name: *const c_char,
    hook: &'static Hook,
    caller: *const c_void,
) -> *mut c_void {
    if handle == libc::RTLD_DEFAULT || is_main_program(handle) {
        return answer_in_global_scope(handle, name, hook, caller);
    }
    if !handle_is_library(handle, hook.library()) {
        return std::ptr::null_mut();
    }
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's own handle and name, passed to the real dlsym.
    let real = unsafe { dlsym(handle, name) };
    if real.is_null() {
        // The real library lacks it: forwarding reproduces NULL and its dlerror text.
        return std::ptr::null_mut();
    }
    hook.slot.seed(real, hook.wrapper());
    hook.wrapper() as *mut c_void
}

/// `RTLD_DEFAULT` and the main program's handle (`dlopen(NULL)`, `ctypes.CDLL(None)`)
/// search the global scope, where our own export of every hooked name sits. A plain forward
/// would therefore always find us, and a process with no driver would see `cuInit`. Answer
/// instead what glibc would answer without the shim:
/// * a definition before ours (the main program's own): forward;
/// * the next definition after ours in the global scope (`RTLD_NEXT` from this object):
///   the driver's function -> our wrapper; anything else -> that definition;
/// * none in the global scope: for `RTLD_DEFAULT`, the caller's own dependency tree (a
///   library dlopened `RTLD_LOCAL` with the driver among its dependencies sees it); else
///   NULL, with a dlerror text from a failed lookup of the name.
fn answer_in_global_scope(
    handle: *mut c_void,
    name: *const c_char,
    hook: &'static Hook,
    caller: *const c_void,
) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's handle (RTLD_DEFAULT or the main program's) and name.
    let first = unsafe { dlsym(handle, name) };
    if first.is_null() || !std::ptr::eq(first, hook.wrapper()) {
        // Not found at all (our export is not global: the shim was dlopened locally), or
        // the main program defines it before us: forwarding answers exactly that.
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's NUL-terminated name.
    let next = unsafe { next_definition(dlsym, name) };
    if !next.is_null() {
        return hand_out(next, hook);
    }
    if handle == libc::RTLD_DEFAULT {
        if let Some(found) = lookup_in_callers_tree(dlsym, caller, name) {
            return hand_out(found, hook);
        }
        // Leave the failed lookup's text for the caller's dlerror().
        // SAFETY: as above.
        unsafe { next_definition(dlsym, name) };
    }
    ANSWER_NULL
}

/// `dlsym(RTLD_NEXT, name)` as the object that exports the hooks would ask it: the next
/// definition in the global scope after our export. With a front attached that is the
/// front's question to ask (a library dlopened `RTLD_LOCAL` gets its loader's scope for
/// RTLD_NEXT, not the global one); preloaded itself, this library asks.
#[inline(never)]
unsafe fn next_definition(dlsym: crate::ground::real::DlsymFn, name: *const c_char) -> *mut c_void {
    if let Some(next) = crate::hooks::front::front_next() {
        // SAFETY: the caller's NUL-terminated name (this function's contract).
        return unsafe { next(name) };
    }
    // SAFETY: RTLD_NEXT is resolved relative to this function's object (the caller of the
    // real dlsym; not a tail call: the result is inspected after it); the caller's name.
    let found = unsafe { dlsym(libc::RTLD_NEXT, name) };
    std::hint::black_box(found)
}

/// What to return for a definition `found` of a hooked name: our wrapper when it is the
/// driver's function (seeding the real slot), the definition itself when another library
/// provides the name.
fn hand_out(found: *mut c_void, hook: &'static Hook) -> *mut c_void {
    if object_is_library(found, hook.library()) {
        hook.slot.seed(found, hook.wrapper());
        hook.wrapper() as *mut c_void
    } else {
        found
    }
}

/// Whether the object that defines `address` is `library` (by its file name).
fn object_is_library(address: *const c_void, library: Library) -> bool {
    // SAFETY: an all-zero Dl_info is valid (null pointers); dladdr only writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr accepts any address and writes `info` on success.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: on success dli_fname is the object's NUL-terminated file name.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    is_driver_library_path(path, library)
}

/// `name` in the dependency tree of the object `caller` belongs to, for a caller that is not
/// the main program (whose scope is the global one, already searched). glibc's
/// `RTLD_DEFAULT` from a library dlopened `RTLD_LOCAL` searches that library's local scope
/// after the global one. (Approximated by the caller object's own tree: a dependency of a
/// locally loaded library that looks a name up in its loader's other dependencies is not
/// covered.)
fn lookup_in_callers_tree(
    dlsym: crate::ground::real::DlsymFn,
    caller: *const c_void,
    name: *const c_char,
) -> Option<*mut c_void> {
    let caller_path = object_path(caller)?;
    // SAFETY: NUL-terminated path of a loaded object; NOLOAD never loads anything and the
    // reference it takes is dropped below.
    let own = unsafe { libc::dlopen(caller_path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if own.is_null() {
        return None;
    }
    let found = if is_main_program(own) {
        std::ptr::null_mut()
    } else {
        // SAFETY: a live handle and the caller's NUL-terminated name.
        unsafe { dlsym(own, name) }
    };
    // SAFETY: drops the reference the NOLOAD dlopen took.
    unsafe { libc::dlclose(own) };
    (!found.is_null()).then_some(found)
}

/// The link-map name of the object containing `address`; `None` for the main program
/// (empty name) or an address in no object.
fn object_path(address: *const c_void) -> Option<&'static CStr> {
    if address.is_null() {
        return None;
    }
    // SAFETY: an all-zero Dl_info is valid; dladdr1 writes it and the link map pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: any address is accepted; RTLD_DL_LINKMAP makes `map` a `struct link_map *`.
    let found = unsafe { libc::dladdr1(address, &mut info, &mut map, RTLD_DL_LINKMAP) };
    if found == 0 || map.is_null() {
        return None;
    }
    // SAFETY: glibc returned a live link_map whose l_name is NUL-terminated; the object
    // stays loaded while its code is our caller.
    let name = unsafe { (*(map as *const LinkMapHead)).l_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: as above.
    let path = unsafe { CStr::from_ptr(name) };
    (!path.is_empty()).then_some(path)
}

/// The main program's handle (`dlopen(NULL)`), cached once seen.
static MAIN_PROGRAM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Whether `handle` is the main program's (its link map has the empty name), whose lookups
/// search the global scope.
fn is_main_program(handle: *mut c_void) -> bool {
    let known = MAIN_PROGRAM.load(Ordering::Acquire);
    if !known.is_null() {
        return known == handle;
    }
    // The main program's link map has the empty name.
    let main = handle_name_is(handle, |name| name.is_empty());
    if main {
        MAIN_PROGRAM.store(handle, Ordering::Release);
    }
    main
}

// `dlsym_trampoline!`: the exported dlsym's machine code, shared with the front library (unit
// tests export no dlsym: it would interpose the test binary's own lookups).
#[cfg(not(test))]
include!("dlsym_asm.rs");

/// The exported `dlsym`.
///
/// # Safety
/// libc's contract for `dlsym`: a handle `dlopen` gave (or a pseudo-handle) and a
/// NUL-terminated name.
#[cfg(all(not(test), any(target_arch = "x86_64", target_arch = "aarch64")))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    dlsym_trampoline!(
        decide_dlsym_answer,
        crate::ground::real::REAL_DLSYM,
        crate::ground::real::resolve_real_dlsym_for_trampoline
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

    /// The front (`shim/front/lib.rs`, `hookable_prefix`) and the exported dlsym's first-byte
    /// check (`dlsym_asm.rs`) forward every name not of this shape without a lookup.
    #[test]
    fn every_hooked_name_is_cu_or_nvml_then_a_capital() {
        for hook in crate::hooks::registry::HOOKS.iter() {
            let name = hook.name.as_bytes();
            let capital = |i: usize| name.get(i).is_some_and(|b| b.is_ascii_uppercase());
            assert!(
                (name.starts_with(b"cu") && capital(2))
                    || (name.starts_with(b"nvml") && capital(4)),
                "{} would be forwarded by the front's prefix check",
                hook.name
            );
        }
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
            assert!(decide(libc::RTLD_DEFAULT, name.as_ptr().cast(), std::ptr::null()).is_null());
        }
        // A hooked name looked up in a library that is not the driver: not ours.
        assert!(decide(libc_handle, c"cuMemAlloc_v2".as_ptr(), std::ptr::null()).is_null());
        assert!(!handle_is_library(libc_handle, Library::Cuda));
        assert!(decide(libc_handle, std::ptr::null(), std::ptr::null()).is_null());
    }

    #[test]
    fn the_main_program_and_callers_objects_are_recognised() {
        // SAFETY: dlopen(NULL) returns the main program's handle; NOLOAD never loads.
        let main = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_NOW) };
        // SAFETY: as above.
        let libc_handle =
            unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(is_main_program(main));
        assert!(is_main_program(main), "cached answer");
        assert!(!is_main_program(libc_handle));
        // The unit-test binary is the main program: no path (its scope is the global one).
        let here = the_main_program_and_callers_objects_are_recognised as *const c_void;
        assert!(object_path(here).is_none());
        let strlen = libc::strlen as *const c_void;
        let libc_path = object_path(strlen).expect("libc has a link-map name");
        assert!(libc_path.to_bytes().ends_with(b".so.6"), "{libc_path:?}");
        assert!(!object_is_library(strlen, Library::Cuda));
        assert!(object_path(std::ptr::null()).is_none());
    }

    #[test]
    fn a_hooked_name_the_real_library_lacks_is_not_handed_out() {
        // No libcuda in scope in the unit-test process: the real RTLD_DEFAULT lookup is NULL,
        // so the answer is "forward" (NULL with the real dlerror), never our wrapper.
        // SAFETY: NUL-terminated literal; NOLOAD never loads anything.
        if unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
            .is_null()
        {
            assert!(decide(
                libc::RTLD_DEFAULT,
                c"cuMemAlloc_v2".as_ptr(),
                std::ptr::null()
            )
            .is_null());
        }
    }
}
