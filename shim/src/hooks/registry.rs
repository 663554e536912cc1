//! THE registry: every hooked function is declared exactly once, in the `hook_table!` macro
//! below, as
//!
//! ```text
//! Cuda fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult => memory::mem_alloc;
//! Cuda fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult => passthrough;
//! ```
//!
//! (library, exported C name and signature, handler). From that one table two generators run:
//! * in the ground layer (`ground::driver`, re-exported here): `signature::NAME`, the C
//!   function-pointer type, and `SLOTS[SlotId::NAME]` + `real::NAME()`, the lazily resolved
//!   real function;
//! * here, `hook_exports!`: `exports::NAME`, the `#[no_mangle] extern "C"` export (only outside
//!   `cfg(test)`), a tiny shell: panic boundary -> fail-closed gate (skipped by a handler
//!   marked `[open]`, see `refusal`) -> real slot (missing -> NOT_SUPPORTED /
//!   FUNCTION_NOT_FOUND) -> handler (`passthrough` calls the real function directly), run
//!   only by the outermost hook on the thread ([`crate::hooks::nesting`]); a handler marked
//!   `[hot]` (the launch paths) has a hot export and a hot launch (its common case, no
//!   boundary) and this shell behind them as a cold function, and skips the nesting check (a
//!   nested launch would be billed twice, which only throttles harder; see
//!   [`crate::hooks::launch`]); and `HOOKS`: name -> wrapper for `dlsym`, and real pointer
//!   -> wrapper for `cuGetProcAddress`.
//!
//! Handlers are `unsafe fn(real: signature::NAME, args...) -> u32` in `crate::hooks` (a
//! `[hot]` one takes what the throttle still asks last, `due`, and answers `Launched`).
//! `helpers { ... }` declares real functions the shim calls itself but does not hook.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use gpuslice_abi::cuda::*;
use gpuslice_abi::nvml::*;

pub(crate) use crate::ground::driver::{real, signature, SlotId, HOOK_COUNT, SLOTS};
pub(crate) use crate::ground::real::{Library, RealSlot};

impl Library {
    /// What a wrapper returns when a panic was contained.
    pub(crate) const fn panic_code(self) -> u32 {
        match self {
            Library::Cuda => result::CUDA_ERROR_UNKNOWN,
            Library::Nvml => ret::NVML_ERROR_UNKNOWN,
        }
    }
    /// What a wrapper returns when the real library lacks the function (older driver).
    pub(crate) const fn missing_code(self) -> u32 {
        match self {
            Library::Cuda => result::CUDA_ERROR_NOT_SUPPORTED,
            Library::Nvml => ret::NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    }
    /// What every entry point returns when the configuration is invalid (fail closed).
    pub(crate) const fn fail_closed_code(self) -> u32 {
        match self {
            Library::Cuda => result::CUDA_ERROR_NOT_INITIALIZED,
            Library::Nvml => ret::NVML_ERROR_UNINITIALIZED,
        }
    }
}

/// One hooked function as the lookup paths see it.
pub(crate) struct Hook {
    pub name: &'static str,
    pub slot: &'static RealSlot,
    /// This library's own export (`exports::NAME`) as an untyped pointer: the handler the
    /// front's trampoline jumps to. Never handed out when a front is attached: see `wrapper`.
    pub own_export: *const c_void,
    /// Position in the registry (the front's export table has the same order).
    pub id: usize,
}

// SAFETY: `own_export` is the address of a function; it is never written and functions can be
// called from any thread.
unsafe impl Sync for Hook {}

impl Hook {
    pub(crate) fn library(&self) -> Library {
        self.slot.library
    }

