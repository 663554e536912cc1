//! `cuGetExportTable`: the private driver tables NVIDIA's CUDA runtime (libcudart) asks for
//! after its `cuGetProcAddress` lookups. Without them every runtime call fails with
//! `cudaErrorSymbolNotFound` (500).
//!
//! A table is an array of pointer-sized slots identified by a 16-byte id (CUuuid byte
//! order). Most tables start with their own size in bytes; the known slots below are served
//! by the model, and every other slot of a served table is a trampoline that prints one line
//! naming the table, the slot and its first arguments, and answers
//! `CUDA_ERROR_NOT_SUPPORTED`: a call the fake cannot serve fails loudly, never silently.
//! What each slot does and where that is known from: cuda-tests/README.md ("The CUDA
//! runtime's private tables"). `FAKEGPU_TRACE_EXPORTS=1` prints every table request and
//! every served slot call, which is how the slots a runtime uses were found. The tables are
//! `fakegpu::export_table::TableDef`s, laid out and found by id by that module, which lays
//! out nvidia-smi's NVML table too.

use crate::ffi::{get, guard, h, hp, put};
use fakegpu::cuda::module::ImageSource;
use fakegpu::cuda::R;
use fakegpu::export_table::{find, fmt_id, id, layout_def, Slot, TableDef};
use gpuslice_abi::cuda::result::*;
use gpuslice_abi::cuda::{CUcontext, CUdevice, CUmodule, CUresult, CUuuid};
use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;

fn cu() -> &'static fakegpu::cuda::Cuda {
    fakegpu::cuda::Cuda::global()
}

fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FAKEGPU_TRACE_EXPORTS").is_some_and(|v| v != "0"))
}

macro_rules! trace {
    ($($a:tt)*) => {
        if tracing() {
            eprintln!("fakegpu: {}", format_args!($($a)*));
        }
    };
}

/// Table names follow the public write-ups of this interface (ZLUDA's `dark_api`); the
/// runtime itself only knows the ids.
static TABLES: &[TableDef] = &[
    TableDef {
        name: "CUDART_INTERFACE",
        id: id("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"),
        slots: 13,
        known: &[
            (0, Slot::SizeOf),
            (1, Slot::Fn(rt_module_from_wrapper as *const c_void)),
            (2, Slot::Fn(rt_primary_context as *const c_void)),
            (6, Slot::Fn(rt_module_from_wrapper_ext as *const c_void)),
            (7, Slot::Fn(rt_noop_usize as *const c_void)),
            (8, Slot::Fn(rt_module_from_fatbin_ext as *const c_void)),
            (12, Slot::Fn(rt_load_compilers as *const c_void)),
        ],
    },
    TableDef {
        name: "TOOLS_TLS",
        id: id("42d85a81-23f6-cb47-8298-f6e78a3aecdc"),
        slots: 4,
        known: &[
            (0, Slot::SizeOf),
            (2, Slot::Fn(tls_current_context as *const c_void)),
        ],
    },
    TableDef {
        name: "TOOLS_RUNTIME_CALLBACK_HOOKS",
        id: id("a094798c-2e74-2e74-93f2-0800200c0a66"),
        slots: 7,
        known: &[
            (0, Slot::SizeOf),
            (2, Slot::Fn(hooks_buffer_1 as *const c_void)),
            (6, Slot::Fn(hooks_buffer_2 as *const c_void)),
        ],
    },
    TableDef {
        name: "CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
        id: id("c693336e-1121-df11-a8c3-68f355d89593"),
        slots: 4,
        known: &[
            (0, Slot::Fn(cls_put as *const c_void)),
            (1, Slot::Fn(cls_delete as *const c_void)),
            (2, Slot::Fn(cls_get as *const c_void)),
        ],
    },
    TableDef {
        name: "CTX_CREATE_BYPASS",
        id: id("0ca50b8c-1004-929a-89a7-d0df10e77286"),
        slots: 2,
        known: &[
            (0, Slot::SizeOf),
            (1, Slot::Fn(ctx_create_bypass as *const c_void)),
        ],
    },
    TableDef {
        name: "HEAP_ACCESS",
        id: id("195bcbf4-d67d-024a-acc5-1d29cea631ae"),
        slots: 3,
        known: &[(0, Slot::SizeOf)],
    },
    TableDef {
        name: "DEVICE_EXTENDED_RT",
        id: id("b10541e1-f7c7-c74a-9f64-f223be99f1e2"),
        slots: 26,
        known: &[
            (0, Slot::SizeOf),
            (13, Slot::Fn(device_flag_byte as *const c_void)),
        ],
    },
    TableDef {
        name: "INTEGRITY_CHECK",
        id: id("d4082055-bde6-704b-8d34-ba123c66e1f2"),
        slots: 3,
        known: &[
            (0, Slot::SizeOf),
            (1, Slot::Fn(integrity_check as *const c_void)),
        ],
    },
    TableDef {
        name: "TOOLS_CONTEXT",
        id: id("21318c60-9714-3248-8ca6-41ff7324c8f2"),
        slots: 93,
        known: &[
            (0, Slot::SizeOf),
            (4, Slot::Fn(tools_context_id as *const c_void)),
        ],
    },
    TableDef {
        name: "UNKNOWN_1734DC26",
        id: id("1734dc26-800d-4745-8726-c0f1e7dd8bca"),
        slots: 32,
        known: &[(0, Slot::SizeOf)],
    },
    TableDef {
        name: "CUPTI",
        id: id("7cb63f9b-9ca4-8e42-a484-beb66e6aed7f"),
        slots: 64,
        known: &[(0, Slot::SizeOf)],
    },
    TableDef {
        name: "CONTEXT_CHECKS",
        id: id("263e8860-7cd2-6143-92f6-bbd5006dfa7e"),
        slots: 4,
        known: &[
            (0, Slot::SizeOf),
            (2, Slot::Fn(context_check as *const c_void)),
            (3, Slot::Fn(check_zero as *const c_void)),
        ],
    },
];

