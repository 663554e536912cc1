//! The CUDA driver API model in plain Rust: what `fakegpu-cuda` exports is a thin shell over
//! the methods of [`Cuda`]. One `Cuda` is one process's view of the driver: its contexts,
//! streams, modules and allocations live here (process-private, as in the real driver),
//! while device memory and the kernel timeline live in the shared state.
//!
//! Every method returns `Result<_, CUresult>` with the real driver's error for each misuse.
//! Handles are tagged integers (`kind << 40 | sequence`) looked up in per-kind tables, so a
//! stale or mixed-up handle is reported, never dereferenced.

pub mod context;
pub mod ctx_storage;
pub mod device;
pub mod driver_memory;
pub mod graph;
pub mod image;
pub mod integrity;
pub mod launch;
pub mod managed;
pub mod memory;
pub mod module;
pub mod pool;
pub mod procaddr;
pub mod runtime_support;
pub mod stream;
pub mod tensor_map;
pub mod vmm;

use crate::state::{self, current_pid, SharedState, MAX_DEVICES};
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::CUresult;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub type R<T> = Result<T, CUresult>;

/// Every device allocation is charged rounded up to this (the VMM granularity).
pub const ALLOC_GRANULARITY: u64 = 2 << 20;

pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Handle kinds (high bits of every handle value).
pub mod kind {
    pub const CTX: u64 = 0xC7;
    pub const STREAM: u64 = 0x57;
    pub const EVENT: u64 = 0xE7;
    pub const MODULE: u64 = 0x40;
    pub const FUNC: u64 = 0xF0;
    pub const LIBRARY: u64 = 0x11;
    pub const KERNEL: u64 = 0x4E;
    pub const GRAPH: u64 = 0x6A;
    pub const EXEC: u64 = 0x6E;
    pub const NODE: u64 = 0x6D;
    pub const POOL: u64 = 0x90;
    pub const ARRAY: u64 = 0xA0;
    pub const MIPMAP: u64 = 0xA1;
    pub const VMM: u64 = 0xB0;
    pub const LINK: u64 = 0x1C;
}

pub fn kind_of(handle: u64) -> u64 {
    handle >> 40
}

/// Settings read from the environment when the driver is created.
#[derive(Clone, Debug)]
pub struct Config {
    pub driver_version: i32,
    pub ctx_overhead: u64,
    /// `FAKEGPU_CTX_INIT_MS`: how long a context's creation takes once its memory is on the
    /// card (a real driver places the context, then initialises it for tens to hundreds of
    /// milliseconds); 0 by default, at most 10 s.
    pub ctx_init_ms: u64,
    pub queue_depth: usize,
    /// `FAKEGPU_NS_PER_WAVE`: the time per wave of kernels that carry no `ns_per_wave`
    /// argument (framework kernels from fatbins and cubins), clamped like the argument.
    pub ns_per_wave: u64,
    /// `FAKEGPU_MANAGED_MEMORY=on-demand`: managed memory has residency (see `managed`);
    /// `device` (the default): it is placed on its device at allocation.
    pub managed_on_demand: bool,
    /// `FAKEGPU_HOST_LINK_GBPS`: the host link's bandwidth in GB/s (default by generation,
    /// see `managed`).
    pub host_link_gbps: Option<f64>,
}

impl Config {
    pub fn from_env() -> Config {
        fn num(name: &str) -> Option<u64> {
            std::env::var(name).ok()?.trim().parse().ok()
        }
        Config {
            driver_version: num("FAKEGPU_DRIVER_VERSION").map_or(13000, |v| v as i32),
            ctx_overhead: num("FAKEGPU_CTX_OVERHEAD").unwrap_or(300 << 20),
            ctx_init_ms: num("FAKEGPU_CTX_INIT_MS").unwrap_or(0).min(10_000),
            queue_depth: num("FAKEGPU_QUEUE_DEPTH").map_or(1024, |v| v.max(1) as usize),
            ns_per_wave: num("FAKEGPU_NS_PER_WAVE")
                .unwrap_or(launch::DEFAULT_NS_PER_WAVE)
                .min(launch::MAX_NS_PER_WAVE),
            managed_on_demand: managed_mode(std::env::var("FAKEGPU_MANAGED_MEMORY").ok()),
            host_link_gbps: std::env::var("FAKEGPU_HOST_LINK_GBPS")
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|gbps| gbps.is_finite() && *gbps > 0.0),
        }
    }
}

