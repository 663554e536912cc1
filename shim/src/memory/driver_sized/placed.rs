//! Memory the driver places by itself, priced before the call that makes it place it: the
//! per-thread stack and the kernels' local memory, the printf FIFO, the device-malloc heap,
//! and modules' and libraries' code and static data. Each is reserved in the slice (one
//! compare-and-swap of the region's total, as every allocation) BEFORE the driver call, and
//! refused with `CUDA_ERROR_OUT_OF_MEMORY`, the call not made, when it does not fit; after
//! the call it is settled to what the driver reports (a refund when it took less). A peer
//! never sees the bytes free between the price and the placement.
//!
//! The prices, per context (a real driver keeps each of these per context; sources in
//! `cuda-tests/README.md`, "Memory the driver takes on its own account"):
//! * **local memory**: one reservation of `per_thread x resident threads` (SMs x max threads
//!   per SM, `cuDeviceGetAttribute`), `per_thread` the larger of the stack limit and the
//!   largest local size of a kernel that may launch in the context (`CU_LIMIT_STACK_SIZE`:
//!   "the driver automatically increases the per-thread stack size for each kernel launch as
//!   needed"; `CU_CTX_LMEM_RESIZE_TO_MAX`, the only behaviour since CUDA 11: it is kept). The
//!   per-thread stack the context started with is inside its measured cost: only growth past
//!   it is charged, rounded up to 2 MiB. A kernel's local size
//!   (`cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)`) is priced when its handle is
//!   obtained (`cuModuleGetFunction`, `cuLibraryGetKernel`, `cuKernelGetFunction`), never at
//!   the launch: the launch fast path (`hooks::launch`) stays a few loads and a call, and a
//!   lookup under lazy loading is itself a placing call (it loads the kernel). A lookup whose
//!   growth does not fit is refused with OUT_OF_MEMORY, as the launch on a full card would be.
//!   A smaller stack limit refunds down to the largest looked-up need, which a later launch
//!   would grow the reservation back to;
//! * **printf FIFO, malloc heap**: the size set, past the size the context started with,
//!   rounded up to 2 MiB;
//! * **modules** (`cuModuleLoad*`): what the image says for the context's device
//!   (`image`), reserved at the load whatever `CUDA_MODULE_LOADING` says (a module's data is
//!   placed at its load; lazy loading defers only its kernels' code, to `cuModuleGetFunction`);
//!   the context's module bytes together past [`CONTEXT_MODULE_ARENA`], rounded up to 2 MiB,
//!   refunded at unload;
//! * **libraries** (`cuLibraryLoad*`, context-independent): reserved in the current context
//!   at the load (eager loading places them there then, lazy loading at their first use
//!   there), and in any other context before the first call that places them there
//!   (`cuLibraryGetKernel`, `cuKernelGetFunction`, `cuLibraryGetGlobal`, `cuLibraryGetModule`).
//!
//! What is charged for a context is refunded when it ends (`Ledger::context_destroyed`).
//! What this cannot know is model error within
//! `gpuslice_common::unpriced::UNPRICED_BOUND_BYTES`: whether a context's measured cost holds
//! its first module pages ([`CONTEXT_MODULE_ARENA`]), the driver's own rounding of what it
//! places. Not priced at all, and so the node agent's business past that bound: images a
//! CUDA runtime would load through its private interface (the CUDA 13 runtime loads its
//! kernels with `cuLibraryLoadData`, priced here), a library that eager loading places in
//! a context made after its load, and a `CUkernel` launched in a context where no lookup
//! priced it.

use std::collections::HashMap;
use std::ffi::c_int;

use gpuslice_abi::cuda::attr::{
    COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY_MINOR, MAX_THREADS_PER_MULTIPROCESSOR,
    MULTIPROCESSOR_COUNT,
};
use gpuslice_abi::cuda::limit::{MALLOC_HEAP_SIZE, PRINTF_FIFO_SIZE, STACK_SIZE};
use gpuslice_abi::cuda::result::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use gpuslice_abi::cuda::{CUdevice, CUresult};

use super::image::Costs;
use crate::ground::driver::real;
use crate::memory::{
    cuda_binding, current_context, current_device, process, shared, Binding, Process,
};
use gpuslice_policy::{charge_size, lock, PlacedCharges};

