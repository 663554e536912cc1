//! The real driver underneath the shim: the real `dlsym` (found with `dlvsym`, because a plain
//! `dlsym` lookup of "dlsym" would find our own export and recurse), the real
//! `libcuda.so.1` / `libnvidia-ml.so.1` handles, and the lazily resolved function slots.
//!
//! Everything here is lock-free and allocation-free: it runs on the dlsym path, possibly before
//! the shim is initialised and possibly from inside a host's malloc interposer.

use std::ffi::{c_char, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

/// The real `dlsym`; read by the exported `dlsym` trampoline (see `hooks::dlsym`), hence a plain
/// pointer-sized static. Null until resolved.
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc symbol versions of `dlsym`, newest first (2.34 moved libdl into libc).
#[cfg(target_arch = "x86_64")]
const DLSYM_VERSIONS: [&[u8]; 2] = [b"GLIBC_2.34\0", b"GLIBC_2.2.5\0"];
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSIONS: [&[u8]; 2] = [b"GLIBC_2.34\0", b"GLIBC_2.17\0"];

/// Thread id of the thread currently resolving the real dlsym (0 = none): a host malloc
/// interposer that calls `dlsym` while glibc resolves ours must get NULL, not infinite recursion.
static RESOLVING_TID: AtomicI32 = AtomicI32::new(0);

/// The real `dlsym`, resolving it on first use.
#[inline]
pub fn real_dlsym() -> Option<DlsymFn> {
    let known = REAL_DLSYM.load(Ordering::Acquire);
    let pointer = if known.is_null() {
        resolve_real_dlsym()
    } else {
        known
    };
    // SAFETY: non-null values stored in REAL_DLSYM come from dlvsym("dlsym"), whose C signature
    // is `DlsymFn`.
    (!pointer.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(pointer) })
}

/// Looks the real dlsym up with `dlvsym(RTLD_NEXT, ...)`; null when glibc has none of the
/// known versions or when called recursively on the same thread.
pub fn resolve_real_dlsym() -> *mut c_void {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    if RESOLVING_TID.load(Ordering::Acquire) == me {
        return null_mut();
    }
    RESOLVING_TID.store(me, Ordering::Release);
    let mut found = null_mut();
    for version in DLSYM_VERSIONS {
        // SAFETY: both strings are NUL-terminated statics; RTLD_NEXT from this object finds
        // libc's dlsym because no object after the shim defines another one we care about.
        found =
            unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr().cast()) };
        if !found.is_null() {
            break;
        }
    }
    RESOLVING_TID.store(0, Ordering::Release);
    if !found.is_null() {
        REAL_DLSYM.store(found, Ordering::Release);
    }
    found
}

/// Trampoline entry (called from assembly with the argument registers saved around it).
pub extern "C" fn resolve_real_dlsym_for_trampoline() -> *mut c_void {
    resolve_real_dlsym()
}

/// Which real library a hooked function lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    Cuda,
    Nvml,
}

static CUDA_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static NVML_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

