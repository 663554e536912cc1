//! Managed (unified) memory with residency, under `FAKEGPU_MANAGED_MEMORY=on-demand`: where
//! each 2 MiB chunk of a `cuMemAllocManaged` allocation lives, and what the card holds of it.
//! The default (`device`) keeps the older model: managed memory is placed on its device at
//! allocation and charged there, like a driver without on-demand paging
//! (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` 0).
//!
//! The model follows the CUDA driver API's documentation of `cuMemAllocManaged`,
//! `cuMemAdvise` and `cuMemPrefetchAsync` and the programming guide's unified memory chapter
//! for a Pascal or later GPU on Linux (concurrent managed access; sources in
//! `cuda-tests/README.md`):
//!
//! * **Allocation** places nothing: a chunk is populated where it is first touched.
//! * **`cuMemAdvise`** records the advice per chunk and moves nothing ("setting the preferred
//!   location does not cause data to migrate"; accessed-by "does not cause data migration").
//! * **`cuMemPrefetchAsync`** moves the chunks to the destination now: to a device they are
//!   charged there (one that does not fit stays where it is: the fake evicts nothing); to the
//!   host (`CU_DEVICE_CPU`) they leave the card and their pages are committed in the process's
//!   memory (so its memory cgroup counts them, as it counts a real driver's).
//! * **A kernel launch** touches every managed allocation one of its 64-bit arguments points
//!   into (the fake knows a kernel's arguments for PTX images only), whole. A chunk on the
//!   launching device is local. A chunk on the host stays there and is read over the host link
//!   when it is in its preferred location (the host) or mapped for the device (accessed-by):
//!   "if the data is already in its preferred location and the faulting processor can
//!   establish a mapping, migration is avoided". Otherwise it migrates to the device (an
//!   unpopulated chunk with the host preferred is populated on the host). Both cost time on
//!   the timeline at the host link's bandwidth: a migration once, a remote read at every
//!   launch.
//! * **Copies and memsets** neither move nor populate chunks; direct CPU access is not seen.
//!
//! What the fake keeps in process memory is the bytes themselves, wherever a chunk lives: a
//! chunk that moved to the device keeps its (already committed) host pages.

use super::{Cuda, Tables, ALLOC_GRANULARITY, R};
use gpuslice_abi::cuda::result::*;

/// `CU_DEVICE_CPU`: the host as a location in the pre-12.2 advice and prefetch API.
pub const CPU: i32 = -1;
/// `CU_DEVICE_INVALID`: no location (range attributes).
pub const NO_LOCATION: i32 = -2;

/// The unit of residency: the fake's allocation granularity.
pub const CHUNK: u64 = ALLOC_GRANULARITY;

/// `CUmem_advise` values.
pub mod advice {
    pub const SET_READ_MOSTLY: i32 = 1;
    pub const UNSET_READ_MOSTLY: i32 = 2;
    pub const SET_PREFERRED_LOCATION: i32 = 3;
    pub const UNSET_PREFERRED_LOCATION: i32 = 4;
    pub const SET_ACCESSED_BY: i32 = 5;
    pub const UNSET_ACCESSED_BY: i32 = 6;
}

/// `CUmem_range_attribute` values the fake answers.
pub mod range_attribute {
    pub const READ_MOSTLY: i32 = 1;
    pub const PREFERRED_LOCATION: i32 = 2;
    pub const ACCESSED_BY: i32 = 3;
    pub const LAST_PREFETCH_LOCATION: i32 = 4;
}

/// Where a chunk's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residence {
    /// Never touched: nowhere yet.
    Nowhere,
    Host,
    Device(u32),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    pub at: Option<Residence>,
    /// `CPU` or a device ordinal; `None` = no preference.
    pub preferred: Option<i32>,
    /// Bit `d`: device `d` keeps a mapping (accessed-by); bit 31: the CPU.
    pub accessed_by: u32,
    pub read_mostly: bool,
}

impl Chunk {
    fn residence(&self) -> Residence {
        self.at.unwrap_or(Residence::Nowhere)
    }
}

/// One managed allocation's chunks.
#[derive(Clone, Debug, Default)]
pub struct Managed {
    pub chunks: Vec<Chunk>,
    /// Where the last prefetch over it went (`CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION`).
    pub last_prefetch: Option<i32>,
}

/// Bytes a launch moved or read over the host link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub migrated: u64,
    pub remote: u64,
}

