//! Contexts: primary contexts (retain/release/reset), created contexts, and each thread's
//! current-context stack. A context costs `FAKEGPU_CTX_OVERHEAD` bytes of device memory from
//! creation until it is destroyed (or the primary context's last release, or a reset), and
//! taking it down frees everything allocated in it, as the real driver does. A reset keeps the
//! primary context's references: the next retain makes it anew, and the old references are
//! still released one by one (the last release of an inactive context ends nothing).

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
}

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
        self.teardown(&mut t, ctx, c.dev);
        drop(t);
        with_stack(|s| s.retain(|&h| h != ctx));
        Ok(())
    }

    /// Frees everything owned by a context and its memory overhead.
    fn teardown(&self, t: &mut Tables, ctx: u64, dev: u32) {
        let Ok(st) = self.check() else { return };
        self.release_ctx_memory(t, ctx);
        t.streams.retain(|_, s| s.ctx != ctx);
        t.events.retain(|_, e| e.ctx != ctx);
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
            },
        );
        t.primary[dev as usize] = Some(h);
        h
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
            self.teardown(&mut t, h, dev);
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
            self.teardown(&mut t, h, dev);
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
    fn context_overhead_can_run_out() {
        let c = driver(Config {
            ctx_overhead: 600 << 20,
            ..Config::default()
        });
        c.ctx_create(0, 0).unwrap();
        assert_eq!(c.ctx_create(0, 0), Err(CUDA_ERROR_OUT_OF_MEMORY));
    }
}
