//! NVML wrappers: memory info reports the slice (what nvidia-smi and pynvml show): total =
//! limit, used = the container's usage from the region, free = the clamped remainder.
//! Device utilisation reports the slice's own processes' share of the card (see
//! [`device_get_utilization_rates`]). The process lists and per-process samples are filtered
//! to the slice, PIDs translated (what is in the slice: `memory::driver_sized`).
//!
//! nvidia-smi reads its process lists through NVML's private export table
//! (`nvmlInternalGetExportTable`), not the public lists: [`internal_export_table`] hands it a
//! copy of the driver's table whose process-list slots apply the same filter.

use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;

use gpuslice_abi::nvml::ret::{NVML_ERROR_NOT_FOUND, NVML_ERROR_UNKNOWN, NVML_SUCCESS};
use gpuslice_abi::nvml::*;

use crate::hooks::lifecycle;
use crate::hooks::out::{answer_list as answer, Out};
use crate::hooks::registry::signature as sig;
use crate::memory;
use crate::memory::driver_sized::{members_only, members_only_by, slice_list, ProcessList};
use crate::memory::Shared;
use gpuslice_policy::{nvml_slice_view, NvmlView};

/// The slice's view of `device` given the driver's physical one; `None` when the device
/// is not limited (or no slice is configured), so the driver's answer stands.
fn slice_view_of(device: nvmlDevice_t, physical: NvmlView) -> Option<NvmlView> {
    lifecycle::slice_config()?;
    let (limit, used) = memory::nvml_slice(device, physical.free)?;
    let view = nvml_slice_view(physical, limit, Some(used));
    Some(memory::oversubscribe::nvml_view(device, view))
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn device_get_memory_info(
    real: sig::nvmlDeviceGetMemoryInfo,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(device, memory) };
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(memory) };
    let (NVML_SUCCESS, Some(m)) = (result, out.read()) else {
        return result;
    };
    // v1 has no reserved field: its `used` includes what v2 calls reserved.
    let physical = NvmlView {
        total: m.total,
        reserved: 0,
        used: m.used,
        free: m.free,
    };
    if let Some(view) = slice_view_of(device, physical) {
        out.write(nvmlMemory_t {
            total: view.total,
            used: view.used + view.reserved,
            free: view.free,
        });
    }
    result
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn device_get_memory_info_v2(
    real: sig::nvmlDeviceGetMemoryInfo_v2,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(device, memory) };
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(memory) };
    let (NVML_SUCCESS, Some(m)) = (result, out.read()) else {
        return result;
    };
    let physical = NvmlView {
        total: m.total,
        reserved: m.reserved,
        used: m.used,
        free: m.free,
    };
    if let Some(view) = slice_view_of(device, physical) {
        out.write(nvmlMemory_v2_t {
            total: view.total,
            reserved: view.reserved,
            used: view.used,
            free: view.free,
            ..m
        });
    }
    result
}

/// How far back from the device's newest sample the slice's samples count: NVML's own
/// utilisation figure covers one sample period of 1/6 s to 1 s.
const UTILISATION_WINDOW_US: u64 = 1_000_000;

/// `nvmlDeviceGetUtilizationRates` on a device limited in the slice: the slice's own
/// processes' share of the card, from the real per-process samples of the slice's members,
/// so an idle slice reads 0 whatever its neighbours do and the neighbours' activity is not
/// disclosed. `gpu` from the samples' `smUtil`, `memory` from their `memUtil` (the same
/// treatment: the card's memory-controller figure is as much the neighbours' as its SM
/// figure). Each is capped at the card's own figure. A driver that cannot give per-process
/// samples makes this answer its error (e.g. `NVML_ERROR_NOT_SUPPORTED`), never the card's
/// figures. Devices without a limit, and processes without a slice, get the card's.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn device_get_utilization_rates(
    real: sig::nvmlDeviceGetUtilizationRates,
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(device, utilization) };
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(utilization) };
    let (NVML_SUCCESS, Some(card)) = (result, out.read()) else {
        return result;
    };
    if lifecycle::slice_config().is_none() {
        return result;
    }
    let Some(samples) = memory::driver_sized::slice_utilization_samples(device) else {
        return result;
    };
    match samples {
        Ok((ours, newest)) => {
            out.write(slice_utilization(&ours, newest, card));
            NVML_SUCCESS
        }
        Err(code) => {
            // Not the card's figures, even to a caller that ignores the result.
            out.write(nvmlUtilization_t { gpu: 0, memory: 0 });
            code
        }
    }
}

