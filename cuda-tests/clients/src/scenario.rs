//! The scenarios (subcommands) all three clients run, written once against [`Gpu`]: the
//! handful of operations they need. [`Driver`] implements it with raw entry points (linked,
//! dlsym or cuGetProcAddress); `cudarc-client` implements it with cudarc's API. Each scenario
//! prints exactly one JSON line on stdout; driver failures are results (named by
//! cuGetErrorName), not client failures: the exit code is 0 unless the client itself broke
//! (bad arguments: 2).

use crate::driver::Driver;
use crate::{AllocPath, Allocation, CUresult, Fail, LaunchPath, Res, VmmOp};
use gpuslice_abi::cuda::attr;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

/// The operations scenarios need from a driver, however it was reached.
#[allow(clippy::too_many_arguments)]
pub trait Gpu: Sync {
    /// "linked", "cudarc", "procaddr": printed as `client` in every result.
    fn client(&self) -> &'static str;
    /// `cuGetErrorName` spelling of `code`.
    fn code_name(&self, code: CUresult) -> String;
    fn init(&self) -> Res<()>;
    fn driver_version(&self) -> Res<i32>;
    fn device_count(&self) -> Res<i32>;
    fn device(&self, ordinal: i32) -> Res<i32>;
    fn device_name(&self, dev: i32) -> Res<String>;
    fn device_uuid(&self, dev: i32) -> Res<[u8; 16]>;
    fn device_total_mem(&self, dev: i32) -> Res<usize>;
    fn device_attribute(&self, dev: i32, attribute: i32) -> Res<i32>;
    /// Makes a context on `dev` current on the calling thread: the primary context
    /// (retained), or with `CLIENT_CONTEXT=created` the process's one created context on
    /// `dev` (created by the first call).
    fn context(&self, dev: i32) -> Res<()>;
    /// Ends what `context` made on `dev` (destroys the created context; releases the
    /// primary context once, which destroys it after its last retain). The driver frees
    /// everything the context owned.
    fn destroy_context(&self, dev: i32) -> Res<()>;
    /// Primary contexts only: takes one more reference to `dev`'s primary context
    /// (`cuDevicePrimaryCtxRetain`), kept until the process exits or a reset ends it.
    fn retain_primary(&self, dev: i32) -> Res<()>;
    /// Primary contexts only: `cuDevicePrimaryCtxReset_v2`, which ends `dev`'s primary
    /// context whatever its references and frees everything it owned. The references stay
    /// (a reset does not release them): `release_primary` drops them one by one; the next
    /// `context` retains the context again, which makes it anew.
    fn reset_primary(&self, dev: i32) -> Res<()>;
    /// Primary contexts only: drops one reference taken before the last `reset_primary` with
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn release_primary(&self, dev: i32) -> Res<()>;
    fn mem_get_info(&self) -> Res<(usize, usize)>;
    fn alloc(&self, path: AllocPath, size: usize) -> Res<Allocation>;
    fn free(&self, allocation: &Allocation) -> Res<()>;
    /// One VMM driver call (`vmm-reuse`).
    fn vmm(&self, op: VmmOp) -> Res<u64>;
    /// `cuMemPoolDestroy(pool)`, whatever is still allocated from it.
    fn pool_destroy(&self, pool: u64) -> Res<()>;
    /// `cuMemFreeAsync(ptr)` on the default stream, then `cuStreamSynchronize`.
    fn free_async(&self, ptr: u64) -> Res<()>;
    fn synchronize(&self) -> Res<()>;
    /// Loads [`crate::SPIN_PTX`] and returns its `spin` function as an integer handle.
    fn load_kernel(&self) -> Res<u64>;
    /// `created == false`: the default (null) stream, 0.
    fn stream(&self, created: bool) -> Res<u64>;
    fn stream_synchronize(&self, stream: u64) -> Res<()>;
    /// Submits `count` launches; one result per launch.
    fn launch(
        &self,
        path: LaunchPath,
        func: u64,
        grid: u32,
        block: u32,
        stream: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Vec<Res<()>>;
    /// The `errors` scenario's checks in order; names are shared by all clients.
    fn errors(&self) -> Vec<(&'static str, Res<()>)>;
    /// `heap`: `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, bytes)` on the current context.
    /// `Err` = the client cannot express it.
    fn set_heap_limit(&self, bytes: usize) -> Result<Res<()>, Usage> {
        let _ = bytes;
        Err(Usage(format!(
            "{}: heap is not implemented by this client",
            self.client()
        )))
    }
    /// `driver-growth`: loads the NUL-terminated PTX `ptx` (kept loaded) with
    /// `cuModuleLoadData`, or with `library` `cuLibraryLoadData`; returns its handle. `Err` =
    /// the client cannot express it.
    fn load_image(&self, ptx: &str, library: bool) -> Result<Res<u64>, Usage> {
        let _ = (ptx, library);
        Err(Usage(format!(
            "{}: driver-growth is not implemented by this client",
            self.client()
        )))
    }
    /// `driver-growth`: the launchable `kernel` of what [`Gpu::load_image`] loaded
    /// (`cuModuleGetFunction`, or `cuLibraryGetKernel`).
    fn get_kernel(&self, handle: u64, kernel: &str, library: bool) -> Result<Res<u64>, Usage> {
        let _ = (handle, kernel, library);
        Err(Usage(format!(
            "{}: driver-growth is not implemented by this client",
            self.client()
        )))
    }
    /// `driver-growth`: the address of global `name` of what [`Gpu::load_image`] loaded
    /// (`cuModuleGetGlobal`, or `cuLibraryGetGlobal`).
    fn get_global(&self, handle: u64, name: &str, library: bool) -> Result<Res<u64>, Usage> {
        let _ = (handle, name, library);
        Err(Usage(format!(
            "{}: driver-growth is not implemented by this client",
            self.client()
        )))
    }
    /// `oversubscribe`: `cuMemAdvise(ptr, size, advice, device)`. `Err` = the client cannot
    /// express it.
    fn advise(&self, ptr: u64, size: usize, advice: i32, device: i32) -> Result<Res<()>, Usage> {
        let _ = (ptr, size, advice, device);
        Err(Usage(format!(
            "{}: oversubscribe is not implemented by this client",
            self.client()
        )))
    }
    /// `oversubscribe`: `cuMemPrefetchAsync(ptr, size, device)` and a synchronisation.
    fn prefetch(&self, ptr: u64, size: usize, device: i32) -> Result<Res<()>, Usage> {
        let _ = (ptr, size, device);
        Err(Usage(format!(
            "{}: oversubscribe is not implemented by this client",
            self.client()
        )))
    }
    /// `oversubscribe`: `count` launches of `func(ns_per_wave, ptr)` on the default stream.
    fn launch_reading(
        &self,
        func: u64,
        ptr: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Result<Vec<Res<()>>, Usage> {
        let _ = (func, ptr, ns_per_wave, count);
        Err(Usage(format!(
            "{}: oversubscribe is not implemented by this client",
            self.client()
        )))
    }
    /// `driver-growth`: `cuCtxSetLimit(limit, bytes)` on the current context.
    fn set_limit(&self, limit: i32, bytes: usize) -> Result<Res<()>, Usage> {
        let _ = (limit, bytes);
        Err(Usage(format!(
            "{}: driver-growth is not implemented by this client",
            self.client()
        )))
    }
    /// `graph-memory`: captures on `stream` `allocs` x `cuMemAllocAsync(size)`, a launch of
    /// `func` and a `cuMemFreeAsync` of each; instantiates, uploads when asked, launches once, synchronises.
    /// Returns (graph, exec, launch result), both kept alive. `Err` = the client cannot
    /// express it.
    fn graph_with_memory(
        &self,
        size: usize,
        allocs: usize,
        func: u64,
        stream: u64,
        upload: bool,
    ) -> Result<Res<(u64, u64, Res<()>)>, Usage> {
        let _ = (size, allocs, func, stream, upload);
        Err(Usage(format!(
            "{}: graph-memory is not implemented by this client",
            self.client()
        )))
    }
}

impl Gpu for Driver {
    fn client(&self) -> &'static str {
        self.client
    }
    fn code_name(&self, code: CUresult) -> String {
        Driver::code_name(self, code)
    }
    fn init(&self) -> Res<()> {
        Driver::init(self)
    }
    fn driver_version(&self) -> Res<i32> {
        Driver::driver_version(self)
    }
    fn device_count(&self) -> Res<i32> {
        Driver::device_count(self)
    }
    fn device(&self, ordinal: i32) -> Res<i32> {
        Driver::device(self, ordinal)
    }
    fn device_name(&self, dev: i32) -> Res<String> {
        Driver::device_name(self, dev)
    }
    fn device_uuid(&self, dev: i32) -> Res<[u8; 16]> {
        Driver::device_uuid(self, dev)
    }
    fn device_total_mem(&self, dev: i32) -> Res<usize> {
        Driver::device_total_mem(self, dev)
    }
    fn device_attribute(&self, dev: i32, attribute: i32) -> Res<i32> {
        Driver::device_attribute(self, dev, attribute)
    }
    fn context(&self, dev: i32) -> Res<()> {
        Driver::context(self, dev)
    }
    fn destroy_context(&self, dev: i32) -> Res<()> {
        Driver::destroy_context(self, dev)
    }
    fn retain_primary(&self, dev: i32) -> Res<()> {
        Driver::retain_primary(self, dev)
    }
    fn reset_primary(&self, dev: i32) -> Res<()> {
        Driver::reset_primary(self, dev)
    }
    fn release_primary(&self, dev: i32) -> Res<()> {
        Driver::release_primary(self, dev)
    }
    fn mem_get_info(&self) -> Res<(usize, usize)> {
        Driver::mem_get_info(self)
    }
    fn alloc(&self, path: AllocPath, size: usize) -> Res<Allocation> {
        Driver::alloc(self, path, size)
    }
    fn free(&self, allocation: &Allocation) -> Res<()> {
        Driver::free(self, allocation)
    }
    fn vmm(&self, op: VmmOp) -> Res<u64> {
        Driver::vmm(self, op)
    }
    fn pool_destroy(&self, pool: u64) -> Res<()> {
        Driver::pool_destroy(self, pool)
    }
    fn free_async(&self, ptr: u64) -> Res<()> {
        Driver::free_async(self, ptr)
    }
    fn synchronize(&self) -> Res<()> {
        Driver::synchronize(self)
    }
    fn load_kernel(&self) -> Res<u64> {
        Driver::load_kernel(self)
    }
    fn stream(&self, created: bool) -> Res<u64> {
        Driver::stream(self, created)
    }
    fn stream_synchronize(&self, stream: u64) -> Res<()> {
        Driver::stream_synchronize(self, stream)
    }
    fn launch(
        &self,
        path: LaunchPath,
        func: u64,
        grid: u32,
        block: u32,
        stream: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Vec<Res<()>> {
        Driver::launch(self, path, func, grid, block, stream, ns_per_wave, count)
    }
    fn errors(&self) -> Vec<(&'static str, Res<()>)> {
        Driver::errors(self)
    }
    fn set_heap_limit(&self, bytes: usize) -> Result<Res<()>, Usage> {
        Ok(Driver::set_heap_limit(self, bytes))
    }
    fn load_image(&self, ptx: &str, library: bool) -> Result<Res<u64>, Usage> {
        Ok(Driver::load_image(self, ptx, library))
    }
    fn get_kernel(&self, handle: u64, kernel: &str, library: bool) -> Result<Res<u64>, Usage> {
        Ok(Driver::get_kernel(self, handle, kernel, library))
    }
    fn get_global(&self, handle: u64, name: &str, library: bool) -> Result<Res<u64>, Usage> {
        Ok(Driver::get_global(self, handle, name, library))
    }
    fn set_limit(&self, limit: i32, bytes: usize) -> Result<Res<()>, Usage> {
        Ok(Driver::set_limit(self, limit, bytes))
    }
    fn advise(&self, ptr: u64, size: usize, advice: i32, device: i32) -> Result<Res<()>, Usage> {
        Ok(Driver::advise(self, ptr, size, advice, device))
    }
    fn prefetch(&self, ptr: u64, size: usize, device: i32) -> Result<Res<()>, Usage> {
        Ok(Driver::prefetch(self, ptr, size, device))
    }
    fn launch_reading(
        &self,
        func: u64,
        ptr: u64,
        ns_per_wave: u64,
        count: usize,
    ) -> Result<Vec<Res<()>>, Usage> {
        Ok(Driver::launch_reading(self, func, ptr, ns_per_wave, count))
    }
    fn graph_with_memory(
        &self,
        size: usize,
        allocs: usize,
        func: u64,
        stream: u64,
        upload: bool,
    ) -> Result<Res<(u64, u64, Res<()>)>, Usage> {
        Ok(Driver::graph_with_memory(
            self, size, allocs, func, stream, upload,
        ))
    }
}

/// The usage text every client prints for bad arguments.
pub const USAGE: &str = "\
usage: <client> SCENARIO [ARGS]
  info
  meminfo
  alloc SIZE [--count N] [--path alloc|pitch|managed|async|pool|vmm|array|array3d|mipmap]
  alloc-until-oom CHUNK [--path P] [--max N] [--before-init context] [--pool-device N]
  alloc-retry SIZE [--path P] [--max-ms MS]
  caching-allocator
  hold SIZE [--path P]
  oversubscribe CHUNK [--max N] [--touches K] [--ns-per-wave NS]
  heap SIZE
  context-cycle SIZE [--path P] [--end release|reset|destroy] [--retains N] [--release-after N]
  pool-destroy-held SIZE [--max N]
  graph-memory SIZE [--allocs N] [--upload true] [--chunk CHUNK] [--max N]
  launch [--kernels N] [--ns-per-wave NS] [--grid G] [--block B] [--stream default|created]
         [--path kernel|ex|cooperative|cooperative-multi|graph|capture] [--duration-s S]
  threads [--threads N] [--size SIZE] [--iterations N] [--path P[,P...]] [--hold-us US] [--keep-alive true]
  vmm-reuse [--threads N] [--size SIZE] [--iterations N] [--slots K] [--churn true] [--hold-us US]
  errors
  (linked-client only) nvml
hold, alloc-retry, heap, context-cycle, pool-destroy-held, graph-memory and vmm-reuse print their line, then keep the process alive until
stdin closes.
threads: N threads (default 16) each allocate and free SIZE (default 2MiB) N times (default 50)
on path P (default alloc), holding each allocation --hold-us microseconds (default 0);
--keep-alive true prints the line and keeps the process alive until stdin closes.
alloc-retry: allocates SIZE, retrying every 5 ms while the answer is out-of-memory, for at
most MS (default 30000); reports result, attempts and refused.
vmm-reuse: N threads (default 16) each loop N times (default 200): cuMemCreate(SIZE, default
60MiB), cuMemMap into a free address range, cuMemSetAccess, cuMemRelease (the mapping keeps
the memory), cuMemUnmap. Address ranges pass between threads while their frees are in
flight: by default K (default N/2) SIZE-ranges of one cuMemAddressReserve are shared and a
thread maps the first that is free (the driver answers CUDA_ERROR_ALREADY_MAPPED for a taken
one); with --churn true every iteration reserves its own range and frees it
(cuMemAddressFree) after the unmap, and the driver may hand the same range to the next
reserve. --hold-us keeps each mapping that long before the unmap (default 0), so that many
threads hold memory at once. Reports each call's results and mem_free.
heap: cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, SIZE) on the current context (the driver backs
the device-malloc heap with device memory); prints the result and mem_free.
driver-growth FILL [--static SIZE] [--local SIZE] [--stack SIZE] [--fifo SIZE] [--library 1]
[--load 0] [--global 1] [--lookup 0] [--launch 0] [--after SIZE]: allocates FILL, sets the stack limit and
the printf FIFO, loads a PTX module (or library) with SIZE of static data, looks up its global
when asked, looks up its kernel, whose stack frame is --local per thread, launches it once,
then tries --after more (2 MiB); holds until stdin ends (driver-API clients only).
behind SIZE [--printf-fifo BYTES]: allocates SIZE through the real cuMemAlloc_v2 found behind
the shim (glibc's own dlsym), then sets the printf FIFO to BYTES through the shim; holds until
stdin ends (driver-API clients only).
oversubscribe: cuMemAlloc of CHUNK until one is refused (or N succeeded, default 1024);
reads cuDeviceTotalMem and cuMemGetInfo; cuMemAdvise(SET_PREFERRED_LOCATION, device) and a
prefetch to the device on the first and the last allocation; K launches (default 4) of a
kernel reading the first allocation and K reading the last, each batch timed to its
synchronisation (first/last_touch_ns per launch; first/last_alloc_ns: the allocations'
own times); prints, holds until stdin closes, then frees (driver-API clients only).
pool-destroy-held: until an allocation fails (or N succeeded), creates a pool, allocates SIZE
from it and destroys the pool with that allocation outstanding (the driver releases the
pool's memory once its allocations are freed); then frees every allocation
(cuMemFreeAsync + cuStreamSynchronize) and reads mem_free.
launch: batches of N kernels (default 1) until S seconds passed, synchronising after each;
--path capture records each batch by stream capture on a created stream and launches the
graph once (capture_ns: wall time spent capturing, in total).
graph-memory: a created stream captures N (default 1) cuMemAllocAsync(SIZE), a kernel and
a cuMemFreeAsync of each (the graph needs N x SIZE at once); the graph is instantiated, uploaded (--upload true), launched and synchronised (its memory
now lives in the device's graph pool); then cuMemAlloc of CHUNK (default 100MiB) until one
fails (or N succeeded). Graph, exec and allocations are held until stdin closes.
context-cycle: SIZE allocated in the context, the context ended without freeing it (the
driver frees what a context owned), a context made again, mem_free read in it. --end:
  release (primary contexts, their default): one cuDevicePrimaryCtxRelease, which ends the
    context only if it drops the last reference;
  reset (primary contexts): cuDevicePrimaryCtxReset, which ends it whatever its references
    but keeps them (the next retain makes the context anew);
  destroy (created contexts, their default and only end): cuCtxDestroy.
  --retains N (primary contexts, default 1): the process holds N references to the primary
  context before it allocates.
  --release-after N (with --end reset): after the context is made anew, N releases of
  references the reset kept (late_releases, mem_free_after_releases).
Environment: CLIENT_START_BARRIER=FIFO: before making its context, the scenario creates
  FIFO.ready.<pid>.<pid namespace> and opens FIFO for reading, which blocks until the test opens it for
  writing, so processes released together really start their contexts together.
  CLIENT_CONTEXT=primary (default: device primary contexts, cuDevicePrimaryCtxRetain)
  or created (one non-primary context per device and process, cuCtxCreate; shared by the
  process's threads; cudarc-client makes it with cuCtxCreate_v4, the others with _v2).";

/// A client break: bad arguments. Printed with the usage; exit code 2.
#[derive(Debug)]
pub struct Usage(pub String);

/// Command-line options after the scenario name: positionals and `--flag value` pairs.
pub struct Args {
    pub positional: Vec<String>,
    pub options: BTreeMap<String, String>,
}

impl Args {
    /// Splits `args`; every `--name` takes one value except those in `switches`.
    pub fn parse(args: &[String], switches: &[&str]) -> Result<Args, Usage> {
        let mut positional = Vec::new();
        let mut options = BTreeMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                if switches.contains(&name) {
                    options.insert(name.to_string(), String::new());
                } else {
                    let v = it
                        .next()
                        .ok_or_else(|| Usage(format!("--{name} needs a value")))?;
                    options.insert(name.to_string(), v.clone());
                }
            } else {
                positional.push(a.clone());
            }
        }
        Ok(Args {
            positional,
            options,
        })
    }

    pub fn has(&self, name: &str) -> bool {
        self.options.contains_key(name)
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, Usage> {
        match self.options.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| Usage(format!("--{name}: cannot parse {v:?}"))),
        }
    }

    fn size_at(&self, index: usize, what: &str) -> Result<usize, Usage> {
        let text = self
            .positional
            .get(index)
            .ok_or_else(|| Usage(format!("missing {what}")))?;
        crate::parse_size(text).map_err(|e| Usage(format!("{what} {text:?}: {e}")))
    }

    /// `--name SIZE` (sizes as `parse_size` reads them), `None` when absent.
    fn size_opt(&self, name: &str) -> Result<Option<usize>, Usage> {
        self.options
            .get(name)
            .map(|v| crate::parse_size(v).map_err(|e| Usage(format!("--{name} {v:?}: {e}"))))
            .transpose()
    }

    fn alloc_path(&self) -> Result<AllocPath, Usage> {
        match self.options.get("path") {
            None => Ok(AllocPath::Alloc),
            Some(p) => AllocPath::parse(p).ok_or_else(|| Usage(format!("unknown --path {p}"))),
        }
    }
    /// `--path a,b,...`: thread `t` of a threaded scenario takes path `t % n` (mixing the
    /// free paths in one process).
    fn alloc_paths(&self) -> Result<Vec<AllocPath>, Usage> {
        match self.options.get("path") {
            None => Ok(vec![AllocPath::Alloc]),
            Some(list) => list
                .split(',')
                .map(|p| AllocPath::parse(p).ok_or_else(|| Usage(format!("unknown --path {p}"))))
                .collect(),
        }
    }
}

/// Runs scenario `args[0]` on `gpu`, prints its JSON line, returns the exit code.
pub fn main_with<G: Gpu>(gpu: &G, args: &[String]) -> i32 {
    match run_gpu(gpu, args) {
        Ok(value) => {
            println!("{value}");
            0
        }
        Err(Usage(message)) => {
            eprintln!("{}: {message}\n{USAGE}", gpu.client());
            2
        }
    }
}

/// Runs one scenario and returns its JSON (without printing).
pub fn run_gpu<G: Gpu>(gpu: &G, args: &[String]) -> Result<Value, Usage> {
    let scenario = args
        .first()
        .ok_or_else(|| Usage("missing scenario".into()))?
        .as_str();
    let rest = Args::parse(&args[1..], &[])?;
    crate::ContextMode::from_env().map_err(Usage)?;
    let mut out = match scenario {
        "info" => info(gpu),
        "meminfo" => meminfo(gpu),
        "alloc" => alloc(gpu, &rest)?,
        "alloc-until-oom" => alloc_until_oom(gpu, &rest)?,
        "alloc-retry" => alloc_retry(gpu, &rest)?,
        "caching-allocator" => caching_allocator(gpu),
        "hold" => hold(gpu, &rest)?,
        "heap" => heap(gpu, &rest)?,
        "driver-growth" => driver_growth(gpu, &rest)?,
        "oversubscribe" => oversubscribe(gpu, &rest)?,
        "behind" => behind(gpu, &rest)?,
        "context-cycle" => context_cycle(gpu, &rest)?,
        "pool-destroy-held" => pool_destroy_held(gpu, &rest)?,
        "graph-memory" => graph_memory(gpu, &rest)?,
        "launch" => launch(gpu, &rest)?,
        "threads" => threads(gpu, &rest)?,
        "churn" => churn(gpu, &rest)?,
        "watch-free" => watch_free(gpu, &rest)?,
        "vmm-reuse" => vmm_reuse(gpu, &rest)?,
        "errors" => errors(gpu),
        other => return Err(Usage(format!("unknown scenario {other:?}"))),
    };
    let obj = out.as_object_mut().expect("scenarios return objects");
    obj.insert("scenario".into(), json!(scenario));
    obj.insert("client".into(), json!(gpu.client()));
    Ok(out)
}

/// Spelling of a failure in results: the driver's name, or `MISSING:<entry point>`.
pub fn fail_name<G: Gpu + ?Sized>(gpu: &G, fail: Fail) -> String {
    match fail {
        Fail::Cu(code) => gpu.code_name(code),
        Fail::Missing(name) => format!("MISSING:{name}"),
    }
}

/// `"CUDA_SUCCESS"` or the failure's name.
pub fn res_name<G: Gpu + ?Sized, T>(gpu: &G, r: &Res<T>) -> String {
    match r {
        Ok(_) => gpu.code_name(0),
        Err(f) => fail_name(gpu, *f),
    }
}

/// A setup call failed: the scenario's result is where and why.
fn setup_failed<G: Gpu + ?Sized>(gpu: &G, step: &str, fail: Fail) -> Value {
    eprintln!("{}: {step} failed: {}", gpu.client(), fail_name(gpu, fail));
    json!({"error": fail_name(gpu, fail), "failed_step": step})
}

/// cuInit + a context on device 0 current (primary, or created: `CLIENT_CONTEXT`); the start
/// of every memory scenario. Returns the device.
fn setup<G: Gpu + ?Sized>(gpu: &G) -> Result<i32, Value> {
    gpu.init().map_err(|f| setup_failed(gpu, "cuInit", f))?;
    let dev = gpu
        .device(0)
        .map_err(|f| setup_failed(gpu, "cuDeviceGet", f))?;
    crate::start_barrier().map_err(|e| json!({"error": e, "failed_step": "start barrier"}))?;
    gpu.context(dev)
        .map_err(|f| setup_failed(gpu, "context", f))?;
    Ok(dev)
}

fn info<G: Gpu>(gpu: &G) -> Value {
    let body = || -> Result<Value, Value> {
        gpu.init().map_err(|f| setup_failed(gpu, "cuInit", f))?;
        let version = gpu
            .driver_version()
            .map_err(|f| setup_failed(gpu, "cuDriverGetVersion", f))?;
        let count = gpu
            .device_count()
            .map_err(|f| setup_failed(gpu, "cuDeviceGetCount", f))?;
        let mut devices = Vec::new();
        for i in 0..count {
            let one = || -> Res<Value> {
                let d = gpu.device(i)?;
                Ok(json!({
                    "index": i,
                    "name": gpu.device_name(d)?,
                    "uuid": crate::format_uuid(&gpu.device_uuid(d)?),
                    "total_memory": gpu.device_total_mem(d)?,
                    "sm_count": gpu.device_attribute(d, attr::MULTIPROCESSOR_COUNT)?,
                    "max_threads_per_sm": gpu.device_attribute(d, attr::MAX_THREADS_PER_MULTIPROCESSOR)?,
                    "cc_major": gpu.device_attribute(d, attr::COMPUTE_CAPABILITY_MAJOR)?,
                    "cc_minor": gpu.device_attribute(d, attr::COMPUTE_CAPABILITY_MINOR)?,
                }))
            };
            devices.push(one().map_err(|f| setup_failed(gpu, &format!("device {i}"), f))?);
        }
        Ok(json!({"driver_version": version, "device_count": count, "devices": devices}))
    };
    body().unwrap_or_else(|e| e)
}

fn meminfo<G: Gpu>(gpu: &G) -> Value {
    if let Err(e) = setup(gpu) {
        return e;
    }
    let info = gpu.mem_get_info();
    let total = gpu.device_total_mem(0);
    json!({
        "result": res_name(gpu, &info),
        "free": info.map(|i| i.0).ok(),
        "total": info.map(|i| i.1).ok(),
        "device_total_result": res_name(gpu, &total),
        "device_total": total.ok(),
    })
}

fn mem_free_now<G: Gpu>(gpu: &G) -> Option<usize> {
    gpu.mem_get_info().ok().map(|i| i.0)
}

fn alloc<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let count: usize = args.get("count", 1)?;
    let path = args.alloc_path()?;
    if let Err(e) = setup(gpu) {
        return Ok(e);
    }
    let free_before = mem_free_now(gpu);
    let attempts: Vec<Res<Allocation>> = (0..count).map(|_| gpu.alloc(path, size)).collect();
    let free_during = mem_free_now(gpu);
    let frees: Vec<String> = attempts
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .map(|a| res_name(gpu, &gpu.free(a)))
        .collect();
    let free_after = mem_free_now(gpu);
    Ok(json!({
        "size": size,
        "count": count,
        "path": path.name(),
        "results": attempts.iter().map(|r| res_name(gpu, r)).collect::<Vec<_>>(),
        "ok": attempts.iter().filter(|r| r.is_ok()).count(),
        "free_results": frees,
        "mem_free_before": free_before,
        "mem_free_during": free_during,
        "mem_free_after": free_after,
    }))
}

/// Counts of each result name (keeps outputs small when thousands of calls succeed).
fn tally<G: Gpu>(gpu: &G, results: &[Res<()>]) -> Map<String, Value> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for r in results {
        *counts.entry(res_name(gpu, r)).or_default() += 1;
    }
    counts.into_iter().map(|(k, v)| (k, json!(v))).collect()
}

/// `alloc-retry SIZE [--path P] [--max-ms MS]`: allocates SIZE, retrying every 5 ms while the
/// answer is OUT_OF_MEMORY, for at most MS (default 30000): an application waiting for room
/// another process is about to give back. Prints the result, attempts and refusals, then holds
/// the allocation until stdin closes.
fn alloc_retry<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let path = args.alloc_path()?;
    let max = Duration::from_millis(args.get("max-ms", 30_000)?);
    if let Err(mut e) = setup(gpu) {
        e["pid"] = json!(std::process::id());
        print_and_hold(gpu, "alloc-retry", e);
    }
    let started = Instant::now();
    let (mut attempts, mut refused) = (0u64, 0u64);
    let result = loop {
        attempts += 1;
        match gpu.alloc(path, size) {
            Err(Fail::Cu(code)) if gpu.code_name(code) == "CUDA_ERROR_OUT_OF_MEMORY" => {
                refused += 1;
                if started.elapsed() >= max {
                    break Err(Fail::Cu(code));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            other => break other,
        }
    };
    let line = json!({
        "size": size,
        "path": path.name(),
        "result": res_name(gpu, &result),
        "attempts": attempts,
        "refused": refused,
        "mem_free": mem_free_now(gpu),
    });
    // Held (not freed) until the process ends: the test reads the card meanwhile.
    print_and_hold(gpu, "alloc-retry", line)
}

fn alloc_until_oom<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let chunk = args.size_at(0, "CHUNK")?;
    let path = args.alloc_path()?;
    let max: usize = args.get("max", 1_000_000)?;
    // `--pool-device N`: `--path pool` creates its pools on device N while the context stays
    // on device 0 (a pool "may be from a device different than that of the specified
    // hStream").
    let pool_device: i32 = args.get("pool-device", 0)?;
    crate::set_pool_device(pool_device);
    // `--before-init context`: ask for device 0's context before cuInit, as a careless
    // program (or a library initialising itself early) may; the driver refuses it.
    let before_init = match args.options.get("before-init").map(String::as_str) {
        None => None,
        Some("context") => Some(res_name(gpu, &gpu.context(0))),
        Some(other) => return Err(Usage(format!("unknown --before-init {other}"))),
    };
    if let Err(mut e) = setup(gpu) {
        e["before_init"] = json!(before_init);
        return Ok(e);
    }
    let (held, failure) = alloc_until_failure(gpu, path, chunk, max);
    let total: usize = held.iter().map(|a| a.size).sum();
    let free_at_oom = mem_free_now(gpu);
    let frees: Vec<Res<()>> = held.iter().map(|a| gpu.free(a)).collect();
    Ok(json!({
        "chunk": chunk,
        "path": path.name(),
        "count": held.len(),
        "total_bytes": total,
        "error": failure.map(|f| fail_name(gpu, f)),
        "mem_free_at_oom": free_at_oom,
        "free_results": tally(gpu, &frees),
        "mem_free_after": mem_free_now(gpu),
        "before_init": before_init,
        "pool_device": pool_device,
    }))
}

/// PyTorch's caching allocator in miniature: grab 1 GiB blocks until OOM, then keep halving
/// the request (down to 2 MiB) and grabbing until OOM at the smallest size.
fn caching_allocator<G: Gpu>(gpu: &G) -> Value {
    if let Err(e) = setup(gpu) {
        return e;
    }
    const SMALLEST: usize = 2 << 20;
    let mut held: Vec<Allocation> = Vec::new();
    let mut blocks: BTreeMap<usize, u64> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut size = 1usize << 30;
    let mut freed_one = false;
    loop {
        match gpu.alloc(AllocPath::Alloc, size) {
            Ok(a) => {
                held.push(a);
                *blocks.entry(size).or_default() += 1;
            }
            Err(f) => {
                errors.push(json!({"size": size, "error": fail_name(gpu, f)}));
                if !freed_one {
                    // The cache's first reaction to OOM: release one cached block and retry.
                    freed_one = true;
                    if let Some(a) = held.pop() {
                        *blocks.entry(a.size).or_default() -= 1;
                        if let Err(f) = gpu.free(&a) {
                            errors.push(json!({"free_size": a.size, "error": fail_name(gpu, f)}));
                        }
                    }
                }
                if size <= SMALLEST {
                    break;
                }
                size /= 2;
            }
        }
        if held.len() > 1_000_000 {
            break;
        }
    }
    let total: usize = held.iter().map(|a| a.size).sum();
    let free_at_oom = mem_free_now(gpu);
    let frees: Vec<Res<()>> = held.iter().map(|a| gpu.free(a)).collect();
    json!({
        "total_held": total,
        "blocks": blocks.iter().filter(|(_, n)| **n > 0).map(|(s, n)| (s.to_string(), json!(n))).collect::<Map<_, _>>(),
        "errors": errors,
        "mem_free_at_oom": free_at_oom,
        "free_results": tally(gpu, &frees),
    })
}

/// Allocates `size` on `path` until the driver refuses or `max` succeeded: what it holds, and
/// the refusal.
fn alloc_until_failure<G: Gpu>(
    gpu: &G,
    path: AllocPath,
    size: usize,
    max: usize,
) -> (Vec<Allocation>, Option<Fail>) {
    let mut held = Vec::new();
    while held.len() < max {
        match gpu.alloc(path, size) {
            Ok(a) => held.push(a),
            Err(f) => return (held, Some(f)),
        }
    }
    (held, None)
}

/// Prints `line` (with the scenario, client and pid), then keeps the process and everything
/// it holds alive until stdin reaches EOF (the parent test closes it or kills us), and exits
/// without printing more.
fn print_and_hold<G: Gpu>(gpu: &G, scenario: &str, mut line: Value) -> ! {
    line["scenario"] = json!(scenario);
    line["client"] = json!(gpu.client());
    line["pid"] = json!(std::process::id());
    println!("{line}");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::process::exit(0);
}

/// Allocates, prints the result, then holds the memory until stdin reaches EOF (the parent
/// test closes it or kills this process).
fn hold<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let path = args.alloc_path()?;
    if let Err(mut e) = setup(gpu) {
        e["pid"] = json!(std::process::id());
        return Ok(e);
    }
    let a = gpu.alloc(path, size);
    let line = json!({
        "scenario": "hold",
        "client": gpu.client(),
        "size": size,
        "path": path.name(),
        "result": res_name(gpu, &a),
        "pid": std::process::id(),
        "mem_free": mem_free_now(gpu),
    });
    println!("{line}");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    if let Ok(a) = &a {
        let r = gpu.free(a);
        eprintln!("{}: hold: free -> {}", gpu.client(), res_name(gpu, &r));
    }
    // The line is already out; tell the runner to print nothing more.
    std::process::exit(0);
}