fn bit(location: i32) -> u32 {
    if location == CPU {
        1 << 31
    } else {
        1 << (location as u32 % 31)
    }
}

/// Commits the host pages of `[addr, addr + len)` (in the process's own reservation) without
/// changing their bytes, so the process's memory (and its cgroup) holds them as a real
/// driver's host pages are held.
fn commit_host_pages(addr: u64, len: u64) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: the range lies inside one of the process's own anonymous reservations.
    let done =
        unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, MADV_POPULATE_WRITE) };
    if done == 0 {
        return;
    }
    // Kernels before 5.14: write each page's first byte back to itself.
    let mut page = addr;
    while page < addr + len {
        // SAFETY: as above; a volatile read and write of the same byte keeps the data.
        unsafe {
            let p = page as *mut u8;
            p.write_volatile(p.read_volatile());
        }
        page += 4096;
    }
}

impl Cuda {
    /// Whether managed memory has residency (`FAKEGPU_MANAGED_MEMORY=on-demand`).
    pub fn managed_on_demand(&self) -> bool {
        self.config.managed_on_demand
    }

    /// Registers a new managed allocation at `base`, `size` bytes, nothing placed.
    pub(crate) fn managed_created(t: &mut Tables, base: u64, size: u64) {
        let chunks = size.max(1).div_ceil(CHUNK) as usize;
        t.managed.insert(
            base,
            Managed {
                chunks: vec![Chunk::default(); chunks],
                last_prefetch: None,
            },
        );
    }

    /// Gives back what the card held of the managed allocation at `base` (it is being freed).
    pub(crate) fn managed_freed(&self, t: &mut Tables, base: u64) {
        let Some(managed) = t.managed.remove(&base) else {
            return;
        };
        let Ok(st) = self.check() else { return };
        for chunk in &managed.chunks {
            if let Residence::Device(d) = chunk.residence() {
                st.uncharge(d, self.slot(), CHUNK);
            }
        }
    }

