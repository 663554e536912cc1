//! The built `libfakegpu_cuda.so` through the C ABI, as clients see it: proc-address identity,
//! many threads at once, several processes sharing one simulated GPU, a SIGKILLed process's
//! memory, fork.
//!
//! Scenarios that need their own environment (state file, devices) run in child processes:
//! this test binary re-executes itself with `FAKEGPU_TEST_ROLE` set and
//! `--ignored --exact child_role`, which runs the ignored `child_role` entry point as the
//! child's program (a normal run lists it as ignored, never as a pass). Parent and child
//! synchronise over pipes (lines starting with "@@ "), never with sleeps.

use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const SUCCESS: u32 = 0;
const OOM: u32 = 2;
const NOT_INITIALIZED: u32 = 3;
const NOT_FOUND: u32 = 500;
const MIB: u64 = 1 << 20;

/// Every symbol the library exports (`nm -D --defined-only`).
const EXPORTS: &str = "
    cuArray3DCreate cuArray3DCreate_v2 cuArrayCreate cuArrayCreate_v2 cuArrayDestroy 
    cuCtxCreate cuCtxCreate_v2 cuCtxCreate_v3 cuCtxCreate_v4 cuCtxDestroy cuCtxDestroy_v2 
    cuCtxGetApiVersion cuCtxGetCurrent cuCtxGetDevice cuCtxGetLimit cuCtxPopCurrent_v2 cuCtxPushCurrent_v2 
    cuCtxSetCurrent cuCtxSetLimit cuCtxSynchronize cuDeviceComputeCapability cuDeviceGet 
    cuDeviceGetAttribute cuDeviceGetByPCIBusId cuDeviceGetCount cuDeviceGetDefaultMemPool 
    cuDeviceGetGraphMemAttribute cuDeviceGetMemPool cuDeviceGetName cuDeviceGetPCIBusId 
    cuDeviceGetUuid cuDeviceGetUuid_v2 cuDeviceGraphMemTrim cuDevicePrimaryCtxGetState 
    cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxReset 
    cuDevicePrimaryCtxReset_v2 cuDevicePrimaryCtxRetain cuDevicePrimaryCtxSetFlags 
    cuDevicePrimaryCtxSetFlags_v2 cuDeviceSetMemPool cuDeviceTotalMem cuDeviceTotalMem_v2 
    cuDriverGetVersion cuEventCreate cuEventDestroy_v2 cuEventElapsedTime 
    cuEventElapsedTime_v2 cuEventQuery cuEventRecord cuEventRecord_ptsz cuEventSynchronize 
    cuFuncGetAttribute cuGetErrorName cuGetErrorString cuGetExportTable cuGetProcAddress 
    cuGetProcAddress_v2 cuGraphAddKernelNode cuGraphAddKernelNode_v2 cuGraphAddMemAllocNode 
    cuGraphCreate cuGraphDestroy cuGraphExecDestroy cuGraphInstantiate 
    cuGraphInstantiateWithFlags cuGraphInstantiate_v2 cuGraphLaunch cuGraphLaunch_ptsz 
    cuGraphUpload cuGraphUpload_ptsz cuInit cuIpcCloseMemHandle cuIpcGetMemHandle 
    cuIpcOpenMemHandle cuIpcOpenMemHandle_v2 cuKernelGetFunction cuLaunch 
    cuLaunchCooperativeKernel cuLaunchCooperativeKernel_ptsz cuLaunchGrid cuLaunchGridAsync 
    cuLaunchKernel cuLaunchKernelEx cuLaunchKernelEx_ptsz cuLaunchKernel_ptsz 
    cuLibraryGetKernel cuLibraryLoadData cuLibraryUnload cuMemAddressFree cuMemAddressReserve 
    cuMemAlloc cuMemAllocAsync cuMemAllocAsync_ptsz cuMemAllocFromPoolAsync 
    cuMemAllocFromPoolAsync_ptsz cuMemAllocHost_v2 cuMemAllocManaged cuMemAllocPitch 
    cuMemAllocPitch_v2 cuMemAlloc_v2 cuMemCreate cuMemFree cuMemFreeAsync cuMemFreeAsync_ptsz 
    cuMemFreeHost cuMemFree_v2 cuMemGetAddressRange_v2 cuMemGetAllocationGranularity 
    cuMemGetAllocationPropertiesFromHandle cuMemGetInfo cuMemGetInfo_v2 cuMemHostAlloc 
    cuMemMap cuMemPoolCreate cuMemPoolDestroy cuMemPoolGetAttribute cuMemPoolSetAttribute 
    cuMemPoolTrimTo cuMemRelease cuMemRetainAllocationHandle cuMemSetAccess cuMemUnmap 
    cuMemcpyDtoD_v2 cuMemcpyDtoD_v2_ptds cuMemcpyDtoHAsync_v2 cuMemcpyDtoHAsync_v2_ptsz 
    cuMemcpyDtoH_v2 cuMemcpyDtoH_v2_ptds cuMemcpyHtoDAsync_v2 cuMemcpyHtoDAsync_v2_ptsz 
    cuMemcpyHtoD_v2 cuMemcpyHtoD_v2_ptds cuMemsetD32_v2 cuMemsetD32_v2_ptds cuMemsetD8Async 
    cuMemsetD8Async_ptsz cuMemsetD8_v2 cuMemsetD8_v2_ptds cuMipmappedArrayCreate 
    cuMipmappedArrayDestroy cuModuleGetFunction cuModuleGetGlobal_v2 cuModuleLoad 
    cuModuleLoadData cuModuleLoadDataEx cuModuleUnload cuStreamBeginCapture 
    cuStreamBeginCapture_ptsz cuStreamBeginCapture_v2 cuStreamBeginCapture_v2_ptsz 
    cuStreamCreate cuStreamCreateWithPriority cuStreamDestroy_v2 cuStreamEndCapture 
    cuStreamEndCapture_ptsz cuStreamIsCapturing cuStreamIsCapturing_ptsz cuStreamQuery 
    cuStreamQuery_ptsz cuStreamSynchronize cuStreamSynchronize_ptsz cuStreamWaitEvent 
    cuStreamWaitEvent_ptsz cuTensorMapEncodeIm2col cuTensorMapEncodeTiled ";

fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .unwrap()
        .join("libfakegpu_cuda.so")
}

fn load() -> Library {
    let p = lib_path();
    // SAFETY: loading our own cdylib; its initialisers are Rust statics only.
    unsafe { Library::new(&p) }.unwrap_or_else(|e| panic!("load {}: {e}", p.display()))
}

type GetProc = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;
type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> u32;

/// The functions the scenarios call.
struct Api {
    _lib: &'static Library,
    init: unsafe extern "C" fn(c_uint) -> u32,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> u32,
    retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32,
    set_current: unsafe extern "C" fn(*mut c_void) -> u32,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> u32,
    free: unsafe extern "C" fn(u64) -> u32,
    get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> u32,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32,
    get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> u32,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> u32,
    ctx_sync: unsafe extern "C" fn() -> u32,
}

fn sym<T: Copy>(lib: &'static Library, name: &str) -> T {
    // SAFETY: the caller names a symbol whose C signature matches T.
    let s: Symbol<T> =
        unsafe { lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"));
    *s
}

impl Api {
    fn new() -> Api {
        let lib: &'static Library = Box::leak(Box::new(load()));
        Api {
            _lib: lib,
            init: sym(lib, "cuInit"),
            device_get_count: sym(lib, "cuDeviceGetCount"),
            retain: sym(lib, "cuDevicePrimaryCtxRetain"),
            set_current: sym(lib, "cuCtxSetCurrent"),
            alloc: sym(lib, "cuMemAlloc_v2"),
            free: sym(lib, "cuMemFree_v2"),
            get_info: sym(lib, "cuMemGetInfo_v2"),
            module_load_data: sym(lib, "cuModuleLoadData"),
            get_function: sym(lib, "cuModuleGetFunction"),
            launch: sym(lib, "cuLaunchKernel"),
            ctx_sync: sym(lib, "cuCtxSynchronize"),
        }
    }

    /// cuInit + primary context of device 0, current on the calling thread.
    fn start(&self) -> *mut c_void {
        // SAFETY: valid arguments and out-pointers per the CUDA API.
        unsafe {
            assert_eq!((self.init)(0), SUCCESS);
            let mut ctx = std::ptr::null_mut();
            assert_eq!((self.retain)(&mut ctx, 0), SUCCESS);
            assert_eq!((self.set_current)(ctx), SUCCESS);
            ctx
        }
    }

    fn mem_info(&self) -> (u64, u64) {
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { (self.get_info)(&mut f, &mut t) }, SUCCESS);
        (f as u64, t as u64)
    }

    fn kernel(&self) -> *mut c_void {
        let mut m = std::ptr::null_mut();
        let mut f = std::ptr::null_mut();
        let image = b"any bytes\0";
        // SAFETY: valid out-pointers, a non-null image and a C string name.
        unsafe {
            assert_eq!(
                (self.module_load_data)(&mut m, image.as_ptr().cast()),
                SUCCESS
            );
            assert_eq!((self.get_function)(&mut f, m, c"spin".as_ptr()), SUCCESS);
        }
        f
    }

    /// One wave of `ns` on the legacy stream.
    fn launch_ns(&self, f: *mut c_void, ns: u64) {
        let mut ns = ns;
        let mut params = [&mut ns as *mut u64 as *mut c_void];
        // SAFETY: kernelParams[0] points to the u64 ns_per_wave, per the fake's contract.
        let r = unsafe {
            (self.launch)(
                f,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, SUCCESS);
    }
}

// ---------------------------------------------------------------------------------------
// Child processes

struct Kid {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Kid {
    fn spawn(role: &str, state: &Path, env: &[(&str, String)]) -> Kid {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "child_role",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("FAKEGPU_TEST_ROLE", role)
        .env("FAKEGPU_STATE", state)
        .env_remove("FAKEGPU_CONFIG")
        .env_remove("FAKEGPU_DEVICES")
        .env_remove("FAKEGPU_RELEASE_DELAY_MS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Kid { child, stdin, out }
    }

    /// The next protocol line (without "@@ "), skipping the test harness's own output.
    fn read(&mut self) -> String {
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "child ended before answering");
            if let Some(rest) = line.trim_end().strip_prefix("@@ ") {
                return rest.to_string();
            }
        }
    }

    fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn finish(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }
}

fn state_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "fakegpu-cuda-it-{}-{name}-{}",
        std::process::id(),
        fakegpu::now_ns()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

fn reply(s: String) {
    println!("@@ {s}");
}

fn wait_line() -> String {
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    l.trim().to_string()
}

/// The program of a child process. Ignored in a normal run, so that it never counts as a pass;
/// run alone (`--ignored`) without a role from its parent, it fails saying so.
#[test]
#[ignore = "child process entry of the multi-process tests (Kid::spawn sets its role)"]
fn child_role() {
    let role = std::env::var("FAKEGPU_TEST_ROLE").expect(
        "child_role is the child program of the multi-process tests, which set FAKEGPU_TEST_ROLE; \
         it tests nothing alone",
    );
    let api = Api::new();
    match role.as_str() {
        "hold" => {
            api.start();
            let bytes: u64 = std::env::var("FAKEGPU_TEST_BYTES")
                .unwrap()
                .parse()
                .unwrap();
            let mut p = 0u64;
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { (api.alloc)(&mut p, bytes as usize) }, SUCCESS);
            reply(format!("allocated {}", std::process::id()));
            if wait_line() == "free" {
                // SAFETY: p came from cuMemAlloc_v2.
                assert_eq!(unsafe { (api.free)(p) }, SUCCESS);
                reply("freed".into());
                wait_line();
            }
        }
        "watch" => {
            api.start();
            loop {
                match wait_line().as_str() {
                    "q" => {
                        let (f, t) = api.mem_info();
                        reply(format!("{f} {t}"));
                    }
                    _ => return,
                }
            }
        }
        "threads" => threads_scenario(&api),
        "fork" => fork_scenario(&api),
        "errors" => errors_scenario(&api),
        "legacy" => legacy_scenario(&api),
        "tensor_map" => tensor_map_scenario(&api),
        other => panic!("unknown role {other}"),
    }
    // Proves to the parent that the scenario ran to its end (not filtered out, not skipped).
    reply("done".into());
}

