//! The memory slice: a hard per-device cap for all processes of a container together, kept
//! in the shared region (`gpuslice_common::region`), and the numbers every view reports.
//!
//! Parts:
//! * [`arrays`]: what an array or mipmapped array of a descriptor costs;
//! * [`ledger`]: sizes as the device spends them and reserve-before-allocate against the
//!   region (pure, unit-tested with a counter budget);
//! * [`objects`]: the sharded per-process table object -> (device, bytes, owning context);
//! * [`pools`], [`vmm`]: when pool and VMM memory really returns to the card;
//! * [`graphs`]: CUDA graph memory, charged as the device's graph pool really holds it;
//! * [`released`]: when a dead process's memory has really gone back to the card;
//! * [`context_start`]: what a new context reserves, the slice's measuring lock, and the
//!   line that says why a context was refused;
//! * [`driver_sized`]: what the paths whose size the driver decides (pools, VMM, contexts)
//!   charge; what the driver places by itself (the stack, printf FIFO and heap limits, module
//!   data, local memory), priced before the call that places it; and which NVML process
//!   entries are the slice's;
//! * [`report`]: the slice's view of memory numbers (pure);
//! * [`sweep`]: when this process asks the slice to look for its dead processes;
//! * [`oversubscribe`]: opt-in oversubscription, the bytes past the physical share placed in
//!   the container's host memory;
//! * this file: the memory policy's process-wide state and the seam the plain allocation
//!   handlers in `hooks::memory` call (`allocate`, over `before_alloc` and `after_alloc`;
//!   `on_free`).
//!
//! Owns: `SHARED` (the device bindings and the measured context costs over the session's
//! region mapping; survives fork, like the mapping), `PROCESS` (the ledger of this process's
//! slot; per process, a fork child has none until it attaches again), `OVERSIZE_WARNED` (a
//! once-per-device warning; survives fork: a child need not warn again). The region mapping,
//! the slot and the host PID are the session's (`crate::session`).
//!
//! Lifecycle: `attach` runs once per process from `lifecycle`'s lazy init (and again in a forked
//! child): the session opens (or creates) the region — a region that cannot be opened makes
//! the shim fail closed, like an invalid limit file — and registers this process in a slot.
//! Devices are bound lazily, by UUID, the first time a hook touches them
//! (`Region::bind_devices`); a device without a memory limit is pass-through and never charged.
//!
//! Context cost: the shim cannot know what a context costs on the device before one exists.
//! Before the first context of the process on a device it reserves what a process of the
//! slice already measured there (the region's per-device `context_cost`, the largest figure
//! seen), or, when none has, an upper bound (`GPUSLICE_CONTEXT_OVERHEAD`, default
//! [`DEFAULT_CONTEXT_BOUND`]) up to the slice's room. Right after, it reads its own entry in
//! NVML's process list (see `session::host_pid`), settles the charge to that measured figure
//! (undoing the context when the real cost does not fit) and publishes it; later contexts of
//! the process use it. Processes of the slice take that step one at a time
//! ([`context_start`]), so simultaneous starts neither refuse each other nor mistake each
//! other's NVML entries. Where NVML cannot tell, a measured figure stays charged, the bound
//! is charged whole.

pub mod arrays;
mod context_start;
pub mod driver_sized;
pub mod graphs;
pub mod ledger;
pub mod objects;
pub mod oversubscribe;
pub mod pools;
mod released;
pub mod report;
pub mod sweep;
mod vmm;

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use gpuslice_abi::cuda::result::{
    CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use gpuslice_abi::cuda::{
    CUarray, CUcontext, CUdevice, CUdeviceptr, CUmemGenericAllocationHandle, CUmipmappedArray,
    CUresult,
};
use gpuslice_abi::nvml::nvmlDevice_t;
use gpuslice_common::config::SliceConfig;
use gpuslice_common::region::{DeviceId, DeviceLimits, Region, SlotId, MAX_DEVICES};

use crate::session::fork::per_process;

use ledger::{charge_size, Budget, Ledger, OutOfMemory};
use objects::{Charged, ObjectKind};

/// Env variable: upper bound reserved for a context before its real cost is measured.
pub const CONTEXT_BOUND_ENV: &str = "GPUSLICE_CONTEXT_OVERHEAD";
/// Default of [`CONTEXT_BOUND_ENV`]: above what current drivers spend per context
/// (~300-500 MiB) so the first context never under-reserves.
pub const DEFAULT_CONTEXT_BOUND: u64 = 512 << 20;

/// Where an allocation lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocTarget {
    /// The device of the calling thread's current context.
    CurrentContext,
    /// An explicit device (context creation, `cuMemCreate` location).
    Device(CUdevice),
}

