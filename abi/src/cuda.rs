//! CUDA driver API types, result codes and constants (cuda.h, CUDA 12.x/13.x ABI).

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = u32;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUmemGenericAllocationHandle = u64;
pub type cuuint64_t = u64;

pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;

/// Result codes (`cudaError_enum`), each declared once: the constant and its
/// `cuGetErrorName` spelling come from the same line.
pub mod result {
    use super::CUresult;

    macro_rules! result_codes {
        ($($name:ident = $value:literal,)*) => {
            $(pub const $name: CUresult = $value;)*

            /// `cuGetErrorName` spelling of a code, `None` for codes this crate does not know.
            pub fn name(code: CUresult) -> Option<&'static str> {
                match code {
                    $($name => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        };
    }

    result_codes! {
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_DEINITIALIZED = 4,
        CUDA_ERROR_NO_DEVICE = 100,
        CUDA_ERROR_INVALID_DEVICE = 101,
        CUDA_ERROR_INVALID_IMAGE = 200,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_ALREADY_MAPPED = 208,
        CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
        CUDA_ERROR_ALREADY_ACQUIRED = 210,
        CUDA_ERROR_NOT_MAPPED = 211,
        CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216,
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
        CUDA_ERROR_INVALID_SOURCE = 300,
        CUDA_ERROR_FILE_NOT_FOUND = 301,
        CUDA_ERROR_INVALID_HANDLE = 400,
        CUDA_ERROR_ILLEGAL_STATE = 401,
        CUDA_ERROR_NOT_FOUND = 500,
        CUDA_ERROR_NOT_READY = 600,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
        CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
        CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
        CUDA_ERROR_LAUNCH_FAILED = 719,
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
        CUDA_ERROR_NOT_PERMITTED = 800,
        CUDA_ERROR_NOT_SUPPORTED = 801,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
        CUDA_ERROR_UNKNOWN = 999,
    }
}

/// `CUdevice_attribute` values used by gpuslice and its fake.
pub mod attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const TOTAL_CONSTANT_MEMORY: i32 = 9;
    pub const WARP_SIZE: i32 = 10;
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    pub const CLOCK_RATE: i32 = 13;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const INTEGRATED: i32 = 18;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const COMPUTE_MODE: i32 = 20;
    pub const CONCURRENT_KERNELS: i32 = 31;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
    pub const L2_CACHE_SIZE: i32 = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
    pub const MANAGED_MEMORY: i32 = 83;
    pub const CONCURRENT_MANAGED_ACCESS: i32 = 89;
    pub const COOPERATIVE_LAUNCH: i32 = 95;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
}

/// `cuGetProcAddress` flags and query results.
pub mod proc_address {
    pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
    pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
    pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
    pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
    pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
    pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;
}

/// `CUfunction_attribute` values (`cuFuncGetAttribute`, `cuKernelGetAttribute`).
pub mod func_attr {
    /// Local memory per thread, bytes.
    pub const LOCAL_SIZE_BYTES: i32 = 3;
}

/// `CUlimit` values (`cuCtxSetLimit` / `cuCtxGetLimit`).
pub mod limit {
    pub const STACK_SIZE: i32 = 0;
    pub const PRINTF_FIFO_SIZE: i32 = 1;
    /// The device-malloc heap: backed by device memory from the moment it is set.
    pub const MALLOC_HEAP_SIZE: i32 = 2;
}

/// `CUmemPool_attribute` values.
pub mod pool_attr {
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
    pub const REUSE_ALLOW_OPPORTUNISTIC: i32 = 2;
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
    pub const RELEASE_THRESHOLD: i32 = 4;
    pub const RESERVED_MEM_CURRENT: i32 = 5;
    pub const RESERVED_MEM_HIGH: i32 = 6;
    pub const USED_MEM_CURRENT: i32 = 7;
    pub const USED_MEM_HIGH: i32 = 8;
}

/// `CUmemAllocationGranularity_flags`, `CUmemLocationType`, `CUmemAllocationType`.
pub mod vmm {
    pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: i32 = 0;
    pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: i32 = 1;
    pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
    /// Host memory (12.2+): pools and allocations there never cost device memory.
    pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
    pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: u32 = 3;
    pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: u32 = 4;
    pub const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
    pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: c_uint,
    pub NumChannels: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: c_uint,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR` of the pre-3.2 ABI (`cuArrayCreate`, unsuffixed): 32-bit extents.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Format: c_uint,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` of the pre-3.2 ABI (`cuArray3DCreate`, unsuffixed).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Depth: c_uint,
    pub Format: c_uint,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// Bytes per channel element of a `CUarray_format`, `None` for formats the fake rejects.
pub fn array_format_bytes(format: c_uint) -> Option<usize> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => return None,
    })
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp_allocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requestedHandleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocationProp_allocFlags,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemPoolProps {
    pub allocType: c_uint,
    pub handleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUlaunchAttribute`: only passed through by pointer; 4-byte id, padding, 64-byte value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: c_uint,
    pub pad: [c_char; 4],
    pub value: [u64; 8],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: c_uint,
}

/// `CUDA_LAUNCH_PARAMS`: one device's entry of `cuLaunchCooperativeKernelMultiDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS` (v1; what cuGraphAddKernelNode takes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_KERNEL_NODE_PARAMS {
    pub func: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUipcMemHandle`: 64 opaque bytes passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (what cuGraphAddKernelNode_v2 takes): v1 plus `kern`, `ctx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub func: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: CUkernel,
    pub ctx: CUcontext,
}

/// Stream, event, launch and memory flags used by the fake and its clients.
pub mod flags {
    /// `CUstreamCaptureStatus`.
    pub const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
    pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;
    /// Special stream handles.
    pub const CU_STREAM_LEGACY: usize = 0x1;
    pub const CU_STREAM_PER_THREAD: usize = 0x2;
    /// `CUevent_flags`.
    pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
    /// `cuLaunchKernel` `extra` keys.
    pub const CU_LAUNCH_PARAM_END: usize = 0x00;
    pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
    pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
    /// `CUmemAttach_flags`.
    pub const CU_MEM_ATTACH_GLOBAL: u32 = 0x1;
    pub const CU_MEM_ATTACH_HOST: u32 = 0x2;
    /// `CUpointer_attribute`: the context a pointer was allocated in.
    pub const CU_POINTER_ATTRIBUTE_CONTEXT: i32 = 1;
    /// Highest `CUdevice_attribute` value + 1 in the 12.8 headers.
    pub const CU_DEVICE_ATTRIBUTE_MAX: i32 = 144;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_array_descriptors_have_the_32_bit_layout() {
        assert_eq!(std::mem::size_of::<CUDA_ARRAY_DESCRIPTOR_v1>(), 16);
        assert_eq!(std::mem::offset_of!(CUDA_ARRAY_DESCRIPTOR_v1, Format), 8);
        assert_eq!(std::mem::size_of::<CUDA_ARRAY3D_DESCRIPTOR_v1>(), 24);
        assert_eq!(std::mem::offset_of!(CUDA_ARRAY3D_DESCRIPTOR_v1, Flags), 20);
        // The 64-bit ones, for contrast.
        assert_eq!(std::mem::size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(std::mem::size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
    }
}
