//! Harness shared by the fake-NVML test binaries: where the built libraries are, one fresh
//! process and state file per test, and typed access to the fake `libnvidia-ml.so.1` and
//! `libcuda.so.1` through libloading.
//!
//! Why a fresh process per test: the fake driver opens `FAKEGPU_STATE` once per process
//! (like a real driver attaching to the GPU), and cargo runs the tests of one binary as
//! threads of one process. [`isolated`] re-runs the current test alone in a child copy of the
//! test binary with its own temporary state file and environment.

#![allow(dead_code)] // each test binary uses a different part of the harness

use gpuslice_abi::cuda::*;
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "FAKEGPU_NVML_TEST_CHILD";
/// Set in an isolated child: its private scratch directory.
pub const SCRATCH_ENV: &str = "FAKEGPU_NVML_TEST_SCRATCH";

/// Every variable of the fake's env contract; cleared in children so that a developer's
/// shell cannot change what a test sees.
const FAKEGPU_VARS: &[&str] = &[
    "FAKEGPU_STATE",
    "FAKEGPU_DEVICES",
    "FAKEGPU_CONFIG",
    "FAKEGPU_DRIVER_VERSION",
    "FAKEGPU_CTX_OVERHEAD",
    "FAKEGPU_PID_OFFSET",
    "FAKEGPU_UTIL_WINDOW_MS",
    "FAKEGPU_RELEASE_DELAY_MS",
];

/// target/debug (or release): test binaries live in its deps/ folder.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

