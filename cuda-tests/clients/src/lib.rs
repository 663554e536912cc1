//! The client programs' shared core: the scenarios every client runs (`scenario`), the
//! driver entry-point table they run them through (`driver`), and the small vocabulary both
//! use (`Fail`, `AllocPath`, `LaunchPath`, size parsing).
//!
//! Three binaries reach the driver the three ways applications do, and all of them print the
//! same one-line JSON for the same scenario, so a test can run one scenario through each path
//! and compare:
//! * `linked-client`: symbols bound by the dynamic linker (`-lcuda`, `-lnvidia-ml`);
//! * `cudarc-client`: the `cudarc` crate (dlopen + dlsym per symbol);
//! * `procaddr-client`: the CUDA runtime's way (dlopen, `cuGetProcAddress_v2` for everything).

#![allow(non_snake_case)]

pub mod driver;
pub mod scenario;

pub use gpuslice_abi::cuda::CUresult;

/// Everything the entry-point table mentions, so `for_each_entry_point!` callbacks in the
/// binaries can name the types with one glob import.
pub mod ffi {
    pub use gpuslice_abi::cuda::*;
    pub use std::ffi::{c_char, c_int, c_uint, c_void};

    /// `CUDA_KERNEL_NODE_PARAMS_v2` (CUDA 12.0+): v1 plus `kern` and `ctx`. The client always
    /// passes this larger layout; the v1 ABI only reads its prefix, so either answer of
    /// cuGetProcAddress("cuGraphAddKernelNode") reads valid memory.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct KernelNodeParamsV2 {
        pub v1: CUDA_KERNEL_NODE_PARAMS,
        pub kern: CUkernel,
        pub ctx: CUcontext,
    }
}

static POOL_DEVICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The device `AllocPath::Pool` creates its pools on (`props.location.id`), whatever device
/// the current context is on: `--pool-device` of `alloc-until-oom`, 0 by default.
pub fn pool_device() -> std::ffi::c_int {
    POOL_DEVICE.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn set_pool_device(device: std::ffi::c_int) {
    POOL_DEVICE.store(device, std::sync::atomic::Ordering::Relaxed);
}

/// Why a driver call did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    /// The driver answered this code.
    Cu(CUresult),
    /// The client could not obtain this entry point (dlsym or cuGetProcAddress said no).
    Missing(&'static str),
}

/// Result of one driver call as scenarios see it.
pub type Res<T> = Result<T, Fail>;

/// Turns a `CUresult` into `Res<()>`.
pub fn check(code: CUresult) -> Res<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Fail::Cu(code))
    }
}

/// How `alloc`-style scenarios obtain device memory; one variant per accounting path the
/// shim must see (field notes: pools, VMM and arrays escaped peers' accounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocPath {
    Alloc,
    Pitch,
    Managed,
    Async,
    Pool,
    Vmm,
    Array,
    Array3d,
    Mipmap,
}

impl AllocPath {
    pub const ALL: [AllocPath; 9] = [
        AllocPath::Alloc,
        AllocPath::Pitch,
        AllocPath::Managed,
        AllocPath::Async,
        AllocPath::Pool,
        AllocPath::Vmm,
        AllocPath::Array,
        AllocPath::Array3d,
        AllocPath::Mipmap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AllocPath::Alloc => "alloc",
            AllocPath::Pitch => "pitch",
            AllocPath::Managed => "managed",
            AllocPath::Async => "async",
            AllocPath::Pool => "pool",
            AllocPath::Vmm => "vmm",
            AllocPath::Array => "array",
            AllocPath::Array3d => "array3d",
            AllocPath::Mipmap => "mipmap",
        }
    }

    pub fn parse(s: &str) -> Option<AllocPath> {
        AllocPath::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// One VMM driver call, for scenarios that drive `cuMemCreate` & co. step by step (the
/// `vmm` allocation path does all of them at once). Each returns what the call produces
/// (an address or a handle), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmmOp {
    /// `cuMemAddressReserve(size)` -> address.
    Reserve { size: usize },
    /// `cuMemAddressFree(ptr, size)`.
    AddressFree { ptr: u64, size: usize },
    /// `cuMemCreate(size)` of pinned device-0 memory -> handle.
    Create { size: usize },
    /// `cuMemMap(ptr, size, 0, handle)`.
    Map { ptr: u64, size: usize, handle: u64 },
    /// `cuMemSetAccess(ptr, size)`: read-write from device 0.
    SetAccess { ptr: u64, size: usize },
    /// `cuMemUnmap(ptr, size)`.
    Unmap { ptr: u64, size: usize },
    /// `cuMemRelease(handle)`.
    Release { handle: u64 },
}

/// One live allocation, whatever path made it; `free` undoes exactly that path.
#[derive(Debug, Clone, Copy)]
pub struct Allocation {
    pub path: AllocPath,
    pub size: usize,
    /// Device pointer, or the array / mipmapped-array handle as an integer.
    pub ptr: u64,
    /// VMM: the physical handle; pool: the pool (one pool per allocation keeps frees simple).
    pub handle: u64,
    pub stream: u64,
}

/// Which context the scenarios run in, from the environment variable `CLIENT_CONTEXT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextMode {
    /// Unset or `primary`: the device's primary context (`cuDevicePrimaryCtxRetain`), what
    /// the CUDA runtime and most frameworks use.
    Primary,
    /// `created`: a non-primary context (`cuCtxCreate*`), one per device and process.
    Created,
}

/// The variable that selects the [`ContextMode`].
pub const CONTEXT_VARIABLE: &str = "CLIENT_CONTEXT";

