//! The fake NVML's C ABI, called the way C clients call it: values agree with the shared
//! state, error codes follow nvml.h, list functions follow the INSUFFICIENT_SIZE protocol,
//! structs of every version are filled at their real offsets, PIDs carry the offset.
//!
//! Needs `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` first.

mod common;

use common::{isolated, truth, Cuda, Nvml};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_int, c_uint, CStr, CString};
use std::mem::size_of;

type Plain = unsafe extern "C" fn() -> nvmlReturn_t;
type UintOut = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
type DevStr = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
type SysStr = unsafe extern "C" fn(*mut c_char, c_uint) -> nvmlReturn_t;
type ByStr = unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
type ProcV3 = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> u32;
type ProcV1 = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> u32;
type ProcUtil = unsafe extern "C" fn(
    nvmlDevice_t,
    *mut nvmlProcessUtilizationSample_t,
    *mut c_uint,
    u64,
) -> nvmlReturn_t;

const MIB: u64 = 1 << 20;

fn uint_out(nvml: &Nvml, name: &str, dev: nvmlDevice_t) -> (nvmlReturn_t, c_uint) {
    let f: UintOut = nvml.sym(name);
    let mut v: c_uint = 0xdead;
    // SAFETY: valid out-pointer.
    let rc = unsafe { f(dev, &mut v) };
    (rc, v)
}

fn sys_string(nvml: &Nvml, name: &str) -> String {
    let f: SysStr = nvml.sym(name);
    let mut buf = [0 as c_char; 96];
    // SAFETY: buffer of the stated length.
    assert_eq!(unsafe { f(buf.as_mut_ptr(), 96) }, NVML_SUCCESS, "{name}");
    // SAFETY: NUL-terminated on success.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Every entry point this fake promises (README), checked as exported symbols.
const EXPORTS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMultiGpuBoard",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
];

