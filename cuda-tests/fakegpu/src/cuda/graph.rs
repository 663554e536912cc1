//! CUDA graphs: explicit kernel nodes, stream capture, instantiation and launch. A graph is a
//! list of kernels; launching an executable graph enqueues them in order on the stream (the
//! fake ignores dependency edges: the device timeline runs one kernel at a time anyway).
//!
//! **Graph memory** (minimal, after the driver's documented model). `cuMemAllocAsync` /
//! `cuMemAllocFromPoolAsync` on a capturing stream "results in the creation of an allocation
//! node ... owned by the graph instead of the memory pool": the fake records an alloc node,
//! hands out a virtual address reserved for the graph (no physical charge), and
//! `cuMemFreeAsync` of such an address on a capturing stream records a free node (freeing
//! anything else during capture is `CUDA_ERROR_INVALID_VALUE`). Instantiating records the
//! graph's peak need (the largest sum of live allocations along the capture order; nodes
//! never freed in the graph count to the end). Physical memory lives in a per-device graph
//! memory pool: `cuGraphUpload`, or the first `cuGraphLaunch` of an exec not uploaded yet,
//! reserves the exec's need there (reusing what the pool holds unused first; the rest is
//! charged to the process, `CUDA_ERROR_OUT_OF_MEMORY` if the card is full, and the launch
//! then runs nothing), and the exec keeps it across launches. `cuGraphExecDestroy` makes the
//! exec's share unused but still reserved; `cuDeviceGraphMemTrim` gives back what no live
//! exec holds. `cuDeviceGetGraphMemAttribute` reports USED (held by live execs) and RESERVED
//! (held by the pool), current and high. Not modelled: sharing of physical memory between
//! execs (each holds its own need), `cuGraphAddMemAllocNode` / `cuGraphAddMemFreeNode`
//! (`CUDA_ERROR_NOT_SUPPORTED`: capture covers the path), release at a context's end.

use super::{kind, round_up, Cuda, ALLOC_GRANULARITY, R};
use gpuslice_abi::cuda::flags::*;
use gpuslice_abi::cuda::result::*;

/// `CUgraphMem_attribute` values.
pub mod graph_mem_attr {
    pub const USED_MEM_CURRENT: i32 = 0;
    pub const USED_MEM_HIGH: i32 = 1;
    pub const RESERVED_MEM_CURRENT: i32 = 2;
    pub const RESERVED_MEM_HIGH: i32 = 3;
}

/// One memory node of a graph, in capture order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemNode {
    Alloc { addr: u64, bytes: u64 },
    Free { addr: u64 },
}

/// The physical memory a graph's memory nodes need at once: the peak of the running sum.
pub fn peak_need(nodes: &[MemNode]) -> u64 {
    let mut live: Vec<(u64, u64)> = Vec::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for node in nodes {
        match *node {
            MemNode::Alloc { addr, bytes } => {
                live.push((addr, bytes));
                now += bytes;
                peak = peak.max(now);
            }
            MemNode::Free { addr } => {
                if let Some(i) = live.iter().position(|&(a, _)| a == addr) {
                    now -= live.swap_remove(i).1;
                }
            }
        }
    }
    peak
}

/// A device's graph memory pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphPool {
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct KernelNode {
    pub func: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub ns_per_wave: Option<u64>,
}

#[derive(Default)]
pub struct Graph {
    pub nodes: Vec<KernelNode>,
    pub mem: Vec<MemNode>,
    /// The device of its memory nodes.
    pub mem_dev: u32,
}

pub struct Exec {
    pub nodes: Vec<KernelNode>,
    pub dev: u32,
    /// Physical bytes its memory nodes need (reserved in the graph pool when uploaded).
    pub need: u64,
    /// Whether `need` is reserved in the device's graph pool for it.
    pub held: bool,
}

impl Cuda {
    pub fn graph_create(&self, flags: u32) -> R<u64> {
        self.check()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let h = t.handle(kind::GRAPH);
        t.graphs.insert(h, Graph::default());
        Ok(h)
    }

    /// Appends a kernel node; returns its node handle.
    pub fn graph_add_kernel(
        &self,
        graph: u64,
        func: u64,
        grid: [u32; 3],
        block: [u32; 3],
        ns_per_wave: Option<u64>,
    ) -> R<()> {
        self.graph_add_kernel_node(graph, func, grid, block, ns_per_wave)
            .map(|_| ())
    }