    /// THE pointer for this hook that the shim hands out and recognises (dlsym and
    /// cuGetProcAddress answers, identity checks): the front's export of the name once a front
    /// attached (`hooks::front`), this library's own export when it was preloaded itself.
    #[inline]
    pub(crate) fn wrapper(&self) -> *const c_void {
        crate::hooks::front::front_export(self.id).unwrap_or(self.own_export)
    }
}

/// THE table: every hooked function (with its handler) and every helper the shim calls
/// itself, declared once. `hook_table!(generator)` hands it to a generator: the hook layer's
/// `hook_exports` (below) and the ground layer's `real_table` (`ground::driver`, which takes
/// the signatures and ignores the handlers).
macro_rules! hook_table {
    ($generate:ident) => {
        $generate! {
        hooks {
            Cuda fn cuInit(flags: c_uint) -> CUresult => lifecycle::cu_init;
            Cuda fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult => passthrough;
            Cuda fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int,
                flags: cuuint64_t) -> CUresult => proc_address::get_proc_address [open];
            Cuda fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int,
                flags: cuuint64_t, symbol_status: *mut c_int) -> CUresult => proc_address::get_proc_address_v2 [open];
            Cuda fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult => query::mem_get_info;
            Cuda fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult => query::device_total_mem;

            Cuda fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult => memory::mem_alloc;
            Cuda fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width_bytes: usize,
                height: usize, element_size: c_uint) -> CUresult => memory::mem_alloc_pitch;
            Cuda fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult
                => memory::mem_alloc_managed;
            Cuda fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult => memory::mem_free;
            Cuda fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult
                => memory::mem_alloc_async;
            Cuda fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult
                => memory::mem_alloc_async;
            Cuda fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::mem_free_async;
            Cuda fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::mem_free_async;
            Cuda fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool,
                stream: CUstream) -> CUresult => memory::mem_alloc_from_pool_async;
            Cuda fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool,
                stream: CUstream) -> CUresult => memory::mem_alloc_from_pool_async;
            // Advice and prefetches: refused over memory an oversubscribed slice placed on the
            // host (see memory::oversubscribe), which they would move onto the card.
            Cuda fn cuMemAdvise(ptr: CUdeviceptr, count: usize, advice: c_int, device: CUdevice) -> CUresult
                => memory::mem_advise;
            Cuda fn cuMemAdvise_v2(ptr: CUdeviceptr, count: usize, advice: c_int, location: CUmemLocation)
                -> CUresult => memory::mem_advise_v2;
            Cuda fn cuMemPrefetchAsync(ptr: CUdeviceptr, count: usize, device: CUdevice, stream: CUstream)
                -> CUresult => memory::mem_prefetch;
            Cuda fn cuMemPrefetchAsync_ptsz(ptr: CUdeviceptr, count: usize, device: CUdevice, stream: CUstream)
                -> CUresult => memory::mem_prefetch;
            Cuda fn cuMemPrefetchAsync_v2(ptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint,
                stream: CUstream) -> CUresult => memory::mem_prefetch_v2;
            Cuda fn cuMemPrefetchAsync_v2_ptsz(ptr: CUdeviceptr, count: usize, location: CUmemLocation,
                flags: c_uint, stream: CUstream) -> CUresult => memory::mem_prefetch_v2;
            Cuda fn cuMemPrefetchBatchAsync(ptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
                locations: *mut CUmemLocation, location_indices: *mut usize, location_count: usize, flags: u64,
                stream: CUstream) -> CUresult => memory::mem_prefetch_batch;
            Cuda fn cuMemPrefetchBatchAsync_ptsz(ptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
                locations: *mut CUmemLocation, location_indices: *mut usize, location_count: usize, flags: u64,
                stream: CUstream) -> CUresult => memory::mem_prefetch_batch;
            Cuda fn cuMemDiscardAndPrefetchBatchAsync(ptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
                locations: *mut CUmemLocation, location_indices: *mut usize, location_count: usize, flags: u64,
                stream: CUstream) -> CUresult => memory::mem_prefetch_batch;
            Cuda fn cuMemDiscardAndPrefetchBatchAsync_ptsz(ptrs: *mut CUdeviceptr, sizes: *mut usize,
                count: usize, locations: *mut CUmemLocation, location_indices: *mut usize, location_count: usize,
                flags: u64, stream: CUstream) -> CUresult => memory::mem_prefetch_batch;
            Cuda fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult => memory::mem_pool_destroy;
            // Which device a pool lives on (a pool allocation is charged there, see the policy crate's pool book).
            Cuda fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult
                => memory::mem_pool_create;
            Cuda fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult
                => memory::device_get_mem_pool;
            Cuda fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult
                => memory::device_get_mem_pool;
            Cuda fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult => memory::device_set_mem_pool;
            Cuda fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult => memory::mem_pool_trim_to;
            Cuda fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize,
                prop: *const CUmemAllocationProp, flags: u64) -> CUresult => memory::mem_create;
            Cuda fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult => memory::mem_release;
            Cuda fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle,
                flags: u64) -> CUresult => memory::mem_map;
            Cuda fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult => memory::mem_unmap;
            Cuda fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult => memory::mem_address_free;
            Cuda fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void)
                -> CUresult => memory::mem_retain_allocation_handle;
            Cuda fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult
                => memory::array_create;
            Cuda fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult
                => memory::array_3d_create;
            Cuda fn cuArrayDestroy(array: CUarray) -> CUresult => memory::array_destroy;
            Cuda fn cuMipmappedArrayCreate(array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR,
                levels: c_uint) -> CUresult => memory::mipmapped_array_create;
            Cuda fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult => memory::mipmapped_array_destroy;
            Cuda fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult
                => context::ctx_create_v2;
            Cuda fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint,
                dev: CUdevice) -> CUresult => context::ctx_create_v3;
            Cuda fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice)
                -> CUresult => context::ctx_create_v4;
            Cuda fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult => context::ctx_destroy;
            // The device-malloc heap is device memory (see hooks::context::ctx_set_limit).
            Cuda fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult => context::ctx_set_limit;
            Cuda fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult
                => context::primary_ctx_retain;
            Cuda fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult => context::primary_ctx_release;
            Cuda fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult => context::primary_ctx_reset;

            // What the driver places by itself for a module or library (its code and static
            // data; a kernel's local memory) is priced before the call (memory::driver_sized::placed).
            Cuda fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult => module::module_load;
            Cuda fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult
                => module::module_load_data;
            Cuda fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, num_options: c_uint,
                options: *mut c_void, option_values: *mut *mut c_void) -> CUresult => module::module_load_data_ex;
            Cuda fn cuModuleLoadFatBinary(module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult
                => module::module_load_fat_binary;
            Cuda fn cuModuleUnload(module: CUmodule) -> CUresult => module::module_unload;
            Cuda fn cuModuleGetFunction(func: *mut CUfunction, module: CUmodule, name: *const c_char) -> CUresult
                => module::module_get_function;
            Cuda fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_void,
                jit_option_values: *mut *mut c_void, num_jit_options: c_uint, library_options: *mut c_void,
                library_option_values: *mut *mut c_void, num_library_options: c_uint) -> CUresult
                => module::library_load_data;
            Cuda fn cuLibraryLoadFromFile(library: *mut CUlibrary, file_name: *const c_char,
                jit_options: *mut c_void, jit_option_values: *mut *mut c_void, num_jit_options: c_uint,
                library_options: *mut c_void, library_option_values: *mut *mut c_void,
                num_library_options: c_uint) -> CUresult => module::library_load_from_file;
            Cuda fn cuLibraryUnload(library: CUlibrary) -> CUresult => module::library_unload;
            Cuda fn cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char) -> CUresult
                => module::library_get_kernel;
            Cuda fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) -> CUresult
                => module::kernel_get_function;
            Cuda fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary,
                name: *const c_char) -> CUresult => module::library_get_global;
            Cuda fn cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary) -> CUresult
                => module::library_get_module;

            Cuda fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint,
                bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void)
                -> CUresult => launch::launch_kernel [hot];
            Cuda fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint,
                bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void)
                -> CUresult => launch::launch_kernel [hot];
            Cuda fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
                extra: *mut *mut c_void) -> CUresult => launch::launch_kernel_ex [hot];
            Cuda fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
                extra: *mut *mut c_void) -> CUresult => launch::launch_kernel_ex [hot];
            Cuda fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
                by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult
                => launch::launch_cooperative_kernel [hot];
            Cuda fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
                by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult
                => launch::launch_cooperative_kernel [hot];
            Cuda fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, flags: c_uint)
                -> CUresult => launch::launch_cooperative_kernel_multi_device;
            Cuda fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_launch [hot];
            Cuda fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_launch [hot];
            // CUDA graph memory (see memory::driver_sized::graph_reservations): settled after each
            // call that can change it.
            Cuda fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode,
                log: *mut c_char, log_size: usize) -> CUresult => memory::instantiate;
            Cuda fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode,
                log: *mut c_char, log_size: usize) -> CUresult => memory::instantiate;
            Cuda fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult
                => memory::instantiate_with_flags;
            Cuda fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
                -> CUresult => memory::instantiate_with_params;
            Cuda fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
                -> CUresult => memory::instantiate_with_params;
            Cuda fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult => memory::upload;
            Cuda fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => memory::upload;
            Cuda fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult => memory::exec_destroy;
            Cuda fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult => memory::trim;
            // Stream capture: launches recorded into a graph are billed when the graph runs
            // (throttle::capture), so the launch path needs to know a capture may be open.
            Cuda fn cuStreamBeginCapture(stream: CUstream) -> CUresult => launch::capture_begin;
            Cuda fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult => launch::capture_begin;
            Cuda fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint) -> CUresult => launch::capture_begin_v2;
            Cuda fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_uint) -> CUresult => launch::capture_begin_v2;
            Cuda fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, dependencies: *const CUgraphNode,
                edge_data: *const c_void, count: usize, mode: c_uint) -> CUresult => launch::capture_begin_to_graph;
            Cuda fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph,
                dependencies: *const CUgraphNode, edge_data: *const c_void, count: usize, mode: c_uint) -> CUresult
                => launch::capture_begin_to_graph;
            Cuda fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult => launch::capture_end;
            Cuda fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult => launch::capture_end;
            // Synchronisations: the time one waits teaches the start-up probe
            // (the policy crate's probe) how long the slice's kernels are, until NVML has measured them.
            Cuda fn cuStreamSynchronize(stream: CUstream) -> CUresult => launch::stream_synchronize;
            Cuda fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult => launch::stream_synchronize;
            Cuda fn cuCtxSynchronize() -> CUresult => launch::ctx_synchronize;
            Cuda fn cuEventSynchronize(event: CUevent) -> CUresult => launch::event_synchronize;

            // The legacy unsuffixed entry points: what a binary built against pre-3.2 headers (or
            // with CUDA_FORCE_API_VERSION) links, what dlsym of the bare name finds, and what
            // cuGetProcAddress answers below the version of the suffixed ABI (NVIDIA's own loaders
            // ask for "cuDevicePrimaryCtxRelease" at 7000 and get the v1 function). Same ABI as
            // the suffixed function: the same handler. 32-bit ABI: a `_v1` handler.
            Cuda fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult => query::mem_get_info_v1;
            Cuda fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult => query::device_total_mem_v1;
            Cuda fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult => memory::mem_alloc_v1;
            Cuda fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width_bytes: c_uint, height: c_uint,
                element_size: c_uint) -> CUresult => memory::mem_alloc_pitch_v1;
            Cuda fn cuMemFree(dptr: c_uint) -> CUresult => memory::mem_free_v1;
            Cuda fn cuArrayCreate(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult
                => memory::array_create_v1;
            Cuda fn cuArray3DCreate(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult
                => memory::array_3d_create_v1;
            Cuda fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult => context::ctx_create_v2;
            Cuda fn cuCtxDestroy(ctx: CUcontext) -> CUresult => context::ctx_destroy;
            Cuda fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult => context::primary_ctx_release;
            Cuda fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult => context::primary_ctx_reset;
            Cuda fn cuLaunch(f: CUfunction) -> CUresult => launch::launch [hot];
            Cuda fn cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int) -> CUresult
                => launch::launch_grid [hot];
            Cuda fn cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, stream: CUstream)
                -> CUresult => launch::launch_grid_async [hot];

            Nvml fn nvmlInit_v2() -> nvmlReturn_t => passthrough;
            Nvml fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t => passthrough;
            // The v1 name, which drivers still export for old binaries: without it a fail-closed
            // process could open NVML through it.
            Nvml fn nvmlInit() -> nvmlReturn_t => passthrough;
            Nvml fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t
                => nvml::device_get_memory_info;
            Nvml fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t
                => nvml::device_get_memory_info_v2;
            Nvml fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t => nvml::compute_processes_v1;
            Nvml fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::compute_processes_v2;
            Nvml fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::compute_processes_v3;
            Nvml fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t => nvml::other_processes_v1;
            Nvml fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::other_processes;
            Nvml fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::other_processes;
            Nvml fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t => nvml::other_processes_v1;
            Nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::other_processes;
            Nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint,
                infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::other_processes;
            // The slice's own share, not the card's (which discloses the neighbours).
            Nvml fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t)
                -> nvmlReturn_t => nvml::device_get_utilization_rates;
            Nvml fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t,
                samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, last_seen: u64) -> nvmlReturn_t
                => nvml::process_utilization;
            // nvidia-smi's private table: its process lists, filtered as the public ones.
            Nvml fn nvmlInternalGetExportTable(table: *mut *const c_void, guid: *const c_void) -> nvmlReturn_t
                => nvml::internal_export_table;
        }
        helpers {
            Cuda fn cuCtxGetDevice(*mut CUdevice) -> CUresult;
            Cuda fn cuDeviceGetUuid_v2(*mut CUuuid, CUdevice) -> CUresult;
            Cuda fn cuDeviceGetUuid(*mut CUuuid, CUdevice) -> CUresult;
            Nvml fn nvmlDeviceGetUUID(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
            Nvml fn nvmlDeviceGetIndex(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
            Nvml fn nvmlDeviceGetHandleByUUID(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
            Nvml fn nvmlDeviceGetHandleByIndex_v2(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
            Cuda fn cuDeviceGetCount(*mut c_int) -> CUresult;
            Cuda fn cuStreamGetCtx(CUstream, *mut CUcontext) -> CUresult;
            Cuda fn cuStreamIsCapturing(CUstream, *mut c_uint) -> CUresult;
            Cuda fn cuStreamQuery(CUstream) -> CUresult;
            Cuda fn cuCtxGetDevice_v2(*mut CUdevice, CUcontext) -> CUresult;
            Cuda fn cuCtxPushCurrent_v2(CUcontext) -> CUresult;
            Cuda fn cuCtxPopCurrent_v2(*mut CUcontext) -> CUresult;
            Cuda fn cuMemPoolGetAttribute(CUmemoryPool, c_int, *mut c_void) -> CUresult;
            Cuda fn cuDeviceGetGraphMemAttribute(CUdevice, c_int, *mut c_void) -> CUresult;
            Cuda fn cuCtxGetLimit(*mut usize, c_int) -> CUresult;
            Cuda fn cuDeviceGetAttribute(*mut c_int, c_int, CUdevice) -> CUresult;
            Cuda fn cuFuncGetAttribute(*mut c_int, c_int, CUfunction) -> CUresult;
            Cuda fn cuKernelGetAttribute(*mut c_int, c_int, CUkernel, CUdevice) -> CUresult;
            Cuda fn cuStreamCreate(*mut CUstream, c_uint) -> CUresult;
            Cuda fn cuStreamDestroy_v2(CUstream) -> CUresult;
            Cuda fn cuMemGetAddressRange_v2(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult;
            Cuda fn cuPointerGetAttribute(*mut c_void, c_int, CUdeviceptr) -> CUresult;
        }}
    };
}

macro_rules! hook_exports {
    (
        hooks {
            $( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty
                => $($handler:ident)::+ $([$flag:ident])? ; )*
        }
        helpers {
            $( $hlib:ident fn $hname:ident ( $($hty:ty),* $(,)? ) -> $hret:ty ; )*
        }
    ) => {
        /// The exported wrappers. Unit-test builds keep them mangled so the test binary never
        /// interposes its own `cu*`/`nvml*` symbols.
        #[allow(non_snake_case, clippy::too_many_arguments)]
        pub mod exports {
            use super::*;
            $(
                hook_exports!(@export $lib $name ($($arg: $ty),*) -> $ret
                    => $($handler)::+ ; $($flag)?);
            )*
        }

        /// The cold shells of the `[hot]` exports: the calls their hot path
        /// (`hooks::launch`) does not bill.
        #[allow(non_snake_case, clippy::too_many_arguments)]
        mod shells {
            use super::*;
            $(
                hook_exports!(@shell $lib $name ($($arg: $ty),*) -> $ret
                    => $($handler)::+ ; $($flag)?);
            )*
        }

        /// The hot launches of the `[hot]` exports: the real call of a launch the hot export
        /// billed, and what follows it.
        #[allow(non_snake_case, clippy::too_many_arguments)]
        mod launches {
            use super::*;
            $(
                hook_exports!(@launch $lib $name ($($arg: $ty),*) -> $ret
                    => $($handler)::+ ; $($flag)?);
            )*
        }

        /// Every hooked function: the name -> wrapper table of the dlsym path and the source
        /// of the real-pointer -> wrapper map of the cuGetProcAddress path.
        pub(crate) static HOOKS: [Hook; HOOK_COUNT] = [
            $( Hook {
                name: stringify!($name),
                slot: &SLOTS[SlotId::$name as usize],
                own_export: exports::$name as *const c_void,
                id: SlotId::$name as usize,
            }, )*
        ];

        /// The hook declared under exactly this name.
        pub(crate) fn hook_by_name(name: &str) -> Option<&'static Hook> {
            let id = match name {
                $( stringify!($name) => SlotId::$name, )*
                _ => return None,
            };
            Some(&HOOKS[id as usize])
        }
    };
    // `[hot]` (the launch paths): the hot export (see `hooks::launch`). Once the gate is open
    // for good it runs the handler with `Due::Fast` (it bills, never launches; no panic
    // boundary: nothing on that path can panic), then tail-calls the hot launch (billed) or
    // the cold shell (everything else, and every call before), with the caller's arguments
    // untouched.
    (@export $lib:ident $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty
        => $($handler:ident)::+ ; hot) => {
        #[doc = concat!("The exported `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// The C API's contract for this function: the arguments as its caller must
        /// pass them to the real one (see the handler contract in [`crate::hooks`]).
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            use $crate::hooks::launch::Due;
            let real = $crate::hooks::launch::open_real(&SLOTS[SlotId::$name as usize]);
            let billed = !real.is_null() && {
                // SAFETY: a resolved slot holds this hook's real function, of this signature.
                let real = unsafe { std::mem::transmute::<*mut c_void, signature::$name>(real) };
                // SAFETY: the caller's arguments, unchanged; `Due::Fast` never launches.
                matches!(unsafe { $($handler)::+(real, $($arg,)* Due::Fast) }, Err(Due::Billed))
            };
            // One call through a chosen pointer, not a branch to two calls: LLVM makes it a
            // jump that leaves the caller's stack arguments where they are (with two calls it
            // loads them into saved registers at entry).
            let next: unsafe extern "C" fn($($ty),*) -> $ret =
                if billed { launches::$name } else { shells::$name };
            // SAFETY: both take this export's arguments, unchanged.
            unsafe { next($($arg),*) }
        }
    };
    (@export $lib:ident $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty
        => $($handler:ident)::+ ; $($flag:ident)?) => {
        #[doc = concat!("The exported `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// The C API's contract for this function: the arguments as its caller must
        /// pass them to the real one (see the handler contract in [`crate::hooks`]).
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $crate::ffi_panic_boundary!(Library::$lib.panic_code(), {
                if hook_exports!(@gated $($flag)?) {
                    if let Err(code) = $crate::hooks::lifecycle::admit(Library::$lib) {
                        return code;
                    }
                }
                let Some(real) = real::$name() else {
                    return Library::$lib.missing_code();
                };
                hook_exports!(@call real, [$($arg),*], $($handler)::+ ; $($flag)?)
            })
        }
    };
    // The cold shell of a `[hot]` export: the usual panic boundary, gate and real slot; then
    // the handler with the throttle's whole check (`Due::Check`).
    (@shell $lib:ident $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty
        => $($handler:ident)::+ ; hot) => {
        #[cold]
        #[inline(never)]
        pub(super) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $crate::ffi_panic_boundary!(Library::$lib.panic_code(), {
                if let Err(code) = $crate::hooks::lifecycle::admit(Library::$lib) {
                    return code;
                }
                let Some(real) = real::$name() else {
                    return Library::$lib.missing_code();
                };
                // SAFETY: the handler takes the real function and the caller's arguments
                // unchanged; the caller upholds the C API's contract for them.
                unsafe { $($handler)::+(real, $($arg,)* $crate::hooks::launch::Due::Check) }
                    .unwrap_or(Library::$lib.panic_code())
            })
        }
    };
    (@shell $lib:ident $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty
        => $($handler:ident)::+ ; $($flag:ident)?) => {};
    // The hot launch of a `[hot]` export: its own function, so that neither it nor the hot
    // export keeps the caller's stack arguments in saved registers (see `hooks::launch`).
    (@launch $lib:ident $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty
        => $($handler:ident)::+ ; hot) => {
        #[inline(never)]
        pub(super) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            let real = SLOTS[SlotId::$name as usize].resolved();
            // SAFETY: the hot export jumps here only after it found this slot resolved, and a
            // resolved slot never changes: `real` is this hook's real function.
            let real = unsafe { std::mem::transmute::<*mut c_void, signature::$name>(real) };
            // SAFETY: the caller's arguments, unchanged; billed by the hot export.
            unsafe { $($handler)::+(real, $($arg,)* $crate::hooks::launch::Due::Billed) }
                .unwrap_or(Library::$lib.panic_code())
        }
    };
    (@launch $lib:ident $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty
        => $($handler:ident)::+ ; $($flag:ident)?) => {};
    // `[open]`: answers even in a fail-closed process (see `refusal`); everything else
    // passes the gate first.
    (@gated open) => { false };
    (@gated $($flag:ident)?) => { true };
    (@call $real:ident, [$($a:ident),*], $($handler:ident)::+ ; open) => {
        hook_exports!(@call $real, [$($a),*], $($handler)::+ ;)
    };
    (@call $real:ident, [$($a:ident),*], passthrough ;) => {
        // SAFETY: the caller's arguments go unchanged to the real function of the same
        // signature; the caller upholds the C API's contract.
        unsafe { $real($($a),*) }
    };
    (@call $real:ident, [$($a:ident),*], $($handler:ident)::+ ;) => {
        $crate::hooks::nesting::outermost(
            // SAFETY: handlers take the real function and the caller's arguments unchanged;
            // the caller upholds the C API's contract for them.
            || unsafe { $($handler)::+($real, $($a),*) },
            // Called back from inside another hook's driver call on this thread (a driver that
            // calls its own exports): the outer hook accounts for it; see `nesting`.
            // SAFETY: as for pass-through.
            || unsafe { $real($($a),*) },
        )
    };
}