/// `oversubscribe` (see the usage text): what an application sees of a slice whose virtual
/// size passes its physical share, and how fast its kernels read each side.
fn oversubscribe<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    const SET_PREFERRED_LOCATION: i32 = 3;
    let chunk = args.size_at(0, "CHUNK")?;
    let max: usize = args.get("max", 1024)?;
    let touches: usize = args.get("touches", 4)?;
    let ns: u64 = args.get("ns-per-wave", 1000)?;
    let dev = match setup(gpu) {
        Ok(dev) => dev,
        Err(e) => return Ok(e),
    };
    let total_mem = gpu.device_total_mem(dev).ok();
    let before = gpu.mem_get_info().ok();
    let mut held = Vec::new();
    let mut refusal = None;
    let mut alloc_ns = Vec::new();
    while held.len() < max {
        let started = Instant::now();
        let allocated = gpu.alloc(AllocPath::Alloc, chunk);
        alloc_ns.push(started.elapsed().as_nanos() as u64);
        match allocated {
            Ok(a) => held.push(a),
            Err(f) => {
                refusal = Some(fail_name(gpu, f));
                break;
            }
        }
    }
    let during = gpu.mem_get_info().ok();
    let mut line = json!({
        "chunk": chunk,
        "ok": held.len(),
        "refusal": refusal,
        "total_mem": total_mem,
        "mem_total": during.map(|i| i.1),
        "mem_free_before": before.map(|i| i.0),
        "mem_free_during": during.map(|i| i.0),
        "first_alloc_ns": alloc_ns.first(),
        "last_alloc_ns": held.len().checked_sub(1).and_then(|i| alloc_ns.get(i)),
    });
    if let (Some(first), Some(last)) = (held.first(), held.last()) {
        let func = match gpu.load_image(crate::TOUCH_PTX, false)? {
            Ok(module) => gpu.get_kernel(module, "touch", false)?,
            Err(f) => Err(f),
        };
        for (name, a) in [("first", first), ("last", last)] {
            let advise = gpu.advise(a.ptr, chunk, SET_PREFERRED_LOCATION, dev)?;
            let prefetch = gpu.prefetch(a.ptr, chunk, dev)?;
            line[format!("{name}_advise")] = json!(res_name(gpu, &advise));
            line[format!("{name}_prefetch")] = json!(res_name(gpu, &prefetch));
            if let Ok(f) = &func {
                let started = Instant::now();
                let launched = gpu.launch_reading(*f, a.ptr, ns, touches)?;
                let synced = gpu.synchronize();
                let ns_each = started.elapsed().as_nanos() as u64 / touches.max(1) as u64;
                line[format!("{name}_touch")] = json!(tally(gpu, &launched));
                line[format!("{name}_touch_sync")] = json!(res_name(gpu, &synced));
                line[format!("{name}_touch_ns")] = json!(ns_each);
            }
        }
        line["load"] = json!(res_name(gpu, &func));
    }
    line["scenario"] = json!("oversubscribe");
    line["client"] = json!(gpu.client());
    line["pid"] = json!(std::process::id());
    println!("{line}");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    for a in &held {
        let _ = gpu.free(a);
    }
    std::process::exit(0);
}