/// Pure: the slice's utilisation from its processes' samples. Per process, the mean of its
/// samples within [`UTILISATION_WINDOW_US`] of `newest` (the newest sample of the whole
/// device); summed over processes; capped at the card's figures (and so at 100).
pub(crate) fn slice_utilization(
    ours: &[nvmlProcessUtilizationSample_t],
    newest: Option<u64>,
    card: nvmlUtilization_t,
) -> nvmlUtilization_t {
    let Some(newest) = newest else {
        return nvmlUtilization_t { gpu: 0, memory: 0 };
    };
    let since = newest.saturating_sub(UTILISATION_WINDOW_US);
    // (pid, sum of smUtil, sum of memUtil, samples)
    let mut per_pid: Vec<(u32, u64, u64, u64)> = Vec::new();
    for sample in ours.iter().filter(|s| s.timeStamp >= since) {
        let (sm, mem) = (
            u64::from(sample.smUtil.min(100)),
            u64::from(sample.memUtil.min(100)),
        );
        match per_pid.iter_mut().find(|p| p.0 == sample.pid) {
            Some(p) => {
                p.1 += sm;
                p.2 += mem;
                p.3 += 1;
            }
            None => per_pid.push((sample.pid, sm, mem, 1)),
        }
    }
    let share = |pick: fn(&(u32, u64, u64, u64)) -> u64| -> u64 {
        per_pid.iter().map(|p| (pick(p) + p.3 / 2) / p.3).sum()
    };
    nvmlUtilization_t {
        gpu: share(|p| p.1).min(u64::from(card.gpu.min(100))) as u32,
        memory: share(|p| p.2).min(u64::from(card.memory.min(100))) as u32,
    }
}

/// Per-process utilisation samples: only the slice's processes, under the PIDs the container
/// knows; `NVML_ERROR_NOT_FOUND` (the driver's "no sample") when none of them has one. The
/// compute throttle reads the real samples through `real::`, unaffected.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn process_utilization(
    real: sig::nvmlDeviceGetProcessUtilization,
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    let read =
        |_: &Shared, _| crate::ground::devices::read_utilization_samples(real, device, last_seen);
    match members_only_by(
        device,
        read,
        |s| s.pid,
        |s, pid| nvmlProcessUtilizationSample_t { pid, ..s },
    ) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, samples, count, last_seen) },
        Some(Err(code)) => code,
        Some(Ok(list)) if list.is_empty() => NVML_ERROR_NOT_FOUND,
        // SAFETY: the caller's count and buffer (the handler contract).
        Some(Ok(list)) => unsafe { answer(list, count, samples, |s| s) },
    }
}

/// Graphics and MPS process lists (v2/v3): only the slice's processes, as in the compute
/// lists, so other tenants' PIDs and memory are not disclosed (gpustat, Ray and nvidia-smi
/// merge these lists with the compute one).
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn other_processes(
    real: ProcessList,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    let read = |_: &Shared, _| crate::ground::devices::read_process_list(real, device, 0);
    match members_only(device, read) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, count, infos) },
        Some(Err(code)) => code,
        // SAFETY: the caller's count and buffer (the handler contract).
        Some(Ok(list)) => unsafe { answer(list, count, infos, |p| p) },
    }
}