/// Most slots any table has; trampolines exist for this many.
const MAX_SLOTS: usize = 96;

/// The built tables: one array of slots each, alive for the process.
struct Built(Vec<Box<[*const c_void]>>);
// SAFETY: built once, read-only afterwards; the pointers are code addresses or sizes.
unsafe impl Sync for Built {}
// SAFETY: as for Sync: nothing in it belongs to a thread.
unsafe impl Send for Built {}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        Built(
            TABLES
                .iter()
                .enumerate()
                .map(|(ti, t)| layout_def(t, |s| trampoline(ti, s)))
                .collect(),
        )
    })
}

/// `cuGetExportTable(&table, id)`.
pub fn get_export_table(table: *mut *const c_void, id: *const CUuuid) -> R<()> {
    if table.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let want = get(id)?.bytes.map(|b| b as u8);
    match find(TABLES, &want) {
        Some(i) => {
            trace!("cuGetExportTable {} served", TABLES[i].name);
            put(table, built().0[i].as_ptr() as *const c_void)
        }
        None => {
            // The runtime takes CUDA_ERROR_NOT_FOUND as "this driver has no such table" and
            // carries on without the optional ones (the integrity check, f8cff951-...).
            trace!("cuGetExportTable {} not served", fmt_id(&want));
            put(table, std::ptr::null())?;
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}

/// The (table, slot) trampolines: a distinct function per pair, so the line names both.
fn trampoline(table: usize, slot: usize) -> *const c_void {
    macro_rules! row {
        ($t:literal) => {
            row!(@ $t; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95)
        };
        (@ $t:literal; $($s:literal)*) => {
            [$(unknown::<$t, $s> as *const c_void),*]
        };
    }
    let rows: [[*const c_void; MAX_SLOTS]; 12] = [
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
    ];
    assert!(TABLES.len() <= rows.len(), "a trampoline row per table");
    rows[table][slot]
}

/// An unknown slot: one line naming it, then CUDA_ERROR_NOT_SUPPORTED. The six integer
/// argument registers are printed as they are (what the caller passed, or leftovers).
unsafe extern "C" fn unknown<const T: usize, const S: usize>(
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
) -> CUresult {
    let name = TABLES.get(T).map_or("?", |t| t.name);
    eprintln!(
        "fakegpu: cuGetExportTable {name} slot {S} is not simulated \
         (args {a0:#x} {a1:#x} {a2:#x} {a3:#x} {a4:#x} {a5:#x}): CUDA_ERROR_NOT_SUPPORTED"
    );
    CUDA_ERROR_NOT_SUPPORTED
}

// ---- CUDART_INTERFACE ----

/// Slot 1: a module from a `__fatBinC_Wrapper_t` (what `__cudaRegisterFatBinary` got).
unsafe extern "C" fn rt_module_from_wrapper(m: *mut CUmodule, wrapper: *const c_void) -> CUresult {
    trace!("CUDART_INTERFACE[1] module from wrapper {wrapper:p}");
    guard(|| {
        put(
            m,
            hp(cu().module_load(ImageSource::FatbinWrapper(wrapper as usize))?),
        )
    })
}

/// Slot 6: as slot 1 with three more arguments (seen as null/0; anything else is refused).
unsafe extern "C" fn rt_module_from_wrapper_ext(
    m: *mut CUmodule,
    wrapper: *const c_void,
    a3: *mut c_void,
    a4: *mut c_void,
    a5: c_uint,
) -> CUresult {
    trace!("CUDART_INTERFACE[6] module from wrapper {wrapper:p} ({a3:p} {a4:p} {a5})");
    guard(|| {
        if !a3.is_null() || !a4.is_null() || a5 != 0 {
            eprintln!(
                "fakegpu: CUDART_INTERFACE slot 6 with options ({a3:p} {a4:p} {a5}) is not \
                 simulated: CUDA_ERROR_NOT_SUPPORTED"
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        put(
            m,
            hp(cu().module_load(ImageSource::FatbinWrapper(wrapper as usize))?),
        )
    })
}

/// Slot 8: a module from a fatbin header directly (module first is slot 1's order swapped).
unsafe extern "C" fn rt_module_from_fatbin_ext(
    fatbin: *const c_void,
    m: *mut CUmodule,
    a3: *mut c_void,
    a4: *mut c_void,
    a5: c_uint,
) -> CUresult {
    trace!("CUDART_INTERFACE[8] module from fatbin {fatbin:p} ({a3:p} {a4:p} {a5})");
    guard(|| {
        if !a3.is_null() || !a4.is_null() || a5 != 0 {
            eprintln!(
                "fakegpu: CUDART_INTERFACE slot 8 with options ({a3:p} {a4:p} {a5}) is not \
                 simulated: CUDA_ERROR_NOT_SUPPORTED"
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        put(
            m,
            hp(cu().module_load(ImageSource::Memory(fatbin as usize))?),
        )
    })
}

/// Slot 2: the device's primary context handle, without retaining or activating it (the
/// runtime retains it itself through `cuDevicePrimaryCtxRetain`).
unsafe extern "C" fn rt_primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    trace!("CUDART_INTERFACE[2] primary context of {dev}");
    guard(|| put(pctx, hp(cu().primary_peek(dev)?)))
}

/// Slot 7: takes one integer and returns nothing; no effect observed.
unsafe extern "C" fn rt_noop_usize(a: usize) {
    trace!("CUDART_INTERFACE[7]({a:#x})");
}

/// Slot 12: the driver loads its JIT compilers here; the fake has none to load.
unsafe extern "C" fn rt_load_compilers() -> CUresult {
    trace!("CUDART_INTERFACE[12] load compilers");
    CUDA_SUCCESS
}

// ---- TOOLS_TLS ----

/// Slot 2: the calling thread's current context, as `cuCtxGetCurrent` answers it (null
/// when none is current).
unsafe extern "C" fn tls_current_context(pctx: *mut CUcontext) -> CUresult {
    let r = guard(|| {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, hp(cu().ctx_get_current()?))
    });
    trace!("TOOLS_TLS[2] current context: {r}");
    r
}

// ---- TOOLS_CONTEXT ----

/// Slot 4: the context's unique id, as `cuCtxGetId` answers it.
unsafe extern "C" fn tools_context_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    let r = guard(|| {
        if id.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(id, cu().ctx_id(h(ctx))?)
    });
    trace!("TOOLS_CONTEXT[4] id of {ctx:p}: {r}");
    r
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS ----

/// Zeroed buffers the runtime keeps tools callback state in (no tool is attached).
struct HookBuffer<const N: usize>(std::cell::UnsafeCell<[u32; N]>);
// SAFETY: the buffer is only ever written by the runtime through the pointer it is handed.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

static HOOKS_1: HookBuffer<1024> = HookBuffer(std::cell::UnsafeCell::new([0; 1024]));
static HOOKS_2: HookBuffer<14> = HookBuffer(std::cell::UnsafeCell::new([0; 14]));

unsafe extern "C" fn hooks_buffer_1(ptr: *mut *mut c_void, size: *mut usize) {
    trace!("TOOLS_RUNTIME_CALLBACK_HOOKS[2]");
    let _ = put(ptr, HOOKS_1.0.get() as *mut c_void);
    let _ = put(size, 1024);
}

unsafe extern "C" fn hooks_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    trace!("TOOLS_RUNTIME_CALLBACK_HOOKS[6]");
    let _ = put(ptr, HOOKS_2.0.get() as *mut c_void);
    let _ = put(size, 14);
}

// ---- CONTEXT_LOCAL_STORAGE ----

/// Slot 0: stores `value` under (`ctx` or the current context, `key`). The destructor the
/// runtime passes is kept but not called: the entry goes with the context.
unsafe extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    _dtor: *const c_void,
) -> CUresult {
    trace!("CONTEXT_LOCAL_STORAGE[0] put {ctx:p} {key:p} = {value:p}");
    guard(|| cu().ctx_storage_put(h(ctx), key as usize, value as usize))
}

unsafe extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    trace!("CONTEXT_LOCAL_STORAGE[1] delete {ctx:p} {key:p}");
    guard(|| cu().ctx_storage_delete(h(ctx), key as usize))
}

/// Slot 2: the stored value, or CUDA_ERROR_INVALID_HANDLE when nothing is stored (the
/// runtime takes that as "first use of this context").
unsafe extern "C" fn cls_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    let r = guard(|| {
        put(
            value,
            hp(cu().ctx_storage_get(h(ctx), key as usize)? as u64),
        )
    });
    trace!("CONTEXT_LOCAL_STORAGE[2] get {ctx:p} {key:p}: {r}");
    r
}