/// Sets the current context's device-malloc heap to SIZE, prints the result and mem_free,
/// then keeps the process alive until stdin reaches EOF (like `hold`).
fn heap<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let line = match setup(gpu) {
        Err(e) => e,
        Ok(_) => {
            let r = gpu.set_heap_limit(size)?;
            json!({
                "size": size,
                "result": res_name(gpu, &r),
                "mem_free": mem_free_now(gpu),
            })
        }
    };
    print_and_hold(gpu, "heap", line)
}

/// The PTX `driver-growth` loads: `static` bytes of module-scope `__device__` data and a
/// kernel `grow` whose stack frame (`__local_depot0`) is `local` bytes per thread, as nvcc
/// writes them.
pub fn growth_ptx(static_bytes: usize, local: usize) -> String {
    format!(
        ".version 7.0\n.target sm_70\n.address_size 64\n\
         .global .align 8 .b8 table[{static_bytes}];\n\
         .visible .entry grow(.param .u64 ns_per_wave)\n{{\n\
         \t.local .align 8 .b8 __local_depot0[{local}];\n\tret;\n}}\n\0"
    )
}

/// What the driver places without being asked, in a full slice: allocates FILL, sets the
/// stack limit (`--stack BYTES`, per thread; 0 = leave it) and the printf FIFO (`--fifo`),
/// loads an image with `--static` bytes of static data (a module, or with `--library 1` a
/// library; `--load 0`: none), looks up its global `table` when asked (`--global 1`), looks up
/// its kernel, whose stack frame is `--local` bytes per thread, and launches it once
/// (`--launch 0`: not; with `--lookup 0` not even looked up); then tries `--after` bytes more
/// (2 MiB by default).
/// Prints each result (null for a step not taken), mem_free, and holds everything until stdin
/// reaches EOF.
fn driver_growth<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let fill = args.size_at(0, "FILL")?;
    let static_bytes = args.size_opt("static")?.unwrap_or(0);
    let local: usize = args.size_opt("local")?.unwrap_or(0);
    let stack: usize = args.size_opt("stack")?.unwrap_or(0);
    let fifo: usize = args.size_opt("fifo")?.unwrap_or(0);
    let after: usize = args.size_opt("after")?.unwrap_or(2 << 20);
    let library = args.get::<u32>("library", 0)? == 1;
    let load_it = args.get::<u32>("load", 1)? == 1;
    let lookup = load_it && args.get::<u32>("lookup", 1)? == 1;
    let launch_it = lookup && args.get::<u32>("launch", 1)? == 1;
    let global = args.get::<u32>("global", 0)? == 1;
    if let Err(e) = setup(gpu) {
        return Ok(e);
    }
    let held = gpu.alloc(AllocPath::Alloc, fill);
    let limit = |limit, bytes: usize| -> Result<Option<Res<()>>, Usage> {
        (bytes > 0).then(|| gpu.set_limit(limit, bytes)).transpose()
    };
    let stack_result = limit(gpuslice_abi::cuda::limit::STACK_SIZE, stack)?;
    let fifo_result = limit(gpuslice_abi::cuda::limit::PRINTF_FIFO_SIZE, fifo)?;
    let ptx = growth_ptx(static_bytes, local);
    let loaded = load_it.then(|| gpu.load_image(&ptx, library)).transpose()?;
    let global_result = match (&loaded, global) {
        (Some(Ok(h)), true) => Some(gpu.get_global(*h, "table", library)?),
        _ => None,
    };
    let func = match (&loaded, lookup) {
        (Some(Ok(h)), true) => Some(gpu.get_kernel(*h, "grow", library)?),
        _ => None,
    };
    let launch = match &func {
        Some(Ok(f)) if launch_it => {
            let r = gpu
                .launch(LaunchPath::Kernel, *f, 1, 32, 0, 1000, 1)
                .pop()
                .unwrap_or(Ok(()));
            Some(r.and_then(|()| gpu.synchronize()))
        }
        _ => None,
    };
    let more = gpu.alloc(AllocPath::Alloc, after);
    let line = json!({
        "fill": res_name(gpu, &held),
        "stack": stack_result.as_ref().map(|r| res_name(gpu, r)),
        "fifo": fifo_result.as_ref().map(|r| res_name(gpu, r)),
        "load": loaded.as_ref().map(|r| res_name(gpu, r)),
        "global": global_result.as_ref().map(|r| res_name(gpu, r)),
        "lookup": func.as_ref().map(|r| res_name(gpu, r)),
        "launch": launch.as_ref().map(|r| res_name(gpu, r)),
        "after": res_name(gpu, &more),
        "mem_free": mem_free_now(gpu),
    });
    if let Ok(m) = &more {
        let _ = gpu.free(m);
    }
    let _keep = held;
    print_and_hold(gpu, "driver-growth", line)
}