impl Library {
    pub const fn soname(self) -> &'static [u8] {
        match self {
            Library::Cuda => b"libcuda.so.1\0",
            Library::Nvml => b"libnvidia-ml.so.1\0",
        }
    }

    /// File-name prefix that identifies this library's handles (`libcuda.so`, `libcuda.so.1`,
    /// `libcuda.so.570.86.10`, the fake's copies).
    pub const fn basename_prefix(self) -> &'static [u8] {
        match self {
            Library::Cuda => b"libcuda.so",
            Library::Nvml => b"libnvidia-ml.so",
        }
    }

    fn handle_cell(self) -> &'static AtomicPtr<c_void> {
        match self {
            Library::Cuda => &CUDA_HANDLE,
            Library::Nvml => &NVML_HANDLE,
        }
    }

    /// The real library's handle: the already loaded one if any (RTLD_NOLOAD), else loaded now.
    /// Null when the library cannot be found (not cached, so a later load is picked up).
    pub fn handle(self) -> *mut c_void {
        let cell = self.handle_cell();
        let known = cell.load(Ordering::Acquire);
        if !known.is_null() {
            return known;
        }
        let name = self.soname().as_ptr().cast();
        // SAFETY: `name` is a NUL-terminated static; dlopen is not hooked by the shim.
        let mut handle = unsafe { libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            // SAFETY: as above.
            handle = unsafe { libc::dlopen(name, libc::RTLD_NOW) };
        }
        if !handle.is_null() {
            cell.store(handle, Ordering::Release);
        }
        handle
    }

    /// The handle only if the library is already loaded in this process (never loads it).
    pub fn loaded_handle(self) -> *mut c_void {
        let known = self.handle_cell().load(Ordering::Acquire);
        if !known.is_null() {
            return known;
        }
        // SAFETY: NUL-terminated static name; RTLD_NOLOAD never loads anything.
        unsafe {
            libc::dlopen(
                self.soname().as_ptr().cast(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        }
    }
}

/// Marker stored in a slot whose function the real library does not have (address 1: with
/// null, the two lowest addresses, see [`RealSlot::resolved`]).
const MISSING: *mut c_void = std::ptr::without_provenance_mut(1);

/// One real function: resolved on first use with the real dlsym on the real library handle.
pub struct RealSlot {
    pointer: AtomicPtr<c_void>,
    pub library: Library,
    /// NUL-terminated exported name.
    pub c_name: &'static [u8],
}

impl RealSlot {
    pub const fn new(library: Library, c_name: &'static [u8]) -> RealSlot {
        RealSlot {
            pointer: AtomicPtr::new(null_mut()),
            library,
            c_name,
        }
    }

    /// The name without its NUL.
    pub fn name(&self) -> &'static str {
        let bytes = &self.c_name[..self.c_name.len() - 1];
        std::str::from_utf8(bytes).unwrap_or("?")
    }

    /// The real function, `None` when the real library lacks it (or cannot be loaded).
    #[inline]
    pub fn get(&self) -> Option<*mut c_void> {
        let known = self.pointer.load(Ordering::Acquire);
        if known == MISSING {
            return None;
        }
        if !known.is_null() {
            return Some(known);
        }
        self.resolve()
    }

    /// The real function if already resolved and present, null otherwise (never resolves):
    /// one load and one compare, for the launch hot path.
    #[inline(always)]
    pub fn resolved(&self) -> *mut c_void {
        let known = self.pointer.load(Ordering::Acquire);
        // Null (not resolved) and MISSING are the two lowest addresses.
        if known.addr() > MISSING.addr() {
            known
        } else {
            null_mut()
        }
    }

    /// Test helper: the slot holds `function`, as if the real library had it.
    #[cfg(test)]
    pub fn plant(&self, function: *mut c_void) {
        self.pointer.store(function, Ordering::Release);
    }

    /// The real pointer if already resolved, without resolving (for the proc-address map).
    pub fn peek(&self) -> Option<*mut c_void> {
        let known = self.pointer.load(Ordering::Acquire);
        (!known.is_null() && known != MISSING).then_some(known)
    }

    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        let handle = self.library.handle();
        if handle.is_null() {
            return None;
        }
        let dlsym = real_dlsym()?;
        // SAFETY: `handle` is a live dlopen handle and `c_name` is NUL-terminated.
        let found = unsafe { dlsym(handle, self.c_name.as_ptr().cast()) };
        let value = if found.is_null() { MISSING } else { found };
        self.pointer.store(value, Ordering::Release);
        (!found.is_null()).then_some(found)
    }

    /// Records the real pointer a caller's own lookup in the real library returned (dlsym
    /// path), saving a lookup later. Never records one of our own wrappers.
    pub fn seed(&self, real: *mut c_void, our_wrapper: *const c_void) {
        if real.is_null() || std::ptr::eq(real, our_wrapper) {
            return;
        }
        let _ =
            self.pointer
                .compare_exchange(null_mut(), real, Ordering::AcqRel, Ordering::Acquire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_dlsym_is_found_by_version_and_answers_like_dlsym() {
        let dlsym = real_dlsym().expect("glibc provides a versioned dlsym");
        // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
        let strlen_ptr = unsafe { dlsym(libc::RTLD_DEFAULT, c"strlen".as_ptr()) };
        assert!(!strlen_ptr.is_null());
        assert_eq!(
            REAL_DLSYM.load(Ordering::Acquire),
            dlsym as *mut c_void,
            "the resolved pointer is cached for the trampoline"
        );
    }

    #[test]
    fn a_slot_for_a_library_that_is_absent_reports_missing_without_crashing() {
        static SLOT: RealSlot = RealSlot::new(Library::Cuda, b"cuInit\0");
        assert_eq!(SLOT.name(), "cuInit");
        // The unit-test process has no libcuda unless the environment provides one; either
        // way `get` must not crash and `peek` agrees with it.
        let got = SLOT.get();
        assert_eq!(got, SLOT.peek());
    }
}