// ---- CTX_CREATE_BYPASS ----

unsafe extern "C" fn ctx_create_bypass(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    trace!("CTX_CREATE_BYPASS[1] flags {flags:#x} dev {dev}");
    guard(|| {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, hp(cu().ctx_create(flags, dev)?))
    })
}

// ---- DEVICE_EXTENDED_RT ----

/// Slot 13: one byte per device, 0 on the GPUs it was observed on.
unsafe extern "C" fn device_flag_byte(result: *mut u8, dev: CUdevice) -> CUresult {
    trace!("DEVICE_EXTENDED_RT[13] dev {dev}");
    guard(|| {
        cu().device_spec(dev)?;
        put(result, 0)
    })
}

// ---- INTEGRITY_CHECK ----

fn table_addr(name: &str) -> u64 {
    TABLES
        .iter()
        .position(|t| t.name == name)
        .map_or(0, |i| built().0[i].as_ptr() as u64)
}

/// Slot 1: the runtime's check that it talks to a real driver (see fakegpu's `integrity`).
unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    result: *mut [u64; 2],
) -> CUresult {
    trace!("INTEGRITY_CHECK[1] version {version} time {unix_seconds}");
    use fakegpu::cuda::integrity::{integrity_answer, DeviceId, Identity};
    guard(|| {
        let n = cu().device_count()?;
        let devices = (0..n)
            .map(|d| {
                let spec = cu().device_spec(d)?;
                let (domain, bus, device) = spec.pci_parts();
                Ok(DeviceId {
                    uuid: spec.uuid_bytes(),
                    pci: [domain as i32, bus as i32, device as i32],
                })
            })
            .collect::<R<Vec<_>>>()?;
        let me = Identity {
            driver_version: cu().driver_version() as u32,
            pid: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: table_addr("CUDART_INTERFACE"),
            integrity_table: table_addr("INTEGRITY_CHECK"),
            check_fn: integrity_check as *const c_void as u64,
        };
        put(
            result,
            integrity_answer(version, unix_seconds, &me, &devices),
        )
    })
}

// ---- CONTEXT_CHECKS ----

unsafe extern "C" fn context_check(
    _ctx: CUcontext,
    result1: *mut u32,
    _result2: *mut *const c_void,
) -> CUresult {
    trace!("CONTEXT_CHECKS[2]");
    guard(|| put(result1, 0))
}

unsafe extern "C" fn check_zero() -> u32 {
    trace!("CONTEXT_CHECKS[3]");
    0
}