/// An object that holds device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceObject {
    Pointer(CUdeviceptr),
    Handle(CUmemGenericAllocationHandle),
    Array(CUarray),
    MipmappedArray(CUmipmappedArray),
    Context(CUcontext),
    /// A primary context, identified by its device (retain/release/reset are by device).
    PrimaryContext(CUdevice),
}

/// A reservation taken before the driver allocates; consumed by `after_alloc`.
#[derive(Debug)]
#[must_use]
pub struct Reservation {
    /// (device entry, bytes) reserved; `None` = nothing to account (pass-through).
    charge: Option<(u8, u64)>,
    /// The context that will own the object.
    context: u64,
}

impl Reservation {
    const NONE: Reservation = Reservation {
        charge: None,
        context: 0,
    };
}

/// The region as the ledger's budget: this process's slot.
pub struct RegionBudget {
    region: &'static Region,
    slot: SlotId,
}

fn device_id(device: u8) -> DeviceId {
    DeviceId::from_index(device as usize).expect("device entries come from the region")
}

impl Budget for RegionBudget {
    #[inline]
    fn reserve(&self, device: u8, bytes: u64) -> Result<(), OutOfMemory> {
        self.region
            .reserve(self.slot, device_id(device), bytes)
            .map_err(|_| OutOfMemory)
    }
    #[inline]
    fn release(&self, device: u8, bytes: u64) {
        self.region.release(self.slot, device_id(device), bytes);
    }
    fn reserve_past_limit(&self, device: u8, bytes: u64) {
        self.region
            .reserve_past_limit(self.slot, device_id(device), bytes);
    }
    fn reap_dead(&self) {
        // A dead process's budget returns only once the driver has freed its memory.
        if let Some(shared) = shared() {
            sweep::now(shared);
        }
    }
}

/// How a device is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Unlimited,
    Limited(u8),
}

const BINDING_UNKNOWN: u32 = 0;
const BINDING_UNLIMITED: u32 = 1;
const BINDING_BASE: u32 = 2;
/// CUDA device ordinals cached (higher ordinals are resolved on every call).
const CACHED_ORDINALS: usize = 64;
const CACHED_NVML_HANDLES: usize = 64;

fn encode(binding: Binding) -> u32 {
    match binding {
        Binding::Unlimited => BINDING_UNLIMITED,
        Binding::Limited(d) => BINDING_BASE + u32::from(d),
    }
}

fn decode(word: u32) -> Option<Binding> {
    match word {
        BINDING_UNKNOWN => None,
        BINDING_UNLIMITED => Some(Binding::Unlimited),
        d => Some(Binding::Limited((d - BINDING_BASE) as u8)),
    }
}

/// Process-wide state that survives fork (over the session's region mapping, which must be
/// the same object in the child, which re-registers through it).
pub struct Shared {
    region: &'static Region,
    config: SliceConfig,
    cuda_bindings: [AtomicU32; CACHED_ORDINALS],
    nvml_handles: [AtomicUsize; CACHED_NVML_HANDLES],
    nvml_bindings: [AtomicU32; CACHED_NVML_HANDLES],
    context_bound: u64,
    /// Measured per-context cost per device entry (0 = not measured yet).
    context_cost: [AtomicU64; MAX_DEVICES],
}

/// Per-process state; replaced in a forked child.
pub struct Process {
    pub ledger: Ledger<RegionBudget>,
    /// The session's slot (`session::slice`), kept beside the ledger that charges it.
    pub slot: SlotId,
}