#[test]
fn exports_every_promised_entry_point() {
    let nvml = Nvml::load();
    let missing: Vec<&str> = EXPORTS.iter().copied().filter(|n| !nvml.has(n)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn uninitialized_until_init_and_shutdown_is_refcounted() {
    isolated(
        "uninitialized_until_init_and_shutdown_is_refcounted",
        &[],
        || {
            let nvml = Nvml::load();
            let count: unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t =
                nvml.sym("nvmlDeviceGetCount_v2");
            let by_index: unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t =
                nvml.sym("nvmlDeviceGetHandleByIndex_v2");
            let init_v1: Plain = nvml.sym("nvmlInit");
            let init_flags: unsafe extern "C" fn(c_uint) -> nvmlReturn_t =
                nvml.sym("nvmlInitWithFlags");
            let mut n = 0;
            let mut h = std::ptr::null_mut();
            // SAFETY: valid pointers throughout; these are plain NVML calls.
            unsafe {
                assert_eq!(count(&mut n), NVML_ERROR_UNINITIALIZED);
                assert_eq!(by_index(0, &mut h), NVML_ERROR_UNINITIALIZED);
                assert_eq!(nvml.shutdown(), NVML_ERROR_UNINITIALIZED);
                // Three inits (v2, v1, flags) need three shutdowns.
                nvml.init();
                assert_eq!(init_v1(), NVML_SUCCESS);
                assert_eq!(init_flags(0), NVML_SUCCESS);
                for _ in 0..2 {
                    assert_eq!(nvml.shutdown(), NVML_SUCCESS);
                    assert_eq!(count(&mut n), NVML_SUCCESS, "still initialised");
                    assert_eq!(n, 1);
                }
                assert_eq!(nvml.shutdown(), NVML_SUCCESS);
                assert_eq!(count(&mut n), NVML_ERROR_UNINITIALIZED);
                assert_eq!(nvml.shutdown(), NVML_ERROR_UNINITIALIZED);
                // Null out-pointers once initialised.
                nvml.init();
                assert_eq!(count(std::ptr::null_mut()), NVML_ERROR_INVALID_ARGUMENT);
                assert_eq!(
                    by_index(0, std::ptr::null_mut()),
                    NVML_ERROR_INVALID_ARGUMENT
                );
            }
        },
    );
}

#[test]
fn error_strings_match_nvml() {
    let nvml = Nvml::load();
    let f: unsafe extern "C" fn(nvmlReturn_t) -> *const c_char = nvml.sym("nvmlErrorString");
    for code in [0, 1, 2, 3, 4, 5, 6, 7, 9, 13, 15, 21, 25, 999] {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr(f(code)) }
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(Some(text.as_str()), message(code), "code {code}");
    }
    // SAFETY: as above, for a code NVML does not define.
    let unknown = unsafe { CStr::from_ptr(f(12345)) };
    assert_eq!(unknown.to_str().unwrap(), "Unknown Error");
}

#[test]
fn system_versions_default_to_cuda_13() {
    isolated("system_versions_default_to_cuda_13", &[], || {
        let nvml = Nvml::load();
        // nvmlSystemGetNVMLVersion works before init, like the real one.
        assert_eq!(
            sys_string(&nvml, "nvmlSystemGetNVMLVersion"),
            "13.580.95.05"
        );
        nvml.init();
        assert_eq!(sys_string(&nvml, "nvmlSystemGetDriverVersion"), "580.95.05");
        for name in [
            "nvmlSystemGetCudaDriverVersion",
            "nvmlSystemGetCudaDriverVersion_v2",
        ] {
            let f: unsafe extern "C" fn(*mut c_int) -> nvmlReturn_t = nvml.sym(name);
            let mut v = 0;
            // SAFETY: valid out-pointer / deliberate null.
            unsafe {
                assert_eq!(f(&mut v), NVML_SUCCESS);
                assert_eq!(f(std::ptr::null_mut()), NVML_ERROR_INVALID_ARGUMENT);
            }
            assert_eq!(v, 13000, "{name}");
        }
    });
}

#[test]
fn system_versions_follow_fakegpu_driver_version() {
    isolated(
        "system_versions_follow_fakegpu_driver_version",
        &[("FAKEGPU_DRIVER_VERSION", "12080")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            assert_eq!(
                sys_string(&nvml, "nvmlSystemGetDriverVersion"),
                "570.172.08"
            );
            assert_eq!(
                sys_string(&nvml, "nvmlSystemGetNVMLVersion"),
                "12.570.172.08"
            );
            let f: unsafe extern "C" fn(*mut c_int) -> nvmlReturn_t =
                nvml.sym("nvmlSystemGetCudaDriverVersion_v2");
            let mut v = 0;
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { f(&mut v) }, NVML_SUCCESS);
            assert_eq!(v, 12080);
            // "570.172.08" needs 11 bytes with its NUL.
            let g: SysStr = nvml.sym("nvmlSystemGetDriverVersion");
            let mut buf = [0x7f as c_char; 16];
            // SAFETY: lengths never exceed the buffer; null is deliberate.
            unsafe {
                assert_eq!(g(buf.as_mut_ptr(), 10), NVML_ERROR_INSUFFICIENT_SIZE);
                assert_eq!(buf[0], 0x7f, "nothing written on INSUFFICIENT_SIZE");
                assert_eq!(g(buf.as_mut_ptr(), 11), NVML_SUCCESS);
                assert_eq!(g(std::ptr::null_mut(), 80), NVML_ERROR_INVALID_ARGUMENT);
            }
        },
    );
}

