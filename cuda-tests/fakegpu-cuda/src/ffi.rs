//! Helpers for the C boundary: the panic guard and checked reads/writes through the raw
//! pointers that C callers pass. Null out-pointers are CUDA_ERROR_INVALID_VALUE, as in the
//! real driver; non-null ones are trusted to be valid, which is the CUDA API's contract.

use fakegpu::cuda::R;
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::CUresult;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs an API body; never lets a panic cross the C boundary.
#[inline]
pub fn guard(f: impl FnOnce() -> R<()>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Writes through a caller's out-pointer.
#[inline]
pub fn put<T>(p: *mut T, v: T) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null out-pointer from the C caller, who guarantees it is valid and aligned.
    unsafe { p.write(v) };
    Ok(())
}

/// Writes through an optional out-pointer (null: skipped).
#[inline]
pub fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: as in `put`.
        unsafe { p.write(v) };
    }
}

/// Reads a caller's in-pointer.
#[inline]
pub fn get<T: Copy>(p: *const T) -> R<T> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null in-pointer from the C caller, valid per the API contract.
    Ok(unsafe { p.read() })
}

/// Copies `n` elements of a caller's in-array (none when `n` is 0, whatever the pointer).
pub fn get_array<T: Copy>(p: *const T, n: usize) -> R<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null array of `n` elements from the C caller, valid per the API contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

/// A caller's NUL-terminated string.
pub fn cstr<'a>(p: *const c_char) -> R<&'a str> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null C string from the caller, NUL-terminated per the API contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)
}

/// Copies `s` into a caller's buffer of `len` bytes, NUL-terminated, truncating.
pub fn put_str(dst: *mut c_char, len: i32, s: &str) -> R<()> {
    if dst.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller provides `len` writable bytes at `dst`; we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

#[inline]
pub fn h(p: *mut c_void) -> u64 {
    p as u64
}

#[inline]
pub fn hp(v: u64) -> *mut c_void {
    v as *mut c_void
}