// ---------------------------------------------------------------------------------------
// Scenarios

#[test]
fn proc_address_returns_the_exported_pointers() {
    let lib: &'static Library = Box::leak(Box::new(load()));
    let gpa: GetProc = sym(lib, "cuGetProcAddress_v2");
    let gpa1: GetProcV1 = sym(lib, "cuGetProcAddress");
    let dlsym = |name: &str| -> usize {
        let f: unsafe extern "C" fn() = sym(lib, name);
        f as usize
    };
    let query = |name: &str, version: c_int, flags: u64| -> (u32, usize, c_int) {
        let c = CString::new(name).unwrap();
        let mut p = std::ptr::null_mut();
        let mut status = -1;
        // SAFETY: valid C string and out-pointers.
        let r = unsafe { gpa(c.as_ptr(), &mut p, version, flags, &mut status) };
        (r, p as usize, status)
    };
    // (asked name, cudaVersion, flags, expected export)
    let cases: &[(&str, c_int, u64, &str)] = &[
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3010, 0, "cuMemAlloc"),
        ("cuMemFree", 3010, 0, "cuMemFree"),
        ("cuMemGetInfo", 3010, 0, "cuMemGetInfo"),
        ("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"),
        ("cuDeviceTotalMem", 2000, 0, "cuDeviceTotalMem"),
        ("cuMemAllocPitch", 3010, 0, "cuMemAllocPitch"),
        ("cuArrayCreate", 3010, 0, "cuArrayCreate"),
        ("cuArray3DCreate", 3010, 0, "cuArray3DCreate"),
        ("cuCtxCreate", 2000, 0, "cuCtxCreate"),
        ("cuCtxDestroy", 3020, 0, "cuCtxDestroy"),
        ("cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"),
        (
            "cuDevicePrimaryCtxRelease",
            7000,
            0,
            "cuDevicePrimaryCtxRelease",
        ),
        (
            "cuDevicePrimaryCtxReset",
            7000,
            0,
            "cuDevicePrimaryCtxReset",
        ),
        ("cuLaunch", 12000, 0, "cuLaunch"),
        ("cuLaunchGrid", 12000, 2, "cuLaunchGrid"),
        ("cuLaunchGridAsync", 12000, 0, "cuLaunchGridAsync"),
        ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
        ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
        ("cuLaunchKernel", 12000, 1, "cuLaunchKernel"),
        ("cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"),
        ("cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"),
        ("cuStreamBeginCapture", 12000, 0, "cuStreamBeginCapture_v2"),
        (
            "cuGraphInstantiate",
            12000,
            0,
            "cuGraphInstantiateWithFlags",
        ),
        ("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
        ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
        ("cuEventElapsedTime", 12000, 0, "cuEventElapsedTime"),
        (
            "cuDevicePrimaryCtxRelease",
            12000,
            0,
            "cuDevicePrimaryCtxRelease_v2",
        ),
        ("cuIpcOpenMemHandle", 12000, 0, "cuIpcOpenMemHandle_v2"),
        ("cuMemFree", 12000, 0, "cuMemFree_v2"),
        ("cuStreamDestroy", 12000, 0, "cuStreamDestroy_v2"),
        ("cuDeviceGetUuid", 12000, 0, "cuDeviceGetUuid_v2"),
    ];
    for &(name, version, flags, export) in cases {
        let (r, p, status) = query(name, version, flags);
        assert_eq!((r, status), (SUCCESS, 0), "{name}@{version}");
        assert_eq!(
            p,
            dlsym(export),
            "{name}@{version} flags {flags} -> {export}"
        );
    }
    // Unknown, empty, suffixed and too-new names.
    for name in ["cuNoSuchThing", "", "cuMemAlloc_v2"] {
        assert_eq!(query(name, 12000, 0), (NOT_FOUND, 0, 1), "{name:?}");
    }
    assert_eq!(query("cuMemAllocAsync", 11000, 0), (NOT_FOUND, 0, 2));
    assert_eq!(
        query("cuMemAlloc", 12000, 7).0,
        1,
        "unknown flags are INVALID_VALUE"
    );
    // v1 has no status but the same answers.
    let mut p = std::ptr::null_mut();
    // SAFETY: valid C string and out-pointer.
    let r = unsafe { gpa1(c"cuMemAlloc".as_ptr(), &mut p, 12000, 0) };
    assert_eq!((r, p as usize), (SUCCESS, dlsym("cuMemAlloc_v2")));
    // Every export is reachable, and every answer is an export's own pointer.
    let all: Vec<&str> = EXPORTS.split_whitespace().collect();
    let pointers: std::collections::HashMap<usize, &str> =
        all.iter().map(|n| (dlsym(n), *n)).collect();
    let base_of = |n: &str| -> String {
        let n = n.trim_end_matches("_ptsz").trim_end_matches("_ptds");
        match n.rfind("_v") {
            Some(i) if n[i + 2..].chars().all(|c| c.is_ascii_digit()) => n[..i].to_string(),
            _ => n.to_string(),
        }
    };
    for name in &all {
        let base = base_of(name);
        for flags in [0, 2] {
            let (r, p, _) = query(&base, 13000, flags);
            assert_eq!(r, SUCCESS, "{base} (from {name})");
            let hit = pointers
                .get(&p)
                .unwrap_or_else(|| panic!("{base}: not an export"));
            assert!(
                base_of(hit) == base || base == "cuGraphInstantiate",
                "{base} resolved to {hit}"
            );
        }
    }
}