/// A registered process that allocates SIZE through the real `cuMemAlloc_v2`, reached behind
/// the shim ([`crate::driver::behind_the_shim`]): bytes its slot never holds. With
/// `--printf-fifo BYTES` it then makes one harmless `cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE,
/// BYTES)` through the shim (a shim that took NVML's surplus after such a call for memory the
/// driver placed by itself would charge the hidden bytes as that). Prints the results and the
/// device pointer, and holds everything until stdin reaches EOF.
fn behind<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let fifo = args.size_opt("printf-fifo")?;
    if let Err(e) = setup(gpu) {
        return Ok(e);
    }
    type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
    let (alloc, ptr) = match crate::driver::behind_the_shim("cuMemAlloc_v2") {
        Ok(function) => {
            // SAFETY: cuMemAlloc_v2's C signature; `ptr` is a valid out-pointer.
            let real = unsafe { std::mem::transmute::<*mut std::ffi::c_void, MemAlloc>(function) };
            let mut ptr = 0u64;
            // SAFETY: as above, with the context `setup` made current.
            let code = unsafe { real(&mut ptr, size) };
            (gpu.code_name(code), ptr)
        }
        Err(e) => (format!("MISSING:{e}"), 0),
    };
    let limit = match fifo {
        Some(bytes) => Some(res_name(
            gpu,
            &gpu.set_limit(gpuslice_abi::cuda::limit::PRINTF_FIFO_SIZE, bytes)?,
        )),
        None => None,
    };
    let line = json!({
        "size": size,
        "alloc": alloc,
        "ptr": ptr,
        "limit": limit,
        "mem_free": mem_free_now(gpu),
    });
    print_and_hold(gpu, "behind", line)
}