    pub fn graph_add_kernel_node(
        &self,
        graph: u64,
        func: u64,
        grid: [u32; 3],
        block: [u32; 3],
        ns_per_wave: Option<u64>,
    ) -> R<u64> {
        self.check()?;
        super::launch::check_dims(grid, block)?;
        let mut t = self.lock();
        Self::check_function(&t, func)?;
        let node = t.handle(kind::NODE);
        let g = t.graphs.get_mut(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        g.nodes.push(KernelNode {
            func,
            grid,
            block,
            ns_per_wave,
        });
        Ok(node)
    }

    pub fn graph_instantiate(&self, graph: u64, flags: u64) -> R<u64> {
        self.check()?;
        // AUTO_FREE_ON_LAUNCH 1, UPLOAD 2, DEVICE_LAUNCH 4, USE_NODE_PRIORITY 8.
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let g = t.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let exec = Exec {
            nodes: g.nodes.clone(),
            dev: g.mem_dev,
            need: peak_need(&g.mem),
            held: false,
        };
        let h = t.handle(kind::EXEC);
        t.execs.insert(h, exec);
        Ok(h)
    }

    /// Reserves an exec's memory in its device's graph pool unless it holds it already:
    /// unused reserved memory first, the rest charged to the card.
    fn reserve_graph_memory(&self, exec: u64) -> R<()> {
        let st = self.check()?;
        let mut t = self.lock();
        let e = t.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if e.held || e.need == 0 {
            return Ok(());
        }
        let (dev, need) = (e.dev, e.need);
        let pool = &mut t.graph_pools[dev as usize];
        let grow = need.saturating_sub(pool.reserved - pool.used);
        if grow > 0 && !st.try_charge(dev, self.slot(), grow) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        pool.reserved += grow;
        pool.used += need;
        pool.reserved_high = pool.reserved_high.max(pool.reserved);
        pool.used_high = pool.used_high.max(pool.used);
        t.execs.get_mut(&exec).expect("looked up above").held = true;
        Ok(())
    }

    /// `cuGraphUpload`: the exec's memory is reserved now rather than at its first launch.
    pub fn graph_upload(&self, exec: u64, stream: u64) -> R<()> {
        self.stream_info(stream)?;
        self.reserve_graph_memory(exec)
    }

    /// `cuDeviceGraphMemTrim`: the graph pool gives back what no live exec holds.
    pub fn device_graph_mem_trim(&self, dev: i32) -> R<()> {
        let dev = self.device_index(dev)?;
        let st = self.check()?;
        let mut t = self.lock();
        let pool = &mut t.graph_pools[dev as usize];
        let release = pool.reserved - pool.used;
        if release > 0 {
            pool.reserved = pool.used;
            st.uncharge(dev, self.slot(), release);
        }
        Ok(())
    }

    /// `cuDeviceGetGraphMemAttribute`.
    pub fn device_graph_mem_attribute(&self, dev: i32, attr: i32) -> R<u64> {
        let dev = self.device_index(dev)?;
        let pool = self.lock().graph_pools[dev as usize];
        Ok(match attr {
            graph_mem_attr::USED_MEM_CURRENT => pool.used,
            graph_mem_attr::USED_MEM_HIGH => pool.used_high,
            graph_mem_attr::RESERVED_MEM_CURRENT => pool.reserved,
            graph_mem_attr::RESERVED_MEM_HIGH => pool.reserved_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemAllocAsync` on a capturing stream: an alloc node of `graph`, owning a virtual
    /// address reserved for the graph; nothing is charged until the graph is uploaded.
    pub(crate) fn capture_alloc(
        &self,
        graph: u64,
        cur: &super::context::Current,
        size: u64,
    ) -> R<u64> {
        let mut t = self.lock();
        if !t.graphs.contains_key(&graph) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        let addr = self.alloc_in(
            &mut t,
            cur,
            size,
            0,
            super::memory::AllocKind::Graph(graph),
            false,
        )?;
        let g = t.graphs.get_mut(&graph).expect("checked above");
        g.mem_dev = cur.dev;
        g.mem.push(MemNode::Alloc {
            addr,
            bytes: round_up(size, ALLOC_GRANULARITY),
        });
        Ok(addr)
    }

    /// `cuMemFreeAsync` on a capturing stream: a free node; only the graph's own allocations
    /// can be freed in it. The address stays reserved for the graph.
    pub(crate) fn capture_free(&self, graph: u64, ptr: u64) -> R<()> {
        let mut t = self.lock();
        match t.allocs.get(&ptr) {
            Some(a) if a.kind == super::memory::AllocKind::Graph(graph) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        let g = t.graphs.get_mut(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let freed = g
            .mem
            .iter()
            .filter(|n| **n == MemNode::Free { addr: ptr })
            .count();
        let allocated = g
            .mem
            .iter()
            .filter(|n| matches!(n, MemNode::Alloc { addr, .. } if *addr == ptr))
            .count();
        if freed >= allocated {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        g.mem.push(MemNode::Free { addr: ptr });
        Ok(())
    }

    pub fn graph_launch(&self, exec: u64, stream: u64) -> R<()> {
        let info = self.stream_info(stream)?;
        self.reserve_graph_memory(exec)?;
        let nodes = self
            .lock()
            .execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .nodes
            .clone();
        for n in nodes {
            self.launch(
                n.func,
                n.grid,
                n.block,
                n.ns_per_wave,
                info.handle.unwrap_or(stream),
            )?;
        }
        Ok(())
    }

    /// The exec's graph memory stays reserved in the pool, unused, until a trim.
    pub fn graph_exec_destroy(&self, exec: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        let e = t.execs.remove(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if e.held {
            let pool = &mut t.graph_pools[e.dev as usize];
            pool.used = pool.used.saturating_sub(e.need);
        }
        Ok(())
    }

    pub fn graph_destroy(&self, graph: u64) -> R<()> {
        self.check()?;
        self.lock()
            .graphs
            .remove(&graph)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    pub fn stream_begin_capture(&self, stream: u64, mode: u32) -> R<()> {
        let info = self.stream_info(stream)?;
        if mode > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let Some(s) = info.handle else {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        };
        if info.capture.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        let graph = self.graph_create(0)?;
        if let Some(st) = self.lock().streams.get_mut(&s) {
            st.capture = Some(graph);
        }
        Ok(())
    }

    pub fn stream_end_capture(&self, stream: u64) -> R<u64> {
        let info = self.stream_info(stream)?;
        let (Some(s), Some(graph)) = (info.handle, info.capture) else {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        };
        if let Some(st) = self.lock().streams.get_mut(&s) {
            st.capture = None;
        }
        Ok(graph)
    }

    pub fn stream_is_capturing(&self, stream: u64) -> R<u32> {
        let info = self.stream_info(stream)?;
        Ok(if info.capture.is_some() {
            CU_STREAM_CAPTURE_STATUS_ACTIVE
        } else {
            CU_STREAM_CAPTURE_STATUS_NONE
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::state::now_ns;

    #[test]
    fn capture_records_and_launch_replays() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let f = c
            .module_get_function(c.module_load(raw_image()).unwrap(), "k")
            .unwrap();
        let s = c.stream_create(1, 0).unwrap();
        assert_eq!(
            c.stream_begin_capture(0, 0),
            Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        );
        c.stream_begin_capture(s, 0).unwrap();
        assert_eq!(
            c.stream_is_capturing(s).unwrap(),
            CU_STREAM_CAPTURE_STATUS_ACTIVE
        );
        assert_eq!(c.stream_begin_capture(s, 0), Err(CUDA_ERROR_ILLEGAL_STATE));
        let before = st.busy_until(0);
        for _ in 0..3 {
            c.launch(f, [1, 1, 1], [32, 1, 1], Some(1_000_000), s)
                .unwrap();
        }
        assert_eq!(st.busy_until(0), before, "captured, not run");
        let g = c.stream_end_capture(s).unwrap();
        assert_eq!(
            c.stream_is_capturing(s).unwrap(),
            CU_STREAM_CAPTURE_STATUS_NONE
        );
        c.graph_add_kernel_node(g, f, [1, 1, 1], [32, 1, 1], Some(1_000_000))
            .unwrap();
        let e = c.graph_instantiate(g, 0).unwrap();
        let t0 = now_ns();
        c.graph_launch(e, s).unwrap();
        assert!(st.busy_until(0) >= t0 + 4_000_000, "four kernels enqueued");
        c.stream_synchronize(s).unwrap();
        assert!(now_ns() >= t0 + 4_000_000);
        c.graph_exec_destroy(e).unwrap();
        c.graph_destroy(g).unwrap();
        assert_eq!(c.graph_launch(e, s), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(c.stream_end_capture(s), Err(CUDA_ERROR_ILLEGAL_STATE));
    }

    #[test]
    fn peak_need_follows_the_capture_order() {
        let a = |addr, bytes| MemNode::Alloc { addr, bytes };
        let f = |addr| MemNode::Free { addr };
        assert_eq!(peak_need(&[]), 0);
        assert_eq!(peak_need(&[a(1, 4), f(1), a(2, 6), f(2)]), 6);
        assert_eq!(peak_need(&[a(1, 4), a(2, 6), f(1), f(2)]), 10);
        assert_eq!(
            peak_need(&[a(1, 4), f(1), a(2, 2)]),
            4,
            "unfreed counts too"
        );
    }

    #[test]
    fn captured_allocations_are_charged_when_the_graph_is_uploaded_and_trimmed_after_destroy() {
        use graph_mem_attr::*;
        const MIB: u64 = 1 << 20;
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        let f = c
            .module_get_function(c.module_load(raw_image()).unwrap(), "k")
            .unwrap();
        let s = c.stream_create(1, 0).unwrap();
        let outside = c.mem_alloc_async(MIB, None, s).unwrap();
        let pool_before = st.used_memory(0);
        c.stream_begin_capture(s, 0).unwrap();
        let p = c.mem_alloc_async(100 * MIB, None, s).unwrap();
        c.launch(f, [1, 1, 1], [32, 1, 1], Some(1000), s).unwrap();
        assert_eq!(
            c.mem_free_async(outside, s),
            Err(CUDA_ERROR_INVALID_VALUE),
            "only the graph's own allocations are freed in it"
        );
        c.mem_free_async(p, s).unwrap();
        assert_eq!(c.mem_free_async(p, s), Err(CUDA_ERROR_INVALID_VALUE));
        let q = c.mem_alloc_async(50 * MIB, None, s).unwrap();
        c.mem_free_async(q, s).unwrap();
        let g = c.stream_end_capture(s).unwrap();
        assert_eq!(st.used_memory(0), pool_before, "nothing charged at capture");
        let e = c.graph_instantiate(g, 0).unwrap();
        assert_eq!(st.used_memory(0), pool_before, "nor at instantiation");
        assert_eq!(c.device_graph_mem_attribute(0, RESERVED_MEM_CURRENT), Ok(0));
        c.graph_launch(e, s).unwrap();
        assert_eq!(st.used_memory(0), pool_before + 100 * MIB, "the peak need");
        c.graph_launch(e, s).unwrap();
        assert_eq!(
            st.used_memory(0),
            pool_before + 100 * MIB,
            "kept, not added"
        );
        assert_eq!(
            c.device_graph_mem_attribute(0, RESERVED_MEM_CURRENT),
            Ok(100 * MIB)
        );
        assert_eq!(
            c.device_graph_mem_attribute(0, USED_MEM_CURRENT),
            Ok(100 * MIB)
        );
        // A second exec of the same graph, uploaded explicitly: its own share.
        let e2 = c.graph_instantiate(g, 0).unwrap();
        c.graph_upload(e2, s).unwrap();
        assert_eq!(st.used_memory(0), pool_before + 200 * MIB);
        c.graph_exec_destroy(e).unwrap();
        assert_eq!(
            st.used_memory(0),
            pool_before + 200 * MIB,
            "reserved until trimmed"
        );
        assert_eq!(
            c.device_graph_mem_attribute(0, USED_MEM_CURRENT),
            Ok(100 * MIB)
        );
        // A new exec reuses the unused reservation.
        let e3 = c.graph_instantiate(g, 0).unwrap();
        c.graph_launch(e3, s).unwrap();
        assert_eq!(st.used_memory(0), pool_before + 200 * MIB);
        c.graph_exec_destroy(e3).unwrap();
        c.device_graph_mem_trim(0).unwrap();
        assert_eq!(
            st.used_memory(0),
            pool_before + 100 * MIB,
            "e2 still holds its share"
        );
        assert_eq!(
            c.device_graph_mem_attribute(0, RESERVED_MEM_HIGH),
            Ok(200 * MIB)
        );
        assert_eq!(
            c.device_graph_mem_attribute(0, USED_MEM_HIGH),
            Ok(200 * MIB)
        );
        assert_eq!(
            c.device_graph_mem_attribute(0, 9),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        c.graph_exec_destroy(e2).unwrap();
        c.device_graph_mem_trim(0).unwrap();
        assert_eq!(st.used_memory(0), pool_before);
        assert_eq!(c.device_graph_mem_attribute(0, RESERVED_MEM_CURRENT), Ok(0));
        // The graph's addresses can be freed outside it: nothing physical changes.
        c.mem_free_async(p, s).unwrap();
        c.mem_free_async(outside, s).unwrap();
        c.stream_synchronize(s).unwrap();
        assert_eq!(st.used_memory(0), base);
        c.graph_destroy(g).unwrap();
    }

    #[test]
    fn a_graph_whose_memory_does_not_fit_fails_its_launch_and_runs_nothing() {
        const MIB: u64 = 1 << 20;
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let f = c
            .module_get_function(c.module_load(raw_image()).unwrap(), "k")
            .unwrap();
        let s = c.stream_create(1, 0).unwrap();
        c.stream_begin_capture(s, 0).unwrap();
        // More than the 1 GiB card holds: capture takes nothing.
        let p = c.mem_alloc_async(2048 * MIB, None, s).unwrap();
        c.launch(f, [1, 1, 1], [32, 1, 1], Some(1_000_000_000), s)
            .unwrap();
        c.mem_free_async(p, s).unwrap();
        let g = c.stream_end_capture(s).unwrap();
        let e = c.graph_instantiate(g, 0).unwrap();
        let used = st.used_memory(0);
        let busy = st.busy_until(0);
        assert_eq!(c.graph_upload(e, s), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(c.graph_launch(e, s), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(st.used_memory(0), used);
        assert_eq!(st.busy_until(0), busy, "no kernel ran");
    }
}
