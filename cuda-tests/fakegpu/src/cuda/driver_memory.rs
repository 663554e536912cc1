//! Device memory the driver takes on a process's account without an allocation call asking
//! for it: module images, local memory, the stack and the printf FIFO. Charged to the
//! process's slot in the shared state (so NVML's per-process `usedGpuMemory` and the card's
//! use include it, as on a real driver) and released with the module, the context or the
//! process. Sources for each rule: `cuda-tests/README.md`, "Memory the driver takes on its own
//! account".
//!
//! * Module images (CUDA Programming Guide, "Lazy Loading"; driver API `cuModuleLoadData`,
//!   `cuLibraryLoadData`): each image's code and data are sized from the image for the
//!   context's device (`image`). What the modules of a context hold together is charged above
//!   the module arena the context's overhead already includes (`FAKEGPU_MODULE_ARENA`,
//!   default 8 MiB), rounded up to the allocation granularity. `cuModuleLoad*` places the
//!   module's data at the load whatever the loading mode, its code too under
//!   `CUDA_MODULE_LOADING=EAGER`, and under `LAZY` (the default since CUDA 12.2) at its first
//!   `cuModuleGetFunction`; the call that does not fit returns OUT_OF_MEMORY (a load is
//!   undone). A library (`cuLibraryLoadData`) is placed in a context, code and data, at its
//!   load under `EAGER` (in the current context), and under `LAZY` at the first call that
//!   needs it there: `cuKernelGetFunction`, `cuLibraryGetModule` / `cuLibraryGetGlobal`, or the
//!   first launch of one of its kernels.
//! * Local memory (driver API `cuCtxSetLimit`, `CU_LIMIT_STACK_SIZE`: "stack size in bytes of
//!   each GPU thread ... The driver automatically increases the per-thread stack size for each
//!   kernel launch as needed. This size isn't reset back to the original value after each
//!   launch"; `CU_CTX_LMEM_RESIZE_TO_MAX`, the only behaviour since CUDA 11): the context
//!   reserves `per_thread * resident threads`, resident threads being SMs x max threads per SM.
//!   `per_thread` is the stack limit, which the first launch of a kernel with more local
//!   memory per thread raises to that kernel's need (that launch fails with OUT_OF_MEMORY when
//!   it does not fit, nothing enqueued), and which `cuCtxSetLimit` sets up or down;
//!   `cuCtxGetLimit` reports it. The default 1 KiB stack is inside the context overhead;
//!   growth past it is charged, rounded up to the allocation granularity.
//! * printf FIFO (`CU_LIMIT_PRINTF_FIFO_SIZE`, default 1 MiB inside the overhead): growth past
//!   the default charged when set, rounded up to the allocation granularity. The malloc heap
//!   is `context`'s (same pattern).

use super::image::{self, ImageInfo};
use super::{round_up, Cuda, Tables, ALLOC_GRANULARITY, R};
use gpuslice_abi::cuda::result::*;
use std::collections::{HashMap, HashSet};

pub const LIMIT_STACK_SIZE: i32 = 0;
pub const LIMIT_PRINTF_FIFO_SIZE: i32 = 1;
/// The driver's default per-thread stack (`cuCtxGetLimit(CU_LIMIT_STACK_SIZE)` on a new
/// context): reserved inside the context overhead.
pub const DEFAULT_STACK: u64 = 1024;
/// The driver's default printf FIFO: inside the context overhead.
pub const DEFAULT_PRINTF_FIFO: u64 = 1 << 20;
/// Module bytes a context's overhead already holds (`FAKEGPU_MODULE_ARENA`).
pub const DEFAULT_MODULE_ARENA: u64 = 8 << 20;

/// The knobs, read once per process.
#[derive(Debug, Clone)]
pub struct Settings {
    pub lazy: bool,
    pub module_arena: u64,
    pub kernel_local: HashMap<String, u64>,
}

