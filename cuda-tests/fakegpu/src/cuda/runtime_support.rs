//! Queries and small operations the CUDA runtime and the frameworks on it (PyTorch, CuPy,
//! cuBLAS) make on their common paths: context and stream properties, pointer attributes,
//! host registration, libraries seen as modules, and the linker. Each answers as the driver
//! API documents for a single-GPU process without peer access.

use super::memory::AllocKind;
use super::module::{ImageSource, Module};
use super::stream::is_default_stream;
use super::{kind, Cuda, R};
use gpuslice_abi::cuda::result::*;
use std::collections::HashMap;

/// What `cuPointerGetAttribute(s)` reports about an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    pub ctx: u64,
    pub dev: u32,
    /// CU_MEMORYTYPE_HOST (1) or CU_MEMORYTYPE_DEVICE (2).
    pub memory_type: u32,
    pub managed: bool,
    pub base: u64,
    pub size: u64,
    /// A stable id per allocation (its base address).
    pub buffer_id: u64,
    /// The memory pool a stream-ordered allocation came from.
    pub pool: Option<u64>,
}

pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// Stream properties: (flags, priority, id, context, device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamProps {
    pub flags: u32,
    pub priority: i32,
    pub id: u64,
    pub ctx: u64,
    pub dev: u32,
}

impl Cuda {
    /// The current context's creation flags.
    pub fn ctx_flags(&self) -> R<u32> {
        let cur = self.current()?;
        Ok(self.lock().contexts.get(&cur.ctx).map_or(0, |c| c.flags))
    }

    /// A unique id of a context (null: the current one): its handle's sequence number.
    pub fn ctx_id(&self, ctx: u64) -> R<u64> {
        let ctx = if ctx == 0 {
            self.current()?.ctx
        } else {
            self.check()?;
            Self::live_ctx(&self.lock(), ctx)?.ctx
        };
        Ok(ctx & ((1 << 40) - 1))
    }

    pub fn stream_props(&self, stream: u64) -> R<StreamProps> {
        let info = self.stream_info(stream)?;
        let t = self.lock();
        let (flags, priority) = info
            .handle
            .and_then(|h| t.streams.get(&h))
            .map_or((0, 0), |s| (s.flags, s.priority));
        // Default streams: the legacy stream is id 1, the per-thread one 2 (NULL is legacy).
        let id = match info.handle {
            Some(h) => h & ((1 << 40) - 1) | (1 << 32),
            None if stream == 2 => 2,
            None => 1,
        };
        Ok(StreamProps {
            flags,
            priority,
            id,
            ctx: info.cur.ctx,
            dev: info.cur.dev,
        })
    }

    /// What is known about `ptr`: device allocations (plain, managed, pool, VMM mappings),
    /// page-locked host memory from `cuMemAllocHost`/`cuMemHostAlloc`/`cuMemHostRegister`.
    /// None for anything else.
    pub fn pointer_info(&self, ptr: u64) -> R<Option<PointerInfo>> {
        self.check()?;
        let t = self.lock();
        if let Some((&base, a)) = t.allocs.range(..=ptr).next_back() {
            if ptr < base + a.size.max(1) {
                return Ok(Some(PointerInfo {
                    ctx: a.ctx,
                    dev: a.dev,
                    memory_type: CU_MEMORYTYPE_DEVICE,
                    managed: matches!(a.kind, AllocKind::Managed),
                    base,
                    size: a.size,
                    buffer_id: base,
                    pool: match a.kind {
                        AllocKind::Pool(p) => Some(p),
                        _ => None,
                    },
                }));
            }
        }
        if let Some((base, size)) = t.vmm.mapped_range(ptr) {
            let dev = t
                .vmm
                .maps
                .get(&base)
                .and_then(|m| t.vmm.handles.get(&m.handle))
                .map_or(0, |h| h.dev);
            let ctx = t.primary[dev as usize].unwrap_or(0);
            return Ok(Some(PointerInfo {
                ctx,
                dev,
                memory_type: CU_MEMORYTYPE_DEVICE,
                managed: false,
                base,
                size,
                buffer_id: base,
                pool: None,
            }));
        }
        let host = t
            .host
            .iter()
            .chain(t.host_registered.iter())
            .find(|(&b, &s)| ptr as usize >= b && (ptr as usize) < b + s.max(1));
        if let Some((&b, &s)) = host {
            let cur = super::with_stack(|s| s.last().copied()).unwrap_or(0);
            let dev = t.contexts.get(&cur).map_or(0, |c| c.dev);
            return Ok(Some(PointerInfo {
                ctx: cur,
                dev,
                memory_type: CU_MEMORYTYPE_HOST,
                managed: false,
                base: b as u64,
                size: s as u64,
                buffer_id: b as u64,
                pool: None,
            }));
        }
        Ok(None)
    }