impl Process {
    /// Applies what a re-read of memory the driver sizes itself (a pool, a device's graph
    /// pool) says: a shrink is refunded; a growth is charged even past the cap, since the
    /// driver holds it already and a later shrink must never refund bytes that were not
    /// charged (the slice then refuses allocations until it shrinks). `past_cap` writes the
    /// one line saying what grew by how many bytes.
    pub fn settle(&self, settle: pools::Settle, past_cap: impl FnOnce(u64)) {
        match settle {
            pools::Settle::Unchanged => {}
            pools::Settle::Shrink { device, bytes } => self.ledger.refund(device, bytes),
            pools::Settle::Grow { device, bytes } => {
                if !self.ledger.charge_held(device, bytes) {
                    past_cap(bytes);
                }
            }
        }
    }
}

/// Survives fork (see [`Shared`]).
static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
per_process! {
    /// This process's ledger; a fork child has none until `attach` runs again (the parent's
    /// objects, pools and contexts are not the child's; its leaked `Process` is abandoned).
    static PROCESS: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());
}

#[inline]
pub fn shared() -> Option<&'static Shared> {
    // SAFETY: SHARED holds null or a leaked, never freed Box published with Release.
    unsafe { SHARED.load(Ordering::Acquire).as_ref() }
}

#[inline]
pub fn process() -> Option<&'static Process> {
    // SAFETY: PROCESS holds null or a leaked, never freed Box published with Release.
    unsafe { PROCESS.load(Ordering::Acquire).as_ref() }
}

/// The context bound: [`CONTEXT_BOUND_ENV`] where no limit file is anchored. Under an anchored
/// file it is ignored (with a warning): a tenant that set it small would make the slice's
/// first context under-reserve, i.e. change what is enforced.
fn context_bound_from_env() -> u64 {
    if crate::session::mode::anchored() {
        if let Ok(text) = std::env::var(CONTEXT_BOUND_ENV) {
            if !text.trim().is_empty() {
                crate::log_warn!(
                    "{CONTEXT_BOUND_ENV}={:?} is ignored: the limit file {} exists and nothing in the environment overrides it",
                    gpuslice_common::text::shorten(&text, 64),
                    gpuslice_common::config::DEFAULT_CONFIG_PATH
                );
            }
        }
        return DEFAULT_CONTEXT_BOUND;
    }
    match std::env::var(CONTEXT_BOUND_ENV) {
        Ok(text) if !text.trim().is_empty() => {
            match gpuslice_common::size::parse_size(text.trim()) {
                Ok(bytes) if bytes > 0 => bytes,
                _ => {
                    crate::log_error!(
                        "{CONTEXT_BOUND_ENV}={:?} is not a size; using {DEFAULT_CONTEXT_BOUND} bytes",
                        gpuslice_common::text::shorten(&text, 64)
                    );
                    DEFAULT_CONTEXT_BOUND
                }
            }
        }
        _ => DEFAULT_CONTEXT_BOUND,
    }
}

/// Attaches this process to its slice (called by `lifecycle` once per process, and again in a
/// forked child): the session maps the region and registers this process in a slot, then this
/// process's ledger is built over it. `Err` is the one line the shim prints before failing
/// closed.
pub fn attach(config: &SliceConfig) -> Result<(), String> {
    let region = crate::session::slice::open(config)?;
    oversubscribe::configure(config);
    let shared = match shared() {
        Some(existing) if std::ptr::eq(existing.region, region) => existing,
        _ => {
            let fresh: &'static Shared = Box::leak(Box::new(Shared {
                region,
                config: config.clone(),
                cuda_bindings: std::array::from_fn(|_| AtomicU32::new(BINDING_UNKNOWN)),
                nvml_handles: std::array::from_fn(|_| AtomicUsize::new(0)),
                nvml_bindings: std::array::from_fn(|_| AtomicU32::new(BINDING_UNKNOWN)),
                context_bound: context_bound_from_env(),
                context_cost: std::array::from_fn(|_| AtomicU64::new(0)),
            }));
            SHARED.store(fresh as *const Shared as *mut Shared, Ordering::Release);
            fresh
        }
    };
    // A full region offers its dead slots to the driver's word before refusing.
    let (slot, identity) = crate::session::slice::register(region, |dead| {
        driver_sized::driver_released(shared, dead)
    })?;
    // Slots of processes that exited (or were killed) are not looked at here: a start costs
    // the same whatever the slice's history. Those holding bytes are the sweep's (this
    // process's first view needs one that began after now: `sweep`); those holding nothing
    // are freed when the region is full (`register` above).
    sweep::started();
    let process: &'static Process = Box::leak(Box::new(Process {
        ledger: Ledger::new(RegionBudget { region, slot }),
        slot,
    }));
    PROCESS.store(process as *const Process as *mut Process, Ordering::Release);
    crate::log_debug!(
        "registered pid {} in slot {} of {}",
        identity.pid,
        slot.index(),
        region.path().display()
    );
    Ok(())
}

