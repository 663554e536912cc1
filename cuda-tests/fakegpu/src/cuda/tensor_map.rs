//! Tensor maps (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`): the 128-byte opaque
//! descriptor a Hopper kernel's TMA unit reads, encoded on the host from the arguments.
//!
//! The checks are the requirements the driver API documents for each argument (CUDA 13.2
//! `cuda.h`, "Tensor Map Object Managment"; the same text as
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TENSOR__MEMORY.html>): a
//! violation is `CUDA_ERROR_INVALID_VALUE`, nothing written. The packed data types and the
//! `128B_ATOM` swizzles came with CUDA 12.8 and are refused by an older simulated driver.
//!
//! The layout of the map is the fake's own (the real one is opaque and differs between
//! architectures); no kernel code runs here, so nothing reads it but [`decode`] in tests:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | `b"FGTM"` |
//! | 4, 5, 6 | kind (1 tiled, 2 im2col), rank, data type |
//! | 7 | interleave (bits 0-1), swizzle (2-4), L2 promotion (5-6), OOB fill (7) |
//! | 8..16 | global address |
//! | 16..56 | global dims, 5 x u64 |
//! | 56..88 | global strides, 4 x u64 |
//! | 88..98 | tiled: box dims, 5 x u16; im2col: channels per pixel, pixels per column (u16) |
//! | 98..103 | element strides, 5 x u8 |
//! | 104..110, 110..116 | im2col: lower and upper pixel-box corners, 3 x i16 each |

use super::R;
use gpuslice_abi::cuda::result::CUDA_ERROR_INVALID_VALUE;

/// `CU_TENSOR_MAP_NUM_QWORDS`: a map is 16 quad-words (128 bytes).
pub const TENSOR_MAP_QWORDS: usize = 16;
/// "tensorMap address must be aligned to 64 bytes."
pub const TENSOR_MAP_ALIGN: u64 = 64;
/// "the maximum supported dimensionality of 5".
pub const MAX_RANK: usize = 5;
/// The driver version that brought the packed data types and the `128B_ATOM` swizzles.
const PACKED_TYPES_SINCE: i32 = 12080;

/// `CUtensorMapDataType` values used by the checks.
pub mod data_type {
    pub const UINT8: u32 = 0;
    pub const FLOAT16: u32 = 6;
    pub const TFLOAT32_FTZ: u32 = 12;
    pub const U4_ALIGN8B: u32 = 13;
    pub const U4_ALIGN16B: u32 = 14;
    pub const U6_ALIGN16B: u32 = 15;
}
use data_type::*;

const INTERLEAVE_NONE: u32 = 0;
const INTERLEAVE_32B: u32 = 2;
const SWIZZLE_NONE: u32 = 0;
const SWIZZLE_32B: u32 = 1;
const SWIZZLE_128B: u32 = 3;
const SWIZZLE_128B_ATOM_32B: u32 = 4;
const SWIZZLE_128B_ATOM_64B: u32 = 6;

/// Bits one element takes in global memory: the packed types hold 16 values in 8 bytes
/// (`16U4_ALIGN8B`) or in 16 bytes (`16U4_ALIGN16B`, `16U6_ALIGN16B`).
fn element_bits(ty: u32) -> Option<u64> {
    Some(match ty {
        0 => 8,                    // UINT8
        1 | 6 | 9 => 16,           // UINT16, FLOAT16, BFLOAT16
        2 | 3 | 7 | 10..=12 => 32, // UINT32, INT32, FLOAT32, FLOAT32_FTZ, TFLOAT32(_FTZ)
        4 | 5 | 8 => 64,           // UINT64, INT64, FLOAT64
        U4_ALIGN8B => 4,
        U4_ALIGN16B | U6_ALIGN16B => 8,
        _ => return None,
    })
}

fn is_packed_16b(ty: u32) -> bool {
    ty == U4_ALIGN16B || ty == U6_ALIGN16B
}

