//! Initialisation, versions and devices: what `cuInit` and the `cuDevice*` queries answer.

use crate::*;

pub(crate) fn cuInit(flags: c_uint) -> R<()> {
    cu().init(flags)
}

pub(crate) fn cuDriverGetVersion(v: *mut c_int) -> R<()> {
    put(v, cu().driver_version())
}

pub(crate) fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> R<()> {
    if device.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(device, cu().device_index(ordinal)? as CUdevice)
}

pub(crate) fn cuDeviceGetCount(count: *mut c_int) -> R<()> {
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(count, cu().device_count()?)
}

pub(crate) fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> R<()> {
    let d = cu().device_spec(dev)?;
    put_str(name, len, &d.name)
}

pub(crate) fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> R<()> {
    let d = cu().device_spec(dev)?;
    put(
        uuid,
        CUuuid {
            bytes: d.uuid_bytes().map(|b| b as c_char),
        },
    )
}

pub(crate) fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> R<()> {
    if pi.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(pi, cu().device_attribute(attrib, dev)?)
}

pub(crate) fn cuDeviceGetPCIBusId(id: *mut c_char, len: c_int, dev: CUdevice) -> R<()> {
    put_str(id, len, &cu().pci_bus_id(dev)?)
}

pub(crate) fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> R<()> {
    if dev.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(dev, cu().device_by_pci_bus_id(cstr(id)?)?)
}

pub(crate) fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> R<()> {
    if bytes.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(bytes, clamp_u32(cu().device_spec(dev)?.total_memory))
}

pub(crate) fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> R<()> {
    if bytes.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(bytes, cu().device_spec(dev)?.total_memory as usize)
}

pub(crate) fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> R<()> {
    if major.is_null() || minor.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = cu().device_spec(dev)?;
    put(major, d.cc_major as c_int)?;
    put(minor, d.cc_minor as c_int)
}

pub(crate) fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> R<()> {
    if can.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().device_spec(dev)?;
    cu().device_spec(peer)?;
    put(can, 0)
}

pub(crate) fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    _attr: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> R<()> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    cu().device_spec(src)?;
    cu().device_spec(dst)?;
    if src == dst {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    put(value, 0)
}