/// The memory limit and region entry of a CUDA device (resolved once, then cached). `Err` is
/// the code the caller answers instead of calling the driver: `CUDA_ERROR_OUT_OF_MEMORY` when
/// the slice cannot be bound, or the driver's own refusal to name the device.
#[inline]
pub fn cuda_binding(shared: &Shared, ordinal: CUdevice) -> Result<Binding, CUresult> {
    let cell = usize::try_from(ordinal)
        .ok()
        .and_then(|i| shared.cuda_bindings.get(i));
    if let Some(binding) = cell.and_then(|c| decode(c.load(Ordering::Acquire))) {
        return Ok(binding);
    }
    bind_cuda(shared, ordinal)
}

/// First sight of a CUDA device ordinal (or one past the cache): resolve and cache it.
#[cold]
#[inline(never)]
fn bind_cuda(shared: &Shared, ordinal: CUdevice) -> Result<Binding, CUresult> {
    let cell = usize::try_from(ordinal)
        .ok()
        .and_then(|i| shared.cuda_bindings.get(i));
    let uuid = match crate::ground::devices::try_cuda_device_uuid(ordinal) {
        Ok(uuid) => uuid,
        // Before cuInit (or for a device that does not exist) the driver refuses every call
        // naming the device: so do we, binding and caching nothing. Matching the device by
        // index here instead would cache "unlimited" for a UUID-keyed slice, or give an
        // index-keyed one a second budget for the same card.
        Err(
            code @ (CUDA_ERROR_NOT_INITIALIZED
            | CUDA_ERROR_DEINITIALIZED
            | CUDA_ERROR_INVALID_DEVICE),
        ) => return Err(code),
        // A driver without device UUIDs: match by index only.
        Err(_) => String::new(),
    };
    let binding = bind(shared, ordinal.max(0) as u32, &uuid, || {
        card_total_for_warning(ordinal)
    })
    .map_err(|()| CUDA_ERROR_OUT_OF_MEMORY)?;
    if let Some(cell) = cell {
        cell.store(encode(binding), Ordering::Release);
    }
    Ok(binding)
}

fn card_total_for_warning(ordinal: CUdevice) -> Option<u64> {
    let total_mem = crate::ground::driver::real::cuDeviceTotalMem_v2()?;
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer for the call.
    (unsafe { total_mem(&mut bytes, ordinal) } == CUDA_SUCCESS).then_some(bytes as u64)
}

/// Device entries whose oversize limit was already reported by this process (bit = entry).
/// Survives fork: a child need not repeat the warning.
static OVERSIZE_WARNED: AtomicU32 = AtomicU32::new(0);