    /// The managed allocation containing `[ptr, ptr + n)`: (base, first chunk, last chunk).
    fn managed_range(t: &Tables, ptr: u64, n: u64) -> R<(u64, usize, usize)> {
        let (&base, alloc) = t
            .allocs
            .range(..=ptr)
            .next_back()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let end = ptr.checked_add(n.max(1)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if !t.managed.contains_key(&base) || end > base + alloc.size.max(1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let first = ((ptr - base) / CHUNK) as usize;
        let last = ((end - 1 - base) / CHUNK) as usize;
        Ok((base, first, last))
    }

    /// `cuMemAdvise` over a managed range: recorded, nothing moves.
    pub fn mem_advise(&self, ptr: u64, n: u64, what: i32, location: i32) -> R<()> {
        self.check()?;
        if location != CPU {
            self.device_spec(location)?;
        }
        let mut t = self.lock();
        let (base, first, last) = Self::managed_range(&t, ptr, n)?;
        let managed = t.managed.get_mut(&base).expect("checked");
        for chunk in &mut managed.chunks[first..=last] {
            match what {
                advice::SET_READ_MOSTLY => chunk.read_mostly = true,
                advice::UNSET_READ_MOSTLY => chunk.read_mostly = false,
                advice::SET_PREFERRED_LOCATION => chunk.preferred = Some(location),
                advice::UNSET_PREFERRED_LOCATION => chunk.preferred = None,
                advice::SET_ACCESSED_BY => chunk.accessed_by |= bit(location),
                advice::UNSET_ACCESSED_BY => chunk.accessed_by &= !bit(location),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        Ok(())
    }

    /// `cuMemPrefetchAsync` over a managed range: the chunks move to `location` now (the
    /// stream's order is not modelled, as for copies).
    pub fn mem_prefetch(&self, ptr: u64, n: u64, location: i32, stream: u64) -> R<()> {
        self.stream_info(stream)?;
        if location != CPU {
            self.device_spec(location)?;
        }
        let st = self.check()?;
        let mut t = self.lock();
        let (base, first, last) = Self::managed_range(&t, ptr, n)?;
        let managed = t.managed.get_mut(&base).expect("checked");
        managed.last_prefetch = Some(location);
        for index in first..=last {
            let chunk = &mut managed.chunks[index];
            let addr = base + index as u64 * CHUNK;
            match (chunk.residence(), location) {
                (Residence::Host, CPU) => {}
                (Residence::Device(d), CPU) => {
                    st.uncharge(d, self.slot(), CHUNK);
                    commit_host_pages(addr, CHUNK);
                    chunk.at = Some(Residence::Host);
                }
                (Residence::Nowhere, CPU) => {
                    commit_host_pages(addr, CHUNK);
                    chunk.at = Some(Residence::Host);
                }
                (Residence::Device(d), to) if d == to as u32 => {}
                (from, to) => {
                    if st.try_charge(to as u32, self.slot(), CHUNK) {
                        if let Residence::Device(d) = from {
                            st.uncharge(d, self.slot(), CHUNK);
                        }
                        chunk.at = Some(Residence::Device(to as u32));
                    }
                }
            }
        }
        Ok(())
    }

    /// A launch on `dev` touches the managed allocations `args` point into: residency moves
    /// as the module doc says; returns what crossed the host link.
    pub fn managed_touched(&self, dev: u32, args: &[u64]) -> R<Traffic> {
        let st = self.check()?;
        let mut traffic = Traffic::default();
        let mut t = self.lock();
        let mut seen: Vec<u64> = Vec::new();
        for &arg in args {
            let Some((&base, alloc)) = t.allocs.range(..=arg).next_back() else {
                continue;
            };
            if arg >= base + alloc.size.max(1) || seen.contains(&base) {
                continue;
            }
            seen.push(base);
            let Some(managed) = t.managed.get_mut(&base) else {
                continue;
            };
            for (index, chunk) in managed.chunks.iter_mut().enumerate() {
                let addr = base + index as u64 * CHUNK;
                let mapped = chunk.accessed_by & bit(dev as i32) != 0;
                let host_preferred = chunk.preferred == Some(CPU);
                match chunk.residence() {
                    Residence::Device(d) if d == dev => {}
                    Residence::Host | Residence::Nowhere
                        if (host_preferred || mapped) && !chunk.read_mostly =>
                    {
                        if chunk.residence() == Residence::Nowhere {
                            // First touch: placed where it is preferred (the host).
                            commit_host_pages(addr, CHUNK);
                            chunk.at = Some(Residence::Host);
                        }
                        traffic.remote += CHUNK;
                    }
                    from => {
                        if st.try_charge(dev, self.slot(), CHUNK) {
                            if let Residence::Device(d) = from {
                                st.uncharge(d, self.slot(), CHUNK);
                            }
                            if from != Residence::Nowhere {
                                traffic.migrated += CHUNK;
                            }
                            chunk.at = Some(Residence::Device(dev));
                        } else {
                            // The card is full and the fake evicts nothing: read remotely.
                            if from == Residence::Nowhere {
                                commit_host_pages(addr, CHUNK);
                                chunk.at = Some(Residence::Host);
                            }
                            traffic.remote += CHUNK;
                        }
                    }
                }
            }
        }
        Ok(traffic)
    }

    /// Nanoseconds `traffic` takes over `dev`'s host link.
    pub fn host_link_ns(&self, dev: u32, traffic: Traffic) -> u64 {
        let bytes = traffic.migrated + traffic.remote;
        if bytes == 0 {
            return 0;
        }
        let per_second = self.host_link_bytes_per_second(dev).max(1);
        (u128::from(bytes) * 1_000_000_000 / u128::from(per_second)) as u64
    }

    /// The host link's bandwidth: `FAKEGPU_HOST_LINK_GBPS`, else by generation: PCIe 3.0 x16
    /// (~12 GB/s in practice) before Ampere, PCIe 4.0 x16 (~25 GB/s) on Ampere and Ada,
    /// PCIe 5.0 x16 (~50 GB/s) from Hopper.
    pub fn host_link_bytes_per_second(&self, dev: u32) -> u64 {
        if let Some(gbps) = self.config.host_link_gbps {
            return (gbps * 1e9) as u64;
        }
        let cc = self
            .check()
            .ok()
            .and_then(|st| st.device(dev))
            .map_or(7, |d| d.cc_major);
        match cc {
            0..=7 => 12_000_000_000,
            8 => 25_000_000_000,
            _ => 50_000_000_000,
        }
    }

    /// `cuMemRangeGetAttribute` over a managed range: `words` 32-bit values (one, or the
    /// accessed-by list). Chunks that disagree read as no location / not read-mostly, as
    /// the driver answers for a range whose pages differ.
    pub fn mem_range_attribute(
        &self,
        ptr: u64,
        n: u64,
        attribute: i32,
        words: usize,
    ) -> R<Vec<i32>> {
        self.check()?;
        let t = self.lock();
        let (base, first, last) = Self::managed_range(&t, ptr, n)?;
        let managed = &t.managed[&base];
        let chunks = &managed.chunks[first..=last];
        let same = |f: &dyn Fn(&Chunk) -> Option<i32>| {
            let value = f(&chunks[0]);
            if chunks.iter().all(|c| f(c) == value) {
                value
            } else {
                None
            }
        };
        let mut out = match attribute {
            range_attribute::READ_MOSTLY => {
                vec![i32::from(chunks.iter().all(|c| c.read_mostly))]
            }
            range_attribute::PREFERRED_LOCATION => {
                vec![same(&|c| c.preferred).unwrap_or(NO_LOCATION)]
            }
            range_attribute::LAST_PREFETCH_LOCATION => {
                vec![managed.last_prefetch.unwrap_or(NO_LOCATION)]
            }
            range_attribute::ACCESSED_BY => {
                let mask = chunks.iter().fold(u32::MAX, |m, c| m & c.accessed_by);
                let mut devices: Vec<i32> = (0..31).filter(|d| mask & (1 << d) != 0).collect();
                if mask & (1 << 31) != 0 {
                    devices.push(CPU);
                }
                devices
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        if words == 0 || (attribute != range_attribute::ACCESSED_BY && words != 1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out.resize(words.max(out.len()), NO_LOCATION);
        out.truncate(words);
        Ok(out)
    }

    /// What the card and the host hold of this process's managed allocations: (device
    /// bytes per device, host bytes).
    pub fn managed_residency(&self) -> (Vec<(u32, u64)>, u64) {
        let t = self.lock();
        let mut devices: Vec<(u32, u64)> = Vec::new();
        let mut host = 0;
        for chunk in t.managed.values().flat_map(|m| m.chunks.iter()) {
            match chunk.residence() {
                Residence::Host => host += CHUNK,
                Residence::Device(d) => match devices.iter_mut().find(|(x, _)| *x == d) {
                    Some((_, bytes)) => *bytes += CHUNK,
                    None => devices.push((d, CHUNK)),
                },
                Residence::Nowhere => {}
            }
        }
        (devices, host)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;
    use gpuslice_abi::cuda::flags::CU_MEM_ATTACH_GLOBAL;

    const MIB: u64 = 1 << 20;

    fn on_demand() -> Config {
        Config {
            managed_on_demand: true,
            ..small_overhead()
        }
    }

    #[test]
    fn managed_memory_is_placed_where_it_is_touched_or_sent() {
        let c = driver(on_demand());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let base = st.used_memory(0);
        let m = c.mem_alloc_managed(8 * MIB, CU_MEM_ATTACH_GLOBAL).unwrap();
        assert_eq!(st.used_memory(0), base, "nothing placed at allocation");
        // Advice moves nothing.
        c.mem_advise(m, 8 * MIB, advice::SET_PREFERRED_LOCATION, CPU)
            .unwrap();
        c.mem_advise(m, 8 * MIB, advice::SET_ACCESSED_BY, 0)
            .unwrap();
        assert_eq!(st.used_memory(0), base);
        assert_eq!(c.managed_residency(), (vec![], 0));
        // Prefetch to the device: charged there; to the host: gone from the card.
        c.mem_prefetch(m, 4 * MIB, 0, 0).unwrap();
        assert_eq!(st.used_memory(0), base + 4 * MIB);
        c.mem_prefetch(m, 8 * MIB, CPU, 0).unwrap();
        assert_eq!(st.used_memory(0), base);
        assert_eq!(c.managed_residency(), (vec![], 8 * MIB));
        // A launch reading it from the device: preferred on the host and mapped, it stays,
        // and every launch reads it over the link.
        let t = c.managed_touched(0, &[m + 100]).unwrap();
        assert_eq!(
            t,
            Traffic {
                migrated: 0,
                remote: 8 * MIB
            }
        );
        assert_eq!(st.used_memory(0), base);
        assert_eq!(
            c.mem_range_attribute(m, 8 * MIB, range_attribute::PREFERRED_LOCATION, 1),
            Ok(vec![CPU])
        );
        assert_eq!(
            c.mem_range_attribute(m, MIB, range_attribute::ACCESSED_BY, 3),
            Ok(vec![0, NO_LOCATION, NO_LOCATION])
        );
        assert_eq!(
            c.mem_range_attribute(m, MIB, range_attribute::LAST_PREFETCH_LOCATION, 1),
            Ok(vec![CPU])
        );
        // Without the advice, a device access migrates it (once).
        c.mem_advise(m, 8 * MIB, advice::UNSET_PREFERRED_LOCATION, CPU)
            .unwrap();
        c.mem_advise(m, 8 * MIB, advice::UNSET_ACCESSED_BY, 0)
            .unwrap();
        let t = c.managed_touched(0, &[m]).unwrap();
        assert_eq!(
            t,
            Traffic {
                migrated: 8 * MIB,
                remote: 0
            }
        );
        assert_eq!(st.used_memory(0), base + 8 * MIB);
        assert_eq!(c.managed_touched(0, &[m]).unwrap(), Traffic::default());
        c.mem_free(m).unwrap();
        assert_eq!(
            st.used_memory(0),
            base,
            "freeing gives back what the card held"
        );
        // A fresh allocation first touched from the device lands there.
        let n = c.mem_alloc_managed(2 * MIB, CU_MEM_ATTACH_GLOBAL).unwrap();
        assert_eq!(c.managed_touched(0, &[n]).unwrap(), Traffic::default());
        assert_eq!(st.used_memory(0), base + 2 * MIB);
        c.ctx_destroy(c.ctx_get_current().unwrap()).unwrap();
        assert_eq!(
            st.used_memory(0),
            0,
            "a context's end frees its managed memory"
        );
    }

    #[test]
    fn advice_and_prefetch_take_managed_ranges_only() {
        let c = driver(on_demand());
        c.ctx_create(0, 0).unwrap();
        let d = c.mem_alloc(2 * MIB).unwrap();
        assert_eq!(
            c.mem_advise(d, MIB, advice::SET_PREFERRED_LOCATION, CPU),
            Err(CUDA_ERROR_INVALID_VALUE),
            "plain device memory is not managed"
        );
        assert_eq!(
            c.mem_prefetch(d, MIB, CPU, 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        let m = c.mem_alloc_managed(3 * MIB, CU_MEM_ATTACH_GLOBAL).unwrap();
        assert_eq!(
            c.mem_prefetch(m, 5 * MIB, CPU, 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            c.mem_advise(m, MIB, 9, CPU),
            Err(CUDA_ERROR_INVALID_VALUE),
            "unknown advice"
        );
        assert_eq!(
            c.mem_advise(m, MIB, advice::SET_ACCESSED_BY, 7),
            Err(CUDA_ERROR_INVALID_DEVICE)
        );
    }

    #[test]
    fn a_prefetch_the_card_cannot_hold_leaves_the_chunks_where_they_are() {
        let c = driver(on_demand());
        let st = c.check().unwrap();
        c.ctx_create(0, 0).unwrap();
        let free = st.total_memory(0) - st.used_memory(0);
        let m = c
            .mem_alloc_managed(free + 4 * MIB, CU_MEM_ATTACH_GLOBAL)
            .unwrap();
        c.mem_prefetch(m, free + 4 * MIB, 0, 0).unwrap();
        assert_eq!(st.used_memory(0), st.total_memory(0), "full, never past");
        let (devices, host) = c.managed_residency();
        assert_eq!((devices, host), (vec![(0, free)], 0));
    }

    #[test]
    fn reading_host_memory_from_a_kernel_takes_time_at_the_links_bandwidth() {
        let c = driver(Config {
            host_link_gbps: Some(1.0),
            ..on_demand()
        });
        c.ctx_create(0, 0).unwrap();
        let traffic = Traffic {
            migrated: 0,
            remote: 1_000_000,
        };
        assert_eq!(
            c.host_link_ns(0, traffic),
            1_000_000,
            "1 MB at 1 GB/s: 1 ms"
        );
        assert_eq!(c.host_link_ns(0, Traffic::default()), 0);
        let c = driver(on_demand());
        assert_eq!(
            c.host_link_bytes_per_second(0),
            12_000_000_000,
            "V100: PCIe 3.0"
        );
        assert_eq!(
            c.host_link_bytes_per_second(1),
            50_000_000_000,
            "H200: PCIe 5.0"
        );
    }
}
