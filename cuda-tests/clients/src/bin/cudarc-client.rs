//! `cudarc-client`: reaches the driver through the `cudarc` crate (dynamic loading: it
//! `dlopen`s the first of its candidate names that loads, `libcuda.so` then ... then
//! `libcuda.so.1`, all searched on LD_LIBRARY_PATH, and `dlsym`s each function on first use),
//! using cudarc's own API: `CudaContext`, `result::*` for allocation, modules and launches,
//! and `sys::*` where cudarc has no wrapper. Prints the same JSON as the other clients.

use cuda_clients::scenario::Gpu;
use cuda_clients::{AllocPath, Allocation, CUresult, ContextMode, Fail, LaunchPath, Res, VmmOp};
use cudarc::driver::{result, sys, CudaContext, DriverError};
use gpuslice_abi::cuda as abi;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex};

/// cudarc's errors as the scenarios' `Fail`. cudarc's `CUresult` is a Rust enum, so its
/// discriminant is the driver's code.
fn cu<T>(r: Result<T, DriverError>) -> Res<T> {
    r.map_err(|e| Fail::Cu(e.0 as u32))
}

struct Cudarc {
    /// Contexts by ordinal, made on first use: primary (`CudaContext::new`), or with
    /// `CLIENT_CONTEXT=created` non-primary (`CudaContext::new_non_primary`, which calls
    /// cuCtxCreate_v4). Kept until `destroy_context`, else for the process lifetime;
    /// dropping one releases the primary context or destroys the created one, which frees
    /// its memory.
    contexts: Mutex<Vec<Option<Arc<CudaContext>>>>,
    /// More references to primary contexts (`retain_primary`: `CudaContext::new` again, one
    /// more cuDevicePrimaryCtxRetain each), kept like `contexts`.
    retained: Mutex<Vec<Arc<CudaContext>>>,
    /// References a reset kept (see `reset_primary`), released by `release_primary`.
    stale: Mutex<Vec<Arc<CudaContext>>>,
    /// Modules loaded by `load_kernel` stay loaded for the process lifetime.
    modules: Mutex<Vec<u64>>,
}

/// Drops `ctx`, which must be the only reference (no stream or module object of cudarc's
/// holds one): cudarc's Drop runs cuCtxDestroy_v2 or cuDevicePrimaryCtxRelease_v2. cudarc
/// keeps that call's result to itself, so success here means "dropped"; the tests judge the
/// outcome by the card.
fn drop_last_reference(ctx: Arc<CudaContext>) -> Res<()> {
    match Arc::try_unwrap(ctx) {
        Ok(ctx) => {
            drop(ctx);
            Ok(())
        }
        Err(_) => Err(Fail::Cu(abi::result::CUDA_ERROR_CONTEXT_ALREADY_IN_USE)),
    }
}

/// A symbol from cudarc's own library handle, for calls whose arguments its typed wrappers
/// cannot express (an out-of-range error code would be an invalid enum value).
fn raw<T: Copy>(name: &str) -> Option<T> {
    // SAFETY: culib() is cudarc's dlopen'd driver; the caller names T as the symbol's
    // signature.
    unsafe { sys::culib().get::<T>(name.as_bytes()).ok().map(|s| *s) }
}

impl Cudarc {
    fn attribute(attribute: i32) -> Option<sys::CUdevice_attribute> {
        use sys::CUdevice_attribute as A;
        Some(match attribute {
            abi::attr::MULTIPROCESSOR_COUNT => A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            abi::attr::MAX_THREADS_PER_MULTIPROCESSOR => {
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
            }
            abi::attr::COMPUTE_CAPABILITY_MAJOR => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            abi::attr::COMPUTE_CAPABILITY_MINOR => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            abi::attr::MEMORY_POOLS_SUPPORTED => A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            _ => return None,
        })
    }
}

