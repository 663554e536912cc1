//! Panic containment at the C boundary (the rustls-ffi `ffi_panic_boundary!` idea): every
//! exported entry point runs its body under `catch_unwind`, so a bug in the shim becomes an
//! error code for the caller (`CUDA_ERROR_UNKNOWN`, `NVML_ERROR_UNKNOWN`, or the real answer on
//! the dlsym path) instead of unwinding into C, which would abort the host process.
//!
//! No panic hook is installed: the hook is process-global and belongs to the host.

/// Runs `$body` and turns a panic into `$on_panic` (evaluated only after a panic).
#[macro_export]
macro_rules! ffi_panic_boundary {
    ($on_panic:expr, $body:block) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| $body)) {
            Ok(value) => value,
            Err(_) => {
                $crate::log_error!("internal error (panic) contained at the FFI boundary");
                $on_panic
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use gpuslice_abi::cuda::result::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};
    use gpuslice_abi::cuda::CUresult;
    use gpuslice_abi::nvml::ret::NVML_ERROR_UNKNOWN;

    fn guarded(should_panic: bool) -> CUresult {
        ffi_panic_boundary!(CUDA_ERROR_UNKNOWN, {
            if should_panic {
                panic!("deliberate");
            }
            CUDA_SUCCESS
        })
    }

    #[test]
    fn a_panic_becomes_the_error_code_and_normal_results_pass() {
        assert_eq!(guarded(false), CUDA_SUCCESS);
        assert_eq!(guarded(true), CUDA_ERROR_UNKNOWN);
        let nvml = ffi_panic_boundary!(NVML_ERROR_UNKNOWN, {
            let v: Vec<u32> = Vec::new();
            v[3]
        });
        assert_eq!(nvml, NVML_ERROR_UNKNOWN);
    }
}