#[test]
fn devices_enumerate_with_the_state_identity() {
    isolated(
        "devices_enumerate_with_the_state_identity",
        &[("FAKEGPU_DEVICES", "v100,h200")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let state = truth();
            assert_eq!(nvml.count(), 2);
            assert_eq!(state.device_count(), 2);
            let (rc, n) = {
                let f: unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t =
                    nvml.sym("nvmlDeviceGetCount");
                let mut n = 0;
                // SAFETY: valid out-pointer.
                (unsafe { f(&mut n) }, n)
            };
            assert_eq!((rc, n), (NVML_SUCCESS, 2), "v1 count");

            let by_uuid: ByStr = nvml.sym("nvmlDeviceGetHandleByUUID");
            let by_bus: ByStr = nvml.sym("nvmlDeviceGetHandleByPciBusId_v2");
            let pci_v3: unsafe extern "C" fn(nvmlDevice_t, *mut nvmlPciInfo_t) -> u32 =
                nvml.sym("nvmlDeviceGetPciInfo_v3");
            let pci_v2: unsafe extern "C" fn(nvmlDevice_t, *mut nvmlPciInfo_t) -> u32 =
                nvml.sym("nvmlDeviceGetPciInfo_v2");
            let cc: unsafe extern "C" fn(nvmlDevice_t, *mut c_int, *mut c_int) -> u32 =
                nvml.sym("nvmlDeviceGetCudaComputeCapability");
            for i in 0..2u32 {
                let spec = state.device(i).unwrap();
                let h = nvml.handle(i);
                assert_eq!(h, nvml.handle(i), "handles are stable");
                assert_eq!(nvml.device_string("nvmlDeviceGetName", h), spec.name);
                assert_eq!(nvml.device_string("nvmlDeviceGetUUID", h), spec.uuid);
                assert_eq!(uint_out(&nvml, "nvmlDeviceGetIndex", h), (NVML_SUCCESS, i));
                assert_eq!(
                    uint_out(&nvml, "nvmlDeviceGetMinorNumber", h),
                    (NVML_SUCCESS, i)
                );

                let uuid = CString::new(spec.uuid.clone()).unwrap();
                let bus = CString::new(spec.pci_bus_id.clone()).unwrap();
                // The 4-digit-domain, lower-case spelling names the same device.
                let short = CString::new(spec.pci_bus_id[4..].to_ascii_lowercase()).unwrap();
                for (f, key) in [(by_uuid, &uuid), (by_bus, &bus), (by_bus, &short)] {
                    let mut found = std::ptr::null_mut();
                    // SAFETY: NUL-terminated key and valid out-pointer.
                    assert_eq!(unsafe { f(key.as_ptr(), &mut found) }, NVML_SUCCESS);
                    assert_eq!(found, h, "lookup by {key:?}");
                }

                for f in [pci_v3, pci_v2] {
                    // SAFETY: nvmlPciInfo_t is plain data; zeroed is a valid value.
                    let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
                    // SAFETY: valid out-pointer.
                    assert_eq!(unsafe { f(h, &mut pci) }, NVML_SUCCESS);
                    // SAFETY: NVML NUL-terminates both ids.
                    let bus_id = unsafe { CStr::from_ptr(pci.busId.as_ptr()) };
                    // SAFETY: as above.
                    let legacy = unsafe { CStr::from_ptr(pci.busIdLegacy.as_ptr()) };
                    assert_eq!(bus_id.to_str().unwrap(), spec.pci_bus_id);
                    assert_eq!(legacy.to_str().unwrap(), &spec.pci_bus_id[4..]);
                    let (domain, bus, dev) = spec.pci_parts();
                    assert_eq!((pci.domain, pci.bus, pci.device), (domain, bus, dev));
                    assert_eq!(pci.pciDeviceId & 0xffff, 0x10de, "NVIDIA vendor id");
                }

                let (mut major, mut minor) = (0, 0);
                // SAFETY: valid out-pointers.
                assert_eq!(unsafe { cc(h, &mut major, &mut minor) }, NVML_SUCCESS);
                assert_eq!((major as u32, minor as u32), (spec.cc_major, spec.cc_minor));

                let cores_per_sm = if spec.cc_major == 7 { 64 } else { 128 };
                assert_eq!(
                    uint_out(&nvml, "nvmlDeviceGetNumGpuCores", h),
                    (NVML_SUCCESS, spec.sm_count * cores_per_sm)
                );
                let attrs_fn: unsafe extern "C" fn(
                    nvmlDevice_t,
                    *mut nvmlDeviceAttributes_t,
                ) -> u32 = nvml.sym("nvmlDeviceGetAttributes_v2");
                let mut attrs = nvmlDeviceAttributes_t::default();
                // SAFETY: valid out-pointer.
                assert_eq!(unsafe { attrs_fn(h, &mut attrs) }, NVML_SUCCESS);
                assert_eq!(attrs.multiprocessorCount, spec.sm_count);
                assert_eq!(attrs.memorySizeMB, spec.total_memory / MIB);
            }

            // Errors: out-of-range index, unknown keys, malformed bus id, null arguments,
            // foreign handles, short buffers.
            let by_index: unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t =
                nvml.sym("nvmlDeviceGetHandleByIndex_v2");
            let mut h = std::ptr::null_mut();
            let unknown_uuid = CString::new("GPU-00000000-0000-0000-0000-000000000000").unwrap();
            let unknown_bus = CString::new("00000000:01:00.0").unwrap();
            let bad_bus = CString::new("not-a-bus").unwrap();
            let name_fn: DevStr = nvml.sym("nvmlDeviceGetName");
            let name_len = state.device(0).unwrap().name.len() as c_uint;
            let mut buf = [0 as c_char; 96];
            let mut junk = 0u64;
            let foreign = (&mut junk as *mut u64).cast();
            // SAFETY: every pointer is valid or deliberately null/foreign; the fake must not
            // dereference a foreign handle.
            unsafe {
                assert_eq!(by_index(2, &mut h), NVML_ERROR_INVALID_ARGUMENT);
                assert_eq!(by_uuid(unknown_uuid.as_ptr(), &mut h), NVML_ERROR_NOT_FOUND);
                assert_eq!(by_bus(unknown_bus.as_ptr(), &mut h), NVML_ERROR_NOT_FOUND);
                assert_eq!(
                    by_bus(bad_bus.as_ptr(), &mut h),
                    NVML_ERROR_INVALID_ARGUMENT
                );
                assert_eq!(
                    by_uuid(std::ptr::null(), &mut h),
                    NVML_ERROR_INVALID_ARGUMENT
                );
                assert_eq!(
                    name_fn(foreign, buf.as_mut_ptr(), 96),
                    NVML_ERROR_INVALID_ARGUMENT
                );
                assert_eq!(
                    name_fn(std::ptr::null_mut(), buf.as_mut_ptr(), 96),
                    NVML_ERROR_INVALID_ARGUMENT
                );
                let h0 = nvml.handle(0);
                assert_eq!(
                    name_fn(h0, buf.as_mut_ptr(), name_len),
                    NVML_ERROR_INSUFFICIENT_SIZE
                );
                assert_eq!(name_fn(h0, buf.as_mut_ptr(), name_len + 1), NVML_SUCCESS);
                assert_eq!(
                    name_fn(h0, std::ptr::null_mut(), 96),
                    NVML_ERROR_INVALID_ARGUMENT
                );
            }

            // Handles survive a shutdown/init cycle unchanged.
            let before = nvml.handle(1);
            assert_eq!(nvml.shutdown(), NVML_SUCCESS);
            nvml.init();
            assert_eq!(nvml.handle(1), before);
        },
    );
}

