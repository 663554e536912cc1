//! Kernel launches on the device-wide timeline.
//!
//! Duration: `kernelParams[0]` (if present) points to a u64 `ns_per_wave` (default 1000;
//! values above 1 s per wave are clamped so that a misread pointer cannot wedge the device);
//! `waves = ceil(blocks / (sm_count * max(1, max_threads_per_sm / threads_per_block)))`,
//! `duration = ns_per_wave * waves`. A launch appends the kernel to the one timeline that all
//! processes share (start = max(now, device busy_until)), so kernels of all contexts run one
//! after another, like time-slicing without MPS, and returns at once. Each process may have
//! `FAKEGPU_QUEUE_DEPTH` (default 1024) kernels outstanding per device; a launch beyond that
//! sleeps until the oldest one finishes.

use super::{sleep_until, Cuda, R};
use crate::state::now_ns;
use gpuslice_abi::cuda::flags::*;
use gpuslice_abi::cuda::result::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

pub const DEFAULT_NS_PER_WAVE: u64 = 1000;
pub const MAX_NS_PER_WAVE: u64 = 1_000_000_000;

/// Validated launch geometry.
pub fn check_dims(grid: [u32; 3], block: [u32; 3]) -> R<()> {
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if threads > 1024 || block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if grid[1] > 65535 || grid[2] > 65535 || grid[0] > i32::MAX as u32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// The duration formula of the conventions.
pub fn kernel_duration(
    sm_count: u32,
    max_threads_per_sm: u32,
    grid: [u32; 3],
    block: [u32; 3],
    ns_per_wave: Option<u64>,
) -> u64 {
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    let threads = block.iter().map(|&b| b as u64).product::<u64>().max(1);
    let per_sm = (max_threads_per_sm as u64 / threads).max(1);
    let waves = blocks.div_ceil(sm_count.max(1) as u64 * per_sm);
    ns_per_wave
        .unwrap_or(DEFAULT_NS_PER_WAVE)
        .min(MAX_NS_PER_WAVE)
        .saturating_mul(waves)
}

/// Reads `ns_per_wave` from `kernelParams[0]`, or from the first 8 bytes of an `extra`
/// argument buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`).
///
/// # Safety
/// `params`, when non-null, must point to an array whose first entry is null or points to
/// at least 8 readable bytes; `extra`, when non-null, must be a valid `CU_LAUNCH_PARAM_END`-
/// terminated key/value list, as the CUDA API requires of callers.
pub unsafe fn read_ns_per_wave(params: *mut *mut c_void, extra: *mut *mut c_void) -> Option<u64> {
    if !params.is_null() {
        // SAFETY: per the contract above.
        let p0 = unsafe { *params };
        if p0.is_null() {
            return None;
        }
        // SAFETY: per the contract above; unaligned read tolerates packed arguments.
        return Some(unsafe { (p0 as *const u64).read_unaligned() });
    }
    if extra.is_null() {
        return None;
    }
    let (mut buf, mut size) = (std::ptr::null::<u8>(), None);
    let mut i = 0;
    loop {
        // SAFETY: the list is END-terminated per the contract; keys have values after them.
        let key = unsafe { *extra.add(i) } as usize;
        if key == CU_LAUNCH_PARAM_END {
            break;
        }
        // SAFETY: as above.
        let value = unsafe { *extra.add(i + 1) };
        match key {
            CU_LAUNCH_PARAM_BUFFER_POINTER => buf = value as *const u8,
            CU_LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                // SAFETY: BUFFER_SIZE's value points to a size_t.
                size = Some(unsafe { *(value as *const usize) })
            }
            _ => {}
        }
        i += 2;
    }
    if buf.is_null() || size.is_some_and(|s| s < 8) {
        return None;
    }
    // SAFETY: the buffer holds at least 8 bytes (checked when its size is given).
    Some(unsafe { (buf as *const u64).read_unaligned() })
}

