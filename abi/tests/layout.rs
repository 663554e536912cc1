//! Every struct that crosses the ABI has the size, alignment and field offsets of the
//! bindgen layouts in `cudarc::driver::sys` (CUDA 12.8 headers) and `nvml-wrapper-sys`.

use cudarc::driver::sys as cu;
use gpuslice_abi::cuda::*;
use gpuslice_abi::nvml::*;
use nvml_wrapper_sys::bindings as nv;
use std::mem::{align_of, offset_of, size_of};

macro_rules! same_layout {
    ($ours:ty, $theirs:ty, [$($field:ident),* $(,)?]) => {{
        assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), "size of {}", stringify!($ours));
        assert_eq!(align_of::<$ours>(), align_of::<$theirs>(), "align of {}", stringify!($ours));
        $(assert_eq!(
            offset_of!($ours, $field),
            offset_of!($theirs, $field),
            "offset of {}.{}", stringify!($ours), stringify!($field)
        );)*
    }};
}

#[test]
fn cuda_structs_match_bindgen() {
    same_layout!(CUuuid, cu::CUuuid_st, [bytes]);
    same_layout!(
        CUDA_ARRAY_DESCRIPTOR,
        cu::CUDA_ARRAY_DESCRIPTOR_st,
        [Width, Height, Format, NumChannels]
    );
    same_layout!(
        CUDA_ARRAY3D_DESCRIPTOR,
        cu::CUDA_ARRAY3D_DESCRIPTOR_st,
        [Width, Height, Depth, Format, NumChannels, Flags]
    );
    same_layout!(CUmemLocation, cu::CUmemLocation_st, [type_, id]);
    same_layout!(
        CUmemAllocationProp_allocFlags,
        cu::CUmemAllocationProp_st__bindgen_ty_1,
        [compressionType, gpuDirectRDMACapable, usage, reserved]
    );
    same_layout!(
        CUmemAllocationProp,
        cu::CUmemAllocationProp_st,
        [
            type_,
            requestedHandleTypes,
            location,
            win32HandleMetaData,
            allocFlags
        ]
    );
    same_layout!(CUmemAccessDesc, cu::CUmemAccessDesc_st, [location, flags]);
    same_layout!(
        CUmemPoolProps,
        cu::CUmemPoolProps_st,
        [
            allocType,
            handleTypes,
            location,
            win32SecurityAttributes,
            maxSize,
            usage,
            reserved
        ]
    );
    same_layout!(
        CUlaunchAttribute,
        cu::CUlaunchAttribute_st,
        [id, pad, value]
    );
    same_layout!(
        CUlaunchConfig,
        cu::CUlaunchConfig_st,
        [
            gridDimX,
            gridDimY,
            gridDimZ,
            blockDimX,
            blockDimY,
            blockDimZ,
            sharedMemBytes,
            hStream,
            attrs,
            numAttrs
        ]
    );
    same_layout!(
        CUDA_KERNEL_NODE_PARAMS,
        cu::CUDA_KERNEL_NODE_PARAMS_st,
        [
            func,
            gridDimX,
            gridDimY,
            gridDimZ,
            blockDimX,
            blockDimY,
            blockDimZ,
            sharedMemBytes,
            kernelParams,
            extra
        ]
    );
}

#[test]
fn cuda_constants_match_bindgen() {
    assert_eq!(
        result::CUDA_ERROR_OUT_OF_MEMORY,
        cu::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32
    );
    assert_eq!(
        result::CUDA_ERROR_NOT_SUPPORTED,
        cu::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as u32
    );
    assert_eq!(
        result::CUDA_ERROR_INVALID_CONTEXT,
        cu::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT as u32
    );
    assert_eq!(
        result::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        cu::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD as u32
    );
    assert_eq!(
        attr::MULTIPROCESSOR_COUNT,
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32
    );
    assert_eq!(
        attr::MEMORY_POOLS_SUPPORTED,
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED as i32
    );
    assert_eq!(
        attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED as i32
    );
    assert_eq!(
        attr::MAX_BLOCKS_PER_MULTIPROCESSOR,
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR as i32
    );
    assert_eq!(
        pool_attr::USED_MEM_CURRENT,
        cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT as i32
    );
    assert_eq!(
        pool_attr::RELEASE_THRESHOLD,
        cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as i32
    );
}