#[test]
fn board_state_of_idle_devices() {
    isolated(
        "board_state_of_idle_devices",
        &[("FAKEGPU_DEVICES", "v100,h200")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let (v100, h200) = (nvml.handle(0), nvml.handle(1));
            let ok = |v| (NVML_SUCCESS, v);
            assert_eq!(uint_out(&nvml, "nvmlDeviceGetComputeMode", v100), ok(0));
            assert_eq!(uint_out(&nvml, "nvmlDeviceGetPersistenceMode", v100), ok(1));
            assert_eq!(uint_out(&nvml, "nvmlDeviceGetMultiGpuBoard", v100), ok(0));
            assert_eq!(
                uint_out(&nvml, "nvmlDeviceGetPerformanceState", v100),
                ok(8)
            );
            assert_eq!(
                uint_out(&nvml, "nvmlDeviceGetEnforcedPowerLimit", v100),
                ok(250_000)
            );
            assert_eq!(
                uint_out(&nvml, "nvmlDeviceGetEnforcedPowerLimit", h200),
                ok(700_000)
            );
            assert_eq!(uint_out(&nvml, "nvmlDeviceGetPowerUsage", v100), ok(25_000));
            assert_eq!(
                uint_out(&nvml, "nvmlDeviceGetFanSpeed", v100).0,
                NVML_ERROR_NOT_SUPPORTED
            );

            let temp: unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut c_uint) -> u32 =
                nvml.sym("nvmlDeviceGetTemperature");
            let mig: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut c_uint) -> u32 =
                nvml.sym("nvmlDeviceGetMigMode");
            let (mut t, mut cur, mut pend) = (0, 9, 9);
            // SAFETY: valid out-pointers.
            unsafe {
                assert_eq!(temp(v100, NVML_TEMPERATURE_GPU, &mut t), NVML_SUCCESS);
                assert_eq!(t, 30, "idle temperature");
                assert_eq!(temp(v100, 1, &mut t), NVML_ERROR_INVALID_ARGUMENT);
                assert_eq!(mig(v100, &mut cur, &mut pend), NVML_ERROR_NOT_SUPPORTED);
                assert_eq!(mig(h200, &mut cur, &mut pend), NVML_SUCCESS);
            }
            assert_eq!((cur, pend), (0, 0), "H200 has MIG, disabled");
            assert_eq!(nvml.utilization(v100).gpu, 0);
        },
    );
}