#[test]
fn two_processes_see_each_others_memory() {
    let state = state_path("two");
    let env = [("FAKEGPU_CTX_OVERHEAD", (100 * MIB).to_string())];
    let mut a = Kid::spawn(
        "hold",
        &state,
        &[
            env[0].clone(),
            ("FAKEGPU_TEST_BYTES", (64 * MIB + 1).to_string()),
        ],
    );
    assert!(a.read().starts_with("allocated"));
    let mut b = Kid::spawn("watch", &state, &env);
    b.say("q");
    let answer = b.read();
    let v: Vec<u64> = answer.split(' ').map(|x| x.parse().unwrap()).collect();
    let (free, total) = (v[0], v[1]);
    assert_eq!(total, 32 << 30);
    // Two contexts, and A's 64 MiB + 1 byte rounded up to 66 MiB.
    assert_eq!(total - free, 200 * MIB + 66 * MIB);
    a.say("free");
    assert_eq!(a.read(), "freed");
    b.say("q");
    let free2: u64 = b.read().split(' ').next().unwrap().parse().unwrap();
    assert_eq!(free2 - free, 66 * MIB);
    a.say("exit");
    a.finish();
    // The drivers look for the dead once per FAKEGPU_LIVENESS_LAG_US (10 ms), a real
    // driver's teardown being asynchronous too: B sees A's context go within a few looks.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        b.say("q");
        let free3: u64 = b.read().split(' ').next().unwrap().parse().unwrap();
        assert!(
            total - free3 >= 100 * MIB,
            "B's own context is still there: {free3}"
        );
        if total - free3 == 100 * MIB {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "A's context did not go with A: {} MiB in use",
            (total - free3) / MIB
        );
    }
    b.say("exit");
    b.finish();
    let _ = std::fs::remove_file(&state);
}

#[test]
fn sigkilled_process_memory_is_freed() {
    let state = state_path("kill");
    let mut a = Kid::spawn(
        "hold",
        &state,
        &[
            ("FAKEGPU_CTX_OVERHEAD", (300 * MIB).to_string()),
            ("FAKEGPU_TEST_BYTES", (1 << 30).to_string()),
        ],
    );
    let pid: u32 = a
        .read()
        .strip_prefix("allocated ")
        .unwrap()
        .parse()
        .unwrap();
    let st = fakegpu::open_state_at(&state).unwrap();
    assert_eq!(st.used_memory(0), (1 << 30) + 300 * MIB);
    let procs = st.processes(0);
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, pid);
    assert_eq!(procs[0].used_memory, (1 << 30) + 300 * MIB);
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    assert_eq!(
        st.used_memory(0),
        0,
        "the dead process's memory is released"
    );
    assert!(st.processes(0).is_empty());
    let _ = std::fs::remove_file(&state);
}

