//! The fake GPU's `libcuda.so.1`: every export is a thin shell over `fakegpu::cuda::Cuda`.
//!
//! All exports are declared once, in the `cuda_api!` table below: exported name, the base
//! name `cuGetProcAddress` callers ask for, the CUDA version from which that base name maps
//! to this symbol, and the variant (default, `_ptds`, `_ptsz`). The same table yields the
//! `#[no_mangle]` functions and the proc-address table, whose pointers are the functions
//! themselves, i.e. exactly what `dlsym(handle, "<exported name>")` returns.
//!
//! `cuGetExportTable` serves the CUDA runtime's private tables (see `export_tables`), so
//! NVIDIA's `libcudart` runs on the fake as well as driver API clients and cudarc.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod export_tables;
mod ffi;
mod unsupported;

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
        fn $name:ident [$base:literal, $ver:literal, $variant:ident] ($($arg:ident : $ty:ty),* $(,)?) $body:block
    )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                let r = guard(|| -> R<()> { $body });
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

fn launch_common(
    f: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> R<()> {
    let ns = node_ns(h(f), params, extra);
    let args = wide_args(h(f), params);
    if cooperative {
        cu().launch_cooperative(h(f), grid, block, ns, h(stream), &args)
    } else {
        cu().launch_touching(h(f), grid, block, ns, h(stream), &args)
    }
}

/// The values of a kernel's 64-bit arguments where its image declares them (PTX), for
/// managed memory's residency; none when managed memory has no residency.
fn wide_args(f: u64, params: *mut *mut c_void) -> Vec<u64> {
    if params.is_null() || !cu().managed_on_demand() {
        return Vec::new();
    }
    cu().wide_params(f)
        .into_iter()
        // SAFETY: `kernelParams` holds one pointer per declared parameter (the CUDA API's
        // rule for callers); these point to 8-byte values.
        .filter_map(|i| unsafe {
            let p = *params.add(i);
            (!p.is_null()).then(|| (p as *const u64).read_unaligned())
        })
        .collect()
}

/// The deprecated launches (`cuLaunch`, `cuLaunchGrid[Async]`). Simplified: the old API's
/// per-function state (`cuFuncSetBlockShape`, `cuParamSet*`) is not modelled, so every such
/// launch runs blocks of one thread for the default `ns_per_wave`; the duration formula
/// then makes the grid's size alone decide the kernel's time (v100: 163,840 blocks a wave).
fn launch_legacy(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> R<()> {
    let dim = |d: c_int| u32::try_from(d).map_err(|_| CUDA_ERROR_INVALID_VALUE);
    let grid = [dim(width)?, dim(height)?, 1];
    cu().launch(
        h(f),
        grid,
        [1, 1, 1],
        Some(cu().config.ns_per_wave),
        h(stream),
    )
}

/// A byte count as the pre-3.2 ABI reports it: clamped to 32 bits, never wrapped.
fn clamp_u32(bytes: u64) -> c_uint {
    bytes.min(u64::from(c_uint::MAX)) as c_uint
}

fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> R<()> {
    let c = get(config)?;
    launch_common(
        f,
        [c.gridDimX, c.gridDimY, c.gridDimZ],
        [c.blockDimX, c.blockDimY, c.blockDimZ],
        c.hStream,
        params,
        extra,
        false,
    )
}

/// A kernel's `ns_per_wave`: from its first argument when its image says so (the clients'
/// spin kernel), else `FAKEGPU_NS_PER_WAVE` (the geometry at the configured rate).
fn node_ns(f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) -> Option<u64> {
    let configured = Some(cu().config.ns_per_wave);
    if !cu().reads_ns_param(f) {
        return configured;
    }
    // SAFETY: kernel params come from the caller with the CUDA API's guarantees.
    unsafe { read_ns_per_wave(params, extra) }.or(configured)
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> R<()> {
    if pfn.is_null() || symbol.is_null() || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = cstr(symbol).unwrap_or("");
    let r = lookup(proc_table(), name, version, flags, cu().driver_version());
    trace_lookup(name, version, flags, r);
    let (ptr, st, res) = match r {
        Lookup::Found(p) => (p, CU_GET_PROC_ADDRESS_SUCCESS, Ok(())),
        Lookup::NotFound => (
            0,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            Err(CUDA_ERROR_NOT_FOUND),
        ),
        Lookup::VersionNotSufficient => (
            0,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            Err(CUDA_ERROR_NOT_FOUND),
        ),
    };
    put(pfn, ptr as *mut c_void)?;
    put_opt(status, st);
    res
}

/// `FAKEGPU_TRACE_CALLS=1`: one line per call of an export (name and result).
fn trace_calls() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FAKEGPU_TRACE_CALLS").is_some_and(|v| v != "0"))
}

/// `FAKEGPU_TRACE_PROCS=1`: one line per `cuGetProcAddress` lookup (name, version, flags,
/// answer), how the tables of names each client asks for were made.
fn trace_lookup(name: &str, version: c_int, flags: u64, r: Lookup) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("FAKEGPU_TRACE_PROCS").is_some_and(|v| v != "0")) {
        let answer = match r {
            Lookup::Found(_) => "found",
            Lookup::NotFound => "not-found",
            Lookup::VersionNotSufficient => "version-not-sufficient",
        };
        eprintln!("fakegpu: cuGetProcAddress {name} {version} {flags} {answer}");
    }
}

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_MEMCPY2D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcMemoryType: c_uint,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: *mut c_void,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: c_uint,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: *mut c_void,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}

/// Whether an address is device memory of this process (unified addressing).
fn is_dev(p: CUdeviceptr) -> R<bool> {
    Ok(cu()
        .pointer_info(p)?
        .is_some_and(|i| i.memory_type == CU_MEMORYTYPE_DEVICE))
}

