//! cuGetProcAddress (v1, CUDA 11.3+) and cuGetProcAddress_v2 (CUDA 12+): the path the CUDA
//! runtime takes for ~420 entry points. We call the REAL one first, so the driver keeps choosing
//! the ABI version (`cuMemAlloc` at >= 3020 is `_v2`) and the stream semantics (`_ptsz`), then
//! swap the returned pointer for our wrapper by pointer identity. Asking for
//! "cuGetProcAddress" itself yields the real v1/v2 pointer, which maps to our matching
//! wrapper. Probes (empty name, version 0) fail in the driver exactly as without the shim.

use std::ffi::{c_char, c_int, c_void};

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_abi::cuda::{cuuint64_t, CUresult};

use crate::registry::{cuda_wrapper_for_real_pointer, signature as sig};

unsafe fn redirect(result: CUresult, pfn: *mut *mut c_void) {
    if result == CUDA_SUCCESS && !pfn.is_null() {
        *pfn = cuda_wrapper_for_real_pointer(*pfn);
    }
}

pub unsafe fn get_proc_address(
    real: sig::cuGetProcAddress,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    let result = real(symbol, pfn, cuda_version, flags);
    redirect(result, pfn);
    result
}

pub unsafe fn get_proc_address_v2(
    real: sig::cuGetProcAddress_v2,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut c_int,
) -> CUresult {
    let result = real(symbol, pfn, cuda_version, flags, symbol_status);
    redirect(result, pfn);
    result
}
