//! Contexts: primary contexts (retain/release/reset), created contexts, and each thread's
//! current-context stack. A context costs `FAKEGPU_CTX_OVERHEAD` bytes of device memory from
//! creation until it is destroyed (or the primary context's last release, or a reset), and
//! taking it down frees everything allocated in it, as the real driver does. A reset keeps the
//! primary context's references: the next retain makes it anew, and the old references are
//! still released one by one (the last release of an inactive context ends nothing).
//!
//! Limits (`cuCtxSetLimit` / `cuCtxGetLimit`): `CU_LIMIT_MALLOC_HEAP_SIZE` is backed by device
//! memory as the driver's device-malloc heap is: the default 8 MiB is part of the context's
//! overhead, growth past it is charged when set (OUT_OF_MEMORY if the card is full, nothing
//! changed), a shrink frees it, and the context's end frees the rest. The stack
//! (`CU_LIMIT_STACK_SIZE`) and the printf FIFO are device memory too (see `driver_memory`);
//! every other limit is accepted and reported back but costs no memory.

use super::{kind, sleep_until, with_stack, Cuda, Tables, R};
use gpuslice_abi::cuda::result::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Ctx {
    pub dev: u32,
    pub flags: u32,
    pub primary: bool,
    /// False for a primary context that is not retained (its handle stays valid for retain).
    pub active: bool,
    pub refcount: u32,
    /// When this context's enqueued work (all its streams) ends.
    pub last_end: Arc<AtomicU64>,
    /// Device-malloc heap bytes above [`DEFAULT_MALLOC_HEAP`], charged to the card.
    pub heap: u64,
    /// The other limits as last set (`CUlimit` -> value); no memory behind them.
    pub limits: std::collections::HashMap<i32, u64>,
}

/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
pub const LIMIT_MALLOC_HEAP_SIZE: i32 = 2;
/// The driver's default device-malloc heap (inside the context overhead).
pub const DEFAULT_MALLOC_HEAP: u64 = 8 << 20;
/// `CU_LIMIT_MAX` of the 13.x headers: limits at or past it are INVALID_VALUE.
const LIMIT_MAX: i32 = 10;

/// What a launch or a copy needs to know about the current context.
#[derive(Clone)]
pub struct Current {
    pub ctx: u64,
    pub dev: u32,
    pub last_end: Arc<AtomicU64>,
}

