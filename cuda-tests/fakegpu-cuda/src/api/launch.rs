//! Kernel launches (current, cooperative and deprecated) and occupancy.

use crate::*;

pub(crate) fn cuLaunch(f: CUfunction) -> R<()> {
    launch_legacy(f, 1, 1, std::ptr::null_mut())
}

pub(crate) fn cuLaunchGrid(f: CUfunction, gw: c_int, gh: c_int) -> R<()> {
    launch_legacy(f, gw, gh, std::ptr::null_mut())
}

pub(crate) fn cuLaunchGridAsync(f: CUfunction, gw: c_int, gh: c_int, s: CUstream) -> R<()> {
    launch_legacy(f, gw, gh, s)
}

pub(crate) fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> R<()> {
    launch_common(f, [gx, gy, gz], [bx, by, bz], s, params, extra, false)
}

pub(crate) fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> R<()> {
    launch_ex(config, f, params, extra)
}

pub(crate) fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
) -> R<()> {
    launch_common(
        f,
        [gx, gy, gz],
        [bx, by, bz],
        s,
        params,
        std::ptr::null_mut(),
        true,
    )
}

pub(crate) fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    n: c_uint,
    _flags: c_uint,
) -> R<()> {
    // Deprecated since CUDA 11.3 but still exported: one cooperative launch per entry
    // (one per device; the fake checks each as cuLaunchCooperativeKernel would).
    if list.is_null() || n == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..n as usize {
        // SAFETY: the caller passes `n` valid entries (the CUDA API's contract).
        let p = unsafe { *list.add(i) };
        launch_common(
            p.function,
            [p.gridDimX, p.gridDimY, p.gridDimZ],
            [p.blockDimX, p.blockDimY, p.blockDimZ],
            p.hStream,
            p.kernelParams,
            std::ptr::null_mut(),
            true,
        )?;
    }
    Ok(())
}

pub(crate) fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    _smem: usize,
) -> R<()> {
    if n.is_null() || block <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(n, occupancy(f, block)?)
}

pub(crate) fn cuOccupancyMaxActiveClusters(
    n: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> R<()> {
    if n.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().func_attribute(0, h(f))?;
    let c = get(config)?;
    let threads = c
        .blockDimX
        .saturating_mul(c.blockDimY)
        .saturating_mul(c.blockDimZ);
    // SAFETY: `attrs` holds `numAttrs` entries, as the API requires of callers.
    let cluster = unsafe { cluster_size(&c) }?;
    put(
        n,
        cu().max_active_clusters(cu().ctx_device()?, threads, c.sharedMemBytes, cluster)? as c_int,
    )
}

pub(crate) fn cuOccupancyAvailableDynamicSMemPerBlock(
    size: *mut usize,
    f: CUfunction,
    blocks: c_int,
    block: c_int,
) -> R<()> {
    if size.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().func_attribute(0, h(f))?;
    put(
        size,
        cu().available_dynamic_shared(cu().ctx_device()?, blocks, block)? as usize,
    )
}

pub(crate) fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    _smem: usize,
    _flags: c_uint,
) -> R<()> {
    if n.is_null() || block <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(n, occupancy(f, block)?)
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
pub(crate) fn node_ns(f: u64, params: *mut *mut c_void, extra: *mut *mut c_void) -> Option<u64> {
    let configured = Some(cu().config.ns_per_wave);
    if !cu().reads_ns_param(f) {
        return configured;
    }
    // SAFETY: kernel params come from the caller with the CUDA API's guarantees.
    unsafe { read_ns_per_wave(params, extra) }.or(configured)
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
