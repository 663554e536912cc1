//! The caller's out-parameters, as the handlers answer through them. [`Out::write`] is the one
//! place a handler writes through a pointer the caller gave (null-checked there), and
//! [`answer_list`] the one place a list is copied out under NVML's count protocol; the policy
//! below takes and returns values only.

use std::ffi::c_uint;

use gpuslice_abi::nvml::nvmlReturn_t;
use gpuslice_abi::nvml::ret::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_SUCCESS,
};

use gpuslice_policy::list_fits;

/// A caller's out-pointer of a `T`, which may be NULL.
pub(crate) struct Out<T>(*mut T);

impl<T> Clone for Out<T> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Out<T> {}

impl<T> Out<T> {
    /// # Safety
    /// `pointer` is NULL or valid for reads and writes of a `T` for as long as the handler
    /// runs: what the C API asks of the caller for an out-parameter.
    #[inline]
    pub(crate) unsafe fn new(pointer: *mut T) -> Self {
        Out(pointer)
    }

    /// Writes `value` to the caller; false (nothing written) when the caller passed NULL.
    #[inline]
    pub(crate) fn write(self, value: T) -> bool {
        if self.0.is_null() {
            return false;
        }
        // SAFETY: non-null, so valid for writes by `Out::new`'s contract.
        unsafe { self.0.write(value) };
        true
    }
}

impl<T: Copy> Out<T> {
    /// What is there now (what the driver just wrote); `None` when the caller passed NULL.
    #[inline]
    pub(crate) fn read(self) -> Option<T> {
        // SAFETY: non-null, so valid for reads by `Out::new`'s contract.
        (!self.0.is_null()).then(|| unsafe { self.0.read() })
    }

    /// [`Out::read`], the default for NULL.
    #[inline]
    pub(crate) fn read_or_default(self) -> T
    where
        T: Default,
    {
        self.read().unwrap_or_default()
    }
}

/// Copies `list` to the caller's `infos` (room for `*count` entries; NULL to ask the size)
/// under NVML's count protocol: `*count` becomes the entries written, or the entries needed
/// with `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `count` is NULL or valid for reads and writes; `infos` is NULL or valid for writes of
/// `*count` entries (what the C API asks of NVML's caller).
pub(crate) unsafe fn answer_list<S, T>(
    list: Vec<S>,
    count: *mut c_uint,
    infos: *mut T,
    convert: impl Fn(S) -> T,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract for `count`.
    let count = unsafe { Out::new(count) };
    let Some(room) = count.read() else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    match list_fits(list.len(), room, infos.is_null()) {
        Err(needed) => {
            count.write(needed);
            NVML_ERROR_INSUFFICIENT_SIZE
        }
        Ok(n) => {
            for (i, entry) in list.into_iter().enumerate().take(n) {
                // SAFETY: `list_fits` keeps `n` within the caller's `room` (and a NULL
                // `infos` to `n` = 0); the caller vouches for that many entries.
                unsafe { infos.add(i).write(convert(entry)) };
            }
            count.write(n as c_uint);
            NVML_SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_out_pointer_is_never_written_nor_read() {
        // SAFETY: NULL is allowed.
        let out = unsafe { Out::<u64>::new(std::ptr::null_mut()) };
        assert!(!out.write(7));
        assert_eq!(out.read(), None);
        assert_eq!(out.read_or_default(), 0);
        let mut value = 3_u64;
        // SAFETY: a live local.
        let out = unsafe { Out::new(&mut value) };
        assert_eq!(out.read(), Some(3));
        assert!(out.write(9));
        assert_eq!(value, 9);
    }

    #[test]
    fn a_list_is_copied_out_under_the_count_protocol() {
        let mut count: c_uint = 0;
        // SAFETY: valid count, NULL buffer (asks the size).
        let code = unsafe {
            answer_list(
                vec![1_u32, 2, 3],
                &mut count,
                std::ptr::null_mut::<u32>(),
                |x| x,
            )
        };
        assert_eq!((code, count), (NVML_ERROR_INSUFFICIENT_SIZE, 3));
        let mut buf = [0_u32; 4];
        count = 4;
        // SAFETY: room for 4.
        let code =
            unsafe { answer_list(vec![1_u32, 2, 3], &mut count, buf.as_mut_ptr(), |x| x * 2) };
        assert_eq!((code, count, buf), (NVML_SUCCESS, 3, [2, 4, 6, 0]));
        // SAFETY: NULL count is refused before anything is read.
        let code =
            unsafe { answer_list(vec![1_u32], std::ptr::null_mut(), buf.as_mut_ptr(), |x| x) };
        assert_eq!(code, NVML_ERROR_INVALID_ARGUMENT);
    }
}