/// How `context-cycle` ends its context (`--end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContextEnd {
    /// One `cuDevicePrimaryCtxRelease_v2` (primary contexts; ends it on the last reference).
    Release,
    /// `cuDevicePrimaryCtxReset_v2` (primary contexts; ends it whatever its references).
    Reset,
    /// `cuCtxDestroy_v2` (created contexts).
    Destroy,
}

impl ContextEnd {
    fn name(self) -> &'static str {
        match self {
            ContextEnd::Release => "release",
            ContextEnd::Reset => "reset",
            ContextEnd::Destroy => "destroy",
        }
    }

    /// `--end`, defaulting to what ends the `CLIENT_CONTEXT` mode's context; an end of the
    /// other mode is a usage error.
    fn from_args(args: &Args) -> Result<ContextEnd, Usage> {
        let primary = crate::ContextMode::current() == crate::ContextMode::Primary;
        let end = match args.options.get("end").map(String::as_str) {
            None if primary => return Ok(ContextEnd::Release),
            None => return Ok(ContextEnd::Destroy),
            Some("release") => ContextEnd::Release,
            Some("reset") => ContextEnd::Reset,
            Some("destroy") => ContextEnd::Destroy,
            Some(other) => return Err(Usage(format!("unknown --end {other}"))),
        };
        let ends_primary = end != ContextEnd::Destroy;
        if ends_primary != primary {
            let needs = if ends_primary { "primary" } else { "created" };
            return Err(Usage(format!(
                "--end {} ends {needs} contexts: it needs {}={needs}",
                end.name(),
                crate::CONTEXT_VARIABLE
            )));
        }
        Ok(end)
    }
}