/// `FAKEGPU_MANAGED_MEMORY`: `on-demand` or `device` (unset, empty or anything else: `device`,
/// the latter with one line on stderr).
fn managed_mode(value: Option<String>) -> bool {
    match value.as_deref().map(str::trim) {
        Some("on-demand") => true,
        None | Some("") | Some("device") => false,
        Some(other) => {
            eprintln!(
                "fakegpu: FAKEGPU_MANAGED_MEMORY={other:?} is not device or on-demand; using device"
            );
            false
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            driver_version: 13000,
            ctx_overhead: 300 << 20,
            ctx_init_ms: 0,
            queue_depth: 1024,
            ns_per_wave: launch::DEFAULT_NS_PER_WAVE,
            managed_on_demand: false,
            host_link_gbps: None,
        }
    }
}

/// Everything process-private, behind one lock (never held while sleeping or copying bytes).
#[derive(Default)]
pub(crate) struct Tables {
    next: u64,
    pub contexts: HashMap<u64, context::Ctx>,
    pub primary: [Option<u64>; MAX_DEVICES],
    pub streams: HashMap<u64, stream::Stream>,
    pub events: HashMap<u64, stream::Event>,
    pub modules: HashMap<u64, module::Module>,
    pub functions: HashMap<u64, module::Func>,
    pub libraries: HashMap<u64, module::Library>,
    pub kernels: HashMap<u64, module::Kernel>,
    pub graphs: HashMap<u64, graph::Graph>,
    pub execs: HashMap<u64, graph::Exec>,
    /// Per device: the graph memory pool (see `graph`).
    pub graph_pools: [graph::GraphPool; MAX_DEVICES],
    pub pools: HashMap<u64, pool::Pool>,
    pub default_pool: [Option<u64>; MAX_DEVICES],
    pub current_pool: [Option<u64>; MAX_DEVICES],
    pub arenas: memory::Arenas,
    pub allocs: BTreeMap<u64, memory::Alloc>,
    /// Residency of the managed allocations, by base (`FAKEGPU_MANAGED_MEMORY=on-demand`).
    pub managed: BTreeMap<u64, managed::Managed>,
    pub arrays: HashMap<u64, memory::ArrayAlloc>,
    pub host: HashMap<usize, usize>,
    /// Host ranges registered with `cuMemHostRegister`: base -> size.
    pub host_registered: HashMap<usize, usize>,
    pub links: HashMap<u64, runtime_support::Link>,
    pub vmm: vmm::Vmm,
    /// What the driver takes on its own account (modules, local memory, limits).
    pub driver_memory: driver_memory::DriverMemory,
    /// The runtime's context-local storage: (context, key) -> value.
    pub ctx_storage: HashMap<(u64, usize), usize>,
}

impl Tables {
    pub fn handle(&mut self, kind: u64) -> u64 {
        self.next += 1;
        (kind << 40) | self.next
    }
}

/// One process's driver.
pub struct Cuda {
    pub config: Config,
    fixed_state: Option<&'static SharedState>,
    state: OnceLock<&'static SharedState>,
    /// Pid that called cuInit; any other pid (a fork child) sees an uninitialised driver.
    init_pid: AtomicU32,
    /// Serialises `init`: threads racing through a process's first cuInit must agree on one
    /// start, or a late one takes the others' finished start for a fork's and wipes what
    /// they already made.
    init_lock: Mutex<()>,
    slot: AtomicUsize,
    tables: Mutex<Tables>,
    /// Per device: end times of this process's outstanding kernels, oldest first.
    queues: [Mutex<VecDeque<u64>>; MAX_DEVICES],
}