impl Cuda {
    /// Puts one kernel of `duration` on the device timeline for this process, waiting while
    /// the process's queue for the device is full. Returns the kernel's end time.
    pub fn enqueue(&self, dev: u32, duration: u64, ends: &[&AtomicU64]) -> R<u64> {
        let st = self.check()?;
        let queue = &self.queues[dev as usize];
        loop {
            let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
            let now = now_ns();
            while q.front().is_some_and(|&e| e <= now) {
                q.pop_front();
            }
            if q.len() < self.config.queue_depth {
                // Under the queue lock, so this process's ends are pushed in timeline order.
                let (start, end) = st.enqueue_busy(dev, duration);
                q.push_back(end);
                drop(q);
                st.record_busy(dev, Some(self.slot()), start, end);
                for e in ends {
                    e.fetch_max(end, Ordering::AcqRel);
                }
                return Ok(end);
            }
            let oldest = *q.front().expect("queue is full, so not empty");
            drop(q);
            sleep_until(oldest);
        }
    }

    /// `cuLaunchKernel` and friends. `ns_per_wave` was read from the arguments by the caller.
    pub fn launch(
        &self,
        f: u64,
        grid: [u32; 3],
        block: [u32; 3],
        ns_per_wave: Option<u64>,
        stream: u64,
    ) -> R<()> {
        self.launch_touching(f, grid, block, ns_per_wave, stream, &[])
    }

    /// A launch whose 64-bit arguments `args` the caller read (see [`Cuda::wide_params`]):
    /// managed memory they point into is touched from the device (see `managed`), and what
    /// crosses the host link lengthens the kernel.
    pub fn launch_touching(
        &self,
        f: u64,
        grid: [u32; 3],
        block: [u32; 3],
        ns_per_wave: Option<u64>,
        stream: u64,
        args: &[u64],
    ) -> R<()> {
        let info = self.stream_info(stream)?;
        Self::check_function(&self.lock(), f)?;
        check_dims(grid, block)?;
        if let Some(graph) = info.capture {
            return self.graph_add_kernel(graph, f, grid, block, ns_per_wave);
        }
        self.first_launch(f, info.cur.ctx)?;
        let st = self.check()?;
        let (sms, threads) = st.sm_shape(info.cur.dev);
        let mut duration = kernel_duration(sms, threads, grid, block, ns_per_wave);
        if !args.is_empty() && self.managed_on_demand() {
            let traffic = self.managed_touched(info.cur.dev, args)?;
            duration = duration.saturating_add(self.host_link_ns(info.cur.dev, traffic));
        }
        self.enqueue(
            info.cur.dev,
            duration,
            &[&info.last_end, &info.cur.last_end],
        )?;
        Ok(())
    }

