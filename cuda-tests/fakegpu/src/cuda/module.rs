//! Modules, libraries, kernels and functions. Any bytes form a module and any non-empty name
//! is a kernel (or a 256-byte global): the fake runs no code, it only models time and memory.
//! What images cost on the device is `driver_memory`'s (each load below hands it the image).
//!
//! Every load goes through one function per kind (`module_load` for modules from memory,
//! a file or the runtime's fatbin registration; `library_load` for libraries), which reads
//! the image's format first (see [`ImageKind`]): the format decides how its kernels take
//! time (see [`Timing`]).

use super::memory::AllocKind;
use super::{kind, Cuda, Tables, R};
use gpuslice_abi::cuda::result::*;
use std::collections::HashMap;

/// Where an image comes from.
#[derive(Clone, Debug)]
pub enum ImageSource {
    /// Bytes in the caller's memory (`cuModuleLoadData[Ex]`, `cuModuleLoadFatBinary`,
    /// `cuLibraryLoadData`): a fatbin wrapper or header, an ELF cubin, PTX text or anything.
    Memory(usize),
    /// The runtime's `__fatBinC_Wrapper_t` (what `__cudaRegisterFatBinary` was handed).
    FatbinWrapper(usize),
    /// A file (`cuModuleLoad`, `cuLibraryLoadFromFile`).
    File(std::path::PathBuf),
}

/// An image's format, read from its first bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// A fatbin (wrapper magic 0x466243b1 or header magic 0xba55ed50): what nvcc embeds
    /// and what libcudart, cuBLAS and PyTorch register.
    Fatbin,
    /// An ELF cubin (`\x7fELF`), as NVRTC and nvJitLink produce.
    Cubin,
    /// PTX text (starts, after comments and blank lines, with a `.version` directive): what
    /// its entries' parameters say.
    Ptx(PtxEntries),
    /// Anything else: the test clients' own images.
    Raw,
}

/// How a module's kernels take device time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Timing {
    /// `kernelParams[0]` points to the kernel's `ns_per_wave` (the clients' spin kernel).
    NsPerWaveParam,
    /// Only these kernels read `ns_per_wave` from their first parameter (PTX), whose
    /// parameters are known.
    ParamFor(PtxEntries),
    /// The launch geometry at `FAKEGPU_NS_PER_WAVE` (framework kernels, whose first
    /// argument is a real argument).
    Geometry,
}

/// What a PTX image's `.entry` declarations say about their parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxEntries {
    /// The entries whose first parameter is named `ns_per_wave`.
    pub ns: Vec<String>,
    /// Per entry, the positions of its 64-bit scalar parameters (`.u64`, `.s64`, `.b64`):
    /// the ones a device pointer is passed in, which managed memory's residency reads at a
    /// launch (see `managed`).
    pub wide: HashMap<String, Vec<usize>>,
}

impl ImageKind {
    pub fn timing(&self) -> Timing {
        match self {
            ImageKind::Raw => Timing::NsPerWaveParam,
            ImageKind::Ptx(entries) => Timing::ParamFor(entries.clone()),
            ImageKind::Fatbin | ImageKind::Cubin => Timing::Geometry,
        }
    }
}

const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;
const FATBIN_MAGIC: u32 = 0xba55_ed50;

/// How much of a PTX image is searched for entries (images are NUL-terminated text).
const PTX_SCAN_LIMIT: usize = 16 << 20;

/// The format of bytes that start with `head`.
pub fn classify_bytes(head: &[u8]) -> ImageKind {
    let magic = head
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if magic == Some(FATBIN_WRAPPER_MAGIC) || magic == Some(FATBIN_MAGIC) {
        return ImageKind::Fatbin;
    }
    if head.starts_with(b"\x7fELF") {
        return ImageKind::Cubin;
    }
    let text = String::from_utf8_lossy(head);
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("//"));
    if first.is_some_and(|l| l.starts_with(".version")) {
        return ImageKind::Ptx(ptx_entries(&text));
    }
    ImageKind::Raw
}

