//! nvidia-smi's private table, called the way nvidia-smi calls it: the GUID check, the size
//! word and empty slots of the real library's layout, slot 81 (handle by index), slots
//! 213-215 (process lists of 4128-byte entries under NVML's count protocol), NOT_SUPPORTED
//! elsewhere; and the public entry points nvidia-smi needs beyond the clients' ones.
//!
//! Needs `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` first.

mod common;

use common::{isolated, Cuda, Nvml};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::{c_uint, c_void};

type GetTable = unsafe extern "C" fn(*mut *const usize, *const u8) -> nvmlReturn_t;
type Slot3 = unsafe extern "C" fn(usize, usize, usize) -> nvmlReturn_t;

const GUID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];
const ENTRY: usize = 4128;
const MIB: u64 = 1 << 20;

fn table(nvml: &Nvml) -> &'static [usize] {
    let get: GetTable = nvml.sym("nvmlInternalGetExportTable");
    let mut t: *const usize = std::ptr::null();
    // SAFETY: valid out-pointer and a 16-byte GUID.
    assert_eq!(unsafe { get(&mut t, GUID.as_ptr()) }, NVML_SUCCESS);
    // SAFETY: the table's first word is its size in bytes; it lives as long as the library.
    unsafe { std::slice::from_raw_parts(t, *t / 8) }
}

fn slot(t: &[usize], n: usize) -> Slot3 {
    assert_ne!(t[n], 0, "slot {n} is empty");
    // SAFETY: every non-empty slot is a function taking up to six integer arguments.
    unsafe { std::mem::transmute::<usize, Slot3>(t[n]) }
}

