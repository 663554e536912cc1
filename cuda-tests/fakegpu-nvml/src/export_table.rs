//! nvidia-smi's private entry point: `nvmlInternalGetExportTable(&table, &guid)` and the
//! table it hands out for GUID `6c3efec4-8fc9-4e6c-a327-ee696e12f7c4`, laid out as the real
//! library of the reported driver branch lays it out (size word, null slots).
//!
//! Every slot is its own trampoline (`slot::<N>`), so a call names its slot
//! (`FAKEGPU_NVML_TRACE_TABLE` logs them): that is how the served slots were found. Served:
//! 26 (debug log), 81 (handle by index), 213-215 (process lists); every other non-null slot
//! answers NOT_SUPPORTED and writes nothing. The layout (size word, null slots, trampolines)
//! is `fakegpu::export_table`'s, as for the CUDA runtime's tables. cuda-tests/README.md
//! lists the facts and where each comes from.

use crate::core::{self, guard, out, NvmlResult};
use fakegpu::export_table::{layout, Slot};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;

pub type Args = [usize; 6];

/// One distinct function per slot, so a call says which slot it came through.
extern "C" fn slot<const N: usize>(
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
) -> nvmlReturn_t {
    dispatch(N, [a0, a1, a2, a3, a4, a5])
}

type SlotFn = extern "C" fn(usize, usize, usize, usize, usize, usize) -> nvmlReturn_t;

macro_rules! row {
    ($hi:literal) => {
        [
            slot::<{ $hi * 16 }>,
            slot::<{ $hi * 16 + 1 }>,
            slot::<{ $hi * 16 + 2 }>,
            slot::<{ $hi * 16 + 3 }>,
            slot::<{ $hi * 16 + 4 }>,
            slot::<{ $hi * 16 + 5 }>,
            slot::<{ $hi * 16 + 6 }>,
            slot::<{ $hi * 16 + 7 }>,
            slot::<{ $hi * 16 + 8 }>,
            slot::<{ $hi * 16 + 9 }>,
            slot::<{ $hi * 16 + 10 }>,
            slot::<{ $hi * 16 + 11 }>,
            slot::<{ $hi * 16 + 12 }>,
            slot::<{ $hi * 16 + 13 }>,
            slot::<{ $hi * 16 + 14 }>,
            slot::<{ $hi * 16 + 15 }>,
        ]
    };
}

const SLOT_ROWS: usize = 16;
static SLOTS: [[SlotFn; 16]; SLOT_ROWS] = [
    row!(0),
    row!(1),
    row!(2),
    row!(3),
    row!(4),
    row!(5),
    row!(6),
    row!(7),
    row!(8),
    row!(9),
    row!(10),
    row!(11),
    row!(12),
    row!(13),
    row!(14),
    row!(15),
];

fn trace() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FAKEGPU_NVML_TRACE_TABLE").is_some_and(|v| v != "0"))
}

fn dispatch(n: usize, a: Args) -> nvmlReturn_t {
    let ret = guard(|| serve(n, a));
    // Slot 26 is nvidia-smi's own debug log, called around every line it prints: traced only
    // at level 2 so that the trace stays readable.
    if trace() && (n != SLOT_DEBUG_LOG || trace_level() >= 2) {
        eprintln!(
            "fakegpu NVML table: slot {n} ({:#x}, {:#x}, {:#x}, {:#x}, {:#x}, {:#x}) -> {ret}",
            a[0], a[1], a[2], a[3], a[4], a[5]
        );
    }
    ret
}