#[test]
fn memory_info_v1_and_v2_track_allocations() {
    isolated(
        "memory_info_v1_and_v2_track_allocations",
        &[("FAKEGPU_CTX_OVERHEAD", "67108864")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let state = truth();
            let h = nvml.handle(0);
            let total = state.device(0).unwrap().total_memory;
            let reserved = fakegpu::nvml_view::RESERVED_MEMORY_BYTES;

            let check = |expected_used: u64| {
                assert_eq!(state.used_memory(0), expected_used, "the state's own count");
                let v2 = nvml.memory_v2(h);
                assert_eq!(v2.version, NVML_MEMORY_V2);
                assert_eq!(v2.total, total);
                assert_eq!(v2.reserved, reserved);
                assert_eq!(v2.used, expected_used);
                assert_eq!(v2.free, total - reserved - expected_used);
                let v1 = nvml.memory_v1(h);
                assert_eq!(v1.total, total);
                assert_eq!(
                    v1.used,
                    expected_used + reserved,
                    "v1 counts the reservation"
                );
                assert_eq!(v1.free + v1.used, v1.total);
            };
            check(0);

            let cuda = Cuda::load();
            cuda.init_context(0);
            check(64 * MIB);
            // 3 MiB + 1 byte rounds up to the 2 MiB granularity: 4 MiB.
            cuda.alloc(3 * MIB as usize + 1);
            check(64 * MIB + 4 * MIB);

            let f: unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> u32 =
                nvml.sym("nvmlDeviceGetMemoryInfo_v2");
            let mut wrong = nvmlMemory_v2_t {
                version: (size_of::<nvmlMemory_v2_t>() as c_uint) | (1 << 24),
                ..Default::default()
            };
            // SAFETY: valid out-pointer / deliberate null.
            unsafe {
                assert_eq!(f(h, &mut wrong), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
                assert_eq!(f(h, std::ptr::null_mut()), NVML_ERROR_INVALID_ARGUMENT);
            }
            assert_eq!(wrong.total, 0, "nothing written on a version mismatch");
        },
    );
}

#[test]
fn process_lists_follow_the_size_protocol_layouts_and_pid_offset() {
    isolated(
        "process_lists_follow_the_size_protocol_layouts_and_pid_offset",
        &[
            ("FAKEGPU_PID_OFFSET", "100000"),
            ("FAKEGPU_CTX_OVERHEAD", "33554432"),
        ],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let h = nvml.handle(0);
            let v3: ProcV3 = nvml.sym("nvmlDeviceGetComputeRunningProcesses_v3");
            let v2: ProcV3 = nvml.sym("nvmlDeviceGetComputeRunningProcesses_v2");
            let v1: ProcV1 = nvml.sym("nvmlDeviceGetComputeRunningProcesses");
            let gfx: ProcV3 = nvml.sym("nvmlDeviceGetGraphicsRunningProcesses_v3");
            let util: ProcUtil = nvml.sym("nvmlDeviceGetProcessUtilization");
            let mut n: c_uint = 0;

            // No process yet: an empty list is SUCCESS with 0, whatever the buffer.
            // SAFETY: valid count, null buffer.
            unsafe {
                assert_eq!(v3(h, &mut n, std::ptr::null_mut()), NVML_SUCCESS);
                assert_eq!(n, 0);
                let mut u = 0;
                assert_eq!(
                    util(h, std::ptr::null_mut(), &mut u, 0),
                    NVML_ERROR_NOT_FOUND,
                    "no process, no samples"
                );
            }

            let cuda = Cuda::load();
            cuda.init_context(0);
            cuda.alloc(10 * MIB as usize);
            let me = std::process::id();
            let expected_pid = me + 100_000;
            let expected_mem = 32 * MIB + 10 * MIB;
            let state = truth();
            let truth_procs = state.processes(0);
            assert_eq!(truth_procs.len(), 1);
            assert_eq!(truth_procs[0].pid, me, "the state keeps real PIDs");
            assert_eq!(truth_procs[0].used_memory, expected_mem);

            for f in [v3, v2] {
                let mut buf = [nvmlProcessInfo_t::default(); 2];
                // SAFETY: `n` never exceeds the buffer's 2 entries; nulls are deliberate.
                unsafe {
                    n = 0;
                    assert_eq!(
                        f(h, &mut n, std::ptr::null_mut()),
                        NVML_ERROR_INSUFFICIENT_SIZE
                    );
                    assert_eq!(n, 1, "size query returns the needed count");
                    n = 0;
                    assert_eq!(f(h, &mut n, buf.as_mut_ptr()), NVML_ERROR_INSUFFICIENT_SIZE);
                    assert_eq!(n, 1);
                    n = 1;
                    assert_eq!(
                        f(h, &mut n, std::ptr::null_mut()),
                        NVML_ERROR_INVALID_ARGUMENT
                    );
                    assert_eq!(
                        f(h, std::ptr::null_mut(), buf.as_mut_ptr()),
                        NVML_ERROR_INVALID_ARGUMENT
                    );
                    n = 2;
                    assert_eq!(f(h, &mut n, buf.as_mut_ptr()), NVML_SUCCESS);
                }
                assert_eq!(n, 1, "count is set to the entries written");
                assert_eq!(buf[0].pid, expected_pid, "PID carries FAKEGPU_PID_OFFSET");
                assert_eq!(buf[0].usedGpuMemory, expected_mem);
                assert_eq!(buf[0].gpuInstanceId, u32::MAX);
                assert_eq!(buf[0].computeInstanceId, u32::MAX);
                assert_eq!(buf[1].pid, 0, "nothing written past the count");
            }

            // Raw byte views: each version writes exactly its struct size at its offsets.
            let v1_size = size_of::<nvmlProcessInfo_v1_t>();
            let v3_size = size_of::<nvmlProcessInfo_t>();
            assert_eq!((v1_size, v3_size), (16, 24));
            let mut raw = [0xAAu8; 64];
            n = 1;
            let mut aligned = [0xAAAA_AAAA_AAAA_AAAAu64; 8];
            // SAFETY: 64 bytes hold one entry of either version; u64 alignment holds
            // because the array is re-aligned through a u64 buffer below.
            unsafe {
                assert_eq!(v1(h, &mut n, aligned.as_mut_ptr().cast()), NVML_SUCCESS);
                std::ptr::copy_nonoverlapping(aligned.as_ptr().cast::<u8>(), raw.as_mut_ptr(), 64);
            }
            assert_eq!(
                u32::from_ne_bytes(raw[0..4].try_into().unwrap()),
                expected_pid
            );
            assert_eq!(
                u64::from_ne_bytes(raw[8..16].try_into().unwrap()),
                expected_mem
            );
            assert!(
                raw[v1_size..].iter().all(|&b| b == 0xAA),
                "v1 wrote past 16 bytes"
            );
            let mut aligned = [0xAAAA_AAAA_AAAA_AAAAu64; 8];
            n = 1;
            // SAFETY: as above, one v3 entry fits.
            unsafe {
                assert_eq!(v3(h, &mut n, aligned.as_mut_ptr().cast()), NVML_SUCCESS);
                std::ptr::copy_nonoverlapping(aligned.as_ptr().cast::<u8>(), raw.as_mut_ptr(), 64);
            }
            assert_eq!(
                u32::from_ne_bytes(raw[0..4].try_into().unwrap()),
                expected_pid
            );
            assert_eq!(
                u64::from_ne_bytes(raw[8..16].try_into().unwrap()),
                expected_mem
            );
            assert_eq!(
                u32::from_ne_bytes(raw[16..20].try_into().unwrap()),
                u32::MAX
            );
            assert_eq!(
                u32::from_ne_bytes(raw[20..24].try_into().unwrap()),
                u32::MAX
            );
            assert!(
                raw[v3_size..].iter().all(|&b| b == 0xAA),
                "v3 wrote past 24 bytes"
            );

            // Graphics: always empty.
            n = 5;
            assert_eq!(
                // SAFETY: valid count, null buffer.
                unsafe { gfx(h, &mut n, std::ptr::null_mut()) },
                NVML_SUCCESS
            );
            assert_eq!(n, 0);

            // Per-process utilisation: size query with a null buffer, then the sample.
            let mut count: c_uint = 0;
            let mut samples = [nvmlProcessUtilizationSample_t::default(); 2];
            let before_us = fakegpu::nvml_sampling::realtime_us();
            // SAFETY: `count` never exceeds the buffer's 2 entries.
            unsafe {
                assert_eq!(
                    util(h, std::ptr::null_mut(), &mut count, 0),
                    NVML_ERROR_INSUFFICIENT_SIZE
                );
                assert_eq!(count, 1);
                count = 0;
                assert_eq!(
                    util(h, samples.as_mut_ptr(), &mut count, 0),
                    NVML_ERROR_INSUFFICIENT_SIZE
                );
                count = 2;
                assert_eq!(util(h, samples.as_mut_ptr(), &mut count, 0), NVML_SUCCESS);
            }
            let after_us = fakegpu::nvml_sampling::realtime_us();
            assert_eq!(count, 1);
            assert_eq!(samples[0].pid, expected_pid);
            assert!(
                (before_us - 2_000..=after_us + 2_000).contains(&samples[0].timeStamp),
                "timestamp in wall-clock microseconds, as the real driver's: {} not in {before_us}..{after_us}",
                samples[0].timeStamp
            );
            assert_eq!(samples[0].smUtil, 0, "no kernel has run");
            // Nothing newer than "now": NOT_FOUND.
            // SAFETY: valid pointers.
            let rc = unsafe { util(h, samples.as_mut_ptr(), &mut count, after_us + 10_000_000) };
            assert_eq!(rc, NVML_ERROR_NOT_FOUND);
            assert_eq!(
                uint_out(&nvml, "nvmlDeviceGetPerformanceState", h),
                (NVML_SUCCESS, 0)
            );
        },
    );
}
