//! Streams and events on top of the device timeline. A stream remembers when its last
//! enqueued kernel ends; the NULL, legacy and per-thread default streams are the context's
//! own (which also covers every other stream of the context, the legacy-stream rule).
//! Synchronisation sleeps until the timeline says the work is done; an event's timestamp is
//! when the work enqueued before it finishes, so elapsed times follow the timeline.

use super::context::Current;
use super::{kind, sleep_until, with_stack, Cuda, R};
use crate::state::now_ns;
use gpuslice_abi::cuda::flags::CU_EVENT_DISABLE_TIMING;
use gpuslice_abi::cuda::result::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    pub last_end: Arc<AtomicU64>,
    /// The graph being captured into, if capturing.
    pub capture: Option<u64>,
}

pub struct Event {
    pub ctx: u64,
    pub flags: u32,
    /// Monotonic ns at which the recorded work completes; `None` until recorded.
    pub ts: Option<u64>,
}

/// What a launch needs about a stream.
pub struct StreamInfo {
    pub cur: Current,
    pub handle: Option<u64>,
    pub last_end: Arc<AtomicU64>,
    pub capture: Option<u64>,
}

/// NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
pub fn is_default_stream(s: u64) -> bool {
    s <= 2
}

impl Cuda {
    pub fn stream_info(&self, stream: u64) -> R<StreamInfo> {
        self.check()?;
        if is_default_stream(stream) {
            let cur = self.current()?;
            let last_end = cur.last_end.clone();
            return Ok(StreamInfo {
                cur,
                handle: None,
                last_end,
                capture: None,
            });
        }
        let t = self.lock();
        let s = t.streams.get(&stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let cur = Self::live_ctx(&t, s.ctx).map_err(|_| CUDA_ERROR_INVALID_HANDLE)?;
        Ok(StreamInfo {
            cur,
            handle: Some(stream),
            last_end: s.last_end.clone(),
            capture: s.capture,
        })
    }

    pub fn stream_current(&self, stream: u64) -> R<Current> {
        Ok(self.stream_info(stream)?.cur)
    }

    /// `cuStreamGetCtx`: the context a stream belongs to (the current one for the NULL,
    /// legacy and per-thread default streams).
    pub fn stream_ctx(&self, stream: u64) -> R<u64> {
        Ok(self.stream_info(stream)?.cur.ctx)
    }

    pub fn stream_create(&self, flags: u32, priority: i32) -> R<u64> {
        let cur = self.current()?;
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let h = t.handle(kind::STREAM);
        t.streams.insert(
            h,
            Stream {
                ctx: cur.ctx,
                flags,
                // Greatest priority is -5 (as reported on recent GPUs); clamp like the driver.
                priority: priority.clamp(-5, 0),
                last_end: Arc::default(),
                capture: None,
            },
        );
        Ok(h)
    }

    pub fn stream_destroy(&self, stream: u64) -> R<()> {
        self.check()?;
        self.lock()
            .streams
            .remove(&stream)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn stream_synchronize(&self, stream: u64) -> R<()> {
        let info = self.stream_info(stream)?;
        sleep_until(info.last_end.load(Ordering::Acquire));
        self.sync_point(info.cur.dev);
        Ok(())
    }

    /// Ok when all work is done, NOT_READY otherwise.
    pub fn stream_query(&self, stream: u64) -> R<()> {
        let info = self.stream_info(stream)?;
        if info.last_end.load(Ordering::Acquire) > now_ns() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        Ok(())
    }

    pub fn stream_wait_event(&self, stream: u64, event: u64, flags: u32) -> R<()> {
        let info = self.stream_info(stream)?;
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ts = self
            .lock()
            .events
            .get(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .ts;
        if let Some(ts) = ts {
            info.last_end.fetch_max(ts, Ordering::AcqRel);
        }
        Ok(())
    }

    pub fn event_create(&self, flags: u32) -> R<u64> {
        let cur = self.current()?;
        // INTERPROCESS (4) requires DISABLE_TIMING.
        if flags & !0x7 != 0 || (flags & 4 != 0 && flags & CU_EVENT_DISABLE_TIMING == 0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let h = t.handle(kind::EVENT);
        t.events.insert(
            h,
            Event {
                ctx: cur.ctx,
                flags,
                ts: None,
            },
        );
        Ok(h)
    }

    pub fn event_record(&self, event: u64, stream: u64) -> R<()> {
        let info = self.stream_info(stream)?;
        let mut t = self.lock();
        let e = t.events.get_mut(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if info.capture.is_none() {
            e.ts = Some(info.last_end.load(Ordering::Acquire).max(now_ns()));
        }
        Ok(())
    }

    fn event_ts(&self, event: u64) -> R<(Option<u64>, u32, u64)> {
        self.check()?;
        let t = self.lock();
        let e = t.events.get(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok((e.ts, e.flags, e.ctx))
    }

    pub fn event_query(&self, event: u64) -> R<()> {
        match self.event_ts(event)?.0 {
            Some(ts) if ts > now_ns() => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    pub fn event_synchronize(&self, event: u64) -> R<()> {
        let (ts, _, ctx) = self.event_ts(event)?;
        if let Some(ts) = ts {
            sleep_until(ts);
        }
        let dev = self.lock().contexts.get(&ctx).map(|c| c.dev);
        if let Some(dev) = dev {
            self.sync_point(dev);
        }
        Ok(())
    }

    /// Milliseconds between two completed, timed events.
    pub fn event_elapsed(&self, start: u64, end: u64) -> R<f32> {
        let (a, fa, _) = self.event_ts(start)?;
        let (b, fb, _) = self.event_ts(end)?;
        if (fa | fb) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (Some(a), Some(b)) = (a, b) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        if a.max(b) > now_ns() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        Ok(((b as f64 - a as f64) / 1e6) as f32)
    }

    pub fn event_destroy(&self, event: u64) -> R<()> {
        self.check()?;
        self.lock()
            .events
            .remove(&event)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// The calling thread's stack depth (tests).
    pub fn stack_depth(&self) -> usize {
        with_stack(|s| s.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn streams_and_events_follow_the_timeline() {
        let c = driver(small_overhead());
        c.ctx_create(0, 0).unwrap();
        let m = c.module_load(raw_image()).unwrap();
        let f = c.module_get_function(m, "k").unwrap();
        let s = c.stream_create(0, 0).unwrap();
        let (e0, e1) = (c.event_create(0).unwrap(), c.event_create(0).unwrap());
        c.event_record(e0, s).unwrap();
        let ns: u64 = 100_000_000; // 100 ms, one wave: far above scheduling noise
        c.launch(f, [1, 1, 1], [32, 1, 1], Some(ns), s).unwrap();
        c.event_record(e1, s).unwrap();
        assert_eq!(c.stream_query(s), Err(CUDA_ERROR_NOT_READY));
        assert_eq!(c.event_query(e1), Err(CUDA_ERROR_NOT_READY));
        assert_eq!(c.event_elapsed(e0, e1), Err(CUDA_ERROR_NOT_READY));
        let t0 = now_ns();
        c.event_synchronize(e1).unwrap();
        assert!(now_ns() - t0 >= ns / 2, "waited for the kernel");
        c.stream_query(s).unwrap();
        let ms = c.event_elapsed(e0, e1).unwrap();
        // 100 ms of kernel plus whatever passed between the two calls that enqueued it.
        assert!((100.0..120.0).contains(&ms), "elapsed {ms} ms");
        let e2 = c.event_create(CU_EVENT_DISABLE_TIMING).unwrap();
        c.event_record(e2, s).unwrap();
        assert_eq!(c.event_elapsed(e0, e2), Err(CUDA_ERROR_INVALID_HANDLE));
        c.stream_destroy(s).unwrap();
        assert_eq!(c.stream_synchronize(s), Err(CUDA_ERROR_INVALID_HANDLE));
        c.event_destroy(e0).unwrap();
        assert_eq!(c.event_query(e0), Err(CUDA_ERROR_INVALID_HANDLE));
        assert_eq!(c.event_create(4), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