/// Binds `(index, uuid)` in the region when the configuration limits its memory.
fn bind(
    shared: &Shared,
    index: u32,
    uuid: &str,
    card_total: impl FnOnce() -> Option<u64>,
) -> Result<Binding, ()> {
    let Some(limit) = shared.config.limit_for(index, uuid) else {
        return Ok(Binding::Unlimited);
    };
    let Some(memory_limit) = limit.memory_limit else {
        return Ok(Binding::Unlimited);
    };
    let key = if uuid.is_empty() {
        format!("index-{index}")
    } else {
        uuid.to_string()
    };
    let binding = shared.region.bind_devices(&[DeviceLimits {
        uuid: key.clone(),
        memory_limit: Some(memory_limit),
        compute_percent: limit.compute_percent,
    }]);
    match binding {
        Ok(binding) => {
            for change in &binding.changes {
                crate::log_info!("limits of {} changed: {change:?}", change.uuid);
            }
            let entry = binding.ids[0].index();
            oversubscribe::bind(shared, &key, entry as u8, limit.host_excess());
            if let Some(total) = card_total() {
                // Once per device entry and process (bindings are cached, but two threads
                // may bind the same device at once, and CUDA and NVML bind separately).
                let bit = 1u32 << (entry % 32);
                if memory_limit > total
                    && OVERSIZE_WARNED.fetch_or(bit, Ordering::AcqRel) & bit == 0
                {
                    crate::log_warn!(
                        "memory limit {} of device {key} is larger than the card ({}); the slice is the whole card",
                        gpuslice_common::size::format_size(memory_limit),
                        gpuslice_common::size::format_size(total)
                    );
                }
            }
            Ok(Binding::Limited(entry as u8))
        }
        Err(e) => {
            crate::log_error!("{e}; allocations on device {key} are refused");
            Err(())
        }
    }
}

/// The limit and region entry of an NVML device handle (cached by handle address: NVML's
/// handles are stable for the life of the library).
fn nvml_binding(shared: &Shared, device: nvmlDevice_t) -> Result<Binding, ()> {
    let key = device as usize;
    for (i, handle) in shared.nvml_handles.iter().enumerate() {
        match handle.load(Ordering::Acquire) {
            0 => break,
            k if k == key => {
                if let Some(b) = decode(shared.nvml_bindings[i].load(Ordering::Acquire)) {
                    return Ok(b);
                }
            }
            _ => {}
        }
    }
    let (index, uuid) = crate::ground::devices::nvml_identity(device);
    let binding = bind(shared, index, &uuid, || None)?;
    for (i, handle) in shared.nvml_handles.iter().enumerate() {
        let claimed = handle.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire);
        if claimed.is_ok() || claimed == Err(key) {
            shared.nvml_bindings[i].store(encode(binding), Ordering::Release);
            break;
        }
    }
    Ok(binding)
}

/// The calling thread's current context (0 = none).
#[inline]
pub fn current_context() -> u64 {
    let Some(get_current) = crate::ground::driver::real::cuCtxGetCurrent() else {
        return 0;
    };
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer for the call.
    if unsafe { get_current(&mut context) } == CUDA_SUCCESS {
        context as u64
    } else {
        0
    }
}

/// Reserve, call the driver, commit or release: the shape every allocation path whose size
/// the caller decides shares. `created` names the object the driver made (read only after
/// success).
#[inline]
pub fn allocate(
    target: AllocTarget,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    created: impl FnOnce() -> DeviceObject,
) -> CUresult {
    let reservation = match before_alloc(target, bytes) {
        Ok(reservation) => reservation,
        Err(code) => return code,
    };
    let result = call();
    let object = if result == CUDA_SUCCESS {
        created()
    } else {
        DeviceObject::Pointer(0)
    };
    after_alloc(reservation, result, object);
    result
}

/// Reserve `bytes` (as the device spends them) on `target` before the driver allocates.
/// Past the cap: `Err(CUDA_ERROR_OUT_OF_MEMORY)` with nothing reserved.
#[inline]
pub fn before_alloc(target: AllocTarget, bytes: u64) -> Result<Reservation, CUresult> {
    let (Some(shared), Some(process)) = (shared(), process()) else {
        return Ok(Reservation::NONE);
    };
    let context = current_context();
    let ordinal = match target {
        AllocTarget::Device(d) => d,
        AllocTarget::CurrentContext => match device_of(process, context) {
            Some(d) => d,
            // No current context: the driver will refuse on its own.
            None => return Ok(Reservation::NONE),
        },
    };
    let device = match cuda_binding(shared, ordinal) {
        Ok(Binding::Unlimited) => return Ok(Reservation::NONE),
        Ok(Binding::Limited(device)) => device,
        Err(code) => return Err(code),
    };
    let bytes = charge_size(bytes);
    charge_or_refuse(process, device, bytes)?;
    Ok(Reservation {
        charge: Some((device, bytes)),
        context,
    })
}