#[test]
fn unknown_guids_and_null_arguments_are_refused_and_clear_the_out_pointer() {
    let nvml = Nvml::load();
    let get: GetTable = nvml.sym("nvmlInternalGetExportTable");
    let mut other = GUID;
    other[15] ^= 1;
    let mut t: *const usize = std::ptr::dangling::<usize>();
    // SAFETY: valid pointers; nulls are deliberate.
    unsafe {
        assert_eq!(get(&mut t, other.as_ptr()), NVML_ERROR_INVALID_ARGUMENT);
        assert!(t.is_null(), "cleared like the real library");
        assert_eq!(get(&mut t, std::ptr::null()), NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(
            get(std::ptr::null_mut(), GUID.as_ptr()),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn the_535_layout_has_the_real_size_and_empty_slots() {
    isolated(
        "the_535_layout_has_the_real_size_and_empty_slots",
        &[("FAKEGPU_DRIVER_VERSION", "12020")],
        || {
            let t = table(&Nvml::load());
            assert_eq!(t[0], 1960);
            assert_eq!(t.len(), 245);
            for empty in [1, 2, 24, 211, 216, 217, 235, 236] {
                assert_eq!(t[empty], 0, "slot {empty}");
            }
            assert_ne!(t[42], 0, "42 is retired only in 550");
        },
    );
}

#[test]
fn the_550_layout_retires_more_slots() {
    isolated(
        "the_550_layout_retires_more_slots",
        &[("FAKEGPU_DRIVER_VERSION", "12040")],
        || {
            let t = table(&Nvml::load());
            assert_eq!(t[0], 2008);
            assert_eq!((t[42], t[43], t[241]), (0, 0, 0));
        },
    );
}

#[test]
fn the_size_knob_overrides_the_layout() {
    isolated(
        "the_size_knob_overrides_the_layout",
        &[("FAKEGPU_NVML_TABLE_BYTES", "1000")],
        || assert_eq!(table(&Nvml::load())[0], 1000),
    );
}

#[test]
fn slots_answer_handles_processes_and_not_supported() {
    isolated(
        "slots_answer_handles_processes_and_not_supported",
        &[
            ("FAKEGPU_PID_OFFSET", "100000"),
            ("FAKEGPU_CTX_OVERHEAD", "33554432"),
        ],
        || {
            let nvml = Nvml::load();
            let t = table(&nvml);
            let mut h: nvmlDevice_t = std::ptr::null_mut();
            let by_index = slot(t, 81);
            // SAFETY: the slot's (index, nvmlDevice_t*, flags) arguments.
            unsafe {
                assert_eq!(
                    by_index(0, &mut h as *mut _ as usize, 0x22),
                    NVML_ERROR_UNINITIALIZED
                );
                nvml.init();
                assert_eq!(by_index(0, &mut h as *mut _ as usize, 0x22), NVML_SUCCESS);
                assert_eq!(h, nvml.handle(0), "the public handle");
                assert_eq!(
                    by_index(7, &mut h as *mut _ as usize, 0x22),
                    NVML_ERROR_INVALID_ARGUMENT
                );
            }
            let cuda = Cuda::load();
            cuda.init_context(0);
            cuda.alloc(10 * MIB as usize);
            let h = nvml.handle(0);
            let mut buf = vec![0x55u8; 3 * ENTRY];
            let mut n: c_uint = 0;
            let compute = slot(t, 213);
            // SAFETY: (device, count*, buffer of `n` entries) with n within the buffer.
            unsafe {
                assert_eq!(
                    compute(h as usize, &mut n as *mut _ as usize, 0),
                    NVML_ERROR_INSUFFICIENT_SIZE
                );
                assert_eq!(n, 1);
                n = 3;
                let rc = compute(
                    h as usize,
                    &mut n as *mut _ as usize,
                    buf.as_mut_ptr() as usize,
                );
                assert_eq!((rc, n), (NVML_SUCCESS, 1));
            }
            let e = &buf[..ENTRY];
            let u32_at = |o: usize| u32::from_ne_bytes(e[o..o + 4].try_into().unwrap());
            let u64_at = |o: usize| u64::from_ne_bytes(e[o..o + 8].try_into().unwrap());
            assert_eq!(u32_at(0), std::process::id() + 100_000);
            assert_eq!(u64_at(8), 32 * MIB + 10 * MIB);
            assert_eq!(
                (u32_at(16), u32_at(20), u64_at(24)),
                (u32::MAX, u32::MAX, 0)
            );
            let name_end = e[32..].iter().position(|b| *b == 0).unwrap();
            let name = String::from_utf8_lossy(&e[32..32 + name_end]);
            assert!(name.contains("nvml_export_table"), "argv[0]: {name}");
            assert_eq!(buf[ENTRY], 0x55, "nothing past the one entry");
            for empty_list in [214, 215] {
                let mut n: c_uint = 3;
                // SAFETY: as above.
                let rc = unsafe {
                    slot(t, empty_list)(
                        h as usize,
                        &mut n as *mut _ as usize,
                        buf.as_mut_ptr() as usize,
                    )
                };
                assert_eq!((rc, n), (NVML_SUCCESS, 0), "slot {empty_list}");
            }
            // Slot 26 is nvidia-smi's debug log; anything else answers NOT_SUPPORTED without
            // touching its arguments.
            let mut out = [0xAAu8; 64];
            // SAFETY: slot 26 takes a format string; 209 a device and an out-pointer.
            unsafe {
                assert_eq!(slot(t, 26)(c"%s".as_ptr() as usize, 0, 0), NVML_SUCCESS);
                assert_eq!(
                    slot(t, 209)(h as usize, out.as_mut_ptr() as usize, 1),
                    NVML_ERROR_NOT_SUPPORTED
                );
            }
            assert_eq!(out, [0xAA; 64]);
        },
    );
}

#[test]
fn event_sets_field_values_and_board_facts() {
    isolated("event_sets_field_values_and_board_facts", &[], || {
        let nvml = Nvml::load();
        nvml.init();
        let h = nvml.handle(0);
        let create: unsafe extern "C" fn(*mut *mut c_void) -> nvmlReturn_t =
            nvml.sym("nvmlEventSetCreate");
        let free: unsafe extern "C" fn(*mut c_void) -> nvmlReturn_t = nvml.sym("nvmlEventSetFree");
        let wait: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint) -> nvmlReturn_t =
            nvml.sym("nvmlEventSetWait_v2");
        let register: unsafe extern "C" fn(nvmlDevice_t, u64, *mut c_void) -> nvmlReturn_t =
            nvml.sym("nvmlDeviceRegisterEvents");
        let mut set = std::ptr::null_mut();
        let mut data = [0u8; 64];
        // SAFETY: valid pointers; the set is used only while live.
        unsafe {
            assert_eq!(create(&mut set), NVML_SUCCESS);
            assert_eq!(register(h, 0, set), NVML_SUCCESS);
            // Clock changes (1 << 4) are not an event the fake raises; Xid (1 << 3) is.
            assert_eq!(register(h, 1 << 4, set), NVML_ERROR_NOT_SUPPORTED);
            assert_eq!(register(h, 1 << 3, set), NVML_SUCCESS);
            assert_eq!(
                wait(set, data.as_mut_ptr().cast(), 1),
                10,
                "NVML_ERROR_TIMEOUT"
            );
            assert_eq!(free(set), NVML_SUCCESS);
        }

        // Field values: power from the board profile (V100: 250 W), the rest NOT_SUPPORTED.
        #[repr(C)]
        struct Field {
            id: c_uint,
            scope: c_uint,
            ts: i64,
            latency: i64,
            kind: c_uint,
            ret: nvmlReturn_t,
            value: u64,
        }
        let get: unsafe extern "C" fn(nvmlDevice_t, i32, *mut Field) -> nvmlReturn_t =
            nvml.sym("nvmlDeviceGetFieldValues");
        let mut fields = [190u32, 1].map(|id| Field {
            id,
            scope: 0,
            ts: 0,
            latency: 0,
            kind: 99,
            ret: 99,
            value: 7,
        });
        // SAFETY: two entries.
        assert_eq!(unsafe { get(h, 2, fields.as_mut_ptr()) }, NVML_SUCCESS);
        assert_eq!((fields[0].ret, fields[0].value), (NVML_SUCCESS, 250_000));
        assert_eq!(fields[1].ret, NVML_ERROR_NOT_SUPPORTED);

        let uint: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t =
            nvml.sym("nvmlDeviceGetArchitecture");
        let serial: unsafe extern "C" fn(nvmlDevice_t, *mut u8, c_uint) -> nvmlReturn_t =
            nvml.sym("nvmlDeviceGetSerial");
        let mut v = 0;
        let mut buf = [0u8; 32];
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!((uint(h, &mut v), v), (NVML_SUCCESS, 5), "Volta");
            assert_eq!(serial(h, buf.as_mut_ptr(), 32), NVML_ERROR_NOT_SUPPORTED);
            assert_eq!(
                serial(std::ptr::null_mut(), buf.as_mut_ptr(), 32),
                NVML_ERROR_INVALID_ARGUMENT
            );
        }
    });
}
