//! CUDA arrays and mipmapped arrays.

use crate::*;

pub(crate) fn cuArrayCreate(p: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = get(desc)?;
    let d3 = CUDA_ARRAY3D_DESCRIPTOR {
        Width: d.Width as usize,
        Height: d.Height as usize,
        Depth: 0,
        Format: d.Format,
        NumChannels: d.NumChannels,
        Flags: 0,
    };
    put(p, hp(cu().array_create(&d3, None)?))
}

pub(crate) fn cuArrayCreate_v2(p: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = get(desc)?;
    let d3 = CUDA_ARRAY3D_DESCRIPTOR {
        Width: d.Width,
        Height: d.Height,
        Depth: 0,
        Format: d.Format,
        NumChannels: d.NumChannels,
        Flags: 0,
    };
    put(p, hp(cu().array_create(&d3, None)?))
}

pub(crate) fn cuArray3DCreate(p: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = get(desc)?;
    let d3 = CUDA_ARRAY3D_DESCRIPTOR {
        Width: d.Width as usize,
        Height: d.Height as usize,
        Depth: d.Depth as usize,
        Format: d.Format,
        NumChannels: d.NumChannels,
        Flags: d.Flags,
    };
    put(p, hp(cu().array_create(&d3, None)?))
}

pub(crate) fn cuArray3DCreate_v2(p: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(p, hp(cu().array_create(&get(desc)?, None)?))
}

pub(crate) fn cuArrayDestroy(a: CUarray) -> R<()> {
    cu().array_destroy(h(a), false)
}

pub(crate) fn cuMipmappedArrayCreate(
    p: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(p, hp(cu().array_create(&get(desc)?, Some(levels))?))
}

pub(crate) fn cuMipmappedArrayDestroy(a: CUmipmappedArray) -> R<()> {
    cu().array_destroy(h(a), true)
}