/// The device ordinal of `context` (the calling thread's current one, 0 = none): remembered
/// per context (`ledger::ContextDevices`), else the driver's `cuCtxGetDevice`.
#[inline]
fn device_of(process: &Process, context: u64) -> Option<CUdevice> {
    if context == 0 {
        return None;
    }
    if let Some(ordinal) = process.ledger.contexts.get(context) {
        return Some(ordinal);
    }
    let ordinal = crate::ground::devices::current_cuda_device()?;
    process.ledger.contexts.remember(context, ordinal);
    Some(ordinal)
}

/// The device of the calling thread's current context, `None` without one (what the memory
/// queries report on).
#[inline]
pub fn current_device() -> Option<CUdevice> {
    match process() {
        Some(process) => device_of(process, current_context()),
        None => crate::ground::devices::current_cuda_device(),
    }
}

/// `Ledger::charge`, and before refusing, pools' cached memory the driver has already given
/// back is settled first (it may be what stands in the way).
#[inline]
pub fn charge_or_refuse(process: &Process, device: u8, bytes: u64) -> Result<(), CUresult> {
    if process.ledger.charge(device, bytes).is_ok() {
        return Ok(());
    }
    retry_or_refuse(process, device, bytes)
}

/// The cap refused `bytes`: what the driver may have given back is settled and the charge
/// tried again before the refusal is final. Out of line: the allocation path stays short.
#[cold]
#[inline(never)]
fn retry_or_refuse(process: &Process, device: u8, bytes: u64) -> Result<(), CUresult> {
    // Both re-read (no short circuit): either may have shrunk.
    let shrank = driver_sized::reread_pools(process) | graphs::reread_if_any(process);
    if shrank && process.ledger.charge(device, bytes).is_ok() {
        return Ok(());
    }
    crate::log_debug!("refusing {bytes} bytes on device entry {device}: slice limit reached");
    if let Some(shared) = shared() {
        // Kept in the region, so the node agent's counter survives this process.
        shared.region.count_refusal(device_id(device));
    }
    Err(CUDA_ERROR_OUT_OF_MEMORY)
}

/// Counts, in the region, that this process of the slice failed closed (for the node agent).
pub fn count_fail_closed() {
    if let Some(shared) = shared() {
        shared.region.count_fail_closed();
    }
}

/// Commit (`result == CUDA_SUCCESS`) or release the reservation.
#[inline]
pub fn after_alloc(reservation: Reservation, result: CUresult, object: DeviceObject) {
    let (Some(process), Some((device, bytes))) = (process(), reservation.charge) else {
        return;
    };
    if result != CUDA_SUCCESS {
        process.ledger.refund(device, bytes);
        return;
    }
    let charged = Charged {
        device,
        bytes,
        pool: 0,
        context: reservation.context,
    };
    match object {
        DeviceObject::Pointer(ptr) => process.ledger.track(ObjectKind::Pointer, ptr, charged),
        other => track_other(process, other, charged),
    }
}

/// `after_alloc` for the objects other than device pointers (out of line: the plain
/// allocation path stays short).
#[cold]
#[inline(never)]
fn track_other(process: &Process, object: DeviceObject, charged: Charged) {
    let Charged { device, bytes, .. } = charged;
    match object {
        DeviceObject::Pointer(ptr) => process.ledger.track(ObjectKind::Pointer, ptr, charged),
        DeviceObject::Array(a) => process.ledger.track(ObjectKind::Array, a as u64, charged),
        DeviceObject::MipmappedArray(a) => {
            process
                .ledger
                .track(ObjectKind::MipmappedArray, a as u64, charged)
        }
        DeviceObject::Handle(handle) => {
            let stale = ledger::lock(&process.ledger.vmm).created(handle, device, bytes);
            if let Some((d, b)) = stale {
                process.ledger.refund(d, b);
            }
        }
        DeviceObject::Context(ctx) => {
            process.ledger.track(
                ObjectKind::Context,
                ctx as u64,
                Charged {
                    context: 0,
                    ..charged
                },
            );
        }
        // Primary contexts are booked by `hooks::context::primary_ctx_retain`.
        DeviceObject::PrimaryContext(_) => process.ledger.refund(device, bytes),
    }
}

