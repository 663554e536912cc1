//! Graphs and stream capture.

use super::launch::node_ns;
use crate::*;

pub(crate) fn cuStreamBeginCapture(s: CUstream) -> R<()> {
    cu().stream_begin_capture(h(s), 0)
}

pub(crate) fn cuStreamBeginCapture_v2(s: CUstream, mode: c_uint) -> R<()> {
    cu().stream_begin_capture(h(s), mode)
}

pub(crate) fn cuStreamEndCapture(s: CUstream, g: *mut CUgraph) -> R<()> {
    if g.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(g, hp(cu().stream_end_capture(h(s))?))
}

pub(crate) fn cuStreamIsCapturing(s: CUstream, status: *mut c_uint) -> R<()> {
    if status.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(status, cu().stream_is_capturing(h(s))?)
}

pub(crate) fn cuGraphCreate(g: *mut CUgraph, flags: c_uint) -> R<()> {
    if g.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(g, hp(cu().graph_create(flags)?))
}

pub(crate) fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _ndeps: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> R<()> {
    if node.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = get(params)?;
    let ns = node_ns(h(p.func), p.kernelParams, p.extra);
    let n = cu().graph_add_kernel_node(
        h(g),
        h(p.func),
        [p.gridDimX, p.gridDimY, p.gridDimZ],
        [p.blockDimX, p.blockDimY, p.blockDimZ],
        ns,
    )?;
    put(node, hp(n))
}

pub(crate) fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _ndeps: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
) -> R<()> {
    if node.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = get(params)?;
    let f = if p.func.is_null() { p.kern } else { p.func };
    let ns = node_ns(h(f), p.kernelParams, p.extra);
    let n = cu().graph_add_kernel_node(
        h(g),
        h(f),
        [p.gridDimX, p.gridDimY, p.gridDimZ],
        [p.blockDimX, p.blockDimY, p.blockDimZ],
        ns,
    )?;
    put(node, hp(n))
}

pub(crate) fn cuGraphInstantiate(
    e: *mut CUgraphExec,
    g: CUgraph,
    _err: *mut CUgraphNode,
    _log: *mut c_char,
    _n: usize,
) -> R<()> {
    if e.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(e, hp(cu().graph_instantiate(h(g), 0)?))
}

pub(crate) fn cuGraphInstantiateWithFlags(
    e: *mut CUgraphExec,
    g: CUgraph,
    flags: c_ulonglong,
) -> R<()> {
    if e.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(e, hp(cu().graph_instantiate(h(g), flags)?))
}

pub(crate) fn cuGraphLaunch(e: CUgraphExec, s: CUstream) -> R<()> {
    cu().graph_launch(h(e), h(s))
}

pub(crate) fn cuGraphExecDestroy(e: CUgraphExec) -> R<()> {
    cu().graph_exec_destroy(h(e))
}

pub(crate) fn cuGraphUpload(e: CUgraphExec, s: CUstream) -> R<()> {
    cu().graph_upload(h(e), h(s))
}

pub(crate) fn cuDeviceGraphMemTrim(dev: CUdevice) -> R<()> {
    cu().device_graph_mem_trim(dev)
}

pub(crate) fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: c_int,
    value: *mut c_void,
) -> R<()> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        value as *mut u64,
        cu().device_graph_mem_attribute(dev, attr)?,
    )
}

pub(crate) fn cuGraphAddMemAllocNode(
    _node: *mut CUgraphNode,
    _g: CUgraph,
    _deps: *const CUgraphNode,
    _ndeps: usize,
    _params: *mut c_void,
) -> R<()> {
    Err(CUDA_ERROR_NOT_SUPPORTED)
}

pub(crate) fn cuGraphDestroy(g: CUgraph) -> R<()> {
    cu().graph_destroy(h(g))
}

pub(crate) fn cuStreamGetCaptureInfo(
    s: CUstream,
    status: *mut c_uint,
    id: *mut c_ulonglong,
) -> R<()> {
    capture_info(
        s,
        status,
        id,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
}

pub(crate) fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut c_uint,
    id: *mut c_ulonglong,
    g: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    n: *mut usize,
) -> R<()> {
    capture_info(s, status, id, g, deps, std::ptr::null_mut(), n)
}

pub(crate) fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    status: *mut c_uint,
    id: *mut c_ulonglong,
    g: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    n: *mut usize,
) -> R<()> {
    capture_info(s, status, id, g, deps, edges, n)
}

pub(crate) fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> R<()> {
    let m = get(mode)?;
    if m > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(mode, CAPTURE_MODE.with(|c| c.replace(m)))
}

pub(crate) fn cuGraphGetNodes(g: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) -> R<()> {
    if n.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
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