/// The v1 layouts of the graphics and MPS lists, filtered as [`other_processes`].
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn other_processes_v1(
    real: unsafe extern "C" fn(
        nvmlDevice_t,
        *mut c_uint,
        *mut nvmlProcessInfo_v1_t,
    ) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    let read = |_: &Shared, _| {
        let v1 = crate::ground::devices::read_process_list(real, device, 0)?;
        Ok(v1
            .into_iter()
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.usedGpuMemory,
                ..Default::default()
            })
            .collect())
    };
    match members_only(device, read) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, count, infos) },
        Some(Err(code)) => code,
        // SAFETY: the caller's count and buffer (the handler contract).
        Some(Ok(list)) => unsafe {
            answer(list, count, infos, |p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.usedGpuMemory,
            })
        },
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn compute_processes_v1(
    real: sig::nvmlDeviceGetComputeRunningProcesses,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    match slice_list(device) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, count, infos) },
        Some(Err(code)) => code,
        // SAFETY: the caller's count and buffer (the handler contract).
        Some(Ok(list)) => unsafe {
            answer(list, count, infos, |p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.usedGpuMemory,
            })
        },
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn compute_processes_v2(
    real: sig::nvmlDeviceGetComputeRunningProcesses_v2,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    match slice_list(device) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, count, infos) },
        Some(Err(code)) => code,
        // SAFETY: the caller's count and buffer (the handler contract).
        Some(Ok(list)) => unsafe { answer(list, count, infos, |p| p) },
    }
}

/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn compute_processes_v3(
    real: sig::nvmlDeviceGetComputeRunningProcesses_v3,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    match slice_list(device) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, count, infos) },
        Some(Err(code)) => code,
        // SAFETY: the caller's count and buffer (the handler contract).
        Some(Ok(list)) => unsafe { answer(list, count, infos, |p| p) },
    }
}

// ---------------------------------------------------------------- the private table

/// The table nvidia-smi asks `nvmlInternalGetExportTable` for,
/// `6c3efec4-8fc9-4e6c-a327-ee696e12f7c4`, as the bytes it passes (first three fields
/// little-endian).
pub(crate) const SMI_TABLE_GUID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// Table layouts the shim knows, by the size in bytes the driver writes in word 0: 1960 in
/// 535.261.03, 2008 in 550.163.01 (Debian's libnvidia-ml1 packages; 550's layout is 535's with
/// slots appended). In both, slots 213, 214 and 215 are the compute, graphics and MPS process
/// lists, `(device, unsigned *count, entry *buf)` with NVML's count protocol.
const KNOWN_TABLE_BYTES: [usize; 2] = [1960, 2008];
/// The process-list slots: compute, graphics, MPS compute.
pub(crate) const PROCESS_LIST_SLOTS: [usize; 3] = [213, 214, 215];

/// One entry of the private process lists (4128 bytes): `nvmlProcessDetail_v1_t`'s numbers,
/// then the process name inline.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PrivateProcessEntry {
    pub pid: c_uint,
    _pad: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
    pub used_cc_protected_memory: u64,
    pub name: [u8; 4096],
}

const _: () = assert!(std::mem::size_of::<PrivateProcessEntry>() == 4128);

type PrivateList =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut PrivateProcessEntry) -> nvmlReturn_t;

/// The driver's table and the copy handed out instead (both as addresses).
struct Interposed {
    original: usize,
    copy: &'static [usize],
    real: [Option<PrivateList>; 3],
}

static INTERPOSED: OnceLock<Option<Interposed>> = OnceLock::new();

/// Pure: whether a table of `size_bytes` has a layout whose process-list slots are known.
pub(crate) fn known_layout(size_bytes: usize) -> bool {
    KNOWN_TABLE_BYTES.contains(&size_bytes)
}

