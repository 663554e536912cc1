//! The NVML logic behind the exported shells: init refcount, device handles, argument
//! checking, list protocols, and the mapping from the shared state to NVML's numbers.
//!
//! Errors are `Err(nvmlReturn_t)` so that the shells are one `guard(|| ...)` each.

use fakegpu::nvml_view::{self, BoardProfile, MemoryView};
use fakegpu::{DeviceSpec, ProcessUsage, SharedState};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_char, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};

pub type NvmlResult<T> = Result<T, nvmlReturn_t>;

/// Runs an entry point's body; a panic becomes `NVML_ERROR_UNKNOWN` instead of unwinding into
/// C (undefined behaviour).
pub fn guard(body: impl FnOnce() -> NvmlResult<()>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// `nvmlInit*` minus `nvmlShutdown` calls: NVML is usable while this is above zero.
static INIT_REFS: AtomicU32 = AtomicU32::new(0);

pub fn init(_flags: c_uint) -> NvmlResult<()> {
    // Opening the state is what "loading the driver" means for the fake; a state file that
    // cannot be opened is the fake's equivalent of a missing kernel module.
    if let Err(e) = fakegpu::state() {
        eprintln!("fakegpu NVML: cannot open the fake GPU state: {e}");
        return Err(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    INIT_REFS.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

pub fn shutdown() -> NvmlResult<()> {
    INIT_REFS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| NVML_ERROR_UNINITIALIZED)
}

/// The state, if NVML is initialised.
pub fn initialized() -> NvmlResult<&'static SharedState> {
    if INIT_REFS.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    fakegpu::state().map_err(|_| NVML_ERROR_UNINITIALIZED)
}

pub fn error_string(code: nvmlReturn_t) -> &'static CStr {
    match code {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        NVML_ERROR_NO_DATA => c"No data",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    }
}

// ---- handles ----

/// Most devices one fake state can describe through NVML.
pub const MAX_DEVICES: usize = 64;

/// What an `nvmlDevice_t` points to. Handles are addresses inside a static table, so they
/// stay valid and identical across calls, init/shutdown cycles and threads, like the real
/// library's, and a foreign pointer is recognisable by its address alone.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Handle {
    index: u32,
}

static HANDLES: [Handle; MAX_DEVICES] = {
    let mut table = [Handle { index: 0 }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        table[i].index = i as u32;
        i += 1;
    }
    table
};

fn handle_for(index: u32) -> nvmlDevice_t {
    &HANDLES[index as usize] as *const Handle as nvmlDevice_t
}