/// `FAKEGPU_RELEASE_DELAY_MS` set in the killed process (it sets the machine's delay when it
/// opens the state): its memory stays on the card and in the process list until it has been
/// seen dead for that long, counted from the first look (so the first look always finds it).
#[test]
fn sigkilled_process_memory_is_freed_after_the_release_delay() {
    let state = state_path("kill-delay");
    let mut a = Kid::spawn(
        "hold",
        &state,
        &[
            ("FAKEGPU_CTX_OVERHEAD", (300 * MIB).to_string()),
            ("FAKEGPU_TEST_BYTES", (1 << 30).to_string()),
            ("FAKEGPU_RELEASE_DELAY_MS", "300".into()),
        ],
    );
    let pid: u32 = a
        .read()
        .strip_prefix("allocated ")
        .unwrap()
        .parse()
        .unwrap();
    let st = fakegpu::open_state_at(&state).unwrap();
    assert_eq!(st.release_delay_ms(), 300);
    let held = (1 << 30) + 300 * MIB;
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    let first_look = fakegpu::now_ns();
    assert_eq!(st.used_memory(0), held, "not released at the first look");
    let procs = st.processes(0);
    assert_eq!(procs.len(), 1);
    assert_eq!((procs[0].pid, procs[0].used_memory), (pid, held));
    let deadline = first_look + 20_000_000_000;
    while st.used_memory(0) != 0 {
        assert!(fakegpu::now_ns() < deadline, "never released");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        fakegpu::now_ns() - first_look >= 300_000_000,
        "released before the delay passed"
    );
    assert!(st.processes(0).is_empty());
    let _ = std::fs::remove_file(&state);
}

#[test]
fn sixteen_threads_keep_consistent_totals() {
    let state = state_path("threads");
    let cfg = state.with_extension("json");
    std::fs::write(
        &cfg,
        r#"{"devices":[{"name":"Tiny","total_memory":268435456,"sm_count":4}]}"#,
    )
    .unwrap();
    let mut kid = Kid::spawn(
        "threads",
        &state,
        &[
            ("FAKEGPU_CONFIG", cfg.display().to_string()),
            ("FAKEGPU_CTX_OVERHEAD", "0".into()),
        ],
    );
    assert_eq!(kid.read(), "done");
    kid.finish();
    let _ = std::fs::remove_file(&state);
    let _ = std::fs::remove_file(&cfg);
}

const THREADS: usize = 16;
const LAUNCHES: usize = 50;
const KERNEL_NS: u64 = 100_000;

fn threads_scenario(api: &Api) {
    let ctx = api.start() as usize;
    let f = api.kernel() as usize;
    let (_, total) = api.mem_info();
    assert_eq!(total, 256 * MIB);
    let t0 = fakegpu::now_ns();
    let barrier = std::sync::Barrier::new(THREADS);
    let counts: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    // SAFETY: ctx is the live primary context.
                    assert_eq!(unsafe { (api.set_current)(ctx as *mut c_void) }, SUCCESS);
                    let mut mine = Vec::new();
                    for i in 0.. {
                        if i < LAUNCHES {
                            api.launch_ns(f as *mut c_void, KERNEL_NS);
                        }
                        let mut p = 0u64;
                        // SAFETY: valid out-pointer.
                        match unsafe { (api.alloc)(&mut p, 1) } {
                            SUCCESS => mine.push(p),
                            OOM if i >= LAUNCHES => break,
                            OOM => {}
                            e => panic!("cuMemAlloc_v2: {e}"),
                        }
                    }
                    barrier.wait();
                    // Everybody is at OOM now: the card is exactly full.
                    let n = mine.len();
                    for p in mine {
                        // SAFETY: p came from cuMemAlloc_v2.
                        assert_eq!(unsafe { (api.free)(p) }, SUCCESS);
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        counts.iter().sum::<usize>(),
        128,
        "256 MiB in 2 MiB pieces: {counts:?}"
    );
    assert_eq!(api.mem_info().0, 256 * MIB, "all freed");
    // SAFETY: a context is current.
    assert_eq!(unsafe { (api.ctx_sync)() }, SUCCESS);
    let t1 = fakegpu::now_ns();
    let st = fakegpu::open_state_at(Path::new(&std::env::var("FAKEGPU_STATE").unwrap())).unwrap();
    let b = fakegpu::timeline::BUCKET_NS;
    let (from, to) = (t0 / b * b, t1.div_ceil(b) * b);
    let expected = (THREADS * LAUNCHES) as u64 * KERNEL_NS;
    assert_eq!(st.busy_ns(0, None, from, to), expected);
    assert_eq!(st.busy_ns(0, Some(std::process::id()), from, to), expected);
    assert!(
        st.busy_until(0) <= t1,
        "synchronize returned after the last kernel"
    );
    assert!(st.busy_until(0) >= t0 + expected, "kernels never overlap");
}