/// Module bytes a context's measured cost is taken to hold already: a driver makes the first
/// pages of a context's module memory with the context, so small images (a few kernels) cost
/// nothing more. Where a driver does not, the difference is model error within
/// `gpuslice_common::unpriced::UNPRICED_BOUND_BYTES` (see its reasoning).
pub const CONTEXT_MODULE_ARENA: u64 = 8 << 20;

/// What the images of a context holding `images` bytes of them are charged.
fn images_charge(images: u64) -> u64 {
    charge_size(images.saturating_sub(CONTEXT_MODULE_ARENA))
}

/// The per-thread stack granularity the price assumes before the driver says (the driver
/// may round the value up, `cuCtxSetLimit`); the read-back settles it either way.
pub const STACK_ALIGN: u64 = 16;

/// What one context's device is.
#[derive(Debug, Clone, Copy, Default)]
struct Facts {
    /// Compute capability, `10 * major + minor`.
    sm: u32,
    /// Threads the device holds resident at once: SMs x max threads per SM.
    threads: u64,
}

/// What the driver placed by itself in one context, as priced.
#[derive(Debug, Default)]
struct Placed {
    /// Region device entry.
    device: u8,
    facts: Facts,
    /// Per-thread stack the context started with (inside its measured cost).
    stack_base: u64,
    /// The stack limit as last set.
    stack: u64,
    /// Largest local size per thread of a kernel looked up for this context.
    local_need: u64,
    local_charged: u64,
    fifo_base: u64,
    fifo_charged: u64,
    heap_base: u64,
    heap_charged: u64,
    /// Bytes of the modules and libraries placed here, and their charge.
    images: u64,
    images_charged: u64,
    /// Libraries priced here, with their bytes.
    libraries: Vec<(u64, u64)>,
}

impl Placed {
    /// The charge for local memory of `per_thread` bytes per thread.
    fn local_for(&self, per_thread: u64) -> u64 {
        charge_size(
            per_thread
                .saturating_sub(self.stack_base)
                .saturating_mul(self.facts.threads),
        )
    }

    /// (base, charged) of a limit sized by its value.
    fn sized(&mut self, limit: c_int) -> (u64, &mut u64) {
        if limit == PRINTF_FIFO_SIZE {
            (self.fifo_base, &mut self.fifo_charged)
        } else {
            (self.heap_base, &mut self.heap_charged)
        }
    }

    fn charged(&self) -> u64 {
        self.local_charged + self.fifo_charged + self.heap_charged + self.images_charged
    }
}

/// This process's prices (in its `Ledger`): per context, per module and library.
#[derive(Debug, Default)]
pub struct PlacedBook {
    contexts: HashMap<u64, Placed>,
    /// Module -> (its context, its bytes).
    modules: HashMap<u64, (u64, u64)>,
    /// Library -> what it costs per architecture.
    libraries: HashMap<u64, Costs>,
    /// Kernel (`CUkernel`) -> its library.
    kernels: HashMap<u64, u64>,
    devices: HashMap<CUdevice, Facts>,
}

impl PlacedCharges for PlacedBook {
    /// A context ended: the driver freed everything it placed there. What was charged for it
    /// (device entry, bytes) is the caller's to refund.
    fn context_gone(&mut self, context: u64) -> Option<(u8, u64)> {
        self.modules.retain(|_, &mut (c, _)| c != context);
        let placed = self.contexts.remove(&context)?;
        Some((placed.device, placed.charged()))
    }
}

/// One `cuDeviceGetAttribute` (0 when the driver does not say).
fn attribute(attribute: c_int, ordinal: CUdevice) -> u64 {
    let Some(get) = real::cuDeviceGetAttribute() else {
        return 0;
    };
    let mut value: c_int = 0;
    // SAFETY: valid out-pointer; the driver validates the ordinal.
    let ok = unsafe { get(&mut value, attribute, ordinal) } == CUDA_SUCCESS;
    if ok {
        value.max(0) as u64
    } else {
        0
    }
}

/// `cuCtxGetLimit(limit)` of the current context, `None` when the driver does not say.
fn limit_now(limit: c_int) -> Option<u64> {
    let get = real::cuCtxGetLimit()?;
    let mut value: usize = 0;
    // SAFETY: cuCtxGetLimit writes one size_t into `value`.
    (unsafe { get(&mut value, limit) } == CUDA_SUCCESS).then_some(value as u64)
}

/// `cuCtxSetLimit(limit, value)` on the current context through the real driver (an undo).
fn set_limit_real(limit: c_int, value: u64) -> bool {
    let Some(set) = real::cuCtxSetLimit() else {
        return false;
    };
    // SAFETY: by-value arguments.
    let result = unsafe { set(limit, value as usize) };
    result == CUDA_SUCCESS
}