/// The box a map describes: a tile, or an im2col pixel box.
#[derive(Clone, Copy, Debug)]
pub enum Shape<'a> {
    Tiled {
        box_dim: &'a [u32],
    },
    Im2col {
        lower_corner: &'a [i32],
        upper_corner: &'a [i32],
        channels_per_pixel: u32,
        pixels_per_column: u32,
    },
}

/// The arguments of an encode call, with the arrays already read (`rank` entries each,
/// `rank - 1` strides, `rank - 2` corners).
#[derive(Clone, Copy, Debug)]
pub struct TensorMapArgs<'a> {
    pub data_type: u32,
    pub global_address: u64,
    pub global_dim: &'a [u64],
    pub global_strides: &'a [u64],
    pub element_strides: &'a [u32],
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
    pub shape: Shape<'a>,
}

fn require(ok: bool) -> R<()> {
    if ok {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The range one im2col corner offset must lie in, by rank.
fn corner_range(rank: usize) -> std::ops::RangeInclusive<i32> {
    match rank {
        3 => -32768..=32767,
        4 => -128..=127,
        _ => -16..=15,
    }
}

/// Checks the arguments as the driver API documents them and encodes the map.
pub fn encode(a: &TensorMapArgs, driver_version: i32) -> R<[u64; TENSOR_MAP_QWORDS]> {
    let rank = a.global_dim.len();
    let bits = element_bits(a.data_type).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let new_in_12_8 = a.data_type >= U4_ALIGN8B || a.swizzle >= SWIZZLE_128B_ATOM_32B;
    require(driver_version >= PACKED_TYPES_SINCE || !new_in_12_8)?;
    require(a.interleave <= INTERLEAVE_32B && a.swizzle <= SWIZZLE_128B_ATOM_64B)?;
    require(a.l2_promotion <= 3 && a.oob_fill <= 1)?;
    // Rank: 1..=5 tiled (3 or more when interleaved), 3..=5 im2col.
    let min_rank = match a.shape {
        Shape::Im2col { .. } => 3,
        Shape::Tiled { .. } if a.interleave != INTERLEAVE_NONE => 3,
        Shape::Tiled { .. } => 1,
    };
    require((min_rank..=MAX_RANK).contains(&rank))?;
    require(a.global_strides.len() == rank - 1 && a.element_strides.len() == rank)?;
    // Alignment: 16 bytes, 32 when interleaved by 32 bytes or for the 16-byte packed types.
    let wide = a.interleave == INTERLEAVE_32B || is_packed_16b(a.data_type);
    let align = if wide { 32 } else { 16 };
    require(a.global_address.is_multiple_of(align))?;
    // Dimensions: non-zero, at most 2^32; packed types whole in dimension 0.
    require(a.global_dim.iter().all(|&d| (1..=1 << 32).contains(&d)))?;
    if is_packed_16b(a.data_type) {
        require(a.global_dim[0].is_multiple_of(128))?;
    } else if a.data_type == U4_ALIGN8B {
        require(a.global_dim[0].is_multiple_of(2))?;
    }
    // Strides: multiples of 16 (32 when wide), below 2^40.
    require(
        a.global_strides
            .iter()
            .all(|&s| s.is_multiple_of(align) && s < 1 << 40),
    )?;
    require(a.element_strides.iter().all(|&s| (1..=8).contains(&s)))?;
    // The inner extent in bytes, which interleave and swizzle constrain.
    let inner = match a.shape {
        Shape::Tiled { box_dim } => {
            require(box_dim.len() == rank)?;
            require(box_dim.iter().all(|&b| (1..=256).contains(&b)))?;
            if is_packed_16b(a.data_type) {
                require(box_dim[0] == 128)?;
            }
            let inner = box_dim[0] as u64 * bits;
            if a.interleave == INTERLEAVE_NONE {
                require(inner.is_multiple_of(16 * 8))?;
            }
            inner / 8
        }
        Shape::Im2col {
            lower_corner,
            upper_corner,
            channels_per_pixel,
            pixels_per_column,
        } => {
            let spatial = rank - 2;
            require(lower_corner.len() == spatial && upper_corner.len() == spatial)?;
            let range = corner_range(rank);
            require(
                lower_corner
                    .iter()
                    .chain(upper_corner)
                    .all(|c| range.contains(c)),
            )?;
            // A non-zero area: every spatial extent (the dimension widened by the corners,
            // which lie between C, dimension 0, and N, the last) is positive.
            require((0..spatial).all(|i| {
                a.global_dim[1 + i] as i64 + upper_corner[i] as i64 - lower_corner[i] as i64 > 0
            }))?;
            require((1..=256).contains(&channels_per_pixel))?;
            require((1..=1024).contains(&pixels_per_column))?;
            if is_packed_16b(a.data_type) {
                require(channels_per_pixel == 128)?;
            }
            channels_per_pixel as u64 * bits / 8
        }
    };
    // Interleave and swizzle.
    if a.interleave == INTERLEAVE_NONE && a.swizzle != SWIZZLE_NONE {
        let span = match a.swizzle {
            SWIZZLE_32B => 32,
            2 => 64,
            _ => 128,
        };
        require(inner <= span)?;
    }
    if a.interleave == INTERLEAVE_32B {
        require(a.swizzle == SWIZZLE_32B)?;
    }
    match a.data_type {
        U6_ALIGN16B => {
            require(a.interleave == INTERLEAVE_NONE)?;
            require(matches!(
                a.swizzle,
                SWIZZLE_NONE | SWIZZLE_128B | SWIZZLE_128B_ATOM_32B | SWIZZLE_128B_ATOM_64B
            ))?;
        }
        U4_ALIGN16B => require(matches!(
            a.swizzle,
            SWIZZLE_NONE | SWIZZLE_128B | SWIZZLE_128B_ATOM_32B
        ))?,
        _ => {}
    }
    // The NaN fill: floating-point types only (FLOAT16..=TFLOAT32_FTZ), not packed ones.
    if a.oob_fill == 1 {
        require((FLOAT16..=TFLOAT32_FTZ).contains(&a.data_type))?;
    }
    Ok(pack(a))
}

fn pack(a: &TensorMapArgs) -> [u64; TENSOR_MAP_QWORDS] {
    let mut b = [0u8; TENSOR_MAP_QWORDS * 8];
    b[0..4].copy_from_slice(b"FGTM");
    b[4] = match a.shape {
        Shape::Tiled { .. } => 1,
        Shape::Im2col { .. } => 2,
    };
    b[5] = a.global_dim.len() as u8;
    b[6] = a.data_type as u8;
    b[7] = (a.interleave | a.swizzle << 2 | a.l2_promotion << 5 | a.oob_fill << 7) as u8;
    b[8..16].copy_from_slice(&a.global_address.to_le_bytes());
    for (i, d) in a.global_dim.iter().enumerate() {
        b[16 + 8 * i..24 + 8 * i].copy_from_slice(&d.to_le_bytes());
    }
    for (i, s) in a.global_strides.iter().enumerate() {
        b[56 + 8 * i..64 + 8 * i].copy_from_slice(&s.to_le_bytes());
    }
    let mut put_u16 = |at: usize, v: u32| b[at..at + 2].copy_from_slice(&(v as u16).to_le_bytes());
    match a.shape {
        Shape::Tiled { box_dim } => {
            for (i, &d) in box_dim.iter().enumerate() {
                put_u16(88 + 2 * i, d);
            }
        }
        Shape::Im2col {
            channels_per_pixel,
            pixels_per_column,
            ..
        } => {
            put_u16(88, channels_per_pixel);
            put_u16(90, pixels_per_column);
        }
    }
    for (i, &s) in a.element_strides.iter().enumerate() {
        b[98 + i] = s as u8;
    }
    if let Shape::Im2col {
        lower_corner,
        upper_corner,
        ..
    } = a.shape
    {
        for (i, (&l, &u)) in lower_corner.iter().zip(upper_corner).enumerate() {
            b[104 + 2 * i..106 + 2 * i].copy_from_slice(&(l as i16).to_le_bytes());
            b[110 + 2 * i..112 + 2 * i].copy_from_slice(&(u as i16).to_le_bytes());
        }
    }
    std::array::from_fn(|i| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes")))
}

/// What a map holds, read back (tests; the fake runs no kernel that would read one).
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded {
    pub tiled: bool,
    pub data_type: u32,
    pub global_address: u64,
    pub global_dim: Vec<u64>,
    pub global_strides: Vec<u64>,
    /// Tiled: the box; im2col: channels per pixel and pixels per column.
    pub box_dim: Vec<u32>,
    pub element_strides: Vec<u32>,
    /// Interleave, swizzle, L2 promotion, OOB fill.
    pub modes: [u32; 4],
}

/// Reads a map [`encode`] made; `None` for anything else.
pub fn decode(map: &[u64; TENSOR_MAP_QWORDS]) -> Option<Decoded> {
    let b: Vec<u8> = map.iter().flat_map(|w| w.to_le_bytes()).collect();
    if &b[0..4] != b"FGTM" {
        return None;
    }
    let rank = b[5] as usize;
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as u32;
    let tiled = b[4] == 1;
    Some(Decoded {
        tiled,
        data_type: b[6] as u32,
        global_address: u64_at(8),
        global_dim: (0..rank).map(|i| u64_at(16 + 8 * i)).collect(),
        global_strides: (0..rank.saturating_sub(1))
            .map(|i| u64_at(56 + 8 * i))
            .collect(),
        box_dim: (0..if tiled { rank } else { 2 })
            .map(|i| u16_at(88 + 2 * i))
            .collect(),
        element_strides: (0..rank).map(|i| b[98 + i] as u32).collect(),
        modes: [
            b[7] as u32 & 3,
            (b[7] as u32 >> 2) & 7,
            (b[7] as u32 >> 5) & 3,
            b[7] as u32 >> 7,
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row-major 1024 x 4096 fp16 matrix, tiles of 64 x 128 with 128-byte swizzle: what
    /// a Hopper GEMM encodes.
    fn gemm_tile<'a>(dim: &'a [u64], strides: &'a [u64], box_dim: &'a [u32]) -> TensorMapArgs<'a> {
        TensorMapArgs {
            data_type: FLOAT16,
            global_address: 0x7f00_0000_0000,
            global_dim: dim,
            global_strides: strides,
            element_strides: &[1, 1],
            interleave: 0,
            swizzle: SWIZZLE_128B,
            l2_promotion: 2,
            oob_fill: 0,
            shape: Shape::Tiled { box_dim },
        }
    }

    #[test]
    fn a_valid_tiled_map_carries_its_arguments() {
        let (dim, strides, box_dim) = ([4096, 1024], [8192], [64, 128]);
        let map = encode(&gemm_tile(&dim, &strides, &box_dim), 13000).unwrap();
        let d = decode(&map).unwrap();
        assert!(d.tiled);
        assert_eq!(d.data_type, FLOAT16);
        assert_eq!(d.global_address, 0x7f00_0000_0000);
        assert_eq!(d.global_dim, dim);
        assert_eq!(d.global_strides, strides);
        assert_eq!(d.box_dim, box_dim);
        assert_eq!(d.element_strides, [1, 1]);
        assert_eq!(d.modes, [0, SWIZZLE_128B, 2, 0]);
        assert_eq!(decode(&[0; TENSOR_MAP_QWORDS]), None);
    }

    #[test]
    fn each_documented_requirement_of_a_tiled_map_is_checked() {
        let (dim, strides, box_dim) = ([4096u64, 1024], [8192u64], [64u32, 128]);
        let ok = gemm_tile(&dim, &strides, &box_dim);
        let bad = |a: TensorMapArgs| encode(&a, 13000);
        let e = Err(CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            bad(TensorMapArgs {
                data_type: 16,
                ..ok
            }),
            e,
            "data type"
        );
        assert_eq!(
            bad(TensorMapArgs {
                global_address: ok.global_address + 8,
                ..ok
            }),
            e,
            "16-byte alignment"
        );
        assert_eq!(
            bad(TensorMapArgs {
                global_dim: &[4096, 0],
                ..ok
            }),
            e,
            "a zero dimension"
        );
        assert_eq!(
            bad(TensorMapArgs {
                global_dim: &[4096, (1 << 32) + 1],
                ..ok
            }),
            e,
            "a dimension past 2^32"
        );
        assert!(bad(TensorMapArgs {
            global_dim: &[4096, 1 << 32],
            ..ok
        })
        .is_ok());
        assert_eq!(
            bad(TensorMapArgs {
                global_strides: &[8200],
                ..ok
            }),
            e,
            "stride % 16"
        );
        assert_eq!(
            bad(TensorMapArgs {
                global_strides: &[1 << 40],
                ..ok
            }),
            e,
            "stride < 2^40"
        );
        let (d6, s6, b6, e6) = ([2u64; 6], [32u64; 5], [2u32; 6], [1u32; 6]);
        let six = TensorMapArgs {
            global_dim: &d6,
            global_strides: &s6,
            element_strides: &e6,
            swizzle: 0,
            shape: Shape::Tiled { box_dim: &b6 },
            ..ok
        };
        assert_eq!(bad(six), e, "rank 6");
        assert_eq!(
            bad(TensorMapArgs {
                shape: Shape::Tiled {
                    box_dim: &[64, 257]
                },
                ..ok
            }),
            e,
            "box past 256"
        );
        assert_eq!(
            bad(TensorMapArgs {
                shape: Shape::Tiled { box_dim: &[4, 128] },
                swizzle: 0,
                ..ok
            }),
            e,
            "an inner box of 8 bytes is not a multiple of 16"
        );
        assert_eq!(
            bad(TensorMapArgs {
                shape: Shape::Tiled {
                    box_dim: &[128, 128]
                },
                ..ok
            }),
            e,
            "256 inner bytes do not fit a 128-byte swizzle"
        );
        let fits = TensorMapArgs {
            shape: Shape::Tiled {
                box_dim: &[32, 128],
            },
            swizzle: 2,
            ..ok
        };
        assert!(bad(fits).is_ok(), "64 inner bytes fit a 64-byte swizzle");
        assert_eq!(
            bad(TensorMapArgs {
                element_strides: &[1, 9],
                ..ok
            }),
            e,
            "element stride 9"
        );
        assert_eq!(
            bad(TensorMapArgs {
                element_strides: &[0, 1],
                ..ok
            }),
            e,
            "element stride 0"
        );
        assert_eq!(
            bad(TensorMapArgs {
                interleave: 1,
                ..ok
            }),
            e,
            "interleave needs rank 3"
        );
        assert_eq!(
            bad(TensorMapArgs {
                l2_promotion: 4,
                ..ok
            }),
            e
        );
        assert_eq!(bad(TensorMapArgs { swizzle: 7, ..ok }), e);
        assert_eq!(
            bad(TensorMapArgs {
                data_type: UINT8,
                oob_fill: 1,
                ..ok
            }),
            e,
            "NaN fill on integers"
        );
        assert!(
            bad(TensorMapArgs { oob_fill: 1, ..ok }).is_ok(),
            "NaN fill on fp16"
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    swizzle: SWIZZLE_128B_ATOM_32B,
                    ..ok
                },
                12060
            ),
            e,
            "the 128B atom swizzles came with 12.8"
        );
        assert!(encode(
            &TensorMapArgs {
                swizzle: SWIZZLE_128B_ATOM_32B,
                ..ok
            },
            12080
        )
        .is_ok());
    }

    #[test]
    fn interleaved_and_packed_maps_follow_their_own_rules() {
        // NC/16HWC16 fp16: interleaved by 32 bytes, rank 4, 32-byte swizzle only.
        let (dim, strides, box_dim, es) = (
            [16u64, 8, 8, 2],
            [512u64, 4096, 32768],
            [16u32, 8, 8, 1],
            [1u32; 4],
        );
        let il = TensorMapArgs {
            data_type: FLOAT16,
            global_address: 1 << 20,
            global_dim: &dim,
            global_strides: &strides,
            element_strides: &es,
            interleave: INTERLEAVE_32B,
            swizzle: SWIZZLE_32B,
            l2_promotion: 0,
            oob_fill: 0,
            shape: Shape::Tiled { box_dim: &box_dim },
        };
        assert!(encode(&il, 13000).is_ok());
        let e = Err(CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            encode(
                &TensorMapArgs {
                    swizzle: SWIZZLE_128B,
                    ..il
                },
                13000
            ),
            e
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    global_address: (1 << 20) + 16,
                    ..il
                },
                13000
            ),
            e
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    global_strides: &[528, 4096, 32768],
                    ..il
                },
                13000
            ),
            e
        );
        // 16U4_ALIGN16B: 32-byte alignment, dimension 0 and box 0 of 128 values.
        let (pd, ps, pb) = ([256u64, 4], [256u64], [128u32, 4]);
        let packed = TensorMapArgs {
            data_type: U4_ALIGN16B,
            global_address: 1 << 20,
            global_dim: &pd,
            global_strides: &ps,
            element_strides: &[1, 1],
            interleave: 0,
            swizzle: SWIZZLE_128B,
            l2_promotion: 0,
            oob_fill: 0,
            shape: Shape::Tiled { box_dim: &pb },
        };
        assert!(encode(&packed, 13000).is_ok());
        assert_eq!(encode(&packed, 12060), e, "packed types came with 12.8");
        assert_eq!(
            encode(
                &TensorMapArgs {
                    global_dim: &[200, 4],
                    ..packed
                },
                13000
            ),
            e
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    shape: Shape::Tiled { box_dim: &[64, 4] },
                    ..packed
                },
                13000
            ),
            e
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    swizzle: 2,
                    ..packed
                },
                13000
            ),
            e
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    oob_fill: 1,
                    ..packed
                },
                13000
            ),
            e
        );
    }

    #[test]
    fn im2col_maps_check_corners_channels_and_pixels() {
        // NHWC fp16, 1 x 16 x 16 x 64, a 3 x 3 filter's corners.
        let (dim, strides, es) = ([64u64, 16, 16, 1], [128u64, 2048, 32768], [1u32; 4]);
        let (lo, hi) = ([-1i32, -1], [-1i32, -1]);
        let shape = |lo, hi, c, p| Shape::Im2col {
            lower_corner: lo,
            upper_corner: hi,
            channels_per_pixel: c,
            pixels_per_column: p,
        };
        let ok = TensorMapArgs {
            data_type: FLOAT16,
            global_address: 1 << 20,
            global_dim: &dim,
            global_strides: &strides,
            element_strides: &es,
            interleave: 0,
            swizzle: SWIZZLE_128B,
            l2_promotion: 0,
            oob_fill: 0,
            shape: shape(&lo, &hi, 64, 256),
        };
        let map = encode(&ok, 13000).unwrap();
        let d = decode(&map).unwrap();
        assert!(!d.tiled);
        assert_eq!(d.box_dim, [64, 256]);
        let e = Err(CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            encode(
                &TensorMapArgs {
                    shape: shape(&[-129, 0], &hi, 64, 256),
                    ..ok
                },
                13000
            ),
            e,
            "rank 4: corners in -128..=127"
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    shape: shape(&lo, &hi, 257, 256),
                    ..ok
                },
                13000
            ),
            e,
            "channels"
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    shape: shape(&lo, &hi, 64, 1025),
                    ..ok
                },
                13000
            ),
            e,
            "pixels"
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    shape: shape(&lo, &hi, 128, 256),
                    ..ok
                },
                13000
            ),
            e,
            "256 bytes of channels exceed the swizzle"
        );
        assert_eq!(
            encode(
                &TensorMapArgs {
                    shape: shape(&[0, 0], &[-16, 0], 64, 256),
                    ..ok
                },
                13000
            ),
            e,
            "an empty box"
        );
        let (d2, s2, e2) = ([64u64, 16], [128u64], [1u32; 2]);
        assert_eq!(
            encode(
                &TensorMapArgs {
                    global_dim: &d2,
                    global_strides: &s2,
                    element_strides: &e2,
                    shape: shape(&[], &[], 64, 256),
                    ..ok
                },
                13000
            ),
            e,
            "im2col needs rank 3"
        );
    }
}
