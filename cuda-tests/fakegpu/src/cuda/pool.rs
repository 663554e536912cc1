//! Stream-ordered allocation and memory pools (cuMemAllocAsync, cuMemPool*).
//!
//! The model of the real allocator: a pool holds RESERVED physical memory, of which USED is
//! handed out. An allocation takes reserved-but-unused bytes first and only charges the card
//! for the rest; a free returns bytes to the pool, which keeps them reserved (still physically
//! in use). Reserved memory above the pool's RELEASE_THRESHOLD (default 0) goes back to the
//! card at the next synchronisation point (stream, event or context synchronize), and
//! cuMemPoolTrimTo releases down to max(minBytesToKeep, used) at once. Sizes are rounded to
//! 2 MiB like every device allocation. Stream order is not modelled: memory freed with
//! cuMemFreeAsync is reusable immediately.
//!
//! A pool takes memory from the card in whole OS allocations ("The OS allocations may happen
//! at different granularity from the user allocations", cuMemPoolTrimTo): `FAKEGPU_POOL_CHUNK`
//! bytes (default and minimum 2 MiB, rounded up to 2 MiB), so a pool may grow by more than a
//! request; releases keep `max(target, used)` rounded up to a chunk.
//!
//! A destroyed pool's handle is invalid at once for every call (attributes, trim, allocation),
//! while its memory stays until its last allocation is freed ("the resources associated with
//! the pool will be released automatically once there are no more outstanding allocations").
//! The driver API promises nothing about using the handle after cuMemPoolDestroy, so the fake
//! takes the strictest reading.

use super::memory::AllocKind;
use super::{kind, round_up, Cuda, Tables, ALLOC_GRANULARITY, R};
use gpuslice_abi::cuda::pool_attr::*;
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::vmm::{CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE};
use gpuslice_abi::cuda::CUmemPoolProps;

#[derive(Debug, Default)]
pub struct Pool {
    pub dev: u32,
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub threshold: u64,
    pub is_default: bool,
    /// Destroyed with allocations outstanding: goes away when they are freed.
    pub destroyed: bool,
    pub reuse: [u64; 3],
    /// Size of the pool's OS allocations: it grows and releases in whole chunks.
    pub chunk: u64,
}

/// Environment variable: the size of a pool's OS allocations, in bytes.
pub const POOL_CHUNK_ENV: &str = "FAKEGPU_POOL_CHUNK";