impl Settings {
    pub fn from_env() -> Settings {
        let lazy = !matches!(
            std::env::var("CUDA_MODULE_LOADING")
                .as_deref()
                .map(str::trim),
            Ok("EAGER") | Ok("eager")
        );
        let module_arena = std::env::var("FAKEGPU_MODULE_ARENA")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MODULE_ARENA);
        Settings {
            lazy,
            module_arena,
            kernel_local: image::local_bytes_from_env(),
        }
    }
}

/// One context's driver-taken memory.
#[derive(Debug, Default)]
struct CtxMemory {
    dev: u32,
    /// Device bytes of the images placed in the context.
    images: u64,
    /// Charged for them (above the arena).
    images_charged: u64,
    /// Per-thread stack (None: the default): as set, or as a launch grew it.
    stack: Option<u64>,
    local_charged: u64,
    printf: Option<u64>,
    printf_charged: u64,
    /// Libraries placed here.
    libraries: HashSet<u64>,
}

#[derive(Debug)]
struct ModuleImage {
    ctx: u64,
    info: ImageInfo,
    /// Bytes of it placed in its context (the data, then the code).
    placed: u64,
}

/// The process's bookkeeping (in `Tables`).
#[derive(Debug, Default)]
pub struct DriverMemory {
    settings: Option<Settings>,
    modules: HashMap<u64, ModuleImage>,
    libraries: HashMap<u64, ImageInfo>,
    contexts: HashMap<u64, CtxMemory>,
    /// Functions launched at least once (their first launch did the placing).
    launched: HashSet<u64>,
}

impl DriverMemory {
    fn settings(&mut self) -> &Settings {
        self.settings.get_or_insert_with(Settings::from_env)
    }

    /// Replaces the knobs (tests).
    pub fn set_settings(&mut self, settings: Settings) {
        self.settings = Some(settings);
    }
}

/// What the image at `src` costs on a device of compute capability `sm` ([`image::parse`]);
/// nothing for an image it cannot read.
///
/// # Safety
/// As [`super::module::classify`]: a `Memory` address is a readable image, a
/// `FatbinWrapper` a readable `__fatBinC_Wrapper_t`.
pub(crate) unsafe fn image_info(src: &super::module::ImageSource, sm: u32) -> ImageInfo {
    use super::module::ImageSource;
    /// `__fatBinC_Wrapper_t`: magic, version, then the pointer to the fatbin.
    const WRAPPER_MAGIC: u32 = 0x4662_43b1;
    let at = |p: usize| {
        if p == 0 {
            return None;
        }
        // SAFETY: per the contract, a readable image or wrapper (at least its magic).
        let magic = unsafe { (p as *const u32).read_unaligned() };
        let image = if magic == WRAPPER_MAGIC {
            // SAFETY: a wrapper holds the fatbin's address at byte 8.
            unsafe { ((p + 8) as *const usize).read_unaligned() }
        } else {
            p
        };
        // SAFETY: per the contract (the wrapper's data is the fatbin it was registered with).
        unsafe { image::image_at(image as *const std::ffi::c_void) }.map(|b| image::parse(b, sm))
    };
    match src {
        ImageSource::Memory(p) | ImageSource::FatbinWrapper(p) => at(*p),
        ImageSource::File(path) => std::fs::read(path).ok().map(|b| image::parse(&b, sm)),
    }
    .unwrap_or_default()
}

/// Local bytes a context reserves per thread beyond the default, charged.
fn local_charge(per_thread: u64, resident_threads: u64) -> u64 {
    round_up(
        per_thread
            .saturating_sub(DEFAULT_STACK)
            .saturating_mul(resident_threads),
        ALLOC_GRANULARITY,
    )
}

impl Cuda {
    /// The compute capability (`10 * major + minor`) of the current context's device, or of
    /// device 0 without one (what an image is sized for).
    pub(crate) fn current_sm(&self) -> u32 {
        let dev = self.current().map_or(0, |c| c.dev);
        self.check()
            .ok()
            .and_then(|st| st.device(dev))
            .map_or(70, |d| d.cc_major * 10 + d.cc_minor)
    }