impl Gpu for Cudarc {
    fn client(&self) -> &'static str {
        "cudarc"
    }

    fn code_name(&self, code: CUresult) -> String {
        type GetName = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;
        if let Some(get_name) = raw::<GetName>("cuGetErrorName") {
            let mut text: *const c_char = std::ptr::null();
            // SAFETY: cuGetErrorName writes a pointer to a static string or fails.
            if unsafe { get_name(code, &mut text) } == 0 && !text.is_null() {
                // SAFETY: the driver returned a static NUL-terminated string.
                return unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        abi::result::name(code)
            .map(str::to_string)
            .unwrap_or_else(|| format!("CUresult({code})"))
    }

    fn init(&self) -> Res<()> {
        cu(result::init())
    }

    fn driver_version(&self) -> Res<i32> {
        let mut v = 0;
        // SAFETY: v is a valid out-pointer.
        cu(unsafe { sys::cuDriverGetVersion(&mut v) }.result())?;
        Ok(v)
    }

    fn device_count(&self) -> Res<i32> {
        cu(CudaContext::device_count())
    }

    fn device(&self, ordinal: i32) -> Res<i32> {
        cu(result::device::get(ordinal))
    }

    fn device_name(&self, dev: i32) -> Res<String> {
        cu(result::device::get_name(dev))
    }

    fn device_uuid(&self, dev: i32) -> Res<[u8; 16]> {
        cu(result::device::get_uuid(dev)).map(|u| u.bytes.map(|b| b as u8))
    }

    fn device_total_mem(&self, dev: i32) -> Res<usize> {
        // SAFETY: dev is a device handle (or an invalid one, which the driver rejects).
        cu(unsafe { result::device::total_mem(dev) })
    }

    fn device_attribute(&self, dev: i32, attribute: i32) -> Res<i32> {
        let attribute =
            Self::attribute(attribute).ok_or(Fail::Cu(abi::result::CUDA_ERROR_INVALID_VALUE))?;
        // SAFETY: plain query with a valid attribute enum.
        cu(unsafe { result::device::get_attribute(dev, attribute) })
    }

    fn context(&self, dev: i32) -> Res<()> {
        let ordinal = dev as usize;
        let mut contexts = self.contexts.lock().expect("context lock");
        if contexts.len() <= ordinal {
            contexts.resize(ordinal + 1, None);
        }
        match &contexts[ordinal] {
            // Another thread made it: bind it here too (contexts are per-thread current).
            Some(ctx) => cu(ctx.bind_to_thread()),
            None => {
                let ctx = match ContextMode::current() {
                    ContextMode::Primary => cu(CudaContext::new(ordinal))?,
                    ContextMode::Created => cu(CudaContext::new_non_primary(ordinal, 0))?,
                };
                contexts[ordinal] = Some(ctx);
                Ok(())
            }
        }
    }

    fn destroy_context(&self, dev: i32) -> Res<()> {
        let ctx = self
            .contexts
            .lock()
            .expect("context lock")
            .get_mut(dev as usize)
            .and_then(Option::take)
            .ok_or(Fail::Cu(abi::result::CUDA_ERROR_INVALID_CONTEXT))?;
        drop_last_reference(ctx)
    }

    fn retain_primary(&self, dev: i32) -> Res<()> {
        let ctx = cu(CudaContext::new(dev as usize))?;
        self.retained.lock().expect("retained lock").push(ctx);
        Ok(())
    }

    fn reset_primary(&self, dev: i32) -> Res<()> {
        // cudarc has no wrapper for the reset; its sys binding is the driver's symbol.
        let mut contexts = self.contexts.lock().expect("context lock");
        let mut retained = self.retained.lock().expect("retained lock");
        // SAFETY: by-value call with a device handle (an invalid one is rejected).
        cu(unsafe { sys::cuDevicePrimaryCtxReset_v2(dev) }.result())?;
        // The reset ended the context but kept its references: cudarc's objects for it move
        // to `stale`, where each drop (cudarc's Drop: one cuDevicePrimaryCtxRelease_v2) is
        // `release_primary`, as the other clients release by hand.
        let mut stale = self.stale.lock().expect("stale lock");
        stale.extend(contexts.get_mut(dev as usize).and_then(Option::take));
        let (of_dev, others): (Vec<_>, Vec<_>) =
            retained.drain(..).partition(|ctx| ctx.cu_device() == dev);
        *retained = others;
        stale.extend(of_dev);
        Ok(())
    }

    fn release_primary(&self, dev: i32) -> Res<()> {
        // References the reset kept first, then the one `context` took since.
        let kept = {
            let mut stale = self.stale.lock().expect("stale lock");
            let index = stale.iter().position(|ctx| ctx.cu_device() == dev);
            index.map(|i| stale.swap_remove(i))
        };
        let ctx = kept
            .or_else(|| {
                let mut contexts = self.contexts.lock().expect("context lock");
                contexts.get_mut(dev as usize).and_then(Option::take)
            })
            .ok_or(Fail::Cu(abi::result::CUDA_ERROR_INVALID_CONTEXT))?;
        drop_last_reference(ctx)
    }

    fn mem_get_info(&self) -> Res<(usize, usize)> {
        cu(result::mem_get_info())
    }

    fn alloc(&self, path: AllocPath, size: usize) -> Res<Allocation> {
        let mut a = Allocation {
            path,
            size,
            ptr: 0,
            handle: 0,
            stream: 0,
        };
        let null = std::ptr::null_mut();
        // SAFETY: (whole block) allocation calls with valid out-pointers and descriptors built
        // from the abi crate's layouts, which tests/layout.rs checks against cudarc's.
        unsafe {
            match path {
                AllocPath::Alloc => a.ptr = cu(result::malloc_sync(size))?,
                AllocPath::Managed => {
                    a.ptr = cu(result::malloc_managed(
                        size,
                        sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL,
                    ))?
                }
                AllocPath::Async => {
                    a.ptr = cu(result::malloc_async(null, size))?;
                    cu(result::stream::synchronize(null))?;
                }
                AllocPath::Pool => {
                    let props = cuda_clients::driver::pool_props(cuda_clients::pool_device());
                    let pool = cu(result::mem_pool::create(
                        (&props as *const abi::CUmemPoolProps).cast(),
                    ))?;
                    a.handle = pool as u64;
                    let r = cu(result::mem_pool::alloc_async(pool, size, null))
                        .and_then(|p| cu(result::stream::synchronize(null)).map(|_| p));
                    match r {
                        Ok(p) => a.ptr = p,
                        Err(e) => {
                            let _ = result::mem_pool::destroy(pool);
                            return Err(e);
                        }
                    }
                }
                AllocPath::Pitch => {
                    let width = size.clamp(1, 1 << 20);
                    let height = size.div_ceil(width).max(1);
                    let mut pitch = 0;
                    cu(sys::cuMemAllocPitch_v2(&mut a.ptr, &mut pitch, width, height, 4).result())?;
                }
                AllocPath::Vmm => {
                    let prop = cuda_clients::driver::vmm_prop(0);
                    let prop_ptr = (&prop as *const abi::CUmemAllocationProp).cast();
                    let mut granularity = 0;
                    cu(sys::cuMemGetAllocationGranularity(
                        &mut granularity,
                        prop_ptr,
                        sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                    )
                    .result())?;
                    let rounded = size.div_ceil(granularity.max(1)) * granularity.max(1);
                    a.size = rounded;
                    cu(sys::cuMemCreate(&mut a.handle, rounded, prop_ptr, 0).result())?;
                    let mapped =
                        cu(sys::cuMemAddressReserve(&mut a.ptr, rounded, 0, 0, 0).result())
                            .and_then(|_| {
                                cu(sys::cuMemMap(a.ptr, rounded, 0, a.handle, 0).result())
                                    .inspect_err(|_| {
                                        let _ = sys::cuMemAddressFree(a.ptr, rounded);
                                    })
                            });
                    if let Err(e) = mapped {
                        let _ = sys::cuMemRelease(a.handle);
                        return Err(e);
                    }
                    let access = abi::CUmemAccessDesc {
                        location: prop.location,
                        flags: abi::vmm::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                    };
                    cu(sys::cuMemSetAccess(
                        a.ptr,
                        rounded,
                        (&access as *const abi::CUmemAccessDesc).cast(),
                        1,
                    )
                    .result())?;
                }
                AllocPath::Array => {
                    let (w, h) = cuda_clients::driver::array_dims(size);
                    let desc = abi::CUDA_ARRAY_DESCRIPTOR {
                        Width: w,
                        Height: h,
                        Format: cuda_clients::ARRAY_FORMAT_U8,
                        NumChannels: 1,
                    };
                    let mut arr: sys::CUarray = std::ptr::null_mut();
                    cu(sys::cuArrayCreate_v2(
                        &mut arr,
                        (&desc as *const abi::CUDA_ARRAY_DESCRIPTOR).cast(),
                    )
                    .result())?;
                    a.ptr = arr as u64;
                }
                AllocPath::Array3d => {
                    let desc = cuda_clients::driver::array3d_desc(size);
                    let mut arr: sys::CUarray = std::ptr::null_mut();
                    cu(sys::cuArray3DCreate_v2(
                        &mut arr,
                        (&desc as *const abi::CUDA_ARRAY3D_DESCRIPTOR).cast(),
                    )
                    .result())?;
                    a.ptr = arr as u64;
                }
                AllocPath::Mipmap => {
                    let (w, h) = cuda_clients::driver::array_dims(size);
                    let desc = abi::CUDA_ARRAY3D_DESCRIPTOR {
                        Width: w,
                        Height: h,
                        Depth: 0,
                        Format: cuda_clients::ARRAY_FORMAT_U8,
                        NumChannels: 1,
                        Flags: 0,
                    };
                    let mut arr: sys::CUmipmappedArray = std::ptr::null_mut();
                    cu(sys::cuMipmappedArrayCreate(
                        &mut arr,
                        (&desc as *const abi::CUDA_ARRAY3D_DESCRIPTOR).cast(),
                        1,
                    )
                    .result())?;
                    a.ptr = arr as u64;
                }
            }
        }
        Ok(a)
    }

    fn free(&self, a: &Allocation) -> Res<()> {
        let null = std::ptr::null_mut();
        // SAFETY: frees exactly what `alloc` made on the same path.
        unsafe {
            match a.path {
                AllocPath::Alloc | AllocPath::Pitch | AllocPath::Managed => {
                    cu(result::free_sync(a.ptr))
                }
                AllocPath::Async => {
                    cu(result::free_async(a.ptr, null))?;
                    cu(result::stream::synchronize(null))
                }
                AllocPath::Pool => {
                    cu(result::free_async(a.ptr, null))?;
                    cu(result::stream::synchronize(null))?;
                    cu(result::mem_pool::destroy(a.handle as sys::CUmemoryPool))
                }
                AllocPath::Vmm => {
                    cu(sys::cuMemUnmap(a.ptr, a.size).result())?;
                    cu(sys::cuMemAddressFree(a.ptr, a.size).result())?;
                    cu(sys::cuMemRelease(a.handle).result())
                }
                AllocPath::Array | AllocPath::Array3d => {
                    cu(sys::cuArrayDestroy(a.ptr as sys::CUarray).result())
                }
                AllocPath::Mipmap => {
                    cu(sys::cuMipmappedArrayDestroy(a.ptr as sys::CUmipmappedArray).result())
                }
            }
        }
    }

    fn vmm(&self, op: VmmOp) -> Res<u64> {
        // cudarc wraps none of these; its sys bindings are the driver's symbols (dlsym).
        let prop = cuda_clients::driver::vmm_prop(0);
        let prop_ptr = (&prop as *const abi::CUmemAllocationProp).cast();
        let mut out = 0u64;
        // SAFETY: by-value arguments and pointers to locals that outlive each call.
        unsafe {
            match op {
                VmmOp::Reserve { size } => {
                    cu(sys::cuMemAddressReserve(&mut out, size, 0, 0, 0).result())?
                }
                VmmOp::AddressFree { ptr, size } => cu(sys::cuMemAddressFree(ptr, size).result())?,
                VmmOp::Create { size } => {
                    cu(sys::cuMemCreate(&mut out, size, prop_ptr, 0).result())?
                }
                VmmOp::Map { ptr, size, handle } => {
                    cu(sys::cuMemMap(ptr, size, 0, handle, 0).result())?
                }
                VmmOp::SetAccess { ptr, size } => {
                    let access = abi::CUmemAccessDesc {
                        location: prop.location,
                        flags: abi::vmm::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                    };
                    cu(sys::cuMemSetAccess(
                        ptr,
                        size,
                        (&access as *const abi::CUmemAccessDesc).cast(),
                        1,
                    )
                    .result())?
                }
                VmmOp::Unmap { ptr, size } => cu(sys::cuMemUnmap(ptr, size).result())?,
                VmmOp::Release { handle } => cu(sys::cuMemRelease(handle).result())?,
            }
        }
        Ok(out)
    }

    fn pool_destroy(&self, pool: u64) -> Res<()> {
        // SAFETY: a pool handle `alloc` created; destroyed once.
        unsafe { cu(result::mem_pool::destroy(pool as sys::CUmemoryPool)) }
    }

    fn free_async(&self, ptr: u64) -> Res<()> {
        let null = std::ptr::null_mut();
        // SAFETY: a pool pointer `alloc` made, freed once on the default stream.
        unsafe {
            cu(result::free_async(ptr, null))?;
            cu(result::stream::synchronize(null))
        }
    }

    fn synchronize(&self) -> Res<()> {
        cu(result::ctx::synchronize())
    }

    fn load_kernel(&self) -> Res<u64> {
        // SAFETY: SPIN_PTX is NUL-terminated; the module stays loaded (kept in `modules`).
        let module =
            cu(unsafe { result::module::load_data(cuda_clients::SPIN_PTX.as_ptr().cast()) })?;
        self.modules
            .lock()
            .expect("module lock")
            .push(module as u64);
        let name = std::ffi::CString::new(cuda_clients::SPIN_KERNEL).expect("no NUL");
        // SAFETY: module is live.
        let f = cu(unsafe { result::module::get_function(module, name) })?;
        Ok(f as u64)
    }

    fn stream(&self, created: bool) -> Res<u64> {
        if !created {
            return Ok(0);
        }
        cu(result::stream::create(
            result::stream::StreamKind::NonBlocking,
        ))
        .map(|s| s as u64)
    }

    fn stream_synchronize(&self, stream: u64) -> Res<()> {
        // SAFETY: stream is 0 or a stream this client created.
        cu(unsafe { result::stream::synchronize(stream as sys::CUstream) })
    }

    fn launch(
        &self,
        path: LaunchPath,
        func: u64,
        grid: u32,
        block: u32,
        stream: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Vec<Res<()>> {
        let f = func as sys::CUfunction;
        let s = stream as sys::CUstream;
        let mut ns = ns_per_wave;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        let one = |params: &mut [*mut c_void]| -> Res<()> {
            // SAFETY: f is a live function, params[0] points to `ns`, which outlives the
            // launches (the scenario synchronises the stream before returning).
            unsafe {
                match path {
                    LaunchPath::Kernel => cu(result::launch_kernel(
                        f,
                        (grid, 1, 1),
                        (block, 1, 1),
                        0,
                        s,
                        params,
                    )),
                    LaunchPath::Cooperative => cu(result::launch_cooperative_kernel(
                        f,
                        (grid, 1, 1),
                        (block, 1, 1),
                        0,
                        s,
                        params,
                    )),
                    LaunchPath::CooperativeMulti => {
                        let mut entry = sys::CUDA_LAUNCH_PARAMS {
                            function: f,
                            gridDimX: grid,
                            gridDimY: 1,
                            gridDimZ: 1,
                            blockDimX: block,
                            blockDimY: 1,
                            blockDimZ: 1,
                            sharedMemBytes: 0,
                            hStream: s,
                            kernelParams: params.as_mut_ptr(),
                        };
                        cu(sys::cuLaunchCooperativeKernelMultiDevice(&mut entry, 1, 0).result())
                    }
                    LaunchPath::Ex => {
                        let config = sys::CUlaunchConfig {
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
                        cu(sys::cuLaunchKernelEx(
                            &config,
                            f,
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                        .result())
                    }
                    LaunchPath::Graph | LaunchPath::Capture => {
                        unreachable!("graphs are launched below")
                    }
                }
            }
        };
        if path == LaunchPath::Capture {
            return capture(f, grid, block, s, &mut params, count);
        }
        if path != LaunchPath::Graph {
            return (0..count).map(|_| one(&mut params)).collect();
        }
        // SAFETY: graph built from a live function and params valid until after the final
        // synchronisation; destroyed after its launches completed.
        unsafe {
            let mut graph: sys::CUgraph = std::ptr::null_mut();
            if let Err(e) = cu(sys::cuGraphCreate(&mut graph, 0).result()) {
                return vec![Err(e); count.max(1)];
            }
            let node_params = cuda_clients::ffi::KernelNodeParamsV2 {
                v1: abi::CUDA_KERNEL_NODE_PARAMS {
                    func: f.cast(),
                    gridDimX: grid,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: block,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    kernelParams: params.as_mut_ptr(),
                    extra: std::ptr::null_mut(),
                },
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            let mut node: sys::CUgraphNode = std::ptr::null_mut();
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            let built = cu(sys::cuGraphAddKernelNode_v2(
                &mut node,
                graph,
                std::ptr::null(),
                0,
                (&node_params as *const cuda_clients::ffi::KernelNodeParamsV2).cast(),
            )
            .result())
            .and_then(|_| {
                cu(
                    result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0))
                        .map(|e| exec = e),
                )
            });
            let results = match built {
                Err(e) => vec![Err(e); count.max(1)],
                Ok(()) => (0..count)
                    .map(|_| cu(result::graph::launch(exec, s)))
                    .collect(),
            };
            let _ = result::stream::synchronize(s);
            if !exec.is_null() {
                let _ = result::graph::exec_destroy(exec);
            }
            let _ = result::graph::destroy(graph);
            results
        }
    }

    fn set_heap_limit(&self, bytes: usize) -> Result<Res<()>, cuda_clients::scenario::Usage> {
        // cudarc has no wrapper for limits; its sys binding is the driver's symbol.
        // SAFETY: by-value call; the driver checks the current context and the value.
        let r = unsafe { sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, bytes) };
        Ok(cu(r.result()))
    }

    fn graph_with_memory(
        &self,
        size: usize,
        allocs: usize,
        func: u64,
        stream: u64,
        upload: bool,
    ) -> Result<Res<(u64, u64, Res<()>)>, cuda_clients::scenario::Usage> {
        let s = stream as sys::CUstream;
        let mut ns: u64 = 1000;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        // SAFETY: a stream this client created and a live function; the captured pointer is
        // only named to the driver; the graph and exec stay alive (the caller holds them).
        Ok(unsafe {
            (|| {
                use sys::CUstreamCaptureMode_enum::CU_STREAM_CAPTURE_MODE_GLOBAL;
                cu(sys::cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL).result())?;
                let mut ptrs: Vec<sys::CUdeviceptr> = Vec::new();
                let captured = (0..allocs)
                    .try_for_each(|_| {
                        let mut ptr: sys::CUdeviceptr = 0;
                        cu(sys::cuMemAllocAsync(&mut ptr, size, s).result())?;
                        ptrs.push(ptr);
                        Ok(())
                    })
                    .and_then(|_| {
                        cu(sys::cuLaunchKernel(
                            func as sys::CUfunction,
                            1,
                            1,
                            1,
                            32,
                            1,
                            1,
                            0,
                            s,
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                        .result())
                    })
                    .and_then(|_| {
                        ptrs.iter()
                            .try_for_each(|&ptr| cu(sys::cuMemFreeAsync(ptr, s).result()))
                    });
                let mut graph: sys::CUgraph = std::ptr::null_mut();
                let ended = cu(sys::cuStreamEndCapture(s, &mut graph).result());
                captured?;
                ended?;
                let exec = cu(result::graph::instantiate(
                    graph,
                    sys::CUgraphInstantiate_flags(0),
                ))?;
                if upload {
                    cu(sys::cuGraphUpload(exec, s).result())?;
                }
                let launched = cu(result::graph::launch(exec, s));
                cu(result::stream::synchronize(s))?;
                Ok((graph as u64, exec as u64, launched))
            })()
        })
    }

    fn errors(&self) -> Vec<(&'static str, Res<()>)> {
        let mut out = Vec::new();
        let mut d = 0;
        let mut p: u64 = 0;
        let mut bytes: usize = 0;
        let mut total: usize = 0;
        // SAFETY: (whole block) deliberate misuse the driver must reject (null pointers,
        // bad ordinals, calls in the wrong state); every non-null pointer is valid.
        unsafe {
            out.push((
                "device_count_before_init",
                cu(result::device::get_count().map(|_| ())),
            ));
            out.push((
                "device_get_before_init",
                cu(result::device::get(0).map(|_| ())),
            ));
            out.push((
                "mem_alloc_before_init",
                cu(result::malloc_sync(1 << 20).map(|_| ())),
            ));
            out.push(("init", cu(result::init())));
            out.push((
                "device_count_null",
                cu(sys::cuDeviceGetCount(std::ptr::null_mut()).result()),
            ));
            out.push((
                "device_get_null",
                cu(sys::cuDeviceGet(std::ptr::null_mut(), 0).result()),
            ));
            out.push((
                "device_get_bad_ordinal",
                cu(sys::cuDeviceGet(&mut d, 9999).result()),
            ));
            out.push((
                "device_total_mem_bad_device",
                cu(sys::cuDeviceTotalMem_v2(&mut bytes, 9999).result()),
            ));
            out.push((
                "device_name_null",
                cu(sys::cuDeviceGetName(std::ptr::null_mut(), 64, 0).result()),
            ));
            type GetName = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;
            let unknown = match raw::<GetName>("cuGetErrorName") {
                Some(get_name) => {
                    let mut text: *const c_char = std::ptr::null();
                    cuda_clients::check(get_name(123_456, &mut text))
                }
                None => Err(Fail::Missing("cuGetErrorName")),
            };
            out.push(("get_error_name_unknown_code", unknown));
            out.push((
                "mem_alloc_no_context",
                cu(sys::cuMemAlloc_v2(&mut p, 1 << 20).result()),
            ));
            out.push((
                "mem_get_info_no_context",
                cu(sys::cuMemGetInfo_v2(&mut bytes, &mut total).result()),
            ));
            out.push(("context", self.context(0)));
            out.push((
                "mem_get_info_null",
                cu(sys::cuMemGetInfo_v2(std::ptr::null_mut(), std::ptr::null_mut()).result()),
            ));
            out.push((
                "mem_alloc_null",
                cu(sys::cuMemAlloc_v2(std::ptr::null_mut(), 1 << 20).result()),
            ));
            out.push(("mem_alloc_zero", cu(sys::cuMemAlloc_v2(&mut p, 0).result())));
            out.push(("mem_free_unknown", cu(result::free_sync(0xdead_0000))));
            let first = cu(result::malloc_sync(1 << 20)).and_then(|q| {
                p = q;
                cu(result::free_sync(q))
            });
            out.push(("mem_free_first", first));
            out.push(("mem_free_twice", cu(result::free_sync(p))));
        }
        out
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gpu = Cudarc {
        contexts: Mutex::new(Vec::new()),
        retained: Mutex::new(Vec::new()),
        stale: Mutex::new(Vec::new()),
        modules: Mutex::new(Vec::new()),
    };
    let code = cuda_clients::scenario::main_with(&gpu, &args);
    // Exit without running cudarc's context drops: a primary-context release at exit would
    // differ from the other clients, which leave teardown to process exit as applications do.
    std::process::exit(code);
}

/// The capture launch path: `count` launches recorded on `s` (a created stream) by stream
/// capture, the graph instantiated and launched once; one result per captured launch, then
/// the graph launch's. The capture's wall time goes to `CAPTURE_NS`.
fn capture(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    s: sys::CUstream,
    params: &mut [*mut c_void],
    count: usize,
) -> Vec<Res<()>> {
    use sys::CUstreamCaptureMode_enum::CU_STREAM_CAPTURE_MODE_GLOBAL;
    let began = std::time::Instant::now();
    // SAFETY: a stream this client created, a live function, params valid until after the
    // final synchronisation; graph and exec destroyed after the launch completed.
    unsafe {
        if let Err(e) = cu(sys::cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL).result())
        {
            return vec![Err(e)];
        }
        let mut results: Vec<Res<()>> = (0..count)
            .map(|_| {
                cu(result::launch_kernel(
                    f,
                    (grid, 1, 1),
                    (block, 1, 1),
                    0,
                    s,
                    params,
                ))
            })
            .collect();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let ended = cu(sys::cuStreamEndCapture(s, &mut graph).result());
        cuda_clients::CAPTURE_NS.fetch_add(
            began.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Err(e) = ended {
            results.push(Err(e));
            return results;
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        let launched = cu(
            result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)).map(|e| exec = e),
        )
        .and_then(|_| cu(result::graph::launch(exec, s)));
        results.push(launched);
        let _ = result::stream::synchronize(s);
        if !exec.is_null() {
            let _ = result::graph::exec_destroy(exec);
        }
        let _ = result::graph::destroy(graph);
        results
    }
}