/// `FAKEGPU_POOL_CHUNK` rounded up to the allocation granularity (default: the granularity).
fn pool_chunk() -> u64 {
    std::env::var(POOL_CHUNK_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(ALLOC_GRANULARITY, |c| round_up(c.max(1), ALLOC_GRANULARITY))
}

impl Pool {
    fn new(dev: u32, is_default: bool) -> Pool {
        Pool {
            dev,
            is_default,
            reuse: [1, 1, 1],
            chunk: pool_chunk(),
            ..Pool::default()
        }
    }
}

impl Cuda {
    fn default_pool_of(t: &mut Tables, dev: u32) -> u64 {
        if let Some(p) = t.default_pool[dev as usize] {
            return p;
        }
        let h = t.handle(kind::POOL);
        t.pools.insert(h, Pool::new(dev, true));
        t.default_pool[dev as usize] = Some(h);
        h
    }

    pub fn device_default_pool(&self, dev: i32) -> R<u64> {
        let dev = self.device_index(dev)?;
        Ok(Self::default_pool_of(&mut self.lock(), dev))
    }

    pub fn device_get_pool(&self, dev: i32) -> R<u64> {
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        match t.current_pool[dev as usize] {
            Some(p) => Ok(p),
            None => Ok(Self::default_pool_of(&mut t, dev)),
        }
    }

    pub fn device_set_pool(&self, dev: i32, pool: u64) -> R<()> {
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        match t.pools.get(&pool) {
            Some(p) if p.dev == dev && !p.destroyed => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        t.current_pool[dev as usize] = Some(pool);
        Ok(())
    }

    pub fn pool_create(&self, props: &CUmemPoolProps) -> R<u64> {
        self.check()?;
        if props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
            || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = self
            .device_index(props.location.id)
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut t = self.lock();
        let h = t.handle(kind::POOL);
        t.pools.insert(h, Pool::new(dev, false));
        Ok(h)
    }

    pub fn pool_destroy(&self, pool: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        let p = match t.pools.get_mut(&pool) {
            Some(p) if !p.is_default && !p.destroyed => p,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        p.destroyed = true;
        let dev = p.dev as usize;
        if t.current_pool[dev] == Some(pool) {
            t.current_pool[dev] = None;
        }
        self.trim_pool(&mut t, pool, 0);
        Ok(())
    }

    /// Releases reserved-but-unused memory of one pool down to max(keep, used), in whole
    /// chunks (an OS allocation goes back only whole).
    fn trim_pool(&self, t: &mut Tables, pool: u64, keep: u64) {
        let Some(p) = t.pools.get_mut(&pool) else {
            return;
        };
        let target = round_up(keep.max(p.used), p.chunk.max(1));
        if p.reserved > target {
            let release = p.reserved - target;
            p.reserved = target;
            if let Ok(st) = self.check() {
                st.uncharge(p.dev, self.slot(), release);
            }
        }
        if p.destroyed && p.used == 0 {
            t.pools.remove(&pool);
        }
    }

    pub(crate) fn trim_device_pools(&self, t: &mut Tables, dev: u32, keep: u64) {
        let pools: Vec<u64> = t
            .pools
            .iter()
            .filter(|(_, p)| p.dev == dev)
            .map(|(&h, _)| h)
            .collect();
        for h in pools {
            self.trim_pool(t, h, keep);
        }
    }

    /// At a synchronisation point, pools holding more than their release threshold give the
    /// excess back to the card.
    pub(crate) fn sync_point(&self, dev: u32) {
        let mut t = self.lock();
        let pools: Vec<(u64, u64)> = t
            .pools
            .iter()
            .filter(|(_, p)| p.dev == dev && p.reserved > p.threshold)
            .map(|(&h, p)| (h, p.threshold))
            .collect();
        for (h, threshold) in pools {
            self.trim_pool(&mut t, h, threshold);
        }
    }

    pub fn pool_trim_to(&self, pool: u64, keep: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        Self::live_pool(&mut t, pool)?;
        self.trim_pool(&mut t, pool, keep);
        Ok(())
    }

    /// Bytes returned to a pool by a free.
    pub(crate) fn pool_return(&self, t: &mut Tables, pool: u64, bytes: u64) {
        if let Some(p) = t.pools.get_mut(&pool) {
            p.used = p.used.saturating_sub(bytes);
            if p.destroyed {
                self.trim_pool(t, pool, 0);
            }
        }
    }

    /// Allocates from `pool` (or the stream's device's current pool) in stream order.
    /// On a capturing stream: an allocation node of the graph instead (see `graph`).
    pub fn mem_alloc_async(&self, size: u64, pool: Option<u64>, stream: u64) -> R<u64> {
        let info = self.stream_info(stream)?;
        let cur = info.cur;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if let Some(graph) = info.capture {
            if let Some(p) = pool {
                Self::live_pool(&mut self.lock(), p)?;
            }
            return self.capture_alloc(graph, &cur, size);
        }
        let st = self.check()?;
        let mut t = self.lock();
        let pool = match pool {
            Some(p) => match t.pools.get(&p) {
                Some(pp) if !pp.destroyed => p,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            },
            None => match t.current_pool[cur.dev as usize] {
                Some(p) => p,
                None => Self::default_pool_of(&mut t, cur.dev),
            },
        };
        let need = round_up(size, ALLOC_GRANULARITY);
        let p = t.pools.get_mut(&pool).expect("checked above");
        let on = super::context::Current { dev: p.dev, ..cur };
        let grow = round_up(need.saturating_sub(p.reserved - p.used), p.chunk.max(1));
        if grow > 0 && !st.try_charge(p.dev, self.slot(), grow) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        p.reserved += grow;
        p.used += need;
        p.reserved_high = p.reserved_high.max(p.reserved);
        p.used_high = p.used_high.max(p.used);
        match self.alloc_in(&mut t, &on, size, 0, AllocKind::Pool(pool), false) {
            Ok(addr) => {
                t.allocs.get_mut(&addr).expect("just inserted").charged = need;
                Ok(addr)
            }
            Err(e) => {
                self.pool_return(&mut t, pool, need);
                Err(e)
            }
        }
    }

    /// Frees in stream order (any device allocation may be freed this way); on a capturing
    /// stream, a free node of the graph.
    pub fn mem_free_async(&self, ptr: u64, stream: u64) -> R<()> {
        if let Some(graph) = self.stream_info(stream)?.capture {
            return self.capture_free(graph, ptr);
        }
        let mut t = self.lock();
        match t.allocs.get(&ptr) {
            Some(a) if !matches!(a.kind, AllocKind::Ipc | AllocKind::Global) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.free_alloc(&mut t, ptr);
        Ok(())
    }

    /// A pool the caller may still name: created and not destroyed.
    fn live_pool(t: &mut Tables, pool: u64) -> R<&mut Pool> {
        match t.pools.get_mut(&pool) {
            Some(p) if !p.destroyed => Ok(p),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    pub fn pool_get_attribute(&self, pool: u64, attr: i32) -> R<u64> {
        self.check()?;
        let mut t = self.lock();
        let p = Self::live_pool(&mut t, pool)?;
        Ok(match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES
            | REUSE_ALLOW_OPPORTUNISTIC
            | REUSE_ALLOW_INTERNAL_DEPENDENCIES => p.reuse[(attr - 1) as usize],
            RELEASE_THRESHOLD => p.threshold,
            RESERVED_MEM_CURRENT => p.reserved,
            RESERVED_MEM_HIGH => p.reserved_high,
            USED_MEM_CURRENT => p.used,
            USED_MEM_HIGH => p.used_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// Setting a high-water mark is only allowed to 0, which resets it to the current value.
    pub fn pool_set_attribute(&self, pool: u64, attr: i32, value: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        let p = Self::live_pool(&mut t, pool)?;
        match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES
            | REUSE_ALLOW_OPPORTUNISTIC
            | REUSE_ALLOW_INTERNAL_DEPENDENCIES => p.reuse[(attr - 1) as usize] = value,
            RELEASE_THRESHOLD => p.threshold = value,
            RESERVED_MEM_HIGH if value == 0 => p.reserved_high = p.reserved,
            USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn freed_memory_stays_reserved_until_sync() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        let pool = c.device_get_pool(0).unwrap();
        assert_eq!(pool, c.device_default_pool(0).unwrap());
        let p = c.mem_alloc_async(3 * MIB, None, 0).unwrap();
        assert_eq!(st.used_memory(0) - base, 4 * MIB);
        assert_eq!(
            c.pool_get_attribute(pool, USED_MEM_CURRENT).unwrap(),
            4 * MIB
        );
        c.mem_free_async(p, 0).unwrap();
        assert_eq!(
            st.used_memory(0) - base,
            4 * MIB,
            "still reserved by the pool"
        );
        assert_eq!(c.pool_get_attribute(pool, USED_MEM_CURRENT).unwrap(), 0);
        assert_eq!(
            c.pool_get_attribute(pool, RESERVED_MEM_CURRENT).unwrap(),
            4 * MIB
        );
        // Reuse needs no new physical memory.
        let q = c.mem_alloc_async(2 * MIB, None, 0).unwrap();
        assert_eq!(st.used_memory(0) - base, 4 * MIB);
        c.mem_free_async(q, 0).unwrap();
        c.ctx_synchronize().unwrap();
        assert_eq!(st.used_memory(0), base, "threshold 0: released at sync");
        assert_eq!(
            c.pool_get_attribute(pool, RESERVED_MEM_HIGH).unwrap(),
            4 * MIB
        );
        c.pool_set_attribute(pool, RESERVED_MEM_HIGH, 0).unwrap();
        assert_eq!(c.pool_get_attribute(pool, RESERVED_MEM_HIGH).unwrap(), 0);
        assert_eq!(
            c.pool_set_attribute(pool, USED_MEM_HIGH, 5),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn threshold_and_trim() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        let pool = c.device_get_pool(0).unwrap();
        c.pool_set_attribute(pool, RELEASE_THRESHOLD, 6 * MIB)
            .unwrap();
        let ps: Vec<u64> = (0..5)
            .map(|_| c.mem_alloc_async(2 * MIB, None, 0).unwrap())
            .collect();
        for p in ps {
            c.mem_free_async(p, 0).unwrap();
        }
        c.ctx_synchronize().unwrap();
        assert_eq!(
            st.used_memory(0) - base,
            6 * MIB,
            "keeps up to the threshold"
        );
        c.pool_trim_to(pool, 2 * MIB).unwrap();
        assert_eq!(st.used_memory(0) - base, 2 * MIB);
        let held = c.mem_alloc_async(2 * MIB, None, 0).unwrap();
        c.pool_trim_to(pool, 0).unwrap();
        assert_eq!(
            st.used_memory(0) - base,
            2 * MIB,
            "trim never releases used memory"
        );
        c.mem_free_async(held, 0).unwrap();
        c.pool_trim_to(pool, 0).unwrap();
        assert_eq!(st.used_memory(0), base);
    }

    #[test]
    fn explicit_pools() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        // SAFETY: a plain C struct, valid all-zero.
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        let pool = c.pool_create(&props).unwrap();
        let p = c.mem_alloc_async(MIB, Some(pool), 0).unwrap();
        c.device_set_pool(0, pool).unwrap();
        assert_eq!(c.device_get_pool(0).unwrap(), pool);
        assert_eq!(c.device_set_pool(1, pool), Err(CUDA_ERROR_INVALID_VALUE));
        c.pool_destroy(pool).unwrap();
        assert_eq!(
            st.used_memory(0) - base,
            2 * MIB,
            "outstanding allocation survives"
        );
        // The handle is gone for the caller, although its memory is not.
        for attr in [RESERVED_MEM_CURRENT, USED_MEM_CURRENT, RELEASE_THRESHOLD] {
            assert_eq!(
                c.pool_get_attribute(pool, attr),
                Err(CUDA_ERROR_INVALID_VALUE)
            );
        }
        assert_eq!(
            c.pool_set_attribute(pool, RELEASE_THRESHOLD, 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(c.pool_trim_to(pool, 0), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(c.pool_destroy(pool), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(
            c.mem_alloc_async(MIB, Some(pool), 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            c.device_get_pool(0).unwrap(),
            c.device_default_pool(0).unwrap()
        );
        c.mem_free_async(p, 0).unwrap();
        assert_eq!(st.used_memory(0), base);
        let default = c.device_default_pool(0).unwrap();
        assert_eq!(c.pool_destroy(default), Err(CUDA_ERROR_INVALID_VALUE));
        props.location.id = 9;
        assert_eq!(c.pool_create(&props), Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn pools_grow_and_release_in_whole_chunks() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        // SAFETY: a plain C struct, valid all-zero.
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = CU_MEM_LOCATION_TYPE_DEVICE;
        let pool = c.pool_create(&props).unwrap();
        assert_eq!(c.lock().pools[&pool].chunk, ALLOC_GRANULARITY, "default");
        c.lock().pools.get_mut(&pool).unwrap().chunk = 16 * MIB;
        // A 2 MiB request takes a whole 16 MiB OS allocation from the card.
        let a = c.mem_alloc_async(MIB, Some(pool), 0).unwrap();
        assert_eq!(st.used_memory(0) - base, 16 * MIB);
        assert_eq!(
            c.pool_get_attribute(pool, RESERVED_MEM_CURRENT).unwrap(),
            16 * MIB
        );
        assert_eq!(
            c.pool_get_attribute(pool, USED_MEM_CURRENT).unwrap(),
            2 * MIB
        );
        // The rest of the chunk serves the next requests; 15 MiB more needs a second chunk.
        let b = c.mem_alloc_async(14 * MIB, Some(pool), 0).unwrap();
        assert_eq!(st.used_memory(0) - base, 16 * MIB);
        let d = c.mem_alloc_async(15 * MIB, Some(pool), 0).unwrap();
        assert_eq!(st.used_memory(0) - base, 32 * MIB);
        // Releases keep every chunk still in use, even partly.
        c.mem_free_async(b, 0).unwrap();
        c.mem_free_async(d, 0).unwrap();
        c.ctx_synchronize().unwrap();
        assert_eq!(st.used_memory(0) - base, 16 * MIB, "a's chunk stays");
        c.mem_free_async(a, 0).unwrap();
        c.pool_trim_to(pool, MIB).unwrap();
        assert_eq!(st.used_memory(0) - base, 16 * MIB, "keeps a whole chunk");
        c.pool_trim_to(pool, 0).unwrap();
        assert_eq!(st.used_memory(0), base);
        c.pool_destroy(pool).unwrap();
    }
}