/// Allocates SIZE in the context (after taking `--retains` references to a primary
/// context), reads mem_free, ends the context as `--end` says WITHOUT freeing the allocation
/// (the driver frees what a context owned), makes a context again and reads mem_free in it.
/// Prints the result (or where setup failed; `destroy_result` is the `--end` call's), then
/// keeps the process alive until stdin reaches EOF (like `hold`), so a test can look at the
/// card and the ledger while the process lives.
fn context_cycle<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let path = args.alloc_path()?;
    let end = ContextEnd::from_args(args)?;
    let retains: usize = args.get("retains", 1)?;
    if retains == 0 {
        return Err(Usage("--retains must be at least 1".into()));
    }
    if retains > 1 && crate::ContextMode::current() != crate::ContextMode::Primary {
        return Err(Usage(
            "--retains counts primary-context references: it needs primary contexts".into(),
        ));
    }
    let late_releases: usize = args.get("release-after", 0)?;
    if late_releases > 0 && end != ContextEnd::Reset {
        return Err(Usage(
            "--release-after releases references a reset kept: it needs --end reset".into(),
        ));
    }
    let line = match setup(gpu) {
        Err(e) => e,
        Ok(dev) => match (1..retains).try_for_each(|_| gpu.retain_primary(dev)) {
            Err(f) => setup_failed(gpu, "retain", f),
            Ok(()) => {
                let a = gpu.alloc(path, size);
                let free_held = mem_free_now(gpu);
                let ended = match end {
                    ContextEnd::Reset => gpu.reset_primary(dev),
                    ContextEnd::Release | ContextEnd::Destroy => gpu.destroy_context(dev),
                };
                let again = gpu.context(dev);
                let free_again = again.ok().and_then(|_| mem_free_now(gpu));
                // References from before the reset, released after the context was made anew.
                let released: Vec<Res<()>> = (0..late_releases)
                    .map(|_| gpu.release_primary(dev))
                    .collect();
                json!({
                    "late_releases": released.iter().map(|r| res_name(gpu, r)).collect::<Vec<_>>(),
                    "mem_free_after_releases": again.ok().and_then(|_| mem_free_now(gpu)),
                    "size": size,
                    "path": path.name(),
                    "end": end.name(),
                    "retains": retains,
                    "result": res_name(gpu, &a),
                    "mem_free_held": free_held,
                    "destroy_result": res_name(gpu, &ended),
                    "context_result": res_name(gpu, &again),
                    "mem_free": free_again,
                })
            }
        },
    };
    print_and_hold(gpu, "context-cycle", line)
}

/// Allocates SIZE from a new pool and destroys the pool with the allocation outstanding,
/// until an allocation fails or `--max` succeeded; then frees every allocation. Prints the
/// result, then keeps the process alive until stdin reaches EOF (like `hold`).
fn pool_destroy_held<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let max: usize = args.get("max", 1_000_000)?;
    let line = match setup(gpu) {
        Err(e) => e,
        Ok(_) => {
            let mut held = Vec::new();
            let mut destroys = Vec::new();
            let mut failure = None;
            while held.len() < max {
                match gpu.alloc(AllocPath::Pool, size) {
                    Ok(a) => {
                        destroys.push(gpu.pool_destroy(a.handle));
                        held.push(a);
                    }
                    Err(f) => {
                        failure = Some(f);
                        break;
                    }
                }
            }
            let free_at_oom = mem_free_now(gpu);
            let frees: Vec<Res<()>> = held.iter().map(|a| gpu.free_async(a.ptr)).collect();
            json!({
                "size": size,
                "count": held.len(),
                "error": failure.map(|f| fail_name(gpu, f)),
                "destroy_results": tally(gpu, &destroys),
                "mem_free_at_oom": free_at_oom,
                "free_results": tally(gpu, &frees),
                "mem_free_after": mem_free_now(gpu),
            })
        }
    };
    print_and_hold(gpu, "pool-destroy-held", line)
}

