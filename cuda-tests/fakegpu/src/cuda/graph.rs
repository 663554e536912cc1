//! CUDA graphs: explicit kernel nodes, stream capture, instantiation and launch. A graph is a
//! list of kernels; launching an executable graph enqueues them in order on the stream (the
//! fake ignores dependency edges: the device timeline runs one kernel at a time anyway).

use super::{kind, Cuda, R};
use gpuslice_abi::cuda::flags::*;
use gpuslice_abi::cuda::result::*;

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
}

pub struct Exec {
    pub nodes: Vec<KernelNode>,
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
        let nodes = t
            .graphs
            .get(&graph)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .nodes
            .clone();
        let h = t.handle(kind::EXEC);
        t.execs.insert(h, Exec { nodes });
        Ok(h)
    }

    pub fn graph_launch(&self, exec: u64, stream: u64) -> R<()> {
        let info = self.stream_info(stream)?;
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

    pub fn graph_exec_destroy(&self, exec: u64) -> R<()> {
        self.check()?;
        self.lock()
            .execs
            .remove(&exec)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
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
            .module_get_function(c.module_load(true).unwrap(), "k")
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
}
