//! Modules, libraries, kernels and functions. Any bytes form a module and any non-empty name
//! is a kernel (or a 256-byte global): the fake runs no code, it only models time and memory.
//! Module images and globals cost no device memory.

use super::memory::AllocKind;
use super::{kind, Cuda, Tables, R};
use gpuslice_abi::cuda::result::*;
use std::collections::HashMap;

pub struct Module {
    pub ctx: u64,
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
}

pub struct Kernel {
    pub library: u64,
    pub name: String,
    /// Function handle per context.
    pub funcs: HashMap<u64, u64>,
}

pub const GLOBAL_SIZE: u64 = 256;

impl Cuda {
    pub fn module_load(&self, image_present: bool) -> R<u64> {
        let cur = self.current()?;
        if !image_present {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let h = t.handle(kind::MODULE);
        t.modules.insert(
            h,
            Module {
                ctx: cur.ctx,
                funcs: HashMap::new(),
                globals: HashMap::new(),
            },
        );
        Ok(h)
    }

    pub fn module_load_file(&self, path: &std::path::Path) -> R<u64> {
        self.current()?;
        if !path.is_file() {
            return Err(CUDA_ERROR_FILE_NOT_FOUND);
        }
        self.module_load(true)
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
        self.module_data_needed(&mut t, m)?;
        let cur = Self::live_ctx(&t, ctx)?;
        let g = self.alloc_in(&mut t, &cur, GLOBAL_SIZE, 0, AllocKind::Global, false)?;
        t.modules
            .get_mut(&m)
            .expect("checked")
            .globals
            .insert(name.to_string(), g);
        Ok((g, GLOBAL_SIZE))
    }

    /// Libraries are context-independent.
    pub fn library_load(&self, code_present: bool) -> R<u64> {
        self.check()?;
        if !code_present {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let h = t.handle(kind::LIBRARY);
        t.libraries.insert(
            h,
            Library {
                kernels: HashMap::new(),
            },
        );
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
        let name = kernel.name.clone();
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
    fn modules_and_libraries() {
        let c = driver(small_overhead());
        assert_eq!(c.module_load(true), Err(CUDA_ERROR_INVALID_CONTEXT));
        c.ctx_create(0, 0).unwrap();
        let m = c.module_load(true).unwrap();
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
        let l = c.library_load(true).unwrap();
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