#[test]
fn forked_child_starts_uninitialised() {
    let state = state_path("fork");
    let mut kid = Kid::spawn("fork", &state, &[]);
    assert_eq!(kid.read(), "done");
    kid.finish();
    let _ = std::fs::remove_file(&state);
}

fn fork_scenario(api: &Api) {
    api.start();
    let mut n = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (api.device_get_count)(&mut n) }, SUCCESS);
    // SAFETY: the child only calls into the fake and then _exit()s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain calls with valid out-pointers; _exit never returns.
        unsafe {
            let before = (api.device_get_count)(&mut n);
            let init = (api.init)(0);
            let after = (api.device_get_count)(&mut n);
            let ok = before == NOT_INITIALIZED && init == SUCCESS && after == SUCCESS && n == 1;
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    // The parent is still initialised.
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (api.device_get_count)(&mut n) }, SUCCESS);
}

/// The pre-3.2 entry points: 32-bit pointers from the low 4 GiB, sizes clamped (never
/// wrapped) on a 32 GiB card, the same accounting as the 64-bit ones, and the deprecated
/// launches on the timeline with the grid deciding their length.
#[test]
fn legacy_entry_points_use_the_32_bit_abi() {
    let state = state_path("legacy");
    let mut kid = Kid::spawn("legacy", &state, &[]);
    assert_eq!(kid.read(), "done");
    kid.finish();
    let _ = std::fs::remove_file(&state);
}

#[allow(clippy::type_complexity)]
fn legacy_scenario(api: &Api) {
    let lib = api._lib;
    let ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> u32 =
        sym(lib, "cuCtxCreate");
    let ctx_destroy: unsafe extern "C" fn(*mut c_void) -> u32 = sym(lib, "cuCtxDestroy");
    let alloc: unsafe extern "C" fn(*mut c_uint, c_uint) -> u32 = sym(lib, "cuMemAlloc");
    let free: unsafe extern "C" fn(c_uint) -> u32 = sym(lib, "cuMemFree");
    let get_info: unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> u32 = sym(lib, "cuMemGetInfo");
    let total_mem: unsafe extern "C" fn(*mut c_uint, c_int) -> u32 = sym(lib, "cuDeviceTotalMem");
    let pitch: unsafe extern "C" fn(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint) -> u32 =
        sym(lib, "cuMemAllocPitch");
    let array: unsafe extern "C" fn(*mut *mut c_void, *const [c_uint; 4]) -> u32 =
        sym(lib, "cuArrayCreate");
    let array3d: unsafe extern "C" fn(*mut *mut c_void, *const [c_uint; 6]) -> u32 =
        sym(lib, "cuArray3DCreate");
    let array_destroy: unsafe extern "C" fn(*mut c_void) -> u32 = sym(lib, "cuArrayDestroy");
    let launch: unsafe extern "C" fn(*mut c_void) -> u32 = sym(lib, "cuLaunch");
    let grid: unsafe extern "C" fn(*mut c_void, c_int, c_int) -> u32 = sym(lib, "cuLaunchGrid");
    let grid_async: unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut c_void) -> u32 =
        sym(lib, "cuLaunchGridAsync");
    let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> u32 =
        sym(lib, "cuStreamCreate");
    let event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> u32 =
        sym(lib, "cuEventCreate");
    let event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32 =
        sym(lib, "cuEventRecord");
    let event_sync: unsafe extern "C" fn(*mut c_void) -> u32 = sym(lib, "cuEventSynchronize");
    let elapsed: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> u32 =
        sym(lib, "cuEventElapsedTime");
    let used = || {
        let (free, total) = api.mem_info();
        total - free
    };
    let base;
    // SAFETY: every call gets valid out-pointers and handles the fake handed out, or the
    // deliberately invalid arguments each case names.
    unsafe {
        assert_eq!((api.init)(0), SUCCESS);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut ctx, 0, 0), SUCCESS);
        base = used();
        assert!(base > 0, "the context costs memory");
        // A 32 GiB card: 32-bit sizes are clamped, never wrapped.
        let (mut f32_, mut t32) = (0, 0);
        assert_eq!(get_info(&mut f32_, &mut t32), SUCCESS);
        assert_eq!((f32_, t32), (u32::MAX, u32::MAX));
        let mut total = 0;
        assert_eq!(total_mem(&mut total, 0), SUCCESS);
        assert_eq!(total, u32::MAX);
        assert_eq!(get_info(std::ptr::null_mut(), &mut t32), 1);

        let mut p = 0;
        assert_eq!(alloc(&mut p, 4096), SUCCESS);
        assert!(p != 0, "a 32-bit device pointer");
        assert_eq!(used() - base, 2 * MIB, "charged like cuMemAlloc_v2");
        assert_eq!(free(p), SUCCESS);
        assert_eq!(free(p), 1, "freed once");
        assert_eq!(used(), base);

        let (mut pp, mut pi) = (0, 0);
        assert_eq!(pitch(&mut pp, &mut pi, 1000, 3000, 4), SUCCESS);
        assert_eq!(pi, 1024);
        assert_eq!(used() - base, 4 * MIB, "1024 x 3000 rounded to 2 MiB");
        assert_eq!(
            (api.free)(u64::from(pp)),
            SUCCESS,
            "the same address in 64 bits"
        );
        assert_eq!(used(), base);

        // float4 (0x20, 4 channels): 16 bytes a texel.
        let mut a = std::ptr::null_mut();
        assert_eq!(array(&mut a, &[1024, 1024, 0x20, 4]), SUCCESS);
        assert_eq!(used() - base, 16 * MIB);
        assert_eq!(array_destroy(a), SUCCESS);
        assert_eq!(array3d(&mut a, &[256, 256, 16, 0x01, 1, 0]), SUCCESS);
        assert_eq!(used() - base, 2 * MIB);
        assert_eq!(array_destroy(a), SUCCESS);
        assert_eq!(used(), base);

        // Deprecated launches: blocks of one thread, 1 us a wave; a V100 wave is 80 SMs x
        // 2048 blocks, so a 163840 x 1000 grid is 1000 waves: at least 1 ms between events
        // recorded around it.
        let f = api.kernel();
        let (mut e0, mut e1) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(event_create(&mut e0, 0), SUCCESS);
        assert_eq!(event_create(&mut e1, 0), SUCCESS);
        assert_eq!(launch(f), SUCCESS);
        assert_eq!(event_record(e0, std::ptr::null_mut()), SUCCESS);
        assert_eq!(grid(f, 163_840, 1000), SUCCESS);
        assert_eq!(event_record(e1, std::ptr::null_mut()), SUCCESS);
        assert_eq!(event_sync(e1), SUCCESS);
        let mut ms = 0f32;
        assert_eq!(elapsed(&mut ms, e0, e1), SUCCESS);
        assert!(ms >= 1.0, "the grid decides the length: {ms} ms");
        let mut s = std::ptr::null_mut();
        assert_eq!(stream_create(&mut s, 0), SUCCESS);
        assert_eq!(event_record(e0, s), SUCCESS);
        assert_eq!(grid_async(f, 163_840, 2000, s), SUCCESS);
        assert_eq!(event_record(e1, s), SUCCESS);
        assert_eq!(event_sync(e1), SUCCESS);
        assert_eq!(elapsed(&mut ms, e0, e1), SUCCESS);
        assert!(ms >= 2.0, "on its stream: {ms} ms");
        assert_eq!(grid(f, -1, 1), 1, "a negative grid is INVALID_VALUE");
        assert_eq!(grid(f, 1, 65536), 1, "grid height above 65535");
        assert_eq!(launch(0x99 as *mut c_void), 400, "not a function");
        assert_eq!((api.ctx_sync)(), SUCCESS);

        assert_eq!(ctx_destroy(ctx), SUCCESS);
        assert_eq!(ctx_destroy(ctx), 201, "destroyed once");
    }
    // Everything, the destroyed context included, is gone: with the primary context retained
    // the card holds exactly one context again.
    api.start();
    assert_eq!(used(), base);
}