/// `nvmlInternalGetExportTable(&table, &guid)`: the driver's answer, except that for
/// nvidia-smi's table of a known layout the caller gets a copy whose process-list slots keep
/// to the slice. Any other table, an unknown layout (said once at debug level), or a second
/// driver table in the same process pass through unchanged.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn internal_export_table(
    real: sig::nvmlInternalGetExportTable,
    table: *mut *const c_void,
    guid: *const c_void,
) -> nvmlReturn_t {
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { real(table, guid) };
    // SAFETY: the caller's out-parameter (the handler contract).
    let out = unsafe { Out::new(table) };
    let Some(original) = out
        .read()
        .filter(|t| result == NVML_SUCCESS && !t.is_null())
    else {
        return result;
    };
    // SAFETY: non-null, and NVML's table GUIDs are 16 bytes (the handler contract).
    if guid.is_null() || unsafe { guid.cast::<[u8; 16]>().read_unaligned() } != SMI_TABLE_GUID {
        return result;
    }
    let original = original as usize;
    let interposed = INTERPOSED.get_or_init(|| {
        // SAFETY: the driver's table starts with its size in bytes.
        let size = unsafe { *(original as *const usize) };
        if !known_layout(size) {
            crate::log_debug!(
                "nvidia-smi's NVML table has an unknown layout ({size} bytes); its process \
                 lists pass through unfiltered"
            );
            return None;
        }
        // SAFETY: a table of `size` bytes, as its first word says.
        let words = unsafe { std::slice::from_raw_parts(original as *const usize, size / 8) };
        let mut copy = words.to_vec();
        let mut real = [None; 3];
        for (i, &slot) in PROCESS_LIST_SLOTS.iter().enumerate() {
            if words[slot] != 0 {
                // SAFETY: in the known layouts this slot is a process list of this signature.
                real[i] = Some(unsafe { std::mem::transmute::<usize, PrivateList>(words[slot]) });
                copy[slot] = PRIVATE_LIST_WRAPPERS[i] as usize;
            }
        }
        Some(Interposed {
            original,
            copy: Box::leak(copy.into_boxed_slice()),
            real,
        })
    });
    match interposed {
        Some(t) if t.original == original => {
            out.write(t.copy.as_ptr().cast());
        }
        _ => {}
    }
    result
}

const PRIVATE_LIST_WRAPPERS: [PrivateList; 3] =
    [private_list::<0>, private_list::<1>, private_list::<2>];

/// A process-list slot of the copied table: the slice's processes only, under the PIDs the
/// container knows (the policy of the public lists, [`members_only_by`]). Not an exported
/// symbol, so it carries its own panic boundary and nesting check.
unsafe extern "C" fn private_list<const I: usize>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    buf: *mut PrivateProcessEntry,
) -> nvmlReturn_t {
    let Some(Some(table)) = INTERPOSED.get() else {
        return NVML_ERROR_UNKNOWN;
    };
    let Some(real) = table.real[I] else {
        return NVML_ERROR_UNKNOWN;
    };
    let run = || {
        crate::ffi_panic_boundary!(NVML_ERROR_UNKNOWN, {
            // SAFETY: the caller's arguments, passed on as the driver's slot takes them.
            unsafe { filtered_private_list(real, device, count, buf) }
        })
    };
    // SAFETY: as above.
    crate::hooks::nesting::outermost(run, || unsafe { real(device, count, buf) })
}

/// A slice member's entry under the PID its container knows. nvidia-smi leaves a row out of
/// its table when the name is empty (what a driver that cannot see the process's name gives);
/// the member is visible here by that PID, so its name is taken from `/proc` then.
fn with_container_pid(entry: PrivateProcessEntry, pid: c_uint) -> PrivateProcessEntry {
    let mut entry = PrivateProcessEntry { pid, ..entry };
    if entry.name[0] == 0 {
        let name = program_name(pid);
        let len = name.len().min(entry.name.len() - 1);
        entry.name[..len].copy_from_slice(&name.as_bytes()[..len]);
    }
    entry
}

/// `/proc/PID/cmdline`'s first word (what nvidia-smi shows as the name), else `comm`, else
/// empty.
fn program_name(pid: c_uint) -> String {
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|c| {
            let first = c.split(|b| *b == 0).next()?;
            (!first.is_empty()).then(|| String::from_utf8_lossy(first).into_owned())
        });
    argv0
        .or_else(|| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim_end().to_owned())
        })
        .unwrap_or_default()
}