/// CUDA graph memory: a captured graph allocating `--allocs` x SIZE (`cuMemAllocAsync`s +
/// kernel + `cuMemFreeAsync`s on a created stream) is instantiated, uploaded (`--upload true`), launched and synchronised; then CHUNK-sized `cuMemAlloc`s (`--chunk`, default 100 MiB) until out of
/// memory (at most `--max`). Prints its line, then holds everything (graph, exec,
/// allocations) until stdin reaches EOF.
fn graph_memory<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let size = args.size_at(0, "SIZE")?;
    let chunk = match args.options.get("chunk") {
        None => 100 << 20,
        Some(text) => {
            crate::parse_size(text).map_err(|e| Usage(format!("--chunk {text:?}: {e}")))?
        }
    };
    let max: usize = args.get("max", 1_000_000)?;
    let upload: bool = args.get("upload", false)?;
    let allocs: usize = args.get("allocs", 1)?;
    let line = match setup(gpu) {
        Err(e) => e,
        Ok(_) => {
            let prepared = gpu
                .load_kernel()
                .map_err(|f| ("load_kernel", f))
                .and_then(|k| gpu.stream(true).map(|s| (k, s)).map_err(|f| ("stream", f)));
            match prepared {
                Err((step, f)) => setup_failed(gpu, step, f),
                Ok((func, stream)) => {
                    match gpu.graph_with_memory(size, allocs, func, stream, upload)? {
                        Err(f) => setup_failed(gpu, "graph", f),
                        Ok((_graph, _exec, launched)) => {
                            let free_after_launch = mem_free_now(gpu);
                            let (held, failure) =
                                alloc_until_failure(gpu, AllocPath::Alloc, chunk, max);
                            // `held` is never freed: the test compares the region with the
                            // card while this process holds it all, then closes stdin.
                            json!({
                                "size": size,
                                "allocs": allocs,
                                "chunk": chunk,
                                "upload": upload,
                                "launch_result": res_name(gpu, &launched),
                                "mem_free_after_launch": free_after_launch,
                                "count": held.len(),
                                "error": failure.map(|f| fail_name(gpu, f)),
                                "mem_free_at_oom": mem_free_now(gpu),
                            })
                        }
                    }
                }
            }
        }
    };
    print_and_hold(gpu, "graph-memory", line)
}

fn launch<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let kernels: usize = args.get("kernels", 1)?;
    let ns: u64 = args.get("ns-per-wave", 1000)?;
    let grid: u32 = args.get("grid", 1)?;
    let block: u32 = args.get("block", 1024)?;
    let duration: f64 = args.get("duration-s", 0.0)?;
    let created = match args.options.get("stream").map(String::as_str) {
        None | Some("default") => false,
        Some("created") => true,
        Some(other) => return Err(Usage(format!("unknown --stream {other}"))),
    };
    let path = match args.options.get("path") {
        None => LaunchPath::Kernel,
        Some(p) => LaunchPath::parse(p).ok_or_else(|| Usage(format!("unknown --path {p}")))?,
    };
    // Capture needs a stream of its own (the legacy stream cannot capture).
    let created = created || path == LaunchPath::Capture;
    if let Err(e) = setup(gpu) {
        return Ok(e);
    }
    let prepared = gpu
        .load_kernel()
        .map_err(|f| ("load_kernel", f))
        .and_then(|k| {
            gpu.stream(created)
                .map(|s| (k, s))
                .map_err(|f| ("stream", f))
        });
    let (func, stream) = match prepared {
        Ok(v) => v,
        Err((step, f)) => return Ok(setup_failed(gpu, step, f)),
    };
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(duration.max(0.0));
    let mut results = Vec::new();
    let mut syncs = Vec::new();
    loop {
        let batch = gpu.launch(path, func, grid, block, stream, ns, kernels);
        let failed = batch.iter().any(|r| r.is_err());
        results.extend(batch);
        syncs.push(gpu.stream_synchronize(stream));
        if failed || start.elapsed() >= deadline {
            break;
        }
    }
    let elapsed = start.elapsed();
    Ok(json!({
        "path": path.name(),
        "stream": if created { "created" } else { "default" },
        "grid": grid,
        "block": block,
        "ns_per_wave": ns,
        "launches": results.len(),
        "ok": results.iter().filter(|r| r.is_ok()).count(),
        "codes": tally(gpu, &results),
        "sync": tally(gpu, &syncs),
        "elapsed_ns": elapsed.as_nanos() as u64,
        "capture_ns": crate::CAPTURE_NS.load(std::sync::atomic::Ordering::Relaxed),
    }))
}

/// Many threads of one process allocating and freeing at once (each with the process's
/// context current: `Gpu::context` per thread), to catch races in whatever sits between
/// client and driver.
fn threads<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let n: usize = args.get("threads", 16)?;
    let iterations: usize = args.get("iterations", 50)?;
    let size = option_size(args, "size", 2 << 20)?;
    let paths = args.alloc_paths()?;
    let hold = Duration::from_micros(args.get("hold-us", 0)?);
    let keep_alive: bool = args.get("keep-alive", false)?;
    if let Err(e) = setup(gpu) {
        if keep_alive {
            print_and_hold(gpu, "threads", e);
        }
        return Ok(e);
    }
    let free_before = mem_free_now(gpu);
    type ThreadResults = (Vec<Res<()>>, Vec<Res<()>>);
    let per_thread: Vec<ThreadResults> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let path = paths[t % paths.len()];
                scope.spawn(move || {
                    let (mut allocs, mut frees) = (Vec::new(), Vec::new());
                    if let Err(f) = gpu.context(0) {
                        allocs.push(Err(f));
                        return (allocs, frees);
                    }
                    for _ in 0..iterations {
                        match gpu.alloc(path, size) {
                            Ok(a) => {
                                allocs.push(Ok(()));
                                if !hold.is_zero() {
                                    std::thread::sleep(hold);
                                }
                                frees.push(gpu.free(&a));
                            }
                            Err(f) => allocs.push(Err(f)),
                        }
                    }
                    (allocs, frees)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread panicked"))
            .collect()
    });
    let allocs: Vec<Res<()>> = per_thread.iter().flat_map(|t| t.0.clone()).collect();
    let frees: Vec<Res<()>> = per_thread.iter().flat_map(|t| t.1.clone()).collect();
    let line = json!({
        "threads": n,
        "iterations": iterations,
        "size": size,
        "path": paths.iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
        "alloc_results": tally(gpu, &allocs),
        "free_results": tally(gpu, &frees),
        "mem_free_before": free_before,
        "mem_free_after": mem_free_now(gpu),
    });
    if keep_alive {
        print_and_hold(gpu, "threads", line);
    }
    Ok(line)
}