impl Cuda {
    /// The calling thread's current, live context (INVALID_CONTEXT otherwise).
    pub fn current(&self) -> R<Current> {
        self.check()?;
        let top = with_stack(|s| s.last().copied()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let t = self.lock();
        Self::live_ctx(&t, top)
    }

    pub(crate) fn live_ctx(t: &Tables, ctx: u64) -> R<Current> {
        match t.contexts.get(&ctx) {
            Some(c) if c.active => Ok(Current {
                ctx,
                dev: c.dev,
                last_end: c.last_end.clone(),
            }),
            _ => Err(CUDA_ERROR_INVALID_CONTEXT),
        }
    }

    fn charge_ctx(&self, dev: u32) -> R<()> {
        let st = self.check()?;
        if !st.try_charge(dev, self.slot(), self.config.ctx_overhead) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        st.add_context(dev, self.slot(), 1);
        // The memory is on the card while the context is being made.
        if self.config.ctx_init_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.config.ctx_init_ms));
        }
        Ok(())
    }

    pub fn ctx_create(&self, flags: u32, dev: i32) -> R<u64> {
        let dev = self.device_index(dev)?;
        self.charge_ctx(dev)?;
        let mut t = self.lock();
        let h = t.handle(kind::CTX);
        t.contexts.insert(
            h,
            Ctx {
                dev,
                flags,
                primary: false,
                active: true,
                refcount: 1,
                last_end: Arc::default(),
                heap: 0,
                limits: Default::default(),
            },
        );
        drop(t);
        with_stack(|s| s.push(h));
        Ok(h)
    }

    pub fn ctx_destroy(&self, ctx: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        match t.contexts.get(&ctx) {
            Some(c) if !c.primary => {}
            _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
        }
        let c = t.contexts.remove(&ctx).expect("checked above");
        self.teardown(&mut t, ctx, c.dev, c.heap);
        drop(t);
        with_stack(|s| s.retain(|&h| h != ctx));
        Ok(())
    }

    /// Frees everything owned by a context, its malloc heap (`heap` bytes above the default,
    /// taken from the context by the caller) and its memory overhead.
    fn teardown(&self, t: &mut Tables, ctx: u64, dev: u32, heap: u64) {
        let Ok(st) = self.check() else { return };
        self.release_ctx_memory(t, ctx);
        self.ctx_driver_memory_gone(t, ctx);
        t.streams.retain(|_, s| s.ctx != ctx);
        t.events.retain(|_, e| e.ctx != ctx);
        t.ctx_storage.retain(|(c, _), _| *c != ctx);
        t.modules.retain(|_, m| m.ctx != ctx);
        let modules: Vec<u64> = t.modules.keys().copied().collect();
        t.functions
            .retain(|_, f| f.ctx != ctx && f.module.is_none_or(|m| modules.contains(&m)));
        // Pools outlive contexts, but the memory they keep in reserve goes with the last
        // context of the device.
        let others = t.contexts.values().any(|c| c.dev == dev && c.active);
        if !others {
            self.trim_device_pools(t, dev, 0);
        }
        st.uncharge(dev, self.slot(), heap);
        st.uncharge(dev, self.slot(), self.config.ctx_overhead);
        st.add_context(dev, self.slot(), -1);
    }

    fn primary_handle(&self, t: &mut Tables, dev: u32) -> u64 {
        if let Some(h) = t.primary[dev as usize] {
            return h;
        }
        let h = t.handle(kind::CTX);
        t.contexts.insert(
            h,
            Ctx {
                dev,
                flags: 0,
                primary: true,
                active: false,
                refcount: 0,
                last_end: Arc::default(),
                heap: 0,
                limits: Default::default(),
            },
        );
        t.primary[dev as usize] = Some(h);
        h
    }

    /// The primary context's handle, neither retained nor activated (the runtime's private
    /// interface asks for it before it retains).
    pub fn primary_peek(&self, dev: i32) -> R<u64> {
        self.check()?;
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        Ok(self.primary_handle(&mut t, dev))
    }

    pub fn primary_retain(&self, dev: i32) -> R<u64> {
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        let h = self.primary_handle(&mut t, dev);
        let c = t.contexts.get_mut(&h).expect("primary exists");
        // Inactive with references left is the state after a reset: a retain makes it anew.
        if !c.active {
            self.charge_ctx(dev)?;
            c.active = true;
        }
        c.refcount += 1;
        Ok(h)
    }

    pub fn primary_release(&self, dev: i32) -> R<()> {
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        let h = self.primary_handle(&mut t, dev);
        let c = t.contexts.get_mut(&h).expect("primary exists");
        if c.refcount == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        c.refcount -= 1;
        if c.refcount == 0 && c.active {
            c.active = false;
            let heap = std::mem::take(&mut c.heap);
            c.limits.clear();
            self.teardown(&mut t, h, dev, heap);
        }
        Ok(())
    }

    pub fn primary_reset(&self, dev: i32) -> R<()> {
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        let h = self.primary_handle(&mut t, dev);
        let c = t.contexts.get_mut(&h).expect("primary exists");
        // "Resetting the primary context does not release it": the references stay, and
        // releasing them afterwards is legal (cuDevicePrimaryCtxReset in the driver API docs).
        if c.active {
            c.active = false;
            let heap = std::mem::take(&mut c.heap);
            c.limits.clear();
            self.teardown(&mut t, h, dev, heap);
        }
        Ok(())
    }

    /// (flags, active).
    pub fn primary_state(&self, dev: i32) -> R<(u32, bool)> {
        let dev = self.device_index(dev)?;
        let mut t = self.lock();
        let h = self.primary_handle(&mut t, dev);
        let c = &t.contexts[&h];
        Ok((c.flags, c.active))
    }

    pub fn primary_set_flags(&self, dev: i32, flags: u32) -> R<()> {
        let dev = self.device_index(dev)?;
        // Scheduling flags (0..=4), BLOCKING_SYNC variants, MAP_HOST, LMEM_RESIZE_TO_MAX.
        if flags & !0x1f != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let h = self.primary_handle(&mut t, dev);
        t.contexts.get_mut(&h).expect("primary exists").flags = flags;
        Ok(())
    }

    pub fn ctx_push(&self, ctx: u64) -> R<()> {
        self.check()?;
        Self::live_ctx(&self.lock(), ctx)?;
        with_stack(|s| s.push(ctx));
        Ok(())
    }

    pub fn ctx_pop(&self) -> R<u64> {
        self.check()?;
        with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// `cuCtxSetCurrent`: replaces the top of the stack; a null context pops it.
    pub fn ctx_set_current(&self, ctx: u64) -> R<()> {
        self.check()?;
        if ctx == 0 {
            with_stack(|s| s.pop());
            return Ok(());
        }
        if !self.lock().contexts.contains_key(&ctx) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        with_stack(|s| match s.last_mut() {
            Some(top) => *top = ctx,
            None => s.push(ctx),
        });
        Ok(())
    }

    /// The top of the stack, or 0 (even if that context was since destroyed, as the driver).
    pub fn ctx_get_current(&self) -> R<u64> {
        self.check()?;
        Ok(with_stack(|s| s.last().copied()).unwrap_or(0))
    }

    pub fn ctx_device(&self) -> R<i32> {
        Ok(self.current()?.dev as i32)
    }

    pub fn ctx_api_version(&self, ctx: u64) -> R<u32> {
        self.check()?;
        let ctx = if ctx == 0 { self.current()?.ctx } else { ctx };
        Self::live_ctx(&self.lock(), ctx)?;
        Ok(3020)
    }

    /// `cuCtxSetLimit` on the current context. The malloc heap's growth past its current size
    /// (past the default, rounded up to the allocation granularity) is charged first
    /// (OUT_OF_MEMORY leaves everything as it was); a shrink frees the difference down to the
    /// default, which stays inside the context overhead.
    pub fn ctx_set_limit(&self, limit: i32, value: u64) -> R<()> {
        let cur = self.current()?;
        if !(0..LIMIT_MAX).contains(&limit) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let st = self.check()?;
        let mut t = self.lock();
        if self.set_driver_limit(&mut t, cur.ctx, limit, value)? {
            return Ok(());
        }
        let c = t
            .contexts
            .get_mut(&cur.ctx)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if limit != LIMIT_MALLOC_HEAP_SIZE {
            c.limits.insert(limit, value);
            return Ok(());
        }
        let heap = super::round_up(
            value.saturating_sub(DEFAULT_MALLOC_HEAP),
            super::ALLOC_GRANULARITY,
        );
        if heap > c.heap {
            if !st.try_charge(cur.dev, self.slot(), heap - c.heap) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        } else {
            st.uncharge(cur.dev, self.slot(), c.heap - heap);
        }
        c.heap = heap;
        c.limits.insert(limit, value);
        Ok(())
    }

    /// `cuCtxGetLimit` on the current context: the malloc heap as set (its default when never
    /// set); other limits read back what was set (0 if never set).
    pub fn ctx_get_limit(&self, limit: i32) -> R<u64> {
        let cur = self.current()?;
        if !(0..LIMIT_MAX).contains(&limit) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let t = self.lock();
        let c = t.contexts.get(&cur.ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if let Some(v) = Self::driver_limit(&t, cur.ctx, limit) {
            return Ok(v);
        }
        if limit == LIMIT_MALLOC_HEAP_SIZE {
            return Ok(c.limits.get(&limit).copied().unwrap_or(DEFAULT_MALLOC_HEAP));
        }
        Ok(c.limits.get(&limit).copied().unwrap_or(0))
    }

    /// Waits for all work of the current context, then lets pools release memory.
    pub fn ctx_synchronize(&self) -> R<()> {
        let cur = self.current()?;
        sleep_until(cur.last_end.load(Ordering::Acquire));
        self.sync_point(cur.dev);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::DEFAULT_MALLOC_HEAP;

    #[test]
    fn contexts_cost_memory_and_stack() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        assert_eq!(c.current().err(), Some(CUDA_ERROR_INVALID_CONTEXT));
        let a = c.ctx_create(0, 0).unwrap();
        assert_eq!(st.used_memory(0), 10 << 20);
        assert_eq!(c.ctx_get_current().unwrap(), a);
        let b = c.ctx_create(0, 1).unwrap();
        assert_eq!(c.ctx_device().unwrap(), 1);
        assert_eq!(c.ctx_pop().unwrap(), b);
        assert_eq!(c.ctx_device().unwrap(), 0);
        c.ctx_push(b).unwrap();
        c.ctx_destroy(b).unwrap();
        assert_eq!(st.used_memory(1), 0);
        assert_eq!(c.ctx_get_current().unwrap(), a);
        assert_eq!(c.ctx_destroy(b), Err(CUDA_ERROR_INVALID_CONTEXT));
        c.ctx_destroy(a).unwrap();
        assert_eq!(st.used_memory(0), 0);
        assert_eq!(c.ctx_pop(), Err(CUDA_ERROR_INVALID_CONTEXT));
    }

    #[test]
    fn primary_context_refcount() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        let p = c.primary_retain(0).unwrap();
        assert_eq!(c.primary_retain(0).unwrap(), p);
        assert_eq!(
            st.used_memory(0),
            10 << 20,
            "one charge per primary context"
        );
        assert_eq!(c.primary_state(0).unwrap(), (0, true));
        c.ctx_set_current(p).unwrap();
        c.mem_alloc(5 << 20).unwrap();
        assert_eq!(st.used_memory(0), (10 + 6) << 20);
        c.primary_release(0).unwrap();
        assert_eq!(st.used_memory(0), (10 + 6) << 20);
        c.primary_release(0).unwrap();
        assert_eq!(
            st.used_memory(0),
            0,
            "last release frees the context's memory"
        );
        assert_eq!(c.primary_release(0), Err(CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(c.current().err(), Some(CUDA_ERROR_INVALID_CONTEXT));
        c.primary_retain(0).unwrap();
        c.primary_reset(0).unwrap();
        assert_eq!(c.primary_state(0).unwrap(), (0, false));
        assert_eq!(st.used_memory(0), 0);
        // The reset kept that reference: a retain makes the context anew (one more
        // reference), releasing the old reference leaves it active, the last one ends it.
        c.primary_retain(0).unwrap();
        assert_eq!(st.used_memory(0), 10 << 20);
        c.primary_release(0).unwrap();
        assert_eq!(c.primary_state(0).unwrap(), (0, true));
        assert_eq!(st.used_memory(0), 10 << 20);
        c.primary_release(0).unwrap();
        assert_eq!(c.primary_state(0).unwrap(), (0, false));
        assert_eq!(st.used_memory(0), 0);
        // A release after a reset, with no retain in between, is legal and ends nothing more.
        c.primary_retain(0).unwrap();
        c.primary_reset(0).unwrap();
        c.primary_release(0).unwrap();
        assert_eq!(c.primary_release(0), Err(CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(st.used_memory(0), 0);
    }

    #[test]
    fn malloc_heap_limit_costs_memory_until_the_context_ends() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        assert_eq!(c.ctx_set_limit(2, 1 << 20), Err(CUDA_ERROR_INVALID_CONTEXT));
        let a = c.ctx_create(0, 0).unwrap();
        assert_eq!(c.ctx_get_limit(2).unwrap(), DEFAULT_MALLOC_HEAP);
        c.ctx_set_limit(2, 108 << 20).unwrap();
        assert_eq!(c.ctx_get_limit(2).unwrap(), 108 << 20);
        assert_eq!(st.used_memory(0), (10 + 100) << 20, "growth charged");
        // The card (1 GiB) cannot hold a 2 GiB heap: refused, nothing changed.
        assert_eq!(c.ctx_set_limit(2, 2 << 30), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(c.ctx_get_limit(2).unwrap(), 108 << 20);
        assert_eq!(st.used_memory(0), (10 + 100) << 20);
        c.ctx_set_limit(2, 58 << 20).unwrap();
        assert_eq!(st.used_memory(0), (10 + 50) << 20, "shrink uncharged");
        c.ctx_set_limit(2, 1 << 20).unwrap();
        assert_eq!(
            st.used_memory(0),
            10 << 20,
            "below the default frees no more"
        );
        assert_eq!(c.ctx_get_limit(2).unwrap(), 1 << 20, "as set");
        // Other limits (not the stack or printf FIFO): accepted, reported, no memory.
        c.ctx_set_limit(3, 4096).unwrap();
        assert_eq!(c.ctx_get_limit(3).unwrap(), 4096);
        assert_eq!(st.used_memory(0), 10 << 20);
        assert_eq!(c.ctx_set_limit(99, 1), Err(CUDA_ERROR_INVALID_VALUE));
        // Destroying the context frees its heap.
        c.ctx_set_limit(2, 208 << 20).unwrap();
        assert_eq!(st.used_memory(0), (10 + 200) << 20);
        c.ctx_destroy(a).unwrap();
        assert_eq!(st.used_memory(0), 0);
        // So does the primary context's last release.
        let p = c.primary_retain(0).unwrap();
        c.ctx_set_current(p).unwrap();
        c.ctx_set_limit(2, 108 << 20).unwrap();
        assert_eq!(st.used_memory(0), (10 + 100) << 20);
        c.primary_release(0).unwrap();
        assert_eq!(st.used_memory(0), 0);
        c.primary_retain(0).unwrap();
        assert_eq!(c.ctx_get_limit(2).unwrap(), DEFAULT_MALLOC_HEAP, "anew");
        c.primary_release(0).unwrap();
    }

    #[test]
    fn context_overhead_can_run_out() {
        let c = driver(Config {
            ctx_overhead: 600 << 20,
            ..Config::default()
        });
        c.ctx_create(0, 0).unwrap();
        assert_eq!(c.ctx_create(0, 0), Err(CUDA_ERROR_OUT_OF_MEMORY));
    }
}
