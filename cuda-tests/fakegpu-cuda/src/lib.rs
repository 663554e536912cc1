//! The fake GPU's `libcuda.so.1`: every export is a thin shell over `fakegpu::cuda::Cuda`.
//!
//! All exports are declared once, in the `cuda_api!` table below, one row each: exported
//! name, the base name `cuGetProcAddress` callers ask for, the CUDA version from which that
//! base name maps to this symbol, the variant (default, `_ptds`, `_ptsz`), the C signature,
//! and the function that implements it. The same table yields the `#[no_mangle]` functions
//! (each calls its implementation inside `guard`, so no panic crosses the C boundary) and
//! the proc-address table, whose pointers are the functions themselves, i.e. exactly what
//! `dlsym(handle, "<exported name>")` returns.
//!
//! The implementations are ordinary functions returning `R<()>`, named like their export,
//! one module per family of the driver API under `api/` (`api/memory.rs`, `api/launch.rs`,
//! ...), with the helpers only that family uses beside them. Names the fake has no meaning
//! for are exported by `unsupported` (NOT_SUPPORTED).
//!
//! `cuGetExportTable` serves the CUDA runtime's private tables (see `export_tables`), so
//! NVIDIA's `libcudart` runs on the fake as well as driver API clients and cudarc.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod api;
mod export_tables;
mod ffi;
mod unsupported;

pub use api::memory::CUDA_MEMCPY2D;
use api::*;
use fakegpu::cuda::launch::read_ns_per_wave;
use fakegpu::cuda::module::ImageSource;
use fakegpu::cuda::procaddr::{lookup, Lookup, ProcEntry, Variant};
use fakegpu::cuda::runtime_support::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
use fakegpu::cuda::{Cuda, R};
use ffi::{cstr, get, guard, h, hp, put, put_opt, put_str};
use gpuslice_abi::cuda::proc_address::*;
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::*;
use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void, CString};
use std::sync::OnceLock;

#[inline]
fn cu() -> &'static Cuda {
    Cuda::global()
}

macro_rules! cuda_api {
    ($(
        fn $name:ident [$base:literal, $ver:literal, $variant:ident] ($($arg:ident : $ty:ty),* $(,)?) => $imp:path;
    )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                let r = guard(|| $imp($($arg),*));
                if trace_calls() {
                    eprintln!("fakegpu: {} -> {}", stringify!($name), r);
                }
                r
            }
        )*

        /// Every export, for `cuGetProcAddress`.
        fn exports() -> Vec<ProcEntry> {
            vec![$(ProcEntry {
                name: stringify!($name),
                base: $base,
                min_version: $ver,
                variant: Variant::$variant,
                ptr: $name as *const () as usize,
            }),*]
        }
    };
}

/// Base names that map to an export under another name from some version on.
const ALIASES: &[(&str, i32, &str)] = &[
    // 12.x headers define cuGraphInstantiate as cuGraphInstantiateWithFlags.
    ("cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"),
];

pub fn proc_table() -> &'static [ProcEntry] {
    static TABLE: OnceLock<Vec<ProcEntry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = exports();
        t.extend(unsupported::entries());
        for &(base, ver, target) in ALIASES {
            let e = *t
                .iter()
                .find(|e| e.name == target)
                .expect("alias target exported");
            t.push(ProcEntry {
                base,
                min_version: ver,
                ..e
            });
        }
        t
    })
}

/// A byte count as the pre-3.2 ABI reports it: clamped to 32 bits, never wrapped.
fn clamp_u32(bytes: u64) -> c_uint {
    bytes.min(u64::from(c_uint::MAX)) as c_uint
}

/// `FAKEGPU_TRACE_CALLS=1`: one line per call of an export (name and result).
fn trace_calls() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FAKEGPU_TRACE_CALLS").is_some_and(|v| v != "0"))
}

