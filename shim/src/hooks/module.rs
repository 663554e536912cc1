//! Module and library loads: the driver places a module's code and static data in device
//! memory at the load (eager loading) or at the first launch or global lookup (lazy loading,
//! the default), on this process's account without an allocation call. Each handler calls
//! the driver unchanged, then tells the memory policy that the driver may have grown, so that
//! `driver_growth` reconciles with the driver's word within its period.
//!
//! A load the driver refuses because the image has no code for the card (an application built
//! without the card's architecture) gets one line per process naming the card's compute
//! capability, so that the tenant knows which build to pin.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use gpuslice_abi::cuda::result::{
    CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::*;

use crate::ground::devices::current_cuda_device;
use crate::hooks::registry::{real, signature as sig};
use crate::memory::driver_growth;

/// The driver may have placed something for this process (only when the call succeeded).
fn grew_if(result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        driver_growth::driver_may_have_changed();
    }
    if result == CUDA_ERROR_NO_BINARY_FOR_GPU || result == CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
        say_no_code_for_the_card(result);
    }
    result
}

/// `CUDA_ERROR_NO_BINARY_FOR_GPU` (no machine code for the card and no PTX that compiles for
/// it) or `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` (only PTX newer than the driver's compiler):
/// one line per process, with the current context's card and its compute capability.
fn say_no_code_for_the_card(result: CUresult) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let device = current_cuda_device();
    let attribute = |attribute: c_int| -> Option<c_int> {
        let get = real::cuDeviceGetAttribute()?;
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer for the duration of the call.
        (unsafe { get(&mut value, attribute, device?) } == CUDA_SUCCESS).then_some(value)
    };
    let card = match (
        device,
        attribute(attr::COMPUTE_CAPABILITY_MAJOR),
        attribute(attr::COMPUTE_CAPABILITY_MINOR),
    ) {
        (Some(d), Some(major), Some(minor)) => {
            format!("GPU {d} has compute capability {major}.{minor} (sm_{major}{minor})")
        }
        _ => "the GPU's compute capability is unknown".to_string(),
    };
    if result == CUDA_ERROR_NO_BINARY_FOR_GPU {
        crate::log_warn!(
            "{card} and this application has no kernel code for it (CUDA_ERROR_NO_BINARY_FOR_GPU, \
             \"no kernel image is available\"): use a build of the application made for this \
             architecture"
        );
    } else {
        crate::log_warn!(
            "{card} and this application's only code for it is PTX newer than the driver \
             compiles (CUDA_ERROR_UNSUPPORTED_PTX_VERSION): use a build made for this \
             architecture or for this driver's CUDA version"
        );
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_load(
    real: sig::cuModuleLoad,
    module: *mut CUmodule,
    fname: *const c_char,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe { real(module, fname) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_load_data(
    real: sig::cuModuleLoadData,
    module: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe { real(module, image) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_load_data_ex(
    real: sig::cuModuleLoadDataEx,
    module: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_void,
    option_values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe { real(module, image, num_options, options, option_values) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_load_fat_binary(
    real: sig::cuModuleLoadFatBinary,
    module: *mut CUmodule,
    fat_cubin: *const c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe { real(module, fat_cubin) })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn library_load_data(
    real: sig::cuLibraryLoadData,
    library: *mut CUlibrary,
    code: *const c_void,
    jit_options: *mut c_void,
    jit_option_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut c_void,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe {
        real(
            library,
            code,
            jit_options,
            jit_option_values,
            num_jit_options,
            library_options,
            library_option_values,
            num_library_options,
        )
    })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn library_load_from_file(
    real: sig::cuLibraryLoadFromFile,
    library: *mut CUlibrary,
    file_name: *const c_char,
    jit_options: *mut c_void,
    jit_option_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut c_void,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe {
        real(
            library,
            file_name,
            jit_options,
            jit_option_values,
            num_jit_options,
            library_options,
            library_option_values,
            num_library_options,
        )
    })
}

/// Under lazy loading a global's lookup places its module.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_get_global(
    real: sig::cuModuleGetGlobal_v2,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged (the handler contract).
    grew_if(unsafe { real(dptr, bytes, module, name) })
}