/// A build artifact next to the test binary's profile directory; fails with the command that
/// builds it (cargo test does not build cdylibs or other packages' binaries).
pub fn artifact(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` before \
         these tests (or `cargo xtask test`)",
        path.display()
    );
    path
}

/// A private temporary directory, removed on drop.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("fakegpu-nvml-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch { dir }
    }

    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// In an isolated child: its scratch directory (the state file is `state` in it).
pub fn child_scratch() -> PathBuf {
    PathBuf::from(std::env::var_os(SCRATCH_ENV).expect("only called inside `isolated`"))
}

/// Runs `body` as the only test of a child copy of this test binary, with a fresh
/// FAKEGPU_STATE and exactly `env` from the fake's contract. `name` must be the calling
/// test's function name: a name that matches no test fails the run ("1 passed" is checked).
pub fn isolated(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        return;
    }
    let scratch = Scratch::new(name);
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]);
    for var in FAKEGPU_VARS {
        cmd.env_remove(var);
    }
    cmd.env(CHILD_ENV, name)
        .env(SCRATCH_ENV, &scratch.dir)
        .env("FAKEGPU_STATE", scratch.state())
        .envs(env.iter().copied());
    let out = cmd.output().expect("re-run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "isolated run of `{name}` failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "isolated run of `{name}` ran no test (wrong name?):\n{stdout}"
    );
}

/// Polls `probe` until it returns `Some`, failing with `what` after `limit`.
pub fn await_value<T>(limit: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        std::thread::yield_now();
        std::thread::sleep(Duration::from_millis(2)); // polling interval, not synchronisation
    }
}

/// The fake libnvidia-ml, loaded from the target directory.
pub struct Nvml {
    lib: libloading::Library,
}

impl Nvml {
    pub fn load() -> Nvml {
        let path = artifact("libfakegpu_nvml.so");
        // SAFETY: the fake NVML's initialisers only set up Rust statics.
        let lib = unsafe { libloading::Library::new(&path) }.expect("load libfakegpu_nvml.so");
        Nvml { lib }
    }

    /// A typed symbol. `T` must be the `unsafe extern "C" fn` type of nvml.h's prototype.
    pub fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: callers name T as the C prototype of `name`; the library outlives the copy
        // because `self` owns it and tests hold `self` while calling.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|e| panic!("fake NVML does not export {name}: {e}"))
        }
    }

    pub fn has(&self, name: &str) -> bool {
        // SAFETY: only the symbol's presence is checked; it is never called through this type.
        unsafe { self.lib.get::<*const c_void>(name.as_bytes()) }.is_ok()
    }

    pub fn init(&self) {
        let f: unsafe extern "C" fn() -> nvmlReturn_t = self.sym("nvmlInit_v2");
        // SAFETY: no arguments.
        assert_eq!(unsafe { f() }, NVML_SUCCESS, "nvmlInit_v2");
    }

    pub fn shutdown(&self) -> nvmlReturn_t {
        let f: unsafe extern "C" fn() -> nvmlReturn_t = self.sym("nvmlShutdown");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    pub fn count(&self) -> u32 {
        let f: unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t =
            self.sym("nvmlDeviceGetCount_v2");
        let mut n = 0;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(&mut n) }, NVML_SUCCESS);
        n
    }

    pub fn handle(&self, index: u32) -> nvmlDevice_t {
        let f: unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t =
            self.sym("nvmlDeviceGetHandleByIndex_v2");
        let mut h = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(index, &mut h) }, NVML_SUCCESS);
        h
    }

    /// A string getter of the `(device, char*, unsigned int)` shape.
    pub fn device_string(&self, name: &str, device: nvmlDevice_t) -> String {
        let f: unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t =
            self.sym(name);
        let mut buf = [0 as c_char; 128];
        assert_eq!(
            // SAFETY: buffer of the stated length.
            unsafe { f(device, buf.as_mut_ptr(), 128) },
            NVML_SUCCESS,
            "{name}"
        );
        // SAFETY: NVML NUL-terminated it on success.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn memory_v1(&self, device: nvmlDevice_t) -> nvmlMemory_t {
        let f: unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t =
            self.sym("nvmlDeviceGetMemoryInfo");
        let mut m = nvmlMemory_t::default();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(device, &mut m) }, NVML_SUCCESS);
        m
    }

    pub fn memory_v2(&self, device: nvmlDevice_t) -> nvmlMemory_v2_t {
        let f: unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t =
            self.sym("nvmlDeviceGetMemoryInfo_v2");
        let mut m = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            ..Default::default()
        };
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(device, &mut m) }, NVML_SUCCESS);
        m
    }

    pub fn utilization(&self, device: nvmlDevice_t) -> nvmlUtilization_t {
        let f: unsafe extern "C" fn(nvmlDevice_t, *mut nvmlUtilization_t) -> nvmlReturn_t =
            self.sym("nvmlDeviceGetUtilizationRates");
        let mut u = nvmlUtilization_t::default();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(device, &mut u) }, NVML_SUCCESS);
        u
    }

    /// nvmlDeviceGetComputeRunningProcesses_v3 through the size-query protocol.
    pub fn processes(&self, device: nvmlDevice_t) -> Vec<nvmlProcessInfo_t> {
        type F = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> u32;
        let f: F = self.sym("nvmlDeviceGetComputeRunningProcesses_v3");
        let mut n: c_uint = 0;
        // SAFETY: size query: valid count, null buffer.
        let rc = unsafe { f(device, &mut n, std::ptr::null_mut()) };
        if rc == NVML_SUCCESS {
            return Vec::new();
        }
        assert_eq!(rc, NVML_ERROR_INSUFFICIENT_SIZE);
        let mut buf = vec![nvmlProcessInfo_t::default(); n as usize + 4];
        n = buf.len() as c_uint;
        // SAFETY: buffer of `n` entries.
        assert_eq!(unsafe { f(device, &mut n, buf.as_mut_ptr()) }, NVML_SUCCESS);
        buf.truncate(n as usize);
        buf
    }
}

/// The fake libcuda, loaded from the target directory: just enough to make a process own
/// memory and run timed kernels.
pub struct Cuda {
    lib: libloading::Library,
}

fn check(what: &str, rc: CUresult) {
    assert_eq!(rc, 0, "{what} returned CUresult {rc}");
}

impl Cuda {
    pub fn load() -> Cuda {
        let path = artifact("libfakegpu_cuda.so");
        // SAFETY: the fake driver's initialisers only set up Rust statics.
        let lib = unsafe { libloading::Library::new(&path) }.expect("load libfakegpu_cuda.so");
        Cuda { lib }
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: callers name T as the C prototype of `name`; `self` keeps the library
        // loaded while the pointer is used.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|e| panic!("fake libcuda does not export {name}: {e}"))
        }
    }

    /// cuInit + the primary context of device `ordinal`, made current.
    pub fn init_context(&self, ordinal: c_int) {
        let init: unsafe extern "C" fn(c_uint) -> CUresult = self.sym("cuInit");
        let get: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult = self.sym("cuDeviceGet");
        let retain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult =
            self.sym("cuDevicePrimaryCtxRetain");
        let set: unsafe extern "C" fn(CUcontext) -> CUresult = self.sym("cuCtxSetCurrent");
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: documented driver API calls with valid out-pointers.
        unsafe {
            check("cuInit", init(0));
            check("cuDeviceGet", get(&mut dev, ordinal));
            check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev));
            check("cuCtxSetCurrent", set(ctx));
        }
    }

    pub fn alloc(&self, bytes: usize) -> CUdeviceptr {
        let f: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult =
            self.sym("cuMemAlloc_v2");
        let mut ptr = 0;
        // SAFETY: valid out-pointer, current context set by init_context.
        check("cuMemAlloc_v2", unsafe { f(&mut ptr, bytes) });
        ptr
    }

    /// A kernel handle from a fake module (the fake accepts any image bytes).
    pub fn kernel(&self) -> CUfunction {
        let load: unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult =
            self.sym("cuModuleLoadData");
        let get: unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult =
            self.sym("cuModuleGetFunction");
        let image = b"// fake PTX: fakegpu ignores module contents\n\0";
        let name = CString::new("spin").unwrap();
        let mut module: CUmodule = std::ptr::null_mut();
        let mut func: CUfunction = std::ptr::null_mut();
        // SAFETY: valid image bytes and out-pointers.
        unsafe {
            check("cuModuleLoadData", load(&mut module, image.as_ptr().cast()));
            check("cuModuleGetFunction", get(&mut func, module, name.as_ptr()));
        }
        func
    }

    /// Launches one block of one thread (one wave) lasting `ns_per_wave`.
    pub fn launch(&self, func: CUfunction, ns_per_wave: u64) {
        type Launch = unsafe extern "C" fn(
            CUfunction,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            CUstream,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> CUresult;
        let f: Launch = self.sym("cuLaunchKernel");
        let mut ns = ns_per_wave;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        // SAFETY: kernelParams[0] points to a live u64, the fake's duration contract; the
        // fake reads it during the call.
        check("cuLaunchKernel", unsafe {
            f(
                func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }

    pub fn synchronize(&self) {
        let f: unsafe extern "C" fn() -> CUresult = self.sym("cuCtxSynchronize");
        // SAFETY: no arguments; a context is current.
        check("cuCtxSynchronize", unsafe { f() });
    }
}

/// The fake GPU state of this isolated test, opened directly (the ground truth NVML must
/// agree with).
pub fn truth() -> fakegpu::SharedState {
    fakegpu::open_state_at(&child_scratch().join("state")).expect("open the test's state")
}

/// Set in a helper child started by [`spawn_holder`]: the role it plays.
const ROLE_ENV: &str = "FAKEGPU_NVML_TEST_ROLE";
const HOLD_BYTES_ENV: &str = "FAKEGPU_NVML_TEST_HOLD_BYTES";

/// True in a helper child started by [`spawn_holder`]; the test body must then call
/// [`run_holder`] and return.
pub fn is_holder() -> bool {
    std::env::var(ROLE_ENV).as_deref() == Ok("hold")
}

/// The holder role: a context and an allocation on device 0, then "READY <pid>" on stdout,
/// then wait until stdin closes (the parent dies) or the parent kills it.
pub fn run_holder() {
    let bytes: usize = std::env::var(HOLD_BYTES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("holder needs its byte count");
    let cuda = Cuda::load();
    cuda.init_context(0);
    cuda.alloc(bytes);
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // libtest has already printed "test NAME ... " without a newline: start a fresh line.
        writeln!(out, "\nREADY {}", std::process::id()).unwrap();
        out.flush().unwrap();
    }
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// Another process holding memory on the fake GPU (a copy of this test binary in the holder
/// role, same FAKEGPU_* environment). Killed on drop.
pub struct Holder {
    child: std::process::Child,
    pub pid: u32,
}

/// Starts a holder for the isolated test `name` and returns once its memory is allocated.
pub fn spawn_holder(name: &str, bytes: u64) -> Holder {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "hold")
        .env(HOLD_BYTES_ENV, bytes.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn holder");
    let pid = child.id();
    let stdout = child.stdout.take().expect("piped stdout");
    // The holder's READY line is the condition. A reader thread forwards it, so that a holder
    // that hangs before allocating fails the test after a deadline instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("READY ").nth(1) {
                let _ = tx.send(rest.trim().parse::<u32>().ok());
                return;
            }
        }
        // EOF: dropping `tx` tells the receiver the holder died.
    });
    let mut holder = Holder { child, pid };
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(reported) => {
            assert_eq!(reported, Some(pid), "holder reported another PID");
            holder
        }
        Err(e) => {
            holder.kill();
            panic!("holder {pid} never reported READY ({e:?}); see its stderr above");
        }
    }
}

impl Holder {
    /// SIGKILL (no chance to free anything) and reap the zombie, as a crash would.
    pub fn kill(&mut self) {
        // SAFETY: plain kill(2) on our own child's PID; it is not reaped yet, so the PID
        // cannot have been reused.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// `fakegpu smi --json --state PATH`, parsed.
pub fn smi_json(state: &Path) -> serde_json::Value {
    let out = Command::new(artifact("fakegpu"))
        .args(["smi", "--json", "--state"])
        .arg(state)
        .output()
        .expect("run fakegpu smi");
    assert!(
        out.status.success(),
        "fakegpu smi failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("fakegpu smi --json prints JSON")
}
