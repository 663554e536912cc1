//! Modules, libraries, kernels and functions: loading images, looking up symbols, function attributes, the JIT linker.

use crate::*;

pub(crate) fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) -> R<()> {
    if m.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        m,
        hp(cu().module_load(ImageSource::Memory(image as usize))?),
    )
}

pub(crate) fn cuModuleLoadDataEx(
    m: *mut CUmodule,
    image: *const c_void,
    _n: c_uint,
    _o: *mut c_int,
    _v: *mut *mut c_void,
) -> R<()> {
    if m.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        m,
        hp(cu().module_load(ImageSource::Memory(image as usize))?),
    )
}

pub(crate) fn cuModuleLoad(m: *mut CUmodule, fname: *const c_char) -> R<()> {
    if m.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        m,
        hp(cu().module_load_file(std::path::Path::new(cstr(fname)?))?),
    )
}

pub(crate) fn cuModuleUnload(m: CUmodule) -> R<()> {
    cu().module_unload(h(m))
}

pub(crate) fn cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, name: *const c_char) -> R<()> {
    if f.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(f, hp(cu().module_get_function(h(m), cstr(name)?)?))
}

pub(crate) fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: CUmodule,
    name: *const c_char,
) -> R<()> {
    let (g, s) = cu().module_get_global(h(m), cstr(name)?)?;
    put_opt(dptr, g);
    put_opt(bytes, s as usize);
    Ok(())
}

pub(crate) fn cuLibraryLoadData(
    l: *mut CUlibrary,
    code: *const c_void,
    _jo: *mut c_int,
    _jv: *mut *mut c_void,
    _jn: c_uint,
    _lo: *mut c_int,
    _lv: *mut *mut c_void,
    _ln: c_uint,
) -> R<()> {
    if l.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        l,
        hp(cu().library_load(ImageSource::Memory(code as usize))?),
    )
}

pub(crate) fn cuLibraryUnload(l: CUlibrary) -> R<()> {
    cu().library_unload(h(l))
}

pub(crate) fn cuLibraryGetKernel(k: *mut CUkernel, l: CUlibrary, name: *const c_char) -> R<()> {
    if k.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(k, hp(cu().library_get_kernel(h(l), cstr(name)?)?))
}

pub(crate) fn cuKernelGetFunction(f: *mut CUfunction, k: CUkernel) -> R<()> {
    if f.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(f, hp(cu().kernel_get_function(h(k))?))
}

pub(crate) fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, f: CUfunction) -> R<()> {
    if pi.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pi, cu().func_attribute(attrib, h(f))?)
}

pub(crate) fn cuModuleGetLoadingMode(mode: *mut c_int) -> R<()> {
    if mode.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // CUDA_MODULE_LOADING picks it, lazy by default since 12.2 (CU_MODULE_LAZY_LOADING = 2).
    let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"));
    put(mode, if eager { 1 } else { 2 })
}

pub(crate) fn cuLibraryLoadFromFile(
    l: *mut CUlibrary,
    path: *const c_char,
    _jo: *mut c_int,
    _jv: *mut *mut c_void,
    _jn: c_uint,
    _lo: *mut c_int,
    _lv: *mut *mut c_void,
    _ln: c_uint,
) -> R<()> {
    if l.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        l,
        hp(cu().library_load(ImageSource::File(cstr(path)?.into()))?),
    )
}

pub(crate) fn cuLibraryGetModule(m: *mut CUmodule, l: CUlibrary) -> R<()> {
    if m.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(m, hp(cu().library_get_module(h(l))?))
}

pub(crate) fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    l: CUlibrary,
    name: *const c_char,
) -> R<()> {
    let (g, s) = cu().library_get_global(h(l), cstr(name)?)?;
    put_opt(dptr, g);
    put_opt(bytes, s as usize);
    Ok(())
}

pub(crate) fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    k: CUkernel,
    dev: CUdevice,
) -> R<()> {
    if pi.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().device_spec(dev)?;
    put(pi, cu().func_attribute(attrib, h(k))?)
}