/// The device index a handle designates, without dereferencing it (the caller may pass
/// garbage).
fn index_of(handle: nvmlDevice_t) -> NvmlResult<u32> {
    let base = HANDLES.as_ptr() as usize;
    let addr = handle as usize;
    let size = std::mem::size_of::<Handle>();
    if addr < base || addr >= base + size * MAX_DEVICES {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let index = (addr - base) / size;
    // A pointer into the middle of an entry is not a handle we gave out.
    if base + index * size != addr {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(index as u32)
}

pub fn device_count(state: &SharedState) -> u32 {
    state.device_count().min(MAX_DEVICES as u32)
}

pub fn handle_by_index(state: &SharedState, index: u32) -> NvmlResult<nvmlDevice_t> {
    if index >= device_count(state) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    crate::faults::check_lost(index)?;
    Ok(handle_for(index))
}

pub fn handle_by_uuid(state: &SharedState, uuid: &str) -> NvmlResult<nvmlDevice_t> {
    (0..device_count(state))
        .find(|&i| state.device(i).is_some_and(|d| d.uuid == uuid))
        .ok_or(NVML_ERROR_NOT_FOUND)
        .and_then(|i| crate::faults::check_lost(i).map(|()| handle_for(i)))
}

pub fn handle_by_pci_bus_id(state: &SharedState, bus_id: &str) -> NvmlResult<nvmlDevice_t> {
    let wanted = nvml_view::parse_pci_bus_id(bus_id).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    (0..device_count(state))
        .find(|&i| {
            state
                .device(i)
                .is_some_and(|d| nvml_view::pci_address(&d, i) == wanted)
        })
        .map(handle_for)
        .ok_or(NVML_ERROR_NOT_FOUND)
}

/// A resolved, existing device of an initialised NVML.
pub struct Dev {
    pub state: &'static SharedState,
    pub index: u32,
    pub spec: DeviceSpec,
    pub profile: BoardProfile,
}

/// The handle of device `index`.
pub fn handle_of(index: u32) -> nvmlDevice_t {
    handle_for(index)
}

pub fn device(handle: nvmlDevice_t) -> NvmlResult<Dev> {
    let state = initialized()?;
    let index = index_of(handle)?;
    if index >= device_count(state) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let spec = state.device(index).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    crate::faults::check_lost(index)?;
    let profile = nvml_view::board_profile(&spec);
    Ok(Dev {
        state,
        index,
        spec,
        profile,
    })
}

impl Dev {
    /// GPU utilisation over the sampling window, percent.
    pub fn utilization(&self) -> u32 {
        nvml_view::device_utilization(self.state, self.index)
    }

    pub fn memory(&self) -> MemoryView {
        // A killed process's memory is freed by the real driver at once (or after the release
        // delay); the fake only learns of the death when someone looks, so every observer
        // reaps first.
        self.state.reap_dead_processes();
        nvml_view::memory_view_of(&self.spec, self.state.used_memory(self.index))
    }

    /// Compute processes with their PIDs already translated by `FAKEGPU_PID_OFFSET`.
    pub fn compute_processes(&self) -> Vec<ProcessUsage> {
        // `processes` reaps first.
        self.state
            .processes(self.index)
            .into_iter()
            .map(|p| ProcessUsage {
                pid: nvml_view::nvml_pid(p.pid),
                used_memory: p.used_memory,
            })
            .collect()
    }

    /// [`Dev::compute_processes`] with each process's name as the driver reports it: the
    /// program its card-namespace PID runs (`/proc/PID/cmdline`'s first word, else `comm`),
    /// empty when that PID is not visible from here.
    pub fn compute_processes_named(&self) -> Vec<crate::export_table::NamedProcess> {
        // `processes` reaps first.
        self.state
            .processes(self.index)
            .into_iter()
            .map(|p| crate::export_table::NamedProcess {
                pid: nvml_view::nvml_pid(p.pid),
                used_memory: p.used_memory,
                name: process_name(p.pid),
            })
            .collect()
    }
}

pub fn process_name(pid: u32) -> String {
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

// ---- argument helpers ----

/// A required out-parameter.
///
/// # Safety
/// `ptr` must be null or valid for writes of `T` for the returned lifetime.
pub unsafe fn out<'a, T>(ptr: *mut T) -> NvmlResult<&'a mut T> {
    // SAFETY: non-null validity is the caller's contract.
    unsafe { ptr.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// A required input string.
///
/// # Safety
/// `ptr` must be null or point to a NUL-terminated string.
pub unsafe fn in_str(ptr: *const c_char) -> NvmlResult<String> {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    Ok(unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned())
}

/// Copies `text` and its NUL into a caller buffer of `len` bytes; INSUFFICIENT_SIZE when it
/// does not fit (nothing is written then, like the real library).
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
pub unsafe fn write_str(buf: *mut c_char, len: c_uint, text: &str) -> NvmlResult<()> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` has `len >= bytes.len() + 1` writable bytes, and a Rust string cannot
    // overlap a caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    Ok(())
}

/// NVML's list protocol: `*count` in = capacity of `out`, out = entries (needed or written).
/// Capacity too small (including a null buffer with `*count == 0`) sets the needed count and
/// returns INSUFFICIENT_SIZE; an empty list is SUCCESS with 0 whatever the buffer.
///
/// # Safety
/// `count` must be null or valid; `out` null or valid for `*count` writes of `T`.
pub unsafe fn fill_list<S, T>(
    count: *mut c_uint,
    out_buf: *mut T,
    items: &[S],
    convert: impl Fn(&S) -> T,
) -> NvmlResult<()> {
    // SAFETY: per the caller's contract.
    let count = unsafe { out(count) }?;
    let needed = items.len() as c_uint;
    if *count < needed {
        *count = needed;
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if needed == 0 {
        *count = 0;
        return Ok(());
    }
    if out_buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: i < needed <= *count, the capacity the caller vouched for.
        unsafe { out_buf.add(i).write(convert(item)) };
    }
    *count = needed;
    Ok(())
}

pub fn process_info(p: &ProcessUsage) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory,
        // Not a MIG device: the real driver reports "not available" for both.
        gpuInstanceId: NVML_VALUE_NOT_AVAILABLE_UINT,
        computeInstanceId: NVML_VALUE_NOT_AVAILABLE_UINT,
    }
}

fn copy_c(dst: &mut [c_char], text: &str) {
    for (d, b) in dst.iter_mut().zip(text.bytes().chain(std::iter::repeat(0))) {
        *d = b as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
}

pub fn pci_info(dev: &Dev) -> nvmlPciInfo_t {
    let addr = nvml_view::pci_address(&dev.spec, dev.index);
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
        domain: addr.0,
        bus: addr.1,
        device: addr.2,
        pciDeviceId: dev.profile.pci_device_id,
        pciSubSystemId: dev.profile.pci_subsystem_id,
        busId: [0; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
    };
    copy_c(&mut info.busIdLegacy, &nvml_view::bus_id_legacy(addr));
    copy_c(&mut info.busId, &nvml_view::bus_id(addr));
    info
}

pub fn attributes(dev: &Dev) -> nvmlDeviceAttributes_t {
    nvmlDeviceAttributes_t {
        multiprocessorCount: dev.spec.sm_count,
        // Copy engines and media engines are not modelled by the fake: 0.
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
        // The whole GPU is one slice when MIG is off.
        gpuInstanceSliceCount: 1,
        computeInstanceSliceCount: 1,
        memorySizeMB: dev.spec.total_memory >> 20,
    }
}

/// nvmlDeviceGetProcessUtilization, as the driver answers it (see `fakegpu::nvml_sampling`):
/// per sample period newer than `last_seen_us` (0: the whole sample buffer), one sample per
/// process, `smUtil` = its percent of that period, `timeStamp` = the period's end; both in
/// wall-clock microseconds (NVML's "CPU timestamp"), so a returned timestamp can be passed
/// back as the next `last_seen_us`. Exact mode: one period, `[last_seen, now)`, every
/// process. Realistic mode: only periods already published (after the delay), only
/// processes with a non-zero figure, some dropped.
///
/// # Safety
/// `count` must be null or valid; `samples` null or valid for `*count` writes.
pub unsafe fn process_utilization(
    dev: &Dev,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen_us: u64,
) -> NvmlResult<()> {
    // SAFETY: per the caller's contract.
    let count = unsafe { out(count) }?;
    let sampling = fakegpu::nvml_sampling::sampling();
    let clock = fakegpu::nvml_sampling::clock();
    let periods = sampling.periods(last_seen_us, fakegpu::now_ns(), clock);
    dev.state.reap_dead_processes();
    let procs = dev.state.processes(dev.index);
    let mut list: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
    for &(from, to) in &periods {
        for p in &procs {
            if sampling.dropped(p.pid, to) {
                continue;
            }
            let busy = dev.state.busy_ns(dev.index, Some(p.pid), from, to);
            let sm = sampling.percent(busy, to - from);
            if sampling.realistic && sm == 0 {
                continue;
            }
            list.push(nvmlProcessUtilizationSample_t {
                pid: nvml_view::nvml_pid(p.pid),
                timeStamp: clock.wall_us(to),
                smUtil: sm,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            });
        }
    }
    if list.is_empty() {
        // The real driver's answer when no sample is newer than `last_seen_us`.
        return Err(NVML_ERROR_NOT_FOUND);
    }
    if samples.is_null() {
        // The size query: pynvml and nvidia-smi call with a null buffer first and expect
        // INSUFFICIENT_SIZE plus the count whatever `*count` held.
        *count = list.len() as c_uint;
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `count` was checked non-null above; `samples` per the caller's contract.
    unsafe { fill_list(count as *mut c_uint, samples, &list, |s| *s) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_protocol_reports_needed_count_and_never_overruns() {
        let items = [1u32, 2, 3];
        let mut buf = [0u32; 4];
        let mut n: c_uint = 2;
        // SAFETY: `n` never exceeds the buffer's 4 entries.
        unsafe {
            assert_eq!(
                fill_list(&mut n, buf.as_mut_ptr(), &items, |x| *x),
                Err(NVML_ERROR_INSUFFICIENT_SIZE)
            );
            assert_eq!((n, buf), (3, [0; 4]));
            n = 0;
            assert_eq!(
                fill_list(&mut n, std::ptr::null_mut::<u32>(), &items, |x| *x),
                Err(NVML_ERROR_INSUFFICIENT_SIZE)
            );
            n = 4;
            assert_eq!(fill_list(&mut n, buf.as_mut_ptr(), &items, |x| *x), Ok(()));
            assert_eq!((n, buf), (3, [1, 2, 3, 0]));
            n = 7;
            let empty: [u32; 0] = [];
            assert_eq!(
                fill_list(&mut n, std::ptr::null_mut::<u32>(), &empty, |x| *x),
                Ok(())
            );
            assert_eq!(n, 0);
            assert_eq!(
                fill_list(std::ptr::null_mut(), buf.as_mut_ptr(), &items, |x| *x),
                Err(NVML_ERROR_INVALID_ARGUMENT)
            );
        }
    }

    #[test]
    fn strings_need_room_for_their_nul() {
        let mut buf = [0x55 as c_char; 8];
        // SAFETY: lengths never exceed the 8-byte buffer.
        unsafe {
            assert_eq!(
                write_str(buf.as_mut_ptr(), 3, "abc"),
                Err(NVML_ERROR_INSUFFICIENT_SIZE)
            );
            assert_eq!(buf[0], 0x55);
            assert_eq!(write_str(buf.as_mut_ptr(), 4, "abc"), Ok(()));
            assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str(), Ok("abc"));
        }
    }

    #[test]
    fn only_table_entries_are_handles() {
        assert_eq!(index_of(handle_for(5)), Ok(5));
        assert_eq!(index_of(handle_for(MAX_DEVICES as u32 - 1)), Ok(63));
        let inside = (handle_for(1) as usize + 1) as nvmlDevice_t;
        assert_eq!(index_of(inside), Err(NVML_ERROR_INVALID_ARGUMENT));
        assert_eq!(
            index_of(std::ptr::null_mut()),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
        let mut other = 0u32;
        let foreign = (&mut other as *mut u32).cast();
        assert_eq!(index_of(foreign), Err(NVML_ERROR_INVALID_ARGUMENT));
    }

    #[test]
    fn a_panicking_body_becomes_unknown_error() {
        assert_eq!(guard(|| panic!("boom")), NVML_ERROR_UNKNOWN);
        assert_eq!(guard(|| Err(NVML_ERROR_NOT_FOUND)), NVML_ERROR_NOT_FOUND);
        assert_eq!(guard(|| Ok(())), NVML_SUCCESS);
    }
}
