//! The driver entry points the scenarios use, declared once in [`for_each_entry_point!`], and
//! [`Driver`]: a table of `unsafe extern "C" fn` pointers to them, filled one of three ways:
//! by the dynamic linker (`linked-client` expands the table into a `#[link(name = "cuda")]`
//! extern block), by `dlsym` on a `dlopen` handle, or by `cuGetProcAddress_v2` (the CUDA
//! runtime's path). The scenarios then run unchanged on any of them.

use crate::ffi::*;
use crate::{check, AllocPath, Allocation, ContextMode, Fail, LaunchPath, Res, VmmOp};
use std::ffi::CStr;

/// Calls `$callback!` with every entry point the clients use, one per line:
/// `name = "exported_symbol", min_cuda_version, ptsz|legacy|pinned, (arg: Type, ...);`
/// where `name` is the un-suffixed name cuGetProcAddress takes, `exported_symbol` what a
/// program built against cuda.h 12.x/13.x links (`cuMemAlloc` -> `cuMemAlloc_v2`), `ptsz`
/// marks functions that have a per-thread-default-stream variant, and `pinned` functions
/// whose name took another signature in a later version (`cuCtxCreate`: `_v3` at 11040,
/// `_v4` at 12050), so cuGetProcAddress must be asked for exactly `min_cuda_version` (as a
/// runtime program does with `cudaGetDriverEntryPointByVersion`). Every function returns
/// `CUresult`. Types are spelled as `cuda_clients::ffi` exports them.
///
/// `linked-client` links every `exported_symbol`: a new one must also be added to the stub
/// list in build.rs.
#[macro_export]
macro_rules! for_each_entry_point {
    ($callback:ident) => {
        $callback! {
            cuGetErrorName = "cuGetErrorName", 6000, legacy, (error: CUresult, pstr: *mut *const c_char);
            cuInit = "cuInit", 2000, legacy, (flags: c_uint);
            cuDriverGetVersion = "cuDriverGetVersion", 2020, legacy, (version: *mut c_int);
            cuDeviceGetCount = "cuDeviceGetCount", 2000, legacy, (count: *mut c_int);
            cuDeviceGet = "cuDeviceGet", 2000, legacy, (device: *mut CUdevice, ordinal: c_int);
            cuDeviceGetName = "cuDeviceGetName", 2000, legacy, (name: *mut c_char, len: c_int, dev: CUdevice);
            cuDeviceGetUuid = "cuDeviceGetUuid_v2", 11040, legacy, (uuid: *mut CUuuid, dev: CUdevice);
            cuDeviceTotalMem = "cuDeviceTotalMem_v2", 3020, legacy, (bytes: *mut usize, dev: CUdevice);
            cuDeviceGetAttribute = "cuDeviceGetAttribute", 2000, legacy, (pi: *mut c_int, attrib: c_int, dev: CUdevice);
            cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain", 7000, legacy, (pctx: *mut CUcontext, dev: CUdevice);
            cuDevicePrimaryCtxRelease = "cuDevicePrimaryCtxRelease_v2", 11000, legacy, (dev: CUdevice);
            cuDevicePrimaryCtxReset = "cuDevicePrimaryCtxReset_v2", 11000, legacy, (dev: CUdevice);
            cuCtxCreate = "cuCtxCreate_v2", 3020, pinned, (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
            cuCtxDestroy = "cuCtxDestroy_v2", 4000, legacy, (ctx: CUcontext);
            cuCtxSetCurrent = "cuCtxSetCurrent", 4000, legacy, (ctx: CUcontext);
            cuCtxSynchronize = "cuCtxSynchronize", 2000, legacy, ();
            cuCtxSetLimit = "cuCtxSetLimit", 3010, legacy, (limit: c_int, value: usize);
            cuMemGetInfo = "cuMemGetInfo_v2", 3020, legacy, (free: *mut usize, total: *mut usize);
            cuMemAlloc = "cuMemAlloc_v2", 3020, legacy, (dptr: *mut CUdeviceptr, bytesize: usize);
            cuMemFree = "cuMemFree_v2", 3020, legacy, (dptr: CUdeviceptr);
            cuMemAllocPitch = "cuMemAllocPitch_v2", 3020, legacy, (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element_size: c_uint);
            cuMemAllocManaged = "cuMemAllocManaged", 6000, legacy, (dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
            cuMemAdvise = "cuMemAdvise", 8000, pinned, (ptr: CUdeviceptr, count: usize, advice: c_int, device: CUdevice);
            cuMemPrefetchAsync = "cuMemPrefetchAsync", 8000, pinned, (ptr: CUdeviceptr, count: usize, device: CUdevice, stream: CUstream);
            cuMemAllocAsync = "cuMemAllocAsync", 11020, ptsz, (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream);
            cuMemFreeAsync = "cuMemFreeAsync", 11020, ptsz, (dptr: CUdeviceptr, stream: CUstream);
            cuMemPoolCreate = "cuMemPoolCreate", 11020, legacy, (pool: *mut CUmemoryPool, props: *const CUmemPoolProps);
            cuMemPoolDestroy = "cuMemPoolDestroy", 11020, legacy, (pool: CUmemoryPool);
            cuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync", 11020, ptsz, (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream);
            cuMemGetAllocationGranularity = "cuMemGetAllocationGranularity", 10020, legacy, (granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int);
            cuMemCreate = "cuMemCreate", 10020, legacy, (handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64);
            cuMemRelease = "cuMemRelease", 10020, legacy, (handle: CUmemGenericAllocationHandle);
            cuMemAddressReserve = "cuMemAddressReserve", 10020, legacy, (ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64);
            cuMemAddressFree = "cuMemAddressFree", 10020, legacy, (ptr: CUdeviceptr, size: usize);
            cuMemMap = "cuMemMap", 10020, legacy, (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64);
            cuMemUnmap = "cuMemUnmap", 10020, legacy, (ptr: CUdeviceptr, size: usize);
            cuMemSetAccess = "cuMemSetAccess", 10020, legacy, (ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
            cuArrayCreate = "cuArrayCreate_v2", 3020, legacy, (array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR);
            cuArray3DCreate = "cuArray3DCreate_v2", 3020, legacy, (array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR);
            cuArrayDestroy = "cuArrayDestroy", 2000, legacy, (array: CUarray);
            cuMipmappedArrayCreate = "cuMipmappedArrayCreate", 5000, legacy, (array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint);
            cuMipmappedArrayDestroy = "cuMipmappedArrayDestroy", 5000, legacy, (array: CUmipmappedArray);
            cuStreamCreate = "cuStreamCreate", 2000, legacy, (stream: *mut CUstream, flags: c_uint);
            cuStreamDestroy = "cuStreamDestroy_v2", 4000, legacy, (stream: CUstream);
            cuStreamSynchronize = "cuStreamSynchronize", 2000, ptsz, (stream: CUstream);
            cuModuleLoadData = "cuModuleLoadData", 2000, legacy, (module: *mut CUmodule, image: *const c_void);
            cuModuleGetFunction = "cuModuleGetFunction", 2000, legacy, (func: *mut CUfunction, module: CUmodule, name: *const c_char);
            cuModuleUnload = "cuModuleUnload", 2000, legacy, (module: CUmodule);
            cuModuleGetGlobal = "cuModuleGetGlobal_v2", 3020, legacy, (dptr: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: *const c_char);
            cuLibraryLoadData = "cuLibraryLoadData", 12000, legacy, (library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_void, jit_values: *mut *mut c_void, num_jit: c_uint, options: *mut c_void, values: *mut *mut c_void, num_options: c_uint);
            cuLibraryGetKernel = "cuLibraryGetKernel", 12000, legacy, (kernel: *mut CUkernel, library: CUlibrary, name: *const c_char);
            cuLibraryGetGlobal = "cuLibraryGetGlobal", 12000, legacy, (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char);
            cuLaunchKernel = "cuLaunchKernel", 4000, ptsz, (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchKernelEx = "cuLaunchKernelEx", 11060, ptsz, (config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchCooperativeKernel = "cuLaunchCooperativeKernel", 9000, ptsz, (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void);
            cuLaunchCooperativeKernelMultiDevice = "cuLaunchCooperativeKernelMultiDevice", 9000, legacy, (list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, flags: c_uint);
            cuGraphCreate = "cuGraphCreate", 10000, legacy, (graph: *mut CUgraph, flags: c_uint);
            cuGraphAddKernelNode = "cuGraphAddKernelNode_v2", 12000, legacy, (node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *const KernelNodeParamsV2);
            cuGraphInstantiateWithFlags = "cuGraphInstantiateWithFlags", 11040, legacy, (exec: *mut CUgraphExec, graph: CUgraph, flags: u64);
            cuGraphLaunch = "cuGraphLaunch", 10000, ptsz, (exec: CUgraphExec, stream: CUstream);
            cuGraphExecDestroy = "cuGraphExecDestroy", 10000, legacy, (exec: CUgraphExec);
            cuGraphDestroy = "cuGraphDestroy", 10000, legacy, (graph: CUgraph);
            cuStreamBeginCapture = "cuStreamBeginCapture_v2", 10010, ptsz, (stream: CUstream, mode: c_uint);
            cuStreamEndCapture = "cuStreamEndCapture", 10000, ptsz, (stream: CUstream, graph: *mut CUgraph);
            cuGraphUpload = "cuGraphUpload", 11010, ptsz, (exec: CUgraphExec, stream: CUstream);
        }
    };
}

/// One row of the entry-point table, for loaders and for reports.
#[derive(Debug, Clone, Copy)]
pub struct EntryPoint {
    /// The name cuGetProcAddress takes (no `_v2`).
    pub name: &'static str,
    /// The symbol a program built against cuda.h 12.x/13.x links.
    pub symbol: &'static str,
    /// The CUDA version that introduced the ABI the table's signature describes.
    pub min_version: i32,
    /// Has a `_ptsz` variant that CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects.
    pub per_thread: bool,
    /// Later versions of the name have another signature: look it up at `min_version`.
    pub pinned: bool,
}

impl EntryPoint {
    /// The version to ask cuGetProcAddress for on behalf of a runtime of `cuda_version`:
    /// that version, or `min_version` for a pinned entry point (whose signature the table
    /// describes only at that version).
    pub fn lookup_version(&self, cuda_version: i32) -> i32 {
        if self.pinned {
            self.min_version
        } else {
            cuda_version
        }
    }
}

macro_rules! is_ptsz {
    (ptsz) => {
        true
    };
    (legacy) => {
        false
    };
    (pinned) => {
        false
    };
}

macro_rules! is_pinned {
    (pinned) => {
        true
    };
    ($other:ident) => {
        false
    };
}

macro_rules! define_driver {
    ($($name:ident = $symbol:literal, $version:literal, $pt:ident, ($($arg:ident : $ty:ty),*);)*) => {
        /// Entry points a client obtained; `None` where its lookup path found nothing.
        #[derive(Clone, Copy)]
        pub struct Driver {
            /// Which client built this table ("linked", "dlsym", "procaddr"), for reports.
            pub client: &'static str,
            $(pub $name: Option<unsafe extern "C" fn($($ty),*) -> CUresult>,)*
        }

        /// Every entry point in table order.
        pub const ENTRY_POINTS: &[EntryPoint] = &[
            $(EntryPoint { name: stringify!($name), symbol: $symbol, min_version: $version, per_thread: is_ptsz!($pt), pinned: is_pinned!($pt) },)*
        ];

        impl Driver {
            /// Builds the table from `lookup`, which answers an address or null per entry
            /// point.
            ///
            /// # Safety
            /// Every non-null address `lookup` returns must be a function with the signature
            /// the table declares for that entry point.
            pub unsafe fn from_lookup(
                client: &'static str,
                mut lookup: impl FnMut(&EntryPoint) -> *mut c_void,
            ) -> Driver {
                Driver {
                    client,
                    $($name: {
                        let entry = EntryPoint { name: stringify!($name), symbol: $symbol, min_version: $version, per_thread: is_ptsz!($pt), pinned: is_pinned!($pt) };
                        let address = lookup(&entry);
                        if address.is_null() {
                            None
                        } else {
                            // SAFETY: the caller guarantees the address has this signature.
                            Some(unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> CUresult>(address) })
                        }
                    },)*
                }
            }

            /// Names of the entry points this table lacks.
            pub fn missing(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $(if self.$name.is_none() { missing.push(stringify!($name)); })*
                missing
            }
        }
    };
}

for_each_entry_point!(define_driver);

/// Calls an entry point of a [`Driver`], mapping an absent one to `Fail::Missing`.
macro_rules! call {
    ($driver:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $driver.$name {
            // SAFETY: the table holds a function with exactly this signature (Driver's
            // contract); the arguments are valid for it at every call site (see there).
            Some(f) => check(unsafe { f($($arg),*) }),
            None => Err(Fail::Missing(stringify!($name))),
        }
    };
}

/// `dlopen`s `name` (RTLD_NOW | RTLD_LOCAL, like cudarc, ctypes and the CUDA runtime), or
/// explains why not.
pub fn dlopen(name: &str) -> Result<*mut c_void, String> {
    let c_name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: c_name is a valid NUL-terminated string for the call's duration.
    let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated thread-local message.
        let message = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        return Err(format!("dlopen({name}) failed: {message}"));
    }
    Ok(handle)
}

/// `dlsym(handle, name)`.
///
/// # Safety
/// `handle` must be a live handle from [`dlopen`] (or a pseudo-handle like RTLD_DEFAULT).
pub unsafe fn dlsym(handle: *mut c_void, name: &str) -> *mut c_void {
    let c_name = std::ffi::CString::new(name).expect("symbol names have no NUL");
    // SAFETY: the caller guarantees the handle; c_name is NUL-terminated.
    unsafe { libc::dlsym(handle, c_name.as_ptr()) }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local message.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// The driver function `name` as the real `libcuda.so.1` exports it, found with glibc's own
/// `dlsym` (asked for by version with `dlvsym`, which a preloaded interposer's exported
/// `dlsym` never answers): how a process reaches the driver BEHIND a shim it loaded.
pub fn behind_the_shim(name: &str) -> Result<*mut c_void, String> {
    let c_name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: NUL-terminated literals; RTLD_NOLOAD only looks for what is loaded.
    let libc_handle =
        unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if libc_handle.is_null() {
        return Err(format!("libc.so.6 is not loaded: {}", dl_error()));
    }
    let own = [c"GLIBC_2.34", c"GLIBC_2.2.5"]
        .iter()
        // SAFETY: a live handle and NUL-terminated names.
        .map(|version| unsafe { libc::dlvsym(libc_handle, c"dlsym".as_ptr(), version.as_ptr()) })
        .find(|p| !p.is_null())
        .ok_or_else(|| format!("glibc's dlsym not found: {}", dl_error()))?;
    // SAFETY: glibc's dlsym has this signature.
    let real_dlsym = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(own) };
    let driver = dlopen("libcuda.so.1")?;
    // SAFETY: a live handle and a NUL-terminated name.
    let function = unsafe { real_dlsym(driver, c_name.as_ptr()) };
    if function.is_null() {
        return Err(format!("libcuda.so.1 has no {name}"));
    }
    Ok(function)
}

/// `dlsym` as a function pointer.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// `dlmopen(LM_ID_NEWLM, name)`: the library in a link-map namespace of its own, which neither
/// `LD_PRELOAD` nor `/etc/ld.so.preload` reaches, so no preloaded interposer (the shim) sees
/// its calls: a process BYPASSING the shim. Returns the handle and that namespace's own
/// `dlsym` (found through the base namespace's `dlsym`, which may be the interposer's and
/// could hand out its wrappers, asked for the name `dlsym` on the namespace's libc), so every
/// lookup afterwards stays inside the namespace.
pub fn dlmopen_isolated(name: &str) -> Result<(*mut c_void, DlsymFn), String> {
    let c_name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: c_name is a valid NUL-terminated string for the call's duration.
    let handle = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, c_name.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return Err(format!(
            "dlmopen(LM_ID_NEWLM, {name}) failed: {}",
            dl_error()
        ));
    }
    let mut lmid: libc::Lmid_t = 0;
    // SAFETY: handle is live; RTLD_DI_LMID writes one Lmid_t to the pointer given.
    if unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LMID,
            std::ptr::addr_of_mut!(lmid).cast(),
        )
    } != 0
    {
        return Err(format!("dlinfo(RTLD_DI_LMID): {}", dl_error()));
    }
    // The driver depends on libc, so the namespace has its own libc already.
    // SAFETY: the name is a NUL-terminated literal; RTLD_NOLOAD only looks.
    let libc_handle = unsafe {
        libc::dlmopen(
            lmid,
            c"libc.so.6".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD,
        )
    };
    if libc_handle.is_null() {
        return Err(format!("no libc.so.6 in the new namespace: {}", dl_error()));
    }
    // SAFETY: libc_handle is live; the name is NUL-terminated.
    let own = unsafe { libc::dlsym(libc_handle, c"dlsym".as_ptr()) };
    if own.is_null() {
        return Err(format!(
            "the new namespace's libc has no dlsym: {}",
            dl_error()
        ));
    }
    // SAFETY: glibc's dlsym has this signature.
    Ok((handle, unsafe {
        std::mem::transmute::<*mut c_void, DlsymFn>(own)
    }))
}