/// The calling thread's current context on a limited device, with this process's ledger:
/// what every price starts from. `None` = pass-through.
struct Current {
    process: &'static Process,
    context: u64,
}

fn current() -> Option<Current> {
    let (shared, process) = (shared()?, process()?);
    let context = current_context();
    let ordinal = current_device()?;
    match cuda_binding(shared, ordinal) {
        Ok(Binding::Limited(_)) => Some(Current { process, context }),
        _ => None,
    }
}

/// The book's entry for the current context, made at first sight (its device's facts, and
/// the limits it started with: what its measured cost holds).
fn entry(book: &mut PlacedBook, context: u64) -> Option<&mut Placed> {
    if !book.contexts.contains_key(&context) {
        let ordinal = current_device()?;
        let Ok(Binding::Limited(device)) = cuda_binding(shared()?, ordinal) else {
            return None;
        };
        let facts = *book.devices.entry(ordinal).or_insert_with(|| Facts {
            sm: (attribute(COMPUTE_CAPABILITY_MAJOR, ordinal) * 10
                + attribute(COMPUTE_CAPABILITY_MINOR, ordinal)) as u32,
            threads: attribute(MULTIPROCESSOR_COUNT, ordinal)
                * attribute(MAX_THREADS_PER_MULTIPROCESSOR, ordinal),
        });
        let stack = limit_now(STACK_SIZE).unwrap_or(0);
        book.contexts.insert(
            context,
            Placed {
                device,
                facts,
                stack_base: stack,
                stack,
                local_need: stack,
                fifo_base: limit_now(PRINTF_FIFO_SIZE).unwrap_or(0),
                heap_base: limit_now(MALLOC_HEAP_SIZE).unwrap_or(0),
                ..Placed::default()
            },
        );
    }
    book.contexts.get_mut(&context)
}

/// Reserves `bytes` on `device`; OUT_OF_MEMORY (nothing reserved) past the slice.
fn reserve(process: &Process, device: u8, bytes: u64) -> Result<(), CUresult> {
    crate::memory::charge_or_refuse(process, device, bytes)
}