/// A 2D copy, row by row; arrays are not simulated as copy endpoints.
fn memcpy_2d(p: CUDA_MEMCPY2D, stream: Option<CUstream>) -> R<()> {
    if let Some(s) = stream {
        cu().stream_info(h(s))?;
    }
    let side = |ty: c_uint, host: u64, dev: u64| -> R<(u64, bool)> {
        match ty {
            1 => Ok((host, false)),
            2 => Ok((dev, true)),
            4 => Ok((dev, is_dev(dev)?)),
            3 => {
                eprintln!("fakegpu: cuMemcpy2D with a CUDA array is not simulated: CUDA_ERROR_NOT_SUPPORTED");
                Err(CUDA_ERROR_NOT_SUPPORTED)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    let (src, sdev) = side(p.srcMemoryType, p.srcHost as u64, p.srcDevice)?;
    let (dst, ddev) = side(p.dstMemoryType, p.dstHost as u64, p.dstDevice)?;
    if p.WidthInBytes > p.srcPitch.max(p.WidthInBytes)
        || (p.Height > 1 && (p.WidthInBytes > p.srcPitch || p.WidthInBytes > p.dstPitch))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for row in 0..p.Height {
        let s = src + ((p.srcY + row) * p.srcPitch + p.srcXInBytes) as u64;
        let d = dst + ((p.dstY + row) * p.dstPitch + p.dstXInBytes) as u64;
        memcpy(d, ddev, s, sdev, p.WidthInBytes, stream.is_none())?;
    }
    Ok(())
}

fn write_pointer_attr(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
    info: Option<&fakegpu::cuda::runtime_support::PointerInfo>,
) -> R<()> {
    let dev = info.is_some_and(|i| i.memory_type == CU_MEMORYTYPE_DEVICE);
    match attr {
        1 => put(data as *mut CUcontext, hp(info.map_or(0, |i| i.ctx))),
        2 => put(data as *mut c_uint, info.map_or(0, |i| i.memory_type)),
        // Unified addressing: one address for host and device.
        3 => put(
            data as *mut CUdeviceptr,
            if info.is_some() { ptr } else { 0 },
        ),
        4 => match info {
            Some(i) if i.memory_type == CU_MEMORYTYPE_HOST || i.managed => {
                put(data as *mut u64, ptr)
            }
            Some(_) => Err(CUDA_ERROR_INVALID_VALUE),
            None => put(data as *mut u64, 0),
        },
        6 | 10 | 15 => put(data as *mut c_int, 0), // SYNC_MEMOPS, IS_LEGACY_CUDA_IPC_CAPABLE, RDMA
        7 => put(data as *mut u64, info.map_or(0, |i| i.buffer_id)),
        8 => put(data as *mut c_int, info.is_some_and(|i| i.managed) as c_int),
        9 => put(data as *mut c_int, info.map_or(-2, |i| i.dev as c_int)),
        11 => put(data as *mut CUdeviceptr, info.map_or(0, |i| i.base)),
        12 => put(data as *mut usize, info.map_or(0, |i| i.size as usize)),
        13 => put(data as *mut c_int, info.is_some() as c_int),
        14 => put(data as *mut u64, 0), // ALLOWED_HANDLE_TYPES: none
        16 => put(data as *mut c_int, if info.is_some() { 3 } else { 0 }), // ACCESS_FLAGS: read-write
        17 => put(
            data as *mut CUmemoryPool,
            hp(info.and_then(|i| i.pool).unwrap_or(0)),
        ),
        18 => put(data as *mut usize, info.map_or(0, |i| i.size as usize)),
        19 => put(data as *mut CUdeviceptr, info.map_or(0, |i| i.base)),
        20 => put(data as *mut u64, info.map_or(0, |i| i.buffer_id)),
        _ => {
            let _ = dev;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

const LOG_CALLBACK_BASE: u64 = 0x109 << 40;
static LOG_CALLBACKS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(LOG_CALLBACK_BASE);

thread_local! {
    /// The thread's stream capture mode (`cuThreadExchangeStreamCaptureMode`); 0 = GLOBAL.
    static CAPTURE_MODE: std::cell::Cell<c_uint> = const { std::cell::Cell::new(0) };
}

fn capture_info(
    s: CUstream,
    status: *mut c_uint,
    id: *mut c_ulonglong,
    g: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    n: *mut usize,
) -> R<()> {
    if status.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (st, cid, graph) = cu().stream_capture_info(h(s))?;
    put(status, st)?;
    put_opt(id, cid);
    put_opt(g, hp(graph));
    // The fake's captured graphs are a chain: it reports no open dependency list.
    put_opt(deps, std::ptr::null());
    put_opt(edges, std::ptr::null());
    put_opt(n, 0);
    Ok(())
}

/// Host functions run once the stream's earlier work is done: here at enqueue, on the
/// caller's thread, after waiting for it. Not under capture (no host nodes).
fn host_func_after(s: CUstream) -> R<()> {
    if cu().stream_capture_info(h(s))?.0 != 0 {
        eprintln!("fakegpu: cuLaunchHostFunc under stream capture is not simulated: CUDA_ERROR_NOT_SUPPORTED");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    cu().stream_synchronize(h(s))
}

fn location_device(loc: CUmemLocation) -> R<CUdevice> {
    match loc.type_ {
        1 => Ok(loc.id),            // CU_MEM_LOCATION_TYPE_DEVICE
        2..=4 => Ok(CU_DEVICE_CPU), // HOST, HOST_NUMA, HOST_NUMA_CURRENT
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

const CU_DEVICE_CPU: CUdevice = -1;

/// Device of a `cuMem*MemPool` location: device pools only (CU_MEM_ALLOCATION_TYPE_PINNED).
fn pool_location(loc: CUmemLocation, ty: c_int) -> R<CUdevice> {
    if ty != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if loc.type_ != 1 {
        eprintln!("fakegpu: host memory pools are not simulated: CUDA_ERROR_NOT_SUPPORTED");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(loc.id)
}

/// A prefetch or advice over a managed range. With residency (`FAKEGPU_MANAGED_MEMORY=
/// on-demand`) the fake's `managed` model takes it; without, managed memory lives on its
/// device and a valid request (over any device range) has nothing to move.
fn prefetch_or_advise(
    ptr: CUdeviceptr,
    n: usize,
    dev: CUdevice,
    s: Option<CUstream>,
    advice: c_int,
) -> R<()> {
    if cu().managed_on_demand() {
        return match s {
            Some(s) => cu().mem_prefetch(ptr, n as u64, dev, h(s)),
            None => cu().mem_advise(ptr, n as u64, advice, dev),
        };
    }
    if let Some(s) = s {
        cu().stream_info(h(s))?;
    }
    if dev != CU_DEVICE_CPU {
        cu().device_spec(dev)?;
    }
    match cu().pointer_info(ptr)? {
        Some(i) if i.memory_type == CU_MEMORYTYPE_DEVICE && ptr + n as u64 <= i.base + i.size => {
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemRangeGetAttribute`: 4-byte values (`size / 4` of them for the accessed-by list),
/// answered by the fake's managed memory model.
fn range_attribute(data: *mut c_void, size: usize, attribute: c_int, ptr: u64, n: usize) -> R<()> {
    if data.is_null() || size == 0 || !size.is_multiple_of(4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let values = cu().mem_range_attribute(ptr, n as u64, attribute, size / 4)?;
    for (i, value) in values.into_iter().enumerate() {
        // SAFETY: the caller's buffer holds `size` bytes, `size / 4` values.
        unsafe { (data as *mut c_int).add(i).write_unaligned(value) };
    }
    Ok(())
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

/// The blocks per cluster a launch configuration asks for (`CU_LAUNCH_ATTRIBUTE_CLUSTER_
/// DIMENSION`, x * y * z). The fake's kernels carry no compile-time cluster size, so a
/// configuration without one is CUDA_ERROR_INVALID_CLUSTER_SIZE, as the driver API
/// documents for `cuOccupancyMaxActiveClusters`.
///
/// # Safety
/// `c.attrs` must point to `c.numAttrs` readable entries (or be null with none).
unsafe fn cluster_size(c: &CUlaunchConfig) -> R<u32> {
    const CLUSTER_DIMENSION: c_uint = 4;
    const CUDA_ERROR_INVALID_CLUSTER_SIZE: u32 = 912;
    if c.numAttrs > 0 && c.attrs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..c.numAttrs as usize {
        // SAFETY: per the contract, entry i is readable.
        let a = unsafe { *c.attrs.add(i) };
        if a.id == CLUSTER_DIMENSION {
            // The value's first 12 bytes are the x, y and z sizes (three unsigned ints).
            let x = a.value[0] as u32;
            let y = (a.value[0] >> 32) as u32;
            let z = a.value[1] as u32;
            return Ok(x.saturating_mul(y).saturating_mul(z));
        }
    }
    Err(CUDA_ERROR_INVALID_CLUSTER_SIZE)
}

/// Blocks of `block` threads one SM holds at once (threads only; 32 blocks at most).
fn occupancy(f: CUfunction, block: c_int) -> R<c_int> {
    cu().func_attribute(0, h(f))?;
    let per_sm = cu().device_attribute(attr::MAX_THREADS_PER_MULTIPROCESSOR, cu().ctx_device()?)?;
    Ok((per_sm / block).clamp(0, 32))
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

fn error_string(code: CUresult) -> Option<&'static str> {
    Some(match code {
        CUDA_SUCCESS => "no error",
        CUDA_ERROR_INVALID_VALUE => "invalid argument",
        CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
        CUDA_ERROR_NOT_INITIALIZED => "initialization error",
        CUDA_ERROR_DEINITIALIZED => "driver shutting down",
        CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
        CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
        CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
        CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
        CUDA_ERROR_NOT_FOUND => "named symbol not found",
        CUDA_ERROR_NOT_READY => "device not ready",
        CUDA_ERROR_FILE_NOT_FOUND => "file not found",
        CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
        CUDA_ERROR_NO_BINARY_FOR_GPU => "no kernel image is available for execution on the device",
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
            "the provided PTX was compiled with an unsupported toolchain."
        }
        CUDA_ERROR_UNKNOWN => "unknown error",
        _ => return None,
    })
}

/// Static C strings for error names and descriptions.
fn c_static(s: &'static str) -> *const c_char {
    static CACHE: OnceLock<std::sync::Mutex<std::collections::HashMap<&'static str, CString>>> =
        OnceLock::new();
    let mut m = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    m.entry(s)
        .or_insert_with(|| CString::new(s).expect("no NUL in messages"))
        .as_ptr()
}

fn memcpy(dst: u64, dst_dev: bool, src: u64, src_dev: bool, n: usize, sync: bool) -> R<()> {
    cu().memcpy(dst, dst_dev, src, src_dev, n as u64, sync)
}

fn memcpy_async(
    dst: u64,
    dst_dev: bool,
    src: u64,
    src_dev: bool,
    n: usize,
    stream: CUstream,
) -> R<()> {
    cu().stream_info(h(stream))?;
    memcpy(dst, dst_dev, src, src_dev, n, false)
}

fn memset_async(dst: CUdeviceptr, v: u32, elem: u64, n: usize, stream: CUstream) -> R<()> {
    cu().stream_info(h(stream))?;
    cu().memset(dst, v, elem, n as u64)
}

/// The arguments `cuTensorMapEncodeTiled` and `cuTensorMapEncodeIm2col` share.
struct TensorMapCall {
    map: *mut u64,
    data_type: c_uint,
    rank: c_uint,
    addr: *mut c_void,
    dim: *const u64,
    strides: *const u64,
    element_strides: *const u32,
    modes: [c_uint; 4],
}

/// `cuTensorMapEncodeTiled` / `Im2col`: reads the caller's arrays (only once the rank is
/// known to be in range; `shape` reads the rest) and writes the 128-byte map (see
/// `fakegpu::cuda::tensor_map`). Encoding is host-side: the driver must be initialised, no
/// context is needed.
fn encode_tensor_map(c: TensorMapCall, shape: impl FnOnce(usize) -> R<TensorMapShape>) -> R<()> {
    use fakegpu::cuda::tensor_map::{encode, Shape, TensorMapArgs, MAX_RANK, TENSOR_MAP_ALIGN};
    cu().check()?;
    if c.map.is_null() || !(c.map as u64).is_multiple_of(TENSOR_MAP_ALIGN) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let rank = c.rank as usize;
    if !(1..=MAX_RANK).contains(&rank) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dim = ffi::get_array(c.dim, rank)?;
    let strides = ffi::get_array(c.strides, rank - 1)?;
    let element_strides = ffi::get_array(c.element_strides, rank)?;
    let owned = shape(rank)?;
    let shape = match &owned {
        TensorMapShape::Tiled(box_dim) => Shape::Tiled { box_dim },
        TensorMapShape::Im2col(lower, upper, channels, pixels) => Shape::Im2col {
            lower_corner: lower,
            upper_corner: upper,
            channels_per_pixel: *channels,
            pixels_per_column: *pixels,
        },
    };
    let [interleave, swizzle, l2_promotion, oob_fill] = c.modes;
    let words = encode(
        &TensorMapArgs {
            data_type: c.data_type,
            global_address: c.addr as u64,
            global_dim: &dim,
            global_strides: &strides,
            element_strides: &element_strides,
            interleave,
            swizzle,
            l2_promotion,
            oob_fill,
            shape,
        },
        cu().driver_version(),
    )?;
    // SAFETY: a non-null, 64-byte aligned CUtensorMap (128 bytes) of the caller's.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), c.map, words.len()) };
    Ok(())
}

/// The shape arrays of a tensor-map call, copied from the caller.
enum TensorMapShape {
    Tiled(Vec<u32>),
    Im2col(Vec<i32>, Vec<i32>, u32, u32),
}

cuda_api! {
    // ---- init, versions, devices ----
    fn cuInit["cuInit", 2000, Default](flags: c_uint) { cu().init(flags) }
    fn cuDriverGetVersion["cuDriverGetVersion", 2020, Default](v: *mut c_int) {
        put(v, cu().driver_version())
    }
    fn cuDeviceGet["cuDeviceGet", 2000, Default](device: *mut CUdevice, ordinal: c_int) {
        if device.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(device, cu().device_index(ordinal)? as CUdevice)
    }
    fn cuDeviceGetCount["cuDeviceGetCount", 2000, Default](count: *mut c_int) {
        if count.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(count, cu().device_count()?)
    }
    fn cuDeviceGetName["cuDeviceGetName", 2000, Default](name: *mut c_char, len: c_int, dev: CUdevice) {
        let d = cu().device_spec(dev)?;
        put_str(name, len, &d.name)
    }
    fn cuDeviceGetUuid["cuDeviceGetUuid", 9020, Default](uuid: *mut CUuuid, dev: CUdevice) {
        let d = cu().device_spec(dev)?;
        put(uuid, CUuuid { bytes: d.uuid_bytes().map(|b| b as c_char) })
    }
    fn cuDeviceGetUuid_v2["cuDeviceGetUuid", 11040, Default](uuid: *mut CUuuid, dev: CUdevice) {
        let d = cu().device_spec(dev)?;
        put(uuid, CUuuid { bytes: d.uuid_bytes().map(|b| b as c_char) })
    }
    fn cuDeviceGetAttribute["cuDeviceGetAttribute", 2000, Default](pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        if pi.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pi, cu().device_attribute(attrib, dev)?)
    }
    fn cuDeviceGetPCIBusId["cuDeviceGetPCIBusId", 4010, Default](id: *mut c_char, len: c_int, dev: CUdevice) {
        put_str(id, len, &cu().pci_bus_id(dev)?)
    }
    fn cuDeviceGetByPCIBusId["cuDeviceGetByPCIBusId", 4010, Default](dev: *mut CUdevice, id: *const c_char) {
        if dev.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dev, cu().device_by_pci_bus_id(cstr(id)?)?)
    }
    fn cuDeviceTotalMem["cuDeviceTotalMem", 2000, Default](bytes: *mut c_uint, dev: CUdevice) {
        if bytes.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(bytes, clamp_u32(cu().device_spec(dev)?.total_memory))
    }
    fn cuDeviceTotalMem_v2["cuDeviceTotalMem", 3020, Default](bytes: *mut usize, dev: CUdevice) {
        if bytes.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(bytes, cu().device_spec(dev)?.total_memory as usize)
    }
    fn cuDeviceComputeCapability["cuDeviceComputeCapability", 2000, Default](major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
        if major.is_null() || minor.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let d = cu().device_spec(dev)?;
        put(major, d.cc_major as c_int)?;
        put(minor, d.cc_minor as c_int)
    }

    // ---- contexts ----
    fn cuDevicePrimaryCtxRetain["cuDevicePrimaryCtxRetain", 7000, Default](pctx: *mut CUcontext, dev: CUdevice) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().primary_retain(dev)?))
    }
    fn cuDevicePrimaryCtxRelease["cuDevicePrimaryCtxRelease", 7000, Default](dev: CUdevice) { cu().primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2["cuDevicePrimaryCtxRelease", 11000, Default](dev: CUdevice) { cu().primary_release(dev) }
    fn cuDevicePrimaryCtxReset["cuDevicePrimaryCtxReset", 7000, Default](dev: CUdevice) { cu().primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2["cuDevicePrimaryCtxReset", 11000, Default](dev: CUdevice) { cu().primary_reset(dev) }
    fn cuDevicePrimaryCtxGetState["cuDevicePrimaryCtxGetState", 7000, Default](dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        if flags.is_null() || active.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let (f, a) = cu().primary_state(dev)?;
        put(flags, f)?;
        put(active, a as c_int)
    }
    fn cuDevicePrimaryCtxSetFlags["cuDevicePrimaryCtxSetFlags", 7000, Default](dev: CUdevice, flags: c_uint) { cu().primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxSetFlags_v2["cuDevicePrimaryCtxSetFlags", 11000, Default](dev: CUdevice, flags: c_uint) { cu().primary_set_flags(dev, flags) }
    fn cuCtxCreate["cuCtxCreate", 2000, Default](pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().ctx_create(flags, dev)?))
    }
    fn cuCtxCreate_v2["cuCtxCreate", 3020, Default](pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().ctx_create(flags, dev)?))
    }
    fn cuCtxCreate_v3["cuCtxCreate", 11040, Default](pctx: *mut CUcontext, _params: *mut c_void, _num: c_int, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().ctx_create(flags, dev)?))
    }
    fn cuCtxCreate_v4["cuCtxCreate", 12050, Default](pctx: *mut CUcontext, _params: *mut c_void, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().ctx_create(flags, dev)?))
    }
    fn cuCtxDestroy["cuCtxDestroy", 2000, Default](ctx: CUcontext) { cu().ctx_destroy(h(ctx)) }
    fn cuCtxDestroy_v2["cuCtxDestroy", 4000, Default](ctx: CUcontext) { cu().ctx_destroy(h(ctx)) }
    fn cuCtxPushCurrent_v2["cuCtxPushCurrent", 4000, Default](ctx: CUcontext) { cu().ctx_push(h(ctx)) }
    fn cuCtxPopCurrent_v2["cuCtxPopCurrent", 4000, Default](pctx: *mut CUcontext) {
        let c = cu().ctx_pop()?;
        put_opt(pctx, hp(c));
        Ok(())
    }
    fn cuCtxSetCurrent["cuCtxSetCurrent", 4000, Default](ctx: CUcontext) { cu().ctx_set_current(h(ctx)) }
    fn cuCtxGetCurrent["cuCtxGetCurrent", 4000, Default](pctx: *mut CUcontext) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().ctx_get_current()?))
    }
    fn cuCtxGetDevice["cuCtxGetDevice", 2000, Default](device: *mut CUdevice) {
        if device.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(device, cu().ctx_device()?)
    }
    fn cuCtxSynchronize["cuCtxSynchronize", 2000, Default]() { cu().ctx_synchronize() }
    fn cuCtxSetLimit["cuCtxSetLimit", 3010, Default](limit: c_int, value: usize) { cu().ctx_set_limit(limit, value as u64) }
    fn cuCtxGetLimit["cuCtxGetLimit", 3010, Default](value: *mut usize, limit: c_int) {
        if value.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(value, cu().ctx_get_limit(limit)? as usize)
    }
    fn cuCtxGetApiVersion["cuCtxGetApiVersion", 3020, Default](ctx: CUcontext, version: *mut c_uint) {
        if version.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(version, cu().ctx_api_version(h(ctx))?)
    }

    // ---- memory ----
    fn cuMemAlloc["cuMemAlloc", 2000, Default](dptr: *mut c_uint, bytesize: c_uint) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc_legacy(bytesize)?)
    }
    fn cuMemAlloc_v2["cuMemAlloc", 3020, Default](dptr: *mut CUdeviceptr, bytesize: usize) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc(bytesize as u64)?)
    }
    fn cuMemAllocPitch["cuMemAllocPitch", 2000, Default](dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) {
        if dptr.is_null() || pitch.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let (p, pi) = cu().mem_alloc_pitch_legacy(width, height, elem)?;
        put(dptr, p)?;
        put(pitch, pi)
    }
    fn cuMemAllocPitch_v2["cuMemAllocPitch", 3020, Default](dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        if dptr.is_null() || pitch.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let (p, pi) = cu().mem_alloc_pitch(width as u64, height as u64, elem)?;
        put(dptr, p)?;
        put(pitch, pi as usize)
    }
    fn cuMemAllocManaged["cuMemAllocManaged", 6000, Default](dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc_managed(bytesize as u64, flags)?)
    }
    fn cuMemFree["cuMemFree", 2000, Default](dptr: c_uint) { cu().mem_free(dptr.into()) }
    fn cuMemFree_v2["cuMemFree", 3020, Default](dptr: CUdeviceptr) { cu().mem_free(dptr) }
    fn cuMemGetInfo["cuMemGetInfo", 2000, Default](free: *mut c_uint, total: *mut c_uint) {
        if free.is_null() || total.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let (f, t) = cu().mem_get_info()?;
        put(free, clamp_u32(f))?;
        put(total, clamp_u32(t))
    }
    fn cuMemGetInfo_v2["cuMemGetInfo", 3020, Default](free: *mut usize, total: *mut usize) {
        if free.is_null() || total.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let (f, t) = cu().mem_get_info()?;
        put(free, f as usize)?;
        put(total, t as usize)
    }
    fn cuMemGetAddressRange_v2["cuMemGetAddressRange", 3020, Default](pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        let (b, s) = cu().mem_address_range(dptr)?;
        put_opt(pbase, b);
        put_opt(psize, s as usize);
        Ok(())
    }
    fn cuMemAllocHost_v2["cuMemAllocHost", 3020, Default](pp: *mut *mut c_void, bytesize: usize) {
        if pp.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pp, hp(cu().mem_alloc_host(bytesize as u64)?))
    }
    fn cuMemHostAlloc["cuMemHostAlloc", 2020, Default](pp: *mut *mut c_void, bytesize: usize, flags: c_uint) {
        if pp.is_null() || flags & !0xf != 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pp, hp(cu().mem_alloc_host(bytesize as u64)?))
    }
    fn cuMemFreeHost["cuMemFreeHost", 2000, Default](p: *mut c_void) { cu().mem_free_host(h(p)) }
    fn cuMemcpyHtoD_v2["cuMemcpyHtoD", 3020, Default](dst: CUdeviceptr, src: *const c_void, n: usize) { memcpy(dst, true, src as u64, false, n, true) }
    fn cuMemcpyHtoD_v2_ptds["cuMemcpyHtoD", 7000, Ptds](dst: CUdeviceptr, src: *const c_void, n: usize) { memcpy(dst, true, src as u64, false, n, true) }
    fn cuMemcpyDtoH_v2["cuMemcpyDtoH", 3020, Default](dst: *mut c_void, src: CUdeviceptr, n: usize) { memcpy(dst as u64, false, src, true, n, true) }
    fn cuMemcpyDtoH_v2_ptds["cuMemcpyDtoH", 7000, Ptds](dst: *mut c_void, src: CUdeviceptr, n: usize) { memcpy(dst as u64, false, src, true, n, true) }
    fn cuMemcpyDtoD_v2["cuMemcpyDtoD", 3020, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize) { memcpy(dst, true, src, true, n, true) }
    fn cuMemcpyDtoD_v2_ptds["cuMemcpyDtoD", 7000, Ptds](dst: CUdeviceptr, src: CUdeviceptr, n: usize) { memcpy(dst, true, src, true, n, true) }
    fn cuMemcpyHtoDAsync_v2["cuMemcpyHtoDAsync", 3020, Default](dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) { memcpy_async(dst, true, src as u64, false, n, s) }
    fn cuMemcpyHtoDAsync_v2_ptsz["cuMemcpyHtoDAsync", 7000, Ptsz](dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) { memcpy_async(dst, true, src as u64, false, n, s) }
    fn cuMemcpyDtoHAsync_v2["cuMemcpyDtoHAsync", 3020, Default](dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) { memcpy_async(dst as u64, false, src, true, n, s) }
    fn cuMemcpyDtoHAsync_v2_ptsz["cuMemcpyDtoHAsync", 7000, Ptsz](dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) { memcpy_async(dst as u64, false, src, true, n, s) }
    fn cuMemsetD8_v2["cuMemsetD8", 3020, Default](dst: CUdeviceptr, v: c_uchar, n: usize) { cu().memset(dst, v as u32, 1, n as u64) }
    fn cuMemsetD8_v2_ptds["cuMemsetD8", 7000, Ptds](dst: CUdeviceptr, v: c_uchar, n: usize) { cu().memset(dst, v as u32, 1, n as u64) }
    fn cuMemsetD32_v2["cuMemsetD32", 3020, Default](dst: CUdeviceptr, v: c_uint, n: usize) { cu().memset(dst, v, 4, n as u64) }
    fn cuMemsetD32_v2_ptds["cuMemsetD32", 7000, Ptds](dst: CUdeviceptr, v: c_uint, n: usize) { cu().memset(dst, v, 4, n as u64) }
    fn cuMemsetD8Async["cuMemsetD8Async", 3020, Default](dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) { memset_async(dst, v as u32, 1, n, s) }
    fn cuMemsetD8Async_ptsz["cuMemsetD8Async", 7000, Ptsz](dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) { memset_async(dst, v as u32, 1, n, s) }
    fn cuMemsetD32Async["cuMemsetD32Async", 3020, Default](dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) { memset_async(dst, v, 4, n, s) }
    fn cuMemsetD32Async_ptsz["cuMemsetD32Async", 7000, Ptsz](dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) { memset_async(dst, v, 4, n, s) }
    // Stream memory operations write at enqueue (the fake's copies and memsets do too).
    fn cuStreamWriteValue32["cuStreamWriteValue32", 8000, Default](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) { memset_async(addr, v, 4, 1, s) }
    fn cuStreamWriteValue32_ptsz["cuStreamWriteValue32", 8000, Ptsz](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) { memset_async(addr, v, 4, 1, s) }
    fn cuStreamWriteValue32_v2["cuStreamWriteValue32", 11070, Default](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) { memset_async(addr, v, 4, 1, s) }
    fn cuStreamWriteValue32_v2_ptsz["cuStreamWriteValue32", 11070, Ptsz](s: CUstream, addr: CUdeviceptr, v: c_uint, _flags: c_uint) { memset_async(addr, v, 4, 1, s) }

    // ---- arrays ----
    fn cuArrayCreate["cuArrayCreate", 2000, Default](p: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) {
        if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let d = get(desc)?;
        let d3 = CUDA_ARRAY3D_DESCRIPTOR { Width: d.Width as usize, Height: d.Height as usize, Depth: 0, Format: d.Format, NumChannels: d.NumChannels, Flags: 0 };
        put(p, hp(cu().array_create(&d3, None)?))
    }
    fn cuArrayCreate_v2["cuArrayCreate", 3020, Default](p: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) {
        if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let d = get(desc)?;
        let d3 = CUDA_ARRAY3D_DESCRIPTOR { Width: d.Width, Height: d.Height, Depth: 0, Format: d.Format, NumChannels: d.NumChannels, Flags: 0 };
        put(p, hp(cu().array_create(&d3, None)?))
    }
    fn cuArray3DCreate["cuArray3DCreate", 2000, Default](p: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) {
        if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let d = get(desc)?;
        let d3 = CUDA_ARRAY3D_DESCRIPTOR { Width: d.Width as usize, Height: d.Height as usize, Depth: d.Depth as usize, Format: d.Format, NumChannels: d.NumChannels, Flags: d.Flags };
        put(p, hp(cu().array_create(&d3, None)?))
    }
    fn cuArray3DCreate_v2["cuArray3DCreate", 3020, Default](p: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) {
        if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(p, hp(cu().array_create(&get(desc)?, None)?))
    }
    fn cuArrayDestroy["cuArrayDestroy", 2000, Default](a: CUarray) { cu().array_destroy(h(a), false) }
    fn cuMipmappedArrayCreate["cuMipmappedArrayCreate", 5000, Default](p: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) {
        if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(p, hp(cu().array_create(&get(desc)?, Some(levels))?))
    }
    fn cuMipmappedArrayDestroy["cuMipmappedArrayDestroy", 5000, Default](a: CUmipmappedArray) { cu().array_destroy(h(a), true) }

    // ---- stream-ordered allocation and pools ----
    fn cuMemAllocAsync["cuMemAllocAsync", 11020, Default](dptr: *mut CUdeviceptr, size: usize, s: CUstream) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc_async(size as u64, None, h(s))?)
    }
    fn cuMemAllocAsync_ptsz["cuMemAllocAsync", 11020, Ptsz](dptr: *mut CUdeviceptr, size: usize, s: CUstream) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc_async(size as u64, None, h(s))?)
    }
    fn cuMemFreeAsync["cuMemFreeAsync", 11020, Default](dptr: CUdeviceptr, s: CUstream) { cu().mem_free_async(dptr, h(s)) }
    fn cuMemFreeAsync_ptsz["cuMemFreeAsync", 11020, Ptsz](dptr: CUdeviceptr, s: CUstream) { cu().mem_free_async(dptr, h(s)) }
    fn cuMemAllocFromPoolAsync["cuMemAllocFromPoolAsync", 11020, Default](dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc_async(size as u64, Some(h(pool)), h(s))?)
    }
    fn cuMemAllocFromPoolAsync_ptsz["cuMemAllocFromPoolAsync", 11020, Ptsz](dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) {
        if dptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dptr, cu().mem_alloc_async(size as u64, Some(h(pool)), h(s))?)
    }
    fn cuMemPoolCreate["cuMemPoolCreate", 11020, Default](pool: *mut CUmemoryPool, props: *const CUmemPoolProps) {
        if pool.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pool, hp(cu().pool_create(&get(props)?)?))
    }
    fn cuMemPoolDestroy["cuMemPoolDestroy", 11020, Default](pool: CUmemoryPool) { cu().pool_destroy(h(pool)) }
    fn cuDeviceGetDefaultMemPool["cuDeviceGetDefaultMemPool", 11020, Default](pool: *mut CUmemoryPool, dev: CUdevice) {
        if pool.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pool, hp(cu().device_default_pool(dev)?))
    }
    fn cuDeviceGetMemPool["cuDeviceGetMemPool", 11020, Default](pool: *mut CUmemoryPool, dev: CUdevice) {
        if pool.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pool, hp(cu().device_get_pool(dev)?))
    }
    fn cuDeviceSetMemPool["cuDeviceSetMemPool", 11020, Default](dev: CUdevice, pool: CUmemoryPool) { cu().device_set_pool(dev, h(pool)) }
    fn cuMemPoolSetAttribute["cuMemPoolSetAttribute", 11020, Default](pool: CUmemoryPool, attr: c_int, value: *mut c_void) {
        // REUSE_* attributes are ints; the others are cuuint64_t.
        let v = if (1..=3).contains(&attr) { get(value as *const c_int)? as u64 } else { get(value as *const u64)? };
        cu().pool_set_attribute(h(pool), attr, v)
    }
    fn cuMemPoolGetAttribute["cuMemPoolGetAttribute", 11020, Default](pool: CUmemoryPool, attr: c_int, value: *mut c_void) {
        if value.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let v = cu().pool_get_attribute(h(pool), attr)?;
        if (1..=3).contains(&attr) { put(value as *mut c_int, v as c_int) } else { put(value as *mut u64, v) }
    }
    fn cuMemPoolTrimTo["cuMemPoolTrimTo", 11020, Default](pool: CUmemoryPool, keep: usize) { cu().pool_trim_to(h(pool), keep as u64) }

    // ---- virtual memory management ----
    fn cuMemCreate["cuMemCreate", 10020, Default](handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) {
        if handle.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(handle, cu().mem_create(size as u64, &get(prop)?, flags)?)
    }
    fn cuMemRelease["cuMemRelease", 10020, Default](handle: CUmemGenericAllocationHandle) { cu().mem_release(handle) }
    fn cuMemAddressReserve["cuMemAddressReserve", 10020, Default](ptr: *mut CUdeviceptr, size: usize, align: usize, addr: CUdeviceptr, flags: c_ulonglong) {
        if ptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(ptr, cu().mem_address_reserve(size as u64, align as u64, addr, flags)?)
    }
    fn cuMemAddressFree["cuMemAddressFree", 10020, Default](ptr: CUdeviceptr, size: usize) { cu().mem_address_free(ptr, size as u64) }
    fn cuMemMap["cuMemMap", 10020, Default](ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) {
        cu().mem_map(ptr, size as u64, offset as u64, handle, flags)
    }
    fn cuMemUnmap["cuMemUnmap", 10020, Default](ptr: CUdeviceptr, size: usize) { cu().mem_unmap(ptr, size as u64) }
    fn cuMemSetAccess["cuMemSetAccess", 10020, Default](ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        if desc.is_null() || count == 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        // SAFETY: the caller passes `count` descriptors at `desc` (checked non-null).
        let d = unsafe { std::slice::from_raw_parts(desc, count) };
        cu().mem_set_access(ptr, size as u64, d)
    }
    fn cuMemGetAllocationGranularity["cuMemGetAllocationGranularity", 10020, Default](g: *mut usize, prop: *const CUmemAllocationProp, option: c_int) {
        if g.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(g, cu().mem_granularity(&get(prop)?, option)? as usize)
    }
    fn cuMemGetAllocationPropertiesFromHandle["cuMemGetAllocationPropertiesFromHandle", 10020, Default](prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        if prop.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(prop, cu().mem_allocation_prop(handle)?)
    }
    fn cuMemRetainAllocationHandle["cuMemRetainAllocationHandle", 11000, Default](handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        if handle.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(handle, cu().mem_retain_handle(addr as u64)?)
    }

    // ---- IPC ----
    fn cuIpcGetMemHandle["cuIpcGetMemHandle", 4010, Default](handle: *mut CUipcMemHandle, dptr: CUdeviceptr) {
        if handle.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let b = cu().ipc_get_handle(dptr)?;
        put(handle, CUipcMemHandle { reserved: b.map(|x| x as c_char) })
    }
    fn cuIpcOpenMemHandle["cuIpcOpenMemHandle", 4010, Default](pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, _flags: c_uint) {
        if pdptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pdptr, cu().ipc_open(&handle.reserved.map(|x| x as u8))?)
    }
    fn cuIpcOpenMemHandle_v2["cuIpcOpenMemHandle", 11000, Default](pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, _flags: c_uint) {
        if pdptr.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pdptr, cu().ipc_open(&handle.reserved.map(|x| x as u8))?)
    }
    fn cuIpcCloseMemHandle["cuIpcCloseMemHandle", 4010, Default](dptr: CUdeviceptr) { cu().ipc_close(dptr) }

    // ---- modules, libraries, functions ----
    fn cuModuleLoadData["cuModuleLoadData", 2000, Default](m: *mut CUmodule, image: *const c_void) {
        if m.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(m, hp(cu().module_load(ImageSource::Memory(image as usize))?))
    }
    fn cuModuleLoadDataEx["cuModuleLoadDataEx", 2010, Default](m: *mut CUmodule, image: *const c_void, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) {
        if m.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(m, hp(cu().module_load(ImageSource::Memory(image as usize))?))
    }
    fn cuModuleLoad["cuModuleLoad", 2000, Default](m: *mut CUmodule, fname: *const c_char) {
        if m.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(m, hp(cu().module_load_file(std::path::Path::new(cstr(fname)?))?))
    }
    fn cuModuleUnload["cuModuleUnload", 2000, Default](m: CUmodule) { cu().module_unload(h(m)) }
    fn cuModuleGetFunction["cuModuleGetFunction", 2000, Default](f: *mut CUfunction, m: CUmodule, name: *const c_char) {
        if f.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(f, hp(cu().module_get_function(h(m), cstr(name)?)?))
    }
    fn cuModuleGetGlobal_v2["cuModuleGetGlobal", 3020, Default](dptr: *mut CUdeviceptr, bytes: *mut usize, m: CUmodule, name: *const c_char) {
        let (g, s) = cu().module_get_global(h(m), cstr(name)?)?;
        put_opt(dptr, g);
        put_opt(bytes, s as usize);
        Ok(())
    }
    fn cuLibraryLoadData["cuLibraryLoadData", 12000, Default](l: *mut CUlibrary, code: *const c_void, _jo: *mut c_int, _jv: *mut *mut c_void, _jn: c_uint, _lo: *mut c_int, _lv: *mut *mut c_void, _ln: c_uint) {
        if l.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(l, hp(cu().library_load(ImageSource::Memory(code as usize))?))
    }
    fn cuLibraryUnload["cuLibraryUnload", 12000, Default](l: CUlibrary) { cu().library_unload(h(l)) }
    fn cuLibraryGetKernel["cuLibraryGetKernel", 12000, Default](k: *mut CUkernel, l: CUlibrary, name: *const c_char) {
        if k.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(k, hp(cu().library_get_kernel(h(l), cstr(name)?)?))
    }
    fn cuKernelGetFunction["cuKernelGetFunction", 12000, Default](f: *mut CUfunction, k: CUkernel) {
        if f.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(f, hp(cu().kernel_get_function(h(k))?))
    }
    fn cuFuncGetAttribute["cuFuncGetAttribute", 2020, Default](pi: *mut c_int, attrib: c_int, f: CUfunction) {
        if pi.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pi, cu().func_attribute(attrib, h(f))?)
    }

    // ---- launches ----
    fn cuLaunch["cuLaunch", 2000, Default](f: CUfunction) { launch_legacy(f, 1, 1, std::ptr::null_mut()) }
    fn cuLaunchGrid["cuLaunchGrid", 2000, Default](f: CUfunction, gw: c_int, gh: c_int) { launch_legacy(f, gw, gh, std::ptr::null_mut()) }
    fn cuLaunchGridAsync["cuLaunchGridAsync", 2000, Default](f: CUfunction, gw: c_int, gh: c_int, s: CUstream) { launch_legacy(f, gw, gh, s) }
    fn cuLaunchKernel["cuLaunchKernel", 4000, Default](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_common(f, [gx, gy, gz], [bx, by, bz], s, params, extra, false)
    }
    fn cuLaunchKernel_ptsz["cuLaunchKernel", 7000, Ptsz](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_common(f, [gx, gy, gz], [bx, by, bz], s, params, extra, false)
    }
    fn cuLaunchKernelEx["cuLaunchKernelEx", 11060, Default](config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, params, extra)
    }
    fn cuLaunchKernelEx_ptsz["cuLaunchKernelEx", 11060, Ptsz](config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, params, extra)
    }
    fn cuLaunchCooperativeKernel["cuLaunchCooperativeKernel", 9000, Default](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void) {
        launch_common(f, [gx, gy, gz], [bx, by, bz], s, params, std::ptr::null_mut(), true)
    }
    fn cuLaunchCooperativeKernel_ptsz["cuLaunchCooperativeKernel", 9000, Ptsz](f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, _shared: c_uint, s: CUstream, params: *mut *mut c_void) {
        launch_common(f, [gx, gy, gz], [bx, by, bz], s, params, std::ptr::null_mut(), true)
    }
    fn cuLaunchCooperativeKernelMultiDevice["cuLaunchCooperativeKernelMultiDevice", 9000, Default](list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, _flags: c_uint) {
        // Deprecated since CUDA 11.3 but still exported: one cooperative launch per entry
        // (one per device; the fake checks each as cuLaunchCooperativeKernel would).
        if list.is_null() || n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: the caller passes `n` valid entries (the CUDA API's contract).
            let p = unsafe { *list.add(i) };
            launch_common(p.function, [p.gridDimX, p.gridDimY, p.gridDimZ], [p.blockDimX, p.blockDimY, p.blockDimZ], p.hStream, p.kernelParams, std::ptr::null_mut(), true)?;
        }
        Ok(())
    }

    // ---- graphs and capture ----
    fn cuStreamBeginCapture["cuStreamBeginCapture", 10000, Default](s: CUstream) { cu().stream_begin_capture(h(s), 0) }
    fn cuStreamBeginCapture_ptsz["cuStreamBeginCapture", 10000, Ptsz](s: CUstream) { cu().stream_begin_capture(h(s), 0) }
    fn cuStreamBeginCapture_v2["cuStreamBeginCapture", 10010, Default](s: CUstream, mode: c_uint) { cu().stream_begin_capture(h(s), mode) }
    fn cuStreamBeginCapture_v2_ptsz["cuStreamBeginCapture", 10010, Ptsz](s: CUstream, mode: c_uint) { cu().stream_begin_capture(h(s), mode) }
    fn cuStreamEndCapture["cuStreamEndCapture", 10000, Default](s: CUstream, g: *mut CUgraph) {
        if g.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(g, hp(cu().stream_end_capture(h(s))?))
    }
    fn cuStreamEndCapture_ptsz["cuStreamEndCapture", 10000, Ptsz](s: CUstream, g: *mut CUgraph) {
        if g.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(g, hp(cu().stream_end_capture(h(s))?))
    }
    fn cuStreamIsCapturing["cuStreamIsCapturing", 10000, Default](s: CUstream, status: *mut c_uint) {
        if status.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(status, cu().stream_is_capturing(h(s))?)
    }
    fn cuStreamIsCapturing_ptsz["cuStreamIsCapturing", 10000, Ptsz](s: CUstream, status: *mut c_uint) {
        if status.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(status, cu().stream_is_capturing(h(s))?)
    }
    fn cuGraphCreate["cuGraphCreate", 10000, Default](g: *mut CUgraph, flags: c_uint) {
        if g.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(g, hp(cu().graph_create(flags)?))
    }
    fn cuGraphAddKernelNode["cuGraphAddKernelNode", 10000, Default](node: *mut CUgraphNode, g: CUgraph, _deps: *const CUgraphNode, _ndeps: usize, params: *const CUDA_KERNEL_NODE_PARAMS) {
        if node.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let p = get(params)?;
        let ns = node_ns(h(p.func), p.kernelParams, p.extra);
        let n = cu().graph_add_kernel_node(h(g), h(p.func), [p.gridDimX, p.gridDimY, p.gridDimZ], [p.blockDimX, p.blockDimY, p.blockDimZ], ns)?;
        put(node, hp(n))
    }
    fn cuGraphAddKernelNode_v2["cuGraphAddKernelNode", 12000, Default](node: *mut CUgraphNode, g: CUgraph, _deps: *const CUgraphNode, _ndeps: usize, params: *const CUDA_KERNEL_NODE_PARAMS_v2) {
        if node.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let p = get(params)?;
        let f = if p.func.is_null() { p.kern } else { p.func };
        let ns = node_ns(h(f), p.kernelParams, p.extra);
        let n = cu().graph_add_kernel_node(h(g), h(f), [p.gridDimX, p.gridDimY, p.gridDimZ], [p.blockDimX, p.blockDimY, p.blockDimZ], ns)?;
        put(node, hp(n))
    }
    fn cuGraphInstantiate["cuGraphInstantiate", 10000, Default](e: *mut CUgraphExec, g: CUgraph, _err: *mut CUgraphNode, _log: *mut c_char, _n: usize) {
        if e.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(e, hp(cu().graph_instantiate(h(g), 0)?))
    }
    fn cuGraphInstantiate_v2["cuGraphInstantiate", 11000, Default](e: *mut CUgraphExec, g: CUgraph, _err: *mut CUgraphNode, _log: *mut c_char, _n: usize) {
        if e.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(e, hp(cu().graph_instantiate(h(g), 0)?))
    }
    fn cuGraphInstantiateWithFlags["cuGraphInstantiateWithFlags", 11040, Default](e: *mut CUgraphExec, g: CUgraph, flags: c_ulonglong) {
        if e.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(e, hp(cu().graph_instantiate(h(g), flags)?))
    }
    fn cuGraphLaunch["cuGraphLaunch", 10000, Default](e: CUgraphExec, s: CUstream) { cu().graph_launch(h(e), h(s)) }
    fn cuGraphLaunch_ptsz["cuGraphLaunch", 10000, Ptsz](e: CUgraphExec, s: CUstream) { cu().graph_launch(h(e), h(s)) }
    fn cuGraphExecDestroy["cuGraphExecDestroy", 10000, Default](e: CUgraphExec) { cu().graph_exec_destroy(h(e)) }
    fn cuGraphUpload["cuGraphUpload", 11010, Default](e: CUgraphExec, s: CUstream) { cu().graph_upload(h(e), h(s)) }
    fn cuGraphUpload_ptsz["cuGraphUpload", 11010, Ptsz](e: CUgraphExec, s: CUstream) { cu().graph_upload(h(e), h(s)) }
    fn cuDeviceGraphMemTrim["cuDeviceGraphMemTrim", 11040, Default](dev: CUdevice) { cu().device_graph_mem_trim(dev) }
    fn cuDeviceGetGraphMemAttribute["cuDeviceGetGraphMemAttribute", 11040, Default](dev: CUdevice, attr: c_int, value: *mut c_void) {
        if value.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(value as *mut u64, cu().device_graph_mem_attribute(dev, attr)?)
    }
    // Graph memory comes from stream capture only (see fakegpu::cuda::graph).
    fn cuGraphAddMemAllocNode["cuGraphAddMemAllocNode", 11040, Default](_node: *mut CUgraphNode, _g: CUgraph, _deps: *const CUgraphNode, _ndeps: usize, _params: *mut c_void) {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn cuGraphDestroy["cuGraphDestroy", 10000, Default](g: CUgraph) { cu().graph_destroy(h(g)) }

    // ---- streams and events ----
    fn cuStreamCreate["cuStreamCreate", 2000, Default](s: *mut CUstream, flags: c_uint) {
        if s.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(s, hp(cu().stream_create(flags, 0)?))
    }
    fn cuStreamCreateWithPriority["cuStreamCreateWithPriority", 5050, Default](s: *mut CUstream, flags: c_uint, priority: c_int) {
        if s.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(s, hp(cu().stream_create(flags, priority)?))
    }
    fn cuStreamDestroy_v2["cuStreamDestroy", 4000, Default](s: CUstream) { cu().stream_destroy(h(s)) }
    fn cuStreamGetCtx["cuStreamGetCtx", 9020, Default](s: CUstream, pctx: *mut CUcontext) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().stream_ctx(h(s))?))
    }
    fn cuStreamGetCtx_ptsz["cuStreamGetCtx", 9020, Ptsz](s: CUstream, pctx: *mut CUcontext) {
        if pctx.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(pctx, hp(cu().stream_ctx(h(s))?))
    }
    fn cuStreamSynchronize["cuStreamSynchronize", 2000, Default](s: CUstream) { cu().stream_synchronize(h(s)) }
    fn cuStreamSynchronize_ptsz["cuStreamSynchronize", 7000, Ptsz](s: CUstream) { cu().stream_synchronize(h(s)) }
    fn cuStreamQuery["cuStreamQuery", 2000, Default](s: CUstream) { cu().stream_query(h(s)) }
    fn cuStreamQuery_ptsz["cuStreamQuery", 7000, Ptsz](s: CUstream) { cu().stream_query(h(s)) }
    fn cuStreamWaitEvent["cuStreamWaitEvent", 3020, Default](s: CUstream, e: CUevent, flags: c_uint) { cu().stream_wait_event(h(s), h(e), flags) }
    fn cuStreamWaitEvent_ptsz["cuStreamWaitEvent", 7000, Ptsz](s: CUstream, e: CUevent, flags: c_uint) { cu().stream_wait_event(h(s), h(e), flags) }
    fn cuEventCreate["cuEventCreate", 2000, Default](e: *mut CUevent, flags: c_uint) {
        if e.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(e, hp(cu().event_create(flags)?))
    }
    fn cuEventRecord["cuEventRecord", 2000, Default](e: CUevent, s: CUstream) { cu().event_record(h(e), h(s)) }
    fn cuEventRecord_ptsz["cuEventRecord", 7000, Ptsz](e: CUevent, s: CUstream) { cu().event_record(h(e), h(s)) }
    fn cuEventQuery["cuEventQuery", 2000, Default](e: CUevent) { cu().event_query(h(e)) }
    fn cuEventSynchronize["cuEventSynchronize", 2000, Default](e: CUevent) { cu().event_synchronize(h(e)) }
    fn cuEventElapsedTime["cuEventElapsedTime", 2000, Default](ms: *mut f32, a: CUevent, b: CUevent) {
        if ms.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(ms, cu().event_elapsed(h(a), h(b))?)
    }
    fn cuEventElapsedTime_v2["cuEventElapsedTime", 12080, Default](ms: *mut f32, a: CUevent, b: CUevent) {
        if ms.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(ms, cu().event_elapsed(h(a), h(b))?)
    }
    fn cuEventDestroy_v2["cuEventDestroy", 4000, Default](e: CUevent) { cu().event_destroy(h(e)) }

    // ---- what the CUDA runtime, PyTorch, CuPy and cuBLAS call on their common paths ----
    fn cuCtxGetFlags["cuCtxGetFlags", 7000, Default](flags: *mut c_uint) {
        if flags.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(flags, cu().ctx_flags()?)
    }
    fn cuCtxGetId["cuCtxGetId", 12000, Default](ctx: CUcontext, id: *mut c_ulonglong) {
        if id.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(id, cu().ctx_id(h(ctx))?)
    }
    fn cuCtxGetStreamPriorityRange["cuCtxGetStreamPriorityRange", 5050, Default](least: *mut c_int, greatest: *mut c_int) {
        cu().current()?;
        // The range stream creation clamps to (see fakegpu::cuda::stream).
        put_opt(least, 0);
        put_opt(greatest, -5);
        Ok(())
    }
    fn cuCtxGetCacheConfig["cuCtxGetCacheConfig", 3020, Default](cfg: *mut c_int) {
        if cfg.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().current()?;
        put(cfg, 0) // CU_FUNC_CACHE_PREFER_NONE: the fake keeps no preference
    }
    fn cuCtxSetCacheConfig["cuCtxSetCacheConfig", 3020, Default](cfg: c_int) {
        cu().current()?;
        // A preference the driver may ignore (cuCtxSetCacheConfig docs); valid values only.
        if !(0..=3).contains(&cfg) { return Err(CUDA_ERROR_INVALID_VALUE); }
        Ok(())
    }
    fn cuCtxGetSharedMemConfig["cuCtxGetSharedMemConfig", 4020, Default](cfg: *mut c_int) {
        if cfg.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().current()?;
        put(cfg, 1) // CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE
    }
    fn cuCtxSetSharedMemConfig["cuCtxSetSharedMemConfig", 4020, Default](cfg: c_int) {
        cu().current()?;
        if !(0..=2).contains(&cfg) { return Err(CUDA_ERROR_INVALID_VALUE); }
        Ok(())
    }
    fn cuCtxResetPersistingL2Cache["cuCtxResetPersistingL2Cache", 11000, Default]() {
        cu().current().map(|_| ()) // nothing is ever persisted in the fake's L2
    }
    fn cuCtxEnablePeerAccess["cuCtxEnablePeerAccess", 4000, Default](ctx: CUcontext, _flags: c_uint) {
        cu().current()?;
        cu().ctx_id(h(ctx))?;
        Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) // no peer access between simulated GPUs
    }
    fn cuCtxDisablePeerAccess["cuCtxDisablePeerAccess", 4000, Default](ctx: CUcontext) {
        cu().current()?;
        cu().ctx_id(h(ctx))?;
        Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    }
    fn cuDeviceCanAccessPeer["cuDeviceCanAccessPeer", 4000, Default](can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        if can.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().device_spec(dev)?;
        cu().device_spec(peer)?;
        put(can, 0)
    }
    fn cuDeviceGetP2PAttribute["cuDeviceGetP2PAttribute", 8000, Default](value: *mut c_int, _attr: c_int, src: CUdevice, dst: CUdevice) {
        if value.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().device_spec(src)?;
        cu().device_spec(dst)?;
        if src == dst { return Err(CUDA_ERROR_INVALID_DEVICE); }
        put(value, 0)
    }

    fn cuModuleGetLoadingMode["cuModuleGetLoadingMode", 11070, Default](mode: *mut c_int) {
        if mode.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        // CUDA_MODULE_LOADING picks it, lazy by default since 12.2 (CU_MODULE_LAZY_LOADING = 2).
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"));
        put(mode, if eager { 1 } else { 2 })
    }
    fn cuModuleLoadFatBinary["cuModuleLoadFatBinary", 2000, Default](m: *mut CUmodule, image: *const c_void) {
        if m.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(m, hp(cu().module_load(ImageSource::Memory(image as usize))?))
    }
    fn cuLibraryLoadFromFile["cuLibraryLoadFromFile", 12000, Default](l: *mut CUlibrary, path: *const c_char, _jo: *mut c_int, _jv: *mut *mut c_void, _jn: c_uint, _lo: *mut c_int, _lv: *mut *mut c_void, _ln: c_uint) {
        if l.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(l, hp(cu().library_load(ImageSource::File(cstr(path)?.into()))?))
    }
    fn cuLibraryGetModule["cuLibraryGetModule", 12000, Default](m: *mut CUmodule, l: CUlibrary) {
        if m.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(m, hp(cu().library_get_module(h(l))?))
    }
    fn cuLibraryGetGlobal["cuLibraryGetGlobal", 12000, Default](dptr: *mut CUdeviceptr, bytes: *mut usize, l: CUlibrary, name: *const c_char) {
        let (g, s) = cu().library_get_global(h(l), cstr(name)?)?;
        put_opt(dptr, g);
        put_opt(bytes, s as usize);
        Ok(())
    }
    fn cuKernelGetAttribute["cuKernelGetAttribute", 12000, Default](pi: *mut c_int, attrib: c_int, k: CUkernel, dev: CUdevice) {
        if pi.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().device_spec(dev)?;
        put(pi, cu().func_attribute(attrib, h(k))?)
    }
    fn cuKernelSetAttribute["cuKernelSetAttribute", 12000, Default](attrib: c_int, value: c_int, k: CUkernel, dev: CUdevice) {
        cu().device_spec(dev)?;
        set_func_attribute(h(k), attrib, value, dev)
    }
    fn cuKernelSetCacheConfig["cuKernelSetCacheConfig", 12000, Default](k: CUkernel, cfg: c_int, dev: CUdevice) {
        cu().device_spec(dev)?;
        cu().func_attribute(0, h(k))?;
        if !(0..=3).contains(&cfg) { return Err(CUDA_ERROR_INVALID_VALUE); }
        Ok(())
    }
    fn cuKernelGetName["cuKernelGetName", 12030, Default](name: *mut *const c_char, k: CUkernel) {
        if name.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(name, c_leaked(&cu().func_name(h(k))?))
    }
    fn cuFuncSetAttribute["cuFuncSetAttribute", 9000, Default](f: CUfunction, attrib: c_int, value: c_int) {
        set_func_attribute(h(f), attrib, value, 0)
    }
    fn cuFuncSetCacheConfig["cuFuncSetCacheConfig", 3000, Default](f: CUfunction, cfg: c_int) {
        cu().func_attribute(0, h(f))?;
        if !(0..=3).contains(&cfg) { return Err(CUDA_ERROR_INVALID_VALUE); }
        Ok(())
    }
    fn cuFuncSetSharedMemConfig["cuFuncSetSharedMemConfig", 4020, Default](f: CUfunction, cfg: c_int) {
        cu().func_attribute(0, h(f))?;
        if !(0..=2).contains(&cfg) { return Err(CUDA_ERROR_INVALID_VALUE); }
        Ok(())
    }
    fn cuFuncGetName["cuFuncGetName", 12030, Default](name: *mut *const c_char, f: CUfunction) {
        if name.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(name, c_leaked(&cu().func_name(h(f))?))
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor["cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, Default](n: *mut c_int, f: CUfunction, block: c_int, _smem: usize) {
        if n.is_null() || block <= 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(n, occupancy(f, block)?)
    }
    fn cuOccupancyMaxActiveClusters["cuOccupancyMaxActiveClusters", 11070, Default](n: *mut c_int, f: CUfunction, config: *const CUlaunchConfig) {
        if n.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().func_attribute(0, h(f))?;
        let c = get(config)?;
        let threads = c.blockDimX.saturating_mul(c.blockDimY).saturating_mul(c.blockDimZ);
        // SAFETY: `attrs` holds `numAttrs` entries, as the API requires of callers.
        let cluster = unsafe { cluster_size(&c) }?;
        put(n, cu().max_active_clusters(cu().ctx_device()?, threads, c.sharedMemBytes, cluster)? as c_int)
    }
    fn cuOccupancyAvailableDynamicSMemPerBlock["cuOccupancyAvailableDynamicSMemPerBlock", 10020, Default](size: *mut usize, f: CUfunction, blocks: c_int, block: c_int) {
        if size.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().func_attribute(0, h(f))?;
        put(size, cu().available_dynamic_shared(cu().ctx_device()?, blocks, block)? as usize)
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, Default](n: *mut c_int, f: CUfunction, block: c_int, _smem: usize, _flags: c_uint) {
        if n.is_null() || block <= 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(n, occupancy(f, block)?)
    }

    fn cuStreamGetFlags["cuStreamGetFlags", 5050, Default](s: CUstream, flags: *mut c_uint) {
        if flags.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(flags, cu().stream_props(h(s))?.flags)
    }
    fn cuStreamGetFlags_ptsz["cuStreamGetFlags", 7000, Ptsz](s: CUstream, flags: *mut c_uint) {
        if flags.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(flags, cu().stream_props(h(s))?.flags)
    }
    fn cuStreamGetPriority["cuStreamGetPriority", 5050, Default](s: CUstream, prio: *mut c_int) {
        if prio.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(prio, cu().stream_props(h(s))?.priority)
    }
    fn cuStreamGetPriority_ptsz["cuStreamGetPriority", 7000, Ptsz](s: CUstream, prio: *mut c_int) {
        if prio.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(prio, cu().stream_props(h(s))?.priority)
    }
    fn cuStreamGetId["cuStreamGetId", 12000, Default](s: CUstream, id: *mut c_ulonglong) {
        if id.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(id, cu().stream_props(h(s))?.id)
    }
    fn cuStreamGetId_ptsz["cuStreamGetId", 12000, Ptsz](s: CUstream, id: *mut c_ulonglong) {
        if id.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let s = if h(s) == 0 { 2 } else { h(s) };
        put(id, cu().stream_props(s)?.id)
    }
    fn cuStreamGetDevice["cuStreamGetDevice", 12080, Default](s: CUstream, dev: *mut CUdevice) {
        if dev.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dev, cu().stream_props(h(s))?.dev as CUdevice)
    }
    fn cuStreamGetDevice_ptsz["cuStreamGetDevice", 12080, Ptsz](s: CUstream, dev: *mut CUdevice) {
        if dev.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(dev, cu().stream_props(h(s))?.dev as CUdevice)
    }
    fn cuStreamGetCaptureInfo["cuStreamGetCaptureInfo", 10010, Default](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong) {
        capture_info(s, status, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo_ptsz["cuStreamGetCaptureInfo", 10010, Ptsz](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong) {
        capture_info(s, status, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo_v2["cuStreamGetCaptureInfo", 11030, Default](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize) {
        capture_info(s, status, id, g, deps, std::ptr::null_mut(), n)
    }
    fn cuStreamGetCaptureInfo_v2_ptsz["cuStreamGetCaptureInfo", 11030, Ptsz](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize) {
        capture_info(s, status, id, g, deps, std::ptr::null_mut(), n)
    }
    fn cuStreamGetCaptureInfo_v3["cuStreamGetCaptureInfo", 12030, Default](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const c_void, n: *mut usize) {
        capture_info(s, status, id, g, deps, edges, n)
    }
    fn cuStreamGetCaptureInfo_v3_ptsz["cuStreamGetCaptureInfo", 12030, Ptsz](s: CUstream, status: *mut c_uint, id: *mut c_ulonglong, g: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const c_void, n: *mut usize) {
        capture_info(s, status, id, g, deps, edges, n)
    }
    fn cuThreadExchangeStreamCaptureMode["cuThreadExchangeStreamCaptureMode", 10010, Default](mode: *mut c_uint) {
        let m = get(mode)?;
        if m > 2 { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(mode, CAPTURE_MODE.with(|c| c.replace(m)))
    }
    fn cuLaunchHostFunc["cuLaunchHostFunc", 10000, Default](s: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        host_func_after(s)?;
        // SAFETY: the caller's callback with the caller's data, as cuLaunchHostFunc runs it.
        unsafe { f(data) };
        Ok(())
    }
    fn cuLaunchHostFunc_ptsz["cuLaunchHostFunc", 10000, Ptsz](s: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        host_func_after(s)?;
        // SAFETY: as in cuLaunchHostFunc.
        unsafe { f(data) };
        Ok(())
    }
    fn cuStreamAddCallback["cuStreamAddCallback", 5000, Default](s: CUstream, f: Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>, data: *mut c_void, flags: c_uint) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        host_func_after(s)?;
        // SAFETY: the caller's callback with the caller's data and the stream's status.
        unsafe { f(s, CUDA_SUCCESS, data) };
        Ok(())
    }
    fn cuStreamAddCallback_ptsz["cuStreamAddCallback", 7000, Ptsz](s: CUstream, f: Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>, data: *mut c_void, flags: c_uint) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        host_func_after(s)?;
        // SAFETY: as in cuStreamAddCallback.
        unsafe { f(s, CUDA_SUCCESS, data) };
        Ok(())
    }
    fn cuEventRecordWithFlags["cuEventRecordWithFlags", 11010, Default](e: CUevent, s: CUstream, flags: c_uint) {
        if flags > 1 { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().event_record(h(e), h(s))
    }
    fn cuEventRecordWithFlags_ptsz["cuEventRecordWithFlags", 11010, Ptsz](e: CUevent, s: CUstream, flags: c_uint) {
        if flags > 1 { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().event_record(h(e), h(s))
    }

    fn cuMemcpy["cuMemcpy", 4000, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        memcpy(dst, is_dev(dst)?, src, is_dev(src)?, n, true)
    }
    fn cuMemcpy_ptds["cuMemcpy", 7000, Ptds](dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        memcpy(dst, is_dev(dst)?, src, is_dev(src)?, n, true)
    }
    fn cuMemcpyAsync["cuMemcpyAsync", 4000, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        memcpy_async(dst, is_dev(dst)?, src, is_dev(src)?, n, s)
    }
    fn cuMemcpyAsync_ptsz["cuMemcpyAsync", 7000, Ptsz](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        memcpy_async(dst, is_dev(dst)?, src, is_dev(src)?, n, s)
    }
    fn cuMemcpyDtoDAsync_v2["cuMemcpyDtoDAsync", 3020, Default](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        memcpy_async(dst, true, src, true, n, s)
    }
    fn cuMemcpyDtoDAsync_v2_ptsz["cuMemcpyDtoDAsync", 7000, Ptsz](dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        memcpy_async(dst, true, src, true, n, s)
    }
    fn cuMemcpyPeer["cuMemcpyPeer", 4000, Default](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) {
        cu().ctx_id(h(dctx))?;
        cu().ctx_id(h(sctx))?;
        memcpy(dst, true, src, true, n, true)
    }
    fn cuMemcpyPeer_ptds["cuMemcpyPeer", 7000, Ptds](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) {
        cu().ctx_id(h(dctx))?;
        cu().ctx_id(h(sctx))?;
        memcpy(dst, true, src, true, n, true)
    }
    fn cuMemcpyPeerAsync["cuMemcpyPeerAsync", 4000, Default](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) {
        cu().ctx_id(h(dctx))?;
        cu().ctx_id(h(sctx))?;
        memcpy_async(dst, true, src, true, n, s)
    }
    fn cuMemcpyPeerAsync_ptsz["cuMemcpyPeerAsync", 7000, Ptsz](dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) {
        cu().ctx_id(h(dctx))?;
        cu().ctx_id(h(sctx))?;
        memcpy_async(dst, true, src, true, n, s)
    }
    fn cuMemcpy2D_v2["cuMemcpy2D", 3020, Default](p: *const CUDA_MEMCPY2D) { memcpy_2d(get(p)?, None) }
    fn cuMemcpy2D_v2_ptds["cuMemcpy2D", 7000, Ptds](p: *const CUDA_MEMCPY2D) { memcpy_2d(get(p)?, None) }
    fn cuMemcpy2DUnaligned_v2["cuMemcpy2DUnaligned", 3020, Default](p: *const CUDA_MEMCPY2D) { memcpy_2d(get(p)?, None) }
    fn cuMemcpy2DUnaligned_v2_ptds["cuMemcpy2DUnaligned", 7000, Ptds](p: *const CUDA_MEMCPY2D) { memcpy_2d(get(p)?, None) }
    fn cuMemcpy2DAsync_v2["cuMemcpy2DAsync", 3020, Default](p: *const CUDA_MEMCPY2D, s: CUstream) { memcpy_2d(get(p)?, Some(s)) }
    fn cuMemcpy2DAsync_v2_ptsz["cuMemcpy2DAsync", 7000, Ptsz](p: *const CUDA_MEMCPY2D, s: CUstream) { memcpy_2d(get(p)?, Some(s)) }
    fn cuPointerGetAttribute["cuPointerGetAttribute", 4000, Default](data: *mut c_void, attr: c_int, ptr: CUdeviceptr) {
        if data.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let info = cu().pointer_info(ptr)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        write_pointer_attr(data, attr, ptr, Some(&info))
    }
    fn cuPointerGetAttributes["cuPointerGetAttributes", 7000, Default](n: c_uint, attrs: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) {
        if n == 0 || attrs.is_null() || data.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        // Unknown pointers are not an error here: their attributes read as zero/null.
        let info = cu().pointer_info(ptr)?;
        for i in 0..n as usize {
            // SAFETY: the caller passes `n` attributes and `n` out-pointers.
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            if d.is_null() { continue; }
            write_pointer_attr(d, a, ptr, info.as_ref())?;
        }
        Ok(())
    }
    fn cuMemHostRegister_v2["cuMemHostRegister", 6050, Default](p: *mut c_void, size: usize, flags: c_uint) {
        if flags & !0xf != 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().host_register(p as u64, size as u64)
    }
    fn cuMemHostUnregister["cuMemHostUnregister", 4000, Default](p: *mut c_void) { cu().host_unregister(p as u64) }
    fn cuMemHostGetDevicePointer_v2["cuMemHostGetDevicePointer", 3020, Default](dptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) {
        if dptr.is_null() || flags != 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        match cu().pointer_info(p as u64)? {
            // Unified addressing: the host address is the device address.
            Some(i) if i.memory_type == CU_MEMORYTYPE_HOST => put(dptr, p as CUdeviceptr),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuMemHostGetFlags["cuMemHostGetFlags", 2030, Default](flags: *mut c_uint, p: *mut c_void) {
        if flags.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        match cu().pointer_info(p as u64)? {
            Some(i) if i.memory_type == CU_MEMORYTYPE_HOST => put(flags, 0),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuMemPrefetchAsync["cuMemPrefetchAsync", 8000, Default](ptr: CUdeviceptr, n: usize, dev: CUdevice, s: CUstream) {
        prefetch_or_advise(ptr, n, dev, Some(s), 0)
    }
    fn cuMemPrefetchAsync_ptsz["cuMemPrefetchAsync", 8000, Ptsz](ptr: CUdeviceptr, n: usize, dev: CUdevice, s: CUstream) {
        prefetch_or_advise(ptr, n, dev, Some(s), 0)
    }
    fn cuMemPrefetchAsync_v2["cuMemPrefetchAsync", 12020, Default](ptr: CUdeviceptr, n: usize, loc: CUmemLocation, _flags: c_uint, s: CUstream) {
        prefetch_or_advise(ptr, n, location_device(loc)?, Some(s), 0)
    }
    fn cuMemPrefetchAsync_v2_ptsz["cuMemPrefetchAsync", 12020, Ptsz](ptr: CUdeviceptr, n: usize, loc: CUmemLocation, _flags: c_uint, s: CUstream) {
        prefetch_or_advise(ptr, n, location_device(loc)?, Some(s), 0)
    }
    fn cuMemAdvise["cuMemAdvise", 8000, Default](ptr: CUdeviceptr, n: usize, advice: c_int, dev: CUdevice) {
        if !(1..=6).contains(&advice) { return Err(CUDA_ERROR_INVALID_VALUE); }
        prefetch_or_advise(ptr, n, dev, None, advice)
    }
    fn cuMemAdvise_v2["cuMemAdvise", 12020, Default](ptr: CUdeviceptr, n: usize, advice: c_int, loc: CUmemLocation) {
        if !(1..=6).contains(&advice) { return Err(CUDA_ERROR_INVALID_VALUE); }
        prefetch_or_advise(ptr, n, location_device(loc)?, None, advice)
    }
    fn cuMemRangeGetAttribute["cuMemRangeGetAttribute", 8000, Default](data: *mut c_void, size: usize, attribute: c_int, ptr: CUdeviceptr, n: usize) {
        range_attribute(data, size, attribute, ptr, n)
    }
    fn cuMemRangeGetAttributes["cuMemRangeGetAttributes", 8000, Default](data: *mut *mut c_void, sizes: *mut usize, attributes: *mut c_int, count: usize, ptr: CUdeviceptr, n: usize) {
        if data.is_null() || sizes.is_null() || attributes.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: the caller passes `count` of each.
            let (d, size, attribute) = unsafe { (*data.add(i), *sizes.add(i), *attributes.add(i)) };
            range_attribute(d, size, attribute, ptr, n)?;
        }
        Ok(())
    }
    fn cuMemGetDefaultMemPool["cuMemGetDefaultMemPool", 13000, Default](pool: *mut CUmemoryPool, loc: *const CUmemLocation, ty: c_int) {
        if pool.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let dev = pool_location(get(loc)?, ty)?;
        put(pool, hp(cu().device_default_pool(dev)?))
    }
    fn cuMemGetMemPool["cuMemGetMemPool", 13000, Default](pool: *mut CUmemoryPool, loc: *const CUmemLocation, ty: c_int) {
        if pool.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let dev = pool_location(get(loc)?, ty)?;
        put(pool, hp(cu().device_get_pool(dev)?))
    }
    fn cuMemSetMemPool["cuMemSetMemPool", 13000, Default](loc: *const CUmemLocation, ty: c_int, pool: CUmemoryPool) {
        let dev = pool_location(get(loc)?, ty)?;
        cu().device_set_pool(dev, h(pool))
    }
    fn cuMemPoolSetAccess["cuMemPoolSetAccess", 11020, Default](pool: CUmemoryPool, desc: *const CUmemAccessDesc, count: usize) {
        cu().pool_get_attribute(h(pool), 1)?;
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors.
            let d = get(unsafe { desc.add(i) })?;
            // Only the pool's own device exists for it: access to it is always read-write.
            if d.location.type_ != 1 { return Err(CUDA_ERROR_INVALID_VALUE); }
            cu().device_spec(d.location.id)?;
            if d.flags != 3 { return Err(CUDA_ERROR_INVALID_DEVICE); }
        }
        Ok(())
    }
    fn cuMemPoolGetAccess["cuMemPoolGetAccess", 11020, Default](flags: *mut c_uint, pool: CUmemoryPool, loc: *const CUmemLocation) {
        if flags.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().pool_get_attribute(h(pool), 1)?;
        let l = get(loc)?;
        if l.type_ != 1 { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().device_spec(l.id)?;
        put(flags, 3) // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    }

    // The fake driver never logs, so a registered callback is never called: truthfully.
    fn cuLogsRegisterCallback["cuLogsRegisterCallback", 12090, Default](_cb: *mut c_void, _data: *mut c_void, handle: *mut *mut c_void) {
        if handle.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(handle, hp(LOG_CALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
    }
    fn cuLogsUnregisterCallback["cuLogsUnregisterCallback", 12090, Default](handle: *mut c_void) {
        let h = h(handle);
        if h < LOG_CALLBACK_BASE || h >= LOG_CALLBACKS.load(std::sync::atomic::Ordering::Relaxed) { return Err(CUDA_ERROR_INVALID_VALUE); }
        Ok(())
    }
    fn cuGraphGetNodes["cuGraphGetNodes", 10000, Default](g: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) {
        if n.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let all = cu().graph_nodes(h(g))?;
        if !nodes.is_null() {
            // SAFETY: the caller passes room for `*n` nodes.
            let room = unsafe { *n };
            for (i, &node) in all.iter().take(room).enumerate() {
                // SAFETY: i < room.
                unsafe { *nodes.add(i) = hp(node) };
            }
            for i in all.len()..room {
                // SAFETY: i < room; the rest are set to NULL, as documented.
                unsafe { *nodes.add(i) = std::ptr::null_mut() };
            }
            if room < all.len() {
                return put(n, room);
            }
        }
        put(n, all.len())
    }
    fn cuProfilerStart["cuProfilerStart", 4000, Default]() { cu().current().map(|_| ()) }
    fn cuProfilerStop["cuProfilerStop", 4000, Default]() { cu().current().map(|_| ()) }

    fn cuLinkCreate["cuLinkCreate", 5050, Default](_n: c_uint, _o: *mut c_int, _v: *mut *mut c_void, state: *mut *mut c_void) {
        if state.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(state, hp(cu().link_create()?))
    }
    fn cuLinkCreate_v2["cuLinkCreate", 6050, Default](_n: c_uint, _o: *mut c_int, _v: *mut *mut c_void, state: *mut *mut c_void) {
        if state.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        put(state, hp(cu().link_create()?))
    }
    fn cuLinkAddData["cuLinkAddData", 5050, Default](state: *mut c_void, _ty: c_int, data: *mut c_void, size: usize, _name: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) {
        if size == 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().link_add(h(state), &ImageSource::Memory(data as usize))
    }
    fn cuLinkAddData_v2["cuLinkAddData", 6050, Default](state: *mut c_void, _ty: c_int, data: *mut c_void, size: usize, _name: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) {
        if size == 0 { return Err(CUDA_ERROR_INVALID_VALUE); }
        cu().link_add(h(state), &ImageSource::Memory(data as usize))
    }
    fn cuLinkAddFile["cuLinkAddFile", 5050, Default](state: *mut c_void, _ty: c_int, path: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) {
        cu().link_add(h(state), &ImageSource::File(cstr(path)?.into()))
    }
    fn cuLinkAddFile_v2["cuLinkAddFile", 6050, Default](state: *mut c_void, _ty: c_int, path: *const c_char, _n: c_uint, _o: *mut c_int, _v: *mut *mut c_void) {
        cu().link_add(h(state), &ImageSource::File(cstr(path)?.into()))
    }
    fn cuLinkComplete["cuLinkComplete", 5050, Default](state: *mut c_void, cubin: *mut *mut c_void, size: *mut usize) {
        if cubin.is_null() { return Err(CUDA_ERROR_INVALID_VALUE); }
        let (p, n) = cu().link_complete(h(state))?;
        put(cubin, hp(p))?;
        put_opt(size, n as usize);
        Ok(())
    }
    fn cuLinkDestroy["cuLinkDestroy", 5050, Default](state: *mut c_void) { cu().link_destroy(h(state)) }

    // ---- tensor maps (Hopper's TMA descriptors; encoded on the host) ----
    fn cuTensorMapEncodeTiled["cuTensorMapEncodeTiled", 12000, Default](map: *mut u64, ty: c_uint, rank: c_uint, addr: *mut c_void, dim: *const u64, strides: *const u64, box_dim: *const u32, es: *const u32, interleave: c_uint, swizzle: c_uint, l2: c_uint, oob: c_uint) {
        let call = TensorMapCall { map, data_type: ty, rank, addr, dim, strides, element_strides: es, modes: [interleave, swizzle, l2, oob] };
        encode_tensor_map(call, |rank| Ok(TensorMapShape::Tiled(ffi::get_array(box_dim, rank)?)))
    }
    fn cuTensorMapEncodeIm2col["cuTensorMapEncodeIm2col", 12000, Default](map: *mut u64, ty: c_uint, rank: c_uint, addr: *mut c_void, dim: *const u64, strides: *const u64, lower: *const c_int, upper: *const c_int, channels: c_uint, pixels: c_uint, es: *const u32, interleave: c_uint, swizzle: c_uint, l2: c_uint, oob: c_uint) {
        let call = TensorMapCall { map, data_type: ty, rank, addr, dim, strides, element_strides: es, modes: [interleave, swizzle, l2, oob] };
        encode_tensor_map(call, |rank| {
            // Corners exist for the spatial dimensions only (rank - 2 of them).
            let spatial = rank.saturating_sub(2);
            Ok(TensorMapShape::Im2col(ffi::get_array(lower, spatial)?, ffi::get_array(upper, spatial)?, channels, pixels))
        })
    }

    // ---- lookup and errors (usable before cuInit) ----
    fn cuGetProcAddress["cuGetProcAddress", 11030, Default](symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }
    fn cuGetProcAddress_v2["cuGetProcAddress", 12000, Default](symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) {
        get_proc_address(symbol, pfn, version, flags, status)
    }
    fn cuGetErrorName["cuGetErrorName", 6000, Default](error: CUresult, s: *mut *const c_char) {
        match result::name(error) {
            Some(n) => put(s, c_static(n)),
            None => { put_opt(s, std::ptr::null()); Err(CUDA_ERROR_INVALID_VALUE) }
        }
    }
    fn cuGetErrorString["cuGetErrorString", 6000, Default](error: CUresult, s: *mut *const c_char) {
        match error_string(error).or_else(|| result::name(error)) {
            Some(n) => put(s, c_static(n)),
            None => { put_opt(s, std::ptr::null()); Err(CUDA_ERROR_INVALID_VALUE) }
        }
    }
    fn cuGetExportTable["cuGetExportTable", 3000, Default](table: *mut *const c_void, id: *const CUuuid) {
        export_tables::get_export_table(table, id)
    }
}