/// `cuGetProcAddress_v2` (CUDA 12.0+).
pub type GetProcAddressV2 = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult;

/// One `cuGetProcAddress_v2` answer.
#[derive(Debug, Clone, Copy)]
pub struct ProcAnswer {
    pub result: CUresult,
    pub address: *mut c_void,
    pub status: c_int,
}

/// Asks `cuGetProcAddress_v2` for `symbol`.
pub fn get_proc_address(
    get: GetProcAddressV2,
    symbol: &str,
    cuda_version: c_int,
    flags: u64,
) -> ProcAnswer {
    let c_symbol = std::ffi::CString::new(symbol).expect("symbol names have no NUL");
    let mut address = std::ptr::null_mut();
    let mut status: c_int = -1;
    // SAFETY: `get` is the driver's cuGetProcAddress_v2; every pointer is valid for the call.
    let result = unsafe {
        get(
            c_symbol.as_ptr(),
            &mut address,
            cuda_version,
            flags,
            &mut status,
        )
    };
    ProcAnswer {
        result,
        address,
        status,
    }
}

/// What `Driver` operations need besides the table: the function and module loaded once.
impl Driver {
    pub fn code_name(&self, code: CUresult) -> String {
        let mut text: *const c_char = std::ptr::null();
        if let Some(get_name) = self.cuGetErrorName {
            // SAFETY: cuGetErrorName writes a pointer to a static string into `text`.
            let r = unsafe { get_name(code, &mut text) };
            if r == 0 && !text.is_null() {
                // SAFETY: the driver returned a NUL-terminated static string.
                return unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        match gpuslice_abi::cuda::result::name(code) {
            Some(name) => name.to_string(),
            None => format!("CUresult({code})"),
        }
    }

    pub fn init(&self) -> Res<()> {
        call!(self, cuInit(0))
    }

    pub fn driver_version(&self) -> Res<i32> {
        let mut v = 0;
        call!(self, cuDriverGetVersion(&mut v))?;
        Ok(v)
    }

    pub fn device_count(&self) -> Res<i32> {
        let mut n = 0;
        call!(self, cuDeviceGetCount(&mut n))?;
        Ok(n)
    }

    pub fn device(&self, ordinal: i32) -> Res<CUdevice> {
        let mut d = 0;
        call!(self, cuDeviceGet(&mut d, ordinal))?;
        Ok(d)
    }

    pub fn device_name(&self, dev: CUdevice) -> Res<String> {
        let mut buf = [0 as c_char; 256];
        call!(
            self,
            cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev)
        )?;
        buf[255] = 0;
        // SAFETY: the driver NUL-terminates within the buffer; the last byte stays 0 anyway.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub fn device_uuid(&self, dev: CUdevice) -> Res<[u8; 16]> {
        let mut uuid = CUuuid::default();
        call!(self, cuDeviceGetUuid(&mut uuid, dev))?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    pub fn device_total_mem(&self, dev: CUdevice) -> Res<usize> {
        let mut bytes = 0;
        call!(self, cuDeviceTotalMem(&mut bytes, dev))?;
        Ok(bytes)
    }

    pub fn device_attribute(&self, dev: CUdevice, attribute: i32) -> Res<i32> {
        let mut v = 0;
        call!(self, cuDeviceGetAttribute(&mut v, attribute, dev))?;
        Ok(v)
    }

    /// Makes a context on `dev` current on the calling thread. By default the primary
    /// context (one more retain per call); with `CLIENT_CONTEXT=created` the process's
    /// created context on `dev`: the first call makes it with `cuCtxCreate_v2` (which makes
    /// it current), later calls (other threads) make that one current.
    pub fn context(&self, dev: CUdevice) -> Res<()> {
        if ContextMode::current() == ContextMode::Primary {
            let mut ctx: CUcontext = std::ptr::null_mut();
            call!(self, cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
            return call!(self, cuCtxSetCurrent(ctx));
        }
        let mut created = lock_created();
        if let Some(&(_, ctx)) = created.iter().find(|(d, _)| *d == dev) {
            // A live context: entries leave CREATED when `destroy_context` destroys them.
            return call!(self, cuCtxSetCurrent(ctx as CUcontext));
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        call!(self, cuCtxCreate(&mut ctx, 0, dev))?;
        created.push((dev, ctx as u64));
        Ok(())
    }

    /// Ends what [`Driver::context`] made on `dev`: `cuCtxDestroy_v2` of the created
    /// context, or one `cuDevicePrimaryCtxRelease_v2` (the last release destroys the primary
    /// context). Either way the driver frees everything the context owned.
    pub fn destroy_context(&self, dev: CUdevice) -> Res<()> {
        if ContextMode::current() == ContextMode::Primary {
            return call!(self, cuDevicePrimaryCtxRelease(dev));
        }
        let mut created = lock_created();
        let Some(index) = created.iter().position(|(d, _)| *d == dev) else {
            return Err(Fail::Cu(
                gpuslice_abi::cuda::result::CUDA_ERROR_INVALID_CONTEXT,
            ));
        };
        let (_, ctx) = created[index];
        // A live context this process created, destroyed once (the lock is held throughout).
        call!(self, cuCtxDestroy(ctx as CUcontext))?;
        created.remove(index);
        Ok(())
    }

    /// Takes one more reference to `dev`'s primary context (`cuDevicePrimaryCtxRetain`),
    /// without changing the current context; kept until the process exits or a reset.
    pub fn retain_primary(&self, dev: CUdevice) -> Res<()> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        call!(self, cuDevicePrimaryCtxRetain(&mut ctx, dev))
    }

    /// `cuDevicePrimaryCtxReset_v2`: ends `dev`'s primary context whatever its references
    /// and frees everything it owned; the references stay, the next retain makes it again.
    pub fn reset_primary(&self, dev: CUdevice) -> Res<()> {
        call!(self, cuDevicePrimaryCtxReset(dev))
    }

    /// One `cuDevicePrimaryCtxRelease_v2` of `dev`'s primary context.
    pub fn release_primary(&self, dev: CUdevice) -> Res<()> {
        call!(self, cuDevicePrimaryCtxRelease(dev))
    }

    pub fn mem_get_info(&self) -> Res<(usize, usize)> {
        let (mut free, mut total) = (0, 0);
        call!(self, cuMemGetInfo(&mut free, &mut total))?;
        Ok((free, total))
    }

    pub fn synchronize(&self) -> Res<()> {
        call!(self, cuCtxSynchronize())
    }

    /// `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, bytes)` on the current context.
    pub fn set_heap_limit(&self, bytes: usize) -> Res<()> {
        call!(
            self,
            cuCtxSetLimit(gpuslice_abi::cuda::limit::MALLOC_HEAP_SIZE, bytes)
        )
    }

    /// `cuCtxSetLimit(limit, bytes)` on the current context.
    pub fn set_limit(&self, limit: i32, bytes: usize) -> Res<()> {
        call!(self, cuCtxSetLimit(limit, bytes))
    }

    /// Loads the NUL-terminated PTX `ptx` (kept loaded) and returns its `kernel`.
    pub fn load_ptx(&self, ptx: &str, kernel: &str) -> Res<u64> {
        let module = self.load_image(ptx, false)?;
        self.get_kernel(module, kernel, false)
    }

    /// Loads the NUL-terminated image `image` (kept loaded) as a module (`cuModuleLoadData`)
    /// or, with `library`, a library (`cuLibraryLoadData`, no options); its handle.
    pub fn load_image(&self, image: &str, library: bool) -> Res<u64> {
        let mut handle: *mut c_void = std::ptr::null_mut();
        if library {
            let none = std::ptr::null_mut();
            call!(
                self,
                cuLibraryLoadData(
                    &mut handle,
                    image.as_ptr().cast(),
                    none,
                    std::ptr::null_mut(),
                    0,
                    none,
                    std::ptr::null_mut(),
                    0
                )
            )?;
        } else {
            call!(self, cuModuleLoadData(&mut handle, image.as_ptr().cast()))?;
        }
        Ok(handle as u64)
    }

    /// The function `kernel` of module `handle` (`cuModuleGetFunction`), or with `library`
    /// the `CUkernel` of library `handle` (`cuLibraryGetKernel`), launchable as it is.
    pub fn get_kernel(&self, handle: u64, kernel: &str, library: bool) -> Res<u64> {
        let name = std::ffi::CString::new(kernel).expect("no NUL");
        let mut func: *mut c_void = std::ptr::null_mut();
        if library {
            call!(
                self,
                cuLibraryGetKernel(&mut func, handle as CUlibrary, name.as_ptr())
            )?;
        } else {
            call!(
                self,
                cuModuleGetFunction(&mut func, handle as CUmodule, name.as_ptr())
            )?;
        }
        Ok(func as u64)
    }

    /// `cuMemAdvise(ptr, size, advice, device)` (the pre-12.2 ABI; -1 is the host).
    pub fn advise(&self, ptr: u64, size: usize, advice: i32, device: i32) -> Res<()> {
        call!(self, cuMemAdvise(ptr, size, advice, device))
    }

    /// `cuMemPrefetchAsync(ptr, size, device)` on the default stream, then synchronised.
    pub fn prefetch(&self, ptr: u64, size: usize, device: i32) -> Res<()> {
        call!(
            self,
            cuMemPrefetchAsync(ptr, size, device, std::ptr::null_mut())
        )?;
        call!(self, cuCtxSynchronize())
    }

    /// `count` launches of `func(ns_per_wave, ptr)` (one block of 32 threads each) on the
    /// default stream.
    pub fn launch_reading(
        &self,
        func: u64,
        ptr: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Vec<Res<()>> {
        let (mut ns, mut data) = (ns_per_wave, ptr);
        let mut params: [*mut c_void; 2] =
            [(&mut ns as *mut u64).cast(), (&mut data as *mut u64).cast()];
        let (stream, extra) = (std::ptr::null_mut(), std::ptr::null_mut());
        (0..count)
            .map(|_| {
                call!(
                    self,
                    cuLaunchKernel(
                        func as CUfunction,
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        stream,
                        params.as_mut_ptr(),
                        extra
                    )
                )
            })
            .collect()
    }

    /// The address of global `name` of module (or, with `library`, library) `handle`.
    pub fn get_global(&self, handle: u64, name: &str, library: bool) -> Res<u64> {
        let name = std::ffi::CString::new(name).expect("no NUL");
        let (mut dptr, mut bytes): (CUdeviceptr, usize) = (0, 0);
        if library {
            call!(
                self,
                cuLibraryGetGlobal(&mut dptr, &mut bytes, handle as CUlibrary, name.as_ptr())
            )?;
        } else {
            call!(
                self,
                cuModuleGetGlobal(&mut dptr, &mut bytes, handle as CUmodule, name.as_ptr())
            )?;
        }
        Ok(dptr)
    }

    pub fn alloc(&self, path: AllocPath, size: usize) -> Res<Allocation> {
        let mut a = Allocation {
            path,
            size,
            ptr: 0,
            handle: 0,
            stream: 0,
        };
        let null_stream: CUstream = std::ptr::null_mut();
        match path {
            AllocPath::Alloc => call!(self, cuMemAlloc(&mut a.ptr, size))?,
            AllocPath::Pitch => {
                // Rows of 1 MiB (well below any maximum pitch) so width * height == size.
                let width = size.clamp(1, 1 << 20);
                let height = size.div_ceil(width).max(1);
                let mut pitch = 0;
                call!(
                    self,
                    cuMemAllocPitch(&mut a.ptr, &mut pitch, width, height, 4)
                )?
            }
            AllocPath::Managed => call!(self, cuMemAllocManaged(&mut a.ptr, size, 1))?,
            AllocPath::Async => {
                call!(self, cuMemAllocAsync(&mut a.ptr, size, null_stream))?;
                call!(self, cuStreamSynchronize(null_stream))?
            }
            AllocPath::Pool => {
                let props = pool_props(crate::pool_device());
                let mut pool: CUmemoryPool = std::ptr::null_mut();
                call!(self, cuMemPoolCreate(&mut pool, &props))?;
                a.handle = pool as u64;
                let r = call!(
                    self,
                    cuMemAllocFromPoolAsync(&mut a.ptr, size, pool, null_stream)
                )
                .and_then(|_| call!(self, cuStreamSynchronize(null_stream)));
                if let Err(e) = r {
                    let _ = call!(self, cuMemPoolDestroy(pool));
                    return Err(e);
                }
            }
            AllocPath::Vmm => {
                let prop = vmm_prop(0);
                let mut granularity = 0;
                call!(
                    self,
                    cuMemGetAllocationGranularity(
                        &mut granularity,
                        &prop,
                        gpuslice_abi::cuda::vmm::CU_MEM_ALLOC_GRANULARITY_MINIMUM
                    )
                )?;
                let granularity = granularity.max(1);
                let rounded = size.div_ceil(granularity) * granularity;
                a.size = rounded;
                call!(self, cuMemCreate(&mut a.handle, rounded, &prop, 0))?;
                let mapped = call!(self, cuMemAddressReserve(&mut a.ptr, rounded, 0, 0, 0))
                    .and_then(|_| {
                        call!(self, cuMemMap(a.ptr, rounded, 0, a.handle, 0)).inspect_err(|_| {
                            let _ = call!(self, cuMemAddressFree(a.ptr, rounded));
                        })
                    });
                if let Err(e) = mapped {
                    let _ = call!(self, cuMemRelease(a.handle));
                    return Err(e);
                }
                let access = CUmemAccessDesc {
                    location: prop.location,
                    flags: gpuslice_abi::cuda::vmm::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                };
                call!(self, cuMemSetAccess(a.ptr, rounded, &access, 1))?;
            }
            AllocPath::Array => {
                let (w, h) = array_dims(size);
                let desc = CUDA_ARRAY_DESCRIPTOR {
                    Width: w,
                    Height: h,
                    Format: crate::ARRAY_FORMAT_U8,
                    NumChannels: 1,
                };
                let mut arr: CUarray = std::ptr::null_mut();
                call!(self, cuArrayCreate(&mut arr, &desc))?;
                a.ptr = arr as u64;
            }
            AllocPath::Array3d => {
                let desc = array3d_desc(size);
                let mut arr: CUarray = std::ptr::null_mut();
                call!(self, cuArray3DCreate(&mut arr, &desc))?;
                a.ptr = arr as u64;
            }
            AllocPath::Mipmap => {
                let (w, h) = array_dims(size);
                let desc = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: w,
                    Height: h,
                    Depth: 0,
                    Format: crate::ARRAY_FORMAT_U8,
                    NumChannels: 1,
                    Flags: 0,
                };
                let mut arr: CUmipmappedArray = std::ptr::null_mut();
                call!(self, cuMipmappedArrayCreate(&mut arr, &desc, 1))?;
                a.ptr = arr as u64;
            }
        }
        Ok(a)
    }

    /// One VMM call (see [`VmmOp`]).
    pub fn vmm(&self, op: VmmOp) -> Res<u64> {
        let prop = vmm_prop(0);
        let mut out = 0u64;
        // Every pointer argument is a local that outlives the call.
        match op {
            VmmOp::Reserve { size } => call!(self, cuMemAddressReserve(&mut out, size, 0, 0, 0))?,
            VmmOp::AddressFree { ptr, size } => call!(self, cuMemAddressFree(ptr, size))?,
            VmmOp::Create { size } => call!(self, cuMemCreate(&mut out, size, &prop, 0))?,
            VmmOp::Map { ptr, size, handle } => call!(self, cuMemMap(ptr, size, 0, handle, 0))?,
            VmmOp::SetAccess { ptr, size } => {
                let access = CUmemAccessDesc {
                    location: prop.location,
                    flags: gpuslice_abi::cuda::vmm::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                };
                call!(self, cuMemSetAccess(ptr, size, &access, 1))?
            }
            VmmOp::Unmap { ptr, size } => call!(self, cuMemUnmap(ptr, size))?,
            VmmOp::Release { handle } => call!(self, cuMemRelease(handle))?,
        }
        Ok(out)
    }

    pub fn free(&self, a: &Allocation) -> Res<()> {
        let null_stream: CUstream = std::ptr::null_mut();
        match a.path {
            AllocPath::Alloc | AllocPath::Pitch | AllocPath::Managed => {
                call!(self, cuMemFree(a.ptr))
            }
            AllocPath::Async => {
                call!(self, cuMemFreeAsync(a.ptr, null_stream))?;
                call!(self, cuStreamSynchronize(null_stream))
            }
            AllocPath::Pool => {
                call!(self, cuMemFreeAsync(a.ptr, null_stream))?;
                call!(self, cuStreamSynchronize(null_stream))?;
                call!(self, cuMemPoolDestroy(a.handle as CUmemoryPool))
            }
            AllocPath::Vmm => {
                call!(self, cuMemUnmap(a.ptr, a.size))?;
                call!(self, cuMemAddressFree(a.ptr, a.size))?;
                call!(self, cuMemRelease(a.handle))
            }
            AllocPath::Array | AllocPath::Array3d => {
                call!(self, cuArrayDestroy(a.ptr as CUarray))
            }
            AllocPath::Mipmap => call!(self, cuMipmappedArrayDestroy(a.ptr as CUmipmappedArray)),
        }
    }

    pub fn pool_destroy(&self, pool: u64) -> Res<()> {
        call!(self, cuMemPoolDestroy(pool as CUmemoryPool))
    }

    pub fn free_async(&self, ptr: u64) -> Res<()> {
        let null_stream: CUstream = std::ptr::null_mut();
        call!(self, cuMemFreeAsync(ptr, null_stream))?;
        call!(self, cuStreamSynchronize(null_stream))
    }

    pub fn load_kernel(&self) -> Res<u64> {
        let mut module: CUmodule = std::ptr::null_mut();
        call!(
            self,
            cuModuleLoadData(&mut module, crate::SPIN_PTX.as_ptr().cast())
        )?;
        let name = std::ffi::CString::new(crate::SPIN_KERNEL).expect("no NUL");
        let mut func: CUfunction = std::ptr::null_mut();
        call!(self, cuModuleGetFunction(&mut func, module, name.as_ptr()))?;
        Ok(func as u64)
    }

    pub fn stream(&self, created: bool) -> Res<u64> {
        if !created {
            return Ok(0);
        }
        let mut s: CUstream = std::ptr::null_mut();
        call!(self, cuStreamCreate(&mut s, 0))?;
        Ok(s as u64)
    }

    pub fn stream_synchronize(&self, stream: u64) -> Res<()> {
        call!(self, cuStreamSynchronize(stream as CUstream))
    }

    /// Submits `count` launches of `func` on `stream`; one result per launch.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        path: LaunchPath,
        func: u64,
        grid: u32,
        block: u32,
        stream: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Vec<Res<()>> {
        let f = func as CUfunction;
        let s = stream as CUstream;
        let mut ns = ns_per_wave;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        let p = params.as_mut_ptr();
        let null = std::ptr::null_mut();
        match path {
            LaunchPath::Kernel => (0..count)
                .map(|_| {
                    call!(
                        self,
                        cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, p, null)
                    )
                })
                .collect(),
            LaunchPath::Cooperative => (0..count)
                .map(|_| {
                    call!(
                        self,
                        cuLaunchCooperativeKernel(f, grid, 1, 1, block, 1, 1, 0, s, p)
                    )
                })
                .collect(),
            LaunchPath::CooperativeMulti => {
                let mut entry = [CUDA_LAUNCH_PARAMS {
                    function: f,
                    gridDimX: grid,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: block,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    hStream: s,
                    kernelParams: p,
                }];
                (0..count)
                    .map(|_| {
                        call!(
                            self,
                            cuLaunchCooperativeKernelMultiDevice(entry.as_mut_ptr(), 1, 0)
                        )
                    })
                    .collect()
            }
            LaunchPath::Ex => {
                let config = CUlaunchConfig {
                    gridDimX: grid,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: block,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    hStream: s,
                    attrs: std::ptr::null_mut(),
                    numAttrs: 0,
                };
                (0..count)
                    .map(|_| call!(self, cuLaunchKernelEx(&config, f, p, null)))
                    .collect()
            }
            LaunchPath::Capture => self.captured(f, grid, block, s, p, count),
            LaunchPath::Graph => match self.graph(f, grid, block, p) {
                Err(e) => vec![Err(e); count.max(1)],
                Ok((graph, exec)) => {
                    let results = (0..count)
                        .map(|_| call!(self, cuGraphLaunch(exec, s)))
                        .collect();
                    // The exec must outlive the launches it ran: wait before destroying.
                    let _ = call!(self, cuStreamSynchronize(s));
                    let _ = call!(self, cuGraphExecDestroy(exec));
                    let _ = call!(self, cuGraphDestroy(graph));
                    results
                }
            },
        }
    }

    /// Captures `count` launches on `s` (a created stream) into a graph, instantiates it and
    /// launches it once; one result per captured launch, then the graph launch's. The time
    /// between begin and end of the capture goes to [`crate::CAPTURE_NS`].
    fn captured(
        &self,
        f: CUfunction,
        grid: u32,
        block: u32,
        s: CUstream,
        p: *mut *mut c_void,
        count: usize,
    ) -> Vec<Res<()>> {
        let null = std::ptr::null_mut();
        let began = std::time::Instant::now();
        // CU_STREAM_CAPTURE_MODE_GLOBAL
        if let Err(e) = call!(self, cuStreamBeginCapture(s, 0)) {
            return vec![Err(e)];
        }
        let mut results: Vec<Res<()>> = (0..count)
            .map(|_| {
                call!(
                    self,
                    cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, p, null)
                )
            })
            .collect();
        let mut graph: CUgraph = std::ptr::null_mut();
        let ended = call!(self, cuStreamEndCapture(s, &mut graph));
        crate::CAPTURE_NS.fetch_add(
            began.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Err(e) = ended {
            results.push(Err(e));
            return results;
        }
        let mut exec: CUgraphExec = std::ptr::null_mut();
        let launched = call!(self, cuGraphInstantiateWithFlags(&mut exec, graph, 0))
            .and_then(|_| call!(self, cuGraphLaunch(exec, s)));
        results.push(launched);
        // The exec must outlive the launch it ran: wait before destroying.
        let _ = call!(self, cuStreamSynchronize(s));
        if !exec.is_null() {
            let _ = call!(self, cuGraphExecDestroy(exec));
        }
        let _ = call!(self, cuGraphDestroy(graph));
        results
    }

    fn graph(
        &self,
        f: CUfunction,
        grid: u32,
        block: u32,
        params: *mut *mut c_void,
    ) -> Res<(CUgraph, CUgraphExec)> {
        let mut graph: CUgraph = std::ptr::null_mut();
        call!(self, cuGraphCreate(&mut graph, 0))?;
        let node_params = KernelNodeParamsV2 {
            v1: CUDA_KERNEL_NODE_PARAMS {
                func: f,
                gridDimX: grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: params,
                extra: std::ptr::null_mut(),
            },
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        let mut node: CUgraphNode = std::ptr::null_mut();
        call!(
            self,
            cuGraphAddKernelNode(&mut node, graph, std::ptr::null(), 0, &node_params)
        )?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        call!(self, cuGraphInstantiateWithFlags(&mut exec, graph, 0))?;
        Ok((graph, exec))
    }

    /// Captures on `stream`: `allocs` x `cuMemAllocAsync(size)`, one launch of `func`, a
    /// `cuMemFreeAsync` of each;
    /// instantiates the graph, uploads it when asked, launches it once and synchronises.
    /// Returns (graph, exec, launch result); the graph and exec stay alive.
    pub fn graph_with_memory(
        &self,
        size: usize,
        allocs: usize,
        func: u64,
        stream: u64,
        upload: bool,
    ) -> Res<(u64, u64, Res<()>)> {
        let s = stream as CUstream;
        let mut ns: u64 = 1000;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        // CU_STREAM_CAPTURE_MODE_GLOBAL
        call!(self, cuStreamBeginCapture(s, 0))?;
        let mut ptrs: Vec<CUdeviceptr> = Vec::new();
        let captured = (0..allocs)
            .try_for_each(|_| {
                let mut ptr: CUdeviceptr = 0;
                call!(self, cuMemAllocAsync(&mut ptr, size, s))?;
                ptrs.push(ptr);
                Ok(())
            })
            .and_then(|_| {
                call!(
                    self,
                    cuLaunchKernel(
                        func as CUfunction,
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        s,
                        params.as_mut_ptr(),
                        std::ptr::null_mut()
                    )
                )?;
                ptrs.iter()
                    .try_for_each(|&ptr| call!(self, cuMemFreeAsync(ptr, s)))
            });
        let mut graph: CUgraph = std::ptr::null_mut();
        let ended = call!(self, cuStreamEndCapture(s, &mut graph));
        captured?;
        ended?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        call!(self, cuGraphInstantiateWithFlags(&mut exec, graph, 0))?;
        if upload {
            call!(self, cuGraphUpload(exec, s))?;
        }
        let launched = call!(self, cuGraphLaunch(exec, s));
        call!(self, cuStreamSynchronize(s))?;
        Ok((graph as u64, exec as u64, launched))
    }

    /// The `errors` scenario's checks, in order (state matters: before init, no context, ...).
    pub fn errors(&self) -> Vec<(&'static str, Res<()>)> {
        let mut out = Vec::new();
        let mut n: c_int = 0;
        let mut d: CUdevice = 0;
        let mut p: CUdeviceptr = 0;
        let mut bytes: usize = 0;
        let mut text: *const c_char = std::ptr::null();
        out.push((
            "device_count_before_init",
            call!(self, cuDeviceGetCount(&mut n)),
        ));
        out.push((
            "device_get_before_init",
            call!(self, cuDeviceGet(&mut d, 0)),
        ));
        out.push((
            "mem_alloc_before_init",
            call!(self, cuMemAlloc(&mut p, 1 << 20)),
        ));
        out.push(("init", call!(self, cuInit(0))));
        out.push((
            "device_count_null",
            call!(self, cuDeviceGetCount(std::ptr::null_mut())),
        ));
        out.push((
            "device_get_null",
            call!(self, cuDeviceGet(std::ptr::null_mut(), 0)),
        ));
        out.push((
            "device_get_bad_ordinal",
            call!(self, cuDeviceGet(&mut d, 9999)),
        ));
        out.push((
            "device_total_mem_bad_device",
            call!(self, cuDeviceTotalMem(&mut bytes, 9999)),
        ));
        out.push((
            "device_name_null",
            call!(self, cuDeviceGetName(std::ptr::null_mut(), 64, 0)),
        ));
        out.push((
            "get_error_name_unknown_code",
            call!(self, cuGetErrorName(123_456, &mut text)),
        ));
        out.push((
            "mem_alloc_no_context",
            call!(self, cuMemAlloc(&mut p, 1 << 20)),
        ));
        out.push((
            "mem_get_info_no_context",
            call!(self, cuMemGetInfo(&mut bytes, &mut bytes)),
        ));
        out.push(("context", self.device(0).and_then(|dev| self.context(dev))));
        out.push((
            "mem_get_info_null",
            call!(
                self,
                cuMemGetInfo(std::ptr::null_mut(), std::ptr::null_mut())
            ),
        ));
        out.push((
            "mem_alloc_null",
            call!(self, cuMemAlloc(std::ptr::null_mut(), 1 << 20)),
        ));
        out.push(("mem_alloc_zero", call!(self, cuMemAlloc(&mut p, 0))));
        out.push(("mem_free_unknown", call!(self, cuMemFree(0xdead_0000))));
        let twice =
            call!(self, cuMemAlloc(&mut p, 1 << 20)).and_then(|_| call!(self, cuMemFree(p)));
        out.push(("mem_free_first", twice));
        out.push(("mem_free_twice", call!(self, cuMemFree(p))));
        out
    }
}

/// The contexts [`Driver::context`] created (`CLIENT_CONTEXT=created`) as (device, handle):
/// one per device and process, shared by its threads like cudarc-client's.
static CREATED: std::sync::Mutex<Vec<(CUdevice, u64)>> = std::sync::Mutex::new(Vec::new());

fn lock_created() -> std::sync::MutexGuard<'static, Vec<(CUdevice, u64)>> {
    CREATED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Pool properties for a pinned device pool on `device`.
pub fn pool_props(device: c_int) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: gpuslice_abi::cuda::vmm::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: 0,
        location: CUmemLocation {
            type_: gpuslice_abi::cuda::vmm::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: 0,
        usage: 0,
        reserved: [0; 54],
    }
}

/// VMM allocation properties for pinned device memory on `device`.
pub fn vmm_prop(device: c_int) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: gpuslice_abi::cuda::vmm::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: 0,
        location: CUmemLocation {
            type_: gpuslice_abi::cuda::vmm::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: CUmemAllocationProp_allocFlags {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// 2D extent of a one-byte-per-element array of about `size` bytes: rows of up to 16384
/// elements (within every GPU's 2D texture limits).
pub fn array_dims(size: usize) -> (usize, usize) {
    let width = size.clamp(1, 16384);
    (width, size.div_ceil(width).max(1))
}

/// A 3D array of about `size` bytes: 16384 x 64 x depth.
pub fn array3d_desc(size: usize) -> CUDA_ARRAY3D_DESCRIPTOR {
    let plane = 16384 * 64;
    let (width, height, depth) = if size <= plane {
        let (w, h) = array_dims(size);
        (w, h, 1)
    } else {
        (16384, 64, size.div_ceil(plane))
    };
    CUDA_ARRAY3D_DESCRIPTOR {
        Width: width,
        Height: height,
        Depth: depth,
        Format: crate::ARRAY_FORMAT_U8,
        NumChannels: 1,
        Flags: 0,
    }
}

// Keep `Fail` in scope for the `call!` expansions above.
const _: Option<Fail> = None;
