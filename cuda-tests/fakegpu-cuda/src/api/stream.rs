//! Streams, events, host functions and stream callbacks.

use crate::*;

pub(crate) fn cuStreamCreate(s: *mut CUstream, flags: c_uint) -> R<()> {
    if s.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(s, hp(cu().stream_create(flags, 0)?))
}

pub(crate) fn cuStreamCreateWithPriority(
    s: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> R<()> {
    if s.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(s, hp(cu().stream_create(flags, priority)?))
}

pub(crate) fn cuStreamDestroy_v2(s: CUstream) -> R<()> {
    cu().stream_destroy(h(s))
}

pub(crate) fn cuStreamGetCtx(s: CUstream, pctx: *mut CUcontext) -> R<()> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pctx, hp(cu().stream_ctx(h(s))?))
}

pub(crate) fn cuStreamSynchronize(s: CUstream) -> R<()> {
    cu().stream_synchronize(h(s))
}

pub(crate) fn cuStreamQuery(s: CUstream) -> R<()> {
    cu().stream_query(h(s))
}

pub(crate) fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) -> R<()> {
    cu().stream_wait_event(h(s), h(e), flags)
}

pub(crate) fn cuEventCreate(e: *mut CUevent, flags: c_uint) -> R<()> {
    if e.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(e, hp(cu().event_create(flags)?))
}

pub(crate) fn cuEventRecord(e: CUevent, s: CUstream) -> R<()> {
    cu().event_record(h(e), h(s))
}

pub(crate) fn cuEventQuery(e: CUevent) -> R<()> {
    cu().event_query(h(e))
}

pub(crate) fn cuEventSynchronize(e: CUevent) -> R<()> {
    cu().event_synchronize(h(e))
}

pub(crate) fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) -> R<()> {
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(ms, cu().event_elapsed(h(a), h(b))?)
}

pub(crate) fn cuEventDestroy_v2(e: CUevent) -> R<()> {
    cu().event_destroy(h(e))
}

pub(crate) fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) -> R<()> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(flags, cu().stream_props(h(s))?.flags)
}

pub(crate) fn cuStreamGetPriority(s: CUstream, prio: *mut c_int) -> R<()> {
    if prio.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(prio, cu().stream_props(h(s))?.priority)
}

pub(crate) fn cuStreamGetId(s: CUstream, id: *mut c_ulonglong) -> R<()> {
    if id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(id, cu().stream_props(h(s))?.id)
}

pub(crate) fn cuStreamGetId_ptsz(s: CUstream, id: *mut c_ulonglong) -> R<()> {
    if id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = if h(s) == 0 { 2 } else { h(s) };
    put(id, cu().stream_props(s)?.id)
}

pub(crate) fn cuStreamGetDevice(s: CUstream, dev: *mut CUdevice) -> R<()> {
    if dev.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(dev, cu().stream_props(h(s))?.dev as CUdevice)
}

pub(crate) fn cuLaunchHostFunc(
    s: CUstream,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> R<()> {
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    host_func_after(s)?;
    // SAFETY: the caller's callback with the caller's data, as cuLaunchHostFunc runs it.
    unsafe { f(data) };
    Ok(())
}

pub(crate) fn cuStreamAddCallback(
    s: CUstream,
    f: Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>,
    data: *mut c_void,
    flags: c_uint,
) -> R<()> {
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    host_func_after(s)?;
    // SAFETY: the caller's callback with the caller's data and the stream's status.
    unsafe { f(s, CUDA_SUCCESS, data) };
    Ok(())
}

pub(crate) fn cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: c_uint) -> R<()> {
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().event_record(h(e), h(s))
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