cuda_api! {
    // ---- init, versions, devices ----
    fn cuInit["cuInit", 2000, Default](flags: c_uint) => device::cuInit;
    fn cuDriverGetVersion["cuDriverGetVersion", 2020, Default](v: *mut c_int) => device::cuDriverGetVersion;
    fn cuDeviceGet["cuDeviceGet", 2000, Default](device: *mut CUdevice, ordinal: c_int) => device::cuDeviceGet;
    fn cuDeviceGetCount["cuDeviceGetCount", 2000, Default](count: *mut c_int) => device::cuDeviceGetCount;
    fn cuDeviceGetName["cuDeviceGetName", 2000, Default](name: *mut c_char, len: c_int, dev: CUdevice) => device::cuDeviceGetName;
    fn cuDeviceGetUuid["cuDeviceGetUuid", 9020, Default](uuid: *mut CUuuid, dev: CUdevice) => device::cuDeviceGetUuid;
    fn cuDeviceGetUuid_v2["cuDeviceGetUuid", 11040, Default](uuid: *mut CUuuid, dev: CUdevice) => device::cuDeviceGetUuid;
    fn cuDeviceGetAttribute["cuDeviceGetAttribute", 2000, Default](pi: *mut c_int, attrib: c_int, dev: CUdevice) => device::cuDeviceGetAttribute;
    fn cuDeviceGetPCIBusId["cuDeviceGetPCIBusId", 4010, Default](id: *mut c_char, len: c_int, dev: CUdevice) => device::cuDeviceGetPCIBusId;
    fn cuDeviceGetByPCIBusId["cuDeviceGetByPCIBusId", 4010, Default](dev: *mut CUdevice, id: *const c_char) => device::cuDeviceGetByPCIBusId;
    fn cuDeviceTotalMem["cuDeviceTotalMem", 2000, Default](bytes: *mut c_uint, dev: CUdevice) => device::cuDeviceTotalMem;
    fn cuDeviceTotalMem_v2["cuDeviceTotalMem", 3020, Default](bytes: *mut usize, dev: CUdevice) => device::cuDeviceTotalMem_v2;
    fn cuDeviceComputeCapability["cuDeviceComputeCapability", 2000, Default](major: *mut c_int, minor: *mut c_int, dev: CUdevice) => device::cuDeviceComputeCapability;

    // ---- contexts ----
    fn cuDevicePrimaryCtxRetain["cuDevicePrimaryCtxRetain", 7000, Default](pctx: *mut CUcontext, dev: CUdevice) => context::cuDevicePrimaryCtxRetain;
    fn cuDevicePrimaryCtxRelease["cuDevicePrimaryCtxRelease", 7000, Default](dev: CUdevice) => context::cuDevicePrimaryCtxRelease;
    fn cuDevicePrimaryCtxRelease_v2["cuDevicePrimaryCtxRelease", 11000, Default](dev: CUdevice) => context::cuDevicePrimaryCtxRelease;
    fn cuDevicePrimaryCtxReset["cuDevicePrimaryCtxReset", 7000, Default](dev: CUdevice) => context::cuDevicePrimaryCtxReset;
    fn cuDevicePrimaryCtxReset_v2["cuDevicePrimaryCtxReset", 11000, Default](dev: CUdevice) => context::cuDevicePrimaryCtxReset;
    fn cuDevicePrimaryCtxGetState["cuDevicePrimaryCtxGetState", 7000, Default](dev: CUdevice, flags: *mut c_uint, active: *mut c_int) => context::cuDevicePrimaryCtxGetState;
    fn cuDevicePrimaryCtxSetFlags["cuDevicePrimaryCtxSetFlags", 7000, Default](dev: CUdevice, flags: c_uint) => context::cuDevicePrimaryCtxSetFlags;
    fn cuDevicePrimaryCtxSetFlags_v2["cuDevicePrimaryCtxSetFlags", 11000, Default](dev: CUdevice, flags: c_uint) => context::cuDevicePrimaryCtxSetFlags;
    fn cuCtxCreate["cuCtxCreate", 2000, Default](pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::cuCtxCreate;
    fn cuCtxCreate_v2["cuCtxCreate", 3020, Default](pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::cuCtxCreate;
    fn cuCtxCreate_v3["cuCtxCreate", 11040, Default](pctx: *mut CUcontext, _params: *mut c_void, _num: c_int, flags: c_uint, dev: CUdevice) => context::cuCtxCreate_v3;
    fn cuCtxCreate_v4["cuCtxCreate", 12050, Default](pctx: *mut CUcontext, _params: *mut c_void, flags: c_uint, dev: CUdevice) => context::cuCtxCreate_v4;
    fn cuCtxDestroy["cuCtxDestroy", 2000, Default](ctx: CUcontext) => context::cuCtxDestroy;
    fn cuCtxDestroy_v2["cuCtxDestroy", 4000, Default](ctx: CUcontext) => context::cuCtxDestroy;
    fn cuCtxPushCurrent_v2["cuCtxPushCurrent", 4000, Default](ctx: CUcontext) => context::cuCtxPushCurrent_v2;
    fn cuCtxPopCurrent_v2["cuCtxPopCurrent", 4000, Default](pctx: *mut CUcontext) => context::cuCtxPopCurrent_v2;
    fn cuCtxSetCurrent["cuCtxSetCurrent", 4000, Default](ctx: CUcontext) => context::cuCtxSetCurrent;
    fn cuCtxGetCurrent["cuCtxGetCurrent", 4000, Default](pctx: *mut CUcontext) => context::cuCtxGetCurrent;
    fn cuCtxGetDevice["cuCtxGetDevice", 2000, Default](device: *mut CUdevice) => context::cuCtxGetDevice;
    fn cuCtxSynchronize["cuCtxSynchronize", 2000, Default]() => context::cuCtxSynchronize;
    fn cuCtxSetLimit["cuCtxSetLimit", 3010, Default](limit: c_int, value: usize) => context::cuCtxSetLimit;
    fn cuCtxGetLimit["cuCtxGetLimit", 3010, Default](value: *mut usize, limit: c_int) => context::cuCtxGetLimit;
    fn cuCtxGetApiVersion["cuCtxGetApiVersion", 3020, Default](ctx: CUcontext, version: *mut c_uint) => context::cuCtxGetApiVersion;

    // ---- memory ----
    fn cuMemAlloc["cuMemAlloc", 2000, Default](dptr: *mut c_uint, bytesize: c_uint) => memory::cuMemAlloc;
    fn cuMemAlloc_v2["cuMemAlloc", 3020, Default](dptr: *mut CUdeviceptr, bytesize: usize) => memory::cuMemAlloc_v2;
    fn cuMemAllocPitch["cuMemAllocPitch", 2000, Default](dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) => memory::cuMemAllocPitch;
    fn cuMemAllocPitch_v2["cuMemAllocPitch", 3020, Default](dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) => memory::cuMemAllocPitch_v2;
    fn cuMemAllocManaged["cuMemAllocManaged", 6000, Default](dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) => memory::cuMemAllocManaged;
    fn cuMemFree["cuMemFree", 2000, Default](dptr: c_uint) => memory::cuMemFree;
    fn cuMemFree_v2["cuMemFree", 3020, Default](dptr: CUdeviceptr) => memory::cuMemFree_v2;
    fn cuMemGetInfo["cuMemGetInfo", 2000, Default](free: *mut c_uint, total: *mut c_uint) => memory::cuMemGetInfo;
    fn cuMemGetInfo_v2["cuMemGetInfo", 3020, Default](free: *mut usize, total: *mut usize) => memory::cuMemGetInfo_v2;
    fn cuMemGetAddressRange_v2["cuMemGetAddressRange", 3020, Default](pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) => memory::cuMemGetAddressRange_v2;
    fn cuMemAllocHost_v2["cuMemAllocHost", 3020, Default](pp: *mut *mut c_void, bytesize: usize) => memory::cuMemAllocHost_v2;
    fn cuMemHostAlloc["cuMemHostAlloc", 2020, Default](pp: *mut *mut c_void, bytesize: usize, flags: c_uint) => memory::cuMemHostAlloc;
    fn cuMemFreeHost["cuMemFreeHost", 2000, Default](p: *mut c_void) => memory::cuMemFreeHost;
    fn cuMemcpyHtoD_v2["cuMemcpyHtoD", 3020, Default](dst: CUdeviceptr, src: *const c_void, n: usize) => memory::cuMemcpyHtoD_v2;
    fn cuMemcpyHtoD_v2_ptds["cuMemcpyHtoD", 7000, Ptds](dst: CUdeviceptr, src: *const c_void, n: usize) => memory::cuMemcpyHtoD_v2;
    fn cuMemcpyDtoH_v2["cuMemcpyDtoH", 3020, Default](dst: *mut c_void, src: CUdeviceptr, n: usize) => memory::cuMemcpyDtoH_v2;
    fn cuMemcpyDtoH_v2_ptds["cuMemcpyDtoH", 7000, Ptds](dst: *mut c_void, src: CUdeviceptr, n: usize) => memory::cuMemcpyDtoH_v2;
    fn cuMemcpyDtoD_v2["cuMemcpyDtoD", 3020, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize) => memory::cuMemcpyDtoD_v2;
    fn cuMemcpyDtoD_v2_ptds["cuMemcpyDtoD", 7000, Ptds](dst: CUdeviceptr, src: CUdeviceptr, n: usize) => memory::cuMemcpyDtoD_v2;
    fn cuMemcpyHtoDAsync_v2["cuMemcpyHtoDAsync", 3020, Default](dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => memory::cuMemcpyHtoDAsync_v2;
    fn cuMemcpyHtoDAsync_v2_ptsz["cuMemcpyHtoDAsync", 7000, Ptsz](dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => memory::cuMemcpyHtoDAsync_v2;
    fn cuMemcpyDtoHAsync_v2["cuMemcpyDtoHAsync", 3020, Default](dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => memory::cuMemcpyDtoHAsync_v2;
    fn cuMemcpyDtoHAsync_v2_ptsz["cuMemcpyDtoHAsync", 7000, Ptsz](dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => memory::cuMemcpyDtoHAsync_v2;
    fn cuMemsetD8_v2["cuMemsetD8", 3020, Default](dst: CUdeviceptr, v: c_uchar, n: usize) => memory::cuMemsetD8_v2;
    fn cuMemsetD8_v2_ptds["cuMemsetD8", 7000, Ptds](dst: CUdeviceptr, v: c_uchar, n: usize) => memory::cuMemsetD8_v2;
    fn cuMemsetD32_v2["cuMemsetD32", 3020, Default](dst: CUdeviceptr, v: c_uint, n: usize) => memory::cuMemsetD32_v2;
    fn cuMemsetD32_v2_ptds["cuMemsetD32", 7000, Ptds](dst: CUdeviceptr, v: c_uint, n: usize) => memory::cuMemsetD32_v2;
    fn cuMemsetD8Async["cuMemsetD8Async", 3020, Default](dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) => memory::cuMemsetD8Async;
    fn cuMemsetD8Async_ptsz["cuMemsetD8Async", 7000, Ptsz](dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) => memory::cuMemsetD8Async;
    fn cuMemsetD32Async["cuMemsetD32Async", 3020, Default](dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => memory::cuMemsetD32Async;
    fn cuMemsetD32Async_ptsz["cuMemsetD32Async", 7000, Ptsz](dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => memory::cuMemsetD32Async;
    // Stream memory operations write at enqueue (the fake's copies and memsets do too).
    fn cuStreamWriteValue32["cuStreamWriteValue32", 8000, Default](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) => memory::cuStreamWriteValue32;
    fn cuStreamWriteValue32_ptsz["cuStreamWriteValue32", 8000, Ptsz](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) => memory::cuStreamWriteValue32;
    fn cuStreamWriteValue32_v2["cuStreamWriteValue32", 11070, Default](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) => memory::cuStreamWriteValue32;
    fn cuStreamWriteValue32_v2_ptsz["cuStreamWriteValue32", 11070, Ptsz](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) => memory::cuStreamWriteValue32;

    // ---- arrays ----
    fn cuArrayCreate["cuArrayCreate", 2000, Default](p: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) => array::cuArrayCreate;
    fn cuArrayCreate_v2["cuArrayCreate", 3020, Default](p: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) => array::cuArrayCreate_v2;
    fn cuArray3DCreate["cuArray3DCreate", 2000, Default](p: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) => array::cuArray3DCreate;
    fn cuArray3DCreate_v2["cuArray3DCreate", 3020, Default](p: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) => array::cuArray3DCreate_v2;
    fn cuArrayDestroy["cuArrayDestroy", 2000, Default](a: CUarray) => array::cuArrayDestroy;
    fn cuMipmappedArrayCreate["cuMipmappedArrayCreate", 5000, Default](p: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) => array::cuMipmappedArrayCreate;
    fn cuMipmappedArrayDestroy["cuMipmappedArrayDestroy", 5000, Default](a: CUmipmappedArray) => array::cuMipmappedArrayDestroy;

    // ---- stream-ordered allocation and pools ----
    fn cuMemAllocAsync["cuMemAllocAsync", 11020, Default](dptr: *mut CUdeviceptr, size: usize, s: CUstream) => pool::cuMemAllocAsync;
    fn cuMemAllocAsync_ptsz["cuMemAllocAsync", 11020, Ptsz](dptr: *mut CUdeviceptr, size: usize, s: CUstream) => pool::cuMemAllocAsync;
    fn cuMemFreeAsync["cuMemFreeAsync", 11020, Default](dptr: CUdeviceptr, s: CUstream) => pool::cuMemFreeAsync;
    fn cuMemFreeAsync_ptsz["cuMemFreeAsync", 11020, Ptsz](dptr: CUdeviceptr, s: CUstream) => pool::cuMemFreeAsync;
    fn cuMemAllocFromPoolAsync["cuMemAllocFromPoolAsync", 11020, Default](dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) => pool::cuMemAllocFromPoolAsync;
    fn cuMemAllocFromPoolAsync_ptsz["cuMemAllocFromPoolAsync", 11020, Ptsz](dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) => pool::cuMemAllocFromPoolAsync;
    fn cuMemPoolCreate["cuMemPoolCreate", 11020, Default](pool: *mut CUmemoryPool, props: *const CUmemPoolProps) => pool::cuMemPoolCreate;
    fn cuMemPoolDestroy["cuMemPoolDestroy", 11020, Default](pool: CUmemoryPool) => pool::cuMemPoolDestroy;
    fn cuDeviceGetDefaultMemPool["cuDeviceGetDefaultMemPool", 11020, Default](pool: *mut CUmemoryPool, dev: CUdevice) => pool::cuDeviceGetDefaultMemPool;
    fn cuDeviceGetMemPool["cuDeviceGetMemPool", 11020, Default](pool: *mut CUmemoryPool, dev: CUdevice) => pool::cuDeviceGetMemPool;
    fn cuDeviceSetMemPool["cuDeviceSetMemPool", 11020, Default](dev: CUdevice, pool: CUmemoryPool) => pool::cuDeviceSetMemPool;
    fn cuMemPoolSetAttribute["cuMemPoolSetAttribute", 11020, Default](pool: CUmemoryPool, attr: c_int, value: *mut c_void) => pool::cuMemPoolSetAttribute;
    fn cuMemPoolGetAttribute["cuMemPoolGetAttribute", 11020, Default](pool: CUmemoryPool, attr: c_int, value: *mut c_void) => pool::cuMemPoolGetAttribute;
    fn cuMemPoolTrimTo["cuMemPoolTrimTo", 11020, Default](pool: CUmemoryPool, keep: usize) => pool::cuMemPoolTrimTo;

    // ---- virtual memory management ----
    fn cuMemCreate["cuMemCreate", 10020, Default](handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) => virtual_memory::cuMemCreate;
    fn cuMemRelease["cuMemRelease", 10020, Default](handle: CUmemGenericAllocationHandle) => virtual_memory::cuMemRelease;
    fn cuMemAddressReserve["cuMemAddressReserve", 10020, Default](ptr: *mut CUdeviceptr, size: usize, align: usize, addr: CUdeviceptr, flags: c_ulonglong) => virtual_memory::cuMemAddressReserve;
    fn cuMemAddressFree["cuMemAddressFree", 10020, Default](ptr: CUdeviceptr, size: usize) => virtual_memory::cuMemAddressFree;
    fn cuMemMap["cuMemMap", 10020, Default](ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) => virtual_memory::cuMemMap;
    fn cuMemUnmap["cuMemUnmap", 10020, Default](ptr: CUdeviceptr, size: usize) => virtual_memory::cuMemUnmap;
    fn cuMemSetAccess["cuMemSetAccess", 10020, Default](ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) => virtual_memory::cuMemSetAccess;
    fn cuMemGetAllocationGranularity["cuMemGetAllocationGranularity", 10020, Default](g: *mut usize, prop: *const CUmemAllocationProp, option: c_int) => virtual_memory::cuMemGetAllocationGranularity;
    fn cuMemGetAllocationPropertiesFromHandle["cuMemGetAllocationPropertiesFromHandle", 10020, Default](prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) => virtual_memory::cuMemGetAllocationPropertiesFromHandle;
    fn cuMemRetainAllocationHandle["cuMemRetainAllocationHandle", 11000, Default](handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) => virtual_memory::cuMemRetainAllocationHandle;

    // ---- IPC ----
    fn cuIpcGetMemHandle["cuIpcGetMemHandle", 4010, Default](handle: *mut CUipcMemHandle, dptr: CUdeviceptr) => ipc::cuIpcGetMemHandle;
    fn cuIpcOpenMemHandle["cuIpcOpenMemHandle", 4010, Default](pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, _flags: c_uint) => ipc::cuIpcOpenMemHandle;
    fn cuIpcOpenMemHandle_v2["cuIpcOpenMemHandle", 11000, Default](pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, _flags: c_uint) => ipc::cuIpcOpenMemHandle;
    fn cuIpcCloseMemHandle["cuIpcCloseMemHandle", 4010, Default](dptr: CUdeviceptr) => ipc::cuIpcCloseMemHandle;

    // ---- modules, libraries, functions ----
    fn cuModuleLoadData["cuModuleLoadData", 2000, Default](m: *mut CUmodule, image: *const c_void) => module::cuModuleLoadData;
    fn cuModuleLoadDataEx["cuModuleLoadDataEx", 2010, Default](m: *mut CUmodule, image: *const c_void, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) => module::cuModuleLoadDataEx;
    fn cuModuleLoad["cuModuleLoad", 2000, Default](m: *mut CUmodule, fname: *const c_char) => module::cuModuleLoad;
    fn cuModuleUnload["cuModuleUnload", 2000, Default](m: CUmodule) => module::cuModuleUnload;
    fn cuModuleGetFunction["cuModuleGetFunction", 2000, Default](f: *mut CUfunction, m: CUmodule, name: *const c_char) => module::cuModuleGetFunction;
    fn cuModuleGetGlobal_v2["cuModuleGetGlobal", 3020, Default](dptr: *mut CUdeviceptr, bytes: *mut usize, m: CUmodule, name: *const c_char) => module::cuModuleGetGlobal_v2;
    fn cuLibraryLoadData["cuLibraryLoadData", 12000, Default](l: *mut CUlibrary, code: *const c_void, _jo: *mut c_int, _jv: *mut *mut c_void, _jn: c_uint, _lo: *mut c_int, _lv: *mut *mut c_void, _ln: c_uint) => module::cuLibraryLoadData;
    fn cuLibraryUnload["cuLibraryUnload", 12000, Default](l: CUlibrary) => module::cuLibraryUnload;
    fn cuLibraryGetKernel["cuLibraryGetKernel", 12000, Default](k: *mut CUkernel, l: CUlibrary, name: *const c_char) => module::cuLibraryGetKernel;
    fn cuKernelGetFunction["cuKernelGetFunction", 12000, Default](f: *mut CUfunction, k: CUkernel) => module::cuKernelGetFunction;
    fn cuFuncGetAttribute["cuFuncGetAttribute", 2020, Default](pi: *mut c_int, attrib: c_int, f: CUfunction) => module::cuFuncGetAttribute;

    // ---- launches ----
    fn cuLaunch["cuLaunch", 2000, Default](f: CUfunction) => launch::cuLaunch;
    fn cuLaunchGrid["cuLaunchGrid", 2000, Default](f: CUfunction, gw: c_int, gh: c_int) => launch::cuLaunchGrid;
    fn cuLaunchGridAsync["cuLaunchGridAsync", 2000, Default](f: CUfunction, gw: c_int, gh: c_int, s: CUstream) => launch::cuLaunchGridAsync;
    fn cuLaunchKernel["cuLaunchKernel", 4000, Default](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::cuLaunchKernel;
    fn cuLaunchKernel_ptsz["cuLaunchKernel", 7000, Ptsz](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::cuLaunchKernel;
    fn cuLaunchKernelEx["cuLaunchKernelEx", 11060, Default](config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::cuLaunchKernelEx;
    fn cuLaunchKernelEx_ptsz["cuLaunchKernelEx", 11060, Ptsz](config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::cuLaunchKernelEx;
    fn cuLaunchCooperativeKernel["cuLaunchCooperativeKernel", 9000, Default](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void) => launch::cuLaunchCooperativeKernel;
    fn cuLaunchCooperativeKernel_ptsz["cuLaunchCooperativeKernel", 9000, Ptsz](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void) => launch::cuLaunchCooperativeKernel;
    fn cuLaunchCooperativeKernelMultiDevice["cuLaunchCooperativeKernelMultiDevice", 9000, Default](list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, _flags: c_uint) => launch::cuLaunchCooperativeKernelMultiDevice;

    // ---- graphs and capture ----
    fn cuStreamBeginCapture["cuStreamBeginCapture", 10000, Default](s: CUstream) => graph::cuStreamBeginCapture;
    fn cuStreamBeginCapture_ptsz["cuStreamBeginCapture", 10000, Ptsz](s: CUstream) => graph::cuStreamBeginCapture;
    fn cuStreamBeginCapture_v2["cuStreamBeginCapture", 10010, Default](s: CUstream, mode: c_uint) => graph::cuStreamBeginCapture_v2;
    fn cuStreamBeginCapture_v2_ptsz["cuStreamBeginCapture", 10010, Ptsz](s: CUstream, mode: c_uint) => graph::cuStreamBeginCapture_v2;
    fn cuStreamEndCapture["cuStreamEndCapture", 10000, Default](s: CUstream, g: *mut CUgraph) => graph::cuStreamEndCapture;
    fn cuStreamEndCapture_ptsz["cuStreamEndCapture", 10000, Ptsz](s: CUstream, g: *mut CUgraph) => graph::cuStreamEndCapture;
    fn cuStreamIsCapturing["cuStreamIsCapturing", 10000, Default](s: CUstream, status: *mut c_uint) => graph::cuStreamIsCapturing;
    fn cuStreamIsCapturing_ptsz["cuStreamIsCapturing", 10000, Ptsz](s: CUstream, status: *mut c_uint) => graph::cuStreamIsCapturing;
    fn cuGraphCreate["cuGraphCreate", 10000, Default](g: *mut CUgraph, flags: c_uint) => graph::cuGraphCreate;
    fn cuGraphAddKernelNode["cuGraphAddKernelNode", 10000, Default](node: *mut CUgraphNode, g: CUgraph, _deps: *const CUgraphNode, _ndeps: usize, params: *const CUDA_KERNEL_NODE_PARAMS) => graph::cuGraphAddKernelNode;
    fn cuGraphAddKernelNode_v2["cuGraphAddKernelNode", 12000, Default](node: *mut CUgraphNode, g: CUgraph, _deps: *const CUgraphNode, _ndeps: usize, params: *const CUDA_KERNEL_NODE_PARAMS_v2) => graph::cuGraphAddKernelNode_v2;
    fn cuGraphInstantiate["cuGraphInstantiate", 10000, Default](e: *mut CUgraphExec, g: CUgraph, _err: *mut CUgraphNode, _log: *mut c_char, _n: usize) => graph::cuGraphInstantiate;
    fn cuGraphInstantiate_v2["cuGraphInstantiate", 11000, Default](e: *mut CUgraphExec, g: CUgraph, _err: *mut CUgraphNode, _log: *mut c_char, _n: usize) => graph::cuGraphInstantiate;
    fn cuGraphInstantiateWithFlags["cuGraphInstantiateWithFlags", 11040, Default](e: *mut CUgraphExec, g: CUgraph, flags: c_ulonglong) => graph::cuGraphInstantiateWithFlags;
    fn cuGraphLaunch["cuGraphLaunch", 10000, Default](e: CUgraphExec, s: CUstream) => graph::cuGraphLaunch;
    fn cuGraphLaunch_ptsz["cuGraphLaunch", 10000, Ptsz](e: CUgraphExec, s: CUstream) => graph::cuGraphLaunch;
    fn cuGraphExecDestroy["cuGraphExecDestroy", 10000, Default](e: CUgraphExec) => graph::cuGraphExecDestroy;
    fn cuGraphUpload["cuGraphUpload", 11010, Default](e: CUgraphExec, s: CUstream) => graph::cuGraphUpload;
    fn cuGraphUpload_ptsz["cuGraphUpload", 11010, Ptsz](e: CUgraphExec, s: CUstream) => graph::cuGraphUpload;
    fn cuDeviceGraphMemTrim["cuDeviceGraphMemTrim", 11040, Default](dev: CUdevice) => graph::cuDeviceGraphMemTrim;
    fn cuDeviceGetGraphMemAttribute["cuDeviceGetGraphMemAttribute", 11040, Default](dev: CUdevice, attr: c_int, value: *mut c_void) => graph::cuDeviceGetGraphMemAttribute;
    // Graph memory comes from stream capture only (see fakegpu::cuda::graph).
    fn cuGraphAddMemAllocNode["cuGraphAddMemAllocNode", 11040, Default](_node: *mut CUgraphNode, _g: CUgraph, _deps: *const CUgraphNode, _ndeps: usize, _params: *mut c_void) => graph::cuGraphAddMemAllocNode;
    fn cuGraphDestroy["cuGraphDestroy", 10000, Default](g: CUgraph) => graph::cuGraphDestroy;

    // ---- streams and events ----
    fn cuStreamCreate["cuStreamCreate", 2000, Default](s: *mut CUstream, flags: c_uint) => stream::cuStreamCreate;
    fn cuStreamCreateWithPriority["cuStreamCreateWithPriority", 5050, Default](s: *mut CUstream, flags: c_uint, priority: c_int) => stream::cuStreamCreateWithPriority;
    fn cuStreamDestroy_v2["cuStreamDestroy", 4000, Default](s: CUstream) => stream::cuStreamDestroy_v2;
    fn cuStreamGetCtx["cuStreamGetCtx", 9020, Default](s: CUstream, pctx: *mut CUcontext) => stream::cuStreamGetCtx;
    fn cuStreamGetCtx_ptsz["cuStreamGetCtx", 9020, Ptsz](s: CUstream, pctx: *mut CUcontext) => stream::cuStreamGetCtx;
    fn cuStreamSynchronize["cuStreamSynchronize", 2000, Default](s: CUstream) => stream::cuStreamSynchronize;
    fn cuStreamSynchronize_ptsz["cuStreamSynchronize", 7000, Ptsz](s: CUstream) => stream::cuStreamSynchronize;
    fn cuStreamQuery["cuStreamQuery", 2000, Default](s: CUstream) => stream::cuStreamQuery;
    fn cuStreamQuery_ptsz["cuStreamQuery", 7000, Ptsz](s: CUstream) => stream::cuStreamQuery;
    fn cuStreamWaitEvent["cuStreamWaitEvent", 3020, Default](s: CUstream, e: CUevent, flags: c_uint) => stream::cuStreamWaitEvent;
    fn cuStreamWaitEvent_ptsz["cuStreamWaitEvent", 7000, Ptsz](s: CUstream, e: CUevent, flags: c_uint) => stream::cuStreamWaitEvent;
    fn cuEventCreate["cuEventCreate", 2000, Default](e: *mut CUevent, flags: c_uint) => stream::cuEventCreate;
    fn cuEventRecord["cuEventRecord", 2000, Default](e: CUevent, s: CUstream) => stream::cuEventRecord;
    fn cuEventRecord_ptsz["cuEventRecord", 7000, Ptsz](e: CUevent, s: CUstream) => stream::cuEventRecord;
    fn cuEventQuery["cuEventQuery", 2000, Default](e: CUevent) => stream::cuEventQuery;
    fn cuEventSynchronize["cuEventSynchronize", 2000, Default](e: CUevent) => stream::cuEventSynchronize;
    fn cuEventElapsedTime["cuEventElapsedTime", 2000, Default](ms: *mut f32, a: CUevent, b: CUevent) => stream::cuEventElapsedTime;
    fn cuEventElapsedTime_v2["cuEventElapsedTime", 12080, Default](ms: *mut f32, a: CUevent, b: CUevent) => stream::cuEventElapsedTime;
    fn cuEventDestroy_v2["cuEventDestroy", 4000, Default](e: CUevent) => stream::cuEventDestroy_v2;

    // ---- what the CUDA runtime, PyTorch, CuPy and cuBLAS call on their common paths ----
    fn cuCtxGetFlags["cuCtxGetFlags", 7000, Default](flags: *mut c_uint) => context::cuCtxGetFlags;
    fn cuCtxGetId["cuCtxGetId", 12000, Default](ctx: CUcontext, id: *mut c_ulonglong) => context::cuCtxGetId;
    fn cuCtxGetStreamPriorityRange["cuCtxGetStreamPriorityRange", 5050, Default](least: *mut c_int, greatest: *mut c_int) => context::cuCtxGetStreamPriorityRange;
    fn cuCtxGetCacheConfig["cuCtxGetCacheConfig", 3020, Default](cfg: *mut c_int) => context::cuCtxGetCacheConfig;
    fn cuCtxSetCacheConfig["cuCtxSetCacheConfig", 3020, Default](cfg: c_int) => context::cuCtxSetCacheConfig;
    fn cuCtxGetSharedMemConfig["cuCtxGetSharedMemConfig", 4020, Default](cfg: *mut c_int) => context::cuCtxGetSharedMemConfig;
    fn cuCtxSetSharedMemConfig["cuCtxSetSharedMemConfig", 4020, Default](cfg: c_int) => context::cuCtxSetSharedMemConfig;
    fn cuCtxResetPersistingL2Cache["cuCtxResetPersistingL2Cache", 11000, Default]() => context::cuCtxResetPersistingL2Cache;
    fn cuCtxEnablePeerAccess["cuCtxEnablePeerAccess", 4000, Default](ctx: CUcontext, _flags: c_uint) => context::cuCtxEnablePeerAccess;
    fn cuCtxDisablePeerAccess["cuCtxDisablePeerAccess", 4000, Default](ctx: CUcontext) => context::cuCtxDisablePeerAccess;
    fn cuDeviceCanAccessPeer["cuDeviceCanAccessPeer", 4000, Default](can: *mut c_int, dev: CUdevice, peer: CUdevice) => device::cuDeviceCanAccessPeer;
    fn cuDeviceGetP2PAttribute["cuDeviceGetP2PAttribute", 8000, Default](value: *mut c_int, _attr: c_int, src: CUdevice, dst: CUdevice) => device::cuDeviceGetP2PAttribute;
    fn cuModuleGetLoadingMode["cuModuleGetLoadingMode", 11070, Default](mode: *mut c_int) => module::cuModuleGetLoadingMode;
    fn cuModuleLoadFatBinary["cuModuleLoadFatBinary", 2000, Default](m: *mut CUmodule, image: *const c_void) => module::cuModuleLoadData;
    fn cuLibraryLoadFromFile["cuLibraryLoadFromFile", 12000, Default](l: *mut CUlibrary, path: *const c_char, _jo: *mut c_int, _jv: *mut *mut c_void, _jn: c_uint, _lo: *mut c_int, _lv: *mut *mut c_void, _ln: c_uint) => module::cuLibraryLoadFromFile;
    fn cuLibraryGetModule["cuLibraryGetModule", 12000, Default](m: *mut CUmodule, l: CUlibrary) => module::cuLibraryGetModule;
    fn cuLibraryGetGlobal["cuLibraryGetGlobal", 12000, Default](dptr: *mut CUdeviceptr, bytes: *mut usize, l: CUlibrary, name: *const c_char) => module::cuLibraryGetGlobal;
    fn cuKernelGetAttribute["cuKernelGetAttribute", 12000, Default](pi: *mut c_int, attrib: c_int, k: CUkernel, dev: CUdevice) => module::cuKernelGetAttribute;
    fn cuKernelSetAttribute["cuKernelSetAttribute", 12000, Default](attrib: c_int, value: c_int, k: CUkernel, dev: CUdevice) => module::cuKernelSetAttribute;
    fn cuKernelSetCacheConfig["cuKernelSetCacheConfig", 12000, Default](k: CUkernel, cfg: c_int, dev: CUdevice) => module::cuKernelSetCacheConfig;
    fn cuKernelGetName["cuKernelGetName", 12030, Default](name: *mut *const c_char, k: CUkernel) => module::cuKernelGetName;
    fn cuFuncSetAttribute["cuFuncSetAttribute", 9000, Default](f: CUfunction, attrib: c_int, value: c_int) => module::cuFuncSetAttribute;
    fn cuFuncSetCacheConfig["cuFuncSetCacheConfig", 3000, Default](f: CUfunction, cfg: c_int) => module::cuFuncSetCacheConfig;
    fn cuFuncSetSharedMemConfig["cuFuncSetSharedMemConfig", 4020, Default](f: CUfunction, cfg: c_int) => module::cuFuncSetSharedMemConfig;
    fn cuFuncGetName["cuFuncGetName", 12030, Default](name: *mut *const c_char, f: CUfunction) => module::cuFuncGetName;
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor["cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, Default](n: *mut c_int, f: CUfunction, block: c_int, _smem: usize) => launch::cuOccupancyMaxActiveBlocksPerMultiprocessor;
    fn cuOccupancyMaxActiveClusters["cuOccupancyMaxActiveClusters", 11070, Default](n: *mut c_int, f: CUfunction, config: *const CUlaunchConfig) => launch::cuOccupancyMaxActiveClusters;
    fn cuOccupancyAvailableDynamicSMemPerBlock["cuOccupancyAvailableDynamicSMemPerBlock", 10020, Default](size: *mut usize, f: CUfunction, blocks: c_int, block: c_int) => launch::cuOccupancyAvailableDynamicSMemPerBlock;
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, Default](n: *mut c_int, f: CUfunction, block: c_int, _smem: usize, _flags: c_uint) => launch::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
    fn cuStreamGetFlags["cuStreamGetFlags", 5050, Default](s: CUstream, flags: *mut c_uint) => stream::cuStreamGetFlags;
    fn cuStreamGetFlags_ptsz["cuStreamGetFlags", 7000, Ptsz](s: CUstream, flags: *mut c_uint) => stream::cuStreamGetFlags;
    fn cuStreamGetPriority["cuStreamGetPriority", 5050, Default](s: CUstream, prio: *mut c_int) => stream::cuStreamGetPriority;
    fn cuStreamGetPriority_ptsz["cuStreamGetPriority", 7000, Ptsz](s: CUstream, prio: *mut c_int) => stream::cuStreamGetPriority;
    fn cuStreamGetId["cuStreamGetId", 12000, Default](s: CUstream, id: *mut c_ulonglong) => stream::cuStreamGetId;
    fn cuStreamGetId_ptsz["cuStreamGetId", 12000, Ptsz](s: CUstream, id: *mut c_ulonglong) => stream::cuStreamGetId_ptsz;
    fn cuStreamGetDevice["cuStreamGetDevice", 12080, Default](s: CUstream, dev: *mut CUdevice) => stream::cuStreamGetDevice;
    fn cuStreamGetDevice_ptsz["cuStreamGetDevice", 12080, Ptsz](s: CUstream, dev: *mut CUdevice) => stream::cuStreamGetDevice;
    fn cuStreamGetCaptureInfo["cuStreamGetCaptureInfo", 10010, Default](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong) => graph::cuStreamGetCaptureInfo;
    fn cuStreamGetCaptureInfo_ptsz["cuStreamGetCaptureInfo", 10010, Ptsz](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong) => graph::cuStreamGetCaptureInfo;
    fn cuStreamGetCaptureInfo_v2["cuStreamGetCaptureInfo", 11030, Default](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize) => graph::cuStreamGetCaptureInfo_v2;
    fn cuStreamGetCaptureInfo_v2_ptsz["cuStreamGetCaptureInfo", 11030, Ptsz](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize) => graph::cuStreamGetCaptureInfo_v2;
    fn cuStreamGetCaptureInfo_v3["cuStreamGetCaptureInfo", 12030, Default](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const c_void, n: *mut usize) => graph::cuStreamGetCaptureInfo_v3;
    fn cuStreamGetCaptureInfo_v3_ptsz["cuStreamGetCaptureInfo", 12030, Ptsz](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const c_void, n: *mut usize) => graph::cuStreamGetCaptureInfo_v3;
    fn cuThreadExchangeStreamCaptureMode["cuThreadExchangeStreamCaptureMode", 10010, Default](mode: *mut c_uint) => graph::cuThreadExchangeStreamCaptureMode;
    fn cuLaunchHostFunc["cuLaunchHostFunc", 10000, Default](s: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) => stream::cuLaunchHostFunc;
    fn cuLaunchHostFunc_ptsz["cuLaunchHostFunc", 10000, Ptsz](s: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) => stream::cuLaunchHostFunc;
    fn cuStreamAddCallback["cuStreamAddCallback", 5000, Default](s: CUstream, f: Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>, data: *mut c_void, flags: c_uint) => stream::cuStreamAddCallback;
    fn cuStreamAddCallback_ptsz["cuStreamAddCallback", 7000, Ptsz](s: CUstream, f: Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>, data: *mut c_void, flags: c_uint) => stream::cuStreamAddCallback;
    fn cuEventRecordWithFlags["cuEventRecordWithFlags", 11010, Default](e: CUevent, s: CUstream, flags: c_uint) => stream::cuEventRecordWithFlags;
    fn cuEventRecordWithFlags_ptsz["cuEventRecordWithFlags", 11010, Ptsz](e: CUevent, s: CUstream, flags: c_uint) => stream::cuEventRecordWithFlags;
    fn cuMemcpy["cuMemcpy", 4000, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize) => memory::cuMemcpy;
    fn cuMemcpy_ptds["cuMemcpy", 7000, Ptds](dst: CUdeviceptr, src: CUdeviceptr, n: usize) => memory::cuMemcpy;
    fn cuMemcpyAsync["cuMemcpyAsync", 4000, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => memory::cuMemcpyAsync;
    fn cuMemcpyAsync_ptsz["cuMemcpyAsync", 7000, Ptsz](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => memory::cuMemcpyAsync;
    fn cuMemcpyDtoDAsync_v2["cuMemcpyDtoDAsync", 3020, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => memory::cuMemcpyDtoDAsync_v2;
    fn cuMemcpyDtoDAsync_v2_ptsz["cuMemcpyDtoDAsync", 7000, Ptsz](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => memory::cuMemcpyDtoDAsync_v2;
    fn cuMemcpyPeer["cuMemcpyPeer", 4000, Default](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) => memory::cuMemcpyPeer;
    fn cuMemcpyPeer_ptds["cuMemcpyPeer", 7000, Ptds](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) => memory::cuMemcpyPeer;
    fn cuMemcpyPeerAsync["cuMemcpyPeerAsync", 4000, Default](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) => memory::cuMemcpyPeerAsync;
    fn cuMemcpyPeerAsync_ptsz["cuMemcpyPeerAsync", 7000, Ptsz](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) => memory::cuMemcpyPeerAsync;
    fn cuMemcpy2D_v2["cuMemcpy2D", 3020, Default](p: *const CUDA_MEMCPY2D) => memory::cuMemcpy2D_v2;
    fn cuMemcpy2D_v2_ptds["cuMemcpy2D", 7000, Ptds](p: *const CUDA_MEMCPY2D) => memory::cuMemcpy2D_v2;
    fn cuMemcpy2DUnaligned_v2["cuMemcpy2DUnaligned", 3020, Default](p: *const CUDA_MEMCPY2D) => memory::cuMemcpy2D_v2;
    fn cuMemcpy2DUnaligned_v2_ptds["cuMemcpy2DUnaligned", 7000, Ptds](p: *const CUDA_MEMCPY2D) => memory::cuMemcpy2D_v2;
    fn cuMemcpy2DAsync_v2["cuMemcpy2DAsync", 3020, Default](p: *const CUDA_MEMCPY2D, s: CUstream) => memory::cuMemcpy2DAsync_v2;
    fn cuMemcpy2DAsync_v2_ptsz["cuMemcpy2DAsync", 7000, Ptsz](p: *const CUDA_MEMCPY2D, s: CUstream) => memory::cuMemcpy2DAsync_v2;
    fn cuPointerGetAttribute["cuPointerGetAttribute", 4000, Default](data: *mut c_void, attr: c_int, ptr: CUdeviceptr) => memory::cuPointerGetAttribute;
    fn cuPointerGetAttributes["cuPointerGetAttributes", 7000, Default](n: c_uint, attrs: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) => memory::cuPointerGetAttributes;
    fn cuMemHostRegister_v2["cuMemHostRegister", 6050, Default](p: *mut c_void, size: usize, flags: c_uint) => memory::cuMemHostRegister_v2;
    fn cuMemHostUnregister["cuMemHostUnregister", 4000, Default](p: *mut c_void) => memory::cuMemHostUnregister;
    fn cuMemHostGetDevicePointer_v2["cuMemHostGetDevicePointer", 3020, Default](dptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) => memory::cuMemHostGetDevicePointer_v2;
    fn cuMemHostGetFlags["cuMemHostGetFlags", 2030, Default](flags: *mut c_uint, p: *mut c_void) => memory::cuMemHostGetFlags;
    fn cuMemPrefetchAsync["cuMemPrefetchAsync", 8000, Default](ptr: CUdeviceptr, n: usize, dev: CUdevice, s: CUstream) => memory::cuMemPrefetchAsync;
    fn cuMemPrefetchAsync_ptsz["cuMemPrefetchAsync", 8000, Ptsz](ptr: CUdeviceptr, n: usize, dev: CUdevice, s: CUstream) => memory::cuMemPrefetchAsync;
    fn cuMemPrefetchAsync_v2["cuMemPrefetchAsync", 12020, Default](ptr: CUdeviceptr, n: usize, loc: CUmemLocation, _flags: c_uint, s: CUstream) => memory::cuMemPrefetchAsync_v2;
    fn cuMemPrefetchAsync_v2_ptsz["cuMemPrefetchAsync", 12020, Ptsz](ptr: CUdeviceptr, n: usize, loc: CUmemLocation, _flags: c_uint, s: CUstream) => memory::cuMemPrefetchAsync_v2;
    fn cuMemAdvise["cuMemAdvise", 8000, Default](ptr: CUdeviceptr, n: usize, advice: c_int, dev: CUdevice) => memory::cuMemAdvise;
    fn cuMemAdvise_v2["cuMemAdvise", 12020, Default](ptr: CUdeviceptr, n: usize, advice: c_int, loc: CUmemLocation) => memory::cuMemAdvise_v2;
    fn cuMemRangeGetAttribute["cuMemRangeGetAttribute", 8000, Default](data: *mut c_void, size: usize, attribute: c_int, ptr: CUdeviceptr, n: usize) => memory::cuMemRangeGetAttribute;
    fn cuMemRangeGetAttributes["cuMemRangeGetAttributes", 8000, Default](data: *mut *mut c_void, sizes: *mut usize, attributes: *mut c_int, count: usize, ptr: CUdeviceptr, n: usize) => memory::cuMemRangeGetAttributes;
    fn cuMemGetDefaultMemPool["cuMemGetDefaultMemPool", 13000, Default](pool: *mut CUmemoryPool, loc: *const CUmemLocation, ty: c_int) => pool::cuMemGetDefaultMemPool;
    fn cuMemGetMemPool["cuMemGetMemPool", 13000, Default](pool: *mut CUmemoryPool, loc: *const CUmemLocation, ty: c_int) => pool::cuMemGetMemPool;
    fn cuMemSetMemPool["cuMemSetMemPool", 13000, Default](loc: *const CUmemLocation, ty: c_int, pool: CUmemoryPool) => pool::cuMemSetMemPool;
    fn cuMemPoolSetAccess["cuMemPoolSetAccess", 11020, Default](pool: CUmemoryPool, desc: *const CUmemAccessDesc, count: usize) => pool::cuMemPoolSetAccess;
    fn cuMemPoolGetAccess["cuMemPoolGetAccess", 11020, Default](flags: *mut c_uint, pool: CUmemoryPool, loc: *const CUmemLocation) => pool::cuMemPoolGetAccess;
    // The fake driver never logs, so a registered callback is never called: truthfully.
    fn cuLogsRegisterCallback["cuLogsRegisterCallback", 12090, Default](_cb: *mut c_void, _data: *mut c_void, handle: *mut *mut c_void) => tools::cuLogsRegisterCallback;
    fn cuLogsUnregisterCallback["cuLogsUnregisterCallback", 12090, Default](handle: *mut c_void) => tools::cuLogsUnregisterCallback;
    fn cuGraphGetNodes["cuGraphGetNodes", 10000, Default](g: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) => graph::cuGraphGetNodes;
    fn cuProfilerStart["cuProfilerStart", 4000, Default]() => tools::profiler_start_or_stop;
    fn cuProfilerStop["cuProfilerStop", 4000, Default]() => tools::profiler_start_or_stop;
    fn cuLinkCreate["cuLinkCreate", 5050, Default](_n: c_uint, _o: *mut c_int, _v: *mut *mut c_void, state: *mut *mut c_void) => module::cuLinkCreate;
    fn cuLinkCreate_v2["cuLinkCreate", 6050, Default](_n: c_uint, _o: *mut c_int, _v: *mut *mut c_void, state: *mut *mut c_void) => module::cuLinkCreate;
    fn cuLinkAddData["cuLinkAddData", 5050, Default](state: *mut c_void, _ty: c_int, data: *mut c_void, size: usize, _name: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) => module::cuLinkAddData;
    fn cuLinkAddData_v2["cuLinkAddData", 6050, Default](state: *mut c_void, _ty: c_int, data: *mut c_void, size: usize, _name: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) => module::cuLinkAddData;
    fn cuLinkAddFile["cuLinkAddFile", 5050, Default](state: *mut c_void, _ty: c_int, path: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) => module::cuLinkAddFile;
    fn cuLinkAddFile_v2["cuLinkAddFile", 6050, Default](state: *mut c_void, _ty: c_int, path: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) => module::cuLinkAddFile;
    fn cuLinkComplete["cuLinkComplete", 5050, Default](state: *mut c_void, cubin: *mut *mut c_void, size: *mut usize) => module::cuLinkComplete;
    fn cuLinkDestroy["cuLinkDestroy", 5050, Default](state: *mut c_void) => module::cuLinkDestroy;

    // ---- tensor maps (Hopper's TMA descriptors; encoded on the host) ----
    fn cuTensorMapEncodeTiled["cuTensorMapEncodeTiled", 12000, Default](map: *mut u64, ty: c_uint, rank: c_uint, addr: *mut c_void, dim: *const u64, strides: *const u64, box_dim: *const u32, es: *const u32, interleave: c_uint, swizzle: c_uint, l2: c_uint, oob: c_uint) => tensor_map::cuTensorMapEncodeTiled;
    fn cuTensorMapEncodeIm2col["cuTensorMapEncodeIm2col", 12000, Default](map: *mut u64, ty: c_uint, rank: c_uint, addr: *mut c_void, dim: *const u64, strides: *const u64, lower: *const c_int, upper: *const c_int, channels: c_uint, pixels: c_uint, es: *const u32, interleave: c_uint, swizzle: c_uint, l2: c_uint, oob: c_uint) => tensor_map::cuTensorMapEncodeIm2col;

    // ---- lookup and errors (usable before cuInit) ----
    fn cuGetProcAddress["cuGetProcAddress", 11030, Default](symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => lookup::cuGetProcAddress;
    fn cuGetProcAddress_v2["cuGetProcAddress", 12000, Default](symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => lookup::cuGetProcAddress_v2;
    fn cuGetErrorName["cuGetErrorName", 6000, Default](error: CUresult, s: *mut *const c_char) => lookup::cuGetErrorName;
    fn cuGetErrorString["cuGetErrorString", 6000, Default](error: CUresult, s: *mut *const c_char) => lookup::cuGetErrorString;
    fn cuGetExportTable["cuGetExportTable", 3000, Default](table: *mut *const c_void, id: *const CUuuid) => lookup::cuGetExportTable;
}
