//! What a CUDA array costs: the bytes an array or mipmapped array of a descriptor owns on the
//! device, charged before the driver creates it (`hooks::memory`'s array handlers). Pure.

use std::ffi::c_uint;

use gpuslice_abi::cuda::*;

/// Bytes per texel charged for a format this build does not know (packed, block-compressed,
/// NV12, future formats): no CUDA array format spends more than 16 bytes (4 x 32-bit
/// channels) per texel. The driver cannot be asked afterwards: cuArrayGetMemoryRequirements
/// answers only for arrays created with CUDA_ARRAY3D_DEFERRED_MAPPING.
pub(crate) const UNKNOWN_FORMAT_TEXEL_BYTES: u64 = 16;

/// `CUDA_ARRAY3D_SPARSE` and `CUDA_ARRAY3D_DEFERRED_MAPPING`: such arrays own no memory; it is
/// mapped into them later from `cuMemCreate` handles, which are charged themselves.
pub(crate) const ARRAY3D_WITHOUT_MEMORY: c_uint = 0x40 | 0x80;

/// Bytes of a `width x height x depth` array of `channels` elements of `format`; an unknown
/// format is charged the upper bound [`UNKNOWN_FORMAT_TEXEL_BYTES`] per texel.
pub(crate) fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
) -> u64 {
    let element = match array_format_bytes(format) {
        Some(bytes) => bytes as u64 * u64::from(channels),
        None => UNKNOWN_FORMAT_TEXEL_BYTES,
    };
    [width, height, depth].iter().fold(element, |acc, &extent| {
        acc.saturating_mul(extent.max(1) as u64)
    })
}

/// Bytes of a mipmapped array: every level halves each extent (never below 1).
pub(crate) fn mipmapped_bytes(desc: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> u64 {
    let (mut w, mut h, mut d) = (desc.Width, desc.Height, desc.Depth);
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.saturating_add(array_bytes(w, h, d, desc.Format, desc.NumChannels));
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        d = if d == 0 { 0 } else { (d / 2).max(1) };
    }
    total
}

/// Bytes an array of this descriptor owns: none for a sparse or deferred-mapping 3-D array
/// (`flags`; 0 for a 2-D descriptor), else [`array_bytes`].
pub(crate) fn owned_array_bytes(
    extents: [usize; 3],
    flags: c_uint,
    format: c_uint,
    channels: c_uint,
) -> u64 {
    if flags & ARRAY3D_WITHOUT_MEMORY != 0 {
        return 0;
    }
    let [width, height, depth] = extents;
    array_bytes(width, height, depth, format, channels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_follow_format_channels_and_extents() {
        // 1024 x 768 float4: 16 bytes per element.
        assert_eq!(array_bytes(1024, 768, 0, 0x20, 4), 1024 * 768 * 16);
        // 1-D array: height 0 counts as 1.
        assert_eq!(array_bytes(100, 0, 0, 0x01, 1), 100);
        assert_eq!(
            array_bytes(100, 10, 10, 0xff, 1),
            100 * 10 * 10 * UNKNOWN_FORMAT_TEXEL_BYTES,
            "unknown format: the per-texel upper bound"
        );
    }

    #[test]
    fn mipmaps_sum_their_levels() {
        let desc = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 8,
            Height: 8,
            Depth: 0,
            Format: 0x01,
            NumChannels: 1,
            Flags: 0,
        };
        assert_eq!(mipmapped_bytes(&desc, 4), 64 + 16 + 4 + 1);
    }
}