    /// `cuMemHostRegister`: page-locks (here: records) `[ptr, ptr + size)`.
    pub fn host_register(&self, ptr: u64, size: u64) -> R<()> {
        self.current()?;
        if ptr == 0 || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let (p, s) = (ptr as usize, size as usize);
        let overlaps = |(&b, &n): (&usize, &usize)| p < b + n && b < p + s;
        if t.host_registered.iter().any(overlaps) || t.host.iter().any(overlaps) {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        t.host_registered.insert(p, s);
        Ok(())
    }

    pub fn host_unregister(&self, ptr: u64) -> R<()> {
        self.current()?;
        self.lock()
            .host_registered
            .remove(&(ptr as usize))
            .map(|_| ())
            .ok_or(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    }

    /// `cuLibraryGetModule`: the library as a module of the current context (one per
    /// library and context; it goes with either).
    pub fn library_get_module(&self, l: u64) -> R<u64> {
        let cur = self.current()?;
        let mut t = self.lock();
        let lib = t.libraries.get(&l).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(&m) = lib.modules.get(&cur.ctx) {
            if t.modules.contains_key(&m) {
                return Ok(m);
            }
        }
        let timing = lib.timing.clone();
        // Lazy loading places the library in this context now.
        self.place_library(&mut t, l, cur.ctx)?;
        let m = t.handle(kind::MODULE);
        t.modules.insert(
            m,
            Module {
                ctx: cur.ctx,
                timing,
                funcs: HashMap::new(),
                globals: HashMap::new(),
            },
        );
        t.libraries
            .get_mut(&l)
            .expect("checked")
            .modules
            .insert(cur.ctx, m);
        Ok(m)
    }

    /// `cuLibraryGetGlobal`: a global of the library in the current context.
    pub fn library_get_global(&self, l: u64, name: &str) -> R<(u64, u64)> {
        let m = self.library_get_module(l)?;
        self.module_get_global(m, name)
    }

    /// `cuStreamGetCaptureInfo`: (status, capture id, graph being captured).
    pub fn stream_capture_info(&self, stream: u64) -> R<(u32, u64, u64)> {
        let info = self.stream_info(stream)?;
        Ok(match info.capture {
            Some(g) => (1, g & ((1 << 40) - 1), g),
            None => (0, 0, 0),
        })
    }

    /// `cuGraphGetNodes`: a graph's nodes (kernels, then memory nodes), as handles of
    /// their own (`NODE` kind, graph and position): they name nodes for counting and
    /// identity; no per-node query takes them.
    pub fn graph_nodes(&self, graph: u64) -> R<Vec<u64>> {
        self.check()?;
        let t = self.lock();
        let g = t.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let n = (g.nodes.len() + g.mem.len()) as u64;
        let base = (kind::NODE << 40) | ((graph & 0xf_ffff) << 20);
        Ok((0..n).map(|i| base | (i & 0xf_ffff)).collect())
    }

    /// Whether a stream handle is one of the default streams (NULL, legacy, per-thread).
    pub fn is_default_stream(&self, stream: u64) -> bool {
        is_default_stream(stream)
    }
}

/// A link in progress (`cuLinkCreate` .. `cuLinkDestroy`): the inputs added, and the
/// image `cuLinkComplete` hands out (owned by the link, as the driver documents).
#[derive(Default)]
pub struct Link {
    pub inputs: usize,
    pub output: Option<Vec<u8>>,
}

/// The linked image: an ELF header, so that loading it takes the cubin path.
pub fn linked_image() -> Vec<u8> {
    let mut v = b"\x7fELF\x02\x01\x01".to_vec();
    v.resize(64, 0);
    v
}

impl Cuda {
    pub fn link_create(&self) -> R<u64> {
        self.current()?;
        let mut t = self.lock();
        let h = t.handle(kind::LINK);
        t.links.insert(h, Link::default());
        Ok(h)
    }

    /// `cuLinkAddData` / `cuLinkAddFile`: the input is checked to be readable (a file that
    /// exists, data that is not null), not linked.
    pub fn link_add(&self, link: u64, input: &ImageSource) -> R<()> {
        self.check()?;
        match input {
            ImageSource::Memory(0) | ImageSource::FatbinWrapper(0) => {
                return Err(CUDA_ERROR_INVALID_VALUE)
            }
            ImageSource::File(p) if !p.is_file() => return Err(CUDA_ERROR_FILE_NOT_FOUND),
            _ => {}
        }
        let mut t = self.lock();
        let l = t.links.get_mut(&link).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        l.inputs += 1;
        Ok(())
    }

    /// `cuLinkComplete`: (address, size) of the linked cubin, valid until `cuLinkDestroy`.
    pub fn link_complete(&self, link: u64) -> R<(u64, u64)> {
        self.check()?;
        let mut t = self.lock();
        let l = t.links.get_mut(&link).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if l.inputs == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let out = l.output.get_or_insert_with(linked_image);
        Ok((out.as_ptr() as u64, out.len() as u64))
    }

    pub fn link_destroy(&self, link: u64) -> R<()> {
        self.check()?;
        self.lock()
            .links
            .remove(&link)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn pointers_streams_and_libraries() {
        let c = driver(small_overhead());
        let ctx = c.ctx_create(4, 0).unwrap();
        assert_eq!(c.ctx_flags().unwrap(), 4);
        assert_eq!(c.ctx_id(0).unwrap(), c.ctx_id(ctx).unwrap());
        let p = c.mem_alloc(1000).unwrap();
        let info = c.pointer_info(p + 10).unwrap().unwrap();
        assert_eq!((info.base, info.size, info.memory_type), (p, 1000, 2));
        assert_eq!(info.ctx, ctx);
        assert_eq!(c.pointer_info(p + 5000).unwrap(), None);
        let mut host = vec![0u8; 4096];
        let hp = host.as_mut_ptr() as u64;
        assert_eq!(c.pointer_info(hp).unwrap(), None);
        c.host_register(hp, 4096).unwrap();
        assert_eq!(
            c.host_register(hp + 8, 8),
            Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        );
        assert_eq!(c.pointer_info(hp + 1).unwrap().unwrap().memory_type, 1);
        c.host_unregister(hp).unwrap();
        assert_eq!(
            c.host_unregister(hp),
            Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        );
        let s = c.stream_create(1, -3).unwrap();
        let props = c.stream_props(s).unwrap();
        assert_eq!((props.flags, props.priority, props.ctx), (1, -3, ctx));
        assert_ne!(props.id, c.stream_props(0).unwrap().id);
        assert_eq!(c.stream_capture_info(s).unwrap(), (0, 0, 0));
        c.stream_begin_capture(s, 0).unwrap();
        let (status, id, g) = c.stream_capture_info(s).unwrap();
        assert_eq!(status, 1);
        assert_ne!(id, 0);
        assert_eq!(c.stream_end_capture(s).unwrap(), g);
        let l = c.library_load(raw_image()).unwrap();
        let m = c.library_get_module(l).unwrap();
        assert_eq!(c.library_get_module(l).unwrap(), m);
        c.module_get_function(m, "k").unwrap();
        let (g, size) = c.library_get_global(l, "x").unwrap();
        assert!(g != 0 && size > 0);
        let link = c.link_create().unwrap();
        assert_eq!(c.link_complete(link), Err(CUDA_ERROR_INVALID_VALUE));
        c.link_add(link, &raw_image()).unwrap();
        let (img, n) = c.link_complete(link).unwrap();
        assert!(n >= 4);
        let m = c.module_load(ImageSource::Memory(img as usize)).unwrap();
        let f = c.module_get_function(m, "k").unwrap();
        assert!(
            !c.reads_ns_param(f),
            "linked images are cubins: geometry timing"
        );
        c.link_destroy(link).unwrap();
        assert_eq!(c.link_destroy(link), Err(CUDA_ERROR_INVALID_HANDLE));
    }
}