    fn resident_threads(&self, dev: u32) -> u64 {
        self.check().map_or(0, |st| {
            let (sms, threads) = st.sm_shape(dev);
            sms as u64 * threads as u64
        })
    }

    /// Moves a charge from `old` to `new` bytes; OUT_OF_MEMORY (nothing changed) when the
    /// growth does not fit on the card.
    fn recharge(&self, dev: u32, old: u64, new: u64) -> R<()> {
        let st = self.check()?;
        if new > old {
            if !st.try_charge(dev, self.slot(), new - old) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        } else {
            st.uncharge(dev, self.slot(), old - new);
        }
        Ok(())
    }

    fn ctx_memory(t: &mut Tables, ctx: u64) -> R<&mut CtxMemory> {
        let dev = t
            .contexts
            .get(&ctx)
            .filter(|c| c.active)
            .map(|c| c.dev)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        Ok(t.driver_memory
            .contexts
            .entry(ctx)
            .or_insert_with(|| CtxMemory {
                dev,
                ..CtxMemory::default()
            }))
    }

    /// Places `bytes` of image in `ctx`: the charge above the arena grows.
    fn place_image(&self, t: &mut Tables, ctx: u64, bytes: i128) -> R<()> {
        let arena = t.driver_memory.settings().module_arena;
        let c = Self::ctx_memory(t, ctx)?;
        let images = (c.images as i128 + bytes).max(0) as u64;
        let charged = round_up(images.saturating_sub(arena), ALLOC_GRANULARITY);
        let (dev, old) = (c.dev, c.images_charged);
        self.recharge(dev, old, charged)?;
        let c = Self::ctx_memory(t, ctx)?;
        c.images = images;
        c.images_charged = charged;
        Ok(())
    }

    /// Records a new module's image and places its data now, its code too under eager
    /// loading (undoing the load when it does not fit).
    pub(crate) fn attach_image(&self, m: u64, info: ImageInfo) -> R<()> {
        let mut t = self.lock();
        let Some(ctx) = t.modules.get(&m).map(|module| module.ctx) else {
            return Ok(());
        };
        let eager = !t.driver_memory.settings().lazy;
        let now = if eager {
            info.device_bytes()
        } else {
            info.data_bytes
        };
        t.driver_memory.modules.insert(
            m,
            ModuleImage {
                ctx,
                info,
                placed: 0,
            },
        );
        if let Err(e) = self.place_module(&mut t, m, now) {
            drop(t);
            let _ = self.module_unload(m);
            return Err(e);
        }
        Ok(())
    }

    /// Places the module's image up to `bytes` of it in its context.
    fn place_module(&self, t: &mut Tables, m: u64, bytes: u64) -> R<()> {
        let Some(image) = t.driver_memory.modules.get(&m) else {
            return Ok(());
        };
        let more = bytes.saturating_sub(image.placed);
        if more == 0 {
            return Ok(());
        }
        let ctx = image.ctx;
        self.place_image(t, ctx, more as i128)?;
        if let Some(image) = t.driver_memory.modules.get_mut(&m) {
            image.placed += more;
        }
        Ok(())
    }

    /// A module is unloaded (or its context ended): its image leaves the context's charge.
    pub(crate) fn module_image_gone(&self, t: &mut Tables, m: u64) {
        let Some(image) = t.driver_memory.modules.remove(&m) else {
            return;
        };
        if image.placed > 0 {
            let _ = self.place_image(t, image.ctx, -(image.placed as i128));
        }
    }

    /// `cuModuleGetFunction` loads the module's code (lazy loading places it at the first).
    pub(crate) fn module_code_needed(&self, t: &mut Tables, m: u64) -> R<()> {
        let Some(all) = t
            .driver_memory
            .modules
            .get(&m)
            .map(|i| i.info.device_bytes())
        else {
            return Ok(());
        };
        self.place_module(t, m, all)
    }