thread_local! {
    /// The calling thread's context stack (top = current), as context handles.
    static CTX_STACK: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

static GLOBAL: OnceLock<Cuda> = OnceLock::new();

impl Cuda {
    /// The process's driver, configured from the environment, using the global state file.
    pub fn global() -> &'static Cuda {
        GLOBAL.get_or_init(|| Cuda::new(Config::from_env(), None))
    }

    /// A driver on a given state (tests); `None` opens the global state at cuInit.
    pub fn new(config: Config, state: Option<&'static SharedState>) -> Cuda {
        Cuda {
            config,
            fixed_state: state,
            state: OnceLock::new(),
            init_pid: AtomicU32::new(0),
            init_lock: Mutex::new(()),
            slot: AtomicUsize::new(usize::MAX),
            tables: Mutex::new(Tables::default()),
            queues: std::array::from_fn(|_| Mutex::new(VecDeque::new())),
        }
    }

    pub fn init(&self, flags: u32) -> R<()> {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pid = current_pid();
        if self.init_pid.load(Ordering::Acquire) == pid {
            return Ok(());
        }
        let _one_at_a_time = self.init_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Another thread of this process may have finished the start while we waited.
        let prev = self.init_pid.load(Ordering::Acquire);
        if prev == pid {
            return Ok(());
        }
        let st = match self.fixed_state {
            Some(s) => s,
            None => state::state().map_err(|e| {
                eprintln!("fakegpu: {e}");
                CUDA_ERROR_NO_DEVICE
            })?,
        };
        let _ = self.state.set(st);
        let slot = st.register_current_process().map_err(|e| {
            eprintln!("fakegpu: {e}");
            CUDA_ERROR_NO_DEVICE
        })?;
        if prev != 0 {
            // A fork child: the parent's contexts, allocations and queues do not exist here.
            *self.lock() = Tables::default();
            for q in &self.queues {
                q.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
            CTX_STACK.with(|s| s.borrow_mut().clear());
        }
        self.slot.store(slot, Ordering::Release);
        self.init_pid.store(pid, Ordering::Release);
        Ok(())
    }

    /// NOT_INITIALIZED unless cuInit succeeded in this very process.
    #[inline]
    pub fn check(&self) -> R<&'static SharedState> {
        if self.init_pid.load(Ordering::Acquire) != current_pid() {
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
        self.state.get().copied().ok_or(CUDA_ERROR_NOT_INITIALIZED)
    }

    #[inline]
    pub fn slot(&self) -> usize {
        self.slot.load(Ordering::Acquire)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn driver_version(&self) -> i32 {
        self.config.driver_version
    }
}

/// Waits (sleeping) until the monotonic clock reaches `t_ns`.
pub fn sleep_until(t_ns: u64) {
    loop {
        let now = state::now_ns();
        if now >= t_ns {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(t_ns - now));
    }
}

pub(crate) fn with_stack<T>(f: impl FnOnce(&mut Vec<u64>) -> T) -> T {
    CTX_STACK.with(|s| f(&mut s.borrow_mut()))
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use crate::spec;

    /// A driver on a fresh state file with a small first device (1 GiB) and an H200.
    pub fn driver(config: Config) -> &'static Cuda {
        let p = std::env::temp_dir().join(format!(
            "fakegpu-cuda-test-{}-{}",
            std::process::id(),
            state::now_ns()
        ));
        let mut small = spec::preset("v100", 0).unwrap();
        small.total_memory = 1 << 30;
        let st = state::open_state_with(&p, &[small, spec::preset("h200", 1).unwrap()]).unwrap();
        let _ = std::fs::remove_file(&p);
        let st: &'static SharedState = Box::leak(Box::new(st));
        let cuda: &'static Cuda = Box::leak(Box::new(Cuda::new(config, Some(st))));
        cuda.init(0).unwrap();
        // Each test thread starts with an empty context stack.
        with_stack(|s| s.clear());
        cuda
    }

    /// An image of the test clients' kind (not a known format: kernels read `ns_per_wave`).
    pub fn raw_image() -> super::module::ImageSource {
        super::module::ImageSource::Memory(c"any bytes".as_ptr() as usize)
    }

    pub fn small_overhead() -> Config {
        Config {
            ctx_overhead: 10 << 20,
            ..Config::default()
        }
    }
}