/// The `.entry` kernels' parameters (see [`PtxEntries`]).
fn ptx_entries(text: &str) -> PtxEntries {
    let mut out = PtxEntries::default();
    let mut rest = text;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + ".entry".len()..];
        let Some(open) = rest.find('(') else { break };
        let name = rest[..open].trim();
        let params = &rest[open + 1..];
        let params = &params[..params.find(')').unwrap_or(params.len())];
        if name.is_empty() {
            continue;
        }
        let declared: Vec<&str> = params.split(',').map(str::trim).collect();
        let pname = declared[0].split_whitespace().last().unwrap_or("");
        if pname == "ns_per_wave" {
            out.ns.push(name.to_string());
        }
        let wide = declared
            .iter()
            .enumerate()
            .filter(|(_, d)| {
                let words: Vec<&str> = d.split_whitespace().collect();
                !d.contains('[') && [".u64", ".s64", ".b64"].iter().any(|t| words.contains(t))
            })
            .map(|(position, _)| position)
            .collect();
        out.wide.insert(name.to_string(), wide);
    }
    out
}

/// Reads an image's format from where it lies.
///
/// # Safety
/// For [`ImageSource::Memory`] the address must be a readable image as the CUDA API
/// requires of `cuModuleLoadData` callers (a fatbin, an ELF, or NUL-terminated text);
/// for [`ImageSource::FatbinWrapper`] a readable `__fatBinC_Wrapper_t`.
pub unsafe fn classify(src: &ImageSource) -> R<ImageKind> {
    match src {
        ImageSource::Memory(0) | ImageSource::FatbinWrapper(0) => Err(CUDA_ERROR_INVALID_VALUE),
        ImageSource::FatbinWrapper(p) => {
            // SAFETY: per the contract, a readable wrapper (magic, version, data, ...).
            let magic = unsafe { (*p as *const u32).read_unaligned() };
            if magic != FATBIN_WRAPPER_MAGIC {
                return Err(CUDA_ERROR_INVALID_IMAGE);
            }
            Ok(ImageKind::Fatbin)
        }
        ImageSource::Memory(p) => {
            // SAFETY: per the contract the first 4 bytes are readable (every format is
            // longer, and text images are NUL-terminated, so the scan stops in bounds).
            let head = unsafe { std::slice::from_raw_parts(*p as *const u8, 4) };
            if head.contains(&0) {
                return Ok(classify_bytes(head));
            }
            let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
            if magic == FATBIN_WRAPPER_MAGIC || magic == FATBIN_MAGIC || head == b"\x7fELF" {
                return Ok(classify_bytes(head));
            }
            // SAFETY: text image, NUL-terminated per the contract; bounded scan.
            let len = (0..PTX_SCAN_LIMIT)
                .find(|&i| unsafe { *(*p as *const u8).add(i) } == 0)
                .unwrap_or(PTX_SCAN_LIMIT);
            // SAFETY: `len` bytes were just read one by one.
            let bytes = unsafe { std::slice::from_raw_parts(*p as *const u8, len) };
            Ok(classify_bytes(bytes))
        }
        ImageSource::File(path) => {
            let bytes = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
            Ok(classify_bytes(&bytes))
        }
    }
}

pub struct Module {
    pub ctx: u64,
    pub timing: Timing,
    pub funcs: HashMap<String, u64>,
    pub globals: HashMap<String, u64>,
}

pub struct Func {
    pub ctx: u64,
    pub module: Option<u64>,
    pub name: String,
}

pub struct Library {
    pub kernels: HashMap<String, u64>,
    pub timing: Timing,
    /// The library as a module, per context (`cuLibraryGetModule`).
    pub modules: HashMap<u64, u64>,
}

pub struct Kernel {
    pub library: u64,
    pub name: String,
    /// Function handle per context.
    pub funcs: HashMap<u64, u64>,
}

pub const GLOBAL_SIZE: u64 = 256;

