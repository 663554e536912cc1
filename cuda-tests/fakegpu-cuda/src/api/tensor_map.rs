//! Tensor maps (Hopper's TMA descriptors), encoded on the host.

use crate::*;

pub(crate) fn cuTensorMapEncodeTiled(
    map: *mut u64,
    ty: c_uint,
    rank: c_uint,
    addr: *mut c_void,
    dim: *const u64,
    strides: *const u64,
    box_dim: *const u32,
    es: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2: c_uint,
    oob: c_uint,
) -> R<()> {
    let call = TensorMapCall {
        map,
        data_type: ty,
        rank,
        addr,
        dim,
        strides,
        element_strides: es,
        modes: [interleave, swizzle, l2, oob],
    };
    encode_tensor_map(call, |rank| {
        Ok(TensorMapShape::Tiled(ffi::get_array(box_dim, rank)?))
    })
}

pub(crate) fn cuTensorMapEncodeIm2col(
    map: *mut u64,
    ty: c_uint,
    rank: c_uint,
    addr: *mut c_void,
    dim: *const u64,
    strides: *const u64,
    lower: *const c_int,
    upper: *const c_int,
    channels: c_uint,
    pixels: c_uint,
    es: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2: c_uint,
    oob: c_uint,
) -> R<()> {
    let call = TensorMapCall {
        map,
        data_type: ty,
        rank,
        addr,
        dim,
        strides,
        element_strides: es,
        modes: [interleave, swizzle, l2, oob],
    };
    encode_tensor_map(call, |rank| {
        // Corners exist for the spatial dimensions only (rank - 2 of them).
        let spatial = rank.saturating_sub(2);
        Ok(TensorMapShape::Im2col(
            ffi::get_array(lower, spatial)?,
            ffi::get_array(upper, spatial)?,
            channels,
            pixels,
        ))
    })
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