/// `cuCtxSetLimit(limit, value)` through `call`: the stack, the printf FIFO and the malloc
/// heap priced as the module doc says; other limits pass through.
pub(crate) fn set_limit(limit: c_int, value: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    if ![STACK_SIZE, PRINTF_FIFO_SIZE, MALLOC_HEAP_SIZE].contains(&limit) {
        return call();
    }
    let Some(Current { process, context }) = current() else {
        return call();
    };
    let mut book = lock(&process.ledger.placed);
    let Some(placed) = entry(&mut book, context) else {
        return call();
    };
    let device = placed.device;
    // What an undo sets back (the stack as a launch may have grown it).
    let old = limit_now(limit).unwrap_or(placed.stack);
    // What the context is charged for this limit, before and (priced) after.
    let charge = |placed: &mut Placed, value: u64| -> (u64, u64) {
        if limit == STACK_SIZE {
            let was = placed.local_charged;
            (was, placed.local_for(value.max(placed.local_need)))
        } else {
            let (base, charged) = placed.sized(limit);
            (*charged, charge_size(value.saturating_sub(base)))
        }
    };
    let asked = if limit == STACK_SIZE {
        value.div_ceil(STACK_ALIGN).saturating_mul(STACK_ALIGN)
    } else {
        value
    };
    let (was, priced) = charge(placed, asked);
    if priced > was {
        if let Err(code) = reserve(process, device, priced - was) {
            crate::log_info!(
                "refusing cuCtxSetLimit({limit}, {value}): the driver would place {} bytes more than the slice has room for",
                priced - was
            );
            return code;
        }
    }
    let result = call();
    let held = if result == CUDA_SUCCESS {
        // What the driver made of it (it may round the value up).
        let now = limit_now(limit).unwrap_or(asked);
        let (_, actual) = charge(placed, now);
        let reserved = priced.max(was);
        if actual > reserved && reserve(process, device, actual - reserved).is_err() {
            // Coarser than priced and past the slice: undone, as a full card refuses it.
            set_limit_real(limit, old);
            process.ledger.refund(device, reserved - was);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        // A shrink is refunded only now, after the driver gave the memory back.
        process
            .ledger
            .refund(device, reserved.saturating_sub(actual));
        if limit == STACK_SIZE {
            placed.stack = now;
            placed.local_charged = actual;
        } else {
            *placed.sized(limit).1 = actual;
        }
        actual
    } else {
        process.ledger.refund(device, priced.saturating_sub(was));
        was
    };
    crate::log_debug!("limit {limit} of context {context:#x}: {held} bytes charged");
    result
}

/// A kernel whose handle was just obtained needs `local` bytes per thread in `context`
/// (0 = the current one): the growth of the context's local memory is reserved now (see
/// the module doc). `Err(OUT_OF_MEMORY)` when it does not fit.
pub(crate) fn kernel_found(context: u64, local: u64) -> Result<(), CUresult> {
    let Some(current) = current() else {
        return Ok(());
    };
    let process = current.process;
    let context = if context == 0 {
        current.context
    } else {
        context
    };
    let mut book = lock(&process.ledger.placed);
    let Some(placed) = (if context == current.context {
        entry(&mut book, context)
    } else {
        book.contexts.get_mut(&context)
    }) else {
        return Ok(());
    };
    let need = placed.local_need.max(local);
    let want = placed.local_for(need.max(placed.stack));
    if want > placed.local_charged {
        if let Err(code) = reserve(process, placed.device, want - placed.local_charged) {
            crate::log_info!(
                "refusing a kernel of {local} local bytes per thread: its local memory ({want} bytes for {} resident threads) does not fit in the slice",
                placed.facts.threads
            );
            return Err(code);
        }
        placed.local_charged = want;
    }
    placed.local_need = need;
    Ok(())
}

/// Places `bytes` of image in the current context's charge (rounded with what it holds).
fn reserve_image(process: &Process, placed: &mut Placed, bytes: u64) -> Result<u64, CUresult> {
    let charged = images_charge(placed.images.saturating_add(bytes));
    let growth = charged.saturating_sub(placed.images_charged);
    if let Err(code) = reserve(process, placed.device, growth) {
        crate::log_info!(
            "refusing a module load: its {bytes} bytes of code and static data do not fit in the slice"
        );
        return Err(code);
    }
    placed.images += bytes;
    placed.images_charged = charged;
    Ok(growth)
}

/// Takes `bytes` of image out of a context's charge, refunding what its rounding frees.
fn release_image(process: &Process, placed: &mut Placed, bytes: u64) {
    placed.images = placed.images.saturating_sub(bytes);
    let charged = images_charge(placed.images);
    process
        .ledger
        .refund(placed.device, placed.images_charged.saturating_sub(charged));
    placed.images_charged = charged;
}

/// `cuModuleLoad*` of an image costing `costs` (`None`: unreadable, passed through) through
/// `call` (the driver's result and the module it made): reserved in the current context
/// before the call, undone if the driver fails.
pub(crate) fn load_module(
    costs: Option<Costs>,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    let (Some(costs), Some(Current { process, context })) = (costs, current()) else {
        return call().0;
    };
    let mut book = lock(&process.ledger.placed);
    let Some(placed) = entry(&mut book, context) else {
        return call().0;
    };
    let bytes = costs.for_device(placed.facts.sm).unwrap_or(0);
    let growth = match reserve_image(process, placed, bytes) {
        Ok(growth) => growth,
        Err(code) => return code,
    };
    let (result, module) = call();
    if result != CUDA_SUCCESS {
        placed.images -= bytes;
        placed.images_charged -= growth;
        process.ledger.refund(placed.device, growth);
        return result;
    }
    book.modules.insert(module, (context, bytes));
    result
}

/// `cuModuleUnload` of `module` succeeded.
pub(crate) fn module_unloaded(module: u64) {
    let Some(process) = process() else { return };
    let mut book = lock(&process.ledger.placed);
    let Some((context, bytes)) = book.modules.remove(&module) else {
        return;
    };
    if let Some(placed) = book.contexts.get_mut(&context) {
        release_image(process, placed, bytes);
    }
}

/// The context a module lives in (0 = not one this process priced).
pub(crate) fn module_context(module: u64) -> u64 {
    process().map_or(0, |process| {
        lock(&process.ledger.placed)
            .modules
            .get(&module)
            .map_or(0, |&(context, _)| context)
    })
}

/// Prices library `library` in the current context when it is not yet (see the module doc).
fn place_library(
    process: &Process,
    book: &mut PlacedBook,
    context: u64,
    library: u64,
) -> Result<(), CUresult> {
    let Some(costs) = book.libraries.get(&library).cloned() else {
        return Ok(());
    };
    let Some(placed) = entry(book, context) else {
        return Ok(());
    };
    if placed.libraries.iter().any(|&(l, _)| l == library) {
        return Ok(());
    }
    let bytes = costs.for_device(placed.facts.sm).unwrap_or(0);
    reserve_image(process, placed, bytes)?;
    placed.libraries.push((library, bytes));
    Ok(())
}

/// `cuLibraryLoad*` of an image costing `costs` through `call` (the driver's result and the
/// library): reserved in the current context before the call (when one is current).
pub(crate) fn load_library(
    costs: Option<Costs>,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    let (Some(costs), Some(process)) = (costs, process()) else {
        return call().0;
    };
    let mut book = lock(&process.ledger.placed);
    // Priced under a placeholder key, renamed once the driver named the library.
    const LOADING: u64 = u64::MAX;
    book.libraries.insert(LOADING, costs);
    let context = current().map(|c| c.context);
    if let Some(context) = context {
        if let Err(code) = place_library(process, &mut book, context, LOADING) {
            book.libraries.remove(&LOADING);
            return code;
        }
    }
    let (result, library) = call();
    let costs = book.libraries.remove(&LOADING).unwrap_or_default();
    let placed = context.and_then(|c| book.contexts.get_mut(&c));
    if result != CUDA_SUCCESS {
        if let Some(placed) = placed {
            if let Some(at) = placed.libraries.iter().position(|&(l, _)| l == LOADING) {
                let (_, bytes) = placed.libraries.swap_remove(at);
                release_image(process, placed, bytes);
            }
        }
        return result;
    }
    if let Some(placed) = placed {
        for entry in placed.libraries.iter_mut().filter(|(l, _)| *l == LOADING) {
            entry.0 = library;
        }
    }
    book.libraries.insert(library, costs);
    result
}

/// `cuLibraryUnload` of `library` succeeded: its bytes leave every context it was priced in.
pub(crate) fn library_unloaded(library: u64) {
    let Some(process) = process() else { return };
    let mut book = lock(&process.ledger.placed);
    book.libraries.remove(&library);
    book.kernels.retain(|_, l| *l != library);
    for placed in book.contexts.values_mut() {
        if let Some(at) = placed.libraries.iter().position(|&(l, _)| l == library) {
            let (_, bytes) = placed.libraries.swap_remove(at);
            release_image(process, placed, bytes);
        }
    }
}

/// Before a call that places `library` (or the library of kernel `kernel`, when `library`
/// is 0) in the current context: priced there first. Also records `kernel`'s library.
pub(crate) fn library_used(library: u64, kernel: u64) -> Result<(), CUresult> {
    let Some(Current { process, context }) = current() else {
        return Ok(());
    };
    let mut book = lock(&process.ledger.placed);
    let library = if library != 0 {
        library
    } else {
        match book.kernels.get(&kernel) {
            Some(&l) => l,
            None => return Ok(()),
        }
    };
    place_library(process, &mut book, context, library)
}

/// `cuLibraryGetKernel` answered `kernel` of `library`.
pub(crate) fn kernel_of_library(kernel: u64, library: u64) {
    if let Some(process) = process() {
        lock(&process.ledger.placed).kernels.insert(kernel, library);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn local_memory_is_the_growth_past_the_first_stack_for_every_resident_thread() {
        // A V100: 80 SMs x 2048 threads, a 1 KiB stack inside the context's cost.
        let placed = Placed {
            facts: Facts {
                sm: 70,
                threads: 80 * 2048,
            },
            stack_base: 1024,
            ..Placed::default()
        };
        assert_eq!(placed.local_for(1024), 0);
        assert_eq!(placed.local_for(2048), 160 * MIB);
        assert_eq!(placed.local_for(8192), 1120 * MIB);
        assert_eq!(placed.local_for(16 << 10), 2400 * MIB);
        // Not a whole page: rounded up.
        assert_eq!(placed.local_for(1025), 2 * MIB);
    }

    #[test]
    fn a_contexts_images_cost_what_passes_its_module_arena_in_whole_pages() {
        assert_eq!(images_charge(0), 0);
        assert_eq!(images_charge(CONTEXT_MODULE_ARENA), 0);
        assert_eq!(images_charge(CONTEXT_MODULE_ARENA + 1), 2 * MIB);
        assert_eq!(images_charge(CONTEXT_MODULE_ARENA + 200 * MIB), 200 * MIB);
    }
}