pub(crate) fn cuKernelSetAttribute(
    attrib: c_int,
    value: c_int,
    k: CUkernel,
    dev: CUdevice,
) -> R<()> {
    cu().device_spec(dev)?;
    set_func_attribute(h(k), attrib, value, dev)
}

pub(crate) fn cuKernelSetCacheConfig(k: CUkernel, cfg: c_int, dev: CUdevice) -> R<()> {
    cu().device_spec(dev)?;
    cu().func_attribute(0, h(k))?;
    if !(0..=3).contains(&cfg) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

pub(crate) fn cuKernelGetName(name: *mut *const c_char, k: CUkernel) -> R<()> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(name, c_leaked(&cu().func_name(h(k))?))
}

pub(crate) fn cuFuncSetAttribute(f: CUfunction, attrib: c_int, value: c_int) -> R<()> {
    set_func_attribute(h(f), attrib, value, 0)
}

pub(crate) fn cuFuncSetCacheConfig(f: CUfunction, cfg: c_int) -> R<()> {
    cu().func_attribute(0, h(f))?;
    if !(0..=3).contains(&cfg) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

pub(crate) fn cuFuncSetSharedMemConfig(f: CUfunction, cfg: c_int) -> R<()> {
    cu().func_attribute(0, h(f))?;
    if !(0..=2).contains(&cfg) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

pub(crate) fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> R<()> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(name, c_leaked(&cu().func_name(h(f))?))
}

pub(crate) fn cuLinkCreate(
    _n: c_uint,
    _o: *mut c_int,
    _v: *mut *mut c_void,
    state: *mut *mut c_void,
) -> R<()> {
    if state.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(state, hp(cu().link_create()?))
}

pub(crate) fn cuLinkAddData(
    state: *mut c_void,
    _ty: c_int,
    data: *mut c_void,
    size: usize,
    _name: *const c_char,
    _n: c_uint,
    _o: *mut c_int,
    _v: *mut *mut c_void,
) -> R<()> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().link_add(h(state), &ImageSource::Memory(data as usize))
}

pub(crate) fn cuLinkAddFile(
    state: *mut c_void,
    _ty: c_int,
    path: *const c_char,
    _n: c_uint,
    _o: *mut c_int,
    _v: *mut *mut c_void,
) -> R<()> {
    cu().link_add(h(state), &ImageSource::File(cstr(path)?.into()))
}

pub(crate) fn cuLinkComplete(
    state: *mut c_void,
    cubin: *mut *mut c_void,
    size: *mut usize,
) -> R<()> {
    if cubin.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (p, n) = cu().link_complete(h(state))?;
    put(cubin, hp(p))?;
    put_opt(size, n as usize);
    Ok(())
}

pub(crate) fn cuLinkDestroy(state: *mut c_void) -> R<()> {
    cu().link_destroy(h(state))
}

/// `cuFuncSetAttribute` / `cuKernelSetAttribute`: the settable attributes, checked against
/// the device (dynamic shared memory up to the opt-in maximum, carveout -1..=100).
fn set_func_attribute(f: u64, attrib: c_int, value: c_int, dev: CUdevice) -> R<()> {
    cu().func_attribute(0, f)?;
    match attrib {
        8 => {
            let max = cu().device_attribute(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)?;
            if value < 0 || value > max {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok(())
        }
        9 => {
            if (-1..=100).contains(&value) {
                Ok(())
            } else {
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
        10..=15 => Ok(()), // cluster attributes: accepted, no clusters are modelled
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// A C string that lives as long as the process (names handed out by `cu*GetName`).
fn c_leaked(s: &str) -> *const c_char {
    static CACHE: OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, &'static std::ffi::CStr>>,
    > = OnceLock::new();
    let mut m = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    m.entry(s.to_string())
        .or_insert_with(|| {
            Box::leak(
                CString::new(s.replace('\0', ""))
                    .expect("no NUL")
                    .into_boxed_c_str(),
            )
        })
        .as_ptr()
}