/// # Safety
/// The caller's arguments of a private process-list slot, as the driver's slot takes them:
/// `count` NULL or valid for reads and writes, `buf` NULL or room for `*count` entries.
unsafe fn filtered_private_list(
    real: PrivateList,
    device: nvmlDevice_t,
    count: *mut c_uint,
    buf: *mut PrivateProcessEntry,
) -> nvmlReturn_t {
    // The driver fills the caller's own buffer (its size is the caller's to vouch for); the
    // slice's entries are then written back over it, compacted.
    let read = |_: &Shared, _| {
        // SAFETY: the caller's arguments, unchanged.
        let result = unsafe { real(device, count, buf) };
        if result != NVML_SUCCESS {
            return Err(result);
        }
        // SAFETY: the caller's count (this function's contract).
        let n = unsafe { Out::new(count) }.read().unwrap_or(0) as usize;
        // SAFETY: the driver wrote `n` entries to the caller's buffer, which holds them.
        Ok((0..n)
            .map(|i| unsafe { buf.add(i).read() })
            .collect::<Vec<_>>())
    };
    match members_only_by(
        device,
        read,
        |e: &PrivateProcessEntry| e.pid,
        with_container_pid,
    ) {
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real(device, count, buf) },
        Some(Err(code)) => code,
        // SAFETY: the caller's count and buffer (this function's contract).
        Some(Ok(list)) => unsafe { answer(list, count, buf, |e| e) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, ts: u64, sm: u32, mem: u32) -> nvmlProcessUtilizationSample_t {
        nvmlProcessUtilizationSample_t {
            pid,
            timeStamp: ts,
            smUtil: sm,
            memUtil: mem,
            encUtil: 0,
            decUtil: 0,
        }
    }

    const CARD: nvmlUtilization_t = nvmlUtilization_t {
        gpu: 90,
        memory: 40,
    };

    #[test]
    fn only_the_checked_table_layouts_are_interposed() {
        assert!(known_layout(1960) && known_layout(2008));
        for other in [0, 8, 1952, 2016, 4096] {
            assert!(!known_layout(other), "{other}");
        }
    }

    #[test]
    fn a_member_entry_gets_its_container_pid_and_a_missing_name() {
        let blank = PrivateProcessEntry {
            pid: 4242,
            _pad: 0,
            used_gpu_memory: 7 << 20,
            gpu_instance_id: u32::MAX,
            compute_instance_id: u32::MAX,
            used_cc_protected_memory: 0,
            name: [0; 4096],
        };
        let me = std::process::id();
        let e = with_container_pid(blank, me);
        assert_eq!((e.pid, e.used_gpu_memory), (me, 7 << 20));
        let len = e.name.iter().position(|b| *b == 0).unwrap();
        assert!(len > 0, "named from /proc");
        let mut named = blank;
        named.name[..4].copy_from_slice(b"keep");
        let e = with_container_pid(named, me);
        assert_eq!(&e.name[..5], b"keep\0", "the driver's name stands");
    }

    #[test]
    fn an_idle_slice_reads_zero_whatever_the_card_shows() {
        let idle = slice_utilization(&[], Some(10_000_000), CARD);
        assert_eq!((idle.gpu, idle.memory), (0, 0));
        let nothing_sampled = slice_utilization(&[], None, CARD);
        assert_eq!((nothing_sampled.gpu, nothing_sampled.memory), (0, 0));
    }

    #[test]
    fn the_slice_reads_its_processes_share_from_recent_samples() {
        let now = 50_000_000;
        let samples = [
            // pid 1: two samples in the window (mean 30) and an old one that no longer counts.
            sample(1, now, 20, 10),
            sample(1, now - 500_000, 40, 10),
            sample(1, now - 5_000_000, 100, 100),
            // pid 2: one sample.
            sample(2, now - 100_000, 25, 5),
        ];
        let u = slice_utilization(&samples, Some(now), CARD);
        assert_eq!((u.gpu, u.memory), (55, 15));
        // A slice whose last sample is old reads 0 while the device is sampled now.
        let u = slice_utilization(&samples[2..3], Some(now), CARD);
        assert_eq!((u.gpu, u.memory), (0, 0));
    }

    #[test]
    fn the_slice_never_reads_more_than_the_card() {
        let now = 7_000_000;
        let samples = [sample(1, now, 80, 90), sample(2, now, 70, 0)];
        let u = slice_utilization(&samples, Some(now), CARD);
        assert_eq!((u.gpu, u.memory), (90, 40));
        let card_over = nvmlUtilization_t {
            gpu: 250,
            memory: 250,
        };
        let u = slice_utilization(&samples, Some(now), card_over);
        assert_eq!((u.gpu, u.memory), (100, 90));
    }
}
