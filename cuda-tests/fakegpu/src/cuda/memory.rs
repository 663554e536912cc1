//! Device memory: allocation (plain, pitched, managed, legacy 32-bit), free, queries, host
//! allocations, copies and memsets, CUDA arrays, and IPC handles.
//!
//! Device pointers are real addresses inside per-process `MAP_NORESERVE` anonymous
//! reservations (one per device, plus a low-4-GiB one for the 32-bit `cuMemAlloc` ABI), so
//! copies and memsets really move bytes and host pages are committed only when touched. What
//! the simulated card has in use is accounted separately, in the shared state: every
//! allocation is charged rounded up to 2 MiB ([`ALLOC_GRANULARITY`]).

use super::context::Current;
use super::{kind, round_up, sleep_until, Cuda, Tables, ALLOC_GRANULARITY, R};
use crate::state::{current_pid, MAX_DEVICES};
use gpuslice_abi::cuda::flags::{CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST};
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::{array_format_bytes, CUDA_ARRAY3D_DESCRIPTOR};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// A range of reserved virtual address space handed out first-fit in 2 MiB units.
pub struct Arena {
    base: u64,
    len: u64,
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
}

impl Arena {
    /// Reserves `len` bytes (halving on failure, down to 1 GiB or 16 MiB for the low
    /// arena), 2 MiB aligned.
    pub fn map(mut len: u64, low: bool) -> Option<Arena> {
        let min = if low { 16 << 20 } else { 1 << 30 };
        let extra_flags = if low { libc::MAP_32BIT } else { 0 };
        loop {
            // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    (len + ALLOC_GRANULARITY) as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra_flags,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                let base = round_up(p as u64, ALLOC_GRANULARITY);
                return Some(Arena {
                    base,
                    len,
                    free: BTreeMap::from([(base, len)]),
                });
            }
            if len <= min {
                return None;
            }
            len /= 2;
        }
    }

    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        let (&start, &len) = self.free.iter().find(|(_, &l)| l >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        Some(start)
    }

    /// Claims exactly `[addr, addr + size)` if it is free.
    pub fn alloc_at(&mut self, addr: u64, size: u64) -> Option<u64> {
        let (&start, &len) = self.free.range(..=addr).next_back()?;
        if addr + size > start + len {
            return None;
        }
        self.free.remove(&start);
        if addr > start {
            self.free.insert(start, addr - start);
        }
        if start + len > addr + size {
            self.free.insert(addr + size, start + len - addr - size);
        }
        Some(addr)
    }

    pub fn free(&mut self, addr: u64, size: u64) {
        let (mut start, mut len) = (addr, size);
        if let Some((&ps, &pl)) = self.free.range(..addr).next_back() {
            if ps + pl == addr {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(addr + size)) {
            self.free.remove(&(addr + size));
            len += nl;
        }
        self.free.insert(start, len);
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.len
    }
}

/// Gives the host pages behind a freed range back (keeps a long test's RSS bounded).
pub(crate) fn discard(addr: u64, len: u64) {
    // SAFETY: the range lies inside one of our own anonymous reservations.
    unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) };
}

#[derive(Default)]
pub struct Arenas {
    pub main: [Option<Arena>; MAX_DEVICES],
    pub low: Option<Arena>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    Device,
    Managed,
    /// From a memory pool (stream-ordered allocation).
    Pool(u64),
    /// An IPC import: the exporter owns (and is charged for) the memory.
    Ipc,
    /// A module global: part of the module image, not charged.
    Global,
    /// An allocation node of a graph (captured `cuMemAllocAsync`): its physical memory is
    /// the graph pool's, charged when the graph is uploaded (see `graph`).
    Graph(u64),
}

#[derive(Clone, Debug)]
pub struct Alloc {
    pub dev: u32,
    pub ctx: u64,
    /// Requested size (what cuMemGetAddressRange reports).
    pub size: u64,
    /// Reserved address space.
    pub span: u64,
    /// Physical bytes charged to the device for this allocation.
    pub charged: u64,
    pub kind: AllocKind,
    pub low: bool,
    pub touched: bool,
}

