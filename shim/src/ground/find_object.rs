//! Our own `_dl_find_object` for the statically linked unwinder, so that the core names no
//! `libgcc_s.so.1` and its glibc floor stays 2.34.
//!
//! Why: std needs an unwinder (panics are caught at the FFI boundary). `shim/build.rs` links
//! GCC's static `libgcc_eh.a` instead of `libgcc_s.so.1` (why, and what that saves now that only
//! the front is preloaded: its module doc). GCC 12+ builds that unwinder against glibc >= 2.35
//! to find an address's unwind tables with `_dl_find_object` (`GLIBC_2.35`); importing it would
//! make the loader refuse the core on glibc 2.34 (RHEL 9 / UBI 9 CUDA images), and every
//! CUDA/NVML call in those containers would fail.
//!
//! So this module DEFINES `_dl_find_object`, hidden: the static unwinder's reference binds to
//! it at link time, nothing is imported, and nothing is exported (another object's unwinder,
//! e.g. the process's own `libgcc_s.so.1`, keeps glibc's). It answers from
//! `dl_iterate_phdr` (glibc 2.2.4), which is what libgcc itself did before 2.35: the object
//! whose `PT_LOAD` segments contain the address, its mapping range and its `PT_GNU_EH_FRAME`
//! (`.eh_frame_hdr`). `dlfo_link_map` is left null: libgcc does not read it, and this symbol
//! is visible to nothing else. Only unwinding (a contained panic, a backtrace) calls it.

use std::ffi::{c_int, c_void};

/// glibc's `struct dl_find_object` on x86-64 and aarch64 (no `dlfo_eh_dbase`, no
/// `dlfo_eh_count` on these architectures).
#[repr(C)]
pub struct DlFindObject {
    pub flags: u64,
    pub map_start: *mut c_void,
    pub map_end: *mut c_void,
    pub link_map: *mut c_void,
    pub eh_frame: *mut c_void,
    pub reserved: [u64; 7],
}

const PT_LOAD: u32 = 1;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;

/// What the `dl_iterate_phdr` callback looks for and fills in.
struct Search {
    pc: usize,
    found: Option<(usize, usize, usize)>,
}

/// `dl_iterate_phdr` callback: stops (returns 1) at the object with a `PT_LOAD` segment
/// containing `pc`, recording its mapping range and eh_frame_hdr address.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `Search` that `find_object` passed and owns for the whole call.
    let search = unsafe { &mut *data.cast::<Search>() };
    // SAFETY: glibc passes a valid dl_phdr_info for the duration of the callback.
    let info = unsafe { &*info };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: dlpi_phdr points at dlpi_phnum program headers of a loaded object.
    let headers =
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr as usize;
    let mut contains = false;
    let mut start = usize::MAX;
    let mut end = 0usize;
    let mut eh_frame = 0usize;
    for header in headers {
        let from = base.wrapping_add(header.p_vaddr as usize);
        let to = from.wrapping_add(header.p_memsz as usize);
        match header.p_type {
            PT_LOAD => {
                contains |= (from..to).contains(&search.pc);
                start = start.min(from);
                end = end.max(to);
            }
            PT_GNU_EH_FRAME => eh_frame = from,
            _ => {}
        }
    }
    if !contains {
        return 0;
    }
    search.found = Some((start, end, eh_frame));
    1
}

/// The implementation behind the hidden `_dl_find_object`: 0 and `*result` filled when `pc`
/// lies in a loaded object, -1 otherwise (glibc's contract).
///
/// # Safety
/// `result` is valid for writes of a `DlFindObject` (glibc's contract for its caller).
pub unsafe extern "C" fn find_object(pc: *const c_void, result: *mut DlFindObject) -> c_int {
    let mut search = Search {
        pc: pc as usize,
        found: None,
    };
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and only touches `search`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    let Some((start, end, eh_frame)) = search.found else {
        return -1;
    };
    if result.is_null() {
        return -1;
    }
    // SAFETY: the caller (libgcc's unwinder) passes a writable struct dl_find_object.
    unsafe {
        result.write(DlFindObject {
            flags: 0,
            map_start: start as *mut c_void,
            map_end: end as *mut c_void,
            link_map: std::ptr::null_mut(),
            eh_frame: eh_frame as *mut c_void,
            reserved: [0; 7],
        })
    };
    0
}

