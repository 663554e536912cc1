//! The CUDA runtime's private tables through the C ABI (`cuGetExportTable`), without the
//! runtime itself (the framework tests in cuda-e2e run NVIDIA's): sizes, the served slots
//! and their answers, the NOT_SUPPORTED trampolines, unknown ids, and entry points the
//! fake refuses by name.

use libloading::Library;
use std::ffi::{c_int, c_uint, c_void};
use std::path::Path;

const SUCCESS: u32 = 0;
const INVALID_HANDLE: u32 = 400;
const NOT_FOUND: u32 = 500;
const NOT_SUPPORTED: u32 = 801;

fn id(s: &str) -> [u8; 16] {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

type GetTable = unsafe extern "C" fn(*mut *const c_void, *const [u8; 16]) -> u32;

#[test]
fn the_runtime_tables_are_served_and_unknown_slots_refuse() {
    let state = std::env::temp_dir().join(format!("fakegpu-export-{}", std::process::id()));
    std::env::set_var("FAKEGPU_STATE", &state);
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("libfakegpu_cuda.so");
    // SAFETY: loading our own cdylib; its initialisers are Rust statics only.
    let lib: &'static Library = Box::leak(Box::new(unsafe { Library::new(&path) }.unwrap()));
    macro_rules! sym {
        ($name:literal: $t:ty) => {
            // SAFETY: the named export has this C signature.
            *unsafe { lib.get::<$t>($name) }.unwrap()
        };
    }
    let init = sym!(b"cuInit": unsafe extern "C" fn(c_uint) -> u32);
    let get: GetTable = sym!(b"cuGetExportTable": GetTable);
    let retain =
        sym!(b"cuDevicePrimaryCtxRetain": unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32);
    let set_current = sym!(b"cuCtxSetCurrent": unsafe extern "C" fn(*mut c_void) -> u32);
    let tex = sym!(b"cuTexObjectCreate": unsafe extern "C" fn() -> u32);
    let ctx_id = sym!(b"cuCtxGetId": unsafe extern "C" fn(*mut c_void, *mut u64) -> u32);
    // SAFETY: C calls with valid pointers throughout.
    unsafe {
        // CUPTI asks for its table when it loads, before cuInit: served, sized, no slot served.
        let mut t: *const c_void = std::ptr::null();
        let cupti = id("7cb63f9b-9ca4-8e42-a484-beb66e6aed7f");
        assert_eq!(get(&mut t, &cupti), SUCCESS);
        assert_eq!(
            *(t as *const usize),
            64 * 8,
            "the CUPTI table starts with its size"
        );
        let slot32: unsafe extern "C" fn() -> u32 =
            std::mem::transmute(*(t as *const usize).add(32));
        assert_eq!(slot32(), NOT_SUPPORTED);
        assert_eq!(init(0), SUCCESS);
        let rt = id("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
        assert_eq!(get(&mut t, &rt), SUCCESS);
        let slots = t as *const usize;
        assert_eq!(*slots, 13 * 8, "CUDART_INTERFACE starts with its size");
        // Slot 2: the primary context, not retained; the retain returns the same handle.
        let primary: unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32 =
            std::mem::transmute(*slots.add(2));
        let mut peek = std::ptr::null_mut();
        assert_eq!(primary(&mut peek, 0), SUCCESS);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), SUCCESS);
        assert_eq!(peek, ctx);
        // An unknown slot answers NOT_SUPPORTED (and names itself on stderr).
        let unknown: unsafe extern "C" fn() -> u32 = std::mem::transmute(*slots.add(3));
        assert_eq!(unknown(), NOT_SUPPORTED);
        // Slot 1: a fatbin registered by the runtime becomes a module.
        let from_wrapper: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32 =
            std::mem::transmute(*slots.add(1));
        // TOOLS_TLS slot 2: the thread's current context, null while none is.
        let tls = id("42d85a81-23f6-cb47-8298-f6e78a3aecdc");
        assert_eq!(get(&mut t, &tls), SUCCESS);
        let current: unsafe extern "C" fn(*mut *mut c_void) -> u32 =
            std::mem::transmute(*(t as *const usize).add(2));
        let mut cur = std::ptr::dangling_mut::<c_void>();
        assert_eq!(current(&mut cur), SUCCESS);
        assert!(cur.is_null(), "a retain does not make the context current");
        assert_eq!(set_current(ctx), SUCCESS);
        assert_eq!(current(&mut cur), SUCCESS);
        assert_eq!(cur, ctx);
        assert_eq!(current(std::ptr::null_mut()), 1, "INVALID_VALUE");
        // TOOLS_CONTEXT slot 4: the context's id, as cuCtxGetId gives it.
        let tc = id("21318c60-9714-3248-8ca6-41ff7324c8f2");
        assert_eq!(get(&mut t, &tc), SUCCESS);
        assert_eq!(*(t as *const usize), 93 * 8);
        let tc_id: unsafe extern "C" fn(*mut c_void, *mut u64) -> u32 =
            std::mem::transmute(*(t as *const usize).add(4));
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(tc_id(ctx, &mut a), SUCCESS);
        assert_eq!(ctx_id(ctx, &mut b), SUCCESS);
        assert_eq!(a, b);
        assert_ne!(a, 0);
        // The table cuBLASLt needs on Hopper: served, its one called slot refuses.
        let hopper = id("1734dc26-800d-4745-8726-c0f1e7dd8bca");
        assert_eq!(get(&mut t, &hopper), SUCCESS);
        let slot4: unsafe extern "C" fn() -> u32 = std::mem::transmute(*(t as *const usize).add(4));
        assert_eq!(slot4(), NOT_SUPPORTED);
        let header: [u32; 4] = [0xba55_ed50, 0x0010_0001, 0, 0];
        let wrapper: [usize; 4] = [0x4662_43b1 | (1 << 32), header.as_ptr() as usize, 0, 0];
        let mut module = std::ptr::null_mut();
        assert_eq!(from_wrapper(&mut module, wrapper.as_ptr().cast()), SUCCESS);
        assert!(!module.is_null());
        let bad: [usize; 4] = [0x1234, 0, 0, 0];
        assert_eq!(
            from_wrapper(&mut module, bad.as_ptr().cast()),
            200,
            "not a wrapper"
        );

        // Context-local storage: absent is INVALID_HANDLE, then what was put.
        let cls = id("c693336e-1121-df11-a8c3-68f355d89593");
        assert_eq!(get(&mut t, &cls), SUCCESS);
        let slots = t as *const usize;
        let put: unsafe extern "C" fn(*mut c_void, usize, usize, usize) -> u32 =
            std::mem::transmute(*slots);
        let read: unsafe extern "C" fn(*mut usize, *mut c_void, usize) -> u32 =
            std::mem::transmute(*slots.add(2));
        let mut v = 0usize;
        assert_eq!(read(&mut v, ctx, 7), INVALID_HANDLE);
        assert_eq!(put(ctx, 7, 42, 0), SUCCESS);
        assert_eq!(read(&mut v, std::ptr::null_mut(), 7), SUCCESS);
        assert_eq!(v, 42);

        // The integrity check answers; a version ending in 0 gets the fixed answer.
        let ic = id("d4082055-bde6-704b-8d34-ba123c66e1f2");
        assert_eq!(get(&mut t, &ic), SUCCESS);
        let check: unsafe extern "C" fn(u32, u64, *mut [u64; 2]) -> u32 =
            std::mem::transmute(*(t as *const usize).add(1));
        let mut r = [0u64; 2];
        assert_eq!(check(13000, 1, &mut r), SUCCESS);
        assert_eq!(r[0], 0x3341_181c_03cb_675c);
        assert_eq!(check(13002, 1, &mut r), SUCCESS);
        assert_ne!(r[0], 0x3341_181c_03cb_675c);

        // An id nobody serves.
        let mut t2: *const c_void = std::ptr::dangling::<c_void>();
        assert_eq!(get(&mut t2, &[0u8; 16]), NOT_FOUND);
        assert!(t2.is_null());

        // A refused entry point, as dlsym finds it.
        assert_eq!(tex(), NOT_SUPPORTED);
    }
    let _ = std::fs::remove_file(&state);
}
