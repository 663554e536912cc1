//! cuGetProcAddress (v1, CUDA 11.3+) and cuGetProcAddress_v2 (CUDA 12+): the path the CUDA
//! runtime takes for ~420 entry points. We call the REAL one first, so the driver keeps choosing
//! the ABI version (`cuMemAlloc` at >= 3020 is `_v2`) and the stream semantics (`_ptsz`), then
//! swap the returned pointer for our wrapper by pointer identity. Both stay open in a
//! fail-closed process (see `refusal`): the wrappers they hand out refuse instead. Asking for
//! "cuGetProcAddress" itself yields the real v1/v2 pointer, which maps to our matching
//! wrapper. Probes (empty name, version 0) fail in the driver exactly as without the shim.
//!
//! Identity relies on the driver handing out its exported entry points (the fake does, and
//! so do the drivers peers were written against). If a driver ever returned another pointer
//! for a function we hook, calls through it would bypass the slice: with a slice configured
//! that is reported once, at error level, instead of passing silently.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::{cuuint64_t, CUresult};

use crate::ground::real::Library;
use crate::hooks::lifecycle;
use crate::hooks::out::Out;
use crate::hooks::registry::{
    cuda_wrapper_for_real_pointer, hook_by_name, signature as sig, HOOKS,
};

static UNMAPPED_REPORTED: AtomicBool = AtomicBool::new(false);

/// Does `requested` (a cuGetProcAddress name: no `_v2`/`_ptsz` suffix) name a function we
/// hook in some ABI or stream variant? `cuMemAlloc` -> `cuMemAlloc_v2`; `cuLaunchKernel` ->
/// itself and `_ptsz`; `cuMemAllocHost` is not `cuMemAlloc`'s family.
fn is_hooked_family<'a>(requested: &str, hooked: impl IntoIterator<Item = &'a str>) -> bool {
    !requested.is_empty()
        && hooked.into_iter().any(|name| {
            name == requested
                || name
                    .strip_prefix(requested)
                    .is_some_and(|rest| rest.starts_with('_'))
        })
}

/// Swaps the real function the driver wrote to `pfn` for our wrapper of it (by identity).
///
/// # Safety
/// `pfn` is NULL or valid for reads and writes; `symbol` is NULL or a NUL-terminated string
/// (the caller's cuGetProcAddress arguments).
unsafe fn redirect(result: CUresult, symbol: *const c_char, pfn: *mut *mut c_void) {
    // SAFETY: this function's contract.
    let out = unsafe { Out::new(pfn) };
    let Some(real) = out
        .read()
        .filter(|p| result == CUDA_SUCCESS && !p.is_null())
    else {
        return;
    };
    let mut answer = cuda_wrapper_for_real_pointer(real);
    if answer == real && !symbol.is_null() {
        // SAFETY: non-null, NUL-terminated by this function's contract.
        let symbol = unsafe { CStr::from_ptr(symbol) };
        if must_hand_out_our_cu_init(symbol) {
            if let Some(cu_init) = hook_by_name("cuInit") {
                answer = cu_init.wrapper().cast_mut();
            }
        }
        if lifecycle::slice_config().is_some() {
            report_unmapped(symbol, real);
        }
    }
    out.write(answer);
}

/// Whether a `cuGetProcAddress` answer for `symbol` that the identity map left unchanged
/// must become our refusing `cuInit`: in a fail-closed process the lookup of `cuInit` always
/// hands out our wrapper, even from a driver whose answer is not its exported symbol (which
/// the map passes through), because that one function would let the process use the GPU
/// unlimited (see `refusal`).
fn must_hand_out_our_cu_init(symbol: &CStr) -> bool {
    symbol.to_bytes() == b"cuInit" && lifecycle::admit(Library::Cuda).is_err()
}

#[cold]
fn report_unmapped(symbol: &CStr, pointer: *mut c_void) {
    // A driver whose own references to its exports are not bound at link time hands out
    // whatever the dynamic linker resolved them to: our export, i.e. already the wrapper.
    if HOOKS.iter().any(|h| std::ptr::eq(h.wrapper(), pointer)) {
        return;
    }
    let name = symbol.to_string_lossy();
    if is_hooked_family(&name, HOOKS.iter().map(|h| h.name))
        && !UNMAPPED_REPORTED.swap(true, Ordering::Relaxed)
    {
        crate::log_error!(
            "cuGetProcAddress(\"{name}\") returned a driver function that is not its exported \
             symbol: calls through it are NOT limited by the slice (please report this driver)"
        );
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn get_proc_address(
    real: sig::cuGetProcAddress,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract), which `redirect`
    // asks for too.
    unsafe {
        let result = real(symbol, pfn, cuda_version, flags);
        redirect(result, symbol, pfn);
        result
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn get_proc_address_v2(
    real: sig::cuGetProcAddress_v2,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut c_int,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract), which `redirect`
    // asks for too.
    unsafe {
        let result = real(symbol, pfn, cuda_version, flags, symbol_status);
        redirect(result, symbol, pfn);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::is_hooked_family;

    const HOOKED: [&str; 4] = [
        "cuMemAlloc_v2",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuGetProcAddress_v2",
    ];

    #[test]
    fn families_match_abi_and_stream_variants_only() {
        assert!(is_hooked_family("cuMemAlloc", HOOKED));
        assert!(is_hooked_family("cuLaunchKernel", HOOKED));
        assert!(is_hooked_family("cuGetProcAddress", HOOKED));
        assert!(
            !is_hooked_family("cuMemAllocHost", HOOKED),
            "a longer name is another family"
        );
        assert!(!is_hooked_family("cuLaunchKernelEx", HOOKED));
        assert!(!is_hooked_family("cuDriverGetVersion", HOOKED));
        assert!(
            !is_hooked_family("", HOOKED),
            "the runtime's empty-name probe"
        );
    }
}
