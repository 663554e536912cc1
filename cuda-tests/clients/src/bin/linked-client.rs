//! `linked-client`: reaches the driver through symbols bound by the dynamic linker, like any
//! program built with `-lcuda -lnvidia-ml` (build.rs links it against generated stubs; at run
//! time LD_LIBRARY_PATH supplies the fake or a real driver). Runs the shared scenarios, plus
//! `nvml`, which only this client implements.

use cuda_clients::driver::Driver;
use cuda_clients::ffi::*;
use gpuslice_abi::nvml::*;
use serde_json::{json, Value};

/// Expands the entry-point table into a `#[link(name = "cuda")]` extern block and a
/// [`Driver`] holding the imported functions.
///
/// Rust calls imported functions through GOT slots that the loader fills at start-up (no
/// lazy PLT binding), so a driver lacking any of these symbols stops this client before
/// `main` with "symbol lookup error: undefined symbol: X", as it would a C program linked
/// with `-lcuda -Wl,-z,now`.
macro_rules! linked_driver {
    ($($name:ident = $symbol:literal, $version:literal, $pt:ident, ($($arg:ident : $ty:ty),*);)*) => {
        #[link(name = "cuda")]
        extern "C" {
            $(
                #[link_name = $symbol]
                fn $name($($arg: $ty),*) -> CUresult;
            )*
        }

        fn linked_driver() -> Driver {
            Driver {
                client: "linked",
                $($name: Some($name as unsafe extern "C" fn($($ty),*) -> CUresult),)*
            }
        }
    };
}

cuda_clients::for_each_entry_point!(linked_driver);

#[link(name = "nvidia-ml")]
extern "C" {
    fn nvmlInit_v2() -> nvmlReturn_t;
    fn nvmlShutdown() -> nvmlReturn_t;
    fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> nvmlReturn_t;
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t;
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t;
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, len: c_uint) -> nvmlReturn_t;
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, len: c_uint) -> nvmlReturn_t;
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t;
    fn nvmlDeviceGetMemoryInfo_v2(
        device: nvmlDevice_t,
        memory: *mut nvmlMemory_v2_t,
    ) -> nvmlReturn_t;
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) -> nvmlReturn_t;
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("nvml") {
        println!("{}", nvml());
        return;
    }
    let driver = linked_driver();
    std::process::exit(cuda_clients::scenario::main_with(&driver, &args));
}

/// `NVML_SUCCESS`-style spelling of an NVML return code.
fn nvml_name(code: nvmlReturn_t) -> String {
    use gpuslice_abi::nvml::ret::*;
    let name = match code {
        NVML_SUCCESS => "NVML_SUCCESS",
        NVML_ERROR_UNINITIALIZED => "NVML_ERROR_UNINITIALIZED",
        NVML_ERROR_INVALID_ARGUMENT => "NVML_ERROR_INVALID_ARGUMENT",
        NVML_ERROR_NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED",
        NVML_ERROR_NO_PERMISSION => "NVML_ERROR_NO_PERMISSION",
        NVML_ERROR_ALREADY_INITIALIZED => "NVML_ERROR_ALREADY_INITIALIZED",
        NVML_ERROR_NOT_FOUND => "NVML_ERROR_NOT_FOUND",
        NVML_ERROR_INSUFFICIENT_SIZE => "NVML_ERROR_INSUFFICIENT_SIZE",
        NVML_ERROR_DRIVER_NOT_LOADED => "NVML_ERROR_DRIVER_NOT_LOADED",
        NVML_ERROR_FUNCTION_NOT_FOUND => "NVML_ERROR_FUNCTION_NOT_FOUND",
        NVML_ERROR_GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
        NVML_ERROR_NO_DATA => "NVML_ERROR_NO_DATA",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        NVML_ERROR_UNKNOWN => "NVML_ERROR_UNKNOWN",
        other => return format!("nvmlReturn_t({other})"),
    };
    name.to_string()
}

fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// nvmlInit_v2, driver version, device count and per device name, UUID, memory info v1 and
/// v2 and running compute processes (v3): what nvidia-smi and monitoring agents read.
fn nvml() -> Value {
    // SAFETY: nvmlInit_v2 takes no arguments.
    let init = unsafe { nvmlInit_v2() };
    if init != 0 {
        return json!({"scenario": "nvml", "client": "linked", "init": nvml_name(init)});
    }
    let mut version = [0 as c_char; NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    // SAFETY: the buffer is writable for the length passed.
    let version_r =
        unsafe { nvmlSystemGetDriverVersion(version.as_mut_ptr(), version.len() as c_uint) };
    let mut count: c_uint = 0;
    // SAFETY: count is a valid out-pointer.
    let count_r = unsafe { nvmlDeviceGetCount_v2(&mut count) };
    let mut devices = Vec::new();
    for i in 0..count {
        let mut device: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: device is a valid out-pointer.
        let handle_r = unsafe { nvmlDeviceGetHandleByIndex_v2(i, &mut device) };
        if handle_r != 0 {
            devices.push(json!({"index": i, "handle": nvml_name(handle_r)}));
            continue;
        }
        let mut name = [0 as c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        let mut uuid = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        let mut mem = nvmlMemory_t::default();
        let mut mem2 = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            ..Default::default()
        };
        // SAFETY: `device` came from NVML; every buffer is writable for the length passed
        // and the structs are the ABI's layouts (mem2 carries the version NVML checks).
        let (name_r, uuid_r, mem_r, mem2_r) = unsafe {
            (
                nvmlDeviceGetName(device, name.as_mut_ptr(), name.len() as c_uint),
                nvmlDeviceGetUUID(device, uuid.as_mut_ptr(), uuid.len() as c_uint),
                nvmlDeviceGetMemoryInfo(device, &mut mem),
                nvmlDeviceGetMemoryInfo_v2(device, &mut mem2),
            )
        };
        // Size query first (count 0, null buffer), then the fill, with headroom for a
        // process starting in between, as nvidia-smi does.
        let mut n: c_uint = 0;
        // SAFETY: a zero count with a null buffer is the documented size query.
        let size_r = unsafe {
            nvmlDeviceGetComputeRunningProcesses_v3(device, &mut n, std::ptr::null_mut())
        };
        let mut infos = vec![nvmlProcessInfo_t::default(); n as usize + 8];
        let mut filled = infos.len() as c_uint;
        // SAFETY: `infos` holds `filled` elements.
        let procs_r = unsafe {
            nvmlDeviceGetComputeRunningProcesses_v3(device, &mut filled, infos.as_mut_ptr())
        };
        let processes: Vec<Value> = if procs_r == 0 {
            infos[..filled as usize]
                .iter()
                .map(|p| json!({"pid": p.pid, "used_memory": p.usedGpuMemory}))
                .collect()
        } else {
            Vec::new()
        };
        devices.push(json!({
            "index": i,
            "name_result": nvml_name(name_r),
            "name": c_text(&name),
            "uuid_result": nvml_name(uuid_r),
            "uuid": c_text(&uuid),
            "memory_result": nvml_name(mem_r),
            "memory": {"total": mem.total, "free": mem.free, "used": mem.used},
            "memory_v2_result": nvml_name(mem2_r),
            "memory_v2": {"total": mem2.total, "reserved": mem2.reserved, "free": mem2.free, "used": mem2.used},
            "processes_size_query": nvml_name(size_r),
            "processes_result": nvml_name(procs_r),
            "processes": processes,
        }));
    }
    // SAFETY: balanced with the successful nvmlInit_v2 above.
    let shutdown = unsafe { nvmlShutdown() };
    json!({
        "scenario": "nvml",
        "client": "linked",
        "init": nvml_name(init),
        "driver_version_result": nvml_name(version_r),
        "driver_version": c_text(&version),
        "count_result": nvml_name(count_r),
        "count": count,
        "devices": devices,
        "shutdown": nvml_name(shutdown),
    })
}
