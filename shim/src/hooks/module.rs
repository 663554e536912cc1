//! Module, library and kernel handlers: the driver places a module's code and static data in
//! device memory, and a kernel's local memory at its first launch, without an allocation call.
//! Each handler reads what the memory policy needs to price that before the call (the image
//! the caller hands over, the kernel's local size once its handle exists) and makes one call
//! into `memory::driver_sized::placed`, which reserves or refuses (see its module doc).
//!
//! A load the driver refuses because the image has no code for the card (an application built
//! without the card's architecture) gets one line per process naming the card's compute
//! capability, so that the tenant knows which build to pin.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use gpuslice_abi::cuda::func_attr::LOCAL_SIZE_BYTES;
use gpuslice_abi::cuda::result::{
    CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::*;

use crate::ground::devices::current_cuda_device;
use crate::ground::driver::real;
use crate::hooks::out::Out;
use crate::hooks::registry::signature as sig;
use crate::memory::driver_sized::image::{self, Costs, MAX_IMAGE};
use crate::memory::driver_sized::placed;

/// What the image the caller hands over at `ptr` costs (`None`: not readable as one).
///
/// # Safety
/// `ptr` is NULL or what the CUDA API asks of an image argument: a cubin, a fatbin (or, for
/// `cuModuleLoadFatBinary`, its wrapper) or NUL-terminated PTX, readable as its format says.
unsafe fn costs_at(ptr: *const c_void) -> Option<Costs> {
    // SAFETY: this function's contract.
    let ptr = unsafe { image::unwrap_fatbin(ptr.cast()) };
    // SAFETY: as above.
    let len = unsafe { image::image_len(ptr) }?;
    // SAFETY: `image_len` gave the length its own format states, readable per the contract.
    image::costs(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// What the image in the file `name` costs (`None`: unreadable, larger than an image can be).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string (the CUDA API's contract).
unsafe fn costs_of_file(name: *const c_char) -> Option<Costs> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let path = unsafe { CStr::from_ptr(name) }.to_str().ok()?;
    let file = std::fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() > MAX_IMAGE as u64 {
        return None;
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes).ok()?;
    image::costs(&bytes)
}

/// The handle a successful load wrote to `out` (0 otherwise).
fn made<T>(result: CUresult, out: Out<*mut T>) -> (CUresult, u64) {
    if result == CUDA_ERROR_NO_BINARY_FOR_GPU || result == CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
        say_no_code_for_the_card(result);
    }
    let handle = if result == CUDA_SUCCESS {
        out.read().map_or(0, |h| h as u64)
    } else {
        0
    };
    (result, handle)
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
    // SAFETY: the caller's arguments (the handler contract).
    let (costs, out) = unsafe { (costs_of_file(fname), Out::new(module)) };
    // SAFETY: the caller's arguments, unchanged.
    placed::load_module(costs, || made(unsafe { real(module, fname) }, out))
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_load_data(
    real: sig::cuModuleLoadData,
    module: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    // SAFETY: the caller's arguments (the handler contract).
    let (costs, out) = unsafe { (costs_at(image), Out::new(module)) };
    // SAFETY: the caller's arguments, unchanged.
    placed::load_module(costs, || made(unsafe { real(module, image) }, out))
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
    // SAFETY: the caller's arguments (the handler contract).
    let (costs, out) = unsafe { (costs_at(image), Out::new(module)) };
    placed::load_module(costs, || {
        // SAFETY: the caller's arguments, unchanged.
        let result = unsafe { real(module, image, num_options, options, option_values) };
        made(result, out)
    })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_load_fat_binary(
    real: sig::cuModuleLoadFatBinary,
    module: *mut CUmodule,
    fat_cubin: *const c_void,
) -> CUresult {
    // SAFETY: the caller's arguments (the handler contract).
    let (costs, out) = unsafe { (costs_at(fat_cubin), Out::new(module)) };
    // SAFETY: the caller's arguments, unchanged.
    placed::load_module(costs, || made(unsafe { real(module, fat_cubin) }, out))
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_unload(real: sig::cuModuleUnload, module: CUmodule) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(module) };
    if result == CUDA_SUCCESS {
        placed::module_unloaded(module as u64);
    }
    result
}

/// A kernel's local bytes per thread, as `query` (a `cuFuncGetAttribute` or
/// `cuKernelGetAttribute` call writing one int) answers; 0 when it does not.
fn local_size(query: impl FnOnce(&mut c_int) -> CUresult) -> u64 {
    let mut value: c_int = 0;
    if query(&mut value) == CUDA_SUCCESS {
        value.max(0) as u64
    } else {
        0
    }
}

/// The local bytes per thread of function `f`.
fn function_local_size(f: CUfunction) -> u64 {
    let Some(get) = real::cuFuncGetAttribute() else {
        return 0;
    };
    // SAFETY: valid out-pointer; the driver validates the handle.
    local_size(|value| unsafe { get(value, LOCAL_SIZE_BYTES, f) })
}

/// A lookup succeeded with the function (or kernel) its caller now holds in `out`; when the
/// local memory it needs does not fit, the handle is taken back (NULL) and the answer is
/// OUT_OF_MEMORY.
fn priced_lookup<T>(
    result: CUresult,
    out: Out<*mut T>,
    priced: impl FnOnce(u64) -> Result<(), CUresult>,
) -> CUresult {
    if result != CUDA_SUCCESS {
        return result;
    }
    let Some(handle) = out.read() else {
        return result;
    };
    match priced(handle as u64) {
        Ok(()) => result,
        Err(code) => {
            out.write(std::ptr::null_mut());
            code
        }
    }
}

/// The kernel's local memory is priced in its module's context (lazy loading places the
/// kernel here; its first launch grows local memory).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn module_get_function(
    real: sig::cuModuleGetFunction,
    func: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(func, module, name) };
    // SAFETY: the caller's out-parameter.
    let out = unsafe { Out::new(func) };
    priced_lookup(result, out, |f| {
        let local = function_local_size(f as CUfunction);
        placed::kernel_found(placed::module_context(module as u64), local)
    })
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
    // SAFETY: the caller's arguments (the handler contract).
    let (costs, out) = unsafe { (costs_at(code), Out::new(library)) };
    placed::load_library(costs, || {
        // SAFETY: the caller's arguments, unchanged.
        let result = unsafe {
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
        };
        made(result, out)
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
    // SAFETY: the caller's arguments (the handler contract).
    let (costs, out) = unsafe { (costs_of_file(file_name), Out::new(library)) };
    placed::load_library(costs, || {
        // SAFETY: the caller's arguments, unchanged.
        let result = unsafe {
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
        };
        made(result, out)
    })
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn library_unload(real: sig::cuLibraryUnload, library: CUlibrary) -> CUresult {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(library) };
    if result == CUDA_SUCCESS {
        placed::library_unloaded(library as u64);
    }
    result
}

/// A `CUkernel` may be launched as it is in the current context: the library and the
/// kernel's local memory are priced there.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn library_get_kernel(
    real: sig::cuLibraryGetKernel,
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    if let Err(code) = placed::library_used(library as u64, 0) {
        return code;
    }
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(kernel, library, name) };
    // SAFETY: the caller's out-parameter.
    let out = unsafe { Out::new(kernel) };
    priced_lookup(result, out, |k| {
        placed::kernel_of_library(k, library as u64);
        let (Some(get), Some(device)) = (
            real::cuKernelGetAttribute(),
            crate::ground::devices::current_cuda_device(),
        ) else {
            return Ok(());
        };
        // SAFETY: valid out-pointer; the driver validates the handles.
        let local =
            local_size(|value| unsafe { get(value, LOCAL_SIZE_BYTES, k as CUkernel, device) });
        placed::kernel_found(0, local)
    })
}

/// The kernel's library is placed in the current context (lazy loading), and its function
/// there launched.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn kernel_get_function(
    real: sig::cuKernelGetFunction,
    func: *mut CUfunction,
    kernel: CUkernel,
) -> CUresult {
    if let Err(code) = placed::library_used(0, kernel as u64) {
        return code;
    }
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(func, kernel) };
    // SAFETY: the caller's out-parameter.
    let out = unsafe { Out::new(func) };
    priced_lookup(result, out, |f| {
        placed::kernel_found(0, function_local_size(f as CUfunction))
    })
}

/// A global's lookup places its library in the current context (lazy loading).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn library_get_global(
    real: sig::cuLibraryGetGlobal,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    if let Err(code) = placed::library_used(library as u64, 0) {
        return code;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(dptr, bytes, library, name) }
}

/// The library's module in the current context: placed there (lazy loading).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn library_get_module(
    real: sig::cuLibraryGetModule,
    module: *mut CUmodule,
    library: CUlibrary,
) -> CUresult {
    if let Err(code) = placed::library_used(library as u64, 0) {
        return code;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(module, library) }
}