#[test]
fn nvml_structs_match_bindgen() {
    same_layout!(nvmlMemory_t, nv::nvmlMemory_t, [total, free, used]);
    same_layout!(
        nvmlMemory_v2_t,
        nv::nvmlMemory_v2_t,
        [version, total, reserved, free, used]
    );
    same_layout!(nvmlUtilization_t, nv::nvmlUtilization_t, [gpu, memory]);
    same_layout!(
        nvmlProcessInfo_v1_t,
        nv::nvmlProcessInfo_v1_t,
        [pid, usedGpuMemory]
    );
    same_layout!(
        nvmlProcessInfo_t,
        nv::nvmlProcessInfo_t,
        [pid, usedGpuMemory, gpuInstanceId, computeInstanceId]
    );
    same_layout!(
        nvmlProcessUtilizationSample_t,
        nv::nvmlProcessUtilizationSample_t,
        [pid, timeStamp, smUtil, memUtil, encUtil, decUtil]
    );
    same_layout!(
        nvmlPciInfo_t,
        nv::nvmlPciInfo_t,
        [
            busIdLegacy,
            domain,
            bus,
            device,
            pciDeviceId,
            pciSubSystemId,
            busId
        ]
    );
    assert_eq!(
        NVML_MEMORY_V2,
        (size_of::<nv::nvmlMemory_v2_t>() as u32) | (2 << 24)
    );
}

#[test]
fn nvml_additions_match_bindgen() {
    same_layout!(
        nvmlDeviceAttributes_t,
        nv::nvmlDeviceAttributes_t,
        [
            multiprocessorCount,
            sharedCopyEngineCount,
            sharedDecoderCount,
            sharedEncoderCount,
            sharedJpegCount,
            sharedOfaCount,
            gpuInstanceSliceCount,
            computeInstanceSliceCount,
            memorySizeMB
        ]
    );
    assert_eq!(
        NVML_DEVICE_NAME_BUFFER_SIZE,
        nv::NVML_DEVICE_NAME_BUFFER_SIZE as usize
    );
    assert_eq!(
        NVML_DEVICE_UUID_BUFFER_SIZE,
        nv::NVML_DEVICE_UUID_BUFFER_SIZE as usize
    );
    assert_eq!(
        NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE,
        nv::NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE as usize
    );
    assert_eq!(
        NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE,
        nv::NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE as usize
    );
    assert_eq!(
        NVML_VALUE_NOT_AVAILABLE_UINT,
        nv::NVML_VALUE_NOT_AVAILABLE as u32
    );
    assert_eq!(
        NVML_TEMPERATURE_GPU,
        nv::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU
    );
    assert_eq!(
        NVML_COMPUTEMODE_DEFAULT,
        nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT
    );
    assert_eq!(
        NVML_FEATURE_ENABLED,
        nv::nvmlEnableState_enum_NVML_FEATURE_ENABLED
    );
    assert_eq!(NVML_PSTATE_0, nv::nvmlPStates_enum_NVML_PSTATE_0);
    assert_eq!(NVML_PSTATE_8, nv::nvmlPStates_enum_NVML_PSTATE_8);
    assert_eq!(
        NVML_PSTATE_UNKNOWN,
        nv::nvmlPStates_enum_NVML_PSTATE_UNKNOWN
    );
    assert_eq!(NVML_DEVICE_MIG_DISABLE, nv::NVML_DEVICE_MIG_DISABLE);
}

#[test]
fn cuda_fake_additions_match_bindgen() {
    same_layout!(CUipcMemHandle, cu::CUipcMemHandle_st, [reserved]);
    same_layout!(
        CUDA_KERNEL_NODE_PARAMS_v2,
        cu::CUDA_KERNEL_NODE_PARAMS_v2_st,
        [
            func,
            gridDimX,
            gridDimY,
            gridDimZ,
            blockDimX,
            blockDimY,
            blockDimZ,
            sharedMemBytes,
            kernelParams,
            extra,
            kern,
            ctx
        ]
    );
    use gpuslice_abi::cuda::flags::*;
    assert_eq!(
        CU_STREAM_CAPTURE_STATUS_ACTIVE,
        cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32
    );
    assert_eq!(
        CU_EVENT_DISABLE_TIMING,
        cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
    );
    assert_eq!(
        CU_DEVICE_ATTRIBUTE_MAX,
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX as i32
    );
    assert_eq!(
        CU_MEM_ATTACH_GLOBAL,
        cu::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32
    );
}

#[test]
fn error_names_are_the_constants_own_spelling() {
    assert_eq!(
        result::name(result::CUDA_ERROR_OUT_OF_MEMORY),
        Some("CUDA_ERROR_OUT_OF_MEMORY")
    );
    assert_eq!(
        result::name(cu::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as u32),
        Some(format!("{:?}", cu::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED).as_str())
    );
    assert_eq!(result::name(123_456), None, "an unknown code has no name");
}
