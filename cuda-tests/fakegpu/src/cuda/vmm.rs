//! Virtual memory management: cuMemCreate / Release / AddressReserve / AddressFree / Map /
//! Unmap / SetAccess / granularity / properties / RetainAllocationHandle.
//!
//! Physical memory is charged at cuMemCreate. A handle holds references (create = 1, each
//! cuMemRetainAllocationHandle + 1, each cuMemRelease - 1) and mappings; its memory returns
//! to the card only when both reach zero, so releasing a mapped handle defers the free until
//! the last unmap, as on real hardware. Address reservations come from one per-process
//! `MAP_NORESERVE` arena, so mapped ranges can be copied to and from; two mappings of one
//! handle do not alias each other's bytes (a documented gap).

use super::memory::Arena;
use super::{kind, Cuda, ALLOC_GRANULARITY, R};
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::vmm::*;
use gpuslice_abi::cuda::{CUmemAccessDesc, CUmemAllocationProp};
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Copy, Debug)]
pub struct PhysHandle {
    pub dev: u32,
    pub size: u64,
    pub refs: u32,
    pub maps: u32,
    pub requested_handle_types: u32,
    pub alloc_flags: [u8; 8],
}

#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
}

#[derive(Default)]
pub struct Vmm {
    arena: Option<Arena>,
    pub handles: HashMap<u64, PhysHandle>,
    /// Reserved ranges: start -> size.
    pub reserves: BTreeMap<u64, u64>,
    /// Mapped ranges: start -> mapping.
    pub maps: BTreeMap<u64, Mapping>,
}

impl Vmm {
    pub fn mapped_range(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&start, m) = self.maps.range(..=ptr).next_back()?;
        (ptr < start + m.size).then_some((start, m.size))
    }

    /// Whether `[ptr, ptr + n)` is covered by contiguous mappings.
    pub fn covers(&self, ptr: u64, n: u64) -> bool {
        let Some(end) = ptr.checked_add(n) else {
            return false;
        };
        let mut at = ptr;
        while at < end {
            match self.mapped_range(at) {
                Some((start, size)) => at = start + size,
                None => return false,
            }
        }
        true
    }

    fn reserve_containing(&self, ptr: u64, size: u64) -> Option<(u64, u64)> {
        let (&start, &len) = self.reserves.range(..=ptr).next_back()?;
        (ptr + size <= start + len).then_some((start, len))
    }
}

fn check_prop(c: &Cuda, prop: &CUmemAllocationProp) -> R<u32> {
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    c.device_index(prop.location.id)
        .map_err(|_| CUDA_ERROR_INVALID_DEVICE)
}