use crate::hooks::{context, launch, lifecycle, memory, module, nvml, proc_address, query};

hook_table!(hook_exports);

/// Pure core of the cuGetProcAddress mapping: the wrapper whose real function is exactly
/// `real`, by pointer identity (so the driver's choice of ABI version and stream semantics is
/// kept), or `real` itself for everything we do not hook.
pub(crate) fn map_by_identity(
    real: *mut c_void,
    table: impl IntoIterator<Item = (*mut c_void, *const c_void)>,
) -> *mut c_void {
    table
        .into_iter()
        .find(|(known_real, _)| *known_real == real)
        .map_or(real, |(_, wrapper)| wrapper as *mut c_void)
}

static CUDA_SLOTS_RESOLVED: AtomicBool = AtomicBool::new(false);

/// The wrapper for a real CUDA function pointer handed out by the real cuGetProcAddress.
/// Resolves every CUDA slot once so the map is complete; hooks the real library lacks have no
/// real pointer and so are never handed out.
pub(crate) fn cuda_wrapper_for_real_pointer(real: *mut c_void) -> *mut c_void {
    if real.is_null() {
        return real;
    }
    if !CUDA_SLOTS_RESOLVED.load(Ordering::Acquire) {
        for hook in HOOKS.iter().filter(|h| h.library() == Library::Cuda) {
            let _ = hook.slot.get();
        }
        CUDA_SLOTS_RESOLVED.store(true, Ordering::Release);
    }
    map_by_identity(
        real,
        HOOKS
            .iter()
            .filter(|h| h.library() == Library::Cuda)
            .filter_map(|h| h.slot.peek().map(|p| (p, h.wrapper()))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_is_found_by_its_exact_name_and_points_at_its_own_export() {
        for (index, hook) in HOOKS.iter().enumerate() {
            let found = hook_by_name(hook.name).expect("declared name is found");
            assert!(std::ptr::eq(found, &HOOKS[index]));
            assert_eq!(hook.slot.name(), hook.name);
            assert!(!hook.wrapper().is_null());
            assert_eq!(hook.id, index);
        }
        let mut wrappers: Vec<_> = HOOKS.iter().map(|h| h.wrapper() as usize).collect();
        wrappers.sort_unstable();
        wrappers.dedup();
        assert_eq!(wrappers.len(), HOOK_COUNT, "each hook has its own wrapper");
    }

    #[test]
    fn cu_prefixed_names_outside_the_table_are_not_hooked() {
        for name in [
            "cudnnCreate",
            "cublasCreate_v2",
            "curl_easy_init",
            "cuMemAlloc_v1",  // no such symbol: the 32-bit ABI is the bare name
            "cuMemAllocHost", // not cuMemAlloc's family
            "cuLaunchGridAsync_ptsz",
            "cuInit_",
            "cuinit",
            "cuDeviceGetUuid", // a helper, not a hook
            "nvmlShutdown",
            "cu",
            "",
        ] {
            assert!(hook_by_name(name).is_none(), "{name} must not be hooked");
        }
        assert_eq!(
            hook_by_name("cuMemAlloc_v2").unwrap().library(),
            Library::Cuda
        );
        assert_eq!(
            hook_by_name("nvmlInit_v2").unwrap().library(),
            Library::Nvml
        );
    }

    #[test]
    fn a_wrapper_whose_real_function_is_missing_answers_not_supported() {
        // The unit-test process has no driver libraries, like a driver too old for a hook.
        // SAFETY: NUL-terminated literals; NOLOAD never loads anything.
        let cuda_loaded =
            !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
                .is_null();
        if cuda_loaded
            || !matches!(
                crate::hooks::lifecycle::state(),
                crate::session::state::State::PassThrough
            )
        {
            return;
        }
        let mut pointer = 0;
        // SAFETY: valid out-pointer; the wrapper must not reach any driver.
        let code = unsafe { exports::cuMemAllocAsync(&mut pointer, 1, std::ptr::null_mut()) };
        assert_eq!(code, result::CUDA_ERROR_NOT_SUPPORTED);
        // SAFETY: as above.
        let code = unsafe { exports::nvmlInit_v2() };
        if Library::Nvml.loaded_handle().is_null() {
            assert_eq!(code, ret::NVML_ERROR_FUNCTION_NOT_FOUND);
        }
    }

    #[test]
    fn proc_address_mapping_is_by_pointer_identity() {
        let real_a = 0x1000 as *mut c_void;
        let real_b = 0x2000 as *mut c_void;
        let wrap_a = 0x9000 as *const c_void;
        let table = [(real_a, wrap_a)];
        assert_eq!(map_by_identity(real_a, table), wrap_a as *mut c_void);
        assert_eq!(
            map_by_identity(real_b, table),
            real_b,
            "unhooked pointer stays real"
        );
        assert_eq!(
            map_by_identity(std::ptr::null_mut(), table),
            std::ptr::null_mut()
        );
    }

    #[test]
    fn legacy_unsuffixed_entry_points_are_hooked() {
        for name in [
            "cuMemAlloc",
            "cuMemAllocPitch",
            "cuMemFree",
            "cuMemGetInfo",
            "cuDeviceTotalMem",
            "cuArrayCreate",
            "cuArray3DCreate",
            "cuCtxCreate",
            "cuCtxDestroy",
            "cuDevicePrimaryCtxRelease",
            "cuDevicePrimaryCtxReset",
            "cuLaunch",
            "cuLaunchGrid",
            "cuLaunchGridAsync",
        ] {
            let hook = hook_by_name(name).unwrap_or_else(|| panic!("{name} is hooked"));
            assert_eq!(hook.library(), Library::Cuda, "{name}");
            assert_eq!(hook.slot.name(), name, "{name}: its own real slot");
        }
    }

    #[test]
    fn a_legacy_pointer_from_cu_get_proc_address_maps_to_its_own_wrapper() {
        // Pretend the driver resolved every CUDA slot to a distinct address: the v1 answer
        // (cuGetProcAddress below 3020) maps to the v1 wrapper, the v2 answer to the v2 one.
        let table = || {
            HOOKS
                .iter()
                .enumerate()
                .filter(|(_, h)| h.library() == Library::Cuda)
                .map(|(i, h)| ((0x10_0000 + i * 16) as *mut c_void, h.wrapper()))
        };
        let fake_real = |name: &str| {
            let index = HOOKS.iter().position(|h| h.name == name).unwrap();
            (0x10_0000 + index * 16) as *mut c_void
        };
        for (v1, v2) in [
            ("cuMemAlloc", "cuMemAlloc_v2"),
            ("cuMemFree", "cuMemFree_v2"),
            ("cuCtxDestroy", "cuCtxDestroy_v2"),
            ("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"),
        ] {
            let mapped_v1 = map_by_identity(fake_real(v1), table());
            let mapped_v2 = map_by_identity(fake_real(v2), table());
            assert_eq!(
                mapped_v1,
                hook_by_name(v1).unwrap().wrapper() as *mut c_void
            );
            assert_eq!(
                mapped_v2,
                hook_by_name(v2).unwrap().wrapper() as *mut c_void
            );
            assert_ne!(mapped_v1, mapped_v2, "{v1}: each ABI keeps its own wrapper");
        }
    }

    #[test]
    fn launch_and_memory_families_including_ptsz_are_registered() {
        for name in [
            "cuLaunchKernel_ptsz",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel_ptsz",
            "cuGraphLaunch_ptsz",
            "cuGraphUpload_ptsz",
            "cuStreamBeginCapture_v2_ptsz",
            "cuStreamBeginCaptureToGraph",
            "cuStreamEndCapture_ptsz",
            "cuGraphInstantiateWithParams_ptsz",
            "cuGraphExecDestroy",
            "cuDeviceGraphMemTrim",
            "cuMemAllocAsync_ptsz",
            "cuMemFreeAsync_ptsz",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemAdvise_v2",
            "cuMemPrefetchAsync_v2_ptsz",
            "cuMemPrefetchBatchAsync",
            "cuMemPoolCreate",
            "cuDeviceGetDefaultMemPool",
            "cuDeviceGetMemPool",
            "cuDeviceSetMemPool",
            "cuMemCreate",
            "cuMipmappedArrayCreate",
            "cuCtxCreate_v4",
            "cuCtxSetLimit",
            "cuModuleLoadData",
            "cuModuleLoadFatBinary",
            "cuLibraryLoadData",
            "cuModuleGetFunction",
            "cuLibraryGetKernel",
            "cuKernelGetFunction",
            "cuLibraryGetGlobal",
            "cuModuleUnload",
            "nvmlDeviceGetComputeRunningProcesses_v3",
        ] {
            assert!(hook_by_name(name).is_some(), "{name}");
        }
    }
}