    /// Records a new library's image; eager loading places it in the current context now
    /// (undoing the load when it does not fit).
    pub(crate) fn attach_library(&self, l: u64, info: ImageInfo) -> R<()> {
        let mut t = self.lock();
        t.driver_memory.libraries.insert(l, info);
        let eager = !t.driver_memory.settings().lazy;
        drop(t);
        if eager {
            if let Ok(cur) = self.current() {
                let mut t = self.lock();
                if let Err(e) = self.place_library(&mut t, l, cur.ctx) {
                    drop(t);
                    let _ = self.library_unload(l);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Places library `l` in context `ctx` when it is not yet there (lazy loading, at the
    /// first call that needs it there), if its code runs on that context's card.
    pub(crate) fn place_library(&self, t: &mut Tables, l: u64, ctx: u64) -> R<()> {
        let Some(bytes) = t.driver_memory.libraries.get(&l).map(|i| i.device_bytes()) else {
            return Ok(());
        };
        let c = Self::ctx_memory(t, ctx)?;
        if c.libraries.contains(&l) {
            return Ok(());
        }
        // The library's code for this context's card (a context made after the load).
        let dev = c.dev;
        self.code_runs_on(&t.driver_memory.libraries[&l], dev)?;
        self.place_image(t, ctx, bytes as i128)?;
        Self::ctx_memory(t, ctx)?.libraries.insert(l);
        Ok(())
    }

    /// A library is unloaded: its image leaves every context it was placed in.
    pub(crate) fn library_image_gone(&self, t: &mut Tables, l: u64) {
        let Some(info) = t.driver_memory.libraries.remove(&l) else {
            return;
        };
        let placed: Vec<u64> = t
            .driver_memory
            .contexts
            .iter()
            .filter(|(_, c)| c.libraries.contains(&l))
            .map(|(&ctx, _)| ctx)
            .collect();
        for ctx in placed {
            if let Some(c) = t.driver_memory.contexts.get_mut(&ctx) {
                c.libraries.remove(&l);
            }
            let _ = self.place_image(t, ctx, -(info.device_bytes() as i128));
        }
    }

    /// The first launch of `f` in context `ctx`: lazy loading places its library (a module's
    /// code was placed when `f` was looked up) and the per-thread stack grows to what the
    /// kernel needs. OUT_OF_MEMORY when either does not fit (what was placed stays placed, as
    /// the driver keeps a loaded library).
    pub(crate) fn first_launch(&self, f: u64, ctx: u64) -> R<()> {
        let mut t = self.lock();
        if t.driver_memory.launched.contains(&f) {
            return Ok(());
        }
        let (module, library, name) = match t.functions.get(&f) {
            Some(func) => {
                let library = match func.module {
                    Some(_) => None,
                    None => t
                        .kernels
                        .values()
                        .find(|k| k.funcs.values().any(|&kf| kf == f))
                        .map(|k| k.library),
                };
                (func.module, library, func.name.clone())
            }
            // A CUkernel launched as a function, in the current context.
            None => match t.kernels.get(&f) {
                Some(k) => (None, Some(k.library), k.name.clone()),
                None => return Ok(()),
            },
        };
        if let Some(m) = module {
            self.module_code_needed(&mut t, m)?;
        }
        if let Some(l) = library {
            self.place_library(&mut t, l, ctx)?;
        }
        let from_image = module
            .and_then(|m| t.driver_memory.modules.get(&m))
            .map(|i| &i.info)
            .or_else(|| library.and_then(|l| t.driver_memory.libraries.get(&l)))
            .and_then(|info| info.local_bytes.get(&name).copied());
        let local = t
            .driver_memory
            .settings()
            .kernel_local
            .get(&name)
            .copied()
            .or(from_image)
            .unwrap_or(0);
        let c = Self::ctx_memory(&mut t, ctx)?;
        if local > c.stack.unwrap_or(DEFAULT_STACK) {
            let charge = local_charge(local, self.resident_threads(c.dev));
            self.recharge(c.dev, c.local_charged, charge)?;
            c.stack = Some(local);
            c.local_charged = charge;
        }
        t.driver_memory.launched.insert(f);
        Ok(())
    }

    /// A kernel's per-thread local bytes as `cuFuncGetAttribute(LOCAL_SIZE_BYTES)` reports
    /// for a function (of a module or a library's kernel), or `cuKernelGetAttribute` for a
    /// `CUkernel`.
    pub(crate) fn function_local_bytes(&self, t: &mut Tables, f: u64) -> u64 {
        let (name, info) = if let Some(func) = t.functions.get(&f) {
            let info = match func.module {
                Some(m) => t.driver_memory.modules.get(&m).map(|i| &i.info),
                None => t
                    .kernels
                    .values()
                    .find(|k| k.funcs.values().any(|&kf| kf == f))
                    .and_then(|k| t.driver_memory.libraries.get(&k.library)),
            };
            (func.name.clone(), info)
        } else if let Some(k) = t.kernels.get(&f) {
            (k.name.clone(), t.driver_memory.libraries.get(&k.library))
        } else {
            return 0;
        };
        let from_image = info.and_then(|i| i.local_bytes.get(&name).copied());
        t.driver_memory
            .settings()
            .kernel_local
            .get(&name)
            .copied()
            .or(from_image)
            .unwrap_or(0)
    }

    /// `cuCtxSetLimit` for the stack and the printf FIFO: growth charged first (OUT_OF_MEMORY
    /// leaves everything as it was), shrinking frees (a smaller stack frees local memory a
    /// launch grew: the next launch that needs it grows it again). `Ok(false)`: not one of these limits.
    pub(crate) fn set_driver_limit(
        &self,
        t: &mut Tables,
        ctx: u64,
        limit: i32,
        value: u64,
    ) -> R<bool> {
        match limit {
            LIMIT_STACK_SIZE => {
                let c = Self::ctx_memory(t, ctx)?;
                let charge = local_charge(value, self.resident_threads(c.dev));
                self.recharge(c.dev, c.local_charged, charge)?;
                c.stack = Some(value);
                c.local_charged = charge;
                Ok(true)
            }
            LIMIT_PRINTF_FIFO_SIZE => {
                let c = Self::ctx_memory(t, ctx)?;
                let charge = round_up(value.saturating_sub(DEFAULT_PRINTF_FIFO), ALLOC_GRANULARITY);
                self.recharge(c.dev, c.printf_charged, charge)?;
                c.printf = Some(value);
                c.printf_charged = charge;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// `cuCtxGetLimit` for the stack and the printf FIFO (their defaults when never set).
    pub(crate) fn driver_limit(t: &Tables, ctx: u64, limit: i32) -> Option<u64> {
        let c = t.driver_memory.contexts.get(&ctx);
        match limit {
            LIMIT_STACK_SIZE => Some(c.and_then(|c| c.stack).unwrap_or(DEFAULT_STACK)),
            LIMIT_PRINTF_FIFO_SIZE => Some(c.and_then(|c| c.printf).unwrap_or(DEFAULT_PRINTF_FIFO)),
            _ => None,
        }
    }

    /// A context ends: everything the driver took for it goes back to the card.
    pub(crate) fn ctx_driver_memory_gone(&self, t: &mut Tables, ctx: u64) {
        t.driver_memory.modules.retain(|_, m| m.ctx != ctx);
        let live: HashSet<u64> = t.functions.keys().copied().collect();
        t.driver_memory.launched.retain(|f| live.contains(f));
        if let Some(c) = t.driver_memory.contexts.remove(&ctx) {
            if let Ok(st) = self.check() {
                st.uncharge(
                    c.dev,
                    self.slot(),
                    c.images_charged + c.local_charged + c.printf_charged,
                );
            }
        }
    }

    /// What the driver has taken on this process's account on `dev` (tests, `fakegpu`).
    pub fn driver_taken(&self, dev: u32) -> u64 {
        let t = self.lock();
        t.driver_memory
            .contexts
            .values()
            .filter(|c| c.dev == dev)
            .map(|c| c.images_charged + c.local_charged + c.printf_charged)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::module::ImageSource;
    use super::super::testutil::*;
    use super::super::Config;
    use super::*;

    /// Loads PTX text through the one module funnel, as `cuModuleLoadData` would.
    fn load_ptx(c: &Cuda, ptx: &str) -> R<u64> {
        let image = std::ffi::CString::new(ptx).unwrap();
        c.module_load(ImageSource::Memory(image.as_ptr() as usize))
    }

    /// As [`load_ptx`], as `cuLibraryLoadData` would.
    fn load_ptx_library(c: &Cuda, ptx: &str) -> R<u64> {
        let image = std::ffi::CString::new(ptx).unwrap();
        c.library_load(ImageSource::Memory(image.as_ptr() as usize))
    }

    const MIB: u64 = 1 << 20;

    fn with(lazy: bool, local: &[(&str, u64)]) -> &'static Cuda {
        let c = driver(Config {
            ctx_overhead: 10 << 20,
            ..Config::default()
        });
        c.lock().driver_memory.set_settings(Settings {
            lazy,
            module_arena: DEFAULT_MODULE_ARENA,
            kernel_local: local.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
        });
        c.ctx_create(0, 0).unwrap();
        c
    }

    fn big_ptx(static_mib: u64) -> String {
        format!(
            ".version 7.0\n.target sm_70\n.global .align 8 .b8 big[{}];\n.visible .entry k()\n{{\n .local .align 8 .b8 __local_depot0[3072];\n ret;\n}}\n",
            static_mib * MIB
        )
    }

    #[test]
    fn a_modules_data_is_placed_at_its_load_its_code_at_the_first_lookup_and_local_memory_at_the_first_launch(
    ) {
        let c = with(true, &[]);
        let st = c.check().unwrap();
        let base = st.used_memory(0);
        let ptx = big_ptx(64);
        let m = load_ptx(c, &ptx).unwrap();
        // The data (64 MiB) above the 8 MiB arena, rounded to 2 MiB: placed at the load.
        let data = round_up(64 * MIB - DEFAULT_MODULE_ARENA, 2 * MIB);
        assert_eq!(st.used_memory(0), base + data, "lazy: the data at the load");
        let f = c.module_get_function(m, "k").unwrap();
        // The code (the text) joins it at the first lookup.
        let image = round_up(64 * MIB + ptx.len() as u64 - DEFAULT_MODULE_ARENA, 2 * MIB);
        assert_eq!(st.used_memory(0), base + image, "the code at the lookup");
        c.launch(f, [1, 1, 1], [32, 1, 1], Some(1), 0).unwrap();
        // Local memory: 3 KiB per thread for the v100's 80 x 2048 threads, 2 KiB past the
        // default stack, which the launch raised to 3 KiB.
        let local = round_up(2048 * 80 * 2048, 2 * MIB);
        assert_eq!(st.used_memory(0), base + image + local);
        assert_eq!(
            c.ctx_get_limit(LIMIT_STACK_SIZE).unwrap(),
            3072,
            "the stack grew"
        );
        assert_eq!(c.driver_taken(0), image + local);
        assert_eq!(
            st.processes(0)[0].used_memory,
            base + image + local,
            "NVML sees it"
        );
        // A second launch takes nothing more.
        c.launch(f, [1, 1, 1], [32, 1, 1], Some(1), 0).unwrap();
        assert_eq!(st.used_memory(0), base + image + local);
        c.module_unload(m).unwrap();
        assert_eq!(
            st.used_memory(0),
            base + local,
            "local memory stays with the context"
        );
        // A smaller stack limit gives it back.
        c.ctx_set_limit(LIMIT_STACK_SIZE, 1024).unwrap();
        assert_eq!(st.used_memory(0), base);
        c.ctx_destroy(c.ctx_get_current().unwrap()).unwrap();
        assert_eq!(st.used_memory(0), 0);
    }

    #[test]
    fn eager_loading_charges_at_load_and_refuses_what_does_not_fit() {
        let c = with(false, &[]);
        let st = c.check().unwrap();
        let base = st.used_memory(0);
        let m = load_ptx(c, &big_ptx(64)).unwrap();
        assert!(st.used_memory(0) > base + 56 * MIB);
        // The 1 GiB test card cannot hold a 2 GiB image: refused, nothing left behind.
        let before = st.used_memory(0);
        assert_eq!(load_ptx(c, &big_ptx(2048)), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(st.used_memory(0), before);
        c.module_unload(m).unwrap();
        assert_eq!(st.used_memory(0), base);
    }

    #[test]
    fn a_launch_whose_local_memory_does_not_fit_fails_and_the_stack_limit_costs_memory() {
        let c = with(true, &[("huge", 64 << 10)]);
        let st = c.check().unwrap();
        let base = st.used_memory(0);
        let m = c
            .module_load(ImageSource::Memory(c".version 7.0".as_ptr() as usize))
            .unwrap();
        let f = c.module_get_function(m, "huge").unwrap();
        // 64 KiB x 163,840 threads = 10 GiB: not on a 1 GiB card.
        assert_eq!(
            c.launch(f, [1, 1, 1], [32, 1, 1], Some(1), 0),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(st.used_memory(0), base);
        // The stack limit: 4 KiB per thread is 3 KiB past the default.
        c.ctx_set_limit(LIMIT_STACK_SIZE, 4096).unwrap();
        assert_eq!(c.ctx_get_limit(LIMIT_STACK_SIZE).unwrap(), 4096);
        assert_eq!(st.used_memory(0), base + 3072 * 80 * 2048);
        assert_eq!(
            c.ctx_set_limit(LIMIT_STACK_SIZE, 1 << 20),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(c.ctx_get_limit(LIMIT_STACK_SIZE).unwrap(), 4096);
        c.ctx_set_limit(LIMIT_STACK_SIZE, 1024).unwrap();
        assert_eq!(st.used_memory(0), base);
        // printf FIFO: 33 MiB is 32 MiB past the default.
        assert_eq!(
            c.ctx_get_limit(LIMIT_PRINTF_FIFO_SIZE).unwrap(),
            DEFAULT_PRINTF_FIFO
        );
        c.ctx_set_limit(LIMIT_PRINTF_FIFO_SIZE, 33 * MIB).unwrap();
        assert_eq!(st.used_memory(0), base + 32 * MIB);
        c.ctx_destroy(c.ctx_get_current().unwrap()).unwrap();
        assert_eq!(st.used_memory(0), 0);
    }

    #[test]
    fn a_library_is_placed_in_a_context_at_the_first_call_that_needs_it_there() {
        let c = with(true, &[]);
        let st = c.check().unwrap();
        let base = st.used_memory(0);
        let l = load_ptx_library(c, &big_ptx(32)).unwrap();
        let k = c.library_get_kernel(l, "k").unwrap();
        assert_eq!(st.used_memory(0), base, "lazy: nothing at the load");
        // A CUkernel launched as it is places its library at that launch.
        c.launch(k, [1, 1, 1], [32, 1, 1], Some(1), 0).unwrap();
        let grown = st.used_memory(0);
        assert!(grown > base + 24 * MIB, "{grown}");
        c.library_unload(l).unwrap();
        assert!(st.used_memory(0) < grown - 24 * MIB);
        // The function of a kernel in this context places it too, and so does a global.
        let before = st.used_memory(0);
        let l = load_ptx_library(c, &big_ptx(32)).unwrap();
        let k = c.library_get_kernel(l, "k").unwrap();
        c.kernel_get_function(k).unwrap();
        assert!(st.used_memory(0) > before + 24 * MIB);
        c.library_unload(l).unwrap();
        let l = load_ptx_library(c, &big_ptx(32)).unwrap();
        c.library_get_global(l, "big").unwrap();
        assert!(st.used_memory(0) > before + 24 * MIB);
    }
}