impl Cuda {
    pub fn mem_granularity(&self, prop: &CUmemAllocationProp, option: i32) -> R<u64> {
        self.check()?;
        check_prop(self, prop)?;
        match option {
            CU_MEM_ALLOC_GRANULARITY_MINIMUM | CU_MEM_ALLOC_GRANULARITY_RECOMMENDED => {
                Ok(ALLOC_GRANULARITY)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    pub fn mem_create(&self, size: u64, prop: &CUmemAllocationProp, flags: u64) -> R<u64> {
        let st = self.check()?;
        let dev = check_prop(self, prop)?;
        if size == 0 || !size.is_multiple_of(ALLOC_GRANULARITY) || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !st.try_charge(dev, self.slot(), size) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let f = prop.allocFlags;
        let mut alloc_flags = [f.compressionType, f.gpuDirectRDMACapable, 0, 0, 0, 0, 0, 0];
        alloc_flags[2..4].copy_from_slice(&f.usage.to_ne_bytes());
        let mut t = self.lock();
        let h = t.handle(kind::VMM);
        t.vmm.handles.insert(
            h,
            PhysHandle {
                dev,
                size,
                refs: 1,
                maps: 0,
                requested_handle_types: prop.requestedHandleTypes,
                alloc_flags,
            },
        );
        Ok(h)
    }

    /// Frees a handle's memory once it has neither references nor mappings.
    fn maybe_free_handle(&self, vmm: &mut Vmm, h: u64) {
        if let Some(p) = vmm.handles.get(&h) {
            if p.refs == 0 && p.maps == 0 {
                if let Ok(st) = self.check() {
                    st.uncharge(p.dev, self.slot(), p.size);
                }
                vmm.handles.remove(&h);
            }
        }
    }

    pub fn mem_release(&self, h: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        match t.vmm.handles.get_mut(&h) {
            Some(p) if p.refs > 0 => p.refs -= 1,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.maybe_free_handle(&mut t.vmm, h);
        Ok(())
    }

    pub fn mem_address_reserve(&self, size: u64, alignment: u64, addr: u64, flags: u64) -> R<u64> {
        self.check()?;
        if size == 0
            || !size.is_multiple_of(ALLOC_GRANULARITY)
            || flags != 0
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(ALLOC_GRANULARITY);
        let mut t = self.lock();
        if t.vmm.arena.is_none() {
            t.vmm.arena = Arena::map(1 << 40, false);
        }
        let arena = t.vmm.arena.as_mut().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let hinted = (addr != 0 && addr.is_multiple_of(align))
            .then(|| arena.alloc_at(addr, size))
            .flatten();
        let ptr = match hinted {
            Some(p) => p,
            None => {
                // Over-reserve, then give back the unaligned head and the tail.
                let span = size + align - ALLOC_GRANULARITY;
                let raw = arena.alloc(span).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
                let p = raw.div_ceil(align) * align;
                if p > raw {
                    arena.free(raw, p - raw);
                }
                if raw + span > p + size {
                    arena.free(p + size, raw + span - p - size);
                }
                p
            }
        };
        t.vmm.reserves.insert(ptr, size);
        Ok(ptr)
    }

    pub fn mem_address_free(&self, ptr: u64, size: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        if t.vmm.reserves.get(&ptr) != Some(&size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Mappings still inside the range go with it.
        let inside: Vec<u64> = t.vmm.maps.range(ptr..ptr + size).map(|(&a, _)| a).collect();
        for a in inside {
            let m = t.vmm.maps.remove(&a).expect("listed");
            if let Some(p) = t.vmm.handles.get_mut(&m.handle) {
                p.maps -= 1;
            }
            self.maybe_free_handle(&mut t.vmm, m.handle);
        }
        t.vmm.reserves.remove(&ptr);
        super::memory::discard(ptr, size);
        t.vmm
            .arena
            .as_mut()
            .expect("reserved from it")
            .free(ptr, size);
        Ok(())
    }

    pub fn mem_map(&self, ptr: u64, size: u64, offset: u64, h: u64, flags: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        if size == 0
            || flags != 0
            || !ptr.is_multiple_of(ALLOC_GRANULARITY)
            || !size.is_multiple_of(ALLOC_GRANULARITY)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = *t.vmm.handles.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if p.refs == 0 || offset.checked_add(size).is_none_or(|e| e > p.size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if t.vmm.reserve_containing(ptr, size).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let overlaps =
            t.vmm.mapped_range(ptr).is_some() || t.vmm.maps.range(ptr..ptr + size).next().is_some();
        if overlaps {
            return Err(CUDA_ERROR_ALREADY_MAPPED);
        }
        t.vmm.maps.insert(ptr, Mapping { size, handle: h });
        t.vmm.handles.get_mut(&h).expect("checked").maps += 1;
        Ok(())
    }

    pub fn mem_unmap(&self, ptr: u64, size: u64) -> R<()> {
        self.check()?;
        let mut t = self.lock();
        if size == 0
            || !t.vmm.covers(ptr, size)
            || t.vmm.mapped_range(ptr).map(|r| r.0) != Some(ptr)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let inside: Vec<u64> = t.vmm.maps.range(ptr..ptr + size).map(|(&a, _)| a).collect();
        for a in inside {
            let m = t.vmm.maps.remove(&a).expect("listed");
            super::memory::discard(a, m.size);
            if let Some(p) = t.vmm.handles.get_mut(&m.handle) {
                p.maps -= 1;
            }
            self.maybe_free_handle(&mut t.vmm, m.handle);
        }
        Ok(())
    }

    pub fn mem_set_access(&self, ptr: u64, size: u64, desc: &[CUmemAccessDesc]) -> R<()> {
        self.check()?;
        if desc.is_empty() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for d in desc {
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            self.device_index(d.location.id)
                .map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        }
        if !self.lock().vmm.covers(ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    pub fn mem_allocation_prop(&self, h: u64) -> R<CUmemAllocationProp> {
        self.check()?;
        let t = self.lock();
        let p = t.vmm.handles.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: CUmemAllocationProp is plain data; all-zero is valid (null metadata).
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = p.requested_handle_types;
        prop.location.type_ = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = p.dev as i32;
        prop.allocFlags.compressionType = p.alloc_flags[0];
        prop.allocFlags.gpuDirectRDMACapable = p.alloc_flags[1];
        prop.allocFlags.usage = u16::from_ne_bytes([p.alloc_flags[2], p.alloc_flags[3]]);
        Ok(prop)
    }

    /// The handle mapped at `addr`, with one more reference (released by cuMemRelease).
    pub fn mem_retain_handle(&self, addr: u64) -> R<u64> {
        self.check()?;
        let mut t = self.lock();
        let (start, _) = t.vmm.mapped_range(addr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = t.vmm.maps[&start].handle;
        t.vmm
            .handles
            .get_mut(&h)
            .expect("mapped handles exist")
            .refs += 1;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    const MIB: u64 = 1 << 20;

    fn prop(dev: i32) -> CUmemAllocationProp {
        // SAFETY: plain data, all-zero is valid.
        let mut p: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = dev;
        p
    }

    #[test]
    fn release_while_mapped_defers_the_free() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        assert_eq!(c.mem_granularity(&prop(0), 0).unwrap(), 2 * MIB);
        assert_eq!(
            c.mem_granularity(&prop(7), 0),
            Err(CUDA_ERROR_INVALID_DEVICE)
        );
        assert_eq!(
            c.mem_create(3 * MIB, &prop(0), 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        let h = c.mem_create(4 * MIB, &prop(0), 0).unwrap();
        assert_eq!(st.used_memory(0), 4 * MIB, "charged at create");
        let va = c.mem_address_reserve(8 * MIB, 0, 0, 0).unwrap();
        assert_eq!(st.used_memory(0), 4 * MIB, "reservations are free");
        c.mem_map(va, 4 * MIB, 0, h, 0).unwrap();
        assert_eq!(
            c.mem_map(va, 2 * MIB, 0, h, 0),
            Err(CUDA_ERROR_ALREADY_MAPPED)
        );
        c.mem_map(va + 4 * MIB, 2 * MIB, 2 * MIB, h, 0).unwrap();
        let access = [CUmemAccessDesc {
            location: prop(0).location,
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }];
        c.mem_set_access(va, 6 * MIB, &access).unwrap();
        assert_eq!(
            c.mem_set_access(va, 8 * MIB, &access),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(c.mem_retain_handle(va + 5 * MIB).unwrap(), h);
        c.mem_release(h).unwrap();
        c.mem_release(h).unwrap();
        assert_eq!(st.used_memory(0), 4 * MIB, "still mapped twice");
        assert_eq!(c.mem_allocation_prop(h).unwrap().location.id, 0);
        c.mem_unmap(va, 4 * MIB).unwrap();
        assert_eq!(st.used_memory(0), 4 * MIB);
        c.mem_unmap(va + 4 * MIB, 2 * MIB).unwrap();
        assert_eq!(st.used_memory(0), 0, "freed at the last unmap");
        assert_eq!(c.mem_release(h), Err(CUDA_ERROR_INVALID_VALUE));
        c.mem_address_free(va, 8 * MIB).unwrap();
        assert_eq!(
            c.mem_address_free(va, 8 * MIB),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn release_unmapped_frees_at_once_and_alignment_holds() {
        let c = driver(small_overhead());
        let st = c.check().unwrap();
        let h = c.mem_create(2 * MIB, &prop(1), 0).unwrap();
        assert_eq!(st.used_memory(1), 2 * MIB);
        c.mem_release(h).unwrap();
        assert_eq!(st.used_memory(1), 0);
        let va = c.mem_address_reserve(2 * MIB, 64 * MIB, 0, 0).unwrap();
        assert_eq!(va % (64 * MIB), 0);
        assert_eq!(
            c.mem_address_reserve(MIB, 0, 0, 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }
}