/// The driver freed `object` with `result`: give its charge back. Objects the ledger never
/// charged are ignored (the driver's result is returned unchanged by the wrapper either way).
#[inline]
pub fn on_free(object: DeviceObject, result: CUresult) {
    if result != CUDA_SUCCESS {
        return;
    }
    let Some(process) = process() else { return };
    // Whichever free path: the oldest entry under the address is the object freed (see
    // `objects`), a plain or a pool allocation alike.
    if let DeviceObject::Pointer(ptr) = object {
        if let Some(freed) = process.ledger.untrack(ObjectKind::Pointer, ptr) {
            if freed.pool != 0 {
                driver_sized::pool_pointer_freed(process, freed.pool);
            }
        }
        return;
    }
    free_other(process, object);
}

/// `on_free` for the objects other than device pointers (out of line).
#[cold]
#[inline(never)]
fn free_other(process: &Process, object: DeviceObject) {
    let ledger = &process.ledger;
    match object {
        DeviceObject::Pointer(_) => {}
        DeviceObject::Array(a) => {
            ledger.untrack(ObjectKind::Array, a as u64);
        }
        DeviceObject::MipmappedArray(a) => {
            ledger.untrack(ObjectKind::MipmappedArray, a as u64);
        }
        DeviceObject::Handle(handle) => {
            let freed = ledger::lock(&ledger.vmm).released(handle);
            if let Some((d, b)) = freed {
                ledger.refund(d, b);
            }
        }
        DeviceObject::Context(ctx) => driver_sized::context_gone(process, ctx as u64),
        DeviceObject::PrimaryContext(_) => {}
    }
}

/// (limit, container-wide use) of a CUDA device in the slice; `None` = not limited.
/// `card_free` reads the card's free bytes (called only for a limited device).
#[inline]
pub fn cuda_slice(device: CUdevice, card_free: impl FnOnce() -> u64) -> Option<(u64, u64)> {
    let shared = shared()?;
    match cuda_binding(shared, device) {
        Ok(Binding::Limited(d)) => usage_of(shared, d, Some((sweep::Source::Cuda, card_free()))),
        _ => None,
    }
}

/// [`cuda_slice`] for a decision rather than a view (no card reading): the pools and graph
/// memory re-read and a due sweep run, so a placement is judged on the figures a view shows.
pub fn cuda_slice_settled(device: CUdevice) -> Option<(u64, u64)> {
    let shared = shared()?;
    match cuda_binding(shared, device) {
        Ok(Binding::Limited(d)) => usage_of(shared, d, None),
        _ => None,
    }
}

/// The memory limit in force for a CUDA device in the slice (`Some(None)`: not limited);
/// `None` when this process has no slice ledger or the device cannot be bound (then the
/// configuration says).
#[inline]
pub fn cuda_limit(device: CUdevice) -> Option<Option<u64>> {
    match cuda_binding(shared()?, device) {
        Ok(Binding::Limited(d)) => Some(shared()?.region.usage(device_id(d)).limit),
        Ok(Binding::Unlimited) => Some(None),
        Err(_) => None,
    }
}

/// (limit, container-wide use) of an NVML device in the slice; `None` = not limited.
/// `card_free`: the card's free bytes as NVML reported them.
#[inline]
pub fn nvml_slice(device: nvmlDevice_t, card_free: u64) -> Option<(u64, u64)> {
    let shared = shared()?;
    match nvml_binding(shared, device) {
        Ok(Binding::Limited(d)) => usage_of(shared, d, Some((sweep::Source::Nvml, card_free))),
        _ => None,
    }
}

#[inline]
fn usage_of(
    shared: &Shared,
    device: u8,
    card_seen: Option<(sweep::Source, u64)>,
) -> Option<(u64, u64)> {
    if let Some(process) = process() {
        driver_sized::reread_pools_if_any(process);
        graphs::reread_if_any(process);
    }
    match card_seen {
        Some((source, card_free)) => sweep::card_seen(shared, source, device, card_free),
        None => sweep::if_due(shared),
    }
    let usage = shared.region.usage(device_id(device));
    Some((usage.limit.unwrap_or(u64::MAX), usage.used))
}