impl Cuda {
    /// Every module load: from memory, a file, or the runtime's fatbin registration.
    pub fn module_load(&self, src: ImageSource) -> R<u64> {
        let cur = self.current()?;
        if let ImageSource::File(path) = &src {
            if !path.is_file() {
                return Err(CUDA_ERROR_FILE_NOT_FOUND);
            }
        }
        // SAFETY: the source comes from the caller with the CUDA API's guarantees.
        let image = unsafe { classify(&src) }?;
        // What the image holds: its code (checked against the card now, as the driver's
        // loader picks the image's code for the context's device at the load) and what it
        // costs on the device (its data placed now, its code now or, lazily, at the first
        // `cuModuleGetFunction`).
        let sm = self.current_sm();
        // SAFETY: as for `classify` above.
        let info = unsafe { super::driver_memory::image_info(&src, sm) };
        self.code_runs_on(&info, cur.dev)?;
        let mut t = self.lock();
        let h = t.handle(kind::MODULE);
        t.modules.insert(
            h,
            Module {
                ctx: cur.ctx,
                timing: image.timing(),
                funcs: HashMap::new(),
                globals: HashMap::new(),
            },
        );
        drop(t);
        self.attach_image(h, info)?;
        Ok(h)
    }

    /// Whether an image's code runs on device `dev` under this driver
    /// ([`super::image::code_for_card`]): `CUDA_ERROR_NO_BINARY_FOR_GPU` (or
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) otherwise.
    pub(crate) fn code_runs_on(&self, info: &super::image::ImageInfo, dev: u32) -> R<()> {
        let Some(d) = self.check()?.device(dev) else {
            return Ok(());
        };
        let cc = d.cc_major * 10 + d.cc_minor;
        super::image::code_for_card(&info.code, cc, self.driver_version())
    }

    pub fn module_load_file(&self, path: &std::path::Path) -> R<u64> {
        self.module_load(ImageSource::File(path.to_path_buf()))
    }

    /// Whether a launch of `f` (a function or a CUkernel) reads its `ns_per_wave` from
    /// `kernelParams[0]` (see [`Timing`]); false for unknown handles.
    pub fn reads_ns_param(&self, f: u64) -> bool {
        let t = self.lock();
        match Self::timing_of(&t, f) {
            Some((Timing::NsPerWaveParam, _)) => true,
            Some((Timing::ParamFor(entries), name)) => entries.ns.iter().any(|n| n == name),
            _ => false,
        }
    }

    /// The positions of `f`'s 64-bit parameters, where its image says (PTX); empty otherwise.
    pub fn wide_params(&self, f: u64) -> Vec<usize> {
        let t = self.lock();
        match Self::timing_of(&t, f) {
            Some((Timing::ParamFor(entries), name)) => {
                entries.wide.get(name).cloned().unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// How `f`'s module or library times its kernels, and `f`'s kernel name.
    fn timing_of(t: &Tables, f: u64) -> Option<(&Timing, &str)> {
        let (timing, name) = if let Some(func) = t.functions.get(&f) {
            let timing = match func.module {
                Some(m) => t.modules.get(&m).map(|m| &m.timing),
                None => t
                    .kernels
                    .values()
                    .find(|k| k.funcs.values().any(|&x| x == f))
                    .and_then(|k| t.libraries.get(&k.library))
                    .map(|l| &l.timing),
            };
            (timing, func.name.as_str())
        } else if let Some(k) = t.kernels.get(&f) {
            (
                t.libraries.get(&k.library).map(|l| &l.timing),
                k.name.as_str(),
            )
        } else {
            return None;
        };
        Some((timing?, name))
    }

    pub fn module_unload(&self, m: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        let module = t.modules.remove(&m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.module_image_gone(&mut t, m);
        for f in module.funcs.values() {
            t.functions.remove(f);
        }
        for g in module.globals.values() {
            self.free_alloc(&mut t, *g);
        }
        Ok(())
    }

    pub fn module_get_function(&self, m: u64, name: &str) -> R<u64> {
        self.check()?;
        let mut t = self.lock();
        let module = t.modules.get(&m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if name.is_empty() {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        if let Some(&f) = module.funcs.get(name) {
            return Ok(f);
        }
        let ctx = module.ctx;
        self.module_code_needed(&mut t, m)?;
        let f = t.handle(kind::FUNC);
        t.functions.insert(
            f,
            Func {
                ctx,
                module: Some(m),
                name: name.to_string(),
            },
        );
        t.modules
            .get_mut(&m)
            .expect("checked")
            .funcs
            .insert(name.to_string(), f);
        Ok(f)
    }

    /// (address, size) of a module global, allocated on first request.
    pub fn module_get_global(&self, m: u64, name: &str) -> R<(u64, u64)> {
        self.check()?;
        let mut t = self.lock();
        let module = t.modules.get(&m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if name.is_empty() {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        if let Some(&g) = module.globals.get(name) {
            return Ok((g, GLOBAL_SIZE));
        }
        let ctx = module.ctx;
        let cur = Self::live_ctx(&t, ctx)?;
        let g = self.alloc_in(&mut t, &cur, GLOBAL_SIZE, 0, AllocKind::Global, false)?;
        t.modules
            .get_mut(&m)
            .expect("checked")
            .globals
            .insert(name.to_string(), g);
        Ok((g, GLOBAL_SIZE))
    }

    /// Every library load (libraries are context-independent).
    pub fn library_load(&self, src: ImageSource) -> R<u64> {
        self.check()?;
        if let ImageSource::File(path) = &src {
            if !path.is_file() {
                return Err(CUDA_ERROR_FILE_NOT_FOUND);
            }
        }
        // SAFETY: the source comes from the caller with the CUDA API's guarantees.
        let image = unsafe { classify(&src) }?;
        // A library goes into every context; its code is checked against the current one's
        // device now and against each context's at its first launch there.
        let sm = self.current_sm();
        // SAFETY: as for `classify` above.
        let info = unsafe { super::driver_memory::image_info(&src, sm) };
        if let Ok(cur) = self.current() {
            self.code_runs_on(&info, cur.dev)?;
        }
        let mut t = self.lock();
        let h = t.handle(kind::LIBRARY);
        t.libraries.insert(
            h,
            Library {
                kernels: HashMap::new(),
                timing: image.timing(),
                modules: HashMap::new(),
            },
        );
        drop(t);
        self.attach_library(h, info)?;
        Ok(h)
    }

    pub fn library_unload(&self, l: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        let lib = t.libraries.remove(&l).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.library_image_gone(&mut t, l);
        for k in lib.kernels.values() {
            if let Some(kernel) = t.kernels.remove(k) {
                for f in kernel.funcs.values() {
                    t.functions.remove(f);
                }
            }
        }
        Ok(())
    }

    pub fn library_get_kernel(&self, l: u64, name: &str) -> R<u64> {
        self.check()?;
        let mut t = self.lock();
        let lib = t.libraries.get(&l).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if name.is_empty() {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        if let Some(&k) = lib.kernels.get(name) {
            return Ok(k);
        }
        let k = t.handle(kind::KERNEL);
        t.kernels.insert(
            k,
            Kernel {
                library: l,
                name: name.to_string(),
                funcs: HashMap::new(),
            },
        );
        t.libraries
            .get_mut(&l)
            .expect("checked")
            .kernels
            .insert(name.to_string(), k);
        Ok(k)
    }

    /// The kernel's function in the current context.
    pub fn kernel_get_function(&self, k: u64) -> R<u64> {
        let cur = self.current()?;
        let mut t = self.lock();
        let kernel = t.kernels.get(&k).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(&f) = kernel.funcs.get(&cur.ctx) {
            if t.functions.contains_key(&f) {
                return Ok(f);
            }
        }
        let (name, library) = (kernel.name.clone(), kernel.library);
        // The function of a library's kernel in this context: lazy loading places the
        // library here.
        self.place_library(&mut t, library, cur.ctx)?;
        let f = t.handle(kind::FUNC);
        t.functions.insert(
            f,
            Func {
                ctx: cur.ctx,
                module: None,
                name,
            },
        );
        t.kernels
            .get_mut(&k)
            .expect("checked")
            .funcs
            .insert(cur.ctx, f);
        Ok(f)
    }

    /// The kernel name of a function or CUkernel.
    pub fn func_name(&self, f: u64) -> R<String> {
        self.check()?;
        let t = self.lock();
        if let Some(func) = t.functions.get(&f) {
            return Ok(func.name.clone());
        }
        t.kernels
            .get(&f)
            .map(|k| k.name.clone())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// A launchable handle: a live function, or a CUkernel (which 12.x accepts as one).
    pub(crate) fn check_function(t: &Tables, f: u64) -> R<()> {
        if t.functions.contains_key(&f) || t.kernels.contains_key(&f) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    }

    pub fn func_attribute(&self, attr: i32, f: u64) -> R<i32> {
        let st = self.check()?;
        let mut t = self.lock();
        Self::check_function(&t, f)?;
        let local = self.function_local_bytes(&mut t, f);
        let dev = t
            .functions
            .get(&f)
            .and_then(|func| t.contexts.get(&func.ctx))
            .map_or(0, |c| c.dev);
        let cc = st
            .device(dev)
            .map_or(70, |d| (d.cc_major * 10 + d.cc_minor) as i32);
        Ok(match attr {
            0 => 1024,                              // MAX_THREADS_PER_BLOCK
            1 | 2 => 0,                             // SHARED / CONST size bytes
            3 => local.min(i32::MAX as u64) as i32, // LOCAL_SIZE_BYTES
            4 => 32,                                // NUM_REGS
            5 | 6 => cc,                            // PTX_VERSION, BINARY_VERSION
            7 => 0,                                 // CACHE_MODE_CA
            8 => 48 << 10,                          // MAX_DYNAMIC_SHARED_SIZE_BYTES
            9 => -1,                                // PREFERRED_SHARED_MEMORY_CARVEOUT
            10..=15 => 0,                           // cluster attributes
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn image_formats_decide_how_kernels_take_time() {
        let fatbin = 0xba55_ed50u32.to_le_bytes();
        assert_eq!(classify_bytes(&fatbin), ImageKind::Fatbin);
        assert_eq!(classify_bytes(b"\x7fELF\x02"), ImageKind::Cubin);
        let spin = "// c\n.version 7.0\n.target sm_70\n.visible .entry spin(.param .u64 ns_per_wave)\n{}\n\
                    .visible .entry other(.param .u64 p, .param .u64 ns_per_wave)\n{}";
        let ImageKind::Ptx(entries) = classify_bytes(spin.as_bytes()) else {
            panic!("PTX")
        };
        assert_eq!(entries.ns, vec!["spin".to_string()]);
        assert_eq!(entries.wide["other"], vec![0, 1]);
        let touch = ".version 7.0\n.entry touch(.param .u64 ns_per_wave, .param .u32 n,\n                     .param .align 8 .b8 s[16], .param .u64 .ptr .global p)\n{}";
        let ImageKind::Ptx(entries) = classify_bytes(touch.as_bytes()) else {
            panic!("PTX")
        };
        assert_eq!(entries.wide["touch"], vec![0, 3], "scalars of 64 bits only");
        assert_eq!(classify_bytes(b"any bytes"), ImageKind::Raw);

        let c = driver(small_overhead());
        c.ctx_create(0, 0).unwrap();
        let header: [u32; 4] = [0xba55_ed50, 0x0010_0001, 0, 0];
        let m = c
            .module_load(ImageSource::Memory(header.as_ptr() as usize))
            .unwrap();
        let f = c.module_get_function(m, "gemm").unwrap();
        assert!(!c.reads_ns_param(f), "framework kernels: geometry timing");
        let spin_c = std::ffi::CString::new(spin).unwrap();
        let m = c
            .module_load(ImageSource::Memory(spin_c.as_ptr() as usize))
            .unwrap();
        assert!(c.reads_ns_param(c.module_get_function(m, "spin").unwrap()));
        assert!(!c.reads_ns_param(c.module_get_function(m, "other").unwrap()));
        let raw = c.module_load(raw_image()).unwrap();
        assert!(c.reads_ns_param(c.module_get_function(raw, "k").unwrap()));
        let l = c
            .library_load(ImageSource::Memory(header.as_ptr() as usize))
            .unwrap();
        let k = c.library_get_kernel(l, "k").unwrap();
        assert!(!c.reads_ns_param(k));
        assert!(!c.reads_ns_param(c.kernel_get_function(k).unwrap()));
        assert_eq!(
            c.module_load(ImageSource::FatbinWrapper(header.as_ptr() as usize)),
            Err(CUDA_ERROR_INVALID_IMAGE),
            "a header is not a wrapper"
        );
        assert_eq!(
            c.module_load(ImageSource::Memory(0)),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn an_image_without_code_for_the_card_does_not_load_there() {
        use super::super::image::tests::code_fatbin;
        // Machine code for 7.5 and 9.0 only (PyTorch's kind): the V100 (device 0) has none.
        let torch = code_fatbin(&[(2, 75, 0), (2, 90, 0)]);
        let src = || ImageSource::Memory(torch.as_ptr() as usize);
        let c = driver(small_overhead());
        let v100 = c.ctx_create(0, 0).unwrap();
        let before = c.check().unwrap().used_memory(0);
        assert_eq!(c.module_load(src()), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        assert_eq!(c.library_load(src()), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        assert_eq!(c.check().unwrap().used_memory(0), before, "nothing placed");
        // The H200 (device 1) runs it.
        let h200 = c.ctx_create(0, 1).unwrap();
        let m = c.module_load(src()).unwrap();
        let f = c.module_get_function(m, "k").unwrap();
        c.launch(f, [1, 1, 1], [1, 1, 1], None, 0).unwrap();
        // A library loaded there goes into no V100 context: its first use there fails.
        let l = c.library_load(src()).unwrap();
        let k = c.library_get_kernel(l, "k").unwrap();
        c.launch(k, [1, 1, 1], [1, 1, 1], None, 0).unwrap();
        c.ctx_set_current(v100).unwrap();
        assert_eq!(c.kernel_get_function(k), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        // PTX for compute_70 runs on both.
        let ptx = std::ffi::CString::new(".version 7.0\n.target sm_70\n.entry k()\n{}\n").unwrap();
        c.module_load(ImageSource::Memory(ptx.as_ptr() as usize))
            .unwrap();
        c.ctx_set_current(h200).unwrap();
        c.module_load(ImageSource::Memory(ptx.as_ptr() as usize))
            .unwrap();
    }

    #[test]
    fn modules_and_libraries() {
        let c = driver(small_overhead());
        assert_eq!(c.module_load(raw_image()), Err(CUDA_ERROR_INVALID_CONTEXT));
        c.ctx_create(0, 0).unwrap();
        let m = c.module_load(raw_image()).unwrap();
        let f = c.module_get_function(m, "spin").unwrap();
        assert_eq!(c.module_get_function(m, "spin").unwrap(), f);
        assert_eq!(c.module_get_function(m, ""), Err(CUDA_ERROR_NOT_FOUND));
        let (g, size) = c.module_get_global(m, "counter").unwrap();
        assert_eq!(size, GLOBAL_SIZE);
        let used = c.check().unwrap().used_memory(0);
        assert_eq!(used, 10 << 20, "globals are not charged");
        assert_eq!(c.module_get_global(m, "counter").unwrap().0, g);
        assert_eq!(c.func_attribute(4, f).unwrap(), 32);
        assert_eq!(c.func_attribute(99, f), Err(CUDA_ERROR_INVALID_VALUE));
        c.module_unload(m).unwrap();
        assert_eq!(c.func_attribute(4, f), Err(CUDA_ERROR_INVALID_HANDLE));
        assert_eq!(c.module_unload(m), Err(CUDA_ERROR_INVALID_HANDLE));
        let l = c.library_load(raw_image()).unwrap();
        let k = c.library_get_kernel(l, "k").unwrap();
        let kf = c.kernel_get_function(k).unwrap();
        assert_eq!(c.kernel_get_function(k).unwrap(), kf);
        c.library_unload(l).unwrap();
        assert_eq!(c.kernel_get_function(k), Err(CUDA_ERROR_INVALID_HANDLE));
        assert_eq!(
            c.module_load_file(std::path::Path::new("/nonexistent")),
            Err(CUDA_ERROR_FILE_NOT_FOUND)
        );
    }
}