fn trace_level() -> u32 {
    std::env::var("FAKEGPU_NVML_TRACE_TABLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// `printf`-style debug log: `(format, ...)`; the real library writes it to its debug file
/// when one is configured. The fake has none.
pub const SLOT_DEBUG_LOG: usize = 26;
/// `(index, nvmlDevice_t *out, flags)`, flags 0x22 in every call seen: the handle of the
/// device at `index`.
pub const SLOT_HANDLE_BY_INDEX: usize = 81;
/// `(device, unsigned *count, entry *buf)`: compute, graphics, MPS compute process lists.
pub const SLOT_COMPUTE_PROCESSES: usize = 213;
pub const SLOT_GRAPHICS_PROCESSES: usize = 214;
pub const SLOT_MPS_PROCESSES: usize = 215;

/// One entry of the private process lists: the numeric head of `nvmlProcessDetail_v1_t`
/// followed by the process name inline.
pub const PROC_ENTRY_BYTES: usize = 4128;
const PROC_NAME_OFFSET: usize = 32;

fn serve(n: usize, a: Args) -> NvmlResult<()> {
    match n {
        SLOT_DEBUG_LOG => Ok(()),
        SLOT_HANDLE_BY_INDEX => {
            let state = core::initialized()?;
            // SAFETY: the slot's second argument is the caller's out-pointer (null checked).
            let dev = unsafe { out(a[1] as *mut nvmlDevice_t) }?;
            *dev = core::handle_by_index(state, a[0] as u32)?;
            Ok(())
        }
        SLOT_COMPUTE_PROCESSES | SLOT_GRAPHICS_PROCESSES | SLOT_MPS_PROCESSES => {
            let dev = core::device(a[0] as nvmlDevice_t)?;
            let procs = if n == SLOT_COMPUTE_PROCESSES {
                dev.compute_processes_named()
            } else {
                // The fake runs no graphics work and no MPS server.
                Vec::new()
            };
            // SAFETY: the caller passes its count and a buffer of `*count` entries.
            unsafe { fill_entries(a[1] as *mut c_uint, a[2] as *mut u8, &procs) }
        }
        // Everything else: what a real driver answers for a feature the board lacks. No
        // out-pointer is written, so nvidia-smi prints "N/A" rather than a made-up value.
        _ => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

/// Writes `procs` as private-list entries, with the public lists' protocol: `*count` in is
/// the capacity; too small sets the needed count and answers INSUFFICIENT_SIZE.
///
/// # Safety
/// `count` null or valid; `buf` null or valid for `*count` entries of [`PROC_ENTRY_BYTES`].
unsafe fn fill_entries(count: *mut c_uint, buf: *mut u8, procs: &[NamedProcess]) -> NvmlResult<()> {
    // SAFETY: per the caller's contract.
    let count = unsafe { out(count) }?;
    let needed = procs.len() as c_uint;
    if *count < needed {
        *count = needed;
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if needed > 0 && buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (i, p) in procs.iter().enumerate() {
        let entry = encode_entry(p);
        // SAFETY: i < needed <= *count entries the caller vouched for.
        unsafe {
            std::ptr::copy_nonoverlapping(
                entry.as_ptr(),
                buf.add(i * PROC_ENTRY_BYTES),
                PROC_ENTRY_BYTES,
            )
        };
    }
    *count = needed;
    Ok(())
}

/// A process as the private list carries it.
pub struct NamedProcess {
    pub pid: u32,
    pub used_memory: u64,
    pub name: String,
}

/// pid u32 @0, usedGpuMemory u64 @8, gpuInstanceId u32 @16, computeInstanceId u32 @20
/// (both "not available" without MIG), usedGpuCcProtectedMemory u64 @24 (no confidential
/// computing: 0), NUL-terminated name @32.
pub fn encode_entry(p: &NamedProcess) -> Box<[u8; PROC_ENTRY_BYTES]> {
    let mut e = Box::new([0u8; PROC_ENTRY_BYTES]);
    e[0..4].copy_from_slice(&p.pid.to_ne_bytes());
    e[8..16].copy_from_slice(&p.used_memory.to_ne_bytes());
    e[16..20].copy_from_slice(&NVML_VALUE_NOT_AVAILABLE_UINT.to_ne_bytes());
    e[20..24].copy_from_slice(&NVML_VALUE_NOT_AVAILABLE_UINT.to_ne_bytes());
    let name = p.name.as_bytes();
    let len = name.len().min(PROC_ENTRY_BYTES - PROC_NAME_OFFSET - 1);
    e[PROC_NAME_OFFSET..PROC_NAME_OFFSET + len].copy_from_slice(&name[..len]);
    e
}

/// The table's GUID as nvidia-smi passes it (the first three fields little-endian).
pub const TABLE_GUID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// Word 0 is the table's size in bytes, as in the real library; every other word a slot:
/// null where the real library's is, else the slot's own trampoline.
fn table() -> &'static [usize] {
    static TABLE: OnceLock<Box<[usize]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let cuda = fakegpu::nvml_view::cuda_driver_version();
        let empty = empty_slots(cuda);
        let known = |i: usize| match i {
            0 => Some(Slot::SizeOf),
            _ if empty.contains(&i) => Some(Slot::Null),
            _ => None,
        };
        let trampoline = |i: usize| SLOTS[i / 16][i % 16] as *const c_void;
        layout(table_bytes(cuda) / 8, known, trampoline)
            .iter()
            .map(|p| *p as usize)
            .collect()
    })
}

/// The slots the real library leaves null (read from the relocations of its table in
/// Debian's libnvidia-ml1 535.261.03 and 550.163.01): the 550 list is the 535 one plus 42, 43
/// and 241, so the layout grows by appending and retires slots by nulling them.
const EMPTY_SLOTS_535: &[usize] = &[
    1, 2, 24, 29, 30, 31, 35, 46, 47, 48, 57, 58, 60, 64, 90, 104, 108, 121, 122, 139, 149, 150,
    157, 158, 159, 160, 161, 162, 163, 167, 176, 177, 178, 187, 190, 191, 198, 201, 202, 207, 211,
    216, 217, 235, 236,
];
const EMPTY_SLOTS_550: &[usize] = &[
    1, 2, 24, 29, 30, 31, 35, 42, 43, 46, 47, 48, 57, 58, 60, 64, 90, 104, 108, 121, 122, 139, 149,
    150, 157, 158, 159, 160, 161, 162, 163, 167, 176, 177, 178, 187, 190, 191, 198, 201, 202, 207,
    211, 216, 217, 235, 236, 241,
];

fn empty_slots(cuda_version: i32) -> &'static [usize] {
    if cuda_version < 12040 {
        EMPTY_SLOTS_535
    } else {
        EMPTY_SLOTS_550
    }
}

/// The size the real library of the reported driver branch gives its table: 1960 bytes in
/// 535.261.03, 2008 in 550.163.01 (read from Debian's libnvidia-ml1 packages); other branches
/// get the 550 layout. `FAKEGPU_NVML_TABLE_BYTES` overrides it (a multiple of 8, at most the
/// slots the fake has).
pub fn table_bytes(cuda_version: i32) -> usize {
    let default = if cuda_version < 12040 { 1960 } else { 2008 };
    std::env::var("FAKEGPU_NVML_TABLE_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|b| *b >= 16 && b % 8 == 0 && b / 8 <= SLOT_ROWS * 16)
        .unwrap_or(default)
}

/// `nvmlInternalGetExportTable(&table, &guid)`: as the real library, `*table` is cleared
/// first, a null argument or an unknown GUID answers INVALID_ARGUMENT.
///
/// # Safety
/// `table_out` null or writable; `guid` null or 16 readable bytes.
pub unsafe fn get_export_table(table_out: *mut *const usize, guid: *const u8) -> nvmlReturn_t {
    if table_out.is_null() || guid.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller passes a writable pointer.
    unsafe { *table_out = std::ptr::null() };
    // SAFETY: 16 bytes per the caller's contract.
    let id = unsafe { std::slice::from_raw_parts(guid, 16) };
    if id != TABLE_GUID {
        if trace() {
            eprintln!("fakegpu NVML table: unknown table {id:02x?}");
        }
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: see above.
    unsafe { *table_out = table().as_ptr() };
    NVML_SUCCESS
}
