//! IPC memory handles.

use crate::*;

pub(crate) fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> R<()> {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let b = cu().ipc_get_handle(dptr)?;
    put(
        handle,
        CUipcMemHandle {
            reserved: b.map(|x| x as c_char),
        },
    )
}

pub(crate) fn cuIpcOpenMemHandle(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    _flags: c_uint,
) -> R<()> {
    if pdptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pdptr, cu().ipc_open(&handle.reserved.map(|x| x as u8))?)
}

pub(crate) fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> R<()> {
    cu().ipc_close(dptr)
}