#[test]
fn c_abi_error_semantics() {
    let state = state_path("errors");
    let mut kid = Kid::spawn("errors", &state, &[]);
    assert_eq!(kid.read(), "done");
    kid.finish();
    let _ = std::fs::remove_file(&state);
}

fn errors_scenario(api: &Api) {
    let lib = api._lib;
    let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> u32 = sym(lib, "cuDeviceGet");
    let mut n = 0;
    let mut p = 0u64;
    // SAFETY: valid or deliberately null out-pointers, as each case says.
    unsafe {
        assert_eq!((api.device_get_count)(&mut n), NOT_INITIALIZED);
        assert_eq!((api.alloc)(&mut p, 1), NOT_INITIALIZED);
        assert_eq!((api.init)(1), 1, "flags must be 0");
        assert_eq!((api.init)(0), SUCCESS);
        assert_eq!((api.device_get_count)(std::ptr::null_mut()), 1);
        assert_eq!(device_get(&mut n, 1), 101, "INVALID_DEVICE");
        assert_eq!(
            (api.alloc)(&mut p, 1),
            201,
            "INVALID_CONTEXT without a context"
        );
        assert_eq!((api.set_current)(0xdead as *mut c_void), 201);
        api.start();
        assert_eq!((api.alloc)(std::ptr::null_mut(), 1), 1, "null out-pointer");
        assert_eq!((api.alloc)(&mut p, 0), 1, "zero size");
        assert_eq!((api.free)(0x1234), 1, "not an allocation");
        let mut f = std::ptr::null_mut();
        assert_eq!(
            (api.get_function)(&mut f, 0x99 as *mut c_void, c"k".as_ptr()),
            400
        );
        assert_eq!((api.alloc)(&mut p, 33 << 30), OOM);
    }
}

#[test]
fn tensor_maps_are_encoded_on_the_host_with_the_documented_checks() {
    let state = state_path("tensor_map");
    let mut kid = Kid::spawn("tensor_map", &state, &[]);
    assert_eq!(kid.read(), "done");
    kid.finish();
    let _ = std::fs::remove_file(&state);
}

