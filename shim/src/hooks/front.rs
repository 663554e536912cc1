//! The core's side of the front/core split. `libgpuslice.so` (the front, `shim/front/lib.rs`)
//! is what every process of a container maps: tiny trampolines named like the registry's
//! hooks. At the first hooked call it dlopens this library (`libgpuslice_core.so`,
//! `RTLD_LOCAL`) and calls [`gpuslice_core_attach`], which
//! * checks the front was built from the same registry (same ABI version, same names in the
//!   same order) and refuses otherwise, so the front fails closed;
//! * records the front's exports: from then on [`Hook::wrapper`] is the FRONT's export, the
//!   only pointer of a hooked name the application may see (dlsym and cuGetProcAddress
//!   answers, the identity checks, the unmapped-pointer report), exactly as when this library
//!   was the one preloaded;
//! * takes the real `dlsym` and the front's `RTLD_NEXT` lookup: glibc answers `RTLD_NEXT`
//!   from a library dlopened `RTLD_LOCAL` in its loader's scope, not "the global scope after
//!   our export";
//! * hands back this library's handler for every hook and its dlsym decision function.
//!
//! Nothing here runs unless a front attaches: preloaded by itself, this library works as
//! before (its own exports are the wrappers).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::hooks::registry::{Hook, HOOKS, HOOK_COUNT};

/// Version of [`Attach`]; the front sends the one it was built with.
pub const ATTACH_ABI: u32 = 2;

/// What the front passes (`shim/front/lib.rs` has the same layout).
#[repr(C)]
pub struct Attach {
    pub abi: u32,
    pub count: u32,
    /// NUL-terminated names, registry order.
    pub names: *const *const c_char,
    /// The front's export of each name, same order.
    pub exports: *const *const c_void,
    pub real_dlsym: *mut c_void,
    /// `dlsym(RTLD_NEXT, name)` asked from the front.
    pub next: NextFn,
    /// The offset from the thread pointer of the front's per-thread hook flag (static TLS).
    pub hook_flag_offset: isize,
    /// Out: this library's handler for each name.
    pub handlers: *mut *const c_void,
    /// Out: [`crate::hooks::dlsym::decide_dlsym_answer`].
    pub decide_dlsym: *const c_void,
}

pub type NextFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;

/// The front's export table (HOOK_COUNT entries, a static of the front, which is never
/// unloaded); null while no front is attached.
static FRONT_EXPORTS: AtomicPtr<*const c_void> = AtomicPtr::new(std::ptr::null_mut());
static FRONT_NEXT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The front's export of hook `id`, when a front is attached.
#[inline]
pub fn front_export(id: usize) -> Option<*const c_void> {
    let table = FRONT_EXPORTS.load(Ordering::Acquire);
    // SAFETY: a non-null table has HOOK_COUNT entries (checked at attach) and lives as long as
    // the process (the front is preloaded and never unloaded); `id` < HOOK_COUNT.
    (!table.is_null() && id < HOOK_COUNT).then(|| unsafe { *table.add(id) })
}

/// The front's `RTLD_NEXT` lookup, when a front is attached.
pub fn front_next() -> Option<NextFn> {
    let next = FRONT_NEXT.load(Ordering::Acquire);
    // SAFETY: only ever set from `Attach::next`, a NextFn.
    (!next.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, NextFn>(next) })
}

/// Whether the front's names are exactly the registry's, in order.
fn same_registry(names: &[*const c_char], hooks: &[Hook]) -> bool {
    names.len() == hooks.len()
        && names.iter().zip(hooks).all(|(&name, hook)| {
            // SAFETY: the front passes NUL-terminated static names (checked non-null first).
            !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes() == hook.name.as_bytes()
        })
}

/// Attaches a front (see the module doc). 0 on success; -1 when the front was built from
/// another registry or ABI (nothing is changed then). Idempotent: two threads of the front
/// may both attach.
///
/// # Safety
/// `request` points to a valid [`Attach`] whose arrays have `count` entries.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn gpuslice_core_attach(request: *mut Attach) -> c_int {
    std::panic::catch_unwind(|| {
        // SAFETY: the caller's contract.
        let request = unsafe { &mut *request };
        if request.abi != ATTACH_ABI
            || request.count as usize != HOOK_COUNT
            || request.names.is_null()
            || request.exports.is_null()
            || request.handlers.is_null()
        {
            return -1;
        }
        // SAFETY: `count` (== HOOK_COUNT) entries, per the caller's contract.
        let names = unsafe { std::slice::from_raw_parts(request.names, HOOK_COUNT) };
        if !same_registry(names, &HOOKS) {
            return -1;
        }
        if !request.real_dlsym.is_null() {
            crate::ground::real::REAL_DLSYM.store(request.real_dlsym, Ordering::Release);
        }
        FRONT_NEXT.store(request.next as *mut c_void, Ordering::Release);
        crate::hooks::nesting::use_front_flag(request.hook_flag_offset);
        FRONT_EXPORTS.store(request.exports.cast_mut(), Ordering::Release);
        for hook in HOOKS.iter() {
            // SAFETY: `handlers` has HOOK_COUNT entries; hook.id < HOOK_COUNT.
            unsafe { *request.handlers.add(hook.id) = hook.own_export };
        }
        request.decide_dlsym = crate::hooks::dlsym::decide_dlsym_answer as *const c_void;
        0
    })
    .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_front_from_another_registry_is_refused() {
        let names: Vec<_> = HOOKS
            .iter()
            .map(|h| std::ffi::CString::new(h.name).unwrap())
            .collect();
        let pointers: Vec<_> = names.iter().map(|n| n.as_ptr()).collect();
        assert!(same_registry(&pointers, &HOOKS));
        let mut swapped = pointers.clone();
        swapped.swap(0, 1);
        assert!(!same_registry(&swapped, &HOOKS), "order matters");
        assert!(!same_registry(&pointers[1..], &HOOKS), "count matters");
        let mut renamed = pointers.clone();
        renamed[3] = c"cuSomethingElse".as_ptr();
        assert!(!same_registry(&renamed, &HOOKS));
    }
}
