//! What tools call: log callbacks and the profiler switches.

use crate::*;

pub(crate) fn cuLogsRegisterCallback(
    _cb: *mut c_void,
    _data: *mut c_void,
    handle: *mut *mut c_void,
) -> R<()> {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        handle,
        hp(LOG_CALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
    )
}

pub(crate) fn cuLogsUnregisterCallback(handle: *mut c_void) -> R<()> {
    let h = h(handle);
    if h < LOG_CALLBACK_BASE || h >= LOG_CALLBACKS.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuProfilerStart` and `cuProfilerStop`: nothing is profiled; both need a current context,
/// as the driver's do.
pub(crate) fn profiler_start_or_stop() -> R<()> {
    cu().current().map(|_| ())
}

const LOG_CALLBACK_BASE: u64 = 0x109 << 40;

static LOG_CALLBACKS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(LOG_CALLBACK_BASE);