/// A `CUtensorMap`: 128 bytes, 64-byte aligned as the API requires.
#[repr(C, align(64))]
struct TensorMap([u64; 16]);

type EncodeTiled = unsafe extern "C" fn(
    *mut u64,
    c_uint,
    c_uint,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
) -> u32;
type EncodeIm2col = unsafe extern "C" fn(
    *mut u64,
    c_uint,
    c_uint,
    *mut c_void,
    *const u64,
    *const u64,
    *const c_int,
    *const c_int,
    c_uint,
    c_uint,
    *const u32,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
) -> u32;

fn tensor_map_scenario(api: &Api) {
    const INVALID_VALUE: u32 = 1;
    const FLOAT16: c_uint = 6;
    const SWIZZLE_128B: c_uint = 3;
    let tiled: EncodeTiled = sym(api._lib, "cuTensorMapEncodeTiled");
    let im2col: EncodeIm2col = sym(api._lib, "cuTensorMapEncodeIm2col");
    // A 1024 x 4096 fp16 matrix in 64 x 128 tiles, as a Hopper GEMM encodes it.
    let (dim, strides, box_dim, es) = ([4096u64, 1024], [8192u64], [64u32, 128], [1u32, 1]);
    let addr = 0x7f00_0000_0000usize as *mut c_void;
    let mut map = TensorMap([0; 16]);
    let encode = |map: *mut u64, addr: *mut c_void, rank: c_uint, dim: *const u64| {
        // SAFETY: arrays of `rank` (strides `rank - 1`) entries, a 128-byte map.
        unsafe {
            tiled(
                map,
                FLOAT16,
                rank,
                addr,
                dim,
                strides.as_ptr(),
                box_dim.as_ptr(),
                es.as_ptr(),
                0,
                SWIZZLE_128B,
                2,
                0,
            )
        }
    };
    assert_eq!(
        encode(map.0.as_mut_ptr(), addr, 2, dim.as_ptr()),
        NOT_INITIALIZED
    );
    // SAFETY: plain call.
    assert_eq!(unsafe { (api.init)(0) }, SUCCESS);
    // No context is needed: the map is made on the host.
    assert_eq!(encode(map.0.as_mut_ptr(), addr, 2, dim.as_ptr()), SUCCESS);
    let bytes: Vec<u8> = map.0.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(&bytes[0..4], b"FGTM");
    assert_eq!(
        &bytes[8..16],
        &(addr as u64).to_le_bytes(),
        "the address is in the map"
    );
    assert_eq!(&bytes[16..24], &4096u64.to_le_bytes());
    // Refusals write nothing.
    let mut other = TensorMap([7; 16]);
    let misaligned = (addr as usize + 8) as *mut c_void;
    assert_eq!(
        encode(other.0.as_mut_ptr(), misaligned, 2, dim.as_ptr()),
        INVALID_VALUE
    );
    assert_eq!(other.0, [7; 16], "nothing written");
    // SAFETY: one word past a 64-byte boundary is still inside `other` for the check.
    let unaligned_map = unsafe { other.0.as_mut_ptr().add(1) };
    assert_eq!(encode(unaligned_map, addr, 2, dim.as_ptr()), INVALID_VALUE);
    assert_eq!(
        encode(std::ptr::null_mut(), addr, 2, dim.as_ptr()),
        INVALID_VALUE
    );
    assert_eq!(
        encode(other.0.as_mut_ptr(), addr, 0, std::ptr::null()),
        INVALID_VALUE
    );
    assert_eq!(
        encode(other.0.as_mut_ptr(), addr, 6, std::ptr::null()),
        INVALID_VALUE
    );
    assert_eq!(
        encode(other.0.as_mut_ptr(), addr, 2, std::ptr::null()),
        INVALID_VALUE
    );
    assert_eq!(other.0, [7; 16], "nothing written");
    // Im2col: NHWC fp16 with a 3 x 3 filter's corners.
    let (idim, istrides, ies) = ([64u64, 16, 16, 1], [128u64, 2048, 32768], [1u32; 4]);
    let (lo, hi) = ([-1 as c_int, -1], [-1 as c_int, -1]);
    let mut imap = TensorMap([0; 16]);
    let imap_ptr = imap.0.as_mut_ptr();
    let r = |channels: c_uint| {
        // SAFETY: arrays of the sizes rank 4 asks for, a 128-byte map.
        unsafe {
            im2col(
                imap_ptr,
                FLOAT16,
                4,
                addr,
                idim.as_ptr(),
                istrides.as_ptr(),
                lo.as_ptr(),
                hi.as_ptr(),
                channels,
                256,
                ies.as_ptr(),
                0,
                SWIZZLE_128B,
                0,
                0,
            )
        }
    };
    assert_eq!(r(257), INVALID_VALUE, "at most 256 channels per pixel");
    assert_eq!(r(64), SUCCESS);
    assert_eq!(
        imap.0[0] & 0xffff_ffff,
        u64::from_le_bytes(*b"FGTM\0\0\0\0")
    );
}
