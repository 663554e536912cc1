//! `cuGetProcAddress` resolution over a table of exported functions.
//!
//! Each entry names an exported symbol, the base name a caller asks for (no `_v2`, `_ptsz` or
//! `_ptds` suffix), the lowest CUDA version whose headers map the base name to this symbol,
//! and its variant (default, per-thread default stream `_ptds`/`_ptsz`). Resolution:
//! entries newer than the driver itself are not offered; among the rest, the one with the
//! highest version not above the caller's `cudaVersion` wins; with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, a per-thread variant is preferred when one
//! qualifies. No entry for the name: SYMBOL_NOT_FOUND; entries, but all newer than the
//! caller's version: VERSION_NOT_SUFFICIENT.

use gpuslice_abi::cuda::proc_address::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Default,
    /// Per-thread default stream, synchronous API (`_ptds`).
    Ptds,
    /// Per-thread default stream, stream API (`_ptsz`).
    Ptsz,
}

#[derive(Clone, Copy, Debug)]
pub struct ProcEntry {
    pub name: &'static str,
    pub base: &'static str,
    pub min_version: i32,
    pub variant: Variant,
    pub ptr: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(usize),
    NotFound,
    VersionNotSufficient,
}

pub fn lookup(
    table: &[ProcEntry],
    symbol: &str,
    cuda_version: i32,
    flags: u64,
    driver_version: i32,
) -> Lookup {
    let offered = || {
        table
            .iter()
            .filter(move |e| e.base == symbol && e.min_version <= driver_version)
    };
    if offered().next().is_none() {
        return Lookup::NotFound;
    }
    let best = |per_thread: bool| {
        offered()
            .filter(|e| (e.variant != Variant::Default) == per_thread)
            .filter(|e| e.min_version <= cuda_version)
            .max_by_key(|e| e.min_version)
    };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let pick = if per_thread {
        best(true).or_else(|| best(false))
    } else {
        best(false)
    };
    match pick {
        Some(e) => Lookup::Found(e.ptr),
        None => Lookup::VersionNotSufficient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(
        name: &'static str,
        base: &'static str,
        v: i32,
        variant: Variant,
        ptr: usize,
    ) -> ProcEntry {
        ProcEntry {
            name,
            base,
            min_version: v,
            variant,
            ptr,
        }
    }

    #[test]
    fn picks_by_version_variant_and_driver() {
        use Variant::*;
        let t = [
            e("cuCtxCreate", "cuCtxCreate", 2000, Default, 1),
            e("cuCtxCreate_v2", "cuCtxCreate", 3020, Default, 2),
            e("cuCtxCreate_v3", "cuCtxCreate", 11040, Default, 3),
            e("cuCtxCreate_v4", "cuCtxCreate", 12050, Default, 4),
            e("cuLaunchKernel", "cuLaunchKernel", 4000, Default, 5),
            e("cuLaunchKernel_ptsz", "cuLaunchKernel", 7000, Ptsz, 6),
            e("cuMemAllocAsync", "cuMemAllocAsync", 11020, Default, 7),
        ];
        let ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        assert_eq!(lookup(&t, "cuCtxCreate", 3020, 0, 13000), Lookup::Found(2));
        assert_eq!(lookup(&t, "cuCtxCreate", 11080, 0, 13000), Lookup::Found(3));
        assert_eq!(lookup(&t, "cuCtxCreate", 12080, 0, 13000), Lookup::Found(4));
        // A 12.4 driver does not offer cuCtxCreate_v4.
        assert_eq!(lookup(&t, "cuCtxCreate", 12080, 0, 12040), Lookup::Found(3));
        assert_eq!(
            lookup(&t, "cuLaunchKernel", 12000, ptds, 13000),
            Lookup::Found(6)
        );
        assert_eq!(
            lookup(&t, "cuLaunchKernel", 12000, 0, 13000),
            Lookup::Found(5)
        );
        assert_eq!(
            lookup(&t, "cuLaunchKernel", 6050, ptds, 13000),
            Lookup::Found(5)
        );
        assert_eq!(
            lookup(&t, "cuMemAllocAsync", 12000, ptds, 13000),
            Lookup::Found(7)
        );
        assert_eq!(
            lookup(&t, "cuMemAllocAsync", 11000, 0, 13000),
            Lookup::VersionNotSufficient
        );
        assert_eq!(lookup(&t, "cuNope", 12000, 0, 13000), Lookup::NotFound);
        assert_eq!(lookup(&t, "", 12000, 0, 13000), Lookup::NotFound);
        assert_eq!(
            lookup(&t, "cuCtxCreate_v2", 12000, 0, 13000),
            Lookup::NotFound
        );
    }
}