impl ContextMode {
    /// Reads [`CONTEXT_VARIABLE`]; any value but `primary` and `created` is an error.
    pub fn from_env() -> Result<ContextMode, String> {
        match std::env::var(CONTEXT_VARIABLE) {
            Err(std::env::VarError::NotPresent) => Ok(ContextMode::Primary),
            Ok(v) if v == "primary" => Ok(ContextMode::Primary),
            Ok(v) if v == "created" => Ok(ContextMode::Created),
            Ok(v) => Err(format!(
                "{CONTEXT_VARIABLE}={v:?}: expected \"primary\" or \"created\""
            )),
            Err(e) => Err(format!("{CONTEXT_VARIABLE}: {e}")),
        }
    }

    /// [`ContextMode::from_env`], read once per process; an invalid value reads as
    /// `Primary` here (the scenario runner refuses it before any driver call).
    pub fn current() -> ContextMode {
        static MODE: std::sync::OnceLock<ContextMode> = std::sync::OnceLock::new();
        *MODE.get_or_init(|| ContextMode::from_env().unwrap_or(ContextMode::Primary))
    }
}

/// The variable naming a start barrier (a FIFO) that [`start_barrier`] waits on.
pub const START_BARRIER_VARIABLE: &str = "CLIENT_START_BARRIER";

/// Waits at the start barrier named by [`START_BARRIER_VARIABLE`], if any: announces itself
/// with the file `<FIFO>.ready.<pid>.<pid namespace>` (processes of different PID namespaces
/// may share a PID: each is PID 1 of its own), then opens the FIFO for reading, which the kernel
/// blocks until a writer opens it. A test that waits for every `.ready` file and then opens
/// the FIFO for writing releases all of its processes in the same instant (no polling).
/// `Err` says which step failed.
pub fn start_barrier() -> Result<(), String> {
    let Some(fifo) = std::env::var_os(START_BARRIER_VARIABLE) else {
        return Ok(());
    };
    let fifo = std::path::PathBuf::from(fifo);
    let mut ready = fifo.clone().into_os_string();
    let namespace = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    });
    ready.push(format!(".ready.{}.{namespace}", std::process::id()));
    std::fs::write(&ready, b"")
        .map_err(|e| format!("{START_BARRIER_VARIABLE}: cannot create {ready:?}: {e}"))?;
    std::fs::File::open(&fifo).map(drop).map_err(|e| {
        format!(
            "{START_BARRIER_VARIABLE}: cannot open {}: {e}",
            fifo.display()
        )
    })
}

/// How the `launch` scenario submits kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchPath {
    Kernel,
    Ex,
    Cooperative,
    /// `cuLaunchCooperativeKernelMultiDevice` with one entry (this device, the stream).
    CooperativeMulti,
    Graph,
    /// Stream capture on a created stream: `count` `cuLaunchKernel`s recorded into a graph,
    /// which is instantiated and launched once (its kernels run then, not at capture).
    Capture,
}

/// Wall time this process spent between `cuStreamBeginCapture` and `cuStreamEndCapture` on
/// the capture launch path (reported as `capture_ns` by the `launch` scenario).
pub static CAPTURE_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl LaunchPath {
    pub fn name(self) -> &'static str {
        match self {
            LaunchPath::Kernel => "kernel",
            LaunchPath::Ex => "ex",
            LaunchPath::Cooperative => "cooperative",
            LaunchPath::CooperativeMulti => "cooperative-multi",
            LaunchPath::Graph => "graph",
            LaunchPath::Capture => "capture",
        }
    }

    pub fn parse(s: &str) -> Option<LaunchPath> {
        [
            LaunchPath::Kernel,
            LaunchPath::Ex,
            LaunchPath::Cooperative,
            LaunchPath::CooperativeMulti,
            LaunchPath::Graph,
            LaunchPath::Capture,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

/// Array element format used for array allocations: `CU_AD_FORMAT_UNSIGNED_INT8`, one
/// channel, so an array of `width x height` costs `width * height` bytes before rounding.
pub const ARRAY_FORMAT_U8: u32 = 0x01;

/// The kernel every launch loads. Real PTX (spins on `%globaltimer` for `ns_per_wave`
/// nanoseconds) so the same client also runs on a real GPU; the fake accepts any image and
/// reads `kernelParams[0]` as that same u64.
pub const SPIN_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 ns_per_wave)
{
  .reg .u64 %rd<5>;
  .reg .pred %p<2>;
  ld.param.u64 %rd1, [ns_per_wave];
  mov.u64 %rd2, %globaltimer;
SPIN:
  mov.u64 %rd3, %globaltimer;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p1, %rd4, %rd1;
  @%p1 bra SPIN;
  ret;
}
\0";

/// Name of the kernel in [`SPIN_PTX`].
pub const SPIN_KERNEL: &str = "spin";

/// A kernel that reads the buffer its second argument points to (on the fake: it takes
/// `ns_per_wave` per wave, plus what reading the buffer from where it lives costs).
pub const TOUCH_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64
.visible .entry touch(.param .u64 ns_per_wave, .param .u64 data)
{
  ret;
}
\0";

/// Parses "256MiB", "1GiB", "1g", "512k", "4096" (binary units; a subset of the limit
/// file's grammar, kept here so the clients depend on nothing but the ABI crate).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let text = s.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 256MiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown unit {other:?} in {s:?}")),
    };
    number
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("{s:?} overflows"))
}

/// Formats the 16 UUID bytes the way nvidia-smi and NVML print them.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}