pub struct ArrayAlloc {
    pub ctx: u64,
    pub dev: u32,
    pub charged: u64,
    pub mipmapped: bool,
}

/// Bytes of one array level.
fn array_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR) -> R<u64> {
    let elem = array_format_bytes(d.Format).ok_or(CUDA_ERROR_INVALID_VALUE)? as u64;
    if d.Width == 0 || !matches!(d.NumChannels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(d.Width as u64
        * d.Height.max(1) as u64
        * d.Depth.max(1) as u64
        * d.NumChannels as u64
        * elem)
}

const IPC_MAGIC: &[u8; 8] = b"FGIPC\0\0\x01";

impl Cuda {
    pub(crate) fn alloc_va(&self, t: &mut Tables, dev: u32, span: u64, low: bool) -> R<u64> {
        let st = self.check()?;
        let arena = if low {
            if t.arenas.low.is_none() {
                t.arenas.low = Arena::map(512 << 20, true);
            }
            t.arenas.low.as_mut()
        } else {
            let slot = &mut t.arenas.main[dev as usize];
            if slot.is_none() {
                // Twice the card plus slack: fragmentation must never fail an allocation that
                // the physical accounting allows.
                *slot = Arena::map(2 * st.total_memory(dev) + (8 << 30), false);
            }
            slot.as_mut()
        };
        arena
            .and_then(|a| a.alloc(span))
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
    }

    pub(crate) fn free_va(
        t: &mut Tables,
        dev: u32,
        addr: u64,
        span: u64,
        low: bool,
        touched: bool,
    ) {
        if touched {
            discard(addr, span);
        }
        let arena = if low {
            t.arenas.low.as_mut()
        } else {
            t.arenas.main[dev as usize].as_mut()
        };
        if let Some(a) = arena {
            a.free(addr, span);
        }
    }

    /// Allocates `size` bytes in the context, charging `charge` bytes of physical memory.
    pub(crate) fn alloc_in(
        &self,
        t: &mut Tables,
        cur: &Current,
        size: u64,
        charge: u64,
        kind: AllocKind,
        low: bool,
    ) -> R<u64> {
        let st = self.check()?;
        let span = round_up(size.max(1), ALLOC_GRANULARITY);
        if charge > 0 && !st.try_charge(cur.dev, self.slot(), charge) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let addr = match self.alloc_va(t, cur.dev, span, low) {
            Ok(a) => a,
            Err(e) => {
                st.uncharge(cur.dev, self.slot(), charge);
                return Err(e);
            }
        };
        t.allocs.insert(
            addr,
            Alloc {
                dev: cur.dev,
                ctx: cur.ctx,
                size,
                span,
                charged: charge,
                kind,
                low,
                touched: false,
            },
        );
        Ok(addr)
    }

    pub fn mem_alloc(&self, size: u64) -> R<u64> {
        let cur = self.current()?;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let charge = round_up(size, ALLOC_GRANULARITY);
        self.alloc_in(&mut t, &cur, size, charge, AllocKind::Device, false)
    }

    /// The pre-3.2 ABI: 32-bit size and pointer, served from a low reservation.
    pub fn mem_alloc_legacy(&self, size: u32) -> R<u32> {
        let cur = self.current()?;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let charge = round_up(size as u64, ALLOC_GRANULARITY);
        let addr = self.alloc_in(&mut t, &cur, size as u64, charge, AllocKind::Device, true)?;
        if addr > u32::MAX as u64 {
            self.free_alloc(&mut t, addr);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(addr as u32)
    }

    /// Pitch rounded up to 512 bytes; pitch * height charged.
    pub fn mem_alloc_pitch(&self, width: u64, height: u64, elem: u32) -> R<(u64, u64)> {
        self.alloc_pitch(width, height, elem, false)
    }

    /// The pre-3.2 ABI of [`Cuda::mem_alloc_pitch`]: 32-bit extents, pointer and pitch,
    /// served from the low reservation like [`Cuda::mem_alloc_legacy`].
    pub fn mem_alloc_pitch_legacy(&self, width: u32, height: u32, elem: u32) -> R<(u32, u32)> {
        let (p, pitch) = self.alloc_pitch(width.into(), height.into(), elem, true)?;
        match (u32::try_from(p), u32::try_from(pitch)) {
            (Ok(p), Ok(pitch)) => Ok((p, pitch)),
            _ => {
                self.free_alloc(&mut self.lock(), p);
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    fn alloc_pitch(&self, width: u64, height: u64, elem: u32, low: bool) -> R<(u64, u64)> {
        let cur = self.current()?;
        if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pitch = round_up(width, 512);
        let size = pitch.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut t = self.lock();
        let charge = round_up(size, ALLOC_GRANULARITY);
        let p = self.alloc_in(&mut t, &cur, size, charge, AllocKind::Device, low)?;
        Ok((p, pitch))
    }

    /// Managed memory: charged to the device at allocation by default; placed nowhere until
    /// touched or sent under `FAKEGPU_MANAGED_MEMORY=on-demand` (see `managed`).
    pub fn mem_alloc_managed(&self, size: u64, flags: u32) -> R<u64> {
        let cur = self.current()?;
        if size == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        if self.managed_on_demand() {
            let p = self.alloc_in(&mut t, &cur, size, 0, AllocKind::Managed, false)?;
            Self::managed_created(&mut t, p, size);
            return Ok(p);
        }
        let charge = round_up(size, ALLOC_GRANULARITY);
        self.alloc_in(&mut t, &cur, size, charge, AllocKind::Managed, false)
    }

    /// Removes an allocation, returning its address space and physical memory.
    pub(crate) fn free_alloc(&self, t: &mut Tables, addr: u64) {
        let Some(a) = t.allocs.remove(&addr) else {
            return;
        };
        // Managed chunks placed on the host committed their pages without a copy.
        let touched = a.touched || a.kind == AllocKind::Managed;
        Self::free_va(t, a.dev, addr, a.span, a.low, touched);
        if a.kind == AllocKind::Managed {
            self.managed_freed(t, addr);
        }
        match a.kind {
            AllocKind::Pool(pool) => self.pool_return(t, pool, a.charged),
            _ => {
                if a.charged > 0 {
                    if let Ok(st) = self.check() {
                        st.uncharge(a.dev, self.slot(), a.charged);
                    }
                }
            }
        }
    }

    pub fn mem_free(&self, ptr: u64) -> R<()> {
        self.current()?;
        // Freeing NULL does nothing and succeeds: NVIDIA's static runtime (linked into
        // cuBLAS) calls cuMemFree(0) while it sets up, and fails to start otherwise.
        if ptr == 0 {
            return Ok(());
        }
        let mut t = self.lock();
        match t.allocs.get(&ptr) {
            Some(a) if !matches!(a.kind, AllocKind::Ipc | AllocKind::Global) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.free_alloc(&mut t, ptr);
        Ok(())
    }

    pub(crate) fn release_ctx_memory(&self, t: &mut Tables, ctx: u64) {
        let mine: Vec<u64> = t
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&p, _)| p)
            .collect();
        for p in mine {
            self.free_alloc(t, p);
        }
        let arrays: Vec<u64> = t
            .arrays
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&h, _)| h)
            .collect();
        for h in arrays {
            if let Some(a) = t.arrays.remove(&h) {
                if let Ok(st) = self.check() {
                    st.uncharge(a.dev, self.slot(), a.charged);
                }
            }
        }
    }

    /// (free, total): free is the card minus what ALL processes have in use.
    pub fn mem_get_info(&self) -> R<(u64, u64)> {
        let cur = self.current()?;
        let st = self.check()?;
        let total = st.total_memory(cur.dev);
        Ok((total.saturating_sub(st.used_memory(cur.dev)), total))
    }

    /// (base, size) of the allocation containing `ptr`.
    pub fn mem_address_range(&self, ptr: u64) -> R<(u64, u64)> {
        self.current()?;
        let t = self.lock();
        if let Some((&base, a)) = t.allocs.range(..=ptr).next_back() {
            if ptr < base + a.size.max(1) {
                return Ok((base, a.size));
            }
        }
        t.vmm.mapped_range(ptr).ok_or(CUDA_ERROR_NOT_FOUND)
    }

    /// Checks that `[ptr, ptr + n)` is device memory of this process.
    pub(crate) fn device_range(&self, t: &mut Tables, ptr: u64, n: u64) -> R<()> {
        if let Some((&base, a)) = t.allocs.range_mut(..=ptr).next_back() {
            if ptr.checked_add(n).is_some_and(|e| e <= base + a.span) {
                a.touched = true;
                return Ok(());
            }
        }
        if t.vmm.covers(ptr, n) {
            return Ok(());
        }
        Err(CUDA_ERROR_INVALID_VALUE)
    }

    /// Synchronous copies first wait for the context's earlier work (legacy stream order).
    fn before_sync_copy(&self, cur: &Current) {
        sleep_until(cur.last_end.load(Ordering::Acquire));
    }

    /// Copies between host and device memory (`dst_dev`/`src_dev`: which side is device).
    pub fn memcpy(
        &self,
        dst: u64,
        dst_dev: bool,
        src: u64,
        src_dev: bool,
        n: u64,
        sync: bool,
    ) -> R<()> {
        let cur = self.current()?;
        if n == 0 {
            return Ok(());
        }
        if (!dst_dev && dst == 0) || (!src_dev && src == 0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        {
            // Under unified addressing a page-locked host address is also a device address
            // (`cuMemHostGetDevicePointer` answers it unchanged), so a "device" side may be one
            // (XLA's redzone checker copies from pinned buffers with cuMemcpyDtoHAsync).
            let mut t = self.lock();
            if dst_dev && !Self::pinned_host_range(&t, dst, n) {
                self.device_range(&mut t, dst, n)?;
            }
            if src_dev && !Self::pinned_host_range(&t, src, n) {
                self.device_range(&mut t, src, n)?;
            }
        }
        if sync {
            self.before_sync_copy(&cur);
        }
        // SAFETY: device ranges were checked to lie inside our reservations; host pointers are
        // the caller's promise, as with the real driver. `copy` tolerates overlap (DtoD).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n as usize) };
        Ok(())
    }

    /// Whether `[ptr, ptr + n)` lies in one page-locked host range of this process
    /// (`cuMemAllocHost` / `cuMemHostAlloc`, or `cuMemHostRegister`ed).
    fn pinned_host_range(t: &Tables, ptr: u64, n: u64) -> bool {
        let (p, n) = (ptr as usize, n as usize);
        t.host
            .iter()
            .chain(t.host_registered.iter())
            .any(|(&base, &size)| p >= base && p.checked_add(n).is_some_and(|e| e <= base + size))
    }

    /// Sets `count` elements of `elem` (1 or 4) bytes each to `value`. The target may be
    /// device memory (managed memory included) or page-locked host memory: the driver API
    /// documents memsets "to pinned host memory or a Unified Memory region" (API
    /// synchronization behavior, Memset), and XLA's GEMM autotuner memsets pinned buffers.
    pub fn memset(&self, dst: u64, value: u32, elem: u64, count: u64) -> R<()> {
        self.current()?;
        if count == 0 {
            return Ok(());
        }
        if !dst.is_multiple_of(elem) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = count.checked_mul(elem).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        {
            let mut t = self.lock();
            if !Self::pinned_host_range(&t, dst, n) {
                self.device_range(&mut t, dst, n)?;
            }
        }
        if elem == 1 {
            // SAFETY: the range was checked to lie inside our reservation.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value as u8, n as usize) };
        } else {
            // SAFETY: as above; `dst` is 4-byte aligned (checked).
            let s = unsafe { std::slice::from_raw_parts_mut(dst as *mut u32, count as usize) };
            s.fill(value);
        }
        Ok(())
    }

    /// Page-locked host memory: plain host memory here, no device charge.
    pub fn mem_alloc_host(&self, size: u64) -> R<u64> {
        self.current()?;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; alignment is a power of two.
        if unsafe { libc::posix_memalign(&mut p, 4096, size as usize) } != 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.lock().host.insert(p as usize, size as usize);
        Ok(p as u64)
    }

    pub fn mem_free_host(&self, p: u64) -> R<()> {
        self.check()?;
        if self.lock().host.remove(&(p as usize)).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `p` came from posix_memalign in `mem_alloc_host` and is freed once.
        unsafe { libc::free(p as *mut libc::c_void) };
        Ok(())
    }

    /// CUDA arrays (and mipmapped arrays: the sum over levels, each halving every extent).
    pub fn array_create(&self, d: &CUDA_ARRAY3D_DESCRIPTOR, levels: Option<u32>) -> R<u64> {
        let cur = self.current()?;
        let st = self.check()?;
        let mut bytes = array_bytes(d)?;
        if let Some(levels) = levels {
            if levels == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let mut l = *d;
            for _ in 1..levels {
                l.Width = (l.Width / 2).max(1);
                if l.Height > 0 {
                    l.Height = (l.Height / 2).max(1);
                }
                if l.Depth > 0 {
                    l.Depth = (l.Depth / 2).max(1);
                }
                bytes += array_bytes(&l)?;
            }
        }
        let charge = round_up(bytes, ALLOC_GRANULARITY);
        if !st.try_charge(cur.dev, self.slot(), charge) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let mut t = self.lock();
        let h = t.handle(if levels.is_some() {
            kind::MIPMAP
        } else {
            kind::ARRAY
        });
        t.arrays.insert(
            h,
            ArrayAlloc {
                ctx: cur.ctx,
                dev: cur.dev,
                charged: charge,
                mipmapped: levels.is_some(),
            },
        );
        Ok(h)
    }

    pub fn array_destroy(&self, h: u64, mipmapped: bool) -> R<()> {
        let st = self.check()?;
        let mut t = self.lock();
        match t.arrays.get(&h) {
            Some(a) if a.mipmapped == mipmapped => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        let a = t.arrays.remove(&h).expect("checked");
        st.uncharge(a.dev, self.slot(), a.charged);
        Ok(())
    }

    /// An IPC handle for a device allocation's base address.
    pub fn ipc_get_handle(&self, ptr: u64) -> R<[u8; 64]> {
        self.current()?;
        let t = self.lock();
        let a = match t.allocs.get(&ptr) {
            Some(a) if a.kind == AllocKind::Device => a,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(IPC_MAGIC);
        h[8..12].copy_from_slice(&current_pid().to_le_bytes());
        h[12..16].copy_from_slice(&a.dev.to_le_bytes());
        h[16..24].copy_from_slice(&ptr.to_le_bytes());
        h[24..32].copy_from_slice(&a.size.to_le_bytes());
        Ok(h)
    }

    /// Maps another process's allocation: new address space here, no physical charge (the
    /// memory stays the exporter's). Contents are not shared (see the README).
    pub fn ipc_open(&self, h: &[u8; 64]) -> R<u64> {
        let cur = self.current()?;
        if &h[..8] != IPC_MAGIC {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        let size = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
        if dev >= self.check()?.device_count() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = self.lock();
        let on = Current { dev, ..cur };
        self.alloc_in(&mut t, &on, size, 0, AllocKind::Ipc, false)
    }

    pub fn ipc_close(&self, ptr: u64) -> R<()> {
        self.current()?;
        let mut t = self.lock();
        match t.allocs.get(&ptr) {
            Some(a) if a.kind == AllocKind::Ipc => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.free_alloc(&mut t, ptr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn arena_first_fit_and_coalescing() {
        let mut a = Arena::map(1 << 30, false).unwrap();
        let x = a.alloc(4 * MIB).unwrap();
        let y = a.alloc(2 * MIB).unwrap();
        let z = a.alloc(2 * MIB).unwrap();
        assert_eq!(y, x + 4 * MIB);
        a.free(x, 4 * MIB);
        a.free(y, 2 * MIB);
        assert_eq!(a.alloc(6 * MIB), Some(x), "freed neighbours coalesce");
        a.free(z, 2 * MIB);
        a.free(x, 6 * MIB);
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.alloc_at(x + 2 * MIB, 2 * MIB), Some(x + 2 * MIB));
        assert_eq!(a.alloc_at(x + 2 * MIB, 2 * MIB), None);
    }

    #[test]
    fn allocations_round_to_2mib_and_free() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        assert_eq!(c.mem_alloc(1), Err(CUDA_ERROR_INVALID_CONTEXT));
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        let p = c.mem_alloc(1).unwrap();
        assert_eq!(st.used_memory(0) - base, 2 * MIB);
        let q = c.mem_alloc(2 * MIB + 1).unwrap();
        assert_eq!(st.used_memory(0) - base, 6 * MIB);
        assert_eq!(c.mem_address_range(q + 100).unwrap(), (q, 2 * MIB + 1));
        assert_eq!(c.mem_alloc(0), Err(CUDA_ERROR_INVALID_VALUE));
        let (free, total) = c.mem_get_info().unwrap();
        assert_eq!(total, 1 << 30);
        assert_eq!(free, total - base - 6 * MIB);
        c.mem_free(p).unwrap();
        assert_eq!(c.mem_free(p), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(c.mem_free(q + 1), Err(CUDA_ERROR_INVALID_VALUE));
        c.mem_free(q).unwrap();
        assert_eq!(st.used_memory(0), base);
        // Out of memory is the card's, rounding included.
        assert_eq!(c.mem_alloc(1 << 30), Err(CUDA_ERROR_OUT_OF_MEMORY));
        let (p, pitch) = c.mem_alloc_pitch(1000, 3000, 4).unwrap();
        assert_eq!(pitch, 1024);
        assert_eq!(st.used_memory(0) - base, round_up(1024 * 3000, 2 * MIB));
        c.mem_free(p).unwrap();
        assert_eq!(c.mem_alloc_pitch(1000, 1, 3), Err(CUDA_ERROR_INVALID_VALUE));
        let l = c.mem_alloc_legacy(4096).unwrap();
        assert_eq!(st.used_memory(0) - base, 2 * MIB);
        c.mem_free(l as u64).unwrap();
        let (l, pitch) = c.mem_alloc_pitch_legacy(1000, 3000, 4).unwrap();
        assert_eq!(pitch, 1024);
        assert_eq!(st.used_memory(0) - base, round_up(1024 * 3000, 2 * MIB));
        c.mem_free(l as u64).unwrap();
        assert_eq!(st.used_memory(0), base);
        let m = c.mem_alloc_managed(3 * MIB, CU_MEM_ATTACH_GLOBAL).unwrap();
        assert_eq!(st.used_memory(0) - base, 4 * MIB);
        c.mem_free(m).unwrap();
        assert_eq!(c.mem_alloc_managed(1, 7), Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn copies_move_bytes() {
        let c = driver(small_overhead());
        c.ctx_create(0, 0).unwrap();
        let d = c.mem_alloc(4096).unwrap();
        let src: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let mut back = vec![0u8; 4096];
        c.memcpy(d, true, src.as_ptr() as u64, false, 4096, true)
            .unwrap();
        let e = c.mem_alloc(4096).unwrap();
        c.memcpy(e, true, d, true, 4096, true).unwrap();
        c.memcpy(back.as_mut_ptr() as u64, false, e, true, 4096, true)
            .unwrap();
        assert_eq!(back, src);
        c.memset(e, 0xAB, 1, 16).unwrap();
        c.memset(e + 16, 0xDEADBEEF, 4, 4).unwrap();
        c.memcpy(back.as_mut_ptr() as u64, false, e, true, 32, true)
            .unwrap();
        assert_eq!(&back[..16], &[0xAB; 16]);
        assert_eq!(&back[16..20], &0xDEADBEEFu32.to_ne_bytes());
        assert_eq!(c.memset(e + 1, 0, 4, 1), Err(CUDA_ERROR_INVALID_VALUE));
        // Page-locked host memory can be set too (allocated or registered), within its range;
        // pageable host memory cannot.
        let pinned = c.mem_alloc_host(64).unwrap();
        c.memset(pinned, 7, 4, 16).unwrap();
        // SAFETY: 64 bytes of host memory the fake allocated.
        assert_eq!(unsafe { *((pinned + 60) as *const u32) }, 7);
        assert_eq!(c.memset(pinned, 0, 4, 17), Err(CUDA_ERROR_INVALID_VALUE));
        let mut pageable = vec![0u32; 16];
        let at = pageable.as_mut_ptr() as u64;
        assert_eq!(c.memset(at, 9, 4, 16), Err(CUDA_ERROR_INVALID_VALUE));
        c.host_register(at, 64).unwrap();
        c.memset(at, 9, 4, 16).unwrap();
        assert_eq!(pageable, vec![9; 16]);
        // A pinned address is a device address too (unified addressing): copies take it.
        c.memcpy(e, true, pinned, true, 64, true).unwrap();
        c.memcpy(pinned, true, e, true, 64, false).unwrap();
        assert_eq!(
            c.memcpy(e, true, pinned, true, 65, true),
            Err(CUDA_ERROR_INVALID_VALUE),
            "not past the pinned range"
        );
        c.host_unregister(at).unwrap();
        c.mem_free_host(pinned).unwrap();
        // Past the reservation of the allocation, or nowhere at all.
        assert_eq!(
            c.memcpy(back.as_mut_ptr() as u64, false, e, true, 4 * MIB, true),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            c.memcpy(back.as_mut_ptr() as u64, false, 0x1000, true, 4, true),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn host_memory_and_arrays() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        let h = c.mem_alloc_host(100 * MIB).unwrap();
        assert_eq!(st.used_memory(0), base, "host memory is not device memory");
        c.mem_free_host(h).unwrap();
        assert_eq!(c.mem_free_host(h), Err(CUDA_ERROR_INVALID_VALUE));
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 1024,
            Height: 1024,
            Depth: 0,
            Format: 0x20, // FLOAT
            NumChannels: 4,
            Flags: 0,
        };
        let a = c.array_create(&d, None).unwrap();
        assert_eq!(st.used_memory(0) - base, 16 * MIB);
        let m = c.array_create(&d, Some(2)).unwrap();
        // 16 MiB + 4 MiB levels.
        assert_eq!(st.used_memory(0) - base, 36 * MIB);
        assert_eq!(c.array_destroy(a, true), Err(CUDA_ERROR_INVALID_HANDLE));
        c.array_destroy(a, false).unwrap();
        c.array_destroy(m, true).unwrap();
        assert_eq!(st.used_memory(0), base);
    }

    #[test]
    fn ipc_import_is_not_charged() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let p = c.mem_alloc(8 * MIB).unwrap();
        let used = st.used_memory(0);
        let h = c.ipc_get_handle(p).unwrap();
        let q = c.ipc_open(&h).unwrap();
        assert_ne!(p, q);
        assert_eq!(st.used_memory(0), used);
        assert_eq!(c.mem_address_range(q).unwrap(), (q, 8 * MIB));
        assert_eq!(c.mem_free(q), Err(CUDA_ERROR_INVALID_VALUE));
        c.ipc_close(q).unwrap();
        assert_eq!(c.ipc_close(q), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(c.ipc_get_handle(p + 1), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