    /// Cooperative launches must fit on the device at once.
    pub fn launch_cooperative(
        &self,
        f: u64,
        grid: [u32; 3],
        block: [u32; 3],
        ns_per_wave: Option<u64>,
        stream: u64,
        args: &[u64],
    ) -> R<()> {
        let info = self.stream_info(stream)?;
        check_dims(grid, block)?;
        let (sms, threads) = self.check()?.sm_shape(info.cur.dev);
        let per_block = block.iter().map(|&b| b as u64).product::<u64>();
        let resident = sms as u64 * (threads as u64 / per_block).clamp(1, 32);
        if grid.iter().map(|&g| g as u64).product::<u64>() > resident {
            return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
        self.launch_touching(f, grid, block, ns_per_wave, stream, args)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn duration_formula() {
        // V100: 80 SMs x 2048 threads. 256-thread blocks: 8 per SM, 640 per wave.
        assert_eq!(
            kernel_duration(80, 2048, [640, 1, 1], [256, 1, 1], Some(10)),
            10
        );
        assert_eq!(
            kernel_duration(80, 2048, [641, 1, 1], [256, 1, 1], Some(10)),
            20
        );
        assert_eq!(kernel_duration(80, 2048, [1, 1, 1], [1, 1, 1], None), 1000);
        // Blocks bigger than an SM's thread budget still fit one per SM.
        assert_eq!(
            kernel_duration(2, 512, [4, 1, 1], [1024, 1, 1], Some(5)),
            10
        );
        assert_eq!(
            kernel_duration(80, 2048, [40, 40, 1], [16, 16, 1], Some(1)),
            3
        );
        assert_eq!(
            kernel_duration(1, 1, [1, 1, 1], [1, 1, 1], Some(u64::MAX)),
            MAX_NS_PER_WAVE
        );
    }

    #[test]
    fn reads_ns_per_wave_from_params_and_extra() {
        let mut ns: u64 = 1234;
        let mut params = [&mut ns as *mut u64 as *mut c_void];
        assert_eq!(
            // SAFETY: params[0] points to a u64.
            unsafe { read_ns_per_wave(params.as_mut_ptr(), std::ptr::null_mut()) },
            Some(1234)
        );
        let mut buf = 777u64.to_le_bytes();
        let mut size: usize = 8;
        let mut extra = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buf.as_mut_ptr() as *mut c_void,
            CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        assert_eq!(
            // SAFETY: a well-formed extra list.
            unsafe { read_ns_per_wave(std::ptr::null_mut(), extra.as_mut_ptr()) },
            Some(777)
        );
        assert_eq!(
            // SAFETY: null pointers are allowed.
            unsafe { read_ns_per_wave(std::ptr::null_mut(), std::ptr::null_mut()) },
            None
        );
    }

    #[test]
    fn launches_are_async_serial_and_bounded() {
        let c = driver(Config {
            queue_depth: 4,
            ..small_overhead()
        });
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let f = c
            .module_get_function(c.module_load(raw_image()).unwrap(), "k")
            .unwrap();
        assert_eq!(
            c.launch(f, [1, 1, 1], [2048, 1, 1], None, 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            c.launch(0x1234, [1, 1, 1], [1, 1, 1], None, 0),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        // Long kernels, so that scheduling delays on a loaded machine stay far below them.
        let ns = 50_000_000u64;
        let t0 = now_ns();
        for _ in 0..4 {
            c.launch(f, [1, 1, 1], [32, 1, 1], Some(ns), 0).unwrap();
        }
        assert!(now_ns() - t0 < ns, "four launches fit the queue: no wait");
        let end4 = st.busy_until(0);
        assert!(end4 >= t0 + 4 * ns);
        // The fifth waits for the first to finish.
        c.launch(f, [1, 1, 1], [32, 1, 1], Some(ns), 0).unwrap();
        assert!(now_ns() >= t0 + ns);
        assert_eq!(st.busy_until(0), end4 + ns, "kernels run back to back");
        c.ctx_synchronize().unwrap();
        assert!(now_ns() >= end4 + ns);
        let b = timeline_ns();
        let busy = st.busy_ns(
            0,
            Some(std::process::id()),
            t0 / b * b,
            (end4 + ns).div_ceil(b) * b,
        );
        assert_eq!(busy, 5 * ns);
    }

    fn timeline_ns() -> u64 {
        crate::timeline::BUCKET_NS
    }

    #[test]
    fn cooperative_launch_must_fit() {
        let c = driver(small_overhead());
        c.ctx_create(0, 0).unwrap();
        let f = c
            .module_get_function(c.module_load(raw_image()).unwrap(), "k")
            .unwrap();
        // 80 SMs x (2048/1024 = 2 blocks) = 160 resident blocks.
        c.launch_cooperative(f, [160, 1, 1], [1024, 1, 1], Some(1), 0, &[])
            .unwrap();
        assert_eq!(
            c.launch_cooperative(f, [161, 1, 1], [1024, 1, 1], Some(1), 0, &[]),
            Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE)
        );
    }
}