/// What one `vmm-reuse` thread saw: results per call.
#[derive(Default)]
struct VmmTally {
    create: Vec<Res<()>>,
    map: Vec<Res<()>>,
    other: Vec<(&'static str, Res<()>)>,
    no_range: usize,
}

/// `vmm-reuse` (see the usage text): many threads mapping and unmapping VMM memory in
/// address ranges that pass from one thread to another while the first one's unmap (or
/// address free) is still on its way back through whatever sits between client and driver.
fn vmm_reuse<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    let n: usize = args.get("threads", 16)?;
    let iterations: usize = args.get("iterations", 200)?;
    let slots: usize = args.get("slots", (n / 2).max(1))?;
    let churn: bool = args.get("churn", false)?;
    let hold = Duration::from_micros(args.get("hold-us", 0)?);
    let size = match args.options.get("size") {
        None => 60 << 20,
        Some(s) => crate::parse_size(s).map_err(|e| Usage(format!("--size: {e}")))?,
    };
    if n == 0 || slots == 0 || size == 0 {
        return Err(Usage(
            "vmm-reuse: threads, slots and size must be > 0".into(),
        ));
    }
    if let Err(e) = setup(gpu) {
        print_and_hold(gpu, "vmm-reuse", e);
    }
    let base = if churn {
        0
    } else {
        match gpu.vmm(VmmOp::Reserve { size: size * slots }) {
            Ok(p) => p,
            Err(f) => {
                let e = setup_failed(gpu, "cuMemAddressReserve", f);
                print_and_hold(gpu, "vmm-reuse", e)
            }
        }
    };
    let free_before = mem_free_now(gpu);
    let call = |op: VmmOp| gpu.vmm(op).map(|_| ());
    let one_thread = |t: usize| -> VmmTally {
        let mut tally = VmmTally::default();
        if let Err(f) = gpu.context(0) {
            tally.other.push(("context", Err(f)));
            return tally;
        }
        for i in 0..iterations {
            let handle = match gpu.vmm(VmmOp::Create { size }) {
                Ok(h) => {
                    tally.create.push(Ok(()));
                    h
                }
                Err(f) => {
                    tally.create.push(Err(f));
                    std::thread::yield_now();
                    continue;
                }
            };
            let mut place = None;
            if churn {
                match gpu.vmm(VmmOp::Reserve { size }) {
                    Ok(ptr) => {
                        let r = call(VmmOp::Map { ptr, size, handle });
                        tally.map.push(r);
                        if r.is_ok() {
                            place = Some(ptr);
                        } else {
                            let freed = call(VmmOp::AddressFree { ptr, size });
                            tally.other.push(("address_free", freed));
                        }
                    }
                    Err(f) => tally.other.push(("reserve", Err(f))),
                }
            } else {
                // The first free range from a per-thread starting point: a taken range
                // answers ALREADY_MAPPED; one whose unmap just returned in the driver is free.
                for k in 0..slots {
                    let ptr = base + (((t + i + k) % slots) * size) as u64;
                    let r = call(VmmOp::Map { ptr, size, handle });
                    tally.map.push(r);
                    if r.is_ok() {
                        place = Some(ptr);
                        break;
                    }
                }
            }
            let Some(ptr) = place else {
                tally.no_range += 1;
                tally
                    .other
                    .push(("release", call(VmmOp::Release { handle })));
                continue;
            };
            tally
                .other
                .push(("set_access", call(VmmOp::SetAccess { ptr, size })));
            // The mapping keeps the memory; it goes back to the card at the unmap.
            tally
                .other
                .push(("release", call(VmmOp::Release { handle })));
            if !hold.is_zero() {
                std::thread::sleep(hold);
            }
            tally
                .other
                .push(("unmap", call(VmmOp::Unmap { ptr, size })));
            if churn {
                tally
                    .other
                    .push(("address_free", call(VmmOp::AddressFree { ptr, size })));
            }
        }
        tally
    };
    let tallies: Vec<VmmTally> = std::thread::scope(|scope| {
        let one_thread = &one_thread;
        let handles: Vec<_> = (0..n).map(|t| scope.spawn(move || one_thread(t))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread panicked"))
            .collect()
    });
    let creates: Vec<Res<()>> = tallies.iter().flat_map(|t| t.create.clone()).collect();
    let maps: Vec<Res<()>> = tallies.iter().flat_map(|t| t.map.clone()).collect();
    let mut line = json!({
        "threads": n,
        "iterations": iterations,
        "size": size,
        "slots": if churn { 0 } else { slots },
        "churn": churn,
        "create_results": tally(gpu, &creates),
        "map_results": tally(gpu, &maps),
        "no_range": tallies.iter().map(|t| t.no_range).sum::<usize>(),
        "mem_free_before": free_before,
        "mem_free_after": mem_free_now(gpu),
    });
    for name in [
        "context",
        "reserve",
        "set_access",
        "release",
        "unmap",
        "address_free",
    ] {
        let results: Vec<Res<()>> = tallies
            .iter()
            .flat_map(|t| t.other.iter().filter(|(n, _)| *n == name).map(|(_, r)| *r))
            .collect();
        if !results.is_empty() {
            line[format!("{name}_results")] = Value::Object(tally(gpu, &results));
        }
    }
    print_and_hold(gpu, "vmm-reuse", line)
}

fn option_size(args: &Args, name: &str, default: usize) -> Result<usize, Usage> {
    match args.options.get(name) {
        None => Ok(default),
        Some(s) => crate::parse_size(s).map_err(|e| Usage(format!("--{name}: {e}"))),
    }
}

/// Allocation churn until stdin closes (or the process is killed, which is the point):
/// `--threads N` threads allocate and free `--size` on `--path` in a loop; `--fork N` then
/// forks N children while they run, which never call CUDA and wait until killed, as
/// DataLoader and `multiprocessing` fork workers do. Prints one line once all that runs:
/// the pid and the children's pids. On EOF: stops the threads, kills the children, prints
/// the alloc/free tallies.
fn churn<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let n: usize = args.get("threads", 4)?;
    let forks: usize = args.get("fork", 0)?;
    let size = option_size(args, "size", 2 << 20)?;
    let paths = args.alloc_paths()?;
    if let Err(mut e) = setup(gpu) {
        e["pid"] = json!(std::process::id());
        return Ok(e);
    }
    let stop = AtomicBool::new(false);
    let (granted, refused, failed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let started = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..n {
            let path = paths[t % paths.len()];
            let (stop, granted, refused, failed, started) =
                (&stop, &granted, &refused, &failed, &started);
            scope.spawn(move || {
                let ok = gpu.context(0).is_ok();
                started.fetch_add(1, Ordering::SeqCst);
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                while !stop.load(Ordering::Relaxed) {
                    match gpu.alloc(path, size) {
                        Ok(a) => {
                            granted.fetch_add(1, Ordering::Relaxed);
                            if gpu.free(&a).is_err() {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(Fail::Cu(code))
                            if gpu.code_name(code) == "CUDA_ERROR_OUT_OF_MEMORY" =>
                        {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        while started.load(Ordering::SeqCst) < n as u64 {
            std::thread::yield_now();
        }
        let mut children = Vec::new();
        for _ in 0..forks {
            // SAFETY: the forked child of this multi-threaded process only calls pause(2),
            // which is async-signal-safe, until it is killed.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                loop {
                    // SAFETY: pause only waits for a signal.
                    unsafe { libc::pause() };
                }
            }
            children.push(pid);
        }
        println!(
            "{}",
            json!({"scenario": "churn", "client": gpu.client(), "pid": std::process::id(), "children": children})
        );
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        stop.store(true, Ordering::Relaxed);
        for child in children {
            // SAFETY: signalling and reaping our own children.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, std::ptr::null_mut(), 0);
            }
        }
    });
    Ok(json!({
        "granted": granted.load(Ordering::Relaxed),
        "refused": refused.load(Ordering::Relaxed),
        "failed": failed.load(Ordering::Relaxed),
    }))
}

/// A process that keeps looking at the slice: prints `mem_free` once set up, then, on each
/// stdin line `FREE`, polls `cuMemGetInfo` until it reports at least FREE bytes free (at most
/// `--max-ms`, default 30000) and prints `{"free", "waited_ms", "polls"}`; ends on EOF.
fn watch_free<G: Gpu>(gpu: &G, args: &Args) -> Result<Value, Usage> {
    use std::io::BufRead;
    let max = Duration::from_millis(args.get("max-ms", 30_000)?);
    if let Err(mut e) = setup(gpu) {
        e["pid"] = json!(std::process::id());
        return Ok(e);
    }
    println!(
        "{}",
        json!({"scenario": "watch-free", "client": gpu.client(), "pid": std::process::id(), "mem_free": mem_free_now(gpu)})
    );
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(wanted) = line.trim().parse::<usize>() else {
            continue;
        };
        let started = Instant::now();
        let mut polls = 0u64;
        let free = loop {
            polls += 1;
            let free = mem_free_now(gpu).unwrap_or(0);
            if free >= wanted || started.elapsed() >= max {
                break free;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        println!(
            "{}",
            json!({"free": free, "waited_ms": started.elapsed().as_millis() as u64, "polls": polls})
        );
    }
    std::process::exit(0);
}

fn errors<G: Gpu>(gpu: &G) -> Value {
    let checks: Map<String, Value> = gpu
        .errors()
        .into_iter()
        .map(|(name, r)| (name.to_string(), json!(res_name(gpu, &r))))
        .collect();
    json!({"checks": checks})
}