// The hidden definition the static unwinder binds to. `global_asm!` rather than `#[no_mangle]`:
// rustc's cdylib version script exports every `#[no_mangle]` function, and an exported
// `_dl_find_object` would interpose glibc's for every other unwinder in the process.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl _dl_find_object",
    ".hidden _dl_find_object",
    ".type _dl_find_object, @function",
    "_dl_find_object:",
    "jmp {implementation}",
    ".size _dl_find_object, . - _dl_find_object",
    implementation = sym find_object,
);

#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".globl _dl_find_object",
    ".hidden _dl_find_object",
    ".type _dl_find_object, %function",
    "_dl_find_object:",
    "b {implementation}",
    ".size _dl_find_object, . - _dl_find_object",
    implementation = sym find_object,
);

#[cfg(test)]
mod tests {
    use super::*;

    type GlibcFindObject = unsafe extern "C" fn(*const c_void, *mut DlFindObject) -> c_int;

    fn empty() -> DlFindObject {
        DlFindObject {
            flags: 7,
            map_start: std::ptr::null_mut(),
            map_end: std::ptr::null_mut(),
            link_map: std::ptr::null_mut(),
            eh_frame: std::ptr::null_mut(),
            reserved: [0; 7],
        }
    }

    /// glibc's own `_dl_find_object` (2.35+), looked up at run time; our hidden definition is
    /// not in the dynamic symbol table, so this is never ours.
    fn glibc_find_object() -> Option<GlibcFindObject> {
        // SAFETY: NUL-terminated name; RTLD_DEFAULT lookup.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
        // SAFETY: glibc's _dl_find_object has exactly this C signature.
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, GlibcFindObject>(p) })
    }

    #[test]
    fn answers_what_glibc_answers_for_code_in_this_binary_and_in_libc() {
        let Some(glibc) = glibc_find_object() else {
            eprintln!("glibc < 2.35 here: nothing to compare with");
            return;
        };
        let here = answers_what_glibc_answers_for_code_in_this_binary_and_in_libc as *const c_void;
        let in_libc = libc::getpid as *const c_void;
        for pc in [here, in_libc] {
            let (mut ours, mut theirs) = (empty(), empty());
            // SAFETY: valid out-pointers.
            let (a, b) = unsafe { (find_object(pc, &mut ours), glibc(pc, &mut theirs)) };
            assert_eq!((a, b), (0, 0), "{pc:?}");
            assert_eq!(ours.eh_frame, theirs.eh_frame, "eh_frame_hdr of {pc:?}");
            assert!(!ours.eh_frame.is_null());
            // The range: ours is the whole object, from its first to its last `PT_LOAD`.
            // glibc's is the same for a contiguous object, but for an executable with an
            // unmapped page between its segments it was observed to give only the segment
            // holding the address. The unwinder reads the eh_frame_hdr, not the range, so
            // both must hold the address and glibc's must lie within ours (to the page).
            // SAFETY: sysconf has no preconditions.
            let page =
                usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
            let (start, end) = (ours.map_start as usize, ours.map_end as usize);
            assert!(
                start <= pc as usize && (pc as usize) < end,
                "{pc:?} in ours"
            );
            assert!(
                start <= theirs.map_start as usize
                    && theirs.map_end as usize <= end.next_multiple_of(page),
                "glibc's range of {pc:?} ({:?}..{:?}) lies within ours ({start:#x}..{end:#x})",
                theirs.map_start,
                theirs.map_end
            );
        }
    }

    #[test]
    fn an_address_in_no_object_is_not_found() {
        let mut out = empty();
        // SAFETY: valid out-pointer; address 16 lies in no loaded object.
        assert_eq!(unsafe { find_object(16 as *const c_void, &mut out) }, -1);
    }

    #[test]
    fn a_panic_is_still_caught_by_the_static_unwinder() {
        // The unit-test binary links the same static unwinder (shim/build.rs), whose FDE
        // lookup goes through the hidden `_dl_find_object` above.
        let caught = std::panic::catch_unwind(|| panic!("contained"));
        assert!(caught.is_err());
    }
}
